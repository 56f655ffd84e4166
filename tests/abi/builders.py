"""Real binaries for the verify tests: gcc-built torch extensions, nvcc-built CUDA objects.

Everything is compiled once and cached under ``tests/artifacts/abi`` (or
``$PATCHKIT_TEST_ARTIFACTS``), keyed by a hash of the source and the command line.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ARTIFACTS = os.environ.get("PATCHKIT_TEST_ARTIFACTS") or os.path.join(
    REPO, "tests", "artifacts", "abi"
)


def torch_dir() -> str | None:
    """The installed torch package folder (the repository's .venv, else this interpreter's)."""
    for site in (
        *glob.glob(os.path.join(REPO, ".venv", "lib", "python3*", "site-packages")),
        sysconfig.get_paths()["purelib"],
    ):
        path = os.path.join(site, "torch")
        if os.path.exists(os.path.join(path, "lib", "libc10.so")) and os.path.exists(
            os.path.join(path, "version.py")
        ):
            return path
    return None


def _cached(name: str, key: str, build) -> str:
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    out = os.path.join(ARTIFACTS, f"{name}-{digest}.so")
    if not os.path.exists(out):
        os.makedirs(ARTIFACTS, exist_ok=True)
        tmp = out + f".{os.getpid()}.tmp"
        build(tmp)
        os.replace(tmp, out)
    return out


def _run(cmd: list[str], cwd: str | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")


# A torch extension that calls into libc10 by declaration, so it compiles in a second.
EXT_SOURCE = r"""
#include <string>
namespace c10 {
namespace detail {
[[noreturn]] void torchCheckFail(const char*, const char*, unsigned int, const std::string&);
}
struct TensorImpl {
  void release_resources();
#ifdef MISSING_SYMBOL
  void decref_pyobject() const;
#endif
};
}
extern "C" int ext_entry(c10::TensorImpl* t, int fail) {
  if (fail) c10::detail::torchCheckFail("f", "file", 1, std::string("boom"));
  t->release_resources();
#ifdef MISSING_SYMBOL
  t->decref_pyobject();
#endif
  return 0;
}
"""


def torch_extension(variant: str = "ok") -> str:
    """A shared object NEEDing libc10.so; ``variant``: ok, missing (absent symbol), abi0."""
    tdir = torch_dir()
    if tdir is None or shutil.which("g++") is None:
        raise FileNotFoundError("g++ or torch")
    flags = {
        "ok": ["-D_GLIBCXX_USE_CXX11_ABI=1"],
        "missing": ["-D_GLIBCXX_USE_CXX11_ABI=1", "-DMISSING_SYMBOL"],
        "abi0": ["-D_GLIBCXX_USE_CXX11_ABI=0"],
    }[variant]

    def build(out: str) -> None:
        src = out + ".cpp"
        with open(src, "w") as fh:
            fh.write(EXT_SOURCE)
        _run(
            [
                "g++",
                "-shared",
                "-fPIC",
                "-O1",
                *flags,
                src,
                "-o",
                out,
                f"-L{tdir}/lib",
                "-lc10",
                "-Wl,--no-as-needed",
            ]
        )
        os.unlink(src)

    return _cached(f"ext-{variant}", EXT_SOURCE + " ".join(flags), build)


# A stand-in for the profile's torch 2.9.1 (C++11 ABI): a libc10.so exporting what EXT_SOURCE
# calls but c10::TensorImpl::decref_pyobject, which a newer torch added.
FAKE_C10_SOURCE = r"""
#include <string>
namespace c10 {
namespace detail {
[[noreturn]] void torchCheckFail(const char*, const char*, unsigned int, const std::string&) {
  __builtin_trap();
}
}
struct TensorImpl {
  void release_resources();
};
void TensorImpl::release_resources() {}
}
"""

# A torch extension built against a newer torch (it calls c10::TensorImpl::decref_pyobject),
# and, with OTHER_LIBRARY, into a library of its own.
NEWER_TORCH_SOURCE = r"""
#include <string>
namespace c10 {
namespace detail {
[[noreturn]] void torchCheckFail(const char*, const char*, unsigned int, const std::string&);
}
struct TensorImpl {
  void release_resources();
  void decref_pyobject() const;
};
}
extern "C" int pk_one(void);
extern "C" int ext_entry(c10::TensorImpl* t, int fail) {
  if (fail) c10::detail::torchCheckFail("f", "file", 1, std::string("boom"));
  t->release_resources();
  t->decref_pyobject();
#ifdef OTHER_LIBRARY
  return pk_one();
#else
  return 0;
#endif
}
"""


def _gxx(name: str, source: str, flags: list[str], libs: list[str] = ()) -> str:
    """A shared object g++ builds from ``source`` with ``flags``, NEEDing each of ``libs``."""
    if shutil.which("g++") is None:
        raise FileNotFoundError("g++")
    links = [
        arg for lib in libs for arg in (f"-L{os.path.dirname(lib)}", f"-l:{os.path.basename(lib)}")
    ]

    def build(out: str) -> None:
        src = out + ".cpp"
        with open(src, "w") as fh:
            fh.write(source)
        _run(
            ["g++", "-shared", "-fPIC", "-O1", *flags, src, "-o", out, "-Wl,--no-as-needed", *links]
        )
        os.unlink(src)

    return _cached(name, source + " ".join(flags) + "|".join(libs), build)


# An extension built for torch 2.14: c10d::Backend::decref_pyobject (C++) and
# torch_delete_generator (the stable C shim) came with 2.14, torch_call_dispatcher and
# aoti_torch_abi_version are 2.11's too; pk_one is its own library's.
TORCH_214_SOURCE = r"""
namespace c10d {
struct Backend {
  void decref_pyobject() const;
};
}
extern "C" int torch_delete_generator(void*);
extern "C" int torch_call_dispatcher(const char*, const char*, void*, unsigned long);
extern "C" long aoti_torch_abi_version(void);
extern "C" int pk_one(void);
extern "C" int ext_entry(c10d::Backend* b) {
  b->decref_pyobject();
  torch_call_dispatcher("aten::add", "Tensor", nullptr, 0);
  return torch_delete_generator(nullptr) + (int)aoti_torch_abi_version() + pk_one();
}
"""


def torch_214_extension() -> str:
    """TORCH_214_SOURCE, NEEDing libc10.so, libtorch_cpu.so (SONAMEs of stand-ins, as a real
    build against torch links them) and libpk_other.so.1, which no wheel ships."""
    libs = [
        stub_library("libc10.so"),
        stub_library("libtorch_cpu.so"),
        stub_library("libpk_other.so.1", ("pk_one",)),
    ]
    return _gxx("torch-214-ext", TORCH_214_SOURCE, ["-D_GLIBCXX_USE_CXX11_ABI=1"], libs)


def shim_caller_without_libtorch() -> str:
    """An extension calling torch's shim (aoti_torch_abi_version, in libtorch_cpu.so) that
    NEEDs libc10.so only: the function is torch's, but not in the object's scope."""
    source = 'extern "C" long aoti_torch_abi_version(void);\n'
    source += 'extern "C" long ext_entry(void) { return aoti_torch_abi_version(); }\n'
    return _gxx("shim-no-libtorch", source, [], [stub_library("libc10.so")])


def shim_caller_linking_nothing() -> str:
    """An extension calling torch's shim (aoti_torch_abi_version) that NEEDs no torch library
    at all: built to bind it from the global scope (cuda-core's tensor bridge is)."""
    source = 'extern "C" long aoti_torch_abi_version(void);\n'
    source += 'extern "C" long ext_entry(void) { return aoti_torch_abi_version(); }\n'
    return _gxx("shim-links-nothing", source, [])


# at::_ops::add_Tensor::call, which libtorch_cpu.so exports (in either ABI: it names no string)
ADD_TENSOR = "_ZN2at4_ops10add_Tensor4callERKNS_6TensorES4_RKN3c106ScalarE"


def cxx_caller_without_libtorch() -> str:
    """An extension calling a C++ function of torch's (at::_ops::add_Tensor::call, in
    libtorch_cpu.so) that NEEDs libc10.so only: torch's, but not in the object's scope."""
    source = f'extern "C" long pk_add(void) __asm__("{ADD_TENSOR}");\n'
    source += 'extern "C" long ext_entry(void) { return pk_add(); }\n'
    return _gxx("cxx-no-libtorch", source, [], [stub_library("libc10.so")])


def fake_c10(abi: int = 1) -> str:
    """FAKE_C10_SOURCE as ``libc10.so`` (SONAME too), built with _GLIBCXX_USE_CXX11_ABI=``abi``."""
    flags = [f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-Wl,-soname,libc10.so"]
    return _gxx(f"fake-c10-abi{abi}", FAKE_C10_SOURCE, flags)


def newer_torch_extension(abi: int = 1, other: str | None = None) -> str:
    """An extension built against a torch newer than fake_c10's (it calls
    c10::TensorImpl::decref_pyobject), with _GLIBCXX_USE_CXX11_ABI=``abi``, NEEDing
    ``libc10.so`` and, given ``other`` (a stub_library exporting ``pk_one``), that library."""
    flags = [f"-D_GLIBCXX_USE_CXX11_ABI={abi}"] + (["-DOTHER_LIBRARY"] if other else [])
    libs = [fake_c10()] + ([other] if other else [])
    return _gxx(f"newer-torch-abi{abi}", NEWER_TORCH_SOURCE, flags, libs)


def fake_torch_wheel(
    folder: str, version: str = "2.9.1+cu130", cuda: str = "13.0", abi: int = 1
) -> str:
    """A torch wheel of the profile's version: ``torch/version.py``, ``torch/lib/libc10.so``
    (fake_c10 of ``abi``) and ``torch/_C`` NEEDing it through RPATH ``$ORIGIN/lib``, which is
    how `import torch` makes libc10.so loaded for every extension."""
    c10 = fake_c10(abi)
    torch_c = linking(f"fake-torch-C-abi{abi}", [c10], rpath="$ORIGIN/lib")
    members = {
        "torch/version.py": f"__version__ = '{version}'\ncuda: Optional[str] = '{cuda}'\n".encode(),
        "torch/lib/libc10.so": open(c10, "rb").read(),
        "torch/_C.cpython-311-x86_64-linux-gnu.so": open(torch_c, "rb").read(),
    }
    name = f"torch-{version}-cp311-cp311-manylinux_2_28_x86_64.whl"
    return make_wheel(folder, name, members)


def stub_library(soname: str, symbols: tuple[str, ...] = ()) -> str:
    """An empty library with a given SONAME (e.g. a fake libcudart.so.13) defining ``symbols``."""
    if shutil.which("gcc") is None:
        raise FileNotFoundError("gcc")
    source = "".join(f"int {s}(void) {{ return 0; }}\n" for s in symbols) or "int stub_marker;\n"

    def build(out: str) -> None:
        src = out + ".c"
        with open(src, "w") as fh:
            fh.write(source)
        _run(["gcc", "-shared", "-fPIC", src, "-o", out, f"-Wl,-soname,{soname}"])
        os.unlink(src)

    return _cached(f"stub-{soname}", source + soname, build)


def string_library(soname: str, text: str) -> str:
    """A library with SONAME ``soname`` whose read-only data holds ``text``."""
    if shutil.which("gcc") is None:
        raise FileNotFoundError("gcc")
    source = f'const char pk_text[] = "{text}";\n'

    def build(out: str) -> None:
        src = out + ".c"
        with open(src, "w") as fh:
            fh.write(source)
        _run(["gcc", "-shared", "-fPIC", src, "-o", out, f"-Wl,-soname,{soname}"])
        os.unlink(src)

    return _cached(f"text-{soname}", source + soname, build)


def linking(name: str, libs: list[str], call: str = "", rpath: str = "", runpath: str = "") -> str:
    """A library NEEDing each of ``libs`` (paths), optionally calling ``call``, with an
    optional DT_RPATH or DT_RUNPATH."""
    source = (
        f"extern int {call}(void);\nint entry(void) {{ return {call}(); }}\n"
        if call
        else "int entry(void){return 0;}\n"
    )

    def build(out: str) -> None:
        src = out + ".c"
        with open(src, "w") as fh:
            fh.write(source)
        cmd = ["gcc", "-shared", "-fPIC", src, "-o", out, "-Wl,--no-as-needed"]
        for lib in libs:
            cmd += [f"-L{os.path.dirname(lib)}", f"-l:{os.path.basename(lib)}"]
        if rpath:
            cmd += [f"-Wl,-rpath,{rpath}", "-Wl,--disable-new-dtags"]
        if runpath:
            cmd += [f"-Wl,-rpath,{runpath}", "-Wl,--enable-new-dtags"]
        _run(cmd)
        os.unlink(src)

    key = source + "|".join(libs) + (f"|rpath={rpath}" if rpath else "")
    key += f"|runpath={runpath}" if runpath else ""
    return _cached(f"link-{name}", key, build)


CUDA_SOURCE = r"""
#include <cuda_runtime.h>
extern "C" __global__ void pk_add_one(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}
// Returns the cudaError_t of a launch of pk_add_one on n floats (209 = no kernel image).
extern "C" int pk_launch(int n) {
  float* d = nullptr;
  cudaError_t err = cudaMalloc(&d, n * sizeof(float));
  if (err != cudaSuccess) return (int)err;
  cudaMemset(d, 0, n * sizeof(float));
  pk_add_one<<<(n + 127) / 128, 128>>>(d, n);
  err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  float h = 0;
  if (err == cudaSuccess) err = cudaMemcpy(&h, d, sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (err == cudaSuccess && h != 1.0f) return -1;
  return (int)err;
}
"""

# name -> nvcc code-generation flags
CUDA_VARIANTS = {
    "sm_90": ["-gencode", "arch=compute_90,code=sm_90"],
    "sm_90a": ["-gencode", "arch=compute_90a,code=sm_90a"],
    "sm_120": ["-gencode", "arch=compute_120,code=sm_120"],
    "sm_120a": ["-gencode", "arch=compute_120a,code=sm_120a"],
    "sm_120f": ["-gencode", "arch=compute_120f,code=sm_120f"],
    "compute_120": ["-gencode", "arch=compute_120,code=compute_120"],
    "compute_90": ["-gencode", "arch=compute_90,code=compute_90"],
    "sm_120+compute_120": ["-gencode", "arch=compute_120,code=[sm_120,compute_120]"],
    "sm_90-zstd": ["-gencode", "arch=compute_90,code=sm_90", "-Xfatbin", "-compress-all"],
    "sm_120a-zstd": ["-gencode", "arch=compute_120a,code=sm_120a", "-Xfatbin", "-compress-all"],
    "sm_100f+compute_80": [
        "-gencode",
        "arch=compute_100f,code=sm_100f",
        "-gencode",
        "arch=compute_80,code=compute_80",
    ],
    "sm_86+sm_89": [
        "-gencode",
        "arch=compute_86,code=sm_86",
        "-gencode",
        "arch=compute_89,code=sm_89",
    ],
}

# Expected launch verdicts (CUDA 13 rules) for targets 9.0, 12.0, 12.1.
EXPECTED = {
    "sm_90": ("sass", "none", "none"),
    "sm_90a": ("sass", "none", "none"),
    "sm_120": ("none", "sass", "sass"),
    "sm_120a": ("none", "sass", "none"),
    "sm_120f": ("none", "sass", "sass"),
    "compute_120": ("none", "jit", "jit"),
    "compute_90": ("jit", "jit", "jit"),
    "sm_120+compute_120": ("none", "sass", "sass"),
    "sm_90-zstd": ("sass", "none", "none"),
    "sm_120a-zstd": ("none", "sass", "none"),
    "sm_100f+compute_80": ("jit", "jit", "jit"),
    "sm_86+sm_89": ("none", "none", "none"),
}


def nvcc() -> str | None:
    return shutil.which("nvcc")


def cuda_object(variant: str, nvcc_path: str | None = None) -> str:
    """A CUDA shared object built for one of CUDA_VARIANTS."""
    tool = nvcc_path or nvcc()
    if tool is None:
        raise FileNotFoundError("nvcc")
    flags = CUDA_VARIANTS[variant]

    def build(out: str) -> None:
        src = out + ".cu"
        with open(src, "w") as fh:
            fh.write(CUDA_SOURCE)
        _run([tool, "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared", *flags, src, "-o", out])
        os.unlink(src)

    return _cached(f"cuda-{variant.replace('+', '_')}", CUDA_SOURCE + " ".join(flags), build)


def make_site(root: str, torch_dir: str | None, extras: dict[str, str] | None = None) -> str:
    """A site-packages folder: torch's libraries linked in (not copied) plus ``extras``."""
    site = os.path.join(root, "site-packages")
    os.makedirs(site, exist_ok=True)
    if torch_dir:
        real_site = os.path.dirname(torch_dir)
        os.makedirs(os.path.join(site, "torch", "lib"), exist_ok=True)
        shutil.copy(
            os.path.join(torch_dir, "version.py"), os.path.join(site, "torch", "version.py")
        )
        for lib in glob.glob(os.path.join(torch_dir, "lib", "*.so*")):
            os.symlink(lib, os.path.join(site, "torch", "lib", os.path.basename(lib)))
        for lib in glob.glob(os.path.join(torch_dir, "_C*.so")):
            os.symlink(lib, os.path.join(site, "torch", os.path.basename(lib)))
        for lib in glob.glob(os.path.join(real_site, "nvidia", "*", "lib", "*.so*")):
            rel = os.path.relpath(lib, real_site)
            os.makedirs(os.path.join(site, os.path.dirname(rel)), exist_ok=True)
            os.symlink(lib, os.path.join(site, rel))
    for rel, src in (extras or {}).items():
        dst = os.path.join(site, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if isinstance(src, bytes):
            with open(dst, "wb") as fh:
                fh.write(src)
        else:
            shutil.copy(src, dst)
    return site


# ---------------------------------------------------------------- wheels and raw device code


def make_wheel(folder: str, filename: str, members: dict[str, bytes], requires=()) -> str:
    """A wheel pip would accept (METADATA, WHEEL, RECORD) holding ``members``."""
    import zipfile

    name, version = filename.split("-")[:2]
    path = os.path.join(folder, filename)
    info = f"{name}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, data in members.items():
            zf.writestr(arc, data)
        zf.writestr(f"{info}/METADATA", "\n".join(meta) + "\n\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n")
        zf.writestr(f"{info}/RECORD", "".join(f"{a},,\n" for a in members))
    return path


# A library calling logf: glibc 2.27 gave logf a new version, so it needs logf@GLIBC_2.27.
LOGF_SOURCE = "#include <math.h>\nfloat pk_log(float x) { return logf(x); }\n"


def logf_library() -> str:
    """A shared object whose only GLIBC_2.27 need comes from libm (logf), not from libc."""
    if shutil.which("gcc") is None:
        raise FileNotFoundError("gcc")

    def build(out: str) -> None:
        src = out + ".c"
        with open(src, "w") as fh:
            fh.write(LOGF_SOURCE)
        _run(["gcc", "-shared", "-fPIC", "-O1", src, "-o", out, "-lm", "-Wl,-soname,libpklog.so"])
        os.unlink(src)

    return _cached("logf", LOGF_SOURCE, build)


KERNEL_SOURCE = 'extern "C" __global__ void pk_kernel(float* x) { x[threadIdx.x] += 1.0f; }\n'


def device_code(kind: str, arch: str) -> str:
    """A raw ``.cubin`` (``sm_120a``), ``.fatbin`` or ``.ptx`` (``compute_120``) made by nvcc."""
    tool = nvcc()
    if tool is None:
        raise FileNotFoundError("nvcc")
    suffix = {"cubin": ".cubin", "fatbin": ".fatbin", "ptx": ".ptx"}[kind]
    virtual = "compute_" + arch.split("_", 1)[1]
    flags = {
        "cubin": ["-cubin", f"-arch={arch}"],
        "fatbin": ["-fatbin", "-gencode", f"arch={virtual},code={arch}"],
        "ptx": ["-ptx", f"-arch={virtual}"],
    }[kind]

    def build(out: str) -> None:
        src = out + ".cu"
        with open(src, "w") as fh:
            fh.write(KERNEL_SOURCE)
        _run([tool, *flags, src, "-o", out])
        os.unlink(src)

    path = _cached(f"dev-{kind}-{arch}", KERNEL_SOURCE + " ".join(flags), build)
    named = path[: -len(".so")] + suffix
    if not os.path.exists(named):
        shutil.copy(path, named)
    return named


WHEELS = os.environ.get("PATCHKIT_TEST_WHEELS") or os.path.join(
    os.path.dirname(ARTIFACTS), "wheels"
)


def real_wheelhouse(dest: Path, spec: str, pattern: str) -> Path:
    """A wheelhouse at ``dest`` holding one real wheel from the package index (a link to the
    test wheel cache's copy), returned; the test is skipped when the index cannot be
    reached."""
    import pytest

    wheel = real_wheel(spec, pattern)
    if wheel is None:
        pytest.skip(f"cannot download {spec}")
    dest.mkdir()
    linked = dest / os.path.basename(wheel)
    os.symlink(os.path.realpath(wheel), linked)
    return linked


def real_wheel(spec: str, pattern: str) -> str | None:
    """A wheel from the package index, downloaded once into the test wheel cache (None if the
    index cannot be reached)."""
    import sys

    found = sorted(glob.glob(os.path.join(WHEELS, pattern)))
    # the payload venvs' wheels (`make test-venvs`): torch among them
    found += sorted(glob.glob(os.path.join(REPO, ".cache", "wheels", "*", pattern)))
    if found:
        return found[0]
    os.makedirs(WHEELS, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    proc = subprocess.run([*cmd, "-d", WHEELS, spec], capture_output=True, timeout=900)
    found = sorted(glob.glob(os.path.join(WHEELS, pattern)))
    return found[0] if proc.returncode == 0 and found else None


def findings_by_check(report) -> dict[str, list]:
    """A verify report's findings grouped by check id."""
    out: dict[str, list] = {}
    for f in report.findings:
        out.setdefault(f.check, []).append(f)
    return out


def nm_names(args: list[str], path: str) -> set[str]:
    """`nm -D ARGS PATH`'s symbol names, version suffixes dropped (the tests' oracle)."""
    out = subprocess.run(["nm", "-D", *args, path], capture_output=True, text=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
