"""Warm runs ask the network less: a git host that is down is remembered for a while
(`upstream/reach.py`), and the index's release list is kept for a few minutes
(`upstream/releases.py`)."""

from __future__ import annotations

import os
import time

from patchkit.upstream import reach, releases

GITHUB = "https://github.com/sgl-project/sglang.git"
DOWN = "fatal: unable to access 'https://github.com/x/': Could not resolve host: github.com"


def test_a_host_down_is_skipped_for_the_ttl_and_asked_again_after(tmp_path, monkeypatch):
    assert reach.known_unreachable(GITHUB, tmp_path) is None
    reach.note_failure(GITHUB, "fatal: couldn't find remote ref v9", tmp_path)  # an answer
    assert reach.known_unreachable(GITHUB, tmp_path) is None
    reach.note_failure(GITHUB, DOWN, tmp_path)
    why = reach.known_unreachable(GITHUB, tmp_path)
    assert why and why.startswith("skipped: github.com was unreachable 0 s ago (fatal:")
    assert reach.known_unreachable("git@github.com:sgl-project/sglang.git", tmp_path) == why
    assert reach.known_unreachable("https://gitlab.com/x.git", tmp_path) is None
    assert reach.known_unreachable(str(tmp_path / "clone"), tmp_path) is None  # a local path
    note = tmp_path / "network" / "github.com"
    old = time.time() - reach.DEFAULT_TTL - 1
    os.utime(note, (old, old))
    assert reach.known_unreachable(GITHUB, tmp_path) is None
    os.utime(note, None)
    monkeypatch.setenv("PATCHKIT_UNREACHABLE_TTL", "0")
    assert reach.known_unreachable(GITHUB, tmp_path) is None


def test_the_release_list_is_kept_for_the_ttl(tmp_path, monkeypatch):
    asked = []
    listed = [{"filename": "sglang-0.5.10.tar.gz"}, {"filename": "sglang-0.5.11-py3-none-any.whl"}]

    def project_files(name):
        asked.append(name)
        return listed

    monkeypatch.setattr(releases, "project_files", project_files)
    names = ["sglang-0.5.10.tar.gz", "sglang-0.5.11-py3-none-any.whl"]
    assert releases.listed_files("sglang", tmp_path) == names
    assert releases.listed_files("sglang", tmp_path) == names
    assert asked == ["sglang"]
    monkeypatch.setenv("PATCHKIT_INDEX_URL", "https://other.example.invalid/simple")
    assert releases.listed_files("sglang", tmp_path) == names  # another index: asked again
    assert len(asked) == 2
    monkeypatch.setenv("PATCHKIT_INDEX_TTL", "0")
    releases.listed_files("sglang", tmp_path)
    assert len(asked) == 3
    assert releases.listed_files("sglang", None) == names and len(asked) == 4
