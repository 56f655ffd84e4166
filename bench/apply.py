"""Benchmark: `patchkit apply` of the real series vs raw `git worktree add` + `git am`.

Both read the same mirror (the pinned sglang base; git through a bare clone that shares its
objects and keeps its own writes) and produce a checkout with one commit per patch.  Runs
alternate so machine noise hits both; prints medians and the ratio.
Goal: patchkit / raw <= 1.15, warm and cold.

Warm: the mirror in the page cache (each run reads what the previous one read). Cold: before
every timed run the page cache is emptied of what either side reads: the mirror and the
baseline clone, the patches, and each side's own program: git's binaries (``git``,
``git-core``) for both, and for patchkit also every file its Python process opens or imports
(the interpreter, the standard library, the packages and ``patchkit/`` itself, recorded once
by an untimed apply under an audit hook); the bytes still resident are printed (``fincore``).
Shared system libraries (libc, libz) stay resident for both.

    .venv/bin/python bench/apply.py [--runs 7] [--target sglang] [--regimes warm,cold] [--old DIR]
        [--work DIR] [--settle SECONDS]

Every checkout is removed at the end, none between runs: on a disk mounted with online discard
(this machine's) a removed tree's discards land in the runs after it. `--settle` waits that long
after each eviction, before the timed run.

With `--work DIR` the checkouts (both sides') are made under DIR, e.g. /dev/shm, where writing
the 2,500 files is cheap and steady: the regime where each side's fixed cost shows most.
With `--old DIR` (a copy of an earlier patchkit: `git archive REV | tar -x -C DIR`) that
patchkit's apply of this project's series runs third in each rotation and gets its own line.
An earlier patchkit without the build record writes the series' objects on every run; where
the mirror holds one of them packed, git freshens that pack, the mirror's integrity signature
changes and the next run of either patchkit re-hashes the base (0.13 s): its line and the
new one's are then both slower than either alone.
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

from bench.fixed_cost import patchkit_env  # noqa: E402
from bench.pagecache import evict, files_under  # noqa: E402
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


def with_patchkit(target: str, dest: Path, old: Path | None = None) -> None:
    """This patchkit's apply, or (`old`) that of an earlier copy, on this project's series."""
    env = patchkit_env()
    if old is not None:
        env.update(PATCHKIT_PROJECT=str(ROOT), PYTHONPATH=str(old))
    subprocess.run(
        [sys.executable, "-m", "patchkit", "apply", "--target", target, "--into", str(dest)],
        check=True,
        stdout=subprocess.DEVNULL,
        env=env,
        cwd=old or ROOT,
    )


PROBE = """
import os, runpy, sys
opened = set()
def hook(event, args):
    if event == "open" and isinstance(args[0], str):
        opened.add(os.path.abspath(args[0]))
sys.addaudithook(hook)
sys.argv = ["patchkit", "apply", "--target", TARGET, "--into", DEST]
try:
    runpy.run_module("patchkit", run_name="__main__")
except SystemExit:
    pass
modules = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
files = opened | {f for f in modules if f} | {sys.executable, os.path.realpath(sys.executable)}
with open(OUT, "w") as f:
    f.write("\\n".join(sorted(files)))
"""


def python_files_read(target: str, dest: Path) -> list[str]:
    """The files one ``patchkit apply`` opens or imports in its own process (an untimed run
    under an audit hook), for the cold regime to evict."""
    out = dest.with_suffix(".files")
    code = PROBE.replace("TARGET", repr(target)).replace("DEST", repr(str(dest)))
    code = code.replace("OUT", repr(str(out)))
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        stdout=subprocess.DEVNULL,
        env=patchkit_env(),
        cwd=ROOT,
    )
    shutil.rmtree(dest)
    files = out.read_text().splitlines()
    return [f for f in files if os.path.isfile(f) and not f.startswith(str(dest))]


def _git_core() -> list[str]:
    out = subprocess.run(["git", "--exec-path"], capture_output=True, text=True, check=True)
    return [out.stdout.strip()]


def report(
    label: str,
    raw_times: list[float],
    pk_times: list[float],
    note: str,
    old_times: list[float] | None = None,
) -> None:
    ratios = sorted(p / r for p, r in zip(pk_times, raw_times, strict=True))
    raw, pk = statistics.median(raw_times), statistics.median(pk_times)
    print(f"{label:34}{'median':>10}{'min':>10}{'max':>10}")
    print(
        f"{'git worktree add + git am':34}{raw:10.3f}{min(raw_times):10.3f}{max(raw_times):10.3f}"
    )
    print(
        f"{'patchkit apply (CLI, whole run)':34}{pk:10.3f}"
        f"{min(pk_times):10.3f}{max(pk_times):10.3f}"
    )
    if old_times:
        old, fastest, slowest = statistics.median(old_times), min(old_times), max(old_times)
        print(f"{'earlier patchkit (--old)':34}{old:10.3f}{fastest:10.3f}{slowest:10.3f}")
    print(note)
    print(
        f"ratio patchkit/raw = {pk / raw:.2f}x of medians, {statistics.median(ratios):.2f}x "
        "median of paired runs (goal <= 1.15x)"
    )
    print("paired runs (raw, patchkit" + (", old):" if old_times else "):"), end="")
    for i, (r, p) in enumerate(zip(raw_times, pk_times, strict=True)):
        print(f" {r:.2f}/{p:.2f}" + (f"/{old_times[i]:.2f}" if old_times else ""), end="")
    print()
    if old_times:
        paired = sorted(p / o for p, o in zip(pk_times, old_times, strict=True))
        print(
            f"ratio earlier/raw = {statistics.median(old_times) / raw:.2f}x of medians; "
            f"patchkit/earlier = {statistics.median(paired):.2f}x median of paired runs"
        )
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--target", default="sglang")
    parser.add_argument(
        "--regimes", default="warm,cold", help="warm, cold or both (default), in that order"
    )
    parser.add_argument(
        "--old",
        type=Path,
        help="an earlier patchkit (`git archive REV | tar -x -C DIR`) run in the same rotation",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=None,
        help="seconds to wait after each eviction, before the timed run (default 0)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        help="where the checkouts are made (default: the temp dir; /dev/shm: file writes cheap)",
    )
    args = parser.parse_args()
    regimes = [r for r in args.regimes.split(",") if r]
    if not regimes or set(regimes) - {"warm", "cold"}:
        parser.error(f"--regimes takes warm and/or cold, got {args.regimes!r}")
    ws = Workspace.load(ROOT)
    target = ws.target(args.target)
    series = ws.series(args.target)
    base = acquire(target, None, offline_git=True)
    patchkit_mirror = Mirror(target).path
    patches = [series.directory / name for name in series.names]
    with tempfile.TemporaryDirectory(prefix="bench-apply-", dir=args.work) as tmp:
        mirror = baseline_mirror(patchkit_mirror, Path(tmp))
        git_files = files_under([shutil.which("git") or "/usr/bin/git", *_git_core()])
        read_by_both = files_under([patchkit_mirror, mirror, *patches]) + git_files
        python_files = (
            python_files_read(args.target, Path(tmp) / "probe") if "cold" in regimes else []
        )
        # One untimed run of each side first: git's and Python's caches (bytecode included,
        # as an installed patchkit has it) are then as every later run finds them.
        raw_git(mirror, base.commit, patches, Path(tmp) / "raw-warmup")
        with_patchkit(args.target, Path(tmp) / "pk-warmup")
        # Every tree is removed at the end only: this disk is mounted with online discard,
        # and a tree removed between runs bills its discards to the runs after it (seen
        # here: alternately the two sides, by up to 1 s of a 0.25 s run, for some 15 s).
        made = [Path(tmp) / "raw-warmup", Path(tmp) / "pk-warmup"]
        for regime in regimes:
            raw_times, pk_times, old_times, resident = [], [], [], []
            is_cold = regime == "cold"
            settle = args.settle or 0.0
            for i in range(args.runs):
                raw_dest, pk_dest = Path(tmp) / f"raw{regime}{i}", Path(tmp) / f"pk{regime}{i}"
                os.sync()  # flush the previous run's writes so they are not billed to this one
                if is_cold:
                    resident.append(evict(read_by_both))
                time.sleep(settle)
                t0 = time.perf_counter()
                raw_git(mirror, base.commit, patches, raw_dest)
                raw_times.append(time.perf_counter() - t0)
                os.sync()
                if is_cold:
                    resident.append(evict(read_by_both + python_files))
                time.sleep(settle)
                t0 = time.perf_counter()
                with_patchkit(args.target, pk_dest)
                pk_times.append(time.perf_counter() - t0)
                if args.old:
                    old_dest = Path(tmp) / f"old{regime}{i}"
                    os.sync()
                    if is_cold:
                        resident.append(evict(read_by_both + python_files))
                    time.sleep(settle)
                    t0 = time.perf_counter()
                    with_patchkit(args.target, old_dest, args.old)
                    old_times.append(time.perf_counter() - t0)
                    made.append(old_dest)
                made += [raw_dest, pk_dest]
            note = (
                f"{len(patches)} patches on {args.target} {target.pin}, {args.runs} runs each, "
                f"alternating, {regime} page cache"
            )
            if settle:
                note += f", {settle:g} s settled before each"
            if resident:
                evicted = len(read_by_both) + len(python_files)
                most = max(resident)
                note += f" ({evicted} files evicted before each run"
                note += f", at most {most / 1e6:.1f} MB left resident)" if most >= 0 else ")"
            report(f"{regime}:", raw_times, pk_times, note, old_times)
        for dest in made:
            if dest.name.startswith("raw"):
                remove_worktree(mirror, dest)
            else:
                shutil.rmtree(dest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
