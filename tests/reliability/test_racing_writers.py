"""Every pair of verbs that write patches/ (`export`, `import --into-series`, `rebase --write`),
raced deterministically: the first is held in a planted pause after it has read the series
(and targets.toml) and before it writes, the second runs to completion meanwhile, then the
first goes on. The first must find under the locks that what it read changed and refuse in
one line, exit 1, writing nothing: patches/ stays exactly as the second left it.

Before the shared check (`export.unchanged_since`), `rebase --write` held in that pause wrote
the series it had read over the patch an `import --into-series` had added meanwhile (gone
from the series and the disk, both runs exit 0, lint clean afterwards), and an `export` or a
`rebase --write` wrote over another's patches; a `rebase --continue --write` dropped a patch
imported since its conflict."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability_support import (
    ROOT,
    Toy,
    cli,
    git,
    make_toy,
    one_or_two_lines,
    record,
    snapshot,
    tag_release,
)

SECTION = "racing writers of patches/ (tests/reliability/test_racing_writers.py)"

# Runs the CLI with the function named by PAUSE_AT (module:function, called after the verb
# read the series and before it takes any lock) held until PAUSE_DIR/go exists; PAUSE_DIR/ready
# says the pause was reached.
PAUSED = """
import importlib, os, sys, time
from pathlib import Path
from patchkit import cli
module, name = os.environ["PAUSE_AT"].split(":")
owner = importlib.import_module(module)
real = getattr(owner, name)
here = Path(os.environ["PAUSE_DIR"])
def paused(*args, **kwargs):
    (here / "ready").touch()
    deadline = time.monotonic() + 120
    while not (here / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return real(*args, **kwargs)
setattr(owner, name, paused)
sys.exit(cli.main(sys.argv[1:]))
"""

# Where each verb is held: after its read, before its write and before any lock.
PAUSE_AT = {
    "export": "patchkit.export:write_series",
    "import": "patchkit.commands.import_:write_proposal",
    "rebase": "patchkit.commands.rebase:write_rebase",
}
VERBS = tuple(PAUSE_AT)
IMPORTED = {"first": "pkg/mod09/file00.py", "second": "pkg/mod10/file00.py"}


def _prepare(toy: Toy, tmp_path: Path, role: str, verb: str) -> tuple[str, ...]:
    """The command line of `verb` in the race, its inputs made on the series as it is now:
    export a checkout whose last patch was edited, import a diff of one more file, rebase
    onto the toy's release 1.1."""
    if verb == "export":
        into = tmp_path / f"checkout-{role}"
        done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
        assert done.returncode == 0, done.stderr
        renamed = into / "pkg/mod05/renamed.py"
        renamed.write_text(renamed.read_text() + f"# edited in the {role} checkout\n")
        git(into, "commit", "-qa", "--amend", "--no-edit")
        return ("export", str(into))
    if verb == "import":
        plain = tmp_path / f"plain-{role}"
        if not plain.exists():
            git(tmp_path, "clone", "-q", str(toy.upstream), str(plain))
            git(plain, "checkout", "-q", "v1.0")
        changed = plain / IMPORTED[role]
        changed.write_text(changed.read_text() + f"# imported by the {role} run\n")
        diff = tmp_path / f"{role}.diff"
        diff.write_text(git(plain, "diff"))
        git(plain, "checkout", "-q", "--", ".")
        return ("import", str(diff), "--target", "toy", "--into-series")
    return ("rebase", "--target", "toy@v1.1", "--write")


@pytest.fixture
def race_toy(tmp_path) -> Toy:
    """The toy with a release 1.1 that rewrites the first line of three files its patches
    edit (so rebase --write refreshes them and moves the pin)."""
    toy = make_toy(tmp_path / "toy")
    edited = ("pkg/mod00/file00.py", "pkg/mod01/file03.py", "pkg/mod02/file07.py")
    tag_release(toy, "v1.1", {f: (0, f"# 1.1 rewrote the first line of {f}") for f in edited})
    return toy


def _race(toy: Toy, tmp_path: Path, first: tuple[str, ...], second: tuple[str, ...], verb: str):
    """Run `first` held in its pause, `second` (if any) to completion, then let `first` go on;
    returns (first's exit code, stdout, stderr), second's result, patches/ as second left it."""
    pause = tmp_path / f"pause-{verb}"
    pause.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSED, *first],
        cwd=ROOT,
        env={**os.environ, **toy.env, "PAUSE_AT": PAUSE_AT[verb], "PAUSE_DIR": str(pause)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (pause / "ready").exists():
            assert proc.poll() is None, f"{first} ended before its pause: {proc.communicate()}"
            assert time.monotonic() < deadline, f"{first} never reached its pause"
            time.sleep(0.02)
        other = cli(*second, env=toy.env) if second else None
        between = snapshot(toy.project / "patches")
    finally:
        (pause / "go").touch()
    out, err = proc.communicate(timeout=120)
    return (proc.returncode, out, err), other, between


@pytest.mark.parametrize(
    ("held", "meanwhile"),
    [(a, b) for a in VERBS for b in VERBS],
    ids=[f"{a}-held-{b}-meanwhile" for a in VERBS for b in VERBS],
)
def test_a_writer_refuses_when_another_wrote_since_it_read(race_toy, tmp_path, held, meanwhile):
    toy = race_toy
    first = _prepare(toy, tmp_path, "first", held)
    second = _prepare(toy, tmp_path, "second", meanwhile)
    before = snapshot(toy.project / "patches")
    (rc, out, err), other, between = _race(toy, tmp_path, first, second, held)
    assert other.returncode == 0, other.stdout + other.stderr
    assert between != before, "the run in between changed nothing"
    # What the held run read is gone: it refuses in one line, exit 1, and writes nothing.
    assert snapshot(toy.project / "patches") == between, (rc, out, err)
    assert rc == 1 and one_or_two_lines(err), (rc, out, err)
    assert "nothing was written" in err and "run the same command again" in err, err
    record(SECTION, f"{held} held after its read, {meanwhile} meanwhile: refused, exit 1")


def test_rebase_write_keeps_the_patch_an_import_added_meanwhile(race_toy, tmp_path):
    """The issue: `rebase --write` and `import --into-series` at once, both exit 0, the
    imported patch gone from the series and the disk. Now the rebase refuses; run again it
    carries the imported patch too."""
    toy = race_toy
    rebase = _prepare(toy, tmp_path, "first", "rebase")
    imported = _prepare(toy, tmp_path, "second", "import")
    (rc, _, err), other, _ = _race(toy, tmp_path, rebase, imported, "rebase")
    assert other.returncode == 0, other.stderr
    series_dir = toy.project / "patches" / "toy"
    name = "mod10-file00-changes.patch"
    assert name in (series_dir / "series").read_text().split(), (rc, err)
    assert (series_dir / name).is_file(), (rc, err)
    assert rc == 1 and f"{name} added" in err, err
    again = cli(*rebase, env=toy.env)
    assert again.returncode == 0, again.stderr
    assert name in (series_dir / "series").read_text().split()
    assert (series_dir / name).is_file()
    assert 'pin = "1.1"' in (toy.project / "patches" / "targets.toml").read_text()


@pytest.mark.parametrize("held", VERBS)
def test_a_held_writer_with_nothing_meanwhile_writes(race_toy, tmp_path, held):
    """The pause alone changes nothing: with no other run in it, the held verb writes."""
    toy = race_toy
    first = _prepare(toy, tmp_path, "first", held)
    before = snapshot(toy.project / "patches")
    (rc, _, err), _, between = _race(toy, tmp_path, first, (), held)
    assert between == before
    assert rc == 0, err
    assert snapshot(toy.project / "patches") != before


def test_rebase_continue_write_keeps_a_patch_imported_since_the_conflict(tmp_path):
    """A rebase stopped at a conflict read its series hours before `--continue --write`: a
    patch imported meanwhile is not in its conflict work tree, and writing the rebase used
    to drop it (labelled `dropped`, deleted from the folder). The work tree records what the
    series was read from; the write is refused and the work tree kept."""
    toy = make_toy(tmp_path / "toy")
    tag_release(toy, "v1.1", {"pkg/mod00/file00.py": (5, "upstream rewrote A")})
    done = cli("rebase", "--target", "toy@v1.1", "--conflict-tree", env=toy.env)
    assert done.returncode == 1, done.stdout + done.stderr
    tree = toy.project / "work" / "rebase" / "toy"
    git(tree, "checkout", "--theirs", "--", "pkg/mod00/file00.py")
    git(tree, "add", "--", "pkg/mod00/file00.py")
    imported = _prepare(toy, tmp_path, "second", "import")
    assert cli(*imported, env=toy.env).returncode == 0
    series_dir = toy.project / "patches" / "toy"
    name = "mod10-file00-changes.patch"
    before = snapshot(toy.project / "patches")
    done = cli("rebase", "--target", "toy", "--continue", "--write", env=toy.env)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stdout + done.stderr
    assert f"{name} added" in done.stderr and "--abort" in done.stderr, done.stderr
    assert snapshot(toy.project / "patches") == before
    assert (series_dir / name).is_file() and tree.is_dir()
