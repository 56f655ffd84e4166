"""`patchkit lint`: the real series is clean; each rule fires on a series broken on purpose."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest
from helpers import ROOT, patchkit

from patchkit.lint import RULES, lint_target

SYMM = "sm120-torch-symm-mem-allreduce.patch"
KIMI = "kimi-k25-eagle3-delegation.patch"
TODAY = dt.date(2026, 11, 29)


@pytest.fixture
def series_dir(tmp_path) -> Path:
    """A two-patch copy of the real sglang series (independent files)."""
    dest = tmp_path / "sglang"
    dest.mkdir()
    for name in (SYMM, KIMI):
        shutil.copy(ROOT / "patches" / "sglang" / "0.5.9" / name, dest / name)
    (dest / "series").write_text(f"# two patches\n{SYMM}\n{KIMI}\n")
    return dest


def rules(directory: Path, **kw) -> set[str]:
    report = lint_target("sglang", directory, "python", today=TODAY, **kw)
    return {f.rule for f in report.findings}


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_real_series_lints_clean_with_the_reexport(cache):
    r = patchkit("lint", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["errors"] == 0 and report["warnings"] == 0
    assert set(report["checked"]) == {"sglang/0.5.9", "sglang/0.5.12", "flashinfer/0.6.3"}


def test_copy_is_clean(series_dir):
    assert rules(series_dir) == set()


def test_series_missing_extra_duplicate_name(series_dir):
    (series_dir / "series").write_text(f"{SYMM}\n{SYMM}\ngone.patch\nnot a name\n")
    assert rules(series_dir) == {
        "series-duplicate",
        "series-missing",
        "series-extra",
        "series-name",
    }


@pytest.mark.parametrize(
    "old,new,rule",
    [
        ("Forwarded: no\n", "", "metadata-missing"),
        ("Last-Update: 2026-11-29\n", "", "metadata-missing"),
        ("Origin: vendor, patchkit\n", "", "metadata-missing"),
        ("Forwarded: no\n", "Forwarded: yes\n", "metadata-malformed"),
        ("Origin: vendor, patchkit\n", "Origin: someone\n", "metadata-malformed"),
        ("Origin: vendor, patchkit\n", "Origin: backport, a PR somewhere\n", "metadata-malformed"),
        ("Last-Update: 2026-11-29\n", "Last-Update: 29/11/2026\n", "metadata-malformed"),
        ("Last-Update: 2026-11-29\n", "Last-Update: 2027-01-01\n", "metadata-malformed"),
        ("Forwarded: no\n", "Forwarded: no\nBug: sglang#1\n", "metadata-malformed"),
    ],
)
def test_metadata_rules(series_dir, old, new, rule):
    edit(series_dir / SYMM, old, new)
    assert rules(series_dir) == {rule}


def test_forwarded_url_and_not_needed_are_accepted(series_dir):
    edit(
        series_dir / SYMM,
        "Forwarded: no\n",
        "Forwarded: https://github.com/sgl-project/sglang/pull/1\n",
    )
    edit(series_dir / KIMI, "Forwarded: no\n", "Forwarded: not-needed\n")
    assert rules(series_dir) == set()


def test_description_missing(series_dir):
    path = series_dir / KIMI
    text = path.read_text()
    start = text.index("\n\n", text.index("Subject:")) + 2
    path.write_text(text[:start] + text[text.index("Origin:") :])
    assert "description-missing" in rules(series_dir)


def test_trailing_whitespace_and_crlf_in_added_lines(series_dir):
    edit(
        series_dir / KIMI,
        "+    def get_embed_and_head(self):\n",
        "+    def get_embed_and_head(self):  \n",
    )
    edit(series_dir / SYMM, "+    12: {\n", "+    12: {\r\n")
    assert rules(series_dir) == {"trailing-whitespace", "crlf"}


@pytest.mark.parametrize("bad", ["../escape.py", "/etc/passwd", ".git/hooks/post-checkout"])
def test_paths_must_stay_inside_the_target(series_dir, bad):
    path = "python/sglang/srt/models/kimi_k25.py"
    text = (series_dir / KIMI).read_text().replace(f"a/{path}", f"a/{bad}".replace("a//", "/"))
    text = text.replace(f"b/{path}", f"b/{bad}".replace("b//", "/"))
    (series_dir / KIMI).write_text(text)
    assert "path-escape" in rules(series_dir)


def test_path_outside_the_sdist_subdir_is_a_warning(series_dir):
    path = "python/sglang/srt/models/kimi_k25.py"
    text = (series_dir / KIMI).read_text().replace(path, "sgl-kernel/x.py")
    (series_dir / KIMI).write_text(text)
    report = lint_target("sglang", series_dir, "python", today=TODAY)
    assert {f.rule for f in report.findings} == {"path-outside-subdir"}
    assert not report.errors


def test_overlapping_hunks_are_reported(series_dir):
    second = series_dir / "again.patch"
    shutil.copy(series_dir / KIMI, second)
    (series_dir / "series").write_text(f"{SYMM}\n{KIMI}\nagain.patch\n")
    report = lint_target("sglang", series_dir, "python", today=TODAY)
    overlap = [f for f in report.findings if f.rule == "overlap"]
    assert overlap and overlap[0].patch == "again.patch" and KIMI in overlap[0].message
    assert RULES["overlap"][0] == "warning"


def test_reexport_mismatch_is_an_error(series_dir):
    exported = {
        SYMM: (series_dir / SYMM).read_bytes(),
        KIMI: (series_dir / KIMI).read_bytes().replace(b"Subject: ", b"Subject: x"),
    }
    found = rules(series_dir, reexport=lambda target: exported)
    assert found == {"reexport"}


def test_reexport_against_the_pinned_upstream(cache, project):
    """A patch without index lines applies, but is not what the canonical export writes."""
    path = project / "patches" / "sglang" / "0.5.9" / SYMM
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(ln for ln in lines if not ln.startswith("index ")))
    r = patchkit("lint", "--target", "sglang")
    assert r.returncode == 1
    assert f"error: sglang/0.5.9/{SYMM}: [reexport]" in r.stdout
    assert patchkit("lint", "--target", "sglang", "--no-reexport").returncode == 0


def test_every_rule_has_a_severity():
    assert {s for s, _ in RULES.values()} == {"error", "warning"}
