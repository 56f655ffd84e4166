"""Plant each listed mistake in a copy of a line's patched SGLang tree and require the
speculation tier to fail on it.

    python tests/mutation/plant.py --line 0.5.17 [--only ID ...] [--sample N] [--jobs J] [--json]

The mistakes are data (``tests/mutation/spec_<line>.toml``); every ``old`` text must occur
exactly once in its file, so a mistake that no longer matches the patch is reported as an
error instead of passing unnoticed. The unmutated copy must pass first. Exit 0 when every
mistake was caught, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tests" / "payload"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


@dataclass
class Verdict:
    id: str
    what: str
    verdict: str  # caught | missed | error
    detail: str
    seconds: float


def load(line: str) -> dict:
    path = HERE / f"spec_{line.replace('.', '')}.toml"
    data = tomllib.loads(path.read_text())
    if data.get("line") != line:
        raise SystemExit(f"{path}: line {data.get('line')!r} is not {line!r}")
    return data


def patched_tree(line: str) -> Path:
    """The line's patched tree as the tier builds it: patchkit's own acquisition of the line's
    pinned base and apply of its series (the payload conftest's ``prepare_tree``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "payload_conftest", ROOT / "tests" / "payload" / "conftest.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.prepare_tree("sglang", patched=True, line=line)


def run_tier(tree: Path, line: str, tests: list[str], timeout: int) -> tuple[int, str]:
    # The line is named, not inherited: under another line's name the tier deselects the
    # tests of patches that line does not carry, and a mistake there would pass unseen.
    env = {**os.environ, "PATCHKIT_SPEC_TREE": str(tree), "PATCHKIT_PAYLOAD_TREE": "patched",
           "PATCHKIT_PAYLOAD_SGLANG_ROOT": str(tree),
           "PATCHKIT_PAYLOAD_LINE": line}  # fmt: skip
    cmd = [sys.executable, "-m", "pytest", *tests, "-x", "-q", "-p", "no:cacheprovider",
           "-W", "ignore", "-o", "addopts="]  # fmt: skip
    try:
        run = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    out = run.stdout + run.stderr
    first = next(
        (ln for ln in out.splitlines() if ln.startswith(("FAILED ", "ERROR "))),
        out.strip().splitlines()[-1] if out.strip() else "",
    )
    return run.returncode, first


def plant(copy: Path, edits: list[dict]) -> dict[Path, str]:
    """Apply the edits; return the original texts of the files touched."""
    originals: dict[Path, str] = {}
    for edit in edits:
        path = copy / "python" / edit["file"]
        text = originals.get(path) or path.read_text()
        originals.setdefault(path, text)
        current = path.read_text()
        count = current.count(edit["old"])
        if count != 1:
            raise ValueError(f"{edit['file']}: the planted text occurs {count} times, not once")
        path.write_text(current.replace(edit["old"], edit["new"]))
    return originals


def run_mutant(copy: Path, line: str, mutation: dict, tests: list[str], timeout: int) -> Verdict:
    """Plant one mistake in `copy`, run the tier on it, and put the copy back as it was."""
    start = time.monotonic()
    try:
        originals = plant(copy, mutation["edit"])
    except ValueError as exc:
        return Verdict(mutation["id"], mutation["what"], "error", str(exc), 0.0)
    try:
        rc, detail = run_tier(copy, line, tests, timeout)
    finally:
        for path, text in originals.items():
            path.write_text(text)
        for cache in copy.rglob("__pycache__"):
            shutil.rmtree(cache, ignore_errors=True)
    verdict = "caught" if rc == 1 else "missed" if rc == 0 else "error"
    return Verdict(mutation["id"], mutation["what"], verdict, detail,
                   round(time.monotonic() - start, 1))  # fmt: skip


def chosen(mutations: list[dict], only: list[str], sample: int) -> list[dict]:
    """The mistakes to plant: those named by --only, else a rotating sample (0: all)."""
    if only:
        return [m for m in mutations if m["id"] in only]
    if sample <= 0:
        return mutations
    from sampling import rotating

    return rotating(mutations, sample)


def check_baseline(copy: Path, args: argparse.Namespace, data: dict) -> float | bool:
    """The unmutated copy must pass the whole tier: its seconds, or False (said why)."""
    start = time.monotonic()
    rc, detail = run_tier(copy, args.line, data["tests"], args.timeout)
    if rc != 0 or "skipped" in detail or "deselected" in detail:
        # a skipped or deselected test cannot catch anything: the baseline runs them all
        print(f"error: the unmutated tree does not pass the whole tier ({detail})",
              file=sys.stderr)  # fmt: skip
        return False
    return round(time.monotonic() - start, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--line", default="0.5.17")
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--sample", type=int, default=0,
                        help="plant this many, chosen by the commit (tests/sampling.py); "
                             "0 or PATCHKIT_SAMPLE=all: every one")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1, help="mistakes run side by side")
    parser.add_argument("--baseline", choices=("first", "only", "skip"), default="first",
                        help="the unmutated run: before the mistakes (default), alone, or not "
                             "at all (where the caller runs it apart)")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args(argv)

    data = load(args.line)
    unknown = set(args.only) - {m["id"] for m in data["mutation"]}
    if unknown:
        print(f"error: no such mistake: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    mutations = [] if args.baseline == "only" else chosen(data["mutation"], args.only, args.sample)
    tree = patched_tree(args.line)
    jobs = max(1, min(args.jobs, len(mutations)))
    with tempfile.TemporaryDirectory(prefix="spec-mutation-") as tmp:
        copies = []
        for i in range(jobs):
            copy = Path(tmp) / f"tree-{i}"
            shutil.copytree(
                tree / "python", copy / "python", ignore=shutil.ignore_patterns("__pycache__")
            )
            copies.append(copy)
        baseline = None if args.baseline == "skip" else check_baseline(copies[0], args, data)
        if baseline is False:
            return 1
        free: queue.Queue[Path] = queue.Queue()
        for copy in copies:
            free.put(copy)

        def one(mutation: dict) -> Verdict:
            copy = free.get()
            try:
                return run_mutant(copy, args.line, mutation, data["tests"], args.timeout)
            finally:
                free.put(copy)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            verdicts = list(pool.map(one, mutations))
    if args.json:
        print(json.dumps({"line": args.line, "baseline_seconds": baseline,
                          "planted": len(verdicts), "of": len(data["mutation"]),
                          "mutations": [asdict(v) for v in verdicts]}, indent=2))  # fmt: skip
    else:
        for v in verdicts:
            print(f"{v.verdict:7} {v.id:40} {v.seconds:6.1f}s  {v.detail}")
        caught = sum(v.verdict == "caught" for v in verdicts)
        print(f"{caught}/{len(verdicts)} planted mistakes caught (line {args.line}; "
              f"{len(verdicts)} of {len(data['mutation'])} planted)")  # fmt: skip
    return 0 if all(v.verdict == "caught" for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
