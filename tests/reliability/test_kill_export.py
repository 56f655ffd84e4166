"""Interrupt `export` at every one of its git calls (SIGINT, SIGTERM, SIGKILL, through the
`git` wrapper on PATH) and between its file writes (a real signal sent after k files): the
series directory is always either as it was or as a clean export leaves it, a user's own
file in it is never touched, an interrupt says what was left, and the next run finishes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest
from reliability_support import (
    ROOT,
    GitFaults,
    cli,
    one_or_two_lines,
    record,
    snapshot,
    tally_kill,
)
from sampling import rotating

SECTION = "export interrupted (tests/reliability/test_kill_export.py)"
SAMPLED = 9  # interrupts `make test` tries (rotating by commit); PATCHKIT_SAMPLE=all: every one

# Runs the CLI with export's file writer sending SIGNAL to this very process after KILL_AFTER
# complete files: the moment `export` is most exposed.
SIGNAL_BETWEEN_WRITES = """
import os, signal, sys
from patchkit import cli, export
real = export.replace_file
count = [0]
def write(path, data):
    if count[0] == int(os.environ["KILL_AFTER"]):
        count[0] = -10**9  # once: the roll-back writes through here too
        os.kill(os.getpid(), getattr(signal, os.environ["KILL_SIGNAL"]))
    count[0] += 1
    real(path, data)
export.replace_file = write
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.fixture
def exported(toy, tmp_path):
    """A checkout of the toy series, a series directory holding the toy's original patch
    files (which export rewrites) and a user's own file, and both expected states."""
    into = tmp_path / "wt"
    assert cli("apply", "--target", "toy", "--into", str(into), env=toy.env).returncode == 0
    out = tmp_path / "series-dir"
    shutil.copytree(toy.project / "patches" / "toy", out)
    (out / "my-own.patch").write_bytes(b"a user's patch that no series lists\n")
    (out / ".toy-01.patch.swp").write_bytes(b"an editor's swap file\n")
    pristine = tmp_path / "pristine"
    shutil.copytree(out, pristine)
    args = ("export", str(into), "--target", "toy", "--out", str(out))
    done = cli(*args, env=toy.env)
    assert done.returncode == 0, done.stderr
    after = snapshot(out)
    assert after != snapshot(pristine)

    def reset():
        shutil.rmtree(out)
        shutil.copytree(pristine, out)

    reset()
    return args, out, snapshot(pristine), after, reset


def _user_files_intact(out) -> bool:
    return (out / "my-own.patch").read_bytes() == b"a user's patch that no series lists\n" and (
        out / ".toy-01.patch.swp"
    ).read_bytes() == b"an editor's swap file\n"


def test_export_interrupted_at_every_git_call(toy, tmp_path, exported):
    args, out, before, after, reset = exported
    faults = GitFaults.install(tmp_path / "faults")
    faults.arm(0, "KILL")
    assert cli(*args, env={**toy.env, **faults.env()}).returncode == 0
    calls = len(faults.calls())
    assert calls >= 3
    tried = clean = 0
    points = [(at, sig) for at in range(1, calls + 1) for sig in ("INT", "TERM", "KILL")]
    for at, sig in rotating(points, SAMPLED, salt=13):
        reset()
        faults.arm(at, sig)
        done = cli(*args, env={**toy.env, **faults.env()})
        tried += 1
        now = snapshot(out)
        assert now in (before, after), f"call {at} {sig}: a state neither old nor new"
        assert _user_files_intact(out)
        if sig != "KILL":
            assert done.returncode == 130, (at, sig, done.stderr)
            assert one_or_two_lines(done.stderr) and "interrupted" in done.stderr
        again = cli(*args, env=toy.env)
        assert again.returncode == 0 and snapshot(out) == after, again.stderr
        clean += 1
    record(SECTION, f"{calls} git calls x SIGINT/SIGTERM/SIGKILL: {tried} of {len(points)} "
           "interrupts, "
           f"{clean}/{tried} left the old or the new series and a next run that finished; "
           "the user's own files untouched in all")  # fmt: skip


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_export_interrupted_between_file_writes(toy, exported, sig):
    args, out, before, after, reset = exported
    writes = len([k for k in after if k not in before or after[k] != before[k]])
    for k in range(writes):
        reset()
        tally_kill()
        done = subprocess.run(
            [sys.executable, "-c", SIGNAL_BETWEEN_WRITES, *args],
            cwd=ROOT, env={**os.environ, **toy.env, "KILL_AFTER": str(k), "KILL_SIGNAL": sig},
            capture_output=True, text=True,
        )  # fmt: skip
        assert _user_files_intact(out)
        if sig == "SIGKILL":
            assert done.returncode == -signal.SIGKILL
            stray = [n for n in snapshot(out) if n not in before and n not in after]
            assert all(".patchkit-tmp-" in n for n in stray), stray
        else:
            assert done.returncode == 130, done.stderr
            assert one_or_two_lines(done.stderr), done.stderr
            assert "put back" in done.stderr and "nothing was left half-done" in done.stderr
            assert snapshot(out) == before, f"{sig} after {k} files: not put back"
        again = cli(*args, env=toy.env)
        assert again.returncode == 0 and snapshot(out) == after, again.stderr
    record(SECTION, f"{sig} after 0..{writes - 1} of {writes} file writes: "
           + ("the next run finished the export every time" if sig == "SIGKILL"
              else "every file put back, one line saying so, exit 130"))  # fmt: skip
