"""The rotating sample CI runs of each long test class (planted mistakes, kill points).

`make test` runs a fixed number of members of each class, chosen by the commit under test:
consecutive members (in a stable order) from an offset the commit hash picks, so every class
runs on every landing and every member runs within ceil(members / sample) landings.
``PATCHKIT_SAMPLE=all`` (`make test-mutation`, `make test-reliability`) runs every member;
``PATCHKIT_SAMPLE_SEED`` replaces the commit hash (to rerun what one landing ran).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_ENV = "PATCHKIT_SAMPLE"
SEED_ENV = "PATCHKIT_SAMPLE_SEED"


def exhaustive() -> bool:
    """True when every member of every long class runs (``PATCHKIT_SAMPLE=all``)."""
    return os.environ.get(SAMPLE_ENV, "") == "all"


def seed() -> int:
    """The commit's offset: of ``PATCHKIT_SAMPLE_SEED`` (a commit of this checkout, or a
    number), else of the checkout's HEAD; 0 outside a git checkout."""
    given = os.environ.get(SEED_ENV, "")
    sha = _commit(given or "HEAD")
    if sha:
        return int(sha[:12], 16)
    return int(given) if given.isdigit() else 0


def _commit(ref: str) -> str | None:
    run = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    return run.stdout.strip() if run.returncode == 0 and run.stdout.strip() else None


def rotating(members: Sequence[T], size: int, salt: int = 0) -> list[T]:
    """`size` consecutive members from the commit's offset (all of them when exhaustive or
    when there are no more than `size`); `salt` keeps two classes from moving in step."""
    if exhaustive() or size >= len(members):
        return list(members)
    start = (seed() + salt) % len(members)
    return [members[(start + i) % len(members)] for i in range(size)]
