"""`outlook` without the series' own notes: each SGLang line, carried with every
`Applied-Upstream*` trailer stripped, gets the labels read by hand from the released code
(tests/outlook_truth.toml), each upstream verdict with evidence read from the code, and the
fusion patch's probe fails from the release that added a second SM gate on its path.

The releases where a label rests on reading upstream's code run on every commit; the others
are a rotating sample, one per line (`PATCHKIT_SAMPLE=all .venv/bin/python -m pytest
tests/test_outlook_truth.py`: every release of both lines, 24)."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest
from helpers import private_cache
from sampling import rotating

from patchkit.compat import tomllib

pytestmark = [pytest.mark.slow, pytest.mark.long]

TRUTH = tomllib.loads((Path(__file__).parent / "outlook_truth.toml").read_text("utf-8"))
CODES = {"c": "clean", "o": "offset", "m": "merged", "X": "conflict",
         "x": "partly-upstreamed", "U": "upstreamed", "O": "obsolete"}  # fmt: skip
# Where the trailers decided a label, or a file rewritten upstream faked one (issue 43).
KEY_RELEASES = {"0.5.9": ("0.5.14", "0.5.16", "0.5.21"), "0.5.17": ("0.5.19", "0.5.21")}
_TRAILER = re.compile(rb"^Applied-Upstream[\w-]*:.*\n", re.MULTILINE | re.IGNORECASE)


def _chosen(line: str) -> list[str]:
    key = KEY_RELEASES[line]
    others = [v for v in TRUTH["lines"][line]["releases"] if v not in key]
    chosen = set(key) | set(rotating(others, 1, salt=17))
    return [v for v in TRUTH["lines"][line]["releases"] if v in chosen]


# Chosen once per run (the sample follows the commit under test).
CHOSEN = {line: _chosen(line) for line in KEY_RELEASES}


def releases_of(line: str) -> list[str]:
    return CHOSEN[line]


def stripped(series):
    """The series with every Applied-Upstream* trailer removed from its patches."""
    from patchkit.series import parse_patch

    patches = [parse_patch(p.name, _TRAILER.sub(b"", p.raw)) for p in series.patches]
    assert not any(k.lower().startswith("applied-upstream") for p in patches for k, _ in p.trailers)
    return dataclasses.replace(series, patches=patches)


@pytest.fixture(scope="module")
def bases(shared_cache, warm_mirrors, workspace):
    """Every release the test carries onto, imported into the warm mirror once."""
    from patchkit.upstream import acquire, resolve_new_base

    os.environ.setdefault("PATCHKIT_OFFLINE_GIT", "1")
    for line in KEY_RELEASES:
        target = workspace.targets.get("sglang", line)
        acquire(target, None, cache=shared_cache)
        for version in releases_of(line):
            resolve_new_base(target, version, cache=shared_cache)
    return shared_cache


@pytest.fixture(scope="module")
def outlooks(bases, workspace, tmp_path_factory):
    """Each line's outlook, its trailers stripped, on the releases chosen (a private cache)."""
    from patchkit.lines import line_series
    from patchkit.outlook import index_source, line_outlook

    cache = private_cache(bases, tmp_path_factory.mktemp("truth") / "cache")
    out = {}
    for line in KEY_RELEASES:
        target = workspace.targets.get("sglang", line)
        chosen = releases_of(line)
        source = dataclasses.replace(index_source(cache), releases=lambda t, f, c=chosen: c)
        series = stripped(line_series(workspace.project, target))
        out[line] = line_outlook(target, series, source, cache / "cells")
    return out


@pytest.mark.parametrize("line", list(KEY_RELEASES))
def test_labels_without_the_trailers_are_the_hand_read_ones(outlooks, line):
    truth = TRUTH["lines"][line]
    versions = truth["releases"]
    got = outlooks[line]
    wrong = []
    for row in got.patches:
        wanted = truth["patches"][row.name.removesuffix(".patch")].split()
        for version, cell in row.cells.items():
            expected = CODES[wanted[versions.index(version)]]
            if cell.state != expected:
                parts = "; ".join(f"{p['path']}: {p['state']}" for p in cell.parts)
                wrong.append(f"{row.name} {version}: {cell.state}, not {expected} ({parts})")
    assert [r.version for r in got.releases] == releases_of(line)
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("line", list(KEY_RELEASES))
def test_each_upstream_verdict_quotes_the_code(outlooks, line):
    """An upstreamed or partly upstreamed cell says what in the release's code shows it (no
    trailer is left to say it for them)."""
    for row in outlooks[line].patches:
        for version, cell in row.cells.items():
            if cell.state == "partly-upstreamed":
                hunks = [h for p in cell.parts for h in p.get("hunks", [])]
                upstream = [h for h in hunks if h["state"] == "upstream"]
                assert upstream and all(h["evidence"] for h in upstream), (row.name, version)
                assert any(h["state"] == "needed" for h in hunks) or any(
                    p["state"] in ("applies", "moved", "needed") for p in cell.parts
                ), (row.name, version)
            if cell.state == "upstreamed":
                assert cell.evidence, (row.name, version)
                assert not any("trailer" in e for e in cell.evidence), (row.name, version)


@pytest.mark.parametrize("line", list(KEY_RELEASES))
def test_the_fusion_probe_fails_where_upstream_added_a_second_gate(outlooks, line):
    from packaging.version import Version

    first = Version(TRUTH["lines"][line]["probe_fails_from"]["sm120-flashinfer-allreduce-fusion"])
    row = next(p for p in outlooks[line].patches if p.name.startswith("sm120-flashinfer"))
    for version, cell in row.cells.items():
        assert cell.probes, version
        assert cell.probe_failed == (Version(version) >= first), (version, cell.probes)
        if cell.probe_failed:
            failures = [f for p in cell.probes for f in p["failures"]]
            assert any("flashinfer_comm_fusion.py" in f for f in failures), failures
            assert any("probe fails" in e for e in cell.evidence)


def test_the_truth_table_covers_every_patch_of_each_line(workspace):
    from patchkit.lines import line_series

    for line in KEY_RELEASES:
        series = line_series(workspace.project, workspace.targets.get("sglang", line))
        names = [p.name.removesuffix(".patch") for p in series.patches]
        patches = TRUTH["lines"][line]["patches"]
        assert list(patches) == names
        width = len(TRUTH["lines"][line]["releases"])
        assert all(len(v.split()) == width for v in patches.values()), line
