"""One GPU-tier session on a GPU host: train, start the servers once, test, benchmark.

    python gpu/session.py --out DIR [--labels baseline,eagle3-v1,...] [--no-tests]
                          [--no-bench] [--bench-runs 3] [--budget-s 540] [--keep-servers]
    python gpu/session.py --out DIR --attach [--no-tests] [--no-bench] [--stop]

Trains the tiny models (``gpu/train_models.py``) into ``DIR/models`` unless they are there,
launches one SGLang server per configuration (``gpu/engines.py``; the threshold
configurations only when the installed sglang has the flag), runs the GPU tests against
them (``pytest -m gpu tests/gpu/test_spec_threshold_gpu.py``), then the throughput benchmark
(``bench/spec_threshold.py``, probe off), and stops the servers.

A host that limits one command's run time can split the session: ``--keep-servers`` leaves
the servers running (each in its own process session) and lists them in
``DIR/servers.json``; a later ``--attach`` run uses them, and ``--stop`` stops them at its
end. Everything goes under ``DIR``: ``session.log``, ``pytest.log``, ``bench.json``,
``bench.md``, ``logs/`` (server logs, probe records, what each ramp saw). Each step is bounded
by what is left of ``--budget-s``; the exit status is pytest's (2: training failed, 3: the
servers did not start).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "gpu"))

import engines  # noqa: E402

HAS_FLAG = (
    "import dataclasses, sys; from sglang.srt.server_args import ServerArgs; "
    "sys.exit(0 if 'speculative_disable_batch_threshold' in "
    "{f.name for f in dataclasses.fields(ServerArgs)} else 3)"
)


def profile(
    server: engines.Server, dest: Path, prompts: list[list[int]], steps: int = 200,
    concurrency: int = 128,
) -> str:  # fmt: skip
    """Step times and a cProfile of the server's scheduler thread under a closed-loop load
    of ``concurrency`` requests (``gpu/probe/sitecustomize.py``): ``steps`` target forwards
    of batch size >= 90% of ``concurrency`` timed, then ``steps`` profiled."""
    if server.probe is None:
        return "no probe"
    before = set(server.probe.glob("*.prof.txt"))
    stop = threading.Event()

    def worker(i: int) -> None:
        while not stop.is_set():
            try:
                server.generate(prompts[i % len(prompts)], 140, timeout=120)
            except OSError:
                return

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    (server.probe / "profile").write_text(f"{steps} {int(0.9 * concurrency)}\n")
    deadline = time.time() + 90
    found = None
    while time.time() < deadline and found is None:
        time.sleep(0.5)
        found = next(iter(set(server.probe.glob("*.prof.txt")) - before), None)
    stop.set()
    for thread in threads:
        thread.join(timeout=130)
    if found is None:
        return "no profile within 90 s"
    time.sleep(0.5)
    dest.write_text(found.read_text())
    return dest.read_text().splitlines()[0]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--labels", default=None, help="default: the installed sglang line's configurations"
    )
    parser.add_argument("--no-tests", action="store_true")
    parser.add_argument("--no-bench", action="store_true")
    parser.add_argument("--bench-runs", type=int, default=3)
    parser.add_argument("--bench-concurrency", default="1,4,16,32,64,128")
    parser.add_argument("--bench-rounds", type=int, default=2, help="bench/spec_threshold --rounds")
    parser.add_argument("--budget-s", type=float, default=540.0)
    parser.add_argument("--attention-backend", default="triton")
    parser.add_argument("--keep-servers", action="store_true")
    parser.add_argument("--attach", action="store_true", help="use DIR/servers.json")
    parser.add_argument(
        "--large", action="store_true",
        help="the larger dummy-weight models of gpu/large_models.py instead of the tiny ones",
    )  # fmt: skip
    parser.add_argument(
        "--large-layers", type=int, default=None, help="with --large: the target's layers"
    )
    parser.add_argument(
        "--profile", default="", help="labels to profile at C=128 after the benchmark"
    )
    parser.add_argument("--stop", action="store_true", help="with --attach: stop them at the end")
    return parser


class Session:
    """The steps of one session, each bounded by what is left of ``--budget-s``."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.t0 = args, time.time()
        args.out.mkdir(parents=True, exist_ok=True)
        self.session_log = open(args.out / "session.log", "a")
        self.models, self.logs = args.out / "models", args.out / "logs"

    def log(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        self.session_log.write(line + "\n")
        self.session_log.flush()

    def left(self) -> float:
        return self.args.budget_s - (time.time() - self.t0)

    def profiled(self, labels) -> list[str]:
        return [label for label in self.args.profile.split(",") if label in labels]

    def attach(self) -> dict[str, engines.Server] | int:
        servers = engines.load(self.args.out / "servers.json")
        down = [label for label, s in servers.items() if not s.healthy()]
        if down:
            self.log(f"attached servers not healthy: {down}")
            return 3
        return servers

    def prepare_models(self) -> int:
        """The larger models' configurations, or the tiny models trained unless they are
        there; 2 when training left none."""
        args, models = self.args, self.models
        if args.large:
            import large_models

            large_models.write(models, layers=args.large_layers)
            layers = args.large_layers or large_models.TARGET_CONFIG["num_hidden_layers"]
            self.log(
                f"large model configurations (dummy weights, target layers {layers}) in {models}"
            )
        elif not (models / "target" / "model.safetensors").exists():
            self.log("training the tiny models")
            train = subprocess.run(
                [sys.executable, str(ROOT / "gpu" / "train_models.py"), "--out", str(models)],
                stdout=self.session_log, stderr=subprocess.STDOUT,
                timeout=max(60.0, self.left() - 200),
            )  # fmt: skip
            self.log(f"training exit {train.returncode}")
            if not (models / "target" / "model.safetensors").exists():
                return 2
        return 0

    def labels(self) -> list[str]:
        """The configurations to start: the threshold's only where sglang has the flag."""
        given = self.args.labels or ",".join(engines.line_labels())
        labels = [label for label in given.split(",") if label]
        patched = [label for label in labels if engines.CONFIGS[label].threshold is not None]
        if not patched:
            return labels
        flag = subprocess.run(
            [sys.executable, "-c", HAS_FLAG], capture_output=True, text=True, timeout=300
        )
        if flag.returncode == 0:
            return labels
        self.log(f"sglang lacks --speculative-disable-batch-threshold: not starting {patched}")
        if flag.returncode != 3:
            self.log(flag.stderr[-2000:])
        return [label for label in labels if label not in patched]

    def start(self) -> dict[str, engines.Server] | int:
        status = self.prepare_models()
        if status:
            return status
        args, labels = self.args, self.labels()
        # what the servers leave the session: the tests and the benchmark, or the profiles alone
        reserve = 120
        if args.no_tests and args.no_bench:
            reserve = 20 + 40 * len(self.profiled(labels))
        try:
            servers = engines.launch_all(
                labels, self.models, self.logs, args.attention_backend, probe=True,
                timeout=max(60.0, self.left() - reserve), log=self.log,
            )  # fmt: skip
        except RuntimeError as error:
            self.log(f"servers did not start: {error}")
            return 3
        engines.save(servers, args.out / "servers.json")
        return servers

    def test(self, env: dict[str, str]) -> int:
        self.log(f"pytest against {env['PATCHKIT_GPU_SERVERS']}")
        reserve = 20 if self.args.no_bench else 120
        with open(self.args.out / "pytest.log", "w") as out:
            try:
                status = subprocess.run(
                    [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider",
                     "-v", "-rA", "tests/gpu/test_spec_threshold_gpu.py"],
                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                    timeout=max(30.0, self.left() - reserve),
                ).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                status = 124
        self.log(f"pytest exit {status}")
        return status

    def bench(self, servers: dict[str, engines.Server], env: dict[str, str]) -> None:
        """The benchmark, probe off; it leaves the profiles after it about 40 s each."""
        args = self.args
        for server in servers.values():
            server.set_probe(False)
        self.log("benchmark")
        cmd = [sys.executable, str(ROOT / "bench" / "spec_threshold.py"),
               "--results", str(args.out / "bench.json"),
               "--markdown", str(args.out / "bench.md"),
               "--models", str(self.models),
               "--concurrency", args.bench_concurrency,
               "--runs", str(args.bench_runs),
               "--rounds", str(args.bench_rounds)]  # fmt: skip
        for label, server in servers.items():
            cmd += ["--server", f"{label}={server.url}"]
        try:
            bench = subprocess.run(
                cmd, cwd=ROOT, env=env, stdout=self.session_log, stderr=subprocess.STDOUT,
                timeout=max(30.0, self.left() - 15 - 40 * len(self.profiled(servers))),
            )  # fmt: skip
            self.log(f"bench exit {bench.returncode}")
        except subprocess.TimeoutExpired:
            self.log("bench ran out of time (the runs done so far are in bench.json)")

    def profile_all(self, servers: dict[str, engines.Server]) -> None:
        from language import ChainLanguage

        labels = self.profiled(servers)
        if labels:
            lang = ChainLanguage.load(self.models / "language.json")
            prompts = [lang.prompt(seed, 16) for seed in range(128)]
        for label in labels:
            if self.left() < 35:
                self.log(f"no time left to profile {label}")
                break
            dest = self.args.out / f"profile-{label}.txt"
            self.log(f"profile {label}: {profile(servers[label], dest, prompts)}")

    def run(self, servers: dict[str, engines.Server]) -> int:
        args, status = self.args, 0
        try:
            env = {
                **os.environ,
                "PATCHKIT_GPU_SERVERS": ",".join(f"{la}={s.url}" for la, s in servers.items()),
                "PATCHKIT_GPU_MODELS": str(self.models),
                "PATCHKIT_GPU_LOGS": str(self.logs),
                "PYTHONUNBUFFERED": "1",
            }
            if not args.no_tests:
                status = self.test(env)
            if not args.no_bench:
                self.bench(servers, env)
            self.profile_all(servers)
        finally:
            if args.stop or not (args.keep_servers or args.attach):
                for server in servers.values():
                    server.stop()
                self.log("servers stopped")
            else:
                self.log(f"servers left running: {args.out / 'servers.json'}")
        return status


def main(argv: list[str] | None = None) -> int:
    session = Session(_parser().parse_args(argv))
    servers = session.attach() if session.args.attach else session.start()
    return servers if isinstance(servers, int) else session.run(servers)


if __name__ == "__main__":
    sys.exit(main())
