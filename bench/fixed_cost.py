"""Benchmark: the fixed cost of the commands run many times a day, warm, against git.

On the tree `bench/apply.py` makes (`patchkit apply --target sglang` of the real series into
a scratch directory, on the warm mirror), times side by side, alternating, one warm-up run
dropped:

    git status DIR                      the baseline
    patchkit status DIR                 goal < 0.3 s
    patchkit lint --target sglang       goal < 0.3 s (every line of the sglang series)
    the same lint, its stamps removed   the round trip built and exported again
    patchkit --help                     goal < 0.15 s

and prints each median with its ratio to `git status` (of medians and the median of the
paired runs).  With `--git-calls` it also counts the git processes each patchkit command
starts (a logging `git` first on PATH: it counts every git process, funnel or not).

A warm lint finds the round trip of each line proven by a stamp (`lint.RoundTripStamp`, in
the cache's verified/ folder) and builds nothing; the "no stamp" row removes those stamps
before each of its runs, so it pays for the build and export a changed series costs.

patchkit runs as an installed package does, with its bytecode cached: the bench removes
PYTHONDONTWRITEBYTECODE from the child's environment (the warm-up run writes the cache).

With `--old DIR` (a copy of an earlier patchkit, e.g. `git archive REV patchkit | tar -x -C
DIR`), that patchkit's status and lint run in the same rotation, on this project's patches,
and each gets a line with its paired ratio new / old.

    .venv/bin/python bench/fixed_cost.py [--runs 9] [--git-calls] [--old DIR]
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
sys.path.insert(0, str(ROOT))
GOALS = {"patchkit status": 0.3, "patchkit lint": 0.3, "patchkit --help": 0.15}
NO_STAMP = "lint (no stamp)"
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
        NO_STAMP: [*pk, "lint", "--target", "sglang"],
        "patchkit --help": [*pk, "--help"],
    }


def drop_stamps() -> None:
    """Remove lint's round-trip stamps (only those: the next lint writes them again)."""
    from patchkit.project import cache_root

    for stamp in (cache_root() / "verified").glob("roundtrip-*"):
        stamp.unlink(missing_ok=True)


def run(argv: list[str], env: dict[str, str], cwd: Path = ROOT) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}")
    return elapsed


def git_calls(argv: list[str], tmp: Path, fresh: bool = False) -> int:
    """How many git processes one run of `argv` starts."""
    shim = tmp / "shim"
    shim.mkdir(exist_ok=True)
    log = tmp / "git-calls.log"
    real = shutil.which("git")
    (shim / "git").write_text(f'#!/bin/sh\necho x >> "{log}"\nexec "{real}" "$@"\n')
    (shim / "git").chmod(0o755)
    env = patchkit_env(str(shim))
    # The stamps name the git program, which is the shim here: one run writes them.
    subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    log.write_text("")
    if fresh:
        drop_stamps()
    subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    return len(log.read_text().splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--git-calls", action="store_true", help="count git processes too")
    parser.add_argument("--old", type=Path, help="an earlier patchkit to run side by side")
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
        olds = {f"old {n[9:]}": cmds[n] for n in ("patchkit status", "patchkit lint")}
        old_env = {**patchkit_env(), "PATCHKIT_PROJECT": str(ROOT), "PYTHONPATH": str(args.old)}
        times: dict[str, list[float]] = {name: [] for name in cmds}
        old_times: dict[str, list[float]] = {name: [] for name in olds if args.old}
        for i in range(args.runs + 1):
            for name, argv in cmds.items():
                if name == NO_STAMP:
                    drop_stamps()
                elapsed = run(argv, GIT_ENV if name.startswith("git") else patchkit_env())
                if i:  # run 0 warms the page cache and writes the bytecode cache
                    times[name].append(elapsed)
            for name in old_times:
                elapsed = run(olds[name], old_env, cwd=args.old)
                if i:
                    old_times[name].append(elapsed)
        calls = {}
        for name, argv in cmds.items() if args.git_calls else ():
            if name != "git status":
                calls[name] = git_calls(argv, tmp, fresh=name == NO_STAMP)
    base = times["git status"]
    print(f"{'':20}{'median':>9}{'min':>9}{'max':>9}{'/git status':>13}{'paired':>9}  goal")
    for name, samples in times.items():
        med = statistics.median(samples)
        paired = statistics.median(s / b for s, b in zip(samples, base, strict=True))
        goal = GOALS.get(name)  # the no-stamp row is shown for comparison
        verdict = f"< {goal:.2f} s: {'met' if med < goal else 'NOT met'}" if goal else ""
        print(
            f"{name:20}{med:9.3f}{min(samples):9.3f}{max(samples):9.3f}"
            f"{med / statistics.median(base):12.1f}x{paired:8.1f}x  {verdict}"
        )
    for name, samples in old_times.items():
        new = times[f"patchkit {name[4:]}"]
        paired = statistics.median(n / o for n, o in zip(new, samples, strict=True))
        print(
            f"{name:20}{statistics.median(samples):9.3f}{min(samples):9.3f}{max(samples):9.3f}"
            f"  new / old: {statistics.median(new) / statistics.median(samples):.2f}x of medians,"
            f" {paired:.2f}x paired"
        )
    print(f"{args.runs} runs each, alternating, warm (one warm-up run dropped); seconds")
    if args.git_calls:
        print("git processes per run: " + ", ".join(f"{n}: {c}" for n, c in calls.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
