"""sm120-flashinfer-allreduce-fusion.patch: the fusion gate on SM120, the RMSNorm fallback."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Device:
    """What a box's torch reports: its capability and, on a ROCm build (an AMD GPU seen through
    ``torch.cuda``: ``torch.version.hip`` set, ``torch.version.cuda`` None), its gfx arch."""

    name: str
    major: int
    minor: int = 0
    gfx: str | None = None

    @property
    def hip(self) -> bool:
        return self.gfx is not None


# Every capability a box may report, and two AMD GPUs under ROCm torch whose majors are those of
# NVIDIA gates (MI300X reports 9.4, an RDNA4 Radeon 12.0): the gates are driven over all of them.
DEVICES = (
    Device("SM80 (A100)", 8, 0),
    Device("SM89 (L40S)", 8, 9),
    Device("SM90 (H100)", 9, 0),
    Device("SM100 (B200)", 10, 0),
    Device("SM103 (B300)", 10, 3),
    Device("SM110 (Thor)", 11, 0),
    Device("SM120 (RTX PRO 6000)", 12, 0),
    Device("SM121 (GB10)", 12, 1),
    Device("SM130 (a later major)", 13, 0),
    Device("MI300X (ROCm)", 9, 4, gfx="gfx942:sramecc+:xnack-"),
    Device("Radeon AI PRO R9700 (ROCm)", 12, 0, gfx="gfx1201"),
)
# The majors the patch means: upstream's SM90 and SM10X, and SM12X (RTX PRO 6000, GB10), on CUDA.
FUSION_MAJORS = (9, 10, 12)
# The start-up pass that turns the fusion on unasked keeps upstream's SM90 / SM10X.
AUTO_ENABLE_MAJORS = (9, 10)

# SGLang's cached device probes (those a line lacks, or has uncached, are skipped).
CAPABILITY_CACHES = (
    "is_cuda",
    "is_hip",
    "is_sm90_supported",
    "is_sm100_supported",
    "is_sm110_supported",
    "is_sm120_supported",
    "is_blackwell_supported",
    "is_gfx95_supported",
    "is_gfx1250_supported",
    "get_device_sm",
)


def _clear_capability_caches() -> None:
    from sglang.srt.utils import common

    for name in CAPABILITY_CACHES:
        cache_clear = getattr(getattr(common, name, None), "cache_clear", None)
        if cache_clear is not None:
            cache_clear()


def _admitted_on(device: Device) -> bool:
    return not device.hip and device.major in FUSION_MAJORS


def _gate_seen_by(major: int | Device, monkeypatch: pytest.MonkeyPatch):
    """The per-batch fusion gate of a private copy of its module (``GATES``) executed as on a
    GPU of capability ``major`` (``major``.0 on CUDA, or a ``Device``), and the module.

    The module computes its ``_is_sm*_supported`` flags at import, so the copy is executed with
    torch's device queries spoofed (CUDA 13.0 or ROCm, the device's capability); the imported
    module itself is left alone.
    """
    device = major if isinstance(major, Device) else Device(f"SM{major}0", major)
    module_name, gate = next(g for g in GATES if importlib.util.find_spec(g[0]) is not None)
    real = importlib.import_module(module_name)
    with _capability(device, monkeypatch):
        name = f"_patchkit_gate_{device.major}_{device.minor}_{'hip' if device.hip else 'cuda'}"
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
def _capability(major: int | Device, monkeypatch: pytest.MonkeyPatch):
    """torch's device queries spoofed (CUDA 13.0, capability ``major``.0; or a ``Device``: its
    capability, on ROCm with ``hip``) with SGLang's capability caches cleared before and after.

    Only the device queries are stood in for: torch's capability and properties, and SGLang's
    NVML reading of the capability (0.5.21's ``get_device_sm``), which answers None as it does
    where NVML cannot, so that torch's capability answers.
    """
    device = major if isinstance(major, Device) else Device(f"SM{major}0", major)
    capability = (device.major, device.minor)
    properties = SimpleNamespace(major=device.major, minor=device.minor, gcnArchName=device.gfx)
    from sglang.srt.utils import common

    with monkeypatch.context() as spoof:
        spoof.setattr(torch.cuda, "is_available", lambda: True)
        spoof.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        spoof.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)
        spoof.setattr(torch.version, "cuda", None if device.hip else "13.0")
        spoof.setattr(torch.version, "hip", "7.0.0" if device.hip else None)
        if hasattr(common, "_get_device_sm_via_nvml"):
            spoof.setattr(common, "_get_device_sm_via_nvml", lambda: None)
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


def test_fusion_gate_admits_the_patch_majors_only(server_args, monkeypatch):
    """The per-batch gate over every capability and two ROCm boxes: it admits SM90, SM10X and
    SM12X on CUDA, and nothing else (not SM110, not a later major, not an AMD GPU whose ROCm
    torch reports a major of the list)."""
    _request_fusion(server_args, monkeypatch, True)
    admitted = [device.name for device in DEVICES if _gate_seen_by(device, monkeypatch)[0](8)]
    assert admitted == [device.name for device in DEVICES if _admitted_on(device)]


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

    view = _fusion_model_view()
    auto_enable = overrides._flashinfer_allreduce_fusion_auto_enable
    with _capability(9, monkeypatch):
        assert auto_enable(view) == {"flashinfer_allreduce_fusion_backend": "auto"}
    with _capability(12, monkeypatch):
        assert auto_enable(view) == {}


def _fusion_model_view() -> SimpleNamespace:
    """The server arguments of one node serving DeepSeek-V3 at TP 8, as the start-up pass that
    turns the fusion on for supported models reads them."""
    hf_config = SimpleNamespace(architectures=["DeepseekV3ForCausalLM"])
    return SimpleNamespace(
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


@pytest.mark.sglang_lines("0.5.17", "0.5.23")
def test_backend_resolution_admits_the_patch_majors_only(sglang_tree, monkeypatch):
    """The start-up checks over every capability and two ROCm boxes: the backend resolution
    admits SM90, SM10X and SM12X on CUDA and refuses every other device; the pass that turns the
    fusion on unasked keeps to SM90 / SM10X."""
    from sglang.srt.arg_groups import overrides
    from sglang.srt.layers import flashinfer_comm_fusion as fusion

    view = _fusion_model_view()
    resolved, auto_enabled = [], []
    for device in DEVICES:
        with _capability(device, monkeypatch):
            try:
                assert fusion._resolve_backend("trtllm") == "trtllm", device.name
                resolved.append(device.name)
            except ValueError as refused:
                assert "requires SM90" in str(refused), device.name
            if overrides._flashinfer_allreduce_fusion_auto_enable(view):
                auto_enabled.append(device.name)

    assert resolved == [device.name for device in DEVICES if _admitted_on(device)]
    assert auto_enabled == [
        device.name for device in DEVICES if not device.hip and device.major in AUTO_ENABLE_MAJORS
    ]


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


class AiterFusedNorm:
    """Recording stand-in for AITER's fused all-reduce + residual RMSNorm (a ROCm kernel): it
    returns ``result`` (None: the op declines, as it does without its workspace)."""

    def __init__(self, result):
        self.result = result
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, x, residual, weight, eps):
        self.calls.append((x.clone(), residual.clone()))
        return self.result


# 0.5.9's fused norm has no AITER route; 0.5.23 carries no fallback (upstream from 0.5.21).
@pytest.mark.sglang_lines("0.5.17")
def test_aiter_route_adds_post_residual_once(sglang_tree, server_args, monkeypatch):
    """The fused norm's ROCm route (``_use_aiter``: SGLANG_USE_AITER on a ROCm torch), which the
    patch's hunk runs through: AITER's fused op gets the residual with ``post_residual_addition``
    folded in, and when it declines upstream's route is kept (the TP group's all-reduce with
    AITER's fusion on, none without) and adds ``post_residual_addition`` once; FlashInfer's op
    and the patch's FlashInfer fallback are not reached."""
    from sglang.srt import distributed
    from sglang.srt import server_args as server_args_module
    from sglang.srt.layers import flashinfer_comm_fusion, layernorm

    gen = torch.Generator().manual_seed(2)
    mine, peer, residual, extra = (torch.randn(TOKENS, HIDDEN, generator=gen) for _ in range(4))
    accepted = (torch.full((TOKENS, HIDDEN), 7.0), torch.full((TOKENS, HIDDEN), 8.0))
    # (AITER's result, --enable-aiter-allreduce-fusion, the all-reduces, the normed input)
    cases = (
        (accepted, True, [], None),
        (None, True, ["tp"], mine + peer),
        (None, False, [], mine),
    )
    norm, all_reduce = _two_rank_norm(monkeypatch, peer)
    flashinfer_calls = []
    monkeypatch.setattr(
        flashinfer_comm_fusion,
        "flashinfer_allreduce_residual_rmsnorm",
        lambda **kwargs: flashinfer_calls.append(kwargs) or (None, None),
    )
    # The ROCm flag only, set once the norm is made (its own kernels are not under test).
    monkeypatch.setattr(layernorm, "_use_aiter", True)
    for result, aiter_fusion, reduced, normed in cases:
        all_reduce.calls.clear()
        weight = norm.weight.detach()
        want = accepted if result is not None else _reference(normed, residual + extra, weight)
        aiter = AiterFusedNorm(result)
        monkeypatch.setattr(distributed, "tensor_model_parallel_fused_allreduce_rmsnorm", aiter)
        monkeypatch.setattr(server_args, "enable_aiter_allreduce_fusion", aiter_fusion)
        server_args_module.set_global_server_args_for_scheduler(server_args)

        out = norm.forward_with_allreduce_fusion(
            mine.clone(), residual.clone(), post_residual_addition=extra.clone()
        )

        case = f"AITER {'declined' if result is None else 'fused'}, fusion {aiter_fusion}"
        assert not flashinfer_calls, f"{case}: the ROCm route called FlashInfer's fused op"
        assert len(aiter.calls) == 1, case
        torch.testing.assert_close(aiter.calls[0][0], mine)
        torch.testing.assert_close(aiter.calls[0][1], residual + extra)
        assert [g for g, _ in all_reduce.calls] == reduced, case
        torch.testing.assert_close(out[0], want[0], msg=case)
        torch.testing.assert_close(out[1], want[1], msg=case)
