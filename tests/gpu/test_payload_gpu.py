"""GPU tier of the payload tests: the patched paths run for real (``make gpu-test``).

Needs NVIDIA GPUs and the pinned stack (torch 2.9.1+cu130, nvcc >= 12.8, the payload test
dependencies); each test skips cleanly when what it needs is missing.  The trees come from the
same ``prepare_tree`` as the CPU tier (``tests/payload/conftest.py``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def _payload_conftest():
    spec = importlib.util.spec_from_file_location(
        "patchkit_payload_conftest", ROOT / "tests" / "payload" / "conftest.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(target: str) -> Path:
    payload = _payload_conftest()
    return payload.prepare_tree(target, payload.payload_tree_kind() == "patched")


def _needs_gpus(count: int) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if torch.cuda.device_count() < count:
        pytest.skip(f"needs {count} GPUs, found {torch.cuda.device_count()}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _symm_mem_rank(rank: int, world_size: int, port: int, sglang_python: str, results) -> None:
    """One rank: TorchSymmMemCommunicator from the patched tree, a bf16 sum all-reduce."""
    import torch.distributed as dist

    sys.path.insert(0, sglang_python)
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        device_id=torch.device(f"cuda:{rank}"),
    )
    try:
        from sglang.srt.distributed.device_communicators.torch_symm_mem import (
            TorchSymmMemCommunicator,
        )

        group = dist.new_group(backend="gloo")
        comm = TorchSymmMemCommunicator(group=group, device=rank)
        inp = torch.full((4096,), float(rank + 1), dtype=torch.bfloat16, device=f"cuda:{rank}")
        usable = not comm.disabled and comm.should_torch_symm_mem_allreduce(inp)
        out = comm.all_reduce(inp) if usable else None
        torch.cuda.synchronize()
        results[rank] = {
            "capability": torch.cuda.get_device_capability(rank)[0],
            "disabled": comm.disabled,
            "multimem": getattr(comm, "use_multimem", None),
            "values": None if out is None else sorted(set(out.float().tolist())),
        }
    finally:
        dist.destroy_process_group()


def test_symm_mem_all_reduce_two_gpus():
    """Two GPUs: the communicator initialises (two-shot where there is no multicast) and sums."""
    _needs_gpus(2)
    import torch.multiprocessing as mp

    sglang_python = str(_tree("sglang") / "python")
    world_size = 2
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(
            _symm_mem_rank,
            args=(world_size, _free_port(), sglang_python, results),
            nprocs=world_size,
            join=True,
        )
        results = dict(results)

    expected = float(sum(range(1, world_size + 1)))
    for rank, result in sorted(results.items()):
        assert not result["disabled"], f"rank {rank}: communicator disabled: {result}"
        assert result["values"] == [expected], f"rank {rank}: {result}"
        if result["capability"] == 12:
            assert result["multimem"] is False


def _flashinfer_source_tree() -> Path:
    """The FlashInfer tree with ``flashinfer/data`` linked as upstream's editable install does.

    JIT reads its sources from ``flashinfer/data/{include,csrc,cutlass,spdlog}``; a wheel ships
    them there, the source tree keeps them at the top (see FlashInfer's build_backend.py).
    """
    tree = _tree("flashinfer")
    data = tree / "flashinfer" / "data"
    data.mkdir(exist_ok=True)
    for source, name in [
        ("include", "include"),
        ("csrc", "csrc"),
        ("3rdparty/cutlass", "cutlass"),
        ("3rdparty/spdlog", "spdlog"),
    ]:
        if not (data / name).exists():
            (data / name).symlink_to(tree / source, target_is_directory=True)
    return tree


def _toolkit_root() -> str | None:
    """The CUDA toolkit's root as nvcc itself reports it (``TOP`` of ``nvcc --dryrun``):
    FlashInfer's JIT takes ``CUDA_HOME`` or the folder above ``nvcc`` on ``PATH``, which is
    wrong where ``nvcc`` is a wrapper script (``/usr/local/bin/nvcc`` exec'ing the toolkit's):
    the link step then looks for ``libcudart`` in ``/usr/local/lib64``."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "probe.cu"
        source.write_text("")
        run = subprocess.run(
            ["nvcc", "--dryrun", "-c", str(source)], capture_output=True, text=True, cwd=tmp
        )
    for line in run.stderr.splitlines():
        if line.startswith("#$ TOP="):
            return str(Path(line.split("=", 1)[1]).resolve())
    return None


def _can_link_libcuda() -> bool:
    """The module links against libcuda: the toolkit's driver stub or the driver itself."""
    import ctypes.util

    home = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    return (home / "lib64" / "stubs" / "libcuda.so").exists() or bool(
        ctypes.util.find_library("cuda")
    )


def _comm_spec(arch_list: str, monkeypatch):
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", arch_list)
    if not os.environ.get("CUDA_HOME") and (root := _toolkit_root()):
        monkeypatch.setenv("CUDA_HOME", root)
    sys.path.insert(0, str(_flashinfer_source_tree()))
    from flashinfer import compilation_context
    from flashinfer.jit import comm, core

    context = compilation_context.CompilationContext()
    monkeypatch.setattr(comm, "current_compilation_context", context)
    monkeypatch.setattr(core, "current_compilation_context", context)
    return comm.gen_trtllm_comm_module()


def _local_arch() -> str:
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}{'a' if major >= 9 else ''}"


@pytest.mark.parametrize("arch", ["local", "12.0a"])
def test_flashinfer_trtllm_comm_jit_compiles(arch, monkeypatch, tmp_path):
    """The patched trtllm comm module compiles for the local GPU (and loads), and for sm_120a.

    ``12.0a`` is compile-only: any host with nvcc >= 12.8 builds it, an SM120 GPU is not needed
    (the objects are linked into the module where a libcuda is there to link against; nvcc is
    asked for the toolkit's root, since FlashInfer takes the folder above a wrapper script).
    """
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        pytest.skip("needs nvcc")
    if arch == "local":
        _needs_gpus(1)
        arch = _local_arch()
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    spec = _comm_spec(arch, monkeypatch)
    if arch.startswith("12.0"):
        if _can_link_libcuda():
            spec.build(verbose=False)
        else:  # a toolkit without the driver stub: the objects only, not the link
            import subprocess

            spec.write_ninja()
            objects = [str(p) for p in spec.get_object_paths()]
            command = ["ninja", "-C", str(spec.build_dir), "-f", str(spec.ninja_path), *objects]
            subprocess.run(command, check=True, capture_output=True)
        assert all(Path(p).exists() for p in spec.get_object_paths())
    else:
        module = spec.build_and_load()
        assert hasattr(module, "trtllm_allreduce_fusion")
