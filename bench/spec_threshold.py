"""Output throughput of running SGLang servers over a concurrency sweep, as a table of medians.

    python bench/spec_threshold.py --server baseline=http://127.0.0.1:30000 \
        [--server eagle3-v2=URL] [--server eagle3-v2+threshold=URL] ... \
        [--concurrency 1,4,16,32,64,128] [--runs 3] [--max-new-tokens 128] \
        [--models DIR] [--results runs.json] [--markdown table.md]

Each ``--server LABEL=URL`` is a server already started by the caller (``gpu/session.py``
starts the GPU tier's five on the H200; docs/spec-threshold.md gives the launch lines for the
target box). At every concurrency C the script keeps C requests in flight (closed loop,
``max(--requests-per-level, 2*C)`` requests), greedy, ``ignore_eos``, and reports output
tokens per second over the level's wall time; each level runs ``--runs`` times, servers
interleaved run by run so that drift hits every server alike, and the table shows medians.
Prompts are in the tiny models' language with ``--models`` (``DIR/language.json``), else
random ids below ``--vocab``. For every label ``X+...`` (``X+threshold``, ``X+adaptive``,
...) the table adds the ratio to ``max(baseline, X)``; the goal is >= 0.97 at every
concurrency. Only the standard library.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DEFAULT_LEVELS = "1,4,16,32,64,128"
GOAL = 0.97


def _post(url: str, payload: dict, timeout: float) -> dict:
    request = urllib.request.Request(
        url, json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _prompts(args: argparse.Namespace, concurrency: int, total: int) -> list[list[int]]:
    rng = random.Random(args.seed + concurrency)
    if args.models:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
        from language import ChainLanguage

        lang = ChainLanguage.load(Path(args.models) / "language.json")
        return [lang.prompt(rng.randrange(10**9), args.input_len) for _ in range(total)]
    return [[rng.randrange(100, args.vocab) for _ in range(args.input_len)] for _ in range(total)]


def run_level(url: str, concurrency: int, args: argparse.Namespace) -> dict:
    """Closed-loop load at ``concurrency``; output tok/s and the servers' accept length."""
    total = max(args.requests_per_level, args.rounds * concurrency)
    prompts = _prompts(args, concurrency, total)
    lock = threading.Lock()
    tokens, verify = [0], [0]

    def one(prompt: list[int]) -> None:
        out = _post(
            url + "/generate",
            {
                "input_ids": prompt,
                "sampling_params": {
                    "temperature": 0,
                    "max_new_tokens": args.max_new_tokens,
                    "ignore_eos": True,
                },
            },
            args.timeout,
        )
        meta = out.get("meta_info", {})
        with lock:
            tokens[0] += int(meta.get("completion_tokens", len(out.get("output_ids", []))))
            verify[0] += int(meta.get("spec_verify_ct", 0))

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, prompts))
    elapsed = time.perf_counter() - start
    return {
        "output_tok_s": tokens[0] / elapsed,
        "requests": total,
        "seconds": elapsed,
        "tokens_per_verify": tokens[0] / verify[0] if verify[0] else None,
    }


def medians(results: dict) -> dict[str, dict[str, float]]:
    return {
        label: {
            c: statistics.median(run["output_tok_s"] for run in runs)
            for c, runs in levels.items()
            if runs
        }
        for label, levels in results.items()
    }


def spreads(results: dict) -> dict[str, dict[str, str]]:
    """Per label and concurrency: the lowest and highest tok/s of the runs, and how many."""
    return {
        label: {
            c: f"{min(tok):,.0f}-{max(tok):,.0f} ({len(tok)})"
            for c, runs in levels.items()
            if (tok := [run["output_tok_s"] for run in runs])
        }
        for label, levels in results.items()
    }


def ratios(table: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """For each ``X+...`` (``X+threshold``, ``X+adaptive``, ...): median tok/s over
    max(baseline, X), per concurrency; over the baseline alone where X was not run
    (`reference` names what the ratio is to)."""
    out = {}
    for label, row in table.items():
        base, plus, _ = label.partition("+")
        if not plus or "baseline" not in table:
            continue
        others = [table["baseline"]] + ([table[base]] if base in table else [])
        out[label] = {
            c: v / max(other[c] for other in others)
            for c, v in row.items()
            if all(c in other for other in others)
        }
    return out


def reference(label: str, table: dict[str, dict[str, float]]) -> str:
    """What the ratio of `label` (an ``X+...``) is to."""
    base = label.partition("+")[0]
    return f"max(baseline, {base})" if base in table else f"baseline ({base} not run)"


def _markdown(results: dict, table: dict, rel: dict, cols: list[str]) -> str:
    head = " | ".join(f"C={c}" for c in cols) + " |\n|---|" + "---:|" * len(cols)
    lines = [f"| output tok/s (median) | {head}"]
    for label, row in table.items():
        cells = [f"{row[c]:,.0f}" if c in row else "-" for c in cols]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for label, row in rel.items():
        cells = [
            (f"**{row[c]:.2f}**" if row[c] < GOAL else f"{row[c]:.2f}") if c in row else "-"
            for c in cols
        ]
        lines.append(f"| {label} / {reference(label, table)} | " + " | ".join(cells) + " |")
    lines += ["", f"| output tok/s: lowest-highest (runs) | {head}"]
    for label, row in spreads(results).items():
        lines.append(f"| {label} | " + " | ".join(row.get(c, "-") for c in cols) + " |")
    return "\n".join(lines)


def render(results: dict, levels: list[int], markdown: bool = False) -> str:
    table = medians(results)
    rel = ratios(table)
    cols = [str(c) for c in levels]
    if markdown:
        return _markdown(results, table, rel, cols)
    width = max([len("output tok/s")] + [len(f"{x} / {reference(x, table)}") for x in rel]) + 2
    lines = ["output tok/s".ljust(width) + "".join(f"{c:>10}" for c in cols)]
    for label, row in table.items():
        lines.append(
            label.ljust(width)
            + "".join(f"{row[c]:>10.0f}" if c in row else f"{'-':>10}" for c in cols)
        )
    for label, row in rel.items():
        lines.append(
            f"{label} / {reference(label, table)}".ljust(width)
            + "".join(f"{row[c]:>10.2f}" if c in row else f"{'-':>10}" for c in cols)
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", action="append", required=True, help="LABEL=URL")
    parser.add_argument("--concurrency", default=DEFAULT_LEVELS)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests-per-level", type=int, default=8)
    parser.add_argument(
        "--rounds", type=int, default=2, help="requests per level: at least ROUNDS x concurrency"
    )
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--models", help="the tiny models' folder (prompts in their language)")
    parser.add_argument("--vocab", type=int, default=32000, help="random prompt ids < this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--results", type=Path, help="JSON file to merge runs into")
    parser.add_argument("--markdown", type=Path, help="write the table as Markdown here")
    args = parser.parse_args(argv)

    levels = [int(c) for c in args.concurrency.split(",")]
    results = json.loads(args.results.read_text()) if args.results and args.results.exists() else {}
    servers = []
    for spec in args.server:
        label, _, url = spec.partition("=")
        if not url:
            parser.error(f"--server wants LABEL=URL, got {spec!r}")
        servers.append((label, url.rstrip("/")))
    # warm-up, outside the measurement: every server once at the largest level, whose ramp
    # down passes every smaller batch size (first replays of CUDA graphs and kernels compiled
    # for new shapes made the first measured run of a level up to 6x slower than the next)
    top = max(levels)
    for _label, url in servers:
        run_level(url, top, argparse.Namespace(**{**vars(args), "requests_per_level": top}))
    for run in range(args.runs):
        for concurrency in levels:
            for label, url in servers:
                level = run_level(url, concurrency, args)
                results.setdefault(label, {}).setdefault(str(concurrency), []).append(level)
                tpv = level["tokens_per_verify"]
                print(
                    f"run {run} {label} c={concurrency}: {level['output_tok_s']:.0f} tok/s"
                    + (f", {tpv:.2f} tokens per verify" if tpv else ""),
                    file=sys.stderr,
                    flush=True,
                )
                if args.results:
                    args.results.write_text(json.dumps(results, indent=1))
    print(render(results, levels))
    if args.markdown:
        args.markdown.write_text(render(results, levels, markdown=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
