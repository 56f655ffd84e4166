"""Kill `doctor draft --fix OUT` while it writes the fixed copy (SIGKILL, planted at three
points): OUT is never left half-written, and the next run removes the killed run's copy
beside OUT (a full-size draft's worth of bytes) and finishes, leaving nothing else."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from reliability_support import ROOT, cli, record

pytest.importorskip("safetensors")
pytest.importorskip("numpy")

from doctor_fixtures import speculators_draft, target_config  # noqa: E402
from helpers import private_cache  # noqa: E402

SECTION = "doctor draft --fix killed (tests/reliability/test_kill_doctor.py)"

# Runs the CLI with a SIGKILL planted at KILL_POINT of the copy.
KILL_AT = """
import os, signal, sys
from pathlib import Path
from patchkit import cli
from patchkit.doctor import fix, safetensors

def die(*_args, **_kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

point = os.environ["KILL_POINT"]
if point == "inside the first tensor":  # its shard's header is written, no byte of it yet
    class Dying:
        sha256 = die
    safetensors.hashlib = Dying()
elif point == "copy complete":  # every shard and file copied, before the record is written
    fix._sha256 = die
elif point == "before the rename onto OUT":
    real = os.replace
    def replace(src, dst):
        if Path(dst) == Path(os.environ["OUT"]):
            die()
        real(src, dst)
    os.replace = replace
sys.exit(cli.main(sys.argv[1:]))
"""
POINTS = ["inside the first tensor", "copy complete", "before the rename onto OUT"]


@pytest.fixture(scope="module")
def doctor_cache(tmp_path_factory, warm_mirrors) -> Path:
    """A private cache holding the default line's model sources, as `doctor draft` reads them."""
    from patchkit.doctor import sources

    cache = private_cache(warm_mirrors, tmp_path_factory.mktemp("doctor-kill") / "cache")
    sources.for_line(None, project=ROOT, cache=cache)
    return cache


@pytest.mark.parametrize("point", POINTS)
def test_a_killed_fix_leaves_nothing_after_the_next_run(tmp_path, doctor_cache, point):
    draft = speculators_draft(tmp_path / "spec")
    target = target_config(tmp_path / "target")
    work = tmp_path / "work"
    work.mkdir()
    out = work / "fixed"
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {"PATCHKIT_CACHE": str(doctor_cache), "TMPDIR": str(tmpdir), "OUT": str(out)}
    args = ("doctor", "draft", "--draft", str(draft), "--target-config", str(target),
            "--fix", str(out))  # fmt: skip

    killed = subprocess.run(
        [sys.executable, "-c", KILL_AT, *args],
        cwd=ROOT, env={**os.environ, **env, "KILL_POINT": point},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not out.exists()  # never half-written
    left = sorted(p.name for p in work.iterdir())
    assert left and all(name.startswith(".fixed.fix-") for name in left), left
    copy = work / left[0]
    if point != "inside the first tensor":  # the killed run's full-size copy of the draft
        assert (copy / "model.safetensors").stat().st_size == (
            (draft / "model.safetensors").stat().st_size
        )

    again = cli(*args, env=env)

    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in work.iterdir()) == ["fixed"]
    assert json.loads((out / "patchkit-doctor-fix.json").read_text())["tensors"]
    assert not [p.name for p in tmpdir.iterdir() if p.name.startswith("patchkit-run-")]
    record(SECTION, f"SIGKILL {point}: the next run removed the copy beside OUT and finished")


def test_a_live_runs_copy_is_not_swept(tmp_path, doctor_cache):
    """A run still writing its copy keeps it while another patchkit sweeps: only the copies
    of dead runs go."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    folder = tmp_path / "work" / "fixed"
    folder.parent.mkdir()
    code = (
        "import sys\n"
        "from patchkit import scratch\n"
        f"print(scratch.folder_beside({str(folder)!r}, 'fix'), flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    live = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        made = Path(live.stdout.readline().strip())
        assert made.is_dir() and made.parent == folder.parent
        sweep = "from patchkit import scratch; scratch.sweep_dead()"
        subprocess.run([sys.executable, "-c", sweep], cwd=ROOT, env=env, check=True)
        assert made.is_dir()  # its writer lives
    finally:
        live.stdin.close()
        live.wait(timeout=60)
    assert not made.exists()  # removed with its writer's scratch folder at exit
