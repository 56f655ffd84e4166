"""Benchmark (not a test): `patchkit build --target sglang` against a plain
`python -m build --wheel` of the unpatched sglang tree.

Each round times both, interleaved so machine drift hits both alike.  The plain build gets a
freshly unpacked copy of the pinned sdist (unpacking is not timed); patchkit's time includes
everything it does: resolving the base, applying the series into a clean tree, the isolated
build, and the reproducible rewrite with provenance and SBOM.  Both use an isolated build
environment, as `python -m build` does by default.

    python bench/wheels.py [--rounds 3] [--json]

Goal: median ratio <= 1.2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
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

GOAL = 1.2


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from patchkit.project import cache_root
    from patchkit.upstream import download_sdist, safe_extract_sdist
    from patchkit.workspace import Workspace

    ws = Workspace.load(ROOT)
    sdist = download_sdist(ws.target("sglang").pinned, cache_root())
    env = {**os.environ, "PATCHKIT_OFFLINE_GIT": os.environ.get("PATCHKIT_OFFLINE_GIT", "1")}
    # warm the mirror (the sdist import happens once per machine, not per build)
    subprocess.run(
        [sys.executable, "-m", "patchkit", "fetch", "--target", "sglang"],
        env=env,
        capture_output=True,
    )
    plain, patched = [], []
    with tempfile.TemporaryDirectory(prefix="bench-wheels-") as tmp:
        scratch = Path(tmp)
        for n in range(args.rounds):
            tree_parent = scratch / f"plain-{n}"
            tree = safe_extract_sdist(sdist, tree_parent)
            plain.append(
                _timed(
                    [
                        sys.executable,
                        "-m",
                        "build",
                        "--wheel",
                        "--outdir",
                        str(scratch / f"plain-dist-{n}"),
                        str(tree),
                    ],
                    env,
                )
            )
            shutil.rmtree(tree_parent)
            patched.append(
                _timed(
                    [
                        sys.executable,
                        "-m",
                        "patchkit",
                        "build",
                        "--target",
                        "sglang",
                        "--out",
                        str(scratch / f"pk-dist-{n}"),
                    ],
                    env,
                )
            )
            if not args.json:
                print(
                    f"round {n + 1}: python -m build {plain[-1]:6.1f}s   patchkit build "
                    f"{patched[-1]:6.1f}s   ratio {patched[-1] / plain[-1]:.2f}",
                    flush=True,
                )
        by_name: dict[str, set[str]] = {}
        for path in scratch.glob("pk-dist-*/*.whl"):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            by_name.setdefault(path.name, set()).add(digest)
        wheels = sorted(by_name)
    ratios = [p / b for p, b in zip(patched, plain, strict=True)]
    summary = {
        "rounds": args.rounds,
        "python_m_build_s": [round(t, 2) for t in plain],
        "patchkit_build_s": [round(t, 2) for t in patched],
        "median_python_m_build_s": round(statistics.median(plain), 2),
        "median_patchkit_build_s": round(statistics.median(patched), 2),
        "ratio_of_medians": round(statistics.median(patched) / statistics.median(plain), 3),
        "median_ratio": round(statistics.median(ratios), 3),
        "goal": GOAL,
        "wheels": wheels,  # more than one when the series changed during the run
        "identical_wheels": all(len(h) == 1 for h in by_name.values()),
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(
            f"median: python -m build {summary['median_python_m_build_s']}s, patchkit build "
            f"{summary['median_patchkit_build_s']}s, ratio {summary['median_ratio']} "
            f"(goal <= {GOAL}); patchkit wheels of the same name identical: "
            f"{summary['identical_wheels']} ({', '.join(wheels)})"
        )
    return 0 if summary["median_ratio"] <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
