"""Progress: a live status line on a terminal, periodic plain lines elsewhere, none in JSON."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest
from helpers import ROOT

from patchkit import ui

SCRIPT = (
    "import time\n"
    "from patchkit.ui import Output\n"
    "out = Output()\n"
    "for i in range(3):\n"
    "    out.progress(f'step {i}')\n"
    "    time.sleep(0.3)\n"
    "out.echo('RESULT')\n"
)


def _run_on_a_terminal(env: dict) -> bytes:
    """Run SCRIPT with stdout/stderr on a pseudo-terminal; everything it wrote."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        stdout=follower,
        stderr=follower,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT), "TERM": "xterm"},
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=30)
    os.close(leader)
    return b"".join(chunks)


def test_terminal_gets_a_live_status_line():
    seen = _run_on_a_terminal({"NO_COLOR": "1"})
    assert b"step 2" in seen and b"RESULT" in seen
    assert b"\x1b[" in seen  # cursor control: the line is redrawn, not appended
    assert b"\x1b[3" not in seen.replace(b"\x1b[3D", b"")  # NO_COLOR: no foreground colours


def test_plain_lines_are_periodic(monkeypatch, capsys):
    clock = iter([1.0, 2.0, 6.0, 7.0, 12.5])
    monkeypatch.setattr(ui.time, "monotonic", lambda: next(clock))
    out = ui.Output(_start=0.0)
    for i in range(5):
        out.progress(f"step {i}")
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split("] ", 1)[1] for ln in lines] == ["step 2", "step 4"]
    monkeypatch.undo()
    verbose = ui.Output(verbose=True)
    verbose.progress("a")
    verbose.progress("b")
    assert len(capsys.readouterr().err.splitlines()) == 2


@pytest.mark.parametrize("verbose", [True, False])
def test_json_mode_prints_no_progress(capsys, verbose):
    out = ui.Output(json_mode=True, verbose=verbose)
    out.progress("step")
    assert capsys.readouterr().err == ""
