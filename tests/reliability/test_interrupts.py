"""Interrupts at the awkward moments of an apply: a SIGKILL while checking out into a
`git init`-ed empty folder (an unborn branch), and a second Ctrl-C while the first is being
cleaned up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability_support import ROOT, cli, git, leftovers, one_or_two_lines, rev, start_cli

# The in-place checkout replaced by one that writes every other file of the result into the
# index and the work tree (as `git checkout` does, file by file), leaves git's index.lock and
# SIGKILLs the process: it needs no HEAD, so it works on an unborn branch too.
KILL_IN_UNBORN = """
import os, signal, sys
from patchkit import cli, gitops
def partial(repo, branch, sha):
    paths = repo.run("ls-tree", "-r", "--name-only", "-z", sha).split("\\0")
    for path in [p for p in paths if p][::2]:
        repo.run("checkout", sha, "--", path)
    open(os.path.join(repo.path, ".git", "index.lock"), "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
gitops.checkout_branch = partial
sys.exit(cli.main(sys.argv[1:], exiting=True))  # as the console script
"""


def _apply(toy, into):
    return cli("apply", "--target", "toy", "--into", str(into), env=toy.env)


def _killed_in_unborn_checkout(toy, args: tuple[str, ...]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", KILL_IN_UNBORN, *args],
        cwd=ROOT,
        env={**os.environ, **toy.env},
        capture_output=True,
        text=True,
    )


def test_kill_in_unborn_checkout_is_put_back(toy, tmp_path):
    into = tmp_path / "wt"
    into.mkdir()
    git(into, "init", "-q", "-b", "work")
    args = ("apply", "--target", "toy", "--into", str(into))
    killed = _killed_in_unborn_checkout(toy, args)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    journal = into.parent / f".{into.name}.patchkit.journal"
    assert journal.exists()
    done = _apply(toy, into)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert git(into, "symbolic-ref", "--short", "HEAD").strip() == "patchkit/toy"
    assert git(into, "status", "--porcelain").strip() == ""
    assert not (into / ".git" / "index.lock").exists()
    assert not leftovers(tmp_path, "wt", toy.cache)
    # killed again, then the user commits on the unborn branch: refused, naming the journal
    git(into, "checkout", "-q", "--orphan", "work2")
    git(into, "rm", "-rq", "--cached", ".")
    for p in into.iterdir():
        if p.name != ".git":
            subprocess.run(["rm", "-rf", str(p)], check=True)
    killed = _killed_in_unborn_checkout(toy, args)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (into / ".git" / "index.lock").unlink()
    (into / "mine.txt").write_text("the user's own file\n")
    git(into, "add", "mine.txt")
    done = _apply(toy, into)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert str(journal) in done.stderr and "will not guess" in done.stderr
    assert journal.exists() and rev(into, "HEAD") is None


# The first Ctrl-C planted as the checkout into a new folder starts, the second as the run's
# scratch folder is being removed on the way out: the clean-up of the first interrupt.
TWO_INTERRUPTS = """
import os, signal, sys
from patchkit import apply, cli, scratch
publish, remove = apply._publish_new, scratch._remove
def first(*args):
    os.kill(os.getpid(), signal.SIGINT)
    return publish(*args)
def second(pid):
    os.kill(os.getpid(), signal.SIGINT)
    return remove(pid)
apply._publish_new, scratch._remove = first, second
sys.exit(cli.main(sys.argv[1:], exiting=True))  # as the console script
"""


# A Ctrl-C the moment the folder beside --into exists, before anything could record it for
# removal: the interrupt comes as `mkdir` returns.
INTERRUPT_AS_FOLDER_MADE = """
import os, signal, sys
from patchkit import cli
mkdir = os.mkdir
def made(path, *args, **kwargs):
    mkdir(path, *args, **kwargs)
    if ".wt.patchkit-" in os.fspath(path):
        os.kill(os.getpid(), signal.SIGINT)
os.mkdir = made
sys.exit(cli.main(sys.argv[1:], exiting=True))  # as the console script
"""


def _scratch_left(tmp: Path, parent: Path, toy) -> list[str]:
    return [str(p) for p in tmp.iterdir()] + leftovers(parent, "wt", toy.cache)


def _planted_apply_leaves_nothing(script: str, toy, tmp_path: Path) -> None:
    """`apply --into` run under `script` (interrupts planted): 130, one or two lines, no
    --into and nothing left in $TMPDIR or beside it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    into = tmp_path / "wt"
    done = subprocess.run(
        [sys.executable, "-c", script, "apply", "--target", "toy", "--into", str(into)],
        cwd=ROOT,
        env={**os.environ, **toy.env, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 130 and one_or_two_lines(done.stderr), done.stderr
    assert not into.exists()
    assert not _scratch_left(tmp, tmp_path, toy)


def test_second_interrupt_during_cleanup_is_ignored(toy, tmp_path):
    _planted_apply_leaves_nothing(TWO_INTERRUPTS, toy, tmp_path)


def test_an_interrupt_as_the_folder_beside_into_is_made_leaves_nothing(toy, tmp_path):
    """The folder a new checkout is made in, beside --into, goes with the run's scratch folder
    whenever the interrupt comes (it was left behind when the interrupt came between making it
    and the block that removes it)."""
    _planted_apply_leaves_nothing(INTERRUPT_AS_FOLDER_MADE, toy, tmp_path)


@pytest.mark.parametrize("delay", [0.0, 0.2, 0.5, 1.0])
def test_two_ctrl_c_in_a_row(toy, tmp_path, delay):
    """Two SIGINTs 30 ms apart, at several moments after the run made its scratch folder:
    one line, exit 130, nothing left behind (into is absent or the whole result)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    into = tmp_path / "wt"
    proc = start_cli(
        "apply", "--target", "toy", "--into", str(into), env={**toy.env, "TMPDIR": str(tmp)}
    )
    deadline = time.monotonic() + 60
    while proc.poll() is None and not any(tmp.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(delay)
    sent = proc.poll() is None
    for _ in range(2):
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        time.sleep(0.03)
    _, stderr = proc.communicate(timeout=120)
    assert "Traceback" not in stderr, stderr
    if sent and proc.returncode != 0:
        assert proc.returncode == 130 and one_or_two_lines(stderr), stderr
    assert not _scratch_left(tmp, tmp_path, toy)
    if into.exists():
        assert git(into, "status", "--porcelain").strip() == ""


def test_an_interrupt_in_a_held_section_is_raised_as_it_ends():
    """patchkit's SIGINT handler, called (as Python calls it, in the main thread) while the
    main thread is inside `scratch.signals_held`, raises nothing there and KeyboardInterrupt
    as the outermost section ends; outside one it raises at once; a section of another thread
    holds nothing back.  This is what keeps a scratch folder from being made without being
    recorded for removal, and a git from starting unwatched (the two Ctrl-C above)."""
    import threading

    from patchkit import cli, scratch

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    reached = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with scratch.signals_held():
                with scratch.signals_held():
                    cli._on_interrupt(signal.SIGINT, None)
                    reached.append("inner")
                reached.append("outer")
        assert reached == ["inner", "outer"]
        with pytest.raises(KeyboardInterrupt):
            cli._on_interrupt(signal.SIGINT, None)  # no section: at once
        with scratch.signals_held():
            pass  # nothing pending any more
        held_elsewhere = threading.Event()
        release = threading.Event()

        def other_thread():
            with scratch.signals_held():
                held_elsewhere.set()
                release.wait(10)

        worker = threading.Thread(target=other_thread)
        worker.start()
        held_elsewhere.wait(10)
        try:
            with pytest.raises(KeyboardInterrupt):
                cli._on_interrupt(signal.SIGINT, None)
        finally:
            release.set()
            worker.join()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# Ctrl-C while the program starts (`python -m patchkit`), before `cli.main` takes the
# signals: a finder planted at start-up (sitecustomize) sends it as a module is looked up
INTERRUPT_AS_IT_STARTS = """
import os, signal, sys
module, signum = os.environ["PK_AT_MODULE"], getattr(signal, os.environ["PK_SIGNAL"])
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == module:
            os.kill(os.getpid(), signum)
        return None
sys.meta_path.insert(0, Interrupt())
"""


@pytest.mark.parametrize("module", ["patchkit.cli", "click"])
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_an_interrupt_as_the_program_starts_is_one_line_and_130(tmp_path, module, signame):
    """Before `cli.main` takes SIGINT and SIGTERM, while the program imports what it needs:
    one line and 130 (it was the interpreter's KeyboardInterrupt traceback, or for SIGTERM a
    kill with no word)."""
    (tmp_path / "sitecustomize.py").write_text(INTERRUPT_AS_IT_STARTS)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PK_AT_MODULE": module,
           "PK_SIGNAL": signame}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "patchkit", "--version"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == "patchkit: interrupted; nothing was left half-done\n"
    # imported rather than run, patchkit leaves the signals alone
    imported = subprocess.run(
        [sys.executable, "-c", "import signal, patchkit; "
         "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr


# Ctrl-C the moment patchkit's handler is taken at the start of a run, or as the run's JSON
# envelope is printed after the verb
INTERRUPT_AT_THE_EDGES = """
import os, signal, sys
from patchkit import cli, ui
where = sys.argv.pop(1)
real_signal, real_envelope = signal.signal, ui.print_envelope
def taken(signum, handler):
    old = real_signal(signum, handler)
    if where == "start" and signum == signal.SIGINT and handler is cli._on_interrupt:
        os.kill(os.getpid(), signal.SIGINT)
    return old
def envelope(*args, **kwargs):
    if where == "envelope":
        os.kill(os.getpid(), signal.SIGINT)
    return real_envelope(*args, **kwargs)
signal.signal, ui.print_envelope = taken, envelope
sys.exit(cli.main(sys.argv[1:], exiting=True))  # as the console script
"""


@pytest.mark.parametrize("where", ["start", "envelope"])
def test_an_interrupt_at_a_runs_edges_is_answered(where):
    """As the handler is taken the interrupt is the run's: one line and 130; once the verb is
    done (its envelope printing) it changes nothing: the result and 0. Both gave a traceback,
    the handler being patchkit's outside the block that answers it."""
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPT_AT_THE_EDGES, where, "lint", "--json"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    if where == "start":
        assert done.returncode == 130 and one_or_two_lines(done.stderr), done.stderr
    else:
        assert done.returncode == 0 and done.stdout.startswith("{"), done.stderr
