"""The mutation check of the speculation tier: every mistake planted from
``tests/mutation/spec_<line>.toml`` in a copy of the line's patched tree makes the tier fail.

Runs ``tests/mutation/plant.py`` under the running interpreter, one test item per mistake (so
pytest-xdist spreads them over the cores) and one for the unmutated copy, which must pass the
whole tier; skipped where the line's torch is not the running one.  `make test` plants a
rotating sample of each line's mistakes (``SAMPLE``, chosen by the commit:
``tests/sampling.py``); ``PATCHKIT_SAMPLE=all`` or `make test-mutation` plants every one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from sampling import rotating
from spec_fixtures import LINE_TORCH, use_line_tree

pytestmark = [pytest.mark.payload, pytest.mark.slow, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[2]
PLANT = ROOT / "tests" / "mutation" / "plant.py"
SAMPLE = 3  # mistakes per line and landing; each costs one run of the speculation tier
BASELINE = "unmutated"


def _cases() -> list[tuple[str, str]]:
    cases = []
    for line in sorted(LINE_TORCH):
        listed = tomllib.loads((PLANT.parent / f"spec_{line.replace('.', '')}.toml").read_text())
        ids = [m["id"] for m in listed["mutation"]]
        cases += [(line, BASELINE)] + [(line, i) for i in rotating(ids, SAMPLE)]
    return cases


def _plant(line: str, *args: str) -> dict:
    run = subprocess.run(
        [sys.executable, str(PLANT), "--line", line, "--json", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    assert run.returncode == 0 or run.stdout.strip(), run.stderr[-3000:]
    return {"rc": run.returncode, **(json.loads(run.stdout) if run.stdout.strip() else {})}


@pytest.mark.parametrize(("line", "mistake"), _cases())
def test_every_planted_mistake_is_caught(line, mistake, payload_kind):
    if payload_kind != "patched":
        pytest.fail("the mutation check plants mistakes in the patched tree only")
    use_line_tree(line)
    if mistake == BASELINE:  # a mistake is caught only where the unmutated copy passes
        report = _plant(line, "--baseline", "only")
        assert report["rc"] == 0 and report["baseline_seconds"], report
        return
    report = _plant(line, "--only", mistake, "--baseline", "skip")
    missed = [m for m in report["mutations"] if m["verdict"] != "caught"]
    assert report["mutations"] and not missed, json.dumps(missed, indent=2)
    assert report["rc"] == 0
