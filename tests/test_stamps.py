"""`stamps.Stamp`: a record is read back only whole and under its own key; it is data."""

from __future__ import annotations

import os

import pytest

from patchkit import stamps
from patchkit.stamps import Stamp


def test_a_record_reads_back_under_its_key_only(tmp_path):
    stamp = Stamp(tmp_path / "verified" / "build-x-abc", "k1")
    assert stamp.payload() is None and not stamp.holds()
    assert stamp.record('{"built": []}')
    assert stamp.payload() == '{"built": []}' and stamp.holds()
    assert Stamp(stamp.path, "k2").payload() is None  # another key: a miss
    assert stamp.record() and stamp.payload() == ""  # replaced whole
    assert sorted(p.name for p in stamp.path.parent.iterdir()) == ["build-x-abc"]


@pytest.mark.parametrize(
    "content",
    [b"k1", b"", b"k1\xff\n{}", b"k1 \n{}", b"K1\n{}", b"k1\n" + b"x" * (stamps.MAX_STAMP_BYTES)],
    ids=["no newline", "empty", "not utf-8", "key with a space", "other case", "oversized"],
)
def test_a_damaged_or_foreign_stamp_is_a_miss(tmp_path, content):
    path = tmp_path / "s"
    path.write_bytes(content)
    assert Stamp(path, "k1").payload() is None


def test_a_symlinked_stamp_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = tmp_path / "verified" / "s"
    path.parent.mkdir()
    path.symlink_to(victim)
    assert Stamp(path, "k1").payload() is None  # the victim does not start with the key
    assert Stamp(path, "k1").record("x")
    assert victim.read_text() == "precious" and not path.is_symlink()


def test_an_unwritable_cache_loses_the_record_not_the_run(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    stamp = Stamp(blocked / "verified" / "s", "k1")  # its folder cannot be made
    assert stamp.record("x") is False and stamp.payload() is None


def test_an_interrupted_write_leaves_no_temporary(tmp_path, monkeypatch):
    stamp = Stamp(tmp_path / "s", "k1")
    assert stamp.record("old")

    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        stamp.record("new")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["s"] and stamp.payload() == "old"
