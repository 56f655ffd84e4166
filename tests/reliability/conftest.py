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

from reliability_support import Toy, make_toy  # noqa: E402


@pytest.fixture
def toy(tmp_path) -> Toy:
    """A synthetic upstream with a five-patch series, a scratch project and an empty cache."""
    return make_toy(tmp_path / "toy")
