"""Benchmark (not a test): rebase classification of the full series vs `git rebase`.

    .venv/bin/python bench/rebase.py [--target sglang] [--onto 0.5.10] [--repeat 5]

Both run on the same warm mirror (the pinned base and the new release already imported):

- patchkit: `classify_rebase` of every patch onto the new base (scratch index in the bare
  mirror, all upstream-detection signals for the patches that do not apply);
- git: `git rebase --onto NEW OLD TIP` of the same commits (the series built on the old pin)
  in a shared clone with a work tree, `git rebase --skip` on each conflict, as a plain rebase
  user would to get through the series; the clone + checkout it needs is timed separately.

Goal: full classification < 3 s on a warm mirror.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from patchkit.apply import ApplyOptions, build_series  # noqa: E402
from patchkit.rebase import classify_rebase, resolve_new_base  # noqa: E402
from patchkit.upstream import Mirror, acquire  # noqa: E402
from patchkit.workspace import Workspace  # noqa: E402

GIT_ENV = {
    **os.environ,
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@patchkit.invalid",
    "GIT_EDITOR": "true",
    "LC_ALL": "C",
}


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    # The baseline is git itself, so it is run directly (patchkit's own git goes via gitops).
    return subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", *args],
        cwd=cwd,
        env=GIT_ENV,
        capture_output=True,
        text=True,
        check=check,
    )


def git_rebase(mirror: Path, old: str, new: str, tip: str) -> dict[str, float | int]:
    with tempfile.TemporaryDirectory(prefix="bench-git-rebase-") as tmp:
        clone = Path(tmp) / "tree"
        t0 = time.perf_counter()
        git(Path(tmp), "clone", "--quiet", "--shared", "--no-checkout", str(mirror), str(clone))
        git(clone, "checkout", "--quiet", "-B", "bench", tip)
        t1 = time.perf_counter()
        skipped = 0
        r = git(clone, "rebase", "--empty=drop", "--onto", new, old, "bench", check=False)
        while r.returncode != 0:
            skipped += 1
            r = git(clone, "rebase", "--skip", check=False)
            if skipped > 100:
                raise RuntimeError(r.stderr)
        t2 = time.perf_counter()
    return {"checkout_s": t1 - t0, "rebase_s": t2 - t1, "skipped": skipped}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="sglang")
    parser.add_argument("--onto", default="0.5.10")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    ws = Workspace.load()
    target, series = ws.target(args.target), ws.series(args.target)
    mirror = Mirror(target).path
    old = acquire(target, None)
    new, pin = resolve_new_base(target, args.onto)  # warms the mirror (imports once)
    old_tip, _ = build_series(mirror, old.commit, series, ApplyOptions(), bare=True)

    classify_times, report = [], None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        report = classify_rebase(
            mirror,
            target,
            series,
            old,
            new,
            series_version=ws.targets.series_version,
            ref=args.onto,
            pin=pin,
        )
        classify_times.append(time.perf_counter() - t0)
    git_runs = [git_rebase(mirror, old.commit, new.commit, old_tip) for _ in range(args.repeat)]

    classify = statistics.median(classify_times)
    rebase = statistics.median(r["rebase_s"] for r in git_runs)
    checkout = statistics.median(r["checkout_s"] for r in git_runs)
    result = {
        "target": args.target,
        "onto": args.onto,
        "patches": len(series.patches),
        "labels": report.counts() if report else {},
        "patchkit_classify_s": round(classify, 3),
        "patchkit_classify_min_s": round(min(classify_times), 3),
        "git_rebase_s": round(rebase, 3),
        "git_rebase_skipped_conflicts": git_runs[0]["skipped"],
        "git_clone_checkout_s": round(checkout, 3),
        "ratio_classify_over_git_rebase": round(classify / rebase, 2),
        "ratio_classify_over_git_checkout_plus_rebase": round(classify / (rebase + checkout), 2),
        "goal_s": 3.0,
        "goal_met": classify < 3.0,
        "repeat": args.repeat,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{args.target}: {result['patches']} patches onto {args.onto} "
            f"({', '.join(f'{n} {k}' for k, n in result['labels'].items())})"
        )
        print(
            f"  patchkit classify (median of {args.repeat}): {classify:.3f} s "
            f"(min {min(classify_times):.3f} s; goal < 3 s: "
            f"{'met' if result['goal_met'] else 'NOT met'})"
        )
        print(
            f"  git rebase --onto (median):       {rebase:.3f} s "
            f"(+ {checkout:.3f} s clone/checkout of a work tree; "
            f"{result['git_rebase_skipped_conflicts']} conflict(s) skipped)"
        )
        print(
            f"  ratio classify / git rebase:      {result['ratio_classify_over_git_rebase']}"
            f"  (vs rebase + checkout: "
            f"{result['ratio_classify_over_git_checkout_plus_rebase']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
