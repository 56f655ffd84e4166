"""flashinfer sm120-trtllm-comm.patch: trtllm comm builds for, and keeps code on, SM12x."""

from __future__ import annotations

import re

import pytest

# The FlashInfer line each SGLang line goes with (0.6.3 for 0.5.9, 0.6.15.post1 for 0.5.17);
# 0.5.23's FlashInfer 0.7.2 builds SM12x trtllm comm itself.
pytestmark = [pytest.mark.payload, pytest.mark.sglang_lines("0.5.9", "0.5.17")]

SM120A = "-gencode=arch=compute_120a,code=sm_120a"
SM90A = "-gencode=arch=compute_90a,code=sm_90a"
HEADER = "include/flashinfer/comm/trtllm_allreduce.cuh"


def _trtllm_comm_spec(monkeypatch, arch_list: str, cuda_home):
    """The JitSpec of the trtllm comm module as a box with ``arch_list`` GPUs would build it.

    FlashInfer reads ``FLASHINFER_CUDA_ARCH_LIST`` into its compilation context at import;
    a fresh context is installed for the duration of the test, so no GPU is needed.
    """
    from flashinfer import compilation_context
    from flashinfer.jit import comm, core

    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", arch_list)
    monkeypatch.setenv("CUDA_HOME", str(cuda_home))
    context = compilation_context.CompilationContext()
    monkeypatch.setattr(comm, "current_compilation_context", context)
    monkeypatch.setattr(core, "current_compilation_context", context)
    return comm.gen_trtllm_comm_module()


def test_trtllm_comm_jit_targets_sm120a(flashinfer_tree, monkeypatch, tmp_path):
    spec = _trtllm_comm_spec(monkeypatch, "12.0a", tmp_path)

    assert SM120A in spec.extra_cuda_cflags
    commands = spec.get_compile_commands()
    sources = {entry["file"].rsplit("/", 1)[-1]: entry["command"] for entry in commands}
    assert {"trtllm_allreduce.cu", "trtllm_allreduce_fusion.cu"} <= set(sources)
    for command in sources.values():
        assert command.split()[0].endswith("nvcc")
        assert SM120A in command.split()

    # A mixed Hopper + SM120 arch list builds both.
    mixed = _trtllm_comm_spec(monkeypatch, "9.0a 12.0a", tmp_path)
    assert {SM90A, SM120A} <= set(mixed.extra_cuda_cflags)


def _guard_holds(condition: str, arch: int) -> bool:
    """Evaluate a ``#if`` condition over ``__CUDA_ARCH__`` for the device pass of ``arch``."""
    expr = condition.replace("defined(__CUDA_ARCH__)", "1").replace("__CUDA_ARCH__", str(arch))
    expr = expr.replace("&&", " and ").replace("||", " or ")
    expr = re.sub(r"!(?!=)", " not ", expr)
    return bool(eval(expr, {"__builtins__": {}}))  # noqa: S307 - digits and operators only


def test_trtllm_allreduce_guards_keep_sm12x_code(flashinfer_tree):
    lines = (flashinfer_tree / HEADER).read_text().splitlines()
    guards = [
        (number, line.split("#if", 1)[1])
        for number, line in enumerate(lines, 1)
        if line.lstrip().startswith("#if") and "__CUDA_ARCH__" in line
    ]
    assert guards, f"no __CUDA_ARCH__ guards found in {HEADER}"

    for arch in (1200, 1210):
        empty = [
            n for n, cond in guards if _guard_holds(cond, 900) and not _guard_holds(cond, arch)
        ]
        assert not empty, f"{HEADER}: lines {empty} compile to nothing for sm_{arch // 10}"

    # The Lamport one-shot norm kernel wraps its whole body in a guard; SM12x must keep it.
    start = next(
        i
        for i, line in enumerate(lines)
        if "lamport_style_one_shot_all_reduce_norm_kernel(" in line
    )
    body_guard = next(line for line in lines[start:] if line.lstrip().startswith("#if"))
    assert _guard_holds(body_guard.split("#if", 1)[1], 1200)
