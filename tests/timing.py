"""The run's shape under pytest-xdist: long items first, the reliability figures gathered from
every worker, and a summary of test time by class at the end (docs/perf.md).

Hooks only; tests/conftest.py imports them.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

FIGURES_ENV = "PATCHKIT_FIGURES_FILE"  # reliability_support.record appends to it

# (class, the test ids it holds): the first whose prefix matches; the rest are manager tests.
CLASSES = (
    ("planted mistakes", ("tests/payload/test_spec_mutations.py",)),
    ("payload on unpatched trees", ("tests/test_payload_base_fails.py",)),
    ("payload tests", ("tests/payload/", "tests/test_doctor_payload.py")),
    ("model-based test", ("tests/reliability/test_model.py",)),
    ("kill and interrupt loops", ("tests/reliability/test_kill", "tests/reliability/test_recovery",
                                  "tests/reliability/test_reliability_build",
                                  "tests/reliability/test_reliability_conflict_tree")),
    ("other reliability", ("tests/reliability/",)),
    ("outlook on real releases", ("tests/test_outlook_truth.py",)),
)  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or os.environ.get(FIGURES_ENV):
        return  # a worker (or a nested run) appends to its controller's file
    fd, path = tempfile.mkstemp(prefix="patchkit-figures-", suffix=".jsonl")
    os.close(fd)
    os.environ[FIGURES_ENV] = path  # inherited by the workers pytest-xdist starts
    config._patchkit_figures = Path(path)  # type: ignore[attr-defined]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The items marked `long` first (stable): the cores share the long ones before the many
    short ones fill the gaps, not one core running a long item after the other is done."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def class_of(nodeid: str) -> str:
    for name, prefixes in CLASSES:
        if nodeid.startswith(prefixes):
            return name
    return "manager tests"


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    _figures(terminalreporter, config)
    seconds: dict[str, float] = defaultdict(float)
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                seconds[class_of(report.nodeid)] += report.duration
    if sum(seconds.values()) < 1:
        return
    terminalreporter.section("test time by class (summed over the cores)")
    for name, value in sorted(seconds.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{name:<28} {value:8.1f} s")


def _figures(terminalreporter, config) -> None:
    path = getattr(config, "_patchkit_figures", None)
    if path is None:
        return
    figures: dict[str, list[str]] = {}
    try:
        for raw in path.read_text(encoding="utf-8").splitlines():
            section, line = json.loads(raw)
            figures.setdefault(section, []).append(line)
    finally:
        path.unlink(missing_ok=True)
    if figures:
        terminalreporter.section("reliability figures")
        for section, lines in figures.items():
            terminalreporter.write_line(f"{section}:")
            for line in lines:
                terminalreporter.write_line(f"  {line}")
