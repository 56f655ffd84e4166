"""A CPU harness for the EAGLE workers' decode step with dynamic speculation disable.

What is real: the patched ``EAGLEWorker`` / ``EAGLEWorkerV2`` decode logic (the decision,
the step without drafts, the draft extend it runs), ``TpModelWorker.forward_batch_generation``,
``ForwardBatch``, ``ScheduleBatch`` / ``ModelWorkerBatch``, ``Req``, ``ReqToTokenPool``,
``TokenToKVPoolAllocator``, ``ChunkCache``, ``release_kv_cache``, ``FutureMap`` and the
scheduler's output processing and metrics mixins.

What stands in (SGLang's model runner and CUDA/Triton kernels cannot run on a CPU):

* ``TinyTarget`` / ``TinyDraft``: a tiny target and EAGLE-3-style draft in torch, behind a
  ``StandInModelRunner`` that plays ``ModelRunner.forward`` / ``sample``. Their KV lives in
  per-slot tensors addressed through the real ``req_to_token`` table, so a wrong or stale
  slot changes the tokens.
* The speculative steps below the threshold: ``draft()`` + ``verify()`` are replaced by a
  torch chain draft and a greedy verify with SGLang's bookkeeping (the originals launch
  ``sgl_kernel`` / Triton kernels). The draft extend that follows is the real one.
* Spec v2's ``prepare_for_decode`` over-allocation (a Triton kernel writes ``req_to_token``):
  the same arithmetic in torch, on the real allocator.
* Process-level state of a GPU server: a one-rank expert-parallel group (``ForwardBatch``
  asks its size) and a no-op ``Tensor.record_stream`` (a CUDA allocator hint).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
from pathlib import Path

import pytest
import torch

VOCAB = 40
HIDDEN = 16
STEPS = 2
NUM_DRAFT = STEPS + 1
POOL_TOKENS = 600
MAX_REQS = 16
CONTEXT = 96


class TinyTarget:
    """Stand-in target: one attention-like mixing over its own KV, aux = 3 x hidden."""

    def __init__(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(VOCAB, HIDDEN, generator=g, dtype=torch.float64)
        self.wk = torch.randn(HIDDEN, HIDDEN, generator=g, dtype=torch.float64) / 4
        self.wo = torch.randn(HIDDEN, VOCAB, generator=g, dtype=torch.float64)
        self.kv = torch.zeros(POOL_TOKENS + 1, HIDDEN, dtype=torch.float64)

    def token_kv(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.emb[tokens] @ self.wk)

    def hidden(self, token: int, context_kv: torch.Tensor) -> torch.Tensor:
        return self.emb[token] + 0.5 * context_kv.mean(dim=0)

    @staticmethod
    def aux(hidden: torch.Tensor) -> torch.Tensor:
        return torch.cat([hidden, torch.tanh(hidden), 0.5 * hidden], dim=-1)

    def run(self, input_ids, positions, out_cache_loc, rows, req_to_token):
        """Write the tokens' KV, then mix each token with the KV of positions 0..p."""
        input_ids = input_ids.to(torch.int64)
        self.kv[out_cache_loc.to(torch.int64)] = self.token_kv(input_ids)
        hidden = torch.stack(
            [
                self.hidden(
                    int(input_ids[t]),
                    self.kv[req_to_token[int(rows[t]), : int(positions[t]) + 1].long()],
                )
                for t in range(len(input_ids))
            ]
        )
        return hidden @ self.wo, self.aux(hidden)

    def greedy(self, prompt: list[int], num_tokens: int) -> list[int]:
        """Reference: dense greedy decoding with no KV pool at all."""
        tokens = list(prompt)
        kvs = [self.token_kv(torch.tensor(t)) for t in tokens]
        out = []
        for _ in range(num_tokens):
            hidden = self.hidden(tokens[-1], torch.stack(kvs))
            nxt = int(torch.argmax(hidden @ self.wo))
            out.append(nxt)
            tokens.append(nxt)
            kvs.append(self.token_kv(torch.tensor(nxt)))
        return out


class TinyDraft:
    """Stand-in EAGLE-3 draft: position p takes token p+1 and the target's aux state at p."""

    def __init__(self, target: TinyTarget, seed: int = 1):
        g = torch.Generator().manual_seed(seed)
        self.target = target
        self.fc = torch.randn(3 * HIDDEN, HIDDEN, generator=g, dtype=torch.float64) / 20
        self.wk = torch.randn(HIDDEN, HIDDEN, generator=g, dtype=torch.float64) / 4
        self.kv = torch.zeros(POOL_TOKENS + 1, HIDDEN, dtype=torch.float64)

    def mix_input(self, tokens: torch.Tensor, hidden_in: torch.Tensor) -> torch.Tensor:
        hidden_in = hidden_in.to(torch.float64)
        if hidden_in.shape[-1] == 3 * HIDDEN:
            hidden_in = hidden_in @ self.fc
        return self.target.emb[tokens.to(torch.int64)] + hidden_in

    def run(self, input_ids, hidden_in, positions, out_cache_loc, rows, req_to_token):
        x = self.mix_input(input_ids, hidden_in)
        self.kv[out_cache_loc.to(torch.int64)] = torch.tanh(x @ self.wk)
        hidden = torch.stack(
            [
                x[t]
                + 0.5
                * self.kv[req_to_token[int(rows[t]), : int(positions[t]) + 1].long()].mean(dim=0)
                for t in range(len(input_ids))
            ]
        )
        return hidden @ self.target.wo, hidden

    def chain_step(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """One draft decode step of the stand-in chain (no KV): next guessed token."""
        return torch.argmax(self.mix_input(tokens, hidden) @ self.target.wo, dim=-1)


class StandInAttnBackend:
    """Stands in for an attention backend: the tiny models need no metadata."""

    def __init__(self, name: str):
        self.name = name
        self.planned_modes: list[str] = []

    def init_forward_metadata(self, forward_batch):
        self.planned_modes.append(forward_batch.forward_mode.name)


class StandInModelRunner:
    """Plays ``ModelRunner.forward`` / ``sample`` with a tiny model on CPU."""

    def __init__(self, model, server_args, req_to_token_pool, is_draft: bool):
        self.model = model
        self.server_args = server_args
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = types.SimpleNamespace(name="stand-in KV pool")
        self.attn_backend = StandInAttnBackend("draft" if is_draft else "target")
        self.graph_runner = None
        self.device = "cpu"
        self.model_is_mrope = False
        self.is_draft = is_draft
        self.tp_group = None
        self.calls: list[dict] = []

    def _rows(self, fb) -> torch.Tensor:
        mode = fb.forward_mode
        if mode.is_decode():
            return fb.req_pool_indices
        if mode.is_target_verify():
            return torch.repeat_interleave(fb.req_pool_indices, NUM_DRAFT)
        lens = torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int64)
        return torch.repeat_interleave(fb.req_pool_indices, lens)

    def forward(self, fb, skip_attn_backend_init=False, pp_proxy_tensors=None):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        if not skip_attn_backend_init:
            fb.attn_backend.init_forward_metadata(fb)
        rows = self._rows(fb)
        req_to_token = self.req_to_token_pool.req_to_token
        self.calls.append(
            {
                "mode": fb.forward_mode.name,
                "attn_backend": fb.attn_backend.name,
                "input_ids": fb.input_ids.tolist(),
                "positions": fb.positions.tolist(),
                "out_cache_loc": fb.out_cache_loc.tolist(),
            }
        )
        if self.is_draft:
            logits, hidden = self.model.run(
                fb.input_ids, fb.spec_info.hidden_states, fb.positions,
                fb.out_cache_loc, rows, req_to_token,
            )  # fmt: skip
            if fb.forward_mode.is_draft_extend(include_v2=False):
                # v1 draft extend keeps the last token of every request (LAST capture)
                last = torch.cumsum(torch.tensor(fb.extend_seq_lens_cpu), dim=0) - 1
                logits, hidden = logits[last], hidden[last]
        else:
            logits, hidden = self.model.run(
                fb.input_ids, fb.positions, fb.out_cache_loc, rows, req_to_token
            )
        output = LogitsProcessorOutput(
            next_token_logits=logits.to(torch.float32),
            hidden_states=hidden.to(torch.float32),
        )
        return types.SimpleNamespace(
            logits_output=output, can_run_graph=False, expert_distribution_metrics=None
        )

    def sample(self, logits_output, forward_batch):
        assert forward_batch.sampling_info.is_all_greedy
        return torch.argmax(logits_output.next_token_logits, dim=-1)


def make_target_worker(runner, server_args):
    """The real ``TpModelWorker`` around a stand-in model runner."""
    from sglang.srt.managers.tp_worker import TpModelWorker

    worker = object.__new__(TpModelWorker)
    worker._model_runner = runner
    worker.server_args = server_args
    worker.hicache_layer_transfer_counter = None
    worker.dllm_algorithm = None
    worker.pp_group = types.SimpleNamespace(is_last_rank=True)
    worker.enable_overlap = not server_args.disable_overlap_schedule
    worker.enable_spec = True
    worker.device = "cpu"
    worker.model_config = types.SimpleNamespace(
        hidden_size=HIDDEN, dtype=torch.float32, vocab_size=VOCAB
    )
    return worker


def model_config_standin():
    return types.SimpleNamespace(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        dtype=torch.float32,
        is_encoder_decoder=False,
        is_multimodal=False,
        context_len=CONTEXT,
    )


def acceptance(candidates: torch.Tensor, target_predict: torch.Tensor) -> list[int]:
    """Greedy chain acceptance: drafts accepted while they equal the target's tokens."""
    accept = []
    for cand, pred in zip(candidates.tolist(), target_predict.tolist(), strict=True):
        n = 0
        while n < STEPS and cand[n + 1] == pred[n]:
            n += 1
        accept.append(n)
    return accept


def chain_draft_tokens(draft: TinyDraft, draft_input) -> torch.Tensor:
    """Stand-in for the draft's multi-step decode (topk 1): (bs, NUM_DRAFT) with the root first."""
    tokens = [draft_input.verified_id.to(torch.int64), draft_input.topk_index[:, 0]]
    hidden = draft_input.hidden_states
    for _ in range(STEPS - 1):
        nxt = draft.chain_step(tokens[-1], hidden)
        hidden = draft.mix_input(tokens[-1], hidden)
        tokens.append(nxt)
    return torch.stack(tokens, dim=1)


# --------------------------------------------------------------------------------------
# SGLang 0.5.12 line (a wheel base), for the speculation tests under torch 2.11
# --------------------------------------------------------------------------------------
SPEC_TREE_ENV = "PATCHKIT_SPEC_TREE"
PATCHES = Path(__file__).resolve().parents[2] / "patches"
STANDINS = Path(__file__).resolve().parent / "standins"


def _cache_root() -> Path:
    base = os.environ.get("PATCHKIT_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "patchkit") / "payload"


def _payload_tree_kind() -> str:
    kind = os.environ.get("PATCHKIT_PAYLOAD_TREE", "patched")
    if kind not in ("patched", "base"):
        raise pytest.UsageError(f"PATCHKIT_PAYLOAD_TREE must be 'patched' or 'base', not {kind!r}")
    return kind


def _put_first_on_path(directory: Path) -> None:
    path = str(directory)
    if path in sys.path:
        sys.path.remove(path)
    sys.path.insert(0, path)


LINE_WHEELS = {
    "0.5.12": (
        "sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl",
        "4ed786a38655851fd055ef57380c34d29b87753b53f63457309f51e5bf48c2e6",
    ),
}
LINE_TORCH = {"0.5.12": "2.11."}


def _line_wheel(line: str) -> Path:
    """The line's pinned sglang wheel from the package index, sha256-checked (cached)."""
    import hashlib
    import subprocess

    name, sha256 = LINE_WHEELS[line]
    wheels = _cache_root() / "wheels"
    wheel = wheels / name
    if not wheel.exists():
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.11", "--implementation", "cp",
             "--platform", "manylinux_2_34_x86_64", f"sglang=={line}", "-d", str(wheels)],
            check=True, capture_output=True,
        )  # fmt: skip
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != sha256:
        raise RuntimeError(f"{wheel}: sha256 {digest} is not the pinned {sha256}")
    return wheel


def line_series(line: str) -> list[Path]:
    series_dir = PATCHES / "sglang" / line
    names = [
        s.strip()
        for s in (series_dir / "series").read_text().splitlines()
        if s.strip() and not s.strip().startswith("#")
    ]
    return [series_dir / n for n in names]


def line_tree(line: str, patched: bool) -> Path:
    """Root (``<root>/python/sglang``) of the line's wheel base, with the line's series
    applied at zero fuzz when ``patched``; ``PATCHKIT_SPEC_TREE`` names a ready tree instead
    (the mutation check's planted copies). Cached under ``$PATCHKIT_CACHE/payload``."""
    import hashlib
    import shutil
    import subprocess
    import zipfile

    override = os.environ.get(SPEC_TREE_ENV)
    if override:
        return Path(override)
    patches = line_series(line) if patched else []
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in patches)).hexdigest()[:16]
    kind = "patched" if patched else "base"
    tree = _cache_root() / "trees" / f"sglang-{line}-wheel-{kind}-{digest}"
    if tree.exists():
        return tree
    wheel = _line_wheel(line)
    tmp = tree.with_name(f"{tree.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "python").mkdir(parents=True)
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.startswith("sglang/")]
        zf.extractall(tmp / "python", members)
    for patch in patches:
        run = subprocess.run(
            ["git", "apply", "--whitespace=nowarn", str(patch)],
            cwd=tmp, capture_output=True, text=True,
        )  # fmt: skip
        if run.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"{patch.name} does not apply to the {line} wheel: {run.stderr}")
    os.replace(tmp, tree)
    return tree


def use_line_tree(line: str) -> Path:
    """Put the line's tree first on ``sys.path`` (with the stand-ins); skip unless the
    running torch is the line's."""
    torch = pytest.importorskip("torch")
    if not torch.__version__.startswith(LINE_TORCH[line]):
        pytest.skip(f"the {line} line runs under torch {LINE_TORCH[line]}x")
    loaded = sys.modules.get("sglang")
    root = line_tree(line, _payload_tree_kind() == "patched")
    if loaded is not None and not str(loaded.__file__).startswith(str(root)):
        pytest.skip(f"another sglang tree is already imported: {loaded.__file__}")
    _put_first_on_path(STANDINS)
    _put_first_on_path(root / "python")
    return root


def default_server_args(server_args_module):
    """A real default ``ServerArgs`` (``__post_init__`` skipped: it probes GPUs and model
    files), installed as SGLang's global server args."""
    args = object.__new__(server_args_module.ServerArgs)
    for field in dataclasses.fields(server_args_module.ServerArgs):
        if field.default is not dataclasses.MISSING:
            setattr(args, field.name, field.default)
        elif field.default_factory is not dataclasses.MISSING:
            setattr(args, field.name, field.default_factory())
    args.model_path = "patchkit/payload-test-model"
    server_args_module.set_global_server_args_for_scheduler(args)
    return args
