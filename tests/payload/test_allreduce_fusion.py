"""sm120-flashinfer-allreduce-fusion.patch: the fusion gate on SM120, the RMSNorm fallback."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest
import torch

pytestmark = pytest.mark.payload

HIDDEN = 64
TOKENS = 5
EPS = 1e-6


def _clear_capability_caches() -> None:
    from sglang.srt.utils import common

    for name in ("is_cuda", "is_sm90_supported", "is_sm100_supported", "is_sm120_supported"):
        getattr(common, name).cache_clear()


def _communicator_seen_by(major: int, monkeypatch: pytest.MonkeyPatch):
    """A private copy of ``layers/communicator.py`` executed as on a GPU of capability ``major``.

    The module computes its ``_is_sm*_supported`` flags at import, so the copy is executed with
    torch's device queries spoofed (CUDA 13.0, capability ``major``.0); the imported module
    itself is left alone.
    """
    real = importlib.import_module("sglang.srt.layers.communicator")
    with monkeypatch.context() as spoof:
        spoof.setattr(torch.cuda, "is_available", lambda: True)
        spoof.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
        spoof.setattr(torch.version, "cuda", "13.0")
        _clear_capability_caches()
        name = f"_patchkit_communicator_sm{major}"
        try:
            spec = importlib.util.spec_from_file_location(name, real.__file__)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        finally:
            sys.modules.pop(name, None)
            _clear_capability_caches()
    # FlashInfer's presence is not what the gate test is about.
    module._is_flashinfer_available = True
    return module


def test_fusion_gate_accepts_sm120(server_args, monkeypatch):
    monkeypatch.setattr(server_args, "enable_flashinfer_allreduce_fusion", True)
    sm90 = _communicator_seen_by(9, monkeypatch)
    assert sm90.apply_flashinfer_allreduce_fusion(8), "capability spoof did not take"

    sm120 = _communicator_seen_by(12, monkeypatch)
    assert sm120.apply_flashinfer_allreduce_fusion(8)
    assert sm120.apply_flashinfer_allreduce_fusion(sm120.FUSE_ALLREDUCE_MAX_BATCH_SIZE)
    assert not sm120.apply_flashinfer_allreduce_fusion(0)
    assert not sm120.apply_flashinfer_allreduce_fusion(sm120.FUSE_ALLREDUCE_MAX_BATCH_SIZE + 1)

    # Opt-in only: without --enable-flashinfer-allreduce-fusion SM120 does not fuse.
    monkeypatch.setattr(server_args, "enable_flashinfer_allreduce_fusion", False)
    assert not sm120.apply_flashinfer_allreduce_fusion(8)


class PeerSum:
    """Recording stand-in for the TP all-reduce of a two-rank group.

    The collective is infrastructure, not the code under test: it records its inputs and
    returns this rank's tensor plus the peer rank's partial sum.
    """

    def __init__(self, peer: torch.Tensor):
        self.peer = peer
        self.calls: list[torch.Tensor] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.clone())
        return x + self.peer


def _two_rank_norm(monkeypatch: pytest.MonkeyPatch, peer: torch.Tensor):
    from sglang.srt import distributed
    from sglang.srt.layers import flashinfer_comm_fusion
    from sglang.srt.layers.layernorm import RMSNorm

    all_reduce = PeerSum(peer)
    monkeypatch.setattr(distributed, "get_tensor_model_parallel_world_size", lambda: 2)
    monkeypatch.setattr(distributed, "tensor_model_parallel_all_reduce", all_reduce)
    # The real fused op is registered for CUDA only; stand in for it declining, as it does
    # without FlashInfer comm or an initialised workspace: (None, None).
    assert flashinfer_comm_fusion._flashinfer_comm is None
    monkeypatch.setattr(
        flashinfer_comm_fusion,
        "flashinfer_allreduce_residual_rmsnorm",
        lambda input_tensor, residual, weight, eps=1e-6, **_: (None, None),
    )

    norm = RMSNorm(HIDDEN, eps=EPS)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, HIDDEN))
    return norm, all_reduce


def _reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
    h = x + residual
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * weight
    return out, h


def test_layernorm_fallback_all_reduces(sglang_tree, server_args, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    mine, peer, residual = (torch.randn(TOKENS, HIDDEN, generator=gen) for _ in range(3))
    norm, all_reduce = _two_rank_norm(monkeypatch, peer)

    out, residual_out = norm.forward_with_allreduce_fusion(mine.clone(), residual.clone())

    assert len(all_reduce.calls) == 1, "the fallback must all-reduce the partial sum once"
    torch.testing.assert_close(all_reduce.calls[0], mine)
    want_out, want_residual = _reference(mine + peer, residual, norm.weight.detach())
    torch.testing.assert_close(residual_out, want_residual)
    torch.testing.assert_close(out, want_out)


def test_layernorm_fallback_adds_post_residual_once(sglang_tree, server_args, monkeypatch):
    gen = torch.Generator().manual_seed(1)
    mine, peer, residual, extra = (torch.randn(TOKENS, HIDDEN, generator=gen) for _ in range(4))
    norm, all_reduce = _two_rank_norm(monkeypatch, peer)

    out, residual_out = norm.forward_with_allreduce_fusion(
        mine.clone(), residual.clone(), post_residual_addition=extra.clone()
    )

    want_out, want_residual = _reference(mine + peer, residual + extra, norm.weight.detach())
    torch.testing.assert_close(residual_out, want_residual)
    torch.testing.assert_close(out, want_out)
    assert len(all_reduce.calls) == 1
