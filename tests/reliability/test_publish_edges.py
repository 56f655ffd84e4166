"""Where a new checkout goes and what it may borrow: the cases a user's paths and a tampered
mirror bring (names with glob characters, an empty folder with its own mode, the cache itself,
a mirror that borrows objects)."""

from __future__ import annotations

import os
import shutil
import stat

from reliability_support import checkout_problems, cli, git, make_toy, rev, snapshot, tag_release


def test_scratch_of_a_name_with_glob_characters_is_swept_and_no_other(tmp_path):
    toy = make_toy(tmp_path / "toy")
    work = tmp_path / "w"
    work.mkdir()
    stale = work / ".run[1].patchkit-killed"  # what a killed apply into run[1] leaves
    (stale / "tree").mkdir(parents=True)
    live = work / ".abc.patchkit-running"  # another apply's scratch, into abc, still working
    (live / "tree").mkdir(parents=True)
    done = cli("apply", "--target", "toy", "--into", str(work / "run[1]"), env=toy.env)
    assert done.returncode == 0, done.stderr
    assert not stale.exists()
    done = cli("apply", "--target", "toy", "--into", str(work / "a*"), env=toy.env)
    assert done.returncode == 0, done.stderr
    assert live.is_dir(), "the sweep for 'a*' removed the scratch of abc"
    for tree in (work / "run[1]", work / "a*"):
        assert not checkout_problems(tree, {rev(tree, "HEAD")})


def test_an_empty_folder_keeps_its_mode(tmp_path):
    toy = make_toy(tmp_path / "toy")
    into = tmp_path / "shared"
    into.mkdir()
    os.chmod(into, 0o2750)
    done = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(into.stat().st_mode) == 0o2750
    assert not checkout_problems(into, {rev(into, "HEAD")})


def test_a_checkout_inside_the_cache_is_refused(tmp_path):
    toy = make_toy(tmp_path / "toy")
    assert cli("fetch", "--target", "toy", env=toy.env).returncode == 0
    for into in (toy.cache / "tmp" / "import-mine", toy.cache / "mirrors" / "toy.git" / "x"):
        r = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
        assert r.returncode == 2, r.stderr
        assert "inside patchkit's cache" in r.stderr and "Traceback" not in r.stderr
        assert not into.exists()


def test_the_projects_own_checkout_is_refused(tmp_path):
    """`--into` the project (or a folder holding it) would check the series out over its
    own files: refused before anything is fetched or written."""
    toy = make_toy(tmp_path / "toy")
    git(toy.project, "init", "-q")
    git(toy.project, "add", "-A")
    git(toy.project, "commit", "-qm", "the project")
    before = snapshot(toy.project)
    for into in (toy.project, toy.project.parent):
        r = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "holds this project" in r.stderr and "Traceback" not in r.stderr
    assert snapshot(toy.project) == before


def test_a_mirror_that_borrows_its_objects_is_refused(tmp_path):
    """Objects moved out of the mirror behind its own alternates file: refused, nothing made
    (a checkout would otherwise lack them once its own borrowing ends)."""
    toy = make_toy(tmp_path / "toy")
    assert cli("fetch", "--target", "toy", env=toy.env).returncode == 0
    mirror = toy.cache / "mirrors" / "toy.git"
    elsewhere = tmp_path / "elsewhere" / "objects"
    shutil.copytree(mirror / "objects", elsewhere)
    for entry in (mirror / "objects").iterdir():
        if entry.name not in ("info", "pack"):
            shutil.rmtree(entry)
    for pack in (mirror / "objects" / "pack").iterdir():
        pack.unlink()
    (mirror / "objects" / "info" / "alternates").write_text(f"{elsewhere}\n")
    into = tmp_path / "wt"
    r = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "reads objects of another repository" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2  # the error and its next step
    assert not into.exists()
    assert not list(tmp_path.glob(".wt.patchkit-*"))


def test_a_rewritten_loose_object_of_the_series_is_refused(tmp_path):
    """A loose object the series' build wrote into the mirror, rewritten in place (another
    blob's bytes under its name): the checkout is refused in one line naming the file, with
    the build record and without it (a build skips objects the mirror has); nothing made.
    Removing the file, as the hint says, gives the real result again."""
    import zlib

    from patchkit import gitops

    toy = make_toy(tmp_path / "toy")
    first = tmp_path / "first"
    assert cli("apply", "--target", "toy", "--into", str(first), env=toy.env).returncode == 0
    mirror = toy.cache / "mirrors" / "toy.git"
    head, base = rev(first, "HEAD"), rev(first, "refs/patchkit/toy/base")
    repo = gitops.Repo.bare_at(mirror)
    added = [line.split(" ")[0] for line in gitops.objects_since(repo, head, base)]
    blob = next(o for o in added if repo.run("cat-file", "-t", o) == "blob\n")
    path = mirror / "objects" / blob[:2] / blob[2:]
    path.chmod(0o644)
    path.write_bytes(zlib.compress(b"blob 5\0evil\n"))
    for record in ("kept", "removed"):
        if record == "removed":
            for stamp in (toy.cache / "verified").glob("build-*"):
                stamp.unlink()
        into = tmp_path / f"wt-{record}"
        r = cli("apply", "--target", "toy", "--into", str(into), env=toy.env)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"the object file {path} does not hash to its id" in r.stderr, r.stderr
        said = [ln for ln in r.stderr.splitlines() if ln.startswith("patchkit:")]  # not progress
        assert len(said) <= 2 and "Traceback" not in r.stderr
        assert not into.exists() and not list(tmp_path.glob(f".wt-{record}.patchkit-*"))
    path.unlink()
    into = tmp_path / "wt-healed"
    assert cli("apply", "--target", "toy", "--into", str(into), env=toy.env).returncode == 0
    assert rev(into, "HEAD") == head and not checkout_problems(into, {head})


def test_no_write_goes_through_a_link_at_a_scratch_name(tmp_path):
    """The journal beside a checkout and targets.toml are written to new files of random
    names and renamed into place: links planted at the names they used to be written to
    (`.<checkout>.patchkit.journal.tmp`, `patches/.targets.toml.tmp`) lead nowhere."""
    toy = make_toy(tmp_path / "toy")
    into = tmp_path / "wt"
    assert cli("apply", "--target", "toy", "--into", str(into), env=toy.env).returncode == 0
    tag_release(toy, "v1.1", files={"pkg/extra.py": "extra = 1\n"})
    victims = {}
    for link in (tmp_path / ".wt.patchkit.journal.tmp", toy.project / "patches/.targets.toml.tmp"):
        victims[link] = tmp_path / f"victim-{len(victims)}"
        victims[link].write_text("mine\n")
        link.symlink_to(victims[link])
    done = cli(
        "apply", "--target", "toy@v1.1", "--allow-unpinned", "--into", str(into), env=toy.env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (into / "pkg" / "extra.py").is_file()
    done = cli("rebase", "--target", "toy@v1.1", "--write", env=toy.env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "v1.1" in (toy.project / "patches" / "targets.toml").read_text()
    for link, victim in victims.items():
        assert victim.read_text() == "mine\n", link
        assert link.is_symlink()
