"""Output throughput of running SGLang servers over a concurrency sweep, as a table.

    python bench/spec_threshold.py --server baseline=http://127.0.0.1:30000 \
        [--server eagle3=http://127.0.0.1:30001] \
        [--server eagle3+threshold=http://127.0.0.1:30002] \
        [--concurrency 1,8,32,64,100,128] [--max-new-tokens 256] [--results runs.json]

Each ``--server LABEL=URL`` is a server already started by the caller (docs/spec-threshold.md
gives the three launch lines). At every concurrency level C the script keeps C requests in
flight (closed loop, ``--requests-per-level`` requests, at least 2*C) with random prompts of
``--input-len`` token ids, greedy, ``ignore_eos``, and reports output tokens per second over
the level's wall time. Results are merged into ``--results`` (JSON) so the servers can be
benchmarked one after another on the same GPUs; the table covers every label stored there.
The goal row checks EAGLE-3 + threshold >= max(baseline, EAGLE-3) at every concurrency.
Only the standard library is used.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DEFAULT_LEVELS = "1,8,32,64,100,128"
GOAL = ("eagle3+threshold", ("baseline", "eagle3"))


def _post(url: str, payload: dict, timeout: float) -> dict:
    request = urllib.request.Request(
        url, json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(100, vocab) for _ in range(length)]


def run_level(url: str, concurrency: int, args: argparse.Namespace) -> dict:
    """Closed-loop load at ``concurrency``; returns output tok/s and spec accept length."""
    total = max(args.requests_per_level, 2 * concurrency)
    rng = random.Random(args.seed + concurrency)
    prompts = [_prompt(rng, args.input_len, args.vocab) for _ in range(total)]
    lock = threading.Lock()
    tokens, accept = [0], []

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
            if "spec_accept_length" in meta:
                accept.append(float(meta["spec_accept_length"]))

    # warm-up: one request, outside the measurement
    one(prompts[0])
    tokens[0], accept[:] = 0, []
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, prompts))
    elapsed = time.perf_counter() - start
    return {
        "output_tok_s": tokens[0] / elapsed,
        "requests": total,
        "seconds": elapsed,
        "accept_length": sum(accept) / len(accept) if accept else None,
    }


def render(results: dict, levels: list[int]) -> str:
    labels = list(results)
    width = max([len("concurrency")] + [len(label) for label in labels]) + 2
    lines = ["output tok/s".ljust(width) + "".join(f"{c:>10}" for c in levels)]
    for label in labels:
        row = [results[label].get(str(c), {}).get("output_tok_s") for c in levels]
        lines.append(
            label.ljust(width) + "".join(f"{v:>10.1f}" if v else f"{'-':>10}" for v in row)
        )
    goal, others = GOAL
    if goal in results and all(o in results for o in others):
        verdict = []
        for c in levels:
            mine = results[goal].get(str(c), {}).get("output_tok_s")
            best = [results[o].get(str(c), {}).get("output_tok_s") for o in others]
            if mine is None or None in best:
                verdict.append("-")
            else:
                verdict.append("ok" if mine >= max(best) else f"{mine / max(best):.2f}x")
        lines.append("goal >= max".ljust(width) + "".join(f"{v:>10}" for v in verdict))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", action="append", required=True, help="LABEL=URL")
    parser.add_argument("--concurrency", default=DEFAULT_LEVELS)
    parser.add_argument("--requests-per-level", type=int, default=128)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000, help="prompt ids < this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--results", type=Path, help="JSON file to merge results into")
    args = parser.parse_args(argv)

    levels = [int(c) for c in args.concurrency.split(",")]
    results = json.loads(args.results.read_text()) if args.results and args.results.exists() else {}
    for spec in args.server:
        label, _, url = spec.partition("=")
        if not url:
            parser.error(f"--server wants LABEL=URL, got {spec!r}")
        url = url.rstrip("/")
        for concurrency in levels:
            level = run_level(url, concurrency, args)
            results.setdefault(label, {})[str(concurrency)] = level
            accept = level["accept_length"]
            print(
                f"{label} c={concurrency}: {level['output_tok_s']:.1f} tok/s"
                + (f", accept length {accept:.2f}" if accept else ""),
                file=sys.stderr,
            )
            if args.results:
                args.results.write_text(json.dumps(results, indent=1))
    print(render(results, levels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
