"""`patchkit export`: apply then export reproduces the series byte for byte; edits made with
ordinary git (commit --fixup + rebase --autosquash, new commits) export deterministically."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import git, patchkit, series_folder, snapshot

from patchkit.export import slug, split_mbox, strip_patch_trailer


@pytest.mark.parametrize("target", ["sglang", "flashinfer"])
def test_apply_then_export_reproduces_the_real_series(tmp_path, cache, target):
    tree = tmp_path / "tree"
    r = patchkit("apply", "--target", target, "--into", str(tree))
    assert r.returncode == 0, r.stdout + r.stderr
    check = patchkit("export", str(tree), "--check")
    assert check.returncode == 0, check.stdout
    out = tmp_path / "out"
    r = patchkit("export", str(tree), "--out", str(out))
    assert r.returncode == 0, r.stderr
    series = series_folder(Path(os.environ["PATCHKIT_PROJECT"]), target)  # the seed line's
    names = [
        ln
        for ln in (series / "series").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert sorted(p.name for p in out.glob("*.patch")) == sorted(names)
    for name in names:
        assert (out / name).read_bytes() == (series / name).read_bytes(), name
    assert (out / "series").read_text().split() == [n for n in names]


def test_fixup_edit_exports_only_that_patch(tmp_path, cache, project):
    tree = tmp_path / "tree"
    assert patchkit("apply", "--target", "sglang", "--into", str(tree)).returncode == 0
    series_dir = series_folder(project, "sglang")
    before = snapshot(series_dir)
    path = tree / "python/sglang/srt/distributed/device_communicators/all_reduce_utils.py"
    path.write_text(path.read_text() + "# tuned later\n")
    target_commit = git(tree, "log", "--format=%H", "--grep", "symmetric-memory", "-1").strip()
    git(tree, "commit", "-qam", f"fixup! {target_commit}")
    git(
        tree,
        "-c",
        "sequence.editor=true",
        "rebase",
        "-q",
        "-i",
        "--autosquash",
        "refs/patchkit/sglang/base",
        env={"GIT_SEQUENCE_EDITOR": "true"},
    )
    check = patchkit("export", str(tree), "--check")
    assert check.returncode == 1
    assert "1 patch(es) need update" in check.stdout
    r = patchkit("export", str(tree))
    assert r.returncode == 0, r.stderr
    after = snapshot(series_dir)
    changed = sorted(k for k in before if before[k] != after.get(k))
    assert changed == ["sm120-torch-symm-mem-allreduce.patch"]
    text = after["sm120-torch-symm-mem-allreduce.patch"].decode()
    assert "+# tuned later" in text and "Patchkit-Patch" not in text
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "Forwarded: no\n" in text  # message and trailers kept


def _checkout_with_a_new_commit(tree: Path, message: str) -> None:
    """A flashinfer checkout made by apply, with one more commit adding a module."""
    assert patchkit("apply", "--target", "flashinfer", "--into", str(tree)).returncode == 0
    (tree / "flashinfer" / "patchkit_note.py").write_text("NOTE = 1\n")
    git(tree, "add", "flashinfer/patchkit_note.py")
    git(tree, "commit", "-qm", message)


def test_new_commit_is_named_from_its_subject_and_appended(tmp_path, cache, project):
    tree = tmp_path / "tree"
    _checkout_with_a_new_commit(tree, "Add a note module (SM120)\n\nWhy.\n")
    r = patchkit("export", str(tree))
    assert r.returncode == 0, r.stderr
    assert "named from the subject" in r.stdout
    names = (series_folder(project, "flashinfer") / "series").read_text().split("\n")
    assert names[0].startswith("#")  # the comment block is kept
    assert [n for n in names if n and not n.startswith("#")][-1] == "add-a-note-module-sm120.patch"


def test_a_non_ascii_subject_names_the_patch_by_its_letters(tmp_path, cache, project):
    """format-patch writes a non-ASCII subject as RFC 2047 words: the name comes from the
    subject as written, not from `=?UTF-8?q?...`."""
    tree = tmp_path / "tree"
    _checkout_with_a_new_commit(tree, "Überall schön ☃ (SM120)\n\nWhy.\n")
    r = patchkit("export", str(tree))
    assert r.returncode == 0, r.stderr
    names = (series_folder(project, "flashinfer") / "series").read_text().split()
    assert names[-1] == "uberall-schon-sm120.patch", names


def test_export_from_an_older_checkout_keeps_patches_added_since(tmp_path, cache, project):
    """A checkout made before a patch joined the series does not have it: exporting from it
    would delete that patch.  Refused, naming it; after applying again the export keeps it."""
    old, new = tmp_path / "old", tmp_path / "new"
    assert patchkit("apply", "--target", "flashinfer", "--into", str(old)).returncode == 0
    _checkout_with_a_new_commit(new, "Add a note module")
    assert patchkit("export", str(new)).returncode == 0
    folder = series_folder(project, "flashinfer")
    before = snapshot(folder)
    assert "add-a-note-module.patch" in before
    r = patchkit("export", str(old))
    assert r.returncode == 2, r.stdout + r.stderr
    assert (
        "add-a-note-module.patch joined the series" in r.stderr and "apply the series" in r.stderr
    )
    assert snapshot(folder) == before
    assert patchkit("apply", "--target", "flashinfer", "--into", str(old)).returncode == 0
    r = patchkit("export", str(old))
    assert r.returncode == 0, r.stdout + r.stderr
    assert snapshot(folder) == before  # a message without a body exports the same both ways


def test_export_from_an_older_checkout_keeps_a_patch_changed_since(tmp_path, cache, project):
    """Another export changed a patch (same name, other diff) after an older checkout was
    made: exporting from the older one would write its version back over that change.
    Refused, naming it; a checkout applied again exports with the change kept."""
    old, new = tmp_path / "old", tmp_path / "new"
    _checkout_with_a_new_commit(old, "Add a note module")
    assert patchkit("apply", "--target", "flashinfer", "--into", str(new)).returncode == 0
    touched = git(new, "show", "--name-only", "--format=", "HEAD").split()[0]
    with (new / touched).open("a") as fh:
        fh.write("# tuned on the bench\n")
    git(new, "commit", "-qa", "--amend", "--no-edit")
    assert patchkit("export", str(new)).returncode == 0
    folder = series_folder(project, "flashinfer")
    before = snapshot(folder)
    [changed] = [n for n, data in before.items() if b"tuned on the bench" in data]
    r = patchkit("export", str(old))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{changed} changed in" in r.stderr and "write over those changes" in r.stderr
    assert snapshot(folder) == before
    assert patchkit("apply", "--target", "flashinfer", "--into", str(old)).returncode == 0
    assert patchkit("export", str(old)).returncode in (0, 3)
    assert b"tuned on the bench" in (folder / changed).read_bytes()


def test_strip_trailer_of_its_own_paragraph():
    message = (
        b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        b"From: a <a@b.c>\nSubject: x\n\nBody.\n\nPatchkit-Patch: x.patch\n\n"
        b"diff --git a/f b/f\n"
    )
    name, raw = strip_patch_trailer(message)
    assert name == "x.patch"
    assert raw.endswith(b"Body.\n\ndiff --git a/f b/f\n")
    # the trailer as the whole body: format-patch's form of a message without a body
    bare = message.replace(b"Body.\n\n", b"")
    name, raw = strip_patch_trailer(bare)
    assert name == "x.patch" and raw.endswith(b"Subject: x\n\n\ndiff --git a/f b/f\n")


def test_split_mbox_drops_stdout_separators():
    one = b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nA\n"
    assert split_mbox(one + b"\n" + one) == [one, one]


def test_slug():
    assert slug("Fix the thing (SM120) -- now!") == "fix-the-thing-sm120-now.patch"
    assert len(slug("x" * 200)) == 63 + len(".patch")
    assert slug("Überall schön ☃") == "uberall-schon.patch"


# --- export owns only what it wrote ----------------------------------------------------------


def _series_dir(tmp_path, listed: dict[str, bytes], others: dict[str, bytes]):
    from patchkit.export import ExportedPatch  # noqa: F401 - used by callers

    d = tmp_path / "series"
    d.mkdir()
    for name, data in {**listed, **others}.items():
        (d / name).write_bytes(data)
    (d / "series").write_text("# the series\n" + "".join(f"{n}\n" for n in listed))
    return d


def test_export_removes_only_what_the_series_named(tmp_path):
    from patchkit.export import ExportedPatch, write_series

    d = _series_dir(
        tmp_path,
        {"a.patch": b"old a\n", "gone.patch": b"dropped\n"},
        {"mine.patch": b"a user's unrelated patch\n", ".a.patch.swp": b"vim swap\n",
         ".gone.patch.orig": b"backup\n", "notes.txt": b"notes\n"},
    )  # fmt: skip
    report = write_series(d, "t", [ExportedPatch("a.patch", b"new a\n")])
    assert report.removed == ["gone.patch"] and not (d / "gone.patch").exists()
    assert report.left == ["mine.patch"]
    assert (d / "mine.patch").read_bytes() == b"a user's unrelated patch\n"
    assert (d / ".a.patch.swp").read_bytes() == b"vim swap\n"
    assert (d / ".gone.patch.orig").read_bytes() == b"backup\n"
    assert (d / "notes.txt").exists()
    assert (d / "a.patch").read_bytes() == b"new a\n"
    assert (d / "series").read_text() == "# the series\na.patch\n"


def test_export_out_dir_with_unrelated_patches_keeps_them(tmp_path):
    """`export --out DIR` into a directory without a series file removes nothing."""
    from patchkit.export import ExportedPatch, write_series

    d = tmp_path / "out"
    d.mkdir()
    (d / "other-project.patch").write_bytes(b"not ours\n")
    report = write_series(d, "t", [ExportedPatch("x.patch", b"x\n")])
    assert report.removed == [] and report.left == ["other-project.patch"]
    assert (d / "other-project.patch").read_bytes() == b"not ours\n"


def test_export_sweeps_only_its_own_temp_files(tmp_path):
    from patchkit.export import TMP_MARK, ExportedPatch, write_series

    d = _series_dir(tmp_path, {"a.patch": b"a\n"}, {".a.patch.swp": b"swap\n"})
    (d / f".a.patch{TMP_MARK}k1ll3d").write_bytes(b"half")
    write_series(d, "t", [ExportedPatch("a.patch", b"a\n")])
    assert not (d / f".a.patch{TMP_MARK}k1ll3d").exists()
    assert (d / ".a.patch.swp").exists()


def test_interrupted_export_puts_every_file_back(tmp_path, monkeypatch):
    from patchkit import export
    from patchkit.errors import Interrupted

    d = _series_dir(tmp_path, {f"p{i}.patch": b"old\n" for i in range(6)}, {})
    before = snapshot(d)
    real, count = export.replace_file, [0]

    def write(path, data):
        count[0] += 1
        if count[0] == 4:
            raise KeyboardInterrupt  # SIGINT, or SIGTERM as the CLI maps it
        real(path, data)

    monkeypatch.setattr(export, "replace_file", write)
    new = [export.ExportedPatch(f"p{i}.patch", b"new\n") for i in range(5)]
    new.append(export.ExportedPatch("added.patch", b"added\n"))
    with pytest.raises(Interrupted) as caught:
        export.write_series(d, "t", new)
    monkeypatch.setattr(export, "replace_file", real)
    assert "put back" in caught.value.left
    assert snapshot(d) == before
