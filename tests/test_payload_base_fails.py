"""Every payload test asserts on behaviour only its patch provides.

The payload tests run again against the unpatched trees (``PATCHKIT_PAYLOAD_TREE=base``) and
each collected test must fail there; a test that passes on the base proves nothing about its
patch.  Generic over ``tests/payload``: new payload tests are covered without listing them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.payload, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = "tests/payload"
OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (.+)$")


def _pytest(*args: str, tree: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATCHKIT_PAYLOAD_TREE": tree}
    return subprocess.run(
        [sys.executable, "-m", "pytest", PAYLOAD, "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


def _collected_ids() -> list[str]:
    run = _pytest("--collect-only", "-q", tree="patched")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [line for line in run.stdout.splitlines() if line.startswith(f"{PAYLOAD}/")]


def _outcomes(report: str, ids: list[str]) -> dict[str, str]:
    """``-rA`` summary lines -> {test id or module path: outcome}.

    A line is ``OUTCOME <id>`` or ``OUTCOME <id> - <message>``; ids may contain spaces, so
    they are matched against the collected ids and their module paths.
    """
    known = sorted({*ids, *(test_id.split("::", 1)[0] for test_id in ids)}, key=len, reverse=True)
    outcomes = {}
    for line in report.splitlines():
        match = OUTCOME.match(line)
        if not match:
            continue
        rest = match.group(2)
        for test_id in known:
            if rest == test_id or rest.startswith(test_id + " - "):
                outcomes[test_id] = match.group(1)
                break
    return outcomes


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs the payload venv")
def test_every_payload_test_fails_on_the_unpatched_tree():
    ids = _collected_ids()
    assert ids, f"no payload tests collected under {PAYLOAD}"

    run = _pytest("-q", "-rA", "--tb=no", tree="base")
    outcomes = _outcomes(run.stdout, ids)

    def failed(test_id: str) -> bool:
        module = test_id.split("::", 1)[0]
        return outcomes.get(test_id) in ("FAILED", "ERROR") or outcomes.get(module) == "ERROR"

    not_failed = {
        test_id: outcomes.get(test_id, "not run") for test_id in ids if not failed(test_id)
    }
    assert not not_failed, (
        "payload tests that do not fail on the unpatched tree:\n"
        + "\n".join(f"  {test_id}: {outcome}" for test_id, outcome in sorted(not_failed.items()))
        + f"\n--- pytest output (tail) ---\n{run.stdout[-4000:]}"
    )
