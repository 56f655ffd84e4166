"""Progress: a live status line on a terminal, periodic plain lines elsewhere, none in JSON;
the core reports through `ui.progress`, to the Output the running verb installed."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

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


def _run_on_a_terminal(env: dict, script: str = SCRIPT) -> bytes:
    """Run `script` with stdout/stderr on a pseudo-terminal; everything it wrote."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
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
    # the first at once (a start line), then at most one every PLAIN_INTERVAL
    assert [ln.split("] ", 1)[1] for ln in lines] == ["step 0", "step 2", "step 4"]
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


def test_progress_goes_to_the_output_the_verb_installed(capsys):
    ui.progress("before")  # no verb running: nowhere, no error
    out = ui.Output(verbose=True)
    with out.reporting():
        ui.progress("inside")
    ui.progress("after")
    err = capsys.readouterr().err
    assert "inside" in err and "before" not in err and "after" not in err
    with ui.Output(json_mode=True).reporting():
        ui.progress("json")
    assert capsys.readouterr().err == ""


def test_a_silent_step_gets_keep_alive_lines_and_a_last_line(monkeypatch, capsys):
    monkeypatch.setattr(ui, "PLAIN_INTERVAL", 0.2)
    out = ui.Output()
    with out.reporting():
        ui.progress("fetching")
        ui.progress("applying")  # within the interval: shown by the keep-alive, not now
        time.sleep(0.75)
    out.echo("RESULT")
    time.sleep(0.5)  # the keep-alive is stopped: nothing comes after the result
    captured = capsys.readouterr()
    words = [ln.split("] ", 1)[1] for ln in captured.err.splitlines()]
    assert words[:3] == ["fetching", "applying", "still applying"]
    assert words[-1] == "done" and words.count("done") == 1
    assert captured.out == "RESULT\n"


def test_a_failed_core_call_stops_its_lines_and_leaves_the_last_to_the_error(monkeypatch, capsys):
    monkeypatch.setattr(ui, "PLAIN_INTERVAL", 0.1)
    with pytest.raises(RuntimeError), ui.Output().reporting():
        ui.progress("fetching")
        raise RuntimeError("boom")
    time.sleep(0.3)  # no keep-alive after the failure either
    assert [ln.split("] ", 1)[1] for ln in capsys.readouterr().err.splitlines()] == ["fetching"]


CLOCK_SCRIPT = (
    "import time\n"
    "from patchkit import ui\n"
    "out = ui.Output()\n"
    "with out.reporting():\n"
    "    ui.progress('waiting')\n"
    "    time.sleep(1.6)\n"
    "out.echo('RESULT')\n"
)


def test_the_terminal_clock_runs_while_nothing_new_is_reported():
    seen = _run_on_a_terminal({"NO_COLOR": "1"}, CLOCK_SCRIPT)
    shown = {float(s) for s in re.findall(rb"\[\s*([0-9.]+)s\] waiting", seen)}
    assert b"RESULT" in seen
    assert len(shown) >= 3 and max(shown) - min(shown) >= 1.0, sorted(shown)


# The toy upstream and project of the reliability tests (a local upstream, a five-patch series).
sys.path.insert(0, str(ROOT / "tests" / "reliability"))


SLOW_FETCH_GIT = """#!/bin/sh
# The real git, except that the base's fetch from the toy upstream takes {seconds} s.
case " $* " in
*" fetch --quiet --no-tags --no-write-fetch-head -- "*) sleep {seconds} ;;
esac
exec {git} "$@"
"""


def _console_script() -> Path:
    script = Path(sys.executable).parent / "patchkit"
    if not script.exists():
        pytest.skip(f"no installed patchkit console script beside {sys.executable}")
    return script


def _apply_with_a_slow_fetch(
    tmp_path: Path, *args: str
) -> tuple[list[tuple[float, str]], str, float]:
    """`patchkit apply --target toy` (the installed script, stderr a pipe) whose git fetch of
    the base sleeps: each stderr line with the second it came, stdout, and when it ended."""
    import shutil

    from reliability_support import make_toy

    toy = make_toy(tmp_path / "toy")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(SLOW_FETCH_GIT.format(seconds=7, git=shutil.which("git")))
    (bin_dir / "git").chmod(0o755)
    env = {
        **os.environ,
        **toy.env,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
        "PYTHONPATH": str(ROOT),  # this checkout's patchkit behind the installed script
    }
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(_console_script()), "apply", "--target", "toy", "--into", str(tmp_path / "w"), *args],
        cwd=toy.project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stderr:
            lines.append((time.monotonic() - started, line.rstrip("\n")))

    reader = threading.Thread(target=read)
    reader.start()
    out = proc.stdout.read()
    proc.wait(timeout=120)
    ended = time.monotonic() - started
    reader.join()
    assert proc.returncode == 0, (out, lines)
    return lines, out, ended


def test_a_pipe_gets_a_start_line_at_once_keep_alive_lines_and_a_last_line(tmp_path):
    lines, out, ended = _apply_with_a_slow_fetch(tmp_path)
    words = [text.split("] ", 1)[1] for _, text in lines]
    assert words[0].startswith("fetching toy@"), words
    assert lines[0][0] < ended - 5, "the first line came only as the verb ended"
    stills = [at for (at, _), w in zip(lines, words, strict=True) if w.startswith("still fetching")]
    assert stills and stills[0] < ended - 1, f"no keep-alive during the slow fetch: {words}"
    assert words[-1] == "done" and "applied" in out


def test_json_mode_prints_nothing_on_stderr_through_a_slow_step(tmp_path):
    lines, out, _ = _apply_with_a_slow_fetch(tmp_path, "--json")
    assert lines == [] and out.lstrip().startswith("{")


def test_an_interrupt_as_the_keep_alive_starts_leaves_no_line_and_no_thread(monkeypatch, capsys):
    """Ctrl-C the moment before the keep-alive thread starts: the interrupt goes out of the
    verb's reporting, the keep-alive is stopped and nothing is left to stop at exit (a thread
    recorded before it started made the exit's clean-up fail: cannot join it)."""
    import os
    import signal
    import threading

    from patchkit import cli

    start = threading.Thread.start

    def interrupted(self):
        if self.name == "patchkit-keep-alive":
            os.kill(os.getpid(), signal.SIGINT)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", interrupted)
    monkeypatch.setattr(ui, "PLAIN_INTERVAL", 0.05)
    previous = cli._take_interrupts()
    try:
        with pytest.raises(KeyboardInterrupt), ui.Output().reporting():
            ui.progress("fetching")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    ui.stop_all()  # as at the exit
    time.sleep(0.2)
    assert not [t for t in threading.enumerate() if t.name == "patchkit-keep-alive"]
    assert not ui._LIVE and "still" not in capsys.readouterr().err
