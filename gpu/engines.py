"""SGLang servers of the GPU tier: the engine configurations, launch, requests, probe records.

Used by ``tests/gpu/test_spec_threshold_gpu.py``, ``bench/spec_threshold.py`` and
``gpu/session.py`` (stdlib only). One server per configuration serves both the tests and the
benchmark. Servers are ``python -m sglang.launch_server`` processes with CUDA graphs on;
requests carry token ids. Where the models carry a tokenizer (the tiny ones:
``language.save_tokenizer``) and xgrammar is installed, the servers load it and run the
xgrammar backend (``grammar`` requests); otherwise they skip the tokenizer and run no grammar
backend. Each one's output goes to ``<logs>/<label>.log``.

With ``probe=True`` the server runs with ``gpu/probe`` first on ``PYTHONPATH``: its
``sitecustomize`` records every model forward (draft or target, forward mode, batch size,
CUDA graph replayed or not) and every call of the scheduler's ``update_spec_metrics`` into
``<logs>/<label>.probe/`` (see ``gpu/probe/sitecustomize.py``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path

from language import GRAMMAR_REGEX

HERE = Path(__file__).resolve().parent
PROBE_DIR = HERE / "probe"

# Decode batches above THRESHOLD run without drafts; speculation resumes at <= REENABLE
# (the patch's default, int(0.75 * N)). 8: on the H200 with the tiny models EAGLE-3 stops
# paying between 4 and 16 concurrent requests (docs/spec-threshold.md).
THRESHOLD = 8
REENABLE = 6
CUDA_GRAPH_MAX_BS = 128
# one capture list for every configuration (fewer sizes than SGLang's defaults: faster start)
CUDA_GRAPH_BS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128]
# above CUDA_GRAPH_MAX_BS: the tier's widest phase runs eager decode steps as well
MAX_RUNNING = 160
REQUEST_KINDS = ("greedy", "logprob", "sampled", "grammar")
STEPS = 2  # EAGLE-3: 2 steps, topk 1, 3 draft tokens


def spec_flags(steps: int = STEPS) -> list[str]:
    return [
        "--speculative-algorithm", "EAGLE3",
        "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(steps + 1),
    ]  # fmt: skip


# Upstream's --speculative-adaptive (0.5.14+, spec v2, topk 1) picks the step count per decode
# batch: the batch size is padded to a CUDA-graph size and mapped to the largest key <= it.
# Its default config (0.5.17 adaptive_spec_params.DEFAULT_ADAPTIVE_CONFIG), candidate steps
# per slot; --speculative-num-steps must be in their union or 0.5.17 refuses to start, so
# the configurations on it run 3, what upstream picks when the flag is left out.
ADAPTIVE_DEFAULT_CONFIG = {1: [1, 3, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}
ADAPTIVE_STEPS = 3
# The threshold written as such a config (`threshold_adaptive_config`): 2 steps up to
# THRESHOLD, none from the graph size that THRESHOLD + 1 pads to (no hysteresis).
SKIP_ZERO_STEP_ENV = {"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1"}
# the threshold's steps without drafts run the full draft extend, not the draft's K/V alone
FULL_EXTEND_ENV = {"SGLANG_SPEC_ZERO_STEP_FULL_DRAFT_EXTEND": "1"}
DISABLED_RE = r"Speculative decoding disabled: decode batch size (\d+) > (\d+)"
REENABLED_RE = r"Speculative decoding re-enabled: decode batch size (\d+) <= (\d+)"


def graph_size_above(threshold: int, sizes: list[int] = CUDA_GRAPH_BS) -> int:
    """The CUDA-graph batch size that a decode batch of ``threshold + 1`` is padded to."""
    return next(bs for bs in sorted(sizes) if bs >= threshold + 1)


def threshold_adaptive_config(threshold: int = THRESHOLD) -> dict:
    """``--speculative-adaptive-config`` contents that act as the batch threshold."""
    return {
        "1": {"candidate_steps": [2]},
        str(graph_size_above(threshold)): {"candidate_steps": [0]},
    }


@dataclass(frozen=True)
class EngineConfig:
    label: str
    spec: bool = False
    spec_v2: bool = False
    threshold: int | None = None
    adaptive: bool = False  # upstream's --speculative-adaptive (0.5.14+)
    adaptive_config: dict | None = field(default=None, hash=False)  # None: upstream's default
    extra_env: tuple[tuple[str, str], ...] = ()
    steps: int = STEPS  # --speculative-num-steps (draft tokens: steps + 1, topk 1)

    def slot_config(self) -> dict[int, list[int]] | None:
        """Upstream adaptive mode's candidate steps per batch-size slot; None without it."""
        if not self.adaptive:
            return None
        if self.adaptive_config is None:
            return ADAPTIVE_DEFAULT_CONFIG
        return {int(k): v["candidate_steps"] for k, v in self.adaptive_config.items()}

    def hysteresis(self) -> tuple[int, int] | None:
        """(N, M) of --speculative-disable-batch-threshold: no drafts above N, drafts again
        at <= M; None without the flag."""
        return None if self.threshold is None else (self.threshold, REENABLE)

    def zero_step_draft(self, line: str) -> str:
        """What a step without drafts runs of the draft on ``line``: nothing (``skip``,
        upstream's switch), the draft's K/V of the new token alone (``kv``: the threshold
        from 0.5.17) or a draft extend (``extend``)."""
        env = dict(self.extra_env)
        if env.get("SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND") == "1":
            return "skip"
        if self.threshold is not None and line != "0.5.12" and not env.keys() & FULL_EXTEND_ENV:
            return "kv"
        return "extend"

    def args(self, models: Path, attention_backend: str) -> list[str]:
        renamed = graph_flags_renamed()
        grammar = grammar_backend(models)
        args = [
            "--model-path", str(models / "target"),
            *(["--skip-tokenizer-init"] if grammar == "none" else []),
            "--attention-backend", attention_backend,
            "--sampling-backend", "pytorch",
            "--grammar-backend", grammar,
            # 0.5.15 renamed the CUDA-graph options per phase (decode / prefill)
            "--cuda-graph-max-bs-decode" if renamed else "--cuda-graph-max-bs",
            str(CUDA_GRAPH_MAX_BS),
            "--cuda-graph-bs-decode" if renamed else "--cuda-graph-bs",
            *map(str, CUDA_GRAPH_BS),
            "--max-running-requests", str(MAX_RUNNING),
            "--mem-fraction-static", os.environ.get("PATCHKIT_GPU_MEM_FRACTION", "0.3"),
            "--max-total-tokens", "262144",
            "--random-seed", "0",
            "--log-level", "info",
            # tensor parallelism for the multi-GPU runs (the tiny models split 2 or 4 ways)
            "--tp-size", os.environ.get("PATCHKIT_GPU_TP", "1"),
        ]  # fmt: skip
        if not any((models / "target").glob("*.safetensors")):
            args += ["--load-format", "dummy"]  # gpu/large_models.py: configurations only
        # prefill graphs (piecewise, breakable from 0.5.15): their capture adds a minute per start
        if renamed:
            args += ["--cuda-graph-backend-prefill", "disabled"]
        elif _piecewise_by_default():
            args.append("--disable-piecewise-cuda-graph")
        if self.spec:
            args += spec_flags(self.steps)
            args += ["--speculative-draft-model-path", str(models / "draft")]
            args += ["--speculative-draft-attention-backend", attention_backend]
        if self.threshold is not None:
            args += ["--speculative-disable-batch-threshold", str(self.threshold)]
        if self.adaptive:
            args.append("--speculative-adaptive")
        if self.adaptive_config is not None:
            path = models / f"adaptive-{self.label.replace('+', '_')}.json"
            path.write_text(json.dumps(self.adaptive_config, indent=1) + "\n")
            args += ["--speculative-adaptive-config", str(path)]
        return args

    def env(self) -> dict[str, str]:
        env = dict(self.extra_env)
        if self.spec and not graph_flags_renamed():
            # 0.5.15+ always runs the v2 worker and warns about the variable
            env["SGLANG_ENABLE_SPEC_V2"] = "True" if self.spec_v2 else "False"
        return env


def skipping(config: EngineConfig) -> EngineConfig:
    """``config`` with its steps without drafts leaving the draft's KV behind (upstream's
    switch, measured against keeping it current): label ``<label>-skip``."""
    return replace(
        config, label=config.label + "-skip", extra_env=tuple(SKIP_ZERO_STEP_ENV.items())
    )


def full_extend(config: EngineConfig) -> EngineConfig:
    """``config`` with its steps without drafts running the full draft extend instead of the
    draft's K/V alone (what the K/V alone is measured against): label ``<label>-full``."""
    return replace(config, label=config.label + "-full", extra_env=tuple(FULL_EXTEND_ENV.items()))


_THRESHOLD_V2 = EngineConfig("eagle3-v2+threshold", spec=True, spec_v2=True, threshold=THRESHOLD)
# the 0.5.17 line: spec v2 only, upstream's adaptive step counts beside the threshold
_ADAPTIVE = EngineConfig(
    "eagle3-v2+adaptive", spec=True, spec_v2=True, adaptive=True, steps=ADAPTIVE_STEPS
)
CONFIGS = {
    c.label: c
    for c in (
        EngineConfig("baseline"),
        EngineConfig("eagle3-v1", spec=True),
        EngineConfig("eagle3-v2", spec=True, spec_v2=True),
        EngineConfig("eagle3-v1+threshold", spec=True, threshold=THRESHOLD),
        _THRESHOLD_V2,
        skipping(_THRESHOLD_V2),
        full_extend(_THRESHOLD_V2),
        _ADAPTIVE,
        skipping(_ADAPTIVE),
        EngineConfig(
            "eagle3-v2+threshold-config",
            spec=True,
            spec_v2=True,
            adaptive=True,
            adaptive_config=threshold_adaptive_config(),
        ),  # fmt: skip
    )
}
# The configurations each line runs (`line_labels`): 0.5.12 carries the threshold patch on
# its own path; 0.5.15+ has no spec-v1 worker, upstream's adaptive mode with steps 0, and the
# 0.5.17 line carries the threshold as a policy over that mode's runtime states.
LINE_LABELS = {
    "0.5.12": ["baseline", "eagle3-v1", "eagle3-v2", "eagle3-v1+threshold", "eagle3-v2+threshold"],
    "0.5.17": [
        "baseline", "eagle3-v2", "eagle3-v2+threshold", "eagle3-v2+adaptive",
        "eagle3-v2+adaptive-skip", "eagle3-v2+threshold-config", "eagle3-v2+threshold-skip",
        "eagle3-v2+threshold-full",
    ],
}  # fmt: skip
# What a step without drafts is (docs/gpu.md): its target forward mode, and whether the
# scheduler books it into the acceptance metrics. The threshold's steps without drafts are a
# plain DECODE forward on every line (0.5.12: its own path; 0.5.17: the zero-step state's
# DECODE graphs); upstream's adaptive zero-step state runs a one-token TARGET_VERIFY.
# 0.5.12 books nothing; from 0.5.17 process_batch_result_decode books every decode batch of
# a speculative server (bs rows, 0 correct drafts; per request, spec_verify_ct counts it).


def grammar_backend(models: Path) -> str:
    """``xgrammar`` where the models carry a tokenizer and xgrammar is installed, else
    ``none`` (the servers then skip the tokenizer: no grammar requests)."""
    has_tokenizer = (models / "target" / "tokenizer.json").is_file()
    return "xgrammar" if has_tokenizer and importlib.util.find_spec("xgrammar") else "none"


def nodraft_mode(label: str) -> str:
    return "DECODE" if CONFIGS[label].hysteresis() else "TARGET_VERIFY"


BOOKS_STEPS_WITHOUT_DRAFTS = {"0.5.12": False, "0.5.17": True}


def sglang_version() -> tuple[int, ...] | None:
    """The installed sglang's release as a tuple (local version dropped), None without one."""
    try:
        version = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None
    return tuple(int(x) for x in version.split("+")[0].split(".")[:3] if x.isdigit())


def installed_line(version: tuple[int, ...] | None = None) -> str:
    """The GPU tier's line of the installed sglang (0.5.12's without sglang)."""
    version = sglang_version() if version is None else version
    return "0.5.17" if version and version >= (0, 5, 15) else "0.5.12"


def line_labels(version: tuple[int, ...] | None = None) -> list[str]:
    """The configurations of the installed sglang's line (0.5.12's without sglang)."""
    return LINE_LABELS[installed_line(version)]


def graph_flags_renamed() -> bool:
    """0.5.15 renamed --cuda-graph-max-bs / --cuda-graph-bs per phase and replaced
    --disable-piecewise-cuda-graph with --cuda-graph-backend-prefill."""
    version = sglang_version()
    return bool(version) and version >= (0, 5, 15)


def _piecewise_by_default() -> bool:
    """0.5.12 captures piecewise (prefill) CUDA graphs by default, 0.5.9 does not."""
    version = sglang_version()
    return version is None or version >= (0, 5, 10)


def _free_port() -> int:
    """A free port below 45000: SGLang also binds port + 10000 (gRPC) and + more."""
    import random

    for _ in range(200):
        port = random.randrange(20000, 45000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-45000")


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


def http_post(url: str, payload: dict, timeout: float) -> dict:
    request = urllib.request.Request(
        url, json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def parse_probe_line(line: str) -> tuple | None:
    """One probe record: ('F', draft, mode, bs, graph, tokens per request or None),
    ('D', bs, steps), ('E', bs) or ('S', bs, correct drafts, draft tokens or None); None
    for anything else. Records of the 0.5.12 runs (F without tokens, S without the draft
    tokens) parse with None there."""
    parts = line.split()
    kind, n = (parts[0], len(parts)) if parts else ("", 0)
    if kind == "F" and n in (5, 6):
        tokens = int(parts[5]) if n == 6 and int(parts[5]) > 0 else None
        return ("F", parts[1] == "1", parts[2], int(parts[3]), parts[4] == "1", tokens)
    if kind == "S" and n in (3, 4):
        stride = int(parts[3]) if n == 4 and int(parts[3]) > 0 else None
        return ("S", int(parts[1]), int(parts[2]), stride)
    if kind == "D" and n == 3:
        return ("D", int(parts[1]), int(parts[2]))
    if kind in ("E", "K") and n == 2:
        return (kind, int(parts[1]))
    return None


@dataclass
class Server:
    """A launched (or, with ``url``, an already running) SGLang server."""

    config: EngineConfig
    log: Path
    url: str = ""
    proc: subprocess.Popen | None = None
    probe: Path | None = None
    started_s: float = 0.0
    pid: int | None = None  # of an attached server (its own process group)
    _out: object = field(default=None, repr=False)

    @classmethod
    def launch(
        cls, config: EngineConfig, models: Path, logs: Path, attention_backend: str, probe: bool
    ) -> Server:
        logs.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        log = logs / f"{config.label}.log"
        env = {**os.environ, **config.env(), "PYTHONUNBUFFERED": "1"}
        probe_dir = None
        if probe:
            probe_dir = logs / f"{config.label}.probe"
            probe_dir.mkdir(exist_ok=True)
            env["PATCHKIT_GPU_PROBE"] = str(probe_dir)
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(PROBE_DIR), env.get("PYTHONPATH", "")) if p
            )
        cmd = [sys.executable, "-m", "sglang.launch_server"]
        cmd += config.args(models, attention_backend)
        cmd += ["--host", "127.0.0.1", "--port", str(port)]
        out = open(log, "w")
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        server = cls(config, log, f"http://127.0.0.1:{port}", proc, probe_dir, time.time(), out)
        return server

    def serving_text(self) -> str:
        """The log from the moment the server was ready (start-up noise left out)."""
        text = self.text()
        mark = text.find("The server is fired up and ready to roll")
        return text[mark:] if mark >= 0 else text

    def text(self) -> str:
        if self._out is not None:
            self._out.flush()
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, n: int = 3000) -> str:
        return self.text()[-n:]

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def ready(self) -> bool:
        return http_get(self.url + "/health_generate", timeout=30)[0] == 200

    def wait_ready(self, timeout: float) -> float:
        """Seconds from launch to healthy; raises RuntimeError on exit or timeout."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.exited():
                raise RuntimeError(f"{self.config.label}: server exited: {self.tail()}")
            if self.ready():
                return time.time() - self.started_s
            time.sleep(2)
        raise RuntimeError(f"{self.config.label}: not healthy after {timeout:.0f}s: {self.tail()}")

    def healthy(self) -> bool:
        return not self.exited() and http_get(self.url + "/health")[0] == 200

    def generate(self, prompt: list[int], max_new_tokens: int, rid: str | None = None,
                 timeout: float = 300.0, kind: str = "greedy") -> dict:  # fmt: skip
        """One request of a REQUEST_KINDS kind: greedy; greedy with the logprob of each
        output token; sampled (temperature 0.8, top-p 0.95, a seed of its own); greedy under
        ``language.GRAMMAR_REGEX`` (a server with the xgrammar backend)."""
        payload = {
            "input_ids": prompt,
            "sampling_params": {
                "temperature": 0,
                "max_new_tokens": max_new_tokens,
                "ignore_eos": True,
            },
        }
        if kind == "logprob":
            payload |= {"return_logprob": True, "top_logprobs_num": 2}
        elif kind == "sampled":
            payload["sampling_params"] |= {"temperature": 0.8, "top_p": 0.95,
                                           "sampling_seed": sum(prompt) % 9973}  # fmt: skip
        elif kind == "grammar":
            payload["sampling_params"]["regex"] = GRAMMAR_REGEX
        elif kind != "greedy":
            raise ValueError(f"unknown request kind {kind!r}")
        if rid:
            payload["rid"] = rid
        return http_post(self.url + "/generate", payload, timeout)

    def loads(self) -> dict:
        status, text = http_get(self.url + "/v1/loads?include=core")
        if status != 200:
            raise RuntimeError(f"{self.config.label}: /v1/loads answered {status}")
        data = json.loads(text)
        loads = data.get("loads", data) if isinstance(data, dict) else data
        return loads[0] if isinstance(loads, list) else loads

    def server_info(self) -> dict:
        status, text = http_get(self.url + "/get_server_info")
        return json.loads(text) if status == 200 else {}

    def probe_events(self) -> list[tuple]:
        """All probe records so far, parsed (``parse_probe_line``; gpu/steps.py reads them)."""
        if self.probe is None:
            return []
        events = []
        for path in sorted(self.probe.glob("*.rec")):
            for line in path.read_text().splitlines():
                event = parse_probe_line(line)
                if event is not None:
                    events.append(event)
        return events

    def probe_flush(self, wait: float = 1.0) -> None:
        """Ask the probe to write out what it holds (it flushes every 0.2 s anyway)."""
        time.sleep(wait)

    def set_probe(self, on: bool) -> None:
        if self.probe is not None:
            flag = self.probe / "off"
            if on:
                flag.unlink(missing_ok=True)
            else:
                flag.write_text("")

    def stop(self) -> None:
        if self.proc is None and self.pid:
            for sig in (15, 9):
                try:
                    os.killpg(self.pid, sig)
                except ProcessLookupError:
                    break
                time.sleep(5)
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 15)
                self.proc.wait(timeout=30)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, 9)
                except ProcessLookupError:
                    pass
        if self._out is not None:
            self._out.close()
            self._out = None


def launch_all(
    labels: list[str],
    models: Path,
    logs: Path,
    attention_backend: str = "triton",
    probe: bool = True,
    timeout: float = 480.0,
    log=lambda msg: None,
) -> dict[str, Server]:
    """Start the servers together and wait until every one is healthy.

    Concurrent starts are safe here: each server's KV pool is capped by --max-total-tokens
    far below the share --mem-fraction-static leaves it, whatever the others allocate while
    it measures free memory. Raises RuntimeError (after stopping them all) when one does not
    come up in time.
    """
    servers: dict[str, Server] = {}
    deadline = time.time() + timeout
    try:
        for label in labels:
            server = Server.launch(CONFIGS[label], models, logs, attention_backend, probe)
            servers[label] = server
            log(f"launched {label} at {server.url}")
        for label, server in servers.items():
            took = server.wait_ready(max(1.0, deadline - time.time()))
            log(f"{label} ready in {took:.0f}s")
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


def save(servers: dict[str, Server], path: Path) -> None:
    """Write what ``load`` needs to reach (and stop) the servers from another process."""
    data = {
        label: {"url": s.url, "pid": s.proc.pid if s.proc else s.pid, "log": str(s.log)}
        for label, s in servers.items()
    }
    path.write_text(json.dumps(data, indent=1))


def load(path: Path) -> dict[str, Server]:
    servers = {}
    for label, item in json.loads(path.read_text()).items():
        log = Path(item["log"])
        probe = log.parent / f"{label}.probe"
        servers[label] = Server(
            CONFIGS[label], log, item["url"], None, probe if probe.is_dir() else None,
            pid=item["pid"],
        )  # fmt: skip
    return servers


def attach(spec: str, logs: Path) -> dict[str, Server]:
    """Servers started elsewhere: ``label=url[,label=url...]`` (logs and probes under logs)."""
    servers = {}
    for item in filter(None, spec.split(",")):
        label, _, url = item.partition("=")
        probe = logs / f"{label}.probe"
        servers[label] = Server(
            CONFIGS[label], logs / f"{label}.log", url.rstrip("/"), None,
            probe if probe.is_dir() else None,
        )  # fmt: skip
    return servers
