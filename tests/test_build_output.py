"""The build backend's output, as the installed `patchkit` console script shows it: streamed
live to stderr under `-v` (stdout keeps the one `--json` document), kept in the build log
otherwise, and its last lines quoted in the one-line error when the backend fails.

The builds are real: the pinned FlashInfer 0.6.3 sdist, its series and its own in-tree backend
(setuptools underneath), run by the PyPA frontend; the failing build adds one more patch to the
series that makes that backend print, wait and raise.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, git, private_cache
from wheel_fixtures import scratch_project

STREAMED = "    | "  # how a line of the backend's output is shown under -v
PLANTED = (
    "    print('planted: the backend starts')\n"
    "    __import__('time').sleep(4)\n"
    "    raise RuntimeError('planted: the backend fails')\n"
)


def _console_script() -> Path:
    script = Path(sys.executable).parent / "patchkit"
    if not script.exists():
        pytest.skip(f"no installed patchkit console script beside {sys.executable}")
    return script


def _env(root: Path, warm: Path) -> dict[str, str]:
    project = scratch_project(root / "project")
    # as in a user's shell: a backend's stdout on a pipe is block-buffered unless patchkit says
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return {
        **env,
        "PATCHKIT_PROJECT": str(project),
        "PATCHKIT_CACHE": str(private_cache(warm, root / "cache")),
        "PATCHKIT_OFFLINE_GIT": "1",
        # This checkout's patchkit behind the installed script (an editable install may point
        # at another checkout).
        "PYTHONPATH": str(ROOT),
    }


def _build(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(_console_script()), "build", "--target", "flashinfer", *args],
        cwd=env["PATCHKIT_PROJECT"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _plant_failing_backend(project: Path, warm: Path, scratch: Path, body: str = PLANTED) -> None:
    """Add a patch (git format-patch, as the series holds) that puts `body` first in the
    backend's build_wheel (by default: print a line, wait, then raise)."""
    mirror = warm / "mirrors" / "flashinfer.git"
    base = git(mirror, "log", "--all", "--format=%H", "--grep=flashinfer-python==0.6.3").split()
    original = subprocess.run(
        ["git", "--git-dir", str(mirror), "show", f"{base[0]}:build_backend.py"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    head = "def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):\n"
    assert original.count(head) == 1, "the flashinfer backend changed: update the planted patch"
    repo = scratch / "plant"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "build_backend.py").write_text(original)
    git(repo, "add", "build_backend.py")
    git(repo, "commit", "-q", "-m", "base")
    (repo / "build_backend.py").write_text(original.replace(head, head + body))
    git(repo, "commit", "-q", "-am", "Make the build backend fail")
    patch = git(
        repo,
        "format-patch",
        "-1",
        "--stdout",
        "--keep-subject",
        "--no-stat",
        "--no-signature",
        "--zero-commit",
        "--full-index",
    )
    line = project / "patches" / "flashinfer" / "0.6.3"
    (line / "planted-backend-failure.patch").write_text(patch)
    with (line / "series").open("a") as fh:
        fh.write("planted-backend-failure.patch\n")


@pytest.mark.slow
def test_verbose_streams_the_real_backend_output_to_stderr_and_json_stays_one_document(
    warm_mirrors, tmp_path
):
    env = _env(tmp_path, warm_mirrors)
    proc = _build(env, "--out", str(tmp_path / "dist"), "--json", "-v")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    document = json.loads(out)  # stdout is the one document, nothing else
    assert document["ok"] and document["command"] == "build"
    [wheel] = document["result"]["wheels"]
    streamed = [ln[len(STREAMED) :] for ln in err.splitlines() if ln.startswith(STREAMED)]
    # setuptools' own lines, as the backend printed them, and the same lines in the log
    assert any(ln.startswith("running bdist_wheel") for ln in streamed), err[-2000:]
    log = Path(wheel["log"]).read_text(errors="replace")
    assert [ln for ln in streamed if "bdist_wheel" in ln] == [
        ln for ln in log.splitlines() if "bdist_wheel" in ln
    ]


@pytest.mark.slow
@pytest.mark.long
def test_a_failing_backend_streams_live_under_verbose_and_is_quoted_in_one_line_without(
    warm_mirrors, tmp_path
):
    env = _env(tmp_path, warm_mirrors)
    _plant_failing_backend(Path(env["PATCHKIT_PROJECT"]), warm_mirrors, tmp_path)

    # -v: the planted line reaches the terminal while the backend is still running
    proc = _build(env, "--out", str(tmp_path / "dist-v"), "-v")
    seen_at = None
    lines = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line.rstrip("\n"))
        if seen_at is None and line == f"{STREAMED}planted: the backend starts\n":
            seen_at = time.monotonic()
    proc.wait(timeout=600)
    ended_at = time.monotonic()
    err = "\n".join(lines)
    assert proc.returncode == 1, err[-2000:]
    assert seen_at is not None, err[-2000:]
    assert ended_at - seen_at > 2.5, "the backend's output came only when it had finished"
    assert f"{STREAMED}RuntimeError: planted: the backend fails" in lines
    assert not list((tmp_path / "dist-v").glob("*.whl"))

    # quiet: no backend output, one error line that quotes its last lines and names the log
    quiet = _build(env, "--out", str(tmp_path / "dist"))
    out, err = quiet.communicate(timeout=600)
    assert quiet.returncode == 1
    assert out == ""
    assert STREAMED not in err and "Traceback" not in err
    [error] = [ln for ln in err.splitlines() if ln.startswith("patchkit: error:")]
    assert "the build backend failed" in error
    assert error.endswith("RuntimeError: planted: the backend fails"), error
    assert " | " in error  # more than the last line: the lines before it too
    [hint] = [ln for ln in err.splitlines() if ln.startswith("patchkit: next:")]
    log = Path(hint.split("the full log is ", 1)[1].strip())
    assert "planted: the backend starts" in log.read_text(errors="replace")


@pytest.mark.slow
def test_an_interrupt_under_verbose_stops_the_streaming_backend(warm_mirrors, tmp_path):
    """SIGTERM while -v streams a backend that would run for a minute: patchkit exits 130 in
    seconds and the backend process is gone (killed, not waited for)."""
    env = _env(tmp_path, warm_mirrors)
    hang = (
        "    print('planted: the backend starts', __import__('os').getpid())\n"
        "    __import__('time').sleep(120)\n"
    )
    _plant_failing_backend(Path(env["PATCHKIT_PROJECT"]), warm_mirrors, tmp_path, hang)
    proc = _build(env, "--out", str(tmp_path / "dist"), "-v")
    assert proc.stderr is not None
    backend_pid = None
    for line in proc.stderr:
        if line.startswith(f"{STREAMED}planted: the backend starts "):
            backend_pid = int(line.split()[-1])
            break
    assert backend_pid is not None
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=30) == 130, rest
    assert time.monotonic() - sent < 30, "patchkit waited for the backend to finish"
    assert "patchkit: interrupted" in rest
    with pytest.raises(ProcessLookupError):
        os.kill(backend_pid, 0)
