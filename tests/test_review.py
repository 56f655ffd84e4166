"""`patchkit review`: the terminal table, --against classification, the --since range-diff and
the self-contained HTML page, loaded in a real headless chromium."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from browser.cdp import Browser, find_chromium
from helpers import ROOT, SEED_LINE, git, patchkit, result_of, series_folder
from rebase_fixtures import cache_0510, sglang_0510  # noqa: F401 - fixtures

from patchkit.targets import load_targets

ARTIFACTS = ROOT / "tests" / "artifacts"
KIMI = "kimi-k25-eagle3-delegation.patch"
SYMM = "sm120-torch-symm-mem-allreduce.patch"
AUX_POST = "eagle3-aux-capture-post-allreduce.patch"


def series_names(root: Path, target: str) -> list[str]:
    """The series of `target`'s line in the tests' projects (sglang: the seed line)."""
    line = SEED_LINE if target == "sglang" else None
    text = (series_folder(root, target, line) / "series").read_text()
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


@pytest.fixture
def versioned_project(project, cache) -> Path:
    """The scratch project as a git repository with one commit, then a new series version:
    KIMI's description edited, SYMM dropped, AUX_POST renamed, one patch added."""
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "the series as released")
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
    rows = {p["name"]: p for p in result_of(r.stdout)["targets"][0]["patches"]}
    assert rows[KIMI]["classification"] == "upstreamed"
    assert any(e.startswith("definitions-present") for e in rows[KIMI]["evidence"])
    assert rows[SYMM]["classification"] == "clean"
    assert rows["cu130-packaging-pins.patch"]["classification"] == "conflict"


def test_since_compares_two_versions_of_the_series(versioned_project):
    r = patchkit("review", "--since", "HEAD", "--no-diff", "--json")
    assert r.returncode == 0, r.stderr
    entries = {e["name"]: e for e in result_of(r.stdout)["comparison"]["entries"]}
    assert entries[KIMI]["state"] == "changed"
    assert "+KimiK25ForConditionalGeneration (Kimi-K2.5) wraps" in entries[KIMI]["interdiff"]
    assert entries[SYMM]["state"] == "dropped"
    assert entries["aux-post.patch"]["state"] == "changed"
    assert entries["aux-post.patch"]["note"] == f"renamed from {AUX_POST}"
    assert entries["kimi-again.patch"]["state"] == "added"
    assert entries["cu130-packaging-pins.patch"]["state"] == "unchanged"
    assert entries["sm120-trtllm-comm.patch"]["state"] == "unchanged"
    text = patchkit("review", "--since", "HEAD", "--no-diff").stdout
    targets = load_targets(versioned_project / "patches" / "targets.toml")
    version = re.escape(targets.series_version)
    assert re.search(rf"series changes since HEAD \([0-9a-f]{{12}}, series {version} -> ", text)


def test_since_needs_a_commit(project, cache):
    r = patchkit("review", "--since", "HEAD")
    assert r.returncode == 2 and "--since HEAD" in r.stderr


def test_html_is_self_contained(tmp_path, cache):
    page = tmp_path / "review.html"
    r = patchkit("review", "--html", str(page))
    assert r.returncode == 0, r.stderr
    html = page.read_text()
    # one inline script, allowed by its sha256 in the CSP and by nothing else
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    assert len(scripts) == 1 and html.lower().count("<script") == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in html
    assert "unsafe-inline'; script-src" in html and "script-src 'unsafe" not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html.split("<main>")[0])
    assert "default-src 'none'" in html
    assert not re.search(r"<(img|iframe|link)[^>]+(src|href)=\"https?:", html)
    assert html.count('class="patch-row"') == sum(
        len(series_names(ROOT, t)) for t in ("sglang", "flashinfer")
    )
    # diffs are collapsed by default; line numbers and highlighting are rendered server-side
    assert "<details open" not in html
    assert 'class="ln" data-ln="' in html and 'class="tok-kw"' in html


def test_html_never_writes_through_a_link_beside_the_page(tmp_path, cache):
    """The page is written to a new file of a random name and renamed into place: a link
    planted at a predictable scratch name (`.review.html.tmp`) leads nowhere."""
    out = tmp_path / "dist"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    (out / ".review.html.tmp").symlink_to(victim)
    r = patchkit("review", "--html", str(out / "review.html"))
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "mine\n"
    assert not (out / "review.html").is_symlink() and "<html" in (out / "review.html").read_text()
    assert sorted(p.name for p in out.iterdir()) == [".review.html.tmp", "review.html"]


def test_diff_table_numbers_lines_and_highlights():
    from patchkit.review.render.diffview import diff_table

    diff = (
        "diff --git a/pkg/m.py b/pkg/m.py\n"
        "index 1111111..2222222 100644\n"
        "--- a/pkg/m.py\n+++ b/pkg/m.py\n"
        "@@ -10,3 +10,4 @@ def f():\n"
        " x = 1\n-y = 'a'\n+y = 'b'  # why\n+z = 2\n w = 3\n"
    )
    html = diff_table(diff)
    rows = re.findall(
        r'<tr class="(\w+)"><td class="ln" data-ln="(\d*)"></td>'
        r'<td class="ln" data-ln="(\d*)"></td>',
        html,
    )
    assert rows == [
        ("meta", "", ""),
        ("meta", "", ""),
        ("meta", "", ""),
        ("hunk", "", ""),
        ("ctx", "10", "10"),
        ("del", "11", ""),
        ("add", "", "11"),
        ("add", "", "12"),
        ("ctx", "12", "13"),
    ]
    assert '<span class="tok-str">&#x27;b&#x27;</span>' in html
    assert '<span class="tok-com"># why</span>' in html
    # a C++/CUDA file is highlighted as C, an unknown extension as plain text
    cu = diff_table("diff --git a/k.cu b/k.cu\n@@ -1 +1 @@\n-#if X\n+int y = 0;\n")
    assert 'class="tok-pre"' in cu and '<span class="tok-kw">int</span>' in cu
    txt = diff_table("diff --git a/k.txt b/k.txt\n@@ -1 +1 @@\n-if x\n+def y\n")
    assert "tok-" not in txt


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
        # every rebase note is shown: the equivalent-implementation caveat and conflict reasons
        notes = browser.evaluate(
            "[...document.querySelectorAll('tr.patch-row .rebase-note, tr.patch-row .conflicts')]"
            ".map(n => n.textContent)"
        )
        assert any("read it before dropping" in n for n in notes), notes
        counts = browser.evaluate("document.querySelector('.counts').textContent")
        assert "patch(es)" in counts and "file(s)" in counts and "upstreamed" in counts
        # collapsed by default; expand all / collapse all by script; a hash link opens its diff
        opened = "[...document.querySelectorAll('details.patch-diff')].filter(d => d.open).length"
        assert browser.evaluate(opened) == 0
        collapsed_height = browser.evaluate("document.documentElement.scrollHeight")
        browser.evaluate("document.querySelector('[data-action=expand-all]').click()")
        assert browser.evaluate(opened) == len(expected)
        assert browser.evaluate("document.documentElement.scrollHeight") > 2 * collapsed_height
        browser.evaluate("document.querySelector('[data-action=collapse-all]').click()")
        assert browser.evaluate(opened) == 0
        anchor = browser.evaluate("document.querySelector('tr.patch-row a').hash")
        browser.evaluate(f"window.location.hash = {json.dumps(anchor)}")
        assert browser.evaluate(opened) == 1
        numbers = browser.evaluate(
            "getComputedStyle(document.querySelector('td.ln[data-ln=\\'1\\']') "
            "|| document.querySelector('td.ln'), '::before').content"
        )
        assert numbers not in ("none", "normal", '""')
        paths_break_at_slashes = browser.evaluate(
            "[...document.querySelectorAll('td.files')].every("
            "td => getComputedStyle(td).wordBreak === 'normal')"
        )
        assert paths_break_at_slashes
        assert browser.errors() == []
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.screenshot(ARTIFACTS / "review.png")
        browser.evaluate("document.getElementById('range-diff').scrollIntoView()")
        browser.screenshot(ARTIFACTS / "review-range-diff.png")
    with Browser(executable, width=390, height=844) as phone:
        phone.goto(page.as_uri())
        assert phone.errors() == []
        sideways = phone.evaluate("document.documentElement.scrollWidth > window.innerWidth + 1")
        assert not sideways, "the page scrolls sideways at phone width"
        phone.screenshot(ARTIFACTS / "review-phone.png")
    shutil.copy(page, ARTIFACTS / "review.html")
    assert (ARTIFACTS / "review.png").stat().st_size > 10_000
