"""`patchkit review`: the terminal table, --against classification, the --since range-diff and
the self-contained HTML page, loaded in a real headless chromium."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from browser.cdp import Browser, find_chromium
from helpers import ROOT, git, patchkit, series_folder
from rebase_fixtures import cache_0510, sglang_0510  # noqa: F401 - fixtures

ARTIFACTS = ROOT / "tests" / "artifacts"
KIMI = "kimi-k25-eagle3-delegation.patch"
SYMM = "sm120-torch-symm-mem-allreduce.patch"
AUX_POST = "eagle3-aux-capture-post-allreduce.patch"


def series_names(root: Path, target: str) -> list[str]:
    text = (series_folder(root, target) / "series").read_text()
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


@pytest.fixture
def versioned_project(project, cache) -> Path:
    """The scratch project as a git repository with one commit, then a new series version:
    KIMI's description edited, SYMM dropped, AUX_POST renamed, one patch added."""
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "series 0.1.0")
    sg = series_folder(project, "sglang")
    text = (sg / KIMI).read_text()
    (sg / KIMI).write_text(
        text.replace(
            "KimiK25ForConditionalGeneration wraps",
            "KimiK25ForConditionalGeneration (Kimi-K2.5) wraps",
        )
    )
    (sg / SYMM).unlink()
    (sg / AUX_POST).rename(sg / "aux-post.patch")
    new = text.replace("Subject: Delegate the EAGLE-3 hooks", "Subject: Delegate EAGLE-3 hooks")
    (sg / "kimi-again.patch").write_text(new)
    names = [
        ("aux-post.patch" if n == AUX_POST else n)
        for n in series_names(project, "sglang")
        if n != SYMM
    ] + ["kimi-again.patch"]
    (sg / "series").write_text("".join(f"{n}\n" for n in names))
    return project


def test_terminal_table_lists_every_patch(cache):
    r = patchkit("review", "--no-diff")
    assert r.returncode == 0, r.stderr
    for target in ("sglang", "flashinfer"):
        for name in series_names(ROOT, target):
            assert name in r.stdout
    assert "not forwarded yet" in r.stdout
    assert "combined delta against v0.5.9" in r.stdout
    full = patchkit("review", "--target", "flashinfer")
    assert "diff --git a/include/flashinfer/comm/trtllm_allreduce.cuh" in full.stdout


@pytest.mark.slow
def test_against_adds_the_rebase_classification(cache_0510):  # noqa: F811
    r = patchkit("review", "--target", "sglang", "--against", "sglang@0.5.10", "--json")
    assert r.returncode == 0, r.stderr
    rows = {p["name"]: p for p in json.loads(r.stdout)["targets"][0]["patches"]}
    assert rows[KIMI]["classification"] == "upstreamed"
    assert any(e.startswith("definitions-present") for e in rows[KIMI]["evidence"])
    assert rows[SYMM]["classification"] == "clean"
    assert rows["cu130-packaging-pins.patch"]["classification"] == "conflict"


def test_since_compares_two_versions_of_the_series(versioned_project):
    r = patchkit("review", "--since", "HEAD", "--no-diff", "--json")
    assert r.returncode == 0, r.stderr
    entries = {e["name"]: e for e in json.loads(r.stdout)["comparison"]["entries"]}
    assert entries[KIMI]["state"] == "changed"
    assert "+KimiK25ForConditionalGeneration (Kimi-K2.5) wraps" in entries[KIMI]["interdiff"]
    assert entries[SYMM]["state"] == "dropped"
    assert entries["aux-post.patch"]["state"] == "changed"
    assert entries["aux-post.patch"]["note"] == f"renamed from {AUX_POST}"
    assert entries["kimi-again.patch"]["state"] == "added"
    assert entries["cu130-packaging-pins.patch"]["state"] == "unchanged"
    assert entries["sm120-trtllm-comm.patch"]["state"] == "unchanged"
    text = patchkit("review", "--since", "HEAD", "--no-diff").stdout
    assert re.search(r"series changes since HEAD \([0-9a-f]{12}, series 0\.1\.0 -> ", text)


def test_since_needs_a_commit(project, cache):
    r = patchkit("review", "--since", "HEAD")
    assert r.returncode == 2 and "--since HEAD" in r.stderr


def test_html_is_self_contained(tmp_path, cache):
    page = tmp_path / "review.html"
    r = patchkit("review", "--html", str(page))
    assert r.returncode == 0, r.stderr
    html = page.read_text()
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html.split("<main>")[0])
    assert "default-src 'none'" in html
    assert not re.search(r"<(img|iframe|link)[^>]+(src|href)=\"https?:", html)
    assert html.count('class="patch-row"') == sum(
        len(series_names(ROOT, t)) for t in ("sglang", "flashinfer")
    )


@pytest.mark.slow
def test_html_page_in_headless_chromium(tmp_path, versioned_project, sglang_0510):  # noqa: F811
    executable = find_chromium()
    if executable is None:
        pytest.skip("chromium is not installed (tests/browser/ensure-chromium.sh installs it)")
    page = tmp_path / "review.html"
    r = patchkit("review", "--html", str(page), "--since", "HEAD", "--against", "sglang@0.5.10")
    assert r.returncode == 0, r.stdout + r.stderr
    expected = [
        (t, n) for t in ("sglang", "flashinfer") for n in series_names(versioned_project, t)
    ]
    with Browser(executable) as browser:
        browser.goto(page.as_uri())
        assert browser.errors() == []
        assert [u for u in browser.requests() if not u.startswith(("file:", "data:"))] == []
        rows = browser.evaluate(
            "[...document.querySelectorAll('tr.patch-row')]"
            ".map(r => [r.dataset.target, r.dataset.patch])"
        )
        assert [tuple(r) for r in rows] == expected
        labels = browser.evaluate(
            "[...document.querySelectorAll('tr.patch-row .badge')].map(b => b.textContent)"
        )
        assert "upstreamed" in labels and "conflict" in labels
        states = browser.evaluate(
            "[...document.querySelectorAll('#range-diff .badge')].map(b => b.textContent)"
        )
        assert sorted(set(states)) == ["added", "changed", "dropped", "unchanged"]
        sections = browser.evaluate("document.querySelectorAll('section.patch').length")
        assert sections == len(expected)
        width = browser.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        assert width, "the page scrolls sideways"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.screenshot(ARTIFACTS / "review.png")
        browser.evaluate("document.getElementById('range-diff').scrollIntoView()")
        browser.screenshot(ARTIFACTS / "review-range-diff.png")
    shutil.copy(page, ARTIFACTS / "review.html")
    assert (ARTIFACTS / "review.png").stat().st_size > 10_000
