"""sm120-flashinfer-allreduce-fusion.patch: the fusion gate on SM120, the RMSNorm fallback."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import sys
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.payload

HIDDEN = 64
TOKENS = 5
EPS = 1e-6


# The all-reduce when the fused op declines is upstream from 0.5.21: not carried on 0.5.23.
FALLBACK_FIX = pytest.mark.sglang_lines("0.5.9", "0.5.17")

# The per-batch gate: layers/communicator.py up to 0.5.20, then the residual add + norm of the
# layer boundary (0.5.21 moved it and renamed it).
GATES = (
    ("sglang.srt.layers.communicator", "apply_flashinfer_allreduce_fusion"),
    ("sglang.srt.layers.layer_boundary.residual.add_norm", "flashinfer_ar_fusion_applies"),
)


def _clear_capability_caches() -> None:
    from sglang.srt.utils import common

    for name in ("is_cuda", "is_sm90_supported", "is_sm100_supported", "is_sm120_supported"):
        getattr(common, name).cache_clear()


def _gate_seen_by(major: int, monkeypatch: pytest.MonkeyPatch):
    """The per-batch fusion gate of a private copy of its module (``GATES``) executed as on a
    GPU of capability ``major``, and the module.

    The module computes its ``_is_sm*_supported`` flags at import, so the copy is executed with
    torch's device queries spoofed (CUDA 13.0, capability ``major``.0); the imported module
    itself is left alone.
    """
    module_name, gate = next(g for g in GATES if importlib.util.find_spec(g[0]) is not None)
    real = importlib.import_module(module_name)
    with _capability(major, monkeypatch):
        name = f"_patchkit_gate_sm{major}"
        try:
            spec = importlib.util.spec_from_file_location(name, real.__file__)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        finally:
            sys.modules.pop(name, None)
    # FlashInfer's presence is not what the gate test is about.
    module._is_flashinfer_available = True
    return getattr(module, gate), module


def _request_fusion(server_args, monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """Ask for the fusion as a user does on the line under test: 0.5.17 and later choose a
    backend (``--flashinfer-allreduce-fusion-backend``, read from the published runtime
    configuration), earlier lines set ``--enable-flashinfer-allreduce-fusion``."""
    if hasattr(type(server_args), "__struct_fields__"):  # 0.5.23: resolved, read-only
        from sglang.srt.runtime_context import get_context

        backend = "auto" if on else None
        get_context().override("payload-test", flashinfer_allreduce_fusion_backend=backend)
    elif hasattr(server_args, "flashinfer_allreduce_fusion_backend"):
        monkeypatch.setattr(
            server_args, "flashinfer_allreduce_fusion_backend", "auto" if on else None
        )
        from sglang.srt import server_args as server_args_module

        server_args_module.set_global_server_args_for_scheduler(server_args)
    else:
        monkeypatch.setattr(server_args, "enable_flashinfer_allreduce_fusion", on)


@contextlib.contextmanager
def _capability(major: int, monkeypatch: pytest.MonkeyPatch):
    """torch's device queries spoofed (CUDA 13.0, capability ``major``.0) with SGLang's
    capability caches cleared before and after."""
    with monkeypatch.context() as spoof:
        spoof.setattr(torch.cuda, "is_available", lambda: True)
        spoof.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
        spoof.setattr(torch.version, "cuda", "13.0")
        _clear_capability_caches()
        try:
            yield
        finally:
            _clear_capability_caches()


def test_fusion_gate_accepts_sm120(server_args, monkeypatch):
    _request_fusion(server_args, monkeypatch, True)
    sm90, _ = _gate_seen_by(9, monkeypatch)
    assert sm90(8), "capability spoof did not take"

    sm120, module = _gate_seen_by(12, monkeypatch)
    assert sm120(8)
    assert sm120(module.FUSE_ALLREDUCE_MAX_BATCH_SIZE)
    assert not sm120(0)
    assert not sm120(module.FUSE_ALLREDUCE_MAX_BATCH_SIZE + 1)

    # Opt-in only: without the fusion asked for, SM120 does not fuse.
    _request_fusion(server_args, monkeypatch, False)
    assert not sm120(8)


@pytest.mark.sglang_lines("0.5.17", "0.5.23")
def test_backend_resolution_accepts_sm120(sglang_tree, monkeypatch):
    """0.5.17 resolves ``--flashinfer-allreduce-fusion-backend`` at start-up and refused
    everything but SM90 / SM10X; on SM120 (one PCIe node) ``auto`` and ``trtllm`` resolve to
    the trtllm backend, while mnnvl (an NVLink fabric) and multi-node stay refused, and the
    fusion is never turned on for SM120 unasked."""
    from sglang.srt.layers import flashinfer_comm_fusion as fusion

    with _capability(9, monkeypatch):
        assert fusion._resolve_backend("auto") == "trtllm", "capability spoof did not take"
    with _capability(12, monkeypatch):
        assert fusion._resolve_backend("auto") == "trtllm"
        assert fusion._resolve_backend("trtllm") == "trtllm"
        for backend, multi_node in (("mnnvl", False), ("auto", True), ("trtllm", True)):
            with pytest.raises(ValueError):
                fusion._resolve_backend(backend, is_multi_node=multi_node)
    with _capability(8, monkeypatch), pytest.raises(ValueError, match="SM90"):
        fusion._resolve_backend("auto")

    # SM120 fuses only when asked: the start-up pass that turns the fusion on for supported
    # models does so on SM90, not on SM120.
    from sglang.srt.arg_groups import overrides

    hf_config = SimpleNamespace(architectures=["DeepseekV3ForCausalLM"])
    view = SimpleNamespace(
        get_model_config=lambda: SimpleNamespace(hf_config=hf_config),
        flashinfer_allreduce_fusion_backend=None,
        tp_size=8,
        enable_dp_attention=False,
        nnodes=1,
        moe_a2a_backend="none",
        disable_custom_all_reduce=False,
        attn_dp_size=1,
        ep_join_mode=None,
        # 0.5.23 reads the model through a memo a fixture may fill (model_config_of)
        _model_config=SimpleNamespace(hf_config=hf_config),
    )
    auto_enable = overrides._flashinfer_allreduce_fusion_auto_enable
    with _capability(9, monkeypatch):
        assert auto_enable(view) == {"flashinfer_allreduce_fusion_backend": "auto"}
    with _capability(12, monkeypatch):
        assert auto_enable(view) == {}


class PeerSum:
    """Recording stand-in for the all-reduces of a two-rank group.

    The collective is infrastructure, not the code under test: it records which group's
    all-reduce was called with what, and returns this rank's tensor plus the peer rank's
    partial sum.
    """

    def __init__(self, peer: torch.Tensor):
        self.peer = peer
        self.calls: list[tuple[str, torch.Tensor]] = []

    def on(self, group: str):
        def all_reduce(x: torch.Tensor) -> torch.Tensor:
            self.calls.append((group, x.clone()))
            return x + self.peer

        return all_reduce


# The TP-level all-reduces of ``sglang.srt.distributed`` by group (0.5.12 also reduces over
# the attention TP and MoE groups), and the group sizes the fused path asks for.
ALL_REDUCES = {
    "tensor_model_parallel_all_reduce": "tp",
    "attention_tensor_model_parallel_all_reduce": "attn_tp",
    "moe_tensor_model_parallel_all_reduce": "moe_tp",
}
WORLD_SIZES = {
    "get_tensor_model_parallel_world_size": 2,
    "get_attn_tensor_model_parallel_world_size": 2,
    "get_moe_tensor_parallel_world_size": 2,
    "get_moe_expert_parallel_world_size": 1,
}


def _has_group_choice() -> bool:
    """0.5.12's ``forward_with_allreduce_fusion`` takes ``use_attn_tp_group``; 0.5.9's not."""
    from sglang.srt.layers.layernorm import RMSNorm

    params = inspect.signature(RMSNorm.forward_with_allreduce_fusion).parameters
    return "use_attn_tp_group" in params


def _two_rank_norm(monkeypatch: pytest.MonkeyPatch, peer: torch.Tensor, ep_size: int = 1):
    from sglang.srt import distributed
    from sglang.srt.layers import flashinfer_comm_fusion
    from sglang.srt.layers.layernorm import RMSNorm

    all_reduce = PeerSum(peer)
    sizes = {**WORLD_SIZES}
    if ep_size > 1:  # expert parallel: the MoE TP group is one rank
        sizes.update(
            get_moe_expert_parallel_world_size=ep_size, get_moe_tensor_parallel_world_size=1
        )
    for name, size in sizes.items():
        if hasattr(distributed, name):
            monkeypatch.setattr(distributed, name, lambda size=size: size)
    for name, group in ALL_REDUCES.items():
        if hasattr(distributed, name):
            monkeypatch.setattr(distributed, name, all_reduce.on(group))
    if hasattr(distributed, "get_moe_ep_group"):
        ep_group = SimpleNamespace(all_reduce=all_reduce.on("moe_ep"))
        monkeypatch.setattr(distributed, "get_moe_ep_group", lambda: ep_group)
    # The real fused op is registered for CUDA only; stand in for it declining, as it does
    # without FlashInfer comm or an initialised workspace: (None, None).
    assert flashinfer_comm_fusion._flashinfer_comm is None
    monkeypatch.setattr(
        flashinfer_comm_fusion,
        "flashinfer_allreduce_residual_rmsnorm",
        lambda input_tensor, residual, weight, eps=1e-6, **_: (None, None),
    )

    from sglang.srt.layers import layernorm

    if hasattr(layernorm, "get_parallel"):  # 0.5.17+: group sizes from the runtime context
        parallel = SimpleNamespace(
            attn_tp_size=sizes["get_attn_tensor_model_parallel_world_size"],
            moe_ep_size=sizes["get_moe_expert_parallel_world_size"],
            moe_tp_size=sizes["get_moe_tensor_parallel_world_size"],
        )
        monkeypatch.setattr(layernorm, "get_parallel", lambda: parallel)

    norm = RMSNorm(HIDDEN, eps=EPS)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, HIDDEN))
    return norm, all_reduce


def _fallback_cases() -> list[tuple[dict, int, str]]:
    """(keyword arguments, expert-parallel size, the group the fallback must all-reduce)."""
    if not _has_group_choice():
        return [({}, 1, "tp")]
    moe = {"use_attn_tp_group": False}
    return [({}, 1, "attn_tp"), (moe, 1, "moe_tp"), (moe, 2, "moe_ep")]


def _reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
    h = x + residual
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * weight
    return out, h


@FALLBACK_FIX
def test_layernorm_fallback_all_reduces(sglang_tree, server_args, monkeypatch):
    for kwargs, ep_size, group in _fallback_cases():
        gen = torch.Generator().manual_seed(0)
        mine, peer, residual = (torch.randn(TOKENS, HIDDEN, generator=gen) for _ in range(3))
        norm, all_reduce = _two_rank_norm(monkeypatch, peer, ep_size)

        out, residual_out = norm.forward_with_allreduce_fusion(
            mine.clone(), residual.clone(), **kwargs
        )

        assert [g for g, _ in all_reduce.calls] == [group], (
            f"the fallback ({kwargs or 'defaults'}, EP {ep_size}) must all-reduce the partial "
            f"sum once, "
            f"over the {group} group; got {[g for g, _ in all_reduce.calls]}"
        )
        torch.testing.assert_close(all_reduce.calls[0][1], mine)
        want_out, want_residual = _reference(mine + peer, residual, norm.weight.detach())
        torch.testing.assert_close(residual_out, want_residual)
        torch.testing.assert_close(out, want_out)


@FALLBACK_FIX
def test_layernorm_fallback_adds_post_residual_once(sglang_tree, server_args, monkeypatch):
    for kwargs, ep_size, group in _fallback_cases():
        gen = torch.Generator().manual_seed(1)
        mine, peer, residual, extra = (torch.randn(TOKENS, HIDDEN, generator=gen) for _ in range(4))
        norm, all_reduce = _two_rank_norm(monkeypatch, peer, ep_size)

        out, residual_out = norm.forward_with_allreduce_fusion(
            mine.clone(), residual.clone(), post_residual_addition=extra.clone(), **kwargs
        )

        want_out, want_residual = _reference(mine + peer, residual + extra, norm.weight.detach())
        torch.testing.assert_close(residual_out, want_residual)
        torch.testing.assert_close(out, want_out)
        assert [g for g, _ in all_reduce.calls] == [group]
