"""The distribution, host and JIT-toolchain checks (1-4, 11-14, 16-20) on small synthetic
site-packages folders: real dist-info metadata, gcc-built stub libraries, fake hosts."""

from __future__ import annotations

import json
import os

import pytest

from patchkit.abi import verify
from patchkit.abi.archs import CC
from patchkit.abi.checks import Context, DriverInfo, detect_driver
from patchkit.abi.checks.running import check_device_toolkit
from patchkit.abi.elf import ElfInfo
from patchkit.abi.fatbin import Fatbin
from patchkit.abi.profiles import load_profile
from patchkit.abi.scan import FileReport
from patchkit.abi.sources import Tree
from tests.abi import builders

VERSION_PY = "__version__ = '{v}'\ndebug = False\ncuda: Optional[str] = {c}\n"


def _dist(site: str, name: str, version: str, requires=(), record=()):
    folder = os.path.join(site, f"{name.replace('-', '_')}-{version}.dist-info")
    os.makedirs(folder, exist_ok=True)
    head = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    head += [f"Requires-Dist: {r}" for r in requires]
    with open(os.path.join(folder, "METADATA"), "w") as fh:
        fh.write("\n".join(head) + "\n\nlong description\n")
    with open(os.path.join(folder, "RECORD"), "w") as fh:
        fh.write("".join(f"{r},,\n" for r in record))


def _site(tmp_path, version="2.9.1+cu130", cuda="'13.0'", extras=None) -> str:
    # One real object, so the run checks something ("nothing checked" is its own error).
    extras = {"demo/libdemo.so": builders.stub_library("libdemo.so", ("demo",)), **(extras or {})}
    site = builders.make_site(str(tmp_path), None, extras)
    os.makedirs(os.path.join(site, "torch"), exist_ok=True)
    with open(os.path.join(site, "torch", "version.py"), "w") as fh:
        fh.write(VERSION_PY.format(v=version, c=cuda))
    return site


def _checks(report) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in report.findings:
        out.setdefault(f.check, []).append(f)
    return out


def _verify(site, tmp_path, **kw):
    return verify(env=site, cache_dir=str(tmp_path / "cache"), host_checks=False, **kw)


def test_clean_metadata_has_no_findings(tmp_path):
    site = _site(tmp_path)
    _dist(site, "torch", "2.9.1", ["nvidia-cuda-runtime==13.0.48; platform_system == 'Linux'"])
    _dist(site, "nvidia-cuda-runtime", "13.0.48")
    assert _verify(site, tmp_path).findings == []


def test_torch_variant_cpu_and_dist(tmp_path):
    site = _site(tmp_path, version="2.9.1+cu128", cuda="'12.8'")
    _dist(site, "torch", "2.9.0")
    found = _checks(_verify(site, tmp_path))
    assert found["torch-variant"][0].message == (
        "torch is 2.9.1+cu128 (CUDA 12.8); expected 2.9.1+cu130"
    )
    assert "torch dist-info says 2.9.0 but torch/version.py says 2.9.1+cu128" in (
        found["torch-dist-version"][0].message
    )
    site = _site(tmp_path / "cpu", version="2.9.1+cpu", cuda="None")
    found = _checks(_verify(site, tmp_path))
    assert found["torch-cpu-only"][0].message == "torch 2.9.1+cpu is a CPU-only build"


def test_cuda_wheel_pins_and_cuda12_wheels(tmp_path):
    site = _site(tmp_path)
    _dist(
        site,
        "torch",
        "2.9.1",
        [
            "nvidia-cuda-runtime==13.0.48; platform_system == 'Linux'",
            "nvidia-cublas==13.0.0.19; platform_system == 'Windows'",
        ],
    )
    _dist(site, "nvidia-cuda-runtime", "13.0.40")
    _dist(site, "nvidia-cublas", "12.0")  # marker false: not required here
    _dist(site, "nvidia-cublas-cu12", "12.8.4.1", record=["nvidia/cublas/lib/libcublas.so.12"])
    env = {"LD_LIBRARY_PATH": os.path.join(site, "nvidia", "cublas", "lib")}
    found = _checks(_verify(site, tmp_path, environ=env))
    assert [f.message for f in found["cuda-wheel-pin"]] == [
        "torch requires nvidia-cuda-runtime==13.0.48 but nvidia-cuda-runtime 13.0.40 is installed"
    ]
    assert "LD_LIBRARY_PATH" in found["cuda12-wheel-on-path"][0].message
    found = _checks(_verify(site, tmp_path, environ={}))
    assert found["cuda12-wheel"][0].message == (
        "CUDA-12 wheel nvidia-cublas-cu12 is installed in a CUDA-13 environment"
    )


def test_sgl_kernel_owner_pin_loader_and_cuda_python(tmp_path):
    site = _site(tmp_path, extras={"sgl_kernel/load_utils.py": b"candidate = 'libcudart.so.12'\n"})
    _dist(site, "sgl-kernel", "0.3.20+cu130", record=["sgl_kernel/__init__.py"])
    _dist(site, "sglang-kernel", "0.4.10", record=["sgl_kernel/__init__.py"])
    _dist(site, "sglang", "0.5.9", ["sgl-kernel==0.3.21", "cuda-python==12.9"])
    found = _checks(_verify(site, tmp_path))
    assert found["sgl-kernel-owner"][0].message == (
        "both sgl-kernel 0.3.20+cu130 and sglang-kernel 0.4.10 install sgl_kernel/ — uninstall one"
    )
    assert found["sgl-kernel-pin"][0].message == (
        "sglang 0.5.9 requires sgl-kernel==0.3.21, found 0.3.20+cu130"
    )
    assert found["loader-hardcode"][0].file == "sgl_kernel/load_utils.py"
    assert found["cuda-python"][0].message == (
        "sglang pins cuda-python==12.9 (CUDA 12 bindings) in a CUDA 13 environment"
    )


def test_flashinfer_trio_and_jit_toolchain(tmp_path):
    site = _site(tmp_path)
    _dist(site, "flashinfer-python", "0.6.3")
    _dist(site, "flashinfer-cubin", "0.6.2")
    _dist(site, "flashinfer-jit-cache", "0.6.3+cu128")
    home = tmp_path / "cuda-12.8"
    home.mkdir()
    (home / "version.json").write_text(json.dumps({"cuda": {"version": "12.8.1"}}))
    env = {"CUDA_HOME": str(home), "FLASHINFER_CUDA_ARCH_LIST": "9.0a 10.0a"}
    found = _checks(_verify(site, tmp_path, environ=env))
    assert found["flashinfer-cubin"][0].message == (
        "flashinfer-cubin version (0.6.2) does not match flashinfer version (0.6.3)"
    )
    assert found["flashinfer-jit-cache"][0].message == (
        "flashinfer-jit-cache 0.6.3+cu128 is built for cu128 but torch is cu130"
    )
    assert found["jit-nvcc"][0].message.startswith("flashinfer will JIT with nvcc 12.8.1")
    assert found["jit-arch-list"][0].message.startswith("FLASHINFER_CUDA_ARCH_LIST lacks 12.0a")


def test_torch_arch_list(tmp_path):
    lib = builders.string_library("libtorch_python.so", "sm_80 sm_86 sm_90 compute_90")
    site = _site(tmp_path, extras={"torch/lib/libtorch_python.so": lib})
    assert "torch-archs" not in _checks(_verify(site, tmp_path, gpus=["9.0"]))
    found = _checks(_verify(site, tmp_path, gpus=["8.9"]))  # compute_90 PTX cannot JIT down
    assert "torch-archs" not in found  # sm_86 runs on 8.9
    found = _checks(_verify(site, tmp_path, gpus=["7.5"]))
    assert found["torch-archs"][0].message == (
        "NVIDIA GPU with CUDA capability sm_75 is not compatible with the current PyTorch "
        "installation (supports sm_80 sm_86 sm_90 compute_90)"
    )


def test_one_runtime(tmp_path):
    rt12 = builders.stub_library("libcudart.so.12", ("cudaMalloc",))
    rt13 = builders.stub_library("libcudart.so.13", ("cudaMalloc",))
    ext = builders.linking("two-runtimes", [rt12, rt13])
    site = _site(
        tmp_path,
        extras={
            "cudalibs/libcudart.so.12": rt12,
            "cudalibs/libcudart.so.13": rt13,
            "sgl_kernel/common_ops.abi3.so": ext,
        },
    )
    env = {"LD_LIBRARY_PATH": os.path.join(site, "cudalibs")}
    found = _checks(_verify(site, tmp_path, environ=env))
    assert found["one-runtime"][0].message.startswith(
        "process would load both libcudart.so.12 and libcudart.so.13"
    )


def test_driver(tmp_path, monkeypatch):
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Thu Jan 1 2025\n")
    driver = detect_driver(str(proc), ld_cache={})
    assert driver.version == "570.86.15" and driver.cuda == (12, 8)
    monkeypatch.setattr("patchkit.abi.detect_driver", lambda: driver)
    site = _site(tmp_path)
    report = verify(env=site, cache_dir=str(tmp_path / "cache"), host_checks=True)
    (f,) = _checks(report)["driver"]
    assert f.message.startswith(
        "NVIDIA driver 570.86.15 supports CUDA 12.8; CUDA 13 wheels need driver >= 580.65.06"
    )
    monkeypatch.setattr("patchkit.abi.detect_driver", lambda: DriverInfo(None))
    report = verify(env=site, cache_dir=str(tmp_path / "cache"), host_checks=True)
    assert [f.check for f in report.findings] == ["driver-missing"]


def test_ptx_isa_newer_than_driver(tmp_path, monkeypatch):
    if builders.nvcc() is None:
        pytest.skip("needs nvcc")
    obj = builders.cuda_object("compute_120")
    site = _site(tmp_path, extras={"sgl_kernel/common_ops.abi3.so": obj})
    monkeypatch.setattr("patchkit.abi.detect_driver", lambda: DriverInfo("570.86.15"))
    report = verify(env=site, cache_dir=str(tmp_path / "cache"), host_checks=True)
    (f,) = _checks(report)["ptx-isa"]
    assert f.message == "1 kernels for sm_120 exist only as PTX 9.0; driver 570.86.15 cannot JIT it"
    monkeypatch.setattr("patchkit.abi.detect_driver", lambda: DriverInfo("580.65.06"))
    found = _checks(verify(env=site, cache_dir=str(tmp_path / "cache"), host_checks=True))
    assert "ptx-isa" not in found and "arch-jit" in found


def test_device_toolkit_mismatch():
    elf = ElfInfo("x.so", "62", None, ["libcudart.so.13"], [], [], frozenset(), ())
    rep = FileReport(
        "sgl_kernel/x.so", "x.so", elf=elf, fatbins=[Fatbin(0, 0, [], 1, True, 1, "12.8")]
    )
    ctx = Context(
        tree=Tree("env", "/"),
        reports={},
        profile=load_profile("cu130-sm120"),
        targets=[CC(12, 0)],
        cache=None,
    )
    check_device_toolkit(ctx, {"sgl_kernel/x.so": rep})
    assert [f.message for f in ctx.findings] == [
        "device code built by CUDA 12.8 while host links CUDA 13"
    ]
