"""Reliability tests: each records its figures here; they print at the end of the run."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

# A shell starts background jobs with SIGINT ignored, and children inherit that: the interrupt
# tests would then send SIGINT to processes that cannot receive it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reliability_support import FIGURES, Toy, make_toy  # noqa: E402


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    if not FIGURES:
        return
    terminalreporter.section("reliability figures")
    for section, lines in FIGURES.items():
        terminalreporter.write_line(f"{section}:")
        for line in lines:
            terminalreporter.write_line(f"  {line}")


@pytest.fixture
def toy(tmp_path) -> Toy:
    """A synthetic upstream with a five-patch series, a scratch project and an empty cache."""
    return make_toy(tmp_path / "toy")
