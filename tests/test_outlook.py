"""`outlook`'s core on real released code: the 0.5.9 line carried onto the pinned SGLang 0.5.12
wheel (cached, as the payload tier caches it), then read back from the outlook cache."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def outlook_0512(sglang_0512_wheels, warm_mirrors, workspace, tmp_path_factory):
    """The 0.5.9 line carried onto the 0.5.12 wheel twice (the second from the outlook cache),
    in a private cache: (first, again)."""
    from helpers import private_cache

    from patchkit.lines import line_series
    from patchkit.outlook import index_source, line_outlook

    cache = private_cache(warm_mirrors, tmp_path_factory.mktemp("outlook") / "cache")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PATCHKIT_CACHE", str(cache))
        env.setenv("PATCHKIT_OFFLINE_GIT", "1")
        target = workspace.targets.get("sglang", "0.5.9")
        series = line_series(workspace.project, target)
        # Only the pinned release: the index is not asked for its list.
        source = dataclasses.replace(index_source(cache), releases=lambda target, after: ["0.5.12"])
        first = line_outlook(target, series, source, cache)
        again = line_outlook(target, series, source, cache)

        def no_base(target, version):
            raise AssertionError(f"{version}: a warm outlook obtained a base")

        # Warm: the base the mirror holds and its cached states, no acquire (lock, re-hash).
        warm = line_outlook(target, series, dataclasses.replace(source, new_base=no_base), cache)
        return first, again, warm


@pytest.mark.slow
def test_the_0_5_9_line_on_the_0_5_12_wheel_then_from_the_cache(outlook_0512):
    first, again, warm = outlook_0512
    assert [r.cached for r in first.releases] == [False]
    assert [r.cached for r in again.releases] == [True]
    assert warm.to_json() == again.to_json()
    states = {p.name: p.cells["0.5.12"].state for p in first.patches}
    assert {p.name: p.cells["0.5.12"].state for p in again.patches} == states
    assert states["kimi-k25-eagle3-delegation.patch"] == "upstreamed"
    assert states["eagle3-aux-capture-before-cuda-graphs.patch"] == "upstreamed"
    assert states["cu130-packaging-pins.patch"] == "obsolete"
    assert states["sm120-flashinfer-allreduce-fusion.patch"] == "conflict"
    retire = {p.name: p.retire_at for p in first.patches}
    assert retire["cu130-packaging-pins.patch"] == "0.5.12"
    assert retire["sm120-flashinfer-allreduce-fusion.patch"] is None
    assert "sm120-flashinfer-allreduce-fusion.patch" in first.needs_work
    trailer = [
        e
        for e in first.patches[4].cells["0.5.12"].evidence
        if e.startswith("applied-upstream-trailer")
    ]
    assert first.patches[4].name == "eagle3-aux-capture-before-cuda-graphs.patch"
    assert trailer and "Applied-Upstream: 0.5.11" in trailer[0]


@pytest.mark.slow
def test_the_html_page_in_headless_chromium(outlook_0512, tmp_path):
    """`outlook --html`'s page as a browser shows it: no script error, nothing fetched, one
    row per patch with its state, each cell's evidence behind its badge, the legend whole."""
    from browser.cdp import Browser, find_chromium

    from patchkit.outlook import CODES, LEGEND, OutlookReport
    from patchkit.review.render.outlook import render_page

    executable = find_chromium()
    if executable is None:
        pytest.skip("chromium is not installed (tests/browser/ensure-chromium.sh installs it)")
    first, _, _ = outlook_0512
    page = tmp_path / "outlook.html"
    page.write_text(render_page(OutlookReport([first])), encoding="utf-8")
    rows_js = (
        "[...document.querySelectorAll('table.outlook tbody tr')].map(r => [r.cells[0]"
        ".textContent, r.cells[1].textContent, r.cells[2].querySelector('.badge').textContent])"
    )
    with Browser(executable) as browser:
        browser.goto(page.as_uri())
        assert browser.errors() == []
        assert [u for u in browser.requests() if not u.startswith(("file:", "data:"))] == []
        rows = [tuple(row) for row in browser.evaluate(rows_js)]
        cells = [(p.name, p.retire_at, p.cells["0.5.12"]) for p in first.patches]
        assert rows == [
            (n.removesuffix(".patch"), r or "-", CODES[c.state] + ("?" if c.provisional else ""))
            for n, r, c in cells
        ]
        assert {n: code for n, _, code in rows}["sm120-flashinfer-allreduce-fusion"] == "X"
        hidden = "[...document.querySelectorAll('td.cell details')].filter(d => d.open).length"
        assert browser.evaluate(hidden) == 0
        browser.evaluate("document.querySelectorAll('td.cell details').forEach(d => d.open = true)")
        evidence = browser.evaluate(
            "[...document.querySelectorAll('td.cell .evidence')].map(e => e.innerText).join(' ')"
        )
        assert "Applied-Upstream: 0.5.11" in evidence
        legend = browser.evaluate("[...document.querySelectorAll('#legend dt')].length")
        assert legend == len(LEGEND) + 1  # and what ? means
        verdict = browser.evaluate("document.querySelector('p.base').innerText")
        assert "Needs work on 0.5.12" in verdict
        assert browser.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        assert browser.errors() == []


# Kept (ignored by git) to look at: what a team sees first on release day.
SCREENSHOT = Path(__file__).resolve().parent / "artifacts" / "outlook-1400x900.png"
RELEASES = (
    "0.5.10 0.5.10.post1 0.5.11 0.5.12 0.5.12.post1 0.5.13 0.5.13.post1 0.5.14 0.5.15 "
    "0.5.15.post1 0.5.16 0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22 0.5.23"
).split()


@pytest.mark.slow
def test_the_newest_release_and_retire_at_are_on_the_first_screen(outlook_0512, tmp_path):
    """The 0.5.9 line's page over its 18 releases (each holding the 0.5.12 states) in a
    1400x900 window: the newest release's column, "retire at" and the verdict on the newest
    are on the screenshot, whole and not covered; `?` is explained; a cell's evidence leads
    with the per-file states and ends with git's words."""
    from browser.cdp import Browser, find_chromium

    from patchkit.outlook import PROVISIONAL, OutlookReport, PatchRow
    from patchkit.review.render.outlook import render_page

    executable = find_chromium()
    if executable is None:
        pytest.skip("chromium is not installed (tests/browser/ensure-chromium.sh installs it)")
    first = outlook_0512[0]
    column = first.releases[0]
    line = dataclasses.replace(
        first,
        releases=[dataclasses.replace(column, version=v) for v in RELEASES],
        patches=[
            PatchRow(p.name, {v: p.cells["0.5.12"] for v in RELEASES}, p.retire_at)
            for p in first.patches
        ],
    )
    page = tmp_path / "outlook.html"
    page.write_text(render_page(OutlookReport([line])), encoding="utf-8")
    on_screen = """(el => { const r = el.getBoundingClientRect();
        const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
        return r.left >= 0 && r.top >= 0 && r.right <= innerWidth && r.bottom <= innerHeight
            && (el === hit || el.contains(hit)); })"""
    with Browser(executable, width=1400, height=900) as browser:
        browser.goto(page.as_uri())
        browser.screenshot(SCREENSHOT)
        assert browser.errors() == []
        heads = browser.evaluate(
            "[...document.querySelectorAll('table.outlook thead th')].map(t => t.textContent)"
        )
        assert heads[:4] == ["patch", "retire at", "0.5.23", "0.5.22"] and heads[-1] == "0.5.10"
        for selector in (
            "table.outlook th.retire",
            "table.outlook thead th:nth-child(3)",  # 0.5.23
            "table.outlook tbody tr:last-child td:nth-child(3)",
            "table.outlook tbody tr:last-child td.retire",
            "p.verdict",
        ):
            assert browser.evaluate(f"{on_screen}(document.querySelector('{selector}'))"), selector
        assert "Needs work on 0.5.23" in browser.evaluate(
            "document.querySelector('p.verdict').innerText"
        )
        text = browser.evaluate("document.body.innerText")
        assert PROVISIONAL in text and "X?" in text
        browser.evaluate("document.querySelectorAll('td.cell details').forEach(d => d.open = true)")
        fusion = browser.evaluate(
            "document.querySelector('table.outlook tbody tr td:nth-child(3) .evidence').innerText"
        )
        lines = fusion.splitlines()
        assert lines[0].startswith("sm120-flashinfer-allreduce-fusion.patch on 0.5.23: conflict")
        parts = [i for i, ln in enumerate(lines) if re.match(r"python/\S+\.py: \w+ \(", ln)]
        assert parts[0] == 1  # the per-file states first
        git_words = [i for i, ln in enumerate(lines) if ln.startswith("conflicts in ")]
        assert git_words and git_words[0] > parts[-1]  # git's words after them
        assert browser.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")


def test_since_before_the_pin_is_refused(workspace):
    from patchkit.errors import UsageError
    from patchkit.outlook import BaseSource, line_outlook

    target = workspace.targets.get("sglang", "0.5.17")
    never = BaseSource(*(lambda *a: pytest.fail("no base may be asked for") for _ in range(5)))
    with pytest.raises(UsageError, match="before line 0.5.17's pin"):
        line_outlook(target, workspace.series("sglang"), never, None, since="0.5.10")


SERIES_DOC = "docs/series.md"
_BLOCK = re.compile(
    r"^<!-- patchkit outlook --target (\S+) --line (\S+) --markdown \| stamp (\w+), "
    r"releases (\S+)\.\.(\S+) -->\n.*?^<!-- end patchkit outlook -->$",
    re.M | re.S,
)


def _doc_blocks():
    from helpers import ROOT

    return list(_BLOCK.finditer((ROOT / SERIES_DOC).read_text()))


def test_the_series_tables_in_the_docs_are_stamped_with_the_current_series(workspace):
    """docs/series.md's generated tables carry the stamp of the series and classifier they were
    made from: a patch edited or a classifier change since makes them out of date."""
    from patchkit.lines import line_series
    from patchkit.outlook import outlook_stamp

    blocks = _doc_blocks()
    assert blocks, f"no generated outlook table in {SERIES_DOC}"
    for block in blocks:
        target, line, stamp = block.group(1, 2, 3)
        series = line_series(workspace.project, workspace.targets.get(target, line))
        assert stamp == outlook_stamp(series), (
            f"{SERIES_DOC}: the {target} line {line} table is out of date: paste the output of "
            f"`patchkit outlook --target {target} --line {line} --markdown`"
        )


def test_the_series_tables_are_what_outlook_renders_from_its_cache(workspace, shared_cache):
    """Where the test cache holds the line's classified states (`PATCHKIT_CACHE=
    .cache/test-patchkit patchkit outlook ...`), the table in the docs is exactly what outlook
    renders from them; nothing is classified or downloaded here."""
    from types import SimpleNamespace

    from patchkit import gitops
    from patchkit.commands.outlook import render_markdown
    from patchkit.lines import line_series
    from patchkit.outlook import BaseSource, OutlookReport, line_outlook

    class NotCached(Exception):
        pass

    def imported(mirror, version):
        for kind in ("sdist", "wheel"):
            commit = gitops.resolve(gitops.Repo.bare_at(mirror), f"refs/patchkit/{kind}/{version}")
            if commit:
                return SimpleNamespace(source=kind, commit=commit, stands_for=version)
        raise NotCached(version)

    def not_cached(*_):
        raise NotCached

    for block in _doc_blocks():
        target = workspace.targets.get(block.group(1), block.group(2))
        header = block.group(0).split("\n")[2]
        versions = [c.strip() for c in header.strip("|").split("|")[1:-1]]
        mirror = shared_cache / "mirrors" / f"{target.name}.git"
        source = BaseSource(
            releases=lambda *_, v=versions: v,
            old_base=lambda t, m=mirror: imported(m, t.pin),
            new_base=lambda t, v, m=mirror: imported(m, v),
            facts=not_cached,
            mirror=not_cached,
        )
        series = line_series(workspace.project, target)
        try:
            line = line_outlook(target, series, source, shared_cache)
        except NotCached:
            pytest.skip(f"the test cache holds no outlook of {target.name} line {target.line}")
        assert render_markdown(OutlookReport([line])) == block.group(0)
