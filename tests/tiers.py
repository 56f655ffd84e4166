"""`make test`: the CPU tier's parts, one after another, each timed, and a summary at the end.

    python tests/tiers.py [--only NAME ...] [--list] [-- PYTEST_ARGS ...]

The parts (``TIERS``) and the interpreter each runs in are data; pytest runs on every core
(pytest-xdist, ``PATCHKIT_TEST_JOBS``, default: the machine's cores). Every part runs even
when an earlier one failed, so one CI log shows every failure; the exit status is 1 when any
part failed. The summary is also written to ``.cache/test-timings.json`` (the last run) so
that a regression in one part is seen the day it lands (docs/perf.md holds the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMINGS = ROOT / ".cache" / "test-timings.json"


@dataclass(frozen=True)
class Tier:
    name: str
    venv: str  # the interpreter's venv, relative to the project
    argv: tuple[str, ...]  # after `<venv>/bin/python -m`
    env: dict[str, str] = field(default_factory=dict)  # "{root}": the project
    parallel: bool = True  # pytest-xdist over the cores


# Lines on the same torch share one payload venv (`make` names it by torch version). The
# manager tests share a part with the 0.5.9 line's payload tests (both in .venv): the cores
# then fill the gaps between the long payload items with short manager ones.
TIERS = (
    Tier("lint", ".venv", ("patchkit", "lint"), parallel=False),
    Tier(
        "torch 2.9.1: manager + payload 0.5.9",
        ".venv",
        ("pytest", "-m", "not gpu"),
        {
            "PATCHKIT_PAYLOAD_LINE": "0.5.9",
            # the doctor's derivation checked against the real 0.5.17 model in that line's venv
            "PATCHKIT_P0517_PYTHON": "{root}/.venv-torch-2.11/bin/python",
        },
    ),
    Tier(
        "torch 2.11: payload 0.5.17",
        ".venv-torch-2.11",
        ("pytest", "-m", "payload", "tests/payload"),
        {"PATCHKIT_PAYLOAD_LINE": "0.5.17"},
    ),
    Tier(
        "torch 2.14: payload 0.5.23",
        ".venv-torch-2.14",
        ("pytest", "-m", "payload", "tests/payload"),
        {"PATCHKIT_PAYLOAD_LINE": "0.5.23"},
    ),
)


def jobs() -> int:
    return int(os.environ.get("PATCHKIT_TEST_JOBS") or os.cpu_count() or 1)


def command(tier: Tier, extra: list[str]) -> list[str]:
    python = str(ROOT / tier.venv / "bin" / "python")
    argv = [python, "-m", *tier.argv]
    if tier.argv[0] != "pytest":
        return argv
    if tier.parallel and jobs() > 1:
        # worksteal: an idle core takes queued items from a busy one (the long ones come first)
        argv += ["-n", str(jobs()), "--dist", "worksteal"]
    return argv + extra


def run(tier: Tier, extra: list[str]) -> tuple[int, float]:
    argv = command(tier, extra)
    print(f"\n=== {tier.name}: {' '.join(argv[2:])}", flush=True)
    start = time.monotonic()
    env = {key: value.format(root=ROOT) for key, value in tier.env.items()}
    rc = subprocess.run(argv, cwd=ROOT, env={**os.environ, **env}).returncode
    return rc, time.monotonic() - start


def summary(results: list[tuple[Tier, int, float]], setup: float | None) -> str:
    total = sum(seconds for _, _, seconds in results) + (setup or 0)
    rows = [f"{'part':<36} {'result':<8} {'time':>8}"]
    if setup is not None:
        rows.append(f"{'venvs':<36} {'ready':<8} {_clock(setup):>8}")
    for tier, rc, seconds in results:
        rows.append(f"{tier.name:<36} {'passed' if rc == 0 else f'exit {rc}':<8} "
                    f"{_clock(seconds):>8}")  # fmt: skip
    rows.append(f"{'all':<36} {'':<8} {_clock(total):>8}")
    return "\n".join(rows)


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="run this part (repeat)")
    parser.add_argument("--list", action="store_true", help="print the parts and exit")
    parser.add_argument("--setup-seconds", type=float, help="the venvs' set-up time (make)")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to every pytest part")
    args = parser.parse_args(argv)
    names = {tier.name for tier in TIERS}
    unknown = set(args.only) - names
    if unknown:
        parser.error(f"no such part: {', '.join(sorted(unknown))} (parts: {', '.join(names)})")
    chosen = [t for t in TIERS if not args.only or t.name in args.only]
    if args.list:
        for tier in chosen:
            print(f"{tier.name}: {' '.join(command(tier, []))}")
        return 0
    results = [(tier, *run(tier, args.pytest_args)) for tier in chosen]
    table = summary(results, args.setup_seconds)
    print(f"\n=== timing summary ({jobs()} job(s))\n{table}", flush=True)
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    parts = [{"name": t.name, "exit": rc, "seconds": round(s, 1)} for t, rc, s in results]
    record = {"jobs": jobs(), "setup_seconds": args.setup_seconds, "parts": parts}
    TIMINGS.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if all(rc == 0 for _, rc, _ in results) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the part's own pytest has said what it stopped
        sys.exit(130)
