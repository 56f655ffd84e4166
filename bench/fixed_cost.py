"""Benchmark: the fixed cost of the commands run many times a day, warm, against git.

On the tree `bench/apply.py` makes (`patchkit apply --target sglang` of the real series into
a scratch directory, on the warm mirror), times side by side, alternating, one warm-up run
dropped:

    git status DIR                      the baseline
    patchkit status DIR                 goal < 0.3 s
    patchkit lint --target sglang       goal < 0.3 s (every line of the sglang series)
    patchkit --help                     goal < 0.15 s

and prints each median with its ratio to `git status` (of medians and the median of the
paired runs).  With `--git-calls` it also counts the git processes each patchkit command
starts (a logging `git` first on PATH: it counts every git process, funnel or not).

patchkit runs as an installed package does, with its bytecode cached: the bench removes
PYTHONDONTWRITEBYTECODE from the child's environment (the warm-up run writes the cache).

    .venv/bin/python bench/fixed_cost.py [--runs 9] [--git-calls]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOALS = {"patchkit status": 0.3, "patchkit lint": 0.3, "patchkit --help": 0.15}
GIT_ENV = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


def patchkit_env(extra_path: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PATCHKIT_OFFLINE_GIT"] = "1"
    if extra_path:
        env["PATH"] = f"{extra_path}:{env.get('PATH', os.defpath)}"
    return env


def commands(tree: Path) -> dict[str, list[str]]:
    pk = [sys.executable, "-m", "patchkit"]
    return {
        "git status": ["git", "-C", str(tree), "status", "--short"],
        "patchkit status": [*pk, "status", str(tree)],
        "patchkit lint": [*pk, "lint", "--target", "sglang"],
        "patchkit --help": [*pk, "--help"],
    }


def run(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}")
    return elapsed


def git_calls(argv: list[str], tmp: Path) -> int:
    """How many git processes one run of `argv` starts."""
    shim = tmp / "shim"
    shim.mkdir(exist_ok=True)
    log = tmp / "git-calls.log"
    real = shutil.which("git")
    (shim / "git").write_text(f'#!/bin/sh\necho x >> "{log}"\nexec "{real}" "$@"\n')
    (shim / "git").chmod(0o755)
    log.write_text("")
    subprocess.run(argv, cwd=ROOT, env=patchkit_env(str(shim)), stdout=subprocess.DEVNULL)
    return len(log.read_text().splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--git-calls", action="store_true", help="count git processes too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fixed-") as tmpdir:
        tmp = Path(tmpdir)
        tree = tmp / "sglang"
        subprocess.run(
            [sys.executable, "-m", "patchkit", "apply", "--target", "sglang", "--into", str(tree)],
            cwd=ROOT,
            env=patchkit_env(),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        cmds = commands(tree)
        times: dict[str, list[float]] = {name: [] for name in cmds}
        for i in range(args.runs + 1):
            for name, argv in cmds.items():
                elapsed = run(argv, GIT_ENV if name.startswith("git") else patchkit_env())
                if i:  # run 0 warms the page cache and writes the bytecode cache
                    times[name].append(elapsed)
        calls = (
            {n: git_calls(a, tmp) for n, a in cmds.items() if n != "git status"}
            if args.git_calls
            else {}
        )
    base = times["git status"]
    print(f"{'':20}{'median':>9}{'min':>9}{'max':>9}{'/git status':>13}{'paired':>9}  goal")
    for name, samples in times.items():
        med = statistics.median(samples)
        paired = statistics.median(s / b for s, b in zip(samples, base, strict=True))
        goal = GOALS.get(name)
        verdict = f"< {goal:.2f} s: {'met' if med < goal else 'NOT met'}" if goal else ""
        print(
            f"{name:20}{med:9.3f}{min(samples):9.3f}{max(samples):9.3f}"
            f"{med / statistics.median(base):12.1f}x{paired:8.1f}x  {verdict}"
        )
    print(f"{args.runs} runs each, alternating, warm (one warm-up run dropped); seconds")
    if args.git_calls:
        print("git processes per run: " + ", ".join(f"{n}: {c}" for n, c in calls.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
