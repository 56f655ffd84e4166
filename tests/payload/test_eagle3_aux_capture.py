"""EAGLE-3 aux hidden-state capture.

eagle3-aux-capture-post-allreduce.patch (both lines): captured states are the TP-reduced sums
even when the previous layer deferred its all-reduce to the next layer's fused all-reduce +
RMSNorm, in every model that captures in front of a layer and defers: DeepSeek-V2/V3 (Kimi-K2.5's
language model, GLM-4 MoE Lite), GLM-4 MoE, GPT-OSS and Bailing MoE.
eagle3-aux-capture-before-cuda-graphs.patch (0.5.9 line; upstream from 0.5.11): the draft's
configured layer ids are selected before CUDA graphs are captured, and graph capture / warm-up
no longer reset them to defaults.
"""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import pytest
import torch
from tiny_models import NUM_LAYERS, tiny_deepseek_v3
from torch import nn

pytestmark = pytest.mark.payload

HIDDEN = 16
VOCAB = 32
TP = 2
CAPTURE = [1, 3, 5]  # draft ids; the model captures in front of layers 2, 4, 6

# The decoder models whose forward() captures ``hidden_states + residual`` in front of a layer
# while the previous layer may have deferred its all-reduce to the fused one: module, class.
CAPTURING_MODELS = {
    "deepseek_v2": ("sglang.srt.models.deepseek_v2", "DeepseekV2Model"),
    "glm4_moe": ("sglang.srt.models.glm4_moe", "Glm4MoeModel"),
    "gpt_oss": ("sglang.srt.models.gpt_oss", "GptOssModel"),
    "bailing_moe": ("sglang.srt.models.bailing_moe", "BailingMoEModel"),
}
BEFORE_GRAPHS = pytest.mark.sglang_lines("0.5.9")  # upstream from 0.5.11 (sgl-project/sglang#22836)
# The lines whose patch carries each model's capture fix: DeepSeek-V2/V3 captures after the
# all-reduce upstream from 0.5.14 (sgl-project/sglang#28343), the others from 0.5.21 (their
# decoder layers capture the aux state themselves).
CARRIED_ON = {
    "deepseek_v2": ("0.5.9",),
    "glm4_moe": ("0.5.9", "0.5.17"),
    "gpt_oss": ("0.5.9", "0.5.17"),
    "bailing_moe": ("0.5.9", "0.5.17"),
}


def _capturing_model_params() -> list[str]:
    """The models whose fix the line under test carries (others are not collected)."""
    line = os.environ.get("PATCHKIT_PAYLOAD_LINE") or "0.5.9"  # the payload conftest's default
    return [name for name in sorted(CAPTURING_MODELS) if line in CARRIED_ON[name]]


class ThreadGroup:
    """A TP group of ranks run as threads: ``all_reduce`` sums every rank's tensor.

    Stands in for the NCCL/custom all-reduce (infrastructure, not the code under test) and
    counts the calls of each rank.  Like ``GroupCoordinator.all_reduce`` it either returns a new
    tensor (the custom / symm-mem all-reduces) or, ``in_place``, writes the sum into its input
    and returns that same tensor object, attributes included (the NCCL path).
    """

    def __init__(self, size: int, in_place: bool = False):
        self.size = size
        self.in_place = in_place
        self.local = threading.local()
        self.barrier = threading.Barrier(size)
        self.slots: list[torch.Tensor | None] = [None] * size
        self.calls = [0] * size

    @property
    def rank(self) -> int:
        return self.local.rank

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self.calls[self.rank] += 1
        self.slots[self.rank] = x.clone()
        self.barrier.wait()
        total = torch.stack(self.slots).sum(0)
        self.barrier.wait()
        return x.copy_(total) if self.in_place else total

    def run(self, fn):
        results: list = [None] * self.size
        errors: list = []

        def body(rank: int) -> None:
            self.local.rank = rank
            try:
                results[rank] = fn(rank)
            except BaseException as exc:  # re-raised in the main thread
                errors.append(exc)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        if errors:
            raise errors[0]
        return results


class ShardedDecoderLayer(nn.Module):
    """Stands in for ``DeepseekV2DecoderLayer`` on one TP rank (the layer is not under test).

    It keeps the layer's communication contract: a hidden state flagged
    ``_sglang_needs_allreduce_fusion`` is a partial sum that the input side all-reduces
    (LayerCommunicator.prepare_attn's fused path) before adding the residual; the MLP output is
    this rank's partial sum, either all-reduced here or, with fusion, flagged for the next layer.
    """

    def __init__(self, layer_id: int, rank: int, group: ThreadGroup, fuse_next: bool):
        super().__init__()
        self.layer_id, self.rank, self.group, self.fuse_next = layer_id, rank, group, fuse_next

    def forward(self, positions, hidden_states, forward_batch, residual, *args, **kwargs):
        out = self._forward(hidden_states, residual)
        # DeepSeek-V2 layers of 0.5.12 also hand on their top-k indices.
        return (*out, None) if "prev_topk_indices" in kwargs else out

    def _forward(self, hidden_states, residual):
        if residual is None:
            residual = hidden_states
        else:
            if getattr(hidden_states, "_sglang_needs_allreduce_fusion", False):
                hidden_states = self.group.all_reduce(hidden_states)
            residual = hidden_states + residual
        partial = torch.tanh(residual) * (0.5 + 0.1 * self.layer_id + 0.3 * self.rank)
        if self.fuse_next:
            partial._sglang_needs_allreduce_fusion = True
            return partial, residual
        return self.group.all_reduce(partial), residual


def tiny_capturing_model(name: str, rank: int, group: ThreadGroup, fused: bool):
    """The real ``forward`` of model ``name`` over tiny sharded layers (built without weights)."""
    import importlib

    from sglang.srt.layers.layernorm import RMSNorm

    module, cls = CAPTURING_MODELS[name]
    model = object.__new__(getattr(importlib.import_module(module), cls))
    nn.Module.__init__(model)
    # Same embedding on every rank (ranks are threads: no shared global RNG).
    embedding = nn.Embedding.from_pretrained(
        torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(0))
    )
    model.embed_tokens = embedding
    model.word_embeddings = embedding  # Bailing MoE's name for it
    model.layers = nn.ModuleList(
        ShardedDecoderLayer(i, rank, group, fuse_next=fused and i < NUM_LAYERS - 1)
        for i in range(NUM_LAYERS)
    )
    model.norm = RMSNorm(HIDDEN)
    model.pp_group = SimpleNamespace(is_first_rank=True, is_last_rank=True)
    model.start_layer, model.end_layer = 0, NUM_LAYERS
    model.first_k_dense_replace = 1
    model.enable_a2a_moe = False
    model.llama_4_scaling_config = None
    model.layers_to_capture = [i + 1 for i in CAPTURE]
    return model


def _forward_all_ranks(name: str, fused: bool, monkeypatch, in_place: bool = False):
    import importlib

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    group = ThreadGroup(TP, in_place)
    module = importlib.import_module(CAPTURING_MODELS[name][0])
    monkeypatch.setattr(module, "tensor_model_parallel_all_reduce", group.all_reduce)
    batch = SimpleNamespace(
        can_run_tbo=False,
        nsa_cp_metadata=None,
        attn_cp_metadata=None,  # 0.5.12 (context parallel)
        forward_mode=ForwardMode.DECODE,
    )
    input_ids = torch.tensor([3, 7, 11])
    positions = torch.arange(3)

    def rank_forward(rank: int):
        model = tiny_capturing_model(name, rank, group, fused)
        with torch.no_grad():
            return model(input_ids, positions, batch)

    return group, group.run(rank_forward)


@pytest.mark.parametrize("all_reduce", ["out_of_place", "in_place"])
@pytest.mark.sglang_lines(*sorted({line for lines in CARRIED_ON.values() for line in lines}))
@pytest.mark.parametrize("model", _capturing_model_params())
def test_aux_capture_is_post_reduce(sglang_tree, server_args, monkeypatch, model, all_reduce):
    in_place = all_reduce == "in_place"
    _, unfused = _forward_all_ranks(model, False, monkeypatch, in_place)
    group, fused = _forward_all_ranks(model, True, monkeypatch, in_place)

    for rank in range(TP):
        hidden, aux = fused[rank]
        ref_hidden, ref_aux = unfused[rank]
        assert len(aux) == len(CAPTURE)
        for got, want in zip(aux, ref_aux, strict=True):
            torch.testing.assert_close(got, want, msg="aux state is a per-rank partial sum")
        torch.testing.assert_close(hidden, ref_hidden)
    # Every layer's MLP output is reduced exactly once, fused, captured or not.
    assert group.calls == [NUM_LAYERS] * TP


def aux_recording_runner(monkeypatch):
    """A ``ModelRunner`` object (no ``__init__``) for a DeepSeek-V3 target and an EAGLE-3 draft."""
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    runner = object.__new__(ModelRunner)
    runner.model = tiny_deepseek_v3(monkeypatch)
    runner.spec_algorithm = SpeculativeAlgorithm.EAGLE3
    runner.is_draft_worker = False
    runner.eagle_use_aux_hidden_state = True
    runner.eagle_aux_hidden_state_layer_ids = list(CAPTURE)
    runner.device = "cpu"
    runner.model_config = SimpleNamespace(
        is_encoder_decoder=False, hidden_size=HIDDEN, vocab_size=VOCAB, dtype=torch.float32
    )
    return runner


def configured_layers() -> list[int]:
    return [i + 1 for i in CAPTURE]


@BEFORE_GRAPHS
def test_aux_layers_selected_by_model_runner(sglang_tree, server_args, monkeypatch):
    runner = aux_recording_runner(monkeypatch)

    runner.init_aux_hidden_state_capture()

    assert runner.model.model.layers_to_capture == configured_layers()
    assert runner.model.capture_aux_hidden_states is True


class _Captured(Exception):
    """Raised by the stand-in graph capture to stop once the layer choice is observable."""


@BEFORE_GRAPHS
def test_cuda_graph_capture_keeps_configured_aux_layers(sglang_tree, server_args, monkeypatch):
    from sglang.srt.model_executor import cuda_graph_runner

    runner = aux_recording_runner(monkeypatch)
    runner.model.set_eagle3_layers_to_capture(runner.eagle_aux_hidden_state_layer_ids)
    monkeypatch.setattr(server_args, "speculative_algorithm", "EAGLE3")
    monkeypatch.setattr(server_args, "speculative_num_draft_tokens", 4)
    runner.server_args = server_args
    runner.attn_backend = SimpleNamespace(
        init_cuda_graph_state=lambda max_bs, max_num_token: None,
        get_cuda_graph_seq_len_fill_value=lambda: 1,
    )
    seen = {}

    def capture(self):
        seen["layers"] = list(self.model_runner.model.model.layers_to_capture)
        raise _Captured

    # Parallel groups, buffer allocation and the capture itself need CUDA; stand in for them.
    monkeypatch.setattr(cuda_graph_runner, "get_attention_tp_size", lambda: 1)
    monkeypatch.setattr(cuda_graph_runner, "get_attention_tp_rank", lambda: 0)
    monkeypatch.setattr(cuda_graph_runner, "get_batch_sizes_to_capture", lambda mr, n: ([1], []))
    monkeypatch.setattr(cuda_graph_runner.GraphInputBuffers, "create", lambda **kw: None)
    monkeypatch.setattr(cuda_graph_runner.CudaGraphRunner, "capture", capture)

    with pytest.raises(_Captured):
        cuda_graph_runner.CudaGraphRunner(runner)

    assert seen["layers"] == configured_layers(), "graphs captured the default aux layers"


@BEFORE_GRAPHS
def test_dummy_run_keeps_configured_aux_layers(sglang_tree, server_args, monkeypatch):
    from sglang.srt.model_executor import model_runner

    runner = aux_recording_runner(monkeypatch)
    runner.model.set_eagle3_layers_to_capture(runner.eagle_aux_hidden_state_layer_ids)
    monkeypatch.setattr(server_args, "speculative_num_draft_tokens", 4)
    runner.server_args = server_args
    runner.is_generation = True
    runner.attn_backend = SimpleNamespace(get_cuda_graph_seq_len_fill_value=lambda: 1)

    def stop(**kwargs):
        raise _Captured

    # The warm-up forward itself needs CUDA; stop where its buffers would be allocated.
    monkeypatch.setattr(model_runner.GraphInputBuffers, "create", stop)

    with pytest.raises(_Captured):
        runner._dummy_run(batch_size=1)

    assert runner.model.model.layers_to_capture == configured_layers()


@BEFORE_GRAPHS
def test_initialize_selects_aux_layers_before_graph_capture(sglang_tree, server_args, monkeypatch):
    """``ModelRunner.initialize()``: warm-up and graph capture see the configured aux layers."""
    from sglang.srt.model_executor import model_runner

    runner = aux_recording_runner(monkeypatch)
    runner.server_args = server_args
    runner.device = "cuda"
    runner.is_draft_worker = True  # skips expert-location set-up, which needs a real model
    runner.tp_size = runner.dp_size = 1
    runner.model_config = SimpleNamespace(
        num_nextn_predict_layers=None,
        num_hidden_layers=NUM_LAYERS,
        num_attention_layers=NUM_LAYERS,
        hf_config=SimpleNamespace(architectures=["DeepseekV3ForCausalLM"]),
    )
    model = runner.model
    seen: dict[str, list[int]] = {}

    def step(name, effect=None):
        def record(*args, **kwargs):
            seen[name] = list(model.model.layers_to_capture)
            if effect is not None:
                effect()

        return record

    def memory_pool():
        runner.max_total_num_tokens = 64
        runner.req_to_token_pool = SimpleNamespace(size=8)

    # Everything around the ordering needs a GPU and a real checkpoint; record instead.
    monkeypatch.setattr(model_runner.TorchMemorySaverAdapter, "create", lambda **kw: None)
    monkeypatch.setattr(model_runner, "ExpertLocationUpdater", lambda: None)
    monkeypatch.setattr(model_runner, "create_sampler", lambda: None)
    monkeypatch.setattr(model_runner, "apply_torchao_config_to_model", lambda *a, **kw: None)
    runner.load_model = step("load_model")
    runner.configure_kv_cache_dtype = step("configure_kv_cache_dtype")
    runner.init_memory_pool = step("init_memory_pool", memory_pool)
    for name in (
        "init_routed_experts_capturer",
        "init_cublas",
        "init_attention_backend",
        "kernel_warmup",
        "init_device_graphs",
        "init_piecewise_cuda_graphs",
        "prealloc_symmetric_memory_pool",
    ):
        setattr(runner, name, step(name))

    runner.initialize(min_per_gpu_memory=0.0)

    assert seen["kernel_warmup"] == configured_layers()
    assert seen["init_device_graphs"] == configured_layers(), "graphs captured before selection"
    assert model.model.layers_to_capture == configured_layers()
