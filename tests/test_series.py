"""Series files and patch parsing, on the project's real series and on crafted patches."""

from __future__ import annotations

import pytest

from patchkit.errors import ConfigError, PatchFormatError
from patchkit.series import load_series, parse_patch, parse_trailers, read_series_file

GOOD = b"""From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: patchkit maintainers <maintainers@patchkit.invalid>
Date: Sun, 29 Nov 2026 00:00:00 +0000
Subject: Make a change

Why it is needed.

Origin: vendor, patchkit
Forwarded: no
Last-Update: 2026-11-29
Patchkit-Tests: tests/payload/test_x.py::test_y tests/payload/test_x.py::test_z
---
diff --git a/python/a.py b/python/a.py
index 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222 100644
--- a/python/a.py
+++ b/python/a.py
@@ -1,2 +1,2 @@
 x = 1
-y = 2
+y = 3
"""


def test_parse_good_patch():
    patch = parse_patch("a.patch", GOOD)
    assert patch.subject == "Make a change"
    assert patch.trailer("Forwarded") == "no"
    assert patch.tests == ["tests/payload/test_x.py::test_y", "tests/payload/test_x.py::test_z"]
    assert [f.path for f in patch.files] == ["python/a.py"]
    assert (patch.added, patch.removed) == (1, 1)
    assert patch.message.startswith("Make a change\n\nWhy it is needed.\n\nOrigin: vendor")


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda b: b"", "empty patch"),
        (lambda b: b"hello\nworld\n", "not a git format-patch"),
        (lambda b: b.replace(b"\n", b"\r\n"), "CRLF"),
        (lambda b: b.replace(b"Why", b"Wh\xff"), "not UTF-8"),
        (lambda b: b.split(b"diff --git")[0], "contains no diff"),
        (
            lambda b: b.replace(b"a/python/a.py", b"a//etc/passwd").replace(
                b"b/python/a.py", b"b//etc/passwd"
            ),
            "absolute path",
        ),
        (lambda b: b.replace(b"python/a.py", b"python/../../a.py"), "climbs out"),
        (lambda b: b.replace(b"python/a.py", b".git/hooks/post-checkout"), "into a .git directory"),
        (lambda b: b.replace(b"@@ -1,2 +1,2 @@", b"@@ -1,5 +1,9 @@"), "malformed diff"),
        (lambda b: b.replace(b"Subject: Make a change\n", b""), "no Subject"),
        (lambda b: b.split(b"--- a/")[0] + b"GIT binary patch\nliteral 1\nzz\n", "binary"),
    ],
)
def test_hostile_or_malformed_patches_are_refused(mutate, words):
    with pytest.raises(PatchFormatError) as info:
        parse_patch("evil.patch", mutate(GOOD))
    assert words in str(info.value)
    assert "evil.patch" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_plain_diff_is_refused_with_the_import_step(tmp_path):
    """A diff without the format-patch envelope names `patchkit import` as the next step;
    listed in a series, the step names the file, the target and --into-series."""
    plain = GOOD[GOOD.index(b"diff --git ") :]
    unified = plain[plain.index(b"--- a/") :]  # `diff -u` output, no `diff --git` line
    (tmp_path / "fix.patch").write_bytes(plain)
    (tmp_path / "series").write_text("fix.patch\n")

    for raw in (plain, unified):
        with pytest.raises(PatchFormatError, match="not a git format-patch file") as info:
            parse_patch("fix.patch", raw)
        assert info.value.hint == (
            "turn it into a series with `patchkit import fix.patch --target T`"
        )
    with pytest.raises(PatchFormatError) as listed:
        load_series(tmp_path, "sglang")
    assert listed.value.hint == (
        f"take it out of {tmp_path / 'series'}, then turn it into a series with "
        f"`patchkit import {tmp_path / 'fix.patch'} --target sglang --into-series`"
    )
    with pytest.raises(PatchFormatError) as prose:  # not a diff at all: no import advice
        parse_patch("notes.patch", b"just some notes\n")
    assert prose.value.hint is None


def test_symlink_creation_refused():
    raw = GOOD.split(b"diff --git")[0] + (
        b"diff --git a/python/link b/python/link\nnew file mode 120000\n"
        b"index 0000000000000000000000000000000000000000..1111111111111111111111111111111111111111\n"  # noqa: E501
        b"--- /dev/null\n+++ b/python/link\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n"  # noqa: E501
    )
    with pytest.raises(PatchFormatError, match="symlink"):
        parse_patch("link.patch", raw)


def test_trailers_only_from_last_paragraph():
    assert parse_trailers("Subject\n\nBody: not a trailer here.\nmore\n\nA: 1\nB: 2\n") == [
        ("A", "1"),
        ("B", "2"),
    ]
    assert parse_trailers("Body only\n") == []


def test_series_file_comments_and_duplicates(tmp_path):
    (tmp_path / "series").write_text("# c\n\na.patch  # why\nb.patch\n")
    assert [e.name for e in read_series_file(tmp_path / "series")] == ["a.patch", "b.patch"]
    (tmp_path / "series").write_text("a.patch\na.patch\n")
    (tmp_path / "a.patch").write_bytes(GOOD)
    with pytest.raises(ConfigError, match="listed twice"):
        load_series(tmp_path, "t")
    (tmp_path / "series").write_text("missing.patch\n")
    with pytest.raises(ConfigError, match="not a file"):
        load_series(tmp_path, "t")
    (tmp_path / "series").write_text("../escape.patch\n")
    with pytest.raises(ConfigError, match="not a patch file name"):
        load_series(tmp_path, "t")


def test_series_hash_changes_with_any_byte(tmp_path):
    (tmp_path / "series").write_text("a.patch\n")
    (tmp_path / "a.patch").write_bytes(GOOD)
    first = load_series(tmp_path, "t").hash()
    (tmp_path / "a.patch").write_bytes(GOOD.replace(b"y = 3", b"y = 4"))
    assert load_series(tmp_path, "t").hash() != first


def test_real_series_parses_with_required_metadata(workspace):
    for name in workspace.targets.targets:
        series = workspace.series(name)
        assert series.patches, f"{name} series is empty"
        for patch in series.patches:
            for key in ("Origin", "Forwarded", "Last-Update", "Patchkit-Tests"):
                assert patch.trailer(key), f"{patch.name} lacks {key}"
            assert patch.tests
