"""Special files and git's stale lock files: a clear one-line error that names the file,
never a hang. A FIFO where the series or a patch file should be would block the reader
forever; a lock file left by a killed git would block every later run without saying why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hostile_index import add_lying_member, bomb_stream
from reliability_support import ROOT, cli, git, make_project, one_or_two_lines, record, rev

SECTION = "bounded input (tests/reliability/test_bounded_input.py)"


def test_fifo_as_series_file_refused(toy, tmp_path):
    series = toy.project / "patches" / "toy" / "series"
    series.unlink()
    os.mkfifo(series)
    done = cli("apply", "--target", "toy", "--into", str(tmp_path / "wt"), env=toy.env, timeout=60)
    assert done.returncode == 2 and one_or_two_lines(done.stderr), done.stderr
    assert "is a FIFO" in done.stderr and str(series) in done.stderr


def test_fifo_as_patch_file_refused(toy, tmp_path):
    patch = toy.project / "patches" / "toy" / next(iter(toy.patches))
    patch.unlink()
    os.mkfifo(patch)
    done = cli("apply", "--target", "toy", "--into", str(tmp_path / "wt"), env=toy.env, timeout=60)
    assert done.returncode == 2 and "is a FIFO" in done.stderr, done.stderr
    done = cli("lint", env=toy.env, timeout=60)  # finishes: lint never opens it
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    record(SECTION, "a FIFO as the series file or as a patch: refused in one line naming it")


def _older_checkout(toy, tmp_path):
    older = tmp_path / "project-v1"
    make_project(older, toy.upstream, toy.base, dict(list(toy.patches.items())[:2]))
    into = tmp_path / "wt"
    done = cli(
        "apply", "--target", "toy", "--into", str(into),
        env={**toy.env, "PATCHKIT_PROJECT": str(older)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return into


def test_stale_index_lock_is_named(toy, tmp_path):
    into = _older_checkout(toy, tmp_path)
    lock = into / ".git" / "index.lock"
    lock.write_text("")
    before = rev(into, "HEAD")
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert str(lock) in done.stderr and "remove" in done.stderr
    assert rev(into, "HEAD") == before and lock.exists()  # a user's lock is theirs to remove
    lock.unlink()
    assert cli("apply", "--target", "toy", "--into", str(into), env=toy.env).returncode == 0


def test_stale_index_lock_in_a_linked_worktree_is_named(toy, tmp_path):
    main = _older_checkout(toy, tmp_path)
    linked = tmp_path / "linked"
    git(main, "worktree", "add", "-q", "--detach", str(linked))
    git(linked, "checkout", "-q", "-b", "mine")
    git_dir = git(linked, "rev-parse", "--absolute-git-dir").strip()
    lock = os.path.join(git_dir, "index.lock")
    open(lock, "w").close()
    done = cli("apply", "--target", "toy", "--into", str(linked), env=toy.env)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert lock in done.stderr, done.stderr
    os.unlink(lock)
    done = cli("apply", "--target", "toy", "--into", str(linked), env=toy.env)
    assert done.returncode == 0, done.stderr


def test_stale_ref_lock_is_named(toy, tmp_path):
    into = _older_checkout(toy, tmp_path)
    lock = into / ".git" / "refs" / "patchkit" / "toy" / "series.lock"
    lock.write_text("")
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    assert done.returncode == 1 and one_or_two_lines(done.stderr), done.stderr
    assert str(lock) in done.stderr and "internal error" not in done.stderr
    record(SECTION, "stale index.lock (checkout, linked worktree) and ref lock: named in the "
           "one-line error with the step to take; nothing moved")  # fmt: skip


# ---------------------------------------------------------------- verify: what it reads, bounded


def _verify_json(*args: str, timeout: float = 60) -> tuple[int, dict]:
    """`patchkit verify --json ...` in a subprocess held to 3 GiB of address space: a read
    without end fails there (it took 22 GB of memory before it was killed), not the machine."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    done = subprocess.run(
        [sys.executable, "-m", "patchkit", "verify", "--json", "--no-cache", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, preexec_fn=limit,
        env={**os.environ, "PATCHKIT_PROFILE": "cu130-sm120"},
    )  # fmt: skip
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)["result"]


def _site_with(tmp_path) -> Path:
    site = tmp_path / "site-packages"
    for dist in ("pk", "other"):
        info = site / f"{dist}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n\n")
        (info / "RECORD").write_text(f"{dist}/x.py,,\n")
    (site / "torch").mkdir()
    (site / "sgl_kernel").mkdir()
    return site


def test_verify_env_reads_no_fifo_nor_device(tmp_path):
    """An environment whose torch/version.py is a FIFO (verify --env waited forever), whose
    sgl_kernel/load_utils.py links to /dev/zero (it read until memory ran out: an internal
    error), one dist's RECORD a FIFO and another's METADATA a link to /dev/zero: verify
    finishes at once, each is one unreadable-file error naming it, and the rest is checked."""
    site = _site_with(tmp_path)
    os.mkfifo(site / "torch" / "version.py")
    (site / "sgl_kernel" / "load_utils.py").symlink_to("/dev/zero")
    os.unlink(site / "pk-1.0.dist-info" / "RECORD")
    os.mkfifo(site / "pk-1.0.dist-info" / "RECORD")
    os.unlink(site / "other-1.0.dist-info" / "METADATA")
    (site / "other-1.0.dist-info" / "METADATA").symlink_to("/dev/zero")
    code, doc = _verify_json("--env", str(site), timeout=60)
    unread = {f["file"]: f["message"] for f in doc["findings"] if f["check"] == "unreadable-file"}
    assert unread == {
        str(site / "torch" / "version.py"): "not read: a FIFO, not a regular file "
        "(the checks that read it are skipped)",
        str(site / "sgl_kernel" / "load_utils.py"): "not read: a character device, not a "
        "regular file (the checks that read it are skipped)",
        str(site / "pk-1.0.dist-info" / "RECORD"): "not read: a FIFO, not a regular file "
        "(the checks that read it are skipped)",
        str(site / "other-1.0.dist-info" / "METADATA"): "not read: a character device, not a "
        "regular file (the checks that read it are skipped)",
    }
    assert code == 1 and {f["severity"] for f in doc["findings"] if f["file"] in unread} == {
        "error"
    }
    record(SECTION, "verify --env: a FIFO or a link to /dev/zero as torch/version.py, "
           "load_utils.py, RECORD or METADATA: one unreadable-file error each")  # fmt: skip


def _lying_wheel(path: Path, member: str, method: int, data: bytes, claim: int) -> None:
    """A wheel whose ``member`` holds ``data`` (compressed by ``method``) while the central
    directory and the local header claim ``claim`` bytes uncompressed."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("bomb-1.0.dist-info/RECORD", "")
        zf.writestr("bomb-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
        add_lying_member(zf, member, method, data, claim)


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA], ids=["bzip2", "lzma"])
def test_verify_wheel_member_that_inflates_past_its_claim_is_read_bounded(tmp_path, method):
    """A wheel's METADATA claiming 200 bytes whose bzip2 (or lzma) stream inflates to 256 MiB
    (2 GiB of it took verify --wheelhouse to 4.2 GB of memory: zipfile's bzip2 and lzma
    readers bound no single step's output): refused as larger than its header says, with
    less than 24 MiB allocated while the wheelhouse is listed (the decoder's own state: 8 MiB
    for lzma); a member's head alike."""
    import tracemalloc

    from patchkit.abi import members, sources

    total = (256 << 20) if method == zipfile.ZIP_BZIP2 else (64 << 20)
    house = tmp_path / "house"
    house.mkdir()
    data = bomb_stream(method, total, head=b"Name: bomb\nVersion: 1.0\n\n")
    _lying_wheel(house / "bomb-1.0-py3-none-any.whl", "bomb-1.0.dist-info/METADATA", method,
                 data, 200)  # fmt: skip
    members.forget_open()
    tracemalloc.start()
    try:
        tree = sources.read_wheelhouse(str(house), str(tmp_path / "scratch"))
        listing = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    ((_, reason),) = tree.invalid
    assert reason == (
        "invalid archive: bomb-1.0.dist-info/METADATA: member 'bomb-1.0.dist-info/METADATA' "
        "is larger than its header says"
    )
    assert listing < 24 << 20, listing
    # a code member's head: 64 bytes taken, not the stream's first step inflated whole
    (entry,) = [e for e in members.central_directory(str(house / "bomb-1.0-py3-none-any.whl"))
                if e.filename.endswith("METADATA")]  # fmt: skip
    wheel = str(house / "bomb-1.0-py3-none-any.whl")
    member = members.Member(entry.filename, None, 200, 0, "", "", wheel=wheel, zinfo=entry)
    tracemalloc.start()
    try:
        head = members.member_head(member)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert head.startswith(b"Name: bomb") and len(head) == members.HEAD_BYTES
    assert peak < 24 << 20, peak
    code, doc = _verify_json("--wheelhouse", str(house))
    assert code == 1 and [f["message"] for f in doc["findings"] if f["check"] == "invalid-archive"]
    record(SECTION, f"verify --wheelhouse: a METADATA claiming 200 bytes whose "
           f"{'bzip2' if method == zipfile.ZIP_BZIP2 else 'lzma'} stream inflates to "
           f"{total >> 20} MiB: refused; at most {listing >> 10} kB allocated (tracemalloc) "
           f"listing the wheel, {peak >> 10} kB reading a head")  # fmt: skip


def test_verify_profile_or_symbol_set_that_is_a_fifo_or_device(tmp_path):
    """`--profile` naming a FIFO (verify waited on it) or a link to /dev/zero is one line of
    error; a profile whose torch symbol set links to /dev/zero (read until memory ran out) is
    the torch-symbols-unreadable error, and the rest is checked."""
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.toml"
    zero.symlink_to("/dev/zero")
    house = tmp_path / "house"
    house.mkdir()
    for path, kind in ((fifo, "a FIFO"), (zero, "a character device")):
        done = subprocess.run(
            [sys.executable, "-m", "patchkit", "verify", "--wheelhouse", str(house),
             "--profile", str(path)],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2 and one_or_two_lines(done.stderr), done.stderr
        assert f"{path} is {kind}, not a regular file" in done.stderr
    text = (ROOT / "build" / "profiles" / "cu130-sm120.toml").read_text()
    profile = tmp_path / "mine.toml"
    profile.write_text(text.replace('"torch-2.9.1.symbols.json.gz"', '"set.json.gz"'))
    (tmp_path / "set.json.gz").symlink_to("/dev/zero")
    code, doc = _verify_json("--wheelhouse", str(house), "--profile", str(profile))
    (bad,) = [f for f in doc["findings"] if f["check"] == "torch-symbols-unreadable"]
    assert "is a character device, not a regular file" in bad["message"]
    record(SECTION, "verify --profile FIFO or /dev/zero: one line; a symbol set linked to "
           "/dev/zero: torch-symbols-unreadable")  # fmt: skip
