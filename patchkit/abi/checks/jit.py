"""Checks 18-20, the JIT stack: FlashInfer, the toolchain it compiles with, cuda-python."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

from packaging.requirements import InvalidRequirement, Requirement

from patchkit.abi.archs import CC
from patchkit.abi.checks.context import Context
from patchkit.archives import read_regular


def check_flashinfer(ctx: Context) -> None:
    dists = ctx.tree.dists
    fi = dists.get("flashinfer-python")
    if fi is None:
        return
    cubin = dists.get("flashinfer-cubin")
    if cubin and cubin.version != fi.version:
        ctx.emit(
            "flashinfer-cubin", cubin.wheel or "flashinfer_cubin", x=cubin.version, y=fi.version
        )
    jit = dists.get("flashinfer-jit-cache")
    cuda = ctx.torch.cuda or ctx.profile.torch_cuda
    want = "cu" + cuda.replace(".", "")
    if jit:
        local = jit.version.split("+", 1)[1] if "+" in jit.version else ""
        if not jit.version.startswith(fi.version) or local != want:
            ctx.emit(
                "flashinfer-jit-cache",
                jit.wheel or "flashinfer_jit_cache",
                v=jit.version,
                cu=local or "an unknown CUDA",
                want=want,
                y=fi.version,
            )


def nvcc_version(environ: dict[str, str]) -> tuple[str | None, str | None]:
    """(version, CUDA_HOME) of the nvcc FlashInfer's JIT would use."""
    home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    if not home:
        nvcc = shutil.which("nvcc", path=environ.get("PATH"))
        home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None
    if not home:
        return None, None
    try:
        text = read_regular(os.path.join(home, "version.json"), 1 << 20)
        return json.loads(text)["cuda"]["version"], home
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        out = subprocess.run(
            [os.path.join(home, "bin", "nvcc"), "--version"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, home
    m = re.search(r"release (\d+\.\d+)", out)
    return (m.group(1) if m else None), home


def check_jit_toolchain(ctx: Context) -> None:
    if ctx.tree.kind != "env" or "flashinfer-python" not in ctx.tree.dists:
        return
    version, home = nvcc_version(ctx.environ)
    major = ctx.torch.major or ctx.profile.cuda_major
    if version and int(version.split(".")[0]) != major:
        ctx.emit("jit-nvcc", "flashinfer", x=version, p=home, y=major)
    arch_list = ctx.environ.get("FLASHINFER_CUDA_ARCH_LIST")
    if arch_list is None:
        return
    have = arch_list.replace(",", " ").split()
    for arch in ctx.profile.jit_arch:
        base = CC.parse(arch.rstrip("af"))
        if base in ctx.targets and arch not in have and arch.rstrip("a") + "f" not in have:
            ctx.emit("jit-arch-list", "FLASHINFER_CUDA_ARCH_LIST", arch=arch, sm=base.sm)


def check_cuda_python(ctx: Context) -> None:
    sglang = ctx.tree.dists.get("sglang")
    major = ctx.torch.major or ctx.profile.cuda_major
    if sglang is None or major < 13:
        return
    for text in sglang.requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name.lower() != "cuda-python" or (req.marker and "extra" in str(req.marker)):
            continue
        for spec in req.specifier:
            if spec.operator in ("==", "~=", "<=") and spec.version.split(".")[0] == "12":
                ctx.emit("cuda-python", sglang.wheel or "sglang", pin=f"cuda-python{spec}")
                return
