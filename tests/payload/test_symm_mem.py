"""sm120-torch-symm-mem-allreduce.patch: TorchSymmMemCommunicator on SM120 (PCIe, two-shot)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.payload


class FakeSymmetricMemory:
    """Stands in for ``torch.distributed._symmetric_memory`` on a PCIe box without a GPU.

    ``empty`` gives a CPU buffer and ``rendezvous`` a handle whose ``multicast_ptr`` is 0, as
    on every PCIe system (no NVLink multicast), unless ``multicast`` is set (an NVLink box).
    Allocation and rendezvous are infrastructure; the communicator's decisions are what is
    under test.
    """

    def __init__(self):
        self.rendezvous_calls: list[str] = []
        self.multicast = False

    def empty(self, numel, device=None, dtype=None):
        return torch.zeros(numel, dtype=dtype)

    def rendezvous(self, buffer, group_name):
        self.rendezvous_calls.append(group_name)
        multicast_ptr = 0x7F0000000000 if self.multicast else 0
        return SimpleNamespace(multicast_ptr=multicast_ptr, buffer_ptrs=[buffer.data_ptr()])


@pytest.fixture
def sm120_box(sglang_tree, server_args, monkeypatch):
    """Spoof an SM120 device and fake the symmetric-memory rendezvous; return the module
    (default server arguments published: 0.5.17 reads its configuration from them)."""
    from sglang.srt.distributed.device_communicators import torch_symm_mem

    fake = FakeSymmetricMemory()
    # 0.5.17 enlarges the buffer for a model-specific JIT all-reduce (on by default); the
    # tests read the per-capability size table, so that enlargement is turned off.
    monkeypatch.setenv("SGLANG_OPT_USE_INKLING_CUSTOM_AR", "false")
    monkeypatch.setattr(torch_symm_mem, "torch_symm_mem_available", True)
    monkeypatch.setattr(torch_symm_mem, "torch_symm_mem", fake, raising=False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 0))
    return torch_symm_mem, fake


def _communicator(module, monkeypatch, world_size: int):
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: world_size)
    group = SimpleNamespace(group_name=f"tp{world_size}")
    comm = module.TorchSymmMemCommunicator(group=group, device=0)
    # The fake buffer lives on the CPU: tensors there stand in for those on the GPU the
    # communicator was made for (0.5.17 declines tensors of another device).
    comm.device = torch.device("cpu")
    return comm


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_symm_mem_sm120_two_shot(sm120_box, monkeypatch, world_size):
    module, fake = sm120_box
    comm = _communicator(module, monkeypatch, world_size)

    assert not comm.disabled, "SM120 communicator disabled itself (multicast_ptr == 0 on PCIe)"
    assert fake.rendezvous_calls == [f"tp{world_size}"]
    assert comm.max_size == module.TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[12][world_size]
    assert comm.use_multimem is False
    small = torch.ones(4096, dtype=torch.bfloat16)
    assert comm.should_torch_symm_mem_allreduce(small)
    assert not comm.should_torch_symm_mem_allreduce(small.float())


def test_symm_mem_sm120_all_reduce_uses_two_shot(sm120_box, monkeypatch):
    module, _ = sm120_box
    world_size = 4
    comm = _communicator(module, monkeypatch, world_size)
    calls = []

    def two_shot(buffer, op, group_name):
        # Every rank contributed the same tensor: the sum is world_size times it.
        calls.append(("two_shot", op, group_name))
        buffer.mul_(world_size)

    def multimem(buffer, op, group_name):
        calls.append(("multimem", op, group_name))

    monkeypatch.setattr(torch.ops.symm_mem, "two_shot_all_reduce_", two_shot, raising=False)
    monkeypatch.setattr(torch.ops.symm_mem, "multimem_all_reduce_", multimem, raising=False)

    inp = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    out = comm.all_reduce(inp)

    assert calls == [("two_shot", "sum", "tp4")]
    torch.testing.assert_close(out, inp * world_size)


@pytest.mark.parametrize(("major", "world_size"), [(9, 2), (10, 2), (10, 4)])
def test_symm_mem_two_shot_without_multicast_only_on_sm120(
    sm120_box, monkeypatch, major, world_size
):
    """Two-shot without multicast is SM120's path only; elsewhere no multicast still disables.

    On SM90/SM100 these world sizes use two-shot too, but a box without multicast there is a
    PCIe box whose P2P atomics (the two-shot barriers) nothing checks: the communicator must
    stay off, as upstream has it.  The SM120 communicator of the same world size is on.
    """
    module, fake = sm120_box
    assert not _communicator(module, monkeypatch, world_size).disabled

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
    comm = _communicator(module, monkeypatch, world_size)

    assert fake.rendezvous_calls == [f"tp{world_size}"] * 2
    assert comm.disabled, f"SM{major}0 two-shot enabled without multicast"


# Every capability major a box may report (the communicator reads the major only).
MAJORS = (7, 8, 9, 10, 11, 12, 13)


@pytest.mark.parametrize("multicast", [False, True], ids=["pcie", "nvlink-multicast"])
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_symm_mem_majors(sm120_box, monkeypatch, multicast, world_size):
    """The communicator over every capability major: without a multicast object (PCIe) it is on
    for SM12X only, two-shot; with one, on SM90 / SM10X (upstream's, multimem at the world sizes
    of upstream's table) and SM12X (two-shot: no NVLink multicast there); off on every other
    major."""
    module, fake = sm120_box
    fake.multicast = multicast
    enabled, multimem, max_sizes = [], [], {}
    for major in MAJORS:
        monkeypatch.setattr(
            torch.cuda, "get_device_capability", lambda device=None, major=major: (major, 0)
        )
        comm = _communicator(module, monkeypatch, world_size)
        if not comm.disabled:
            enabled.append(major)
            max_sizes[major] = comm.max_size
            if comm.use_multimem:
                multimem.append(major)

    assert enabled == ([9, 10, 12] if multicast else [12])
    table = module.TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES
    assert max_sizes == {major: table[major][world_size] for major in enabled}
    upstream_multimem = [
        major
        for major in (9, 10)
        if world_size in module.TorchSymmMemCommunicator._WORLD_SIZES_MULTIMEM[major]
    ]
    assert multimem == (upstream_multimem if multicast else [])
