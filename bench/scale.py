"""Benchmark: how apply, export, lint and rebase classification grow with the series.

Synthetic series of N patches (each patch edits one different file of the pinned sglang tree)
are made once per N with patchkit's own export, in a scratch copy of the project.  Each verb is
timed side by side with the git command doing the same work on the same warm mirror:

    apply   patchkit apply             vs  git worktree add + git am (apply's build record
                                           is removed first, so the series is built)
    apply, recorded                    the same apply again: the series read from its record
    export  patchkit export --out      vs  git format-patch
    lint    patchkit lint              vs  git worktree add + git am (lint's round trip applies;
                                           its stamps are removed before each run, so every
                                           run builds and exports the series)
    rebase  patchkit rebase (same pin) vs  git worktree add + git am (classification applies)
    quilt   (where quilt is installed) quilt push -a on an exported tree

Prints one table: medians per N, the patchkit/git ratio, and the growth factor from the
smallest to the largest N for each side.  Goal: patchkit grows no faster than git.

    .venv/bin/python bench/scale.py [--sizes 10,100,1000] [--runs 3] [--work DIR]
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

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "b",
    "GIT_AUTHOR_EMAIL": "b@x",
    "GIT_COMMITTER_NAME": "b",
    "GIT_COMMITTER_EMAIL": "b@x",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True, text=True
    ).stdout


def patchkit(project: Path, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "patchkit", *args],
        cwd=ROOT,
        env={**os.environ, "PATCHKIT_OFFLINE_GIT": "1", "PATCHKIT_PROJECT": str(project)},
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def timed(fn, *args, **kwargs) -> float:
    os.sync()  # flush the previous run's writes so they are not billed to this one
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t0


def make_project(tmp: Path, size: int) -> tuple[Path, Path, str, list[Path]]:
    """A scratch project whose sglang series is `size` synthetic patches; returns (project,
    series directory, base commit, patch files)."""
    from patchkit.workspace import Workspace

    project = tmp / f"project-{size}"
    shutil.copytree(ROOT / "patches", project / "patches")
    shutil.copytree(ROOT / "build", project / "build", ignore=shutil.ignore_patterns("work"))
    ws = Workspace.load(project)
    series_dir = ws.series("sglang").directory
    for old in series_dir.glob("*.patch"):
        old.unlink()
    (series_dir / "series").write_text("")
    checkout = tmp / f"checkout-{size}"
    patchkit(project, "apply", "--target", "sglang", "--into", str(checkout))
    base = git("rev-parse", "HEAD", cwd=checkout).strip()
    listed = git("ls-files", "*.py", cwd=checkout).split()
    files = sorted(p for p in listed if p.startswith("python/sglang/"))[:size]
    if len(files) < size:
        raise SystemExit(f"the tree has only {len(files)} .py files under python/sglang/")
    for i, path in enumerate(files):
        target = checkout / path
        target.write_text(f"# patchkit scale bench {i}\n" + target.read_text())
        message = (
            f"Scale bench patch {i:04d}\n\nA comment line on top of {path}, one file per patch."
            "\n\nOrigin: vendor, patchkit\nForwarded: not-needed\nLast-Update: 2026-12-01\n"
            "Patchkit-Tests: tests/test_lint.py\n"
        )
        git("commit", "-qa", "-m", message, cwd=checkout)
    patchkit(project, "export", str(checkout), "--out", str(series_dir))
    patches = [series_dir / n for n in (series_dir / "series").read_text().split()]
    shutil.rmtree(checkout)
    return project, series_dir, base, patches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--work",
        type=Path,
        help="where the trees are made (default: the temp dir). On a disk mounted with online "
        "discard, as this machine's is, each tree removed bills its discards to the next runs; "
        "/dev/shm has none",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    from patchkit.upstream import Mirror
    from patchkit.workspace import Workspace

    patchkit_mirror = Mirror(Workspace.load(ROOT).target("sglang")).path
    quilt = shutil.which("quilt")
    rows: dict[str, dict[int, tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scale-", dir=args.work) as tmpdir:
        tmp = Path(tmpdir)
        # git's side writes into a bare clone sharing the mirror's objects (alternates): its
        # objects and gc packs in patchkit's mirror would bill patchkit integrity re-hashes.
        mirror = tmp / "baseline.git"
        git("clone", "-q", "--bare", "--shared", str(patchkit_mirror), str(mirror))
        for size in sizes:
            measure(size, mirror, tmp, args.runs, quilt, rows)
    _print(rows, sizes, args.runs)
    return 0


def measure(size: int, mirror: Path, tmp: Path, runs: int, quilt: str | None, rows) -> None:
    """Fill rows[verb][size] = (patchkit median, git median) for one series size."""
    project, _, base, patches = make_project(tmp, size)
    pin = _pin(project)
    samples: dict[str, tuple[list[float], list[float]]] = {
        k: ([], []) for k in ("apply", "apply, recorded", "export", "lint", "rebase")
    }

    def raw_am(dest: Path) -> None:
        git("--git-dir", str(mirror), "worktree", "add", "-q", "--detach", str(dest), base)
        git("am", "-q", *map(str, patches), cwd=dest)

    def drop(dest: Path) -> None:
        git("--git-dir", str(mirror), "worktree", "remove", "--force", str(dest))

    for run in range(runs):
        raw_dest, pk_dest = tmp / f"raw-{size}-{run}", tmp / f"pk-{size}-{run}"
        out_raw, out_pk = tmp / f"fp-{size}-{run}", tmp / f"ex-{size}-{run}"
        samples["apply"][1].append(timed(raw_am, raw_dest))
        _drop_stamps("build-*")
        samples["apply"][0].append(
            timed(patchkit, project, "apply", "--target", "sglang", "--into", str(pk_dest))
        )
        again = tmp / f"pk-again-{size}-{run}"
        samples["apply, recorded"][1].append(samples["apply"][1][-1])
        samples["apply, recorded"][0].append(
            timed(patchkit, project, "apply", "--target", "sglang", "--into", str(again))
        )
        shutil.rmtree(again)
        samples["export"][1].append(
            timed(git, "format-patch", "-q", "-o", str(out_raw), f"{base}..HEAD", cwd=raw_dest)
        )
        samples["export"][0].append(
            timed(patchkit, project, "export", str(pk_dest), "--out", str(out_pk))
        )
        drop(raw_dest)
        shutil.rmtree(pk_dest)
        for verb, argv in (
            ("lint", ("lint", "--target", "sglang")),
            ("rebase", ("rebase", "--target", f"sglang@{pin}")),
        ):
            samples[verb][1].append(timed(raw_am, raw_dest))
            drop(raw_dest)
            if verb == "lint":
                _drop_stamps("roundtrip-*")
            samples[verb][0].append(timed(patchkit, project, *argv))
    if quilt:
        rows.setdefault("quilt push -a", {})[size] = (
            statistics.median(_quilt_runs(quilt, mirror, base, patches, tmp, runs)),
            statistics.median(samples["apply"][1]),
        )
    for verb, (pk, raw) in samples.items():
        rows.setdefault(verb, {})[size] = (statistics.median(pk), statistics.median(raw))


def _drop_stamps(pattern: str) -> None:
    """Remove lint's round-trip stamps or apply's build records (`pattern`): what they
    record is not built again."""
    from patchkit.project import cache_root

    for stamp in (cache_root() / "verified").glob(pattern):
        stamp.unlink(missing_ok=True)


def _pin(project: Path) -> str:
    from patchkit.workspace import Workspace

    return Workspace.load(project).target("sglang").pin


def _quilt_runs(quilt: str, mirror: Path, base: str, patches, tmp: Path, runs: int):
    times = []
    for run in range(runs):
        dest = tmp / f"quilt-{run}"
        git("--git-dir", str(mirror), "worktree", "add", "-q", "--detach", str(dest), base)
        (dest / "patches").mkdir()
        for p in patches:
            shutil.copy(p, dest / "patches" / p.name)
        (dest / "patches" / "series").write_text("".join(f"{p.name} -p1\n" for p in patches))
        times.append(
            timed(
                subprocess.run,
                [quilt, "push", "-a", "-q"],
                cwd=dest,
                check=True,
                stdout=subprocess.DEVNULL,
            )
        )
        git("--git-dir", str(mirror), "worktree", "remove", "--force", str(dest))
    return times


def _print(rows, sizes: list[int], runs: int) -> None:
    head = f"{'verb':<16}" + "".join(f"{f'N={n} pk / git':>24}" for n in sizes)
    print(
        head + f"{'growth pk':>11}{'growth git':>11}{'+s pk':>8}{'git':>6}{'ms/patch pk':>13}"
        f"{'git':>6}"
    )
    for verb, by_size in rows.items():
        cells = "".join(
            f"{by_size[n][0]:9.2f} /{by_size[n][1]:7.2f} ={by_size[n][0] / by_size[n][1]:5.2f}x"
            for n in sizes
        )
        first, last = by_size[sizes[0]], by_size[sizes[-1]]
        # The cost of one more patch, between the two largest sizes (fixed costs cancel).
        prev = by_size[sizes[-2]] if len(sizes) > 1 else (0.0, 0.0)
        added = max(sizes[-1] - (sizes[-2] if len(sizes) > 1 else 0), 1)
        slope = [1000 * (last[i] - prev[i]) / added for i in (0, 1)]
        print(
            f"{verb:<16}{cells}{last[0] / first[0]:10.1f}x{last[1] / first[1]:10.1f}x"
            f"{last[0] - first[0]:8.2f}{last[1] - first[1]:6.2f}{slope[0]:13.1f}{slope[1]:6.1f}"
        )
    print(f"medians of {runs} runs per cell, seconds; growth = N={sizes[-1]} / N={sizes[0]}")
    print(f"+s: t(N={sizes[-1]}) - t(N={sizes[0]}), the seconds the longer series adds")
    print("ms/patch: (t(N_last) - t(N_prev)) / (N_last - N_prev), the cost of one more patch")
    print("(quilt row: quilt push -a / git am; its growth columns are quilt and git am)")


if __name__ == "__main__":
    raise SystemExit(main())
