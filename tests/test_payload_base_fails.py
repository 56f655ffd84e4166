"""Every payload test asserts on behaviour only its patch provides.

The payload tests run again against the unpatched trees (``PATCHKIT_PAYLOAD_TREE=base``) and
each collected test must fail there; a test that passes on the base proves nothing about its
patch.  Generic over ``tests/payload``: new payload tests are covered without listing them,
except those marked ``of_the_line`` (patchkit's own reading of the line's code, e.g. the
doctor's derivation, which holds on the unpatched tree too).

Once per SGLang line (``PATCHKIT_PAYLOAD_LINE``), each in the interpreter made for it: this one
when its torch is the line's (``build/constraints/payload-test*.txt``), else the venv of the
line's torch, ``.venv-torch-<major.minor>`` (``make test`` builds it); a line without one is
skipped.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.payload, pytest.mark.slow, pytest.mark.long]

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = "tests/payload"
CONSTRAINTS = ROOT / "build" / "constraints"
OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (.+)$")


def _lines() -> list[str]:
    """The SGLang lines of targets.toml, the default line first."""
    from patchkit.workspace import Workspace

    spec = Workspace.load(ROOT).target("sglang")
    default = spec.current_line.name
    return [default, *(name for name in spec.line_names if name != default)]


def _pinned_torch(line: str) -> str:
    own = CONSTRAINTS / f"payload-test-{line}.txt"
    path = own if own.is_file() else CONSTRAINTS / "payload-test.txt"
    for raw in path.read_text().splitlines():
        name, sep, version = raw.split("#", 1)[0].strip().partition("==")
        if sep and name.strip().lower() == "torch":
            return version.strip()
    raise AssertionError(f"{path.name} pins no torch")


def _interpreter(line: str) -> str | None:
    try:
        here = importlib.metadata.version("torch").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        here = None
    if here == _pinned_torch(line):
        return sys.executable
    family = ".".join(_pinned_torch(line).split(".")[:2])
    venv = ROOT / f".venv-torch-{family}" / "bin" / "python"
    return str(venv) if venv.is_file() else None


def _pytest(*args: str, tree: str, line: str, python: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATCHKIT_PAYLOAD_TREE": tree, "PATCHKIT_PAYLOAD_LINE": line}
    env.pop("PATCHKIT_PAYLOAD_SGLANG_ROOT", None)  # the trees come from the series
    return subprocess.run(
        [python, "-m", "pytest", PAYLOAD, "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


# Tests of patchkit against a line's code (`of_the_line`) hold on the unpatched tree by design.
PATCH_TESTS = ("-m", "not of_the_line")


def _collected_ids(line: str, python: str) -> list[str]:
    run = _pytest("--collect-only", "-q", *PATCH_TESTS, tree="patched", line=line, python=python)
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
@pytest.mark.parametrize("line", _lines())
def test_every_payload_test_fails_on_the_unpatched_tree(line):
    python = _interpreter(line)
    if python is None:
        pytest.skip(f"no interpreter with torch=={_pinned_torch(line)} for line {line}")
    ids = _collected_ids(line, python)
    assert ids, f"no payload tests collected under {PAYLOAD} for line {line}"

    run = _pytest("-q", "-rA", "--tb=no", *PATCH_TESTS, tree="base", line=line, python=python)
    outcomes = _outcomes(run.stdout, ids)

    def failed(test_id: str) -> bool:
        module = test_id.split("::", 1)[0]
        return outcomes.get(test_id) in ("FAILED", "ERROR") or outcomes.get(module) == "ERROR"

    not_failed = {
        test_id: outcomes.get(test_id, "not run") for test_id in ids if not failed(test_id)
    }
    assert not not_failed, (
        f"payload tests that do not fail on the unpatched tree of line {line}:\n"
        + "\n".join(f"  {test_id}: {outcome}" for test_id, outcome in sorted(not_failed.items()))
        + f"\n--- pytest output (tail) ---\n{run.stdout[-4000:]}"
    )
