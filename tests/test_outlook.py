"""`outlook`'s core on real released code: the 0.5.9 line carried onto the pinned SGLang 0.5.12
wheel (cached, as the payload tier caches it), then read back from the outlook cache."""

from __future__ import annotations

import dataclasses

import pytest


@pytest.mark.slow
def test_the_0_5_9_line_on_the_0_5_12_wheel_then_from_the_cache(
    project, sglang_0512_wheels, warm_mirrors, tmp_path, monkeypatch
):
    from helpers import private_cache

    from patchkit.lines import line_series
    from patchkit.outlook import index_source, line_outlook
    from patchkit.workspace import Workspace

    cache = private_cache(warm_mirrors, tmp_path / "cache")
    monkeypatch.setenv("PATCHKIT_CACHE", str(cache))
    monkeypatch.setenv("PATCHKIT_OFFLINE_GIT", "1")
    ws = Workspace.load()
    target = ws.targets.get("sglang", "0.5.9")
    series = line_series(ws.project, target)
    # Only the pinned release: the index is not asked for its list.
    source = dataclasses.replace(index_source(cache), releases=lambda target, after: ["0.5.12"])

    first = line_outlook(target, series, source, cache)
    again = line_outlook(target, series, source, cache)

    assert [r.cached for r in first.releases] == [False]
    assert [r.cached for r in again.releases] == [True]
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


def test_since_before_the_pin_is_refused(workspace):
    from patchkit.errors import UsageError
    from patchkit.outlook import BaseSource, line_outlook

    target = workspace.targets.get("sglang", "0.5.17")
    never = BaseSource(*(lambda *a: pytest.fail("no base may be asked for") for _ in range(5)))
    with pytest.raises(UsageError, match="before line 0.5.17's pin"):
        line_outlook(target, workspace.series("sglang"), never, None, since="0.5.10")
