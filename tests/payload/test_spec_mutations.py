"""The mutation check of the speculation tier: every mistake planted from
``tests/mutation/spec_<line>.toml`` in a copy of the line's patched tree makes the tier fail.

Runs ``tests/mutation/plant.py`` (which first requires the unmutated copy to pass) under the
running interpreter; skipped where the line's torch is not the running one.  `make test` plants
a rotating sample of each line's mistakes (``SAMPLE``, chosen by the commit:
``tests/sampling.py``); ``PATCHKIT_SAMPLE=all`` (`make test-mutation`) plants every one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sampling import exhaustive
from spec_fixtures import LINE_TORCH, use_line_tree

pytestmark = [pytest.mark.payload, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = 3  # mistakes per line and landing; each costs one run of the speculation tier


@pytest.mark.parametrize("line", sorted(LINE_TORCH))
def test_every_planted_mistake_is_caught(line, payload_kind):
    if payload_kind != "patched":
        pytest.fail("the mutation check plants mistakes in the patched tree only")
    use_line_tree(line)
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "mutation" / "plant.py"), "--line", line, "--json",
         "--sample", "0" if exhaustive() else str(SAMPLE)],
        cwd=ROOT, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    assert run.stdout.strip(), run.stderr[-3000:]
    report = json.loads(run.stdout)
    missed = [m for m in report["mutations"] if m["verdict"] != "caught"]
    assert report["mutations"] and not missed, json.dumps(missed, indent=2)
    assert run.returncode == 0
