"""Benchmark: `patchkit apply` of the real series vs raw `git worktree add` + `git am`.

Both read the same warm mirror (the pinned sglang base; git through a bare clone that shares
its objects and keeps its own writes) and produce a checkout with one commit per patch.  Runs
alternate so machine noise hits both; prints medians and the ratio.
Goal: patchkit / raw <= 1.15.

    .venv/bin/python bench/apply.py [--runs 7] [--target sglang]
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

from patchkit.upstream import Mirror, acquire  # noqa: E402
from patchkit.workspace import Workspace  # noqa: E402

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "b",
    "GIT_AUTHOR_EMAIL": "b@x",
    "GIT_COMMITTER_NAME": "b",
    "GIT_COMMITTER_EMAIL": "b@x",
}


def raw_git(mirror: Path, base: str, patches: list[Path], dest: Path) -> None:
    subprocess.run(
        [
            "git",
            "--git-dir",
            str(mirror),
            "worktree",
            "add",
            "--quiet",
            "--detach",
            str(dest),
            base,
        ],
        check=True,
        env=GIT_ENV,
    )
    subprocess.run(
        ["git", "-C", str(dest), "am", "--quiet", *map(str, patches)], check=True, env=GIT_ENV
    )


def baseline_mirror(mirror: Path, tmp: Path) -> Path:
    """A bare clone that reads the mirror's objects (alternates) and writes its own: git am's
    objects and its `gc --auto` packs would otherwise land in patchkit's mirror, where each
    pack patchkit's apply then freshens (an object it writes again) changes the mirror's
    integrity signature and bills patchkit a full re-hash of the base on every run."""
    dest = tmp / "baseline.git"
    subprocess.run(
        ["git", "clone", "--quiet", "--bare", "--shared", str(mirror), str(dest)],
        check=True,
        env=GIT_ENV,
        stderr=subprocess.DEVNULL,  # "cloned an empty repository": the mirror has no branch
    )
    return dest


def remove_worktree(mirror: Path, dest: Path) -> None:
    subprocess.run(
        ["git", "--git-dir", str(mirror), "worktree", "remove", "--force", str(dest)], check=True
    )


def with_patchkit(target: str, dest: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "patchkit", "apply", "--target", target, "--into", str(dest)],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PATCHKIT_OFFLINE_GIT": "1"},
        cwd=ROOT,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--target", default="sglang")
    args = parser.parse_args()
    ws = Workspace.load(ROOT)
    target = ws.target(args.target)
    series = ws.series(args.target)
    base = acquire(target, None, offline_git=True)
    patchkit_mirror = Mirror(target).path
    patches = [series.directory / name for name in series.names]
    raw_times, pk_times = [], []
    with tempfile.TemporaryDirectory(prefix="bench-apply-") as tmp:
        mirror = baseline_mirror(patchkit_mirror, Path(tmp))
        for i in range(args.runs):
            raw_dest, pk_dest = Path(tmp) / f"raw{i}", Path(tmp) / f"pk{i}"
            os.sync()  # flush the previous run's writes so they are not billed to this one
            t0 = time.perf_counter()
            raw_git(mirror, base.commit, patches, raw_dest)
            raw_times.append(time.perf_counter() - t0)
            os.sync()
            t0 = time.perf_counter()
            with_patchkit(args.target, pk_dest)
            pk_times.append(time.perf_counter() - t0)
            remove_worktree(mirror, raw_dest)
            shutil.rmtree(pk_dest)
    ratios = sorted(p / r for p, r in zip(pk_times, raw_times, strict=True))
    raw, pk = statistics.median(raw_times), statistics.median(pk_times)
    print(f"{'':34}{'median':>10}{'min':>10}{'max':>10}")
    print(
        f"{'git worktree add + git am':34}{raw:10.3f}{min(raw_times):10.3f}{max(raw_times):10.3f}"
    )
    print(
        f"{'patchkit apply (CLI, whole run)':34}{pk:10.3f}"
        f"{min(pk_times):10.3f}{max(pk_times):10.3f}"
    )
    print(
        f"{len(patches)} patches on {args.target} {target.pin}, {args.runs} runs each, alternating"
    )
    print(
        f"ratio patchkit/raw = {pk / raw:.2f}x of medians, {statistics.median(ratios):.2f}x "
        "median of paired runs (goal <= 1.15x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
