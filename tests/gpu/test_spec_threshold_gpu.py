"""GPU tier of ``--speculative-disable-batch-threshold``: a real SGLang server, end to end.

Needs an NVIDIA GPU and the patched pinned stack installed (``make wheels``: sglang 0.5.9 with
the series, sgl-kernel 0.3.21, flashinfer 0.6.3); skips otherwise. Run with ``make gpu-test``.

A tiny 8-layer DeepseekV3-style target and a one-layer ``LlamaForCausalLMEagle3`` draft are
launched with dummy weights (configs written here, no tokenizer: requests carry token ids). For
spec v1 and for spec v2 (``SGLANG_ENABLE_SPEC_V2=True``, overlap scheduler) the server runs with
threshold 8 and is swept at concurrency 4 -> 32 -> 4 at temperature 0. Checks: the server stays
healthy, every output equals the output of a server without speculation token for token, the
switch is logged both ways, and the KV pool is empty again once idle
(``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY=1`` also checks it while busy).

Environment knobs: ``PATCHKIT_GPU_ATTENTION_BACKEND`` (default ``triton``; SM120 has no FA3 /
trtllm_mla), ``PATCHKIT_GPU_SERVER_TIMEOUT`` (start-up seconds, default 600),
``PATCHKIT_GPU_TARGET_CONFIG`` / ``PATCHKIT_GPU_DRAFT_CONFIG`` (JSON objects merged into the
written configs, e.g. to change head dimensions for another attention backend).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

THRESHOLD = 8
SWEEP = (4, 32, 4)
MAX_NEW_TOKENS = 48
VOCAB = 1024
ATTENTION_BACKEND = os.environ.get("PATCHKIT_GPU_ATTENTION_BACKEND", "triton")
START_TIMEOUT = float(os.environ.get("PATCHKIT_GPU_SERVER_TIMEOUT", "600"))
TARGET_OVERRIDES = "PATCHKIT_GPU_TARGET_CONFIG"
DRAFT_OVERRIDES = "PATCHKIT_GPU_DRAFT_CONFIG"

TARGET_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 8,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": None,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 32,
    "v_head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "vocab_size": VOCAB,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
DRAFT_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "vocab_size": VOCAB,
    "draft_vocab_size": VOCAB,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def _gpu_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "GPU" in out


def _patched_sglang_present() -> str | None:
    """None when the patched stack is importable, else why not."""
    for module in ("sglang", "sgl_kernel", "flashinfer"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    probe = (
        "from sglang.srt.server_args import ServerArgs; "
        "import sys; "
        "sys.exit(0 if hasattr(ServerArgs, 'speculative_disable_batch_threshold') else 3)"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=600)
    if proc.returncode == 3:
        return "the installed sglang lacks the patch series (make wheels)"
    if proc.returncode != 0:
        return "sglang does not import: " + proc.stderr.decode(errors="replace")[-300:]
    return None


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    if not _gpu_present():
        pytest.skip("needs an NVIDIA GPU (nvidia-smi)")
    why = _patched_sglang_present()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("spec-threshold-models")
    target, draft = root / "target", root / "draft"
    target_config = {**TARGET_CONFIG, **json.loads(os.environ.get(TARGET_OVERRIDES, "{}"))}
    draft_config = {**DRAFT_CONFIG, **json.loads(os.environ.get(DRAFT_OVERRIDES, "{}"))}
    for path, config in ((target, target_config), (draft, draft_config)):
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config, indent=1))
        (path / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    return target, draft


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


def _post(url: str, payload: dict, timeout: float = 300.0) -> dict:
    request = urllib.request.Request(
        url, json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


class Server:
    def __init__(self, args: list[str], env: dict[str, str], log: Path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "sglang.launch_server", *args]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        self._out = open(log, "w")
        self.proc = subprocess.Popen(
            cmd, stdout=self._out, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )
        deadline = time.time() + START_TIMEOUT
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited: {self.tail()}")
            if _get(self.url + "/health_generate", timeout=30)[0] == 200:
                return
            time.sleep(2)
        self.stop()
        raise AssertionError(f"server did not start in {START_TIMEOUT:.0f}s: {self.tail()}")

    def tail(self, n: int = 4000) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")[-n:]

    def healthy(self) -> bool:
        return self.proc.poll() is None and _get(self.url + "/health")[0] == 200

    def generate(self, prompt: list[int]) -> list[int]:
        out = _post(
            self.url + "/generate",
            {
                "input_ids": prompt,
                "sampling_params": {
                    "temperature": 0,
                    "max_new_tokens": MAX_NEW_TOKENS,
                    "ignore_eos": True,
                },
            },
        )
        return out["output_ids"]

    def used_tokens(self) -> float:
        status, text = _get(self.url + "/metrics")
        assert status == 200, "metrics endpoint unavailable"
        values = re.findall(r"^sglang:num_used_tokens\{[^}]*\} ([0-9.e+]+)$", text, re.M)
        assert values, "sglang:num_used_tokens not exported"
        return sum(float(v) for v in values)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._out.close()


def _prompts(n: int, offset: int) -> list[list[int]]:
    # distinct, deterministic prompts of different lengths over the non-special ids
    return [
        [2 + (97 * (offset + i) + 31 * j) % (VOCAB - 2) for j in range(8 + (offset + i) % 13)]
        for i in range(n)
    ]


def _sweep(server: Server) -> list[list[int]]:
    outputs, offset = [], 0
    for concurrency in SWEEP:
        prompts = _prompts(concurrency, offset)
        offset += concurrency
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            outputs += list(pool.map(server.generate, prompts))
        assert server.healthy(), server.tail()
    return outputs


def _base_args(target: Path) -> list[str]:
    return [
        "--model-path", str(target),
        "--load-format", "dummy",
        "--skip-tokenizer-init",
        "--attention-backend", ATTENTION_BACKEND,
        "--max-running-requests", "64",
        "--cuda-graph-max-bs", "32",
        "--mem-fraction-static", "0.5",
        "--enable-metrics",
        "--random-seed", "0",
    ]  # fmt: skip


def _spec_args(draft: Path) -> list[str]:
    return [
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(draft),
        "--speculative-draft-load-format", "dummy",
        "--speculative-draft-attention-backend", ATTENTION_BACKEND,
        "--speculative-num-steps", "2",
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "3",
        "--speculative-disable-batch-threshold", str(THRESHOLD),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory) -> list[list[int]]:
    target, _ = models
    log = tmp_path_factory.mktemp("logs") / "no-spec.log"
    server = Server(_base_args(target), {}, log)
    try:
        return _sweep(server)
    finally:
        server.stop()


@pytest.mark.parametrize("spec_v2", [False, True], ids=["spec-v1", "spec-v2-overlap"])
def test_threshold_sweep_matches_no_spec(models, reference, spec_v2, tmp_path):
    target, draft = models
    env = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1"}
    if spec_v2:
        env["SGLANG_ENABLE_SPEC_V2"] = "True"
    server = Server(_base_args(target) + _spec_args(draft), env, tmp_path / "server.log")
    try:
        outputs = _sweep(server)
        for i, (got, want) in enumerate(zip(outputs, reference, strict=True)):
            assert got == want, f"request {i}: speculative output differs from no-spec"
        deadline = time.time() + 60
        while server.used_tokens() != 0 and time.time() < deadline:
            time.sleep(1)
        assert server.used_tokens() == 0, "KV pool not empty after the sweep"
        assert server.healthy(), server.tail()
        log = server.tail(10**7)
        assert re.search(r"Speculative decoding disabled: decode batch size \d+ > 8", log)
        assert re.search(r"Speculative decoding re-enabled: decode batch size \d+ <= 6", log)
        assert "Traceback" not in log
    finally:
        server.stop()
