"""Everything a run creates outside its target is inside its one scratch folder
(`patchkit/scratch.py`, `$TMPDIR/patchkit-run-*`), so a SIGKILL leaves nothing the next run
does not sweep: every temporary folder patchkit makes goes there (checked on the source, and
by killing `apply` inside the folder its patches are written to)."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys

from reliability_support import ROOT, cli, record

SECTION = "scratch only (tests/reliability/test_scratch_only.py)"
# tempfile's makers of named files and folders (TemporaryFile has no name: nothing is left)
MAKERS = {"TemporaryDirectory", "mkdtemp", "mkstemp", "NamedTemporaryFile", "mktemp"}


def _temp_calls_without_a_folder() -> tuple[int, list[str]]:
    """(tempfile calls in patchkit/, those that name no folder: they land in $TMPDIR itself)."""
    total, loose = 0, []
    for path in sorted((ROOT / "patchkit").rglob("*.py")):
        if path.name == "scratch.py":
            continue  # makes the scratch folder itself in $TMPDIR
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in MAKERS:
                continue
            total += 1
            if not any(k.arg == "dir" for k in node.keywords):
                loose.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return total, loose


def test_every_temporary_file_of_patchkit_goes_to_a_named_folder():
    """A temp file or folder patchkit makes names its folder (the scratch folder through
    scratch.temporary_folder, or beside its target); none falls back to $TMPDIR, where a
    killed run would leave it (apply's patchkit-patches-* was left there)."""
    total, loose = _temp_calls_without_a_folder()
    assert not loose, loose
    record(SECTION, f"{total} tempfile calls in patchkit/: 0 without a folder (goal 0)")


# SIGKILL planted while apply's patch files are in their temporary folder.
KILL_WHILE_PATCHES_ARE_WRITTEN = """
import os, signal, sys
from patchkit import apply, cli
def killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
apply.RunTrees.apply = killed
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_killed_apply_leaves_nothing_in_tmpdir_but_its_swept_scratch(toy, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, **toy.env, "TMPDIR": str(tmp)}
    args = ("apply", "--target", "toy", "--into", str(tmp_path / "wt"))
    killed = subprocess.run(
        [sys.executable, "-c", KILL_WHILE_PATCHES_ARE_WRITTEN, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    found = sorted(p.name for p in tmp.iterdir())
    assert found and all(n.startswith("patchkit-run-") for n in found), found
    again = cli(*args, env={**toy.env, "TMPDIR": str(tmp)})
    assert again.returncode == 0, again.stderr
    assert not list(tmp.iterdir()), list(tmp.iterdir())
    assert (tmp_path / "wt" / ".git").is_dir()
    record(SECTION, "apply SIGKILLed while its patches were in their temporary folder: only "
           "its scratch folder in TMPDIR, swept by the next run, which applied")  # fmt: skip


def test_a_scratch_folder_being_made_is_never_swept(tmp_path, monkeypatch):
    """Another run's sweep that lands between the making of a scratch folder's `held` file
    and its flock finds nothing to take (it took the folder being made: its `held` was there
    and not yet locked, as a dead run's is)."""
    from patchkit import scratch

    monkeypatch.setattr(scratch, "_SCRATCH", {})
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(scratch.atexit, "register", lambda *a: None)
    real = scratch.fcntl.flock
    swept = []

    def flock(fd, op):
        if not swept:  # the first flock: the one that takes the new folder's `held`
            swept.append(True)
            monkeypatch.setattr(scratch.fcntl, "flock", real)
            scratch.sweep_dead()  # another run's sweep, in the window
        return real(fd, op)

    monkeypatch.setattr(scratch.fcntl, "flock", flock)
    made = scratch.root()
    assert swept and os.path.isdir(os.path.join(made, "cwd")), os.listdir(tmp_path)
    assert os.path.exists(os.path.join(made, "held"))
