"""The cases where verify used to say nothing, or something that depended on the machine it ran
on: each on real wheels from the package index (cached) or on small ELF / CUDA files compiled
here, cross-checked with readelf, nm and cuobjdump where those can say the same thing."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import zipfile

import pytest
from helpers import result_of

from patchkit.abi import verify
from patchkit.abi.archs import CC
from patchkit.abi.scan import analyze_file
from patchkit.cli import main
from tests.abi import builders

pytest_plugins = ["tests.abi.fixtures"]

REPO = builders.REPO


_checks = builders.findings_by_check
_nm = builders.nm_names


def _need_gcc():
    if shutil.which("gcc") is None or shutil.which("g++") is None:
        pytest.skip("needs gcc/g++")


# ---------------------------------------------------------------- torch ABI: the profile's torch


def test_one_wheel_checked_against_the_profiles_torch(tmp_path, torch_dir):
    """A kernel wheel built against a torch that has c10::TensorImpl::decref_pyobject (2.10+)
    fails against the profile's torch 2.9.1 even with no torch in the wheelhouse."""
    _need_gcc()
    house = tmp_path / "house"
    house.mkdir()
    bad = builders.torch_extension("missing")
    good = builders.torch_extension("ok")
    builders.make_wheel(
        str(house),
        "newtorch_ext-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        {"newtorch_ext/_C.so": open(bad, "rb").read()},
    )
    report = verify(wheelhouse=str(house), cache_dir=str(tmp_path / "c"))
    found = _checks(report)
    (f,) = found["undefined-symbol-profile"]
    assert f.severity == "error"
    assert "_ZNK3c1010TensorImpl15decref_pyobjectEv" in f.message
    assert "torch 2.9.1" in f.hint and "sha256" in f.hint
    assert [n.check for n in found["torch-from-profile"]] == ["torch-from-profile"]
    # Independently: nm says the symbol is undefined in the object and defined by no library
    # of the installed torch 2.9.1 (the same wheel the profile's symbol set was read from).
    assert "_ZNK3c1010TensorImpl15decref_pyobjectEv" in _nm(["--undefined-only"], bad)
    defined = set()
    for lib in ("libc10.so", "libtorch_cpu.so", "libc10_cuda.so"):
        defined |= _nm(["--defined-only"], f"{torch_dir}/lib/{lib}")
    assert "_ZNK3c1010TensorImpl15decref_pyobjectEv" not in defined
    # The extension built against this torch passes.
    (house / "newtorch_ext-1.0-cp311-cp311-manylinux_2_28_x86_64.whl").unlink()
    builders.make_wheel(
        str(house),
        "oldtorch_ext-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        {"oldtorch_ext/_C.so": open(good, "rb").read()},
    )
    report = verify(wheelhouse=str(house), cache_dir=str(tmp_path / "c"))
    assert report.errors == 0, [f.line() for f in report.findings]


def test_profile_symbol_set_is_the_real_torch(torch_dir):
    """The shipped symbol set equals what the installed torch 2.9.1 (from PyPI) exports."""
    from patchkit.abi import torchsyms
    from patchkit.abi.elf import read_elf
    from patchkit.abi.profiles import load_profile

    prof = load_profile("cu130-sm120")
    doc = torchsyms.load(prof.data_file(prof.torch_symbols))
    assert doc["torch"].startswith("2.9.1") and re.fullmatch(r"[0-9a-f]{64}", doc["sha256"])
    with open(os.path.join(torch_dir, "version.py")) as fh:
        if "2.9.1" not in fh.read():
            pytest.skip("the installed torch is not 2.9.1")
    for lib in ("libc10.so", "libc10_cuda.so", "libtorch_python.so"):
        have = read_elf(os.path.join(torch_dir, "lib", lib))
        entry = doc["libraries"][f"torch/lib/{lib}"]
        assert set(entry["defined"]) == set(have.defined), lib
        assert entry["soname"] == have.soname


@pytest.mark.slow
def test_real_kernel_wheel_built_for_newer_torch(tmp_path, cache_dir, torch_dir):
    """sglang-kernel 0.4.2.post2 from PyPI, alone in a wheelhouse: its torch symbols are not all
    in torch 2.9.1; its CUDA 13 libraries come from wheels not present (notes, not errors)."""
    wheel = builders.real_wheel(
        "sglang-kernel==0.4.2.post2", "sglang_kernel-0.4.2.post2-cp310-abi3-*.whl"
    )
    if wheel is None:
        pytest.skip("cannot download sglang-kernel 0.4.2.post2")
    house = os.path.join(os.path.dirname(cache_dir), "house-sgk")
    os.makedirs(house, exist_ok=True)
    link = os.path.join(house, os.path.basename(wheel))
    if not os.path.exists(link):
        os.symlink(os.path.realpath(wheel), link)
    report = verify(wheelhouse=house, cache_dir=cache_dir)
    found = _checks(report)
    (undef,) = found["undefined-symbol-profile"]  # one finding for the wheel, symbols as evidence
    assert undef.file == os.path.basename(wheel)
    symbols = {e.split(": ", 1)[1].split(" ", 1)[0] for e in undef.evidence}
    assert "_ZNK3c1010TensorImpl15incref_pyobjectEv" in symbols
    # Independently, for one object: nm's undefined torch symbols that none of the installed
    # torch 2.9.1's libraries defines are exactly the evidence verify gives for it.
    member = "sgl_kernel/sm90/common_ops.abi3.so"
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(member, tmp_path)
    undefined = _nm(["--undefined-only"], str(tmp_path / member))
    defined = set()
    for lib in (
        "libc10.so",
        "libc10_cuda.so",
        "libtorch.so",
        "libtorch_cpu.so",
        "libtorch_cuda.so",
    ):
        defined |= _nm(["--defined-only"], f"{torch_dir}/lib/{lib}")
    torch_prefixes = ("_ZN3c10", "_ZNK3c10", "_ZN2at", "_ZNK2at", "_ZN5torch", "_ZNK5torch")
    expected = {u for u in undefined if u.startswith(torch_prefixes)} - defined
    ours = {
        e.split(": ", 1)[1].split(" ", 1)[0]
        for e in undef.evidence
        if e.split(": ")[0].endswith(member)
    }
    assert expected and ours == expected
    # Every ELF object is checked, whatever its name: the mscclpp libraries under lib/ and
    # _mscclpp*.so appear among those needing the CUDA runtime from another wheel.
    notes = {f.message.split(":")[0]: f for f in found["needed-elsewhere"]}
    cudart = notes["libcudart.so.13"]
    assert cudart.severity == "note" and "provided by nvidia-cuda-runtime" in cudart.message
    users = {e.split(": ")[0].split("!", 1)[1] for e in cudart.evidence}
    assert {"lib/mscclpp.so.0.6.0", "lib/mscclpp_nccl.so", "sgl_kernel/spatial_ops.abi3.so"} <= (
        users
    )
    assert any(u.startswith("_mscclpp.") for u in users)
    assert "needed-missing" not in found
    # CUDA 13 build: no CUDA-major finding; FA3 has no sm_120 image (optional: a warning).
    assert "cuda-major" not in found
    fa3 = [f for f in found["arch-coverage-optional"] if f.file.endswith("flash_ops.abi3.so")]
    assert fa3 and "sm_80 sm_86 sm_90a" in fa3[0].message


# ---------------------------------------------------------------- Requires-Dist on torch


def _one_object() -> bytes:
    """A real ELF object for a wheel or an environment to hold, so the run checks something."""
    return open(builders.stub_library("libpkdemo.so", ("pk_demo",)), "rb").read()


def test_wheel_requiring_another_torch(tmp_path):
    """A wheel whose Requires-Dist excludes the profile's torch 2.9.1+cu130 — a pin to 2.8.0,
    to the cu128 build of 2.9.1, a range from 2.10 — is one error each, naming the wheel, the
    requirement and the profile's torch; a requirement the profile's torch meets, or one made
    only for an extra or another platform, is no finding."""
    _need_gcc()
    house = tmp_path / "house"
    house.mkdir()
    requires = {
        "pinned": ["numpy", "torch==2.8.0"],
        "cu128": ["torch==2.9.1+cu128"],
        "newer": ["torch>=2.10"],
        "range": ["torch>=2.9,<2.10"],
        "exact": ["torch==2.9.1"],
        "extra": ['torch==2.8.0; extra == "old"'],
        "windows": ['torch==2.8.0; sys_platform == "win32"'],
        "bare": ["torch"],
    }
    for name, reqs in requires.items():
        builders.make_wheel(
            str(house),
            f"{name}-1.0-py3-none-any.whl",
            {f"{name}/libpkdemo.so": _one_object()},
            reqs,
        )
    report = verify(wheelhouse=str(house), cache_dir=str(tmp_path / "c"))
    pins = {f.file.split("-")[0]: f for f in _checks(report).get("torch-pin", [])}
    assert sorted(pins) == ["cu128", "newer", "pinned"]
    assert report.errors == 3, [f.line() for f in report.findings]
    f = pins["pinned"]
    assert (f.severity, f.number, f.file) == ("error", 1, "pinned-1.0-py3-none-any.whl")
    assert f.message == (
        "pinned 1.0 requires torch==2.8.0, which the profile's torch 2.9.1+cu130 does not "
        "satisfy: pip replaces torch, or stops with ResolutionImpossible"
    )
    assert f.hint == (
        "install a pinned built for torch 2.9.1+cu130 (its Requires-Dist admitting it), or "
        "rebuild it against torch 2.9.1+cu130"
    )
    assert "requires torch==2.9.1+cu128," in pins["cu128"].message
    assert "requires torch>=2.10," in pins["newer"].message


def _dist_info(site: str, name: str, header: str, body: str = "long description\n") -> str:
    folder = os.path.join(site, f"{name}-1.0.dist-info")
    os.makedirs(folder)
    with open(os.path.join(folder, "METADATA"), "w") as fh:
        fh.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n{header}\n\n{body}")
    with open(os.path.join(folder, "RECORD"), "w") as fh:
        fh.write(f"{name}/libpkdemo.so,,\n")
    return os.path.join(folder, "METADATA")


def test_installed_dist_requiring_another_torch(tmp_path):
    """In an environment, the installed dist's METADATA: its Requires-Dist on torch comes after
    a License field of 100 kB (verify read the first 64 kB of a METADATA, so it was never
    seen) and is found."""
    _need_gcc()
    site = builders.make_site(
        str(tmp_path),
        None,
        {"kx/libpkdemo.so": builders.stub_library("libpkdemo.so", ("pk_demo",))},
    )
    license_text = "\n        ".join(
        ["Permission is hereby granted, free of charge, to any"] * 2000
    )
    _dist_info(site, "kx", f"License: {license_text}\nRequires-Dist: torch==2.8.0")
    assert os.path.getsize(os.path.join(site, "kx-1.0.dist-info", "METADATA")) > 100_000
    report = verify(env=site, cache_dir=str(tmp_path / "c"), host_checks=False)
    (f,) = _checks(report)["torch-pin"]
    assert f.file == "kx 1.0" and f.severity == "error"
    assert f.message.startswith("kx 1.0 requires torch==2.8.0, which the profile's torch 2.9.1")


def test_installed_metadata_is_read_bounded(tmp_path):
    """An installed METADATA is read to its blank line and never past 4 MiB: a header cut
    there loses its partial last line (``torch==2.9`` of ``torch==2.9.1`` is no pin); a
    METADATA that is a FIFO is skipped, not waited on forever."""
    from patchkit.abi import sources
    from patchkit.archives import MAX_METADATA_BYTES

    site = str(tmp_path / "site")
    line = "Requires-Dist: torch==2.9.1\n"
    head = "Metadata-Version: 2.1\nName: big\nVersion: 1.0\n"
    filler = MAX_METADATA_BYTES - len(head) - len("Requires-Dist: torch==2.9")
    classifiers = "Classifier: X\n" * (filler // len("Classifier: X\n"))
    classifiers += "K" * (filler - len(classifiers) - 1) + "\n"
    path = _dist_info(site, "big", classifiers + line.rstrip("\n"))
    with open(path, "rb") as fh:  # the 4 MiB end falls inside that requirement
        assert fh.read(MAX_METADATA_BYTES).endswith(b"\nRequires-Dist: torch==2.9")
    fifo = _dist_info(site, "fifo", "")
    os.unlink(fifo)
    os.mkfifo(fifo)
    done: list = []
    thread = threading.Thread(target=lambda: done.append(sources.read_env(site)), daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():  # let the blocked reader go before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert done, "read_env waited on a METADATA that is a FIFO"
    (tree,) = done
    assert sorted(tree.dists) == ["big"]
    assert tree.dists["big"].requires == []


def test_wheel_metadata_claiming_more_than_4_mib_is_refused_unread(tmp_path, monkeypatch):
    """A wheel whose METADATA claims more than 4 MiB (a crafted one may claim GiBs) is one
    invalid-archive error, refused before a byte of it is inflated; it was read whole."""
    from patchkit.abi import members as abi_members

    house = tmp_path / "house"
    house.mkdir()
    wheel = house / "fat-1.0-py3-none-any.whl"
    # hex digits deflate about 2:1: no decompression-bomb ratio, only the size claimed
    metadata = f"Name: fat\nVersion: 1.0\n\n{os.urandom(2_700_000).hex()}\n"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("fat/x.py", "")
        zf.writestr("fat-1.0.dist-info/METADATA", metadata)
        zf.writestr("fat-1.0.dist-info/RECORD", "")
    inflated: list[str] = []
    real = abi_members._pieces
    monkeypatch.setattr(
        abi_members, "_pieces", lambda m, *a, **k: inflated.append(m.relpath) or real(m, *a, **k)
    )
    report = verify(wheelhouse=str(house), cache_dir=str(tmp_path / "c"), jobs=1)
    (f,) = _checks(report)["invalid-archive"]
    assert f.file == wheel.name
    assert f.message == (
        "invalid archive: member 'fat-1.0.dist-info/METADATA' claims "
        f"{len(metadata)} bytes (limit 4194304)"
    )
    assert not [m for m in inflated if m.endswith("METADATA")]


# ---------------------------------------------------------------- torch symbols, a library missing


def test_missing_library_leaves_torch_symbols_checked(tmp_path):
    """Beside the profile's torch wheel (a stand-in compiled here: torch 2.9.1+cu130 whose
    libc10.so lacks c10::TensorImpl::decref_pyobject), an extension built for a newer torch
    that also NEEDs a library no wheel ships: the missing library is an error, the torch
    symbol is still found undefined against the torch libraries present (the check skipped
    the object), and what the missing library keeps from being checked is a note of its own."""
    _need_gcc()
    other = builders.stub_library("libpk_other.so.1", ("pk_one",))
    ext = builders.newer_torch_extension(1, other)
    c10 = builders.fake_c10()
    assert "_ZNK3c1010TensorImpl15decref_pyobjectEv" in _nm(["--undefined-only"], ext)
    assert "_ZNK3c1010TensorImpl15decref_pyobjectEv" not in _nm(["--defined-only"], c10)
    house = tmp_path / "house"
    house.mkdir()
    builders.fake_torch_wheel(str(house))
    name = "newer_ext-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    builders.make_wheel(str(house), name, {"newer_ext/_C.so": open(ext, "rb").read()})
    report = verify(wheelhouse=str(house), cache_dir=str(tmp_path / "c"))
    found = _checks(report)
    assert not {"torch-variant", "torch-from-profile", "cxx11-abi"} & set(found), found
    (missing,) = found["needed-missing"]
    assert missing.message.startswith("libpk_other.so.1: cannot open shared object file")
    (undef,) = found["undefined-symbol"]
    assert undef.file == f"{name}!newer_ext/_C.so"
    assert undef.message == (
        "undefined symbol: _ZNK3c1010TensorImpl15decref_pyobjectEv "
        "(c10::TensorImpl::decref_pyobject() const)"
    )
    (note,) = found["undefined-symbol-unchecked"]
    assert (note.severity, note.file) == ("note", f"{name}!newer_ext/_C.so")
    assert note.message == (
        "1 undefined symbol(s) not checked: libpk_other.so.1 cannot be found, and it may "
        "define them"
    )
    assert [f.check for f in report.findings if f.severity == "error"] == [
        "needed-missing",
        "undefined-symbol",
    ]
    # The same extension without that library: the same torch finding, nothing left unchecked.
    (house / name).unlink()
    alone = builders.newer_torch_extension(1)
    builders.make_wheel(str(house), name, {"newer_ext/_C.so": open(alone, "rb").read()})
    again = _checks(verify(wheelhouse=str(house), cache_dir=str(tmp_path / "c")))
    assert [f.message for f in again["undefined-symbol"]] == [undef.message]
    assert "undefined-symbol-unchecked" not in again and "needed-missing" not in again


# ---------------------------------------------------------------- ABI flag or API change


def test_abi_flag_told_from_api_change(tmp_path):
    """An extension built with _GLIBCXX_USE_CXX11_ABI=0 against a newer torch, checked against
    the profile's torch 2.9.1: c10::detail::torchCheckFail(..., std::string const&), which
    2.9.1 exports with the C++11 ABI's mangling, is the ABI-flag finding (rebuild with
    -D_GLIBCXX_USE_CXX11_ABI=1); c10::TensorImpl::decref_pyobject, which 2.9.1 exports in no
    mangling, the API-change finding (rebuild against 2.9.1) — neither in the other's, where
    both were the one undefined-symbol finding and the ABI finding's example."""
    _need_gcc()
    from patchkit.abi import torchsyms
    from patchkit.abi.profiles import load_profile

    old_abi = "_ZN3c106detail14torchCheckFailEPKcS2_jRKSs"
    new_abi = (
        "_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcE"
        "SaIcEEE"
    )
    api = "_ZNK3c1010TensorImpl15decref_pyobjectEv"
    ext = builders.newer_torch_extension(0)
    assert {old_abi, api} <= _nm(["--undefined-only"], ext)
    prof = load_profile("cu130-sm120")
    doc = torchsyms.load(prof.data_file(prof.torch_symbols))
    exported = {n for lib in doc["libraries"].values() for n in lib["defined"]}
    assert new_abi in exported and old_abi not in exported and api not in exported
    house = tmp_path / "house"
    house.mkdir()
    name = "old_abi_ext-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    builders.make_wheel(str(house), name, {"old_abi_ext/_C.so": open(ext, "rb").read()})
    report = verify(wheelhouse=str(house), cache_dir=str(tmp_path / "c"))
    found = _checks(report)
    (change,) = found["undefined-symbol-profile"]
    assert change.message == (f"undefined symbol: {api} (c10::TensorImpl::decref_pyobject() const)")
    assert "neither C++ ABI" in change.hint and "rebuild against 2.9.1+cu130" in change.hint
    assert "torchCheckFail" not in change.message + " ".join(change.evidence)
    (flag,) = found["cxx11-abi"]
    assert flag.message.startswith(
        "built with _GLIBCXX_USE_CXX11_ABI=0 but torch uses 1 (symbols like "
        "c10::detail::torchCheckFail(char const*, char const*, unsigned int, std::"
    )
    assert flag.hint == "rebuild with -D_GLIBCXX_USE_CXX11_ABI=1"
    (line,) = flag.evidence
    assert line.startswith(f"{old_abi}: undefined (") and line.endswith(f"torch exports {new_abi}")
    assert "decref_pyobject" not in flag.message + " ".join(flag.evidence)
    # Built with the ABI torch uses: the API change alone.
    (house / name).unlink()
    good_abi = builders.newer_torch_extension(1)
    builders.make_wheel(str(house), name, {"old_abi_ext/_C.so": open(good_abi, "rb").read()})
    found = _checks(verify(wheelhouse=str(house), cache_dir=str(tmp_path / "c")))
    assert "cxx11-abi" not in found
    assert [f.message for f in found["undefined-symbol-profile"]] == [change.message]


def test_abi_flag_against_a_torch_of_the_old_abi(tmp_path):
    """The other way round: a C++11-ABI extension beside a torch built with the old ABI (a
    stand-in compiled here) — torchCheckFail's std::__cxx11::string overload is torch's
    ``Ss`` one in the other ABI's spelling."""
    _need_gcc()
    house = tmp_path / "house"
    house.mkdir()
    builders.fake_torch_wheel(str(house), abi=0)
    ext = builders.newer_torch_extension(1)
    name = "new_abi_ext-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    builders.make_wheel(str(house), name, {"new_abi_ext/_C.so": open(ext, "rb").read()})
    found = _checks(verify(wheelhouse=str(house), cache_dir=str(tmp_path / "c")))
    (change,) = found["undefined-symbol"]
    assert change.message == (
        "undefined symbol: _ZNK3c1010TensorImpl15decref_pyobjectEv "
        "(c10::TensorImpl::decref_pyobject() const)"
    )
    (flag,) = found["cxx11-abi"]
    assert "built with _GLIBCXX_USE_CXX11_ABI=1 but torch uses 0" in flag.message
    assert flag.hint == "rebuild with -D_GLIBCXX_USE_CXX11_ABI=0"
    (line,) = flag.evidence
    assert line.startswith("_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx11")
    assert line.endswith("torch exports _ZN3c106detail14torchCheckFailEPKcS2_jRKSs")


# ---------------------------------------------------------------- kernels outside shared objects


@pytest.mark.parametrize(
    "kind,arch,runs_120,runs_90",
    [
        ("cubin", "sm_120a", True, False),
        ("fatbin", "sm_90", False, True),
        ("ptx", "sm_120", True, False),  # compute_120 PTX: JIT on 12.0, nothing on 9.0
    ],
)
def test_raw_device_code_files(tmp_path, kind, arch, runs_120, runs_90):
    if builders.nvcc() is None:
        pytest.skip("needs nvcc")
    path = builders.device_code(kind, arch)
    report = analyze_file(path, os.path.basename(path), path, kind)
    assert report.kind == kind and not report.error, report.error
    (fat,) = report.fatbins
    names = fat.archs
    expected = {"cubin": [arch], "fatbin": [arch], "ptx": ["compute_" + arch[3:]]}[kind]
    assert names == expected
    house = tmp_path / "house"
    house.mkdir()
    builders.make_wheel(
        str(house),
        "kern-1.0-py3-none-any.whl",
        {f"kern/data/k{os.path.splitext(path)[1]}": open(path, "rb").read()},
    )
    for cc, runs in (("12.0", runs_120), ("9.0", runs_90)):
        report = verify(wheelhouse=str(house), gpus=[cc], cache_dir=str(tmp_path / "c"))
        hits = [f for f in report.findings if f.check.startswith("device-files")]
        assert bool(hits) == (not runs), (cc, [f.line() for f in report.findings])
        if hits:
            assert hits[0].severity == "error" and "1/1 device-code files" in hits[0].message


def _cuobjdump() -> str | None:
    try:
        import triton  # carries NVIDIA's binary utilities
    except ImportError:
        return shutil.which("cuobjdump")
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return path if os.access(path, os.X_OK) else shutil.which("cuobjdump")


@pytest.mark.slow
def test_real_flashinfer_cubin_coverage(tmp_path, cache_dir):
    """flashinfer-cubin 0.6.3 from PyPI: thousands of raw cubins, none for SM90 or SM120."""
    wheel = builders.real_wheelhouse(
        tmp_path / "house", "flashinfer-cubin==0.6.3", "flashinfer_cubin-0.6.3-*.whl"
    )
    house = wheel.parent
    report = verify(wheelhouse=str(house), gpus=["12.0", "9.0"], cache_dir=cache_dir)
    found = [f for f in report.findings if f.check.startswith("device-files")]
    by_cc = {re.search(r"sm_(\d+) \(has", f.message).group(1): f for f in found}
    assert set(by_cc) == {"120", "90"}
    with zipfile.ZipFile(wheel) as zf:
        cubins = [n for n in zf.namelist() if n.endswith(".cubin")]
        assert f"{len(cubins)}/{len(cubins)} device-code files" in by_cc["120"].message
        assert "(has: sm_100a sm_100f sm_103a)" in by_cc["120"].message
        # Cross-check a sample with cuobjdump, and the a/f variant with the file names.
        tool = _cuobjdump()
        sample = cubins[:: max(1, len(cubins) // 12)]
        for name in sample:
            data = zf.read(name)
            path = tmp_path / "one.cubin"
            path.write_bytes(data)
            rep = analyze_file(str(path), name, name, "cubin")
            (arch,) = rep.fatbins[0].archs
            tag = re.search(r"[Ss]m(\d+)([af]?)", name.rsplit("/", 1)[1])
            if tag:
                assert arch == f"sm_{tag.group(1)}{tag.group(2)}", name
            if tool:
                out = subprocess.run(
                    [tool, "--dump-elf-symbols", str(path)], capture_output=True, text=True
                )
                m = re.search(r"arch = (sm_\d+)", out.stdout)
                if m:
                    assert arch.rstrip("af") == m.group(1), name


# ---------------------------------------------------------------- GLIBC from every library


def test_glibc_need_from_libm_against_tag_and_host(tmp_path):
    """logf@GLIBC_2.27 (libm, not libc) in a wheel tagged manylinux2014 (glibc 2.17)."""
    _need_gcc()
    lib = builders.logf_library()
    verneed = subprocess.run(["readelf", "-V", lib], capture_output=True, text=True).stdout
    assert re.search(r"Name: GLIBC_2\.27", verneed) and "libm.so.6" in verneed
    house = tmp_path / "house"
    house.mkdir()
    builders.make_wheel(
        str(house),
        "pklog-1.0-cp311-cp311-manylinux2014_x86_64.whl",
        {"pklog/libpklog.so": open(lib, "rb").read()},
    )
    report = verify(wheelhouse=str(house), cache_dir=str(tmp_path / "c"))
    (tag,) = _checks(report)["wheel-glibc-tag"]
    assert tag.message == "tagged manylinux_2_17 but needs GLIBC_2.27"
    assert tag.evidence == ("pklog/libpklog.so: GLIBC_2.27 from libm.so.6 (logf)",)
    assert "host-version" not in _checks(report)  # the profile's host has glibc 2.35
    # A profile whose target host has glibc 2.26: the load would fail there.
    prof = tmp_path / "old-host.toml"
    text = open(os.path.join(REPO, "build", "profiles", "cu130-sm120.toml")).read()
    prof.write_text(text.replace('GLIBC = "2.35"', 'GLIBC = "2.26"'))
    (src := tmp_path / "torch-2.9.1.symbols.json.gz").symlink_to(
        os.path.join(REPO, "build", "profiles", "torch-2.9.1.symbols.json.gz")
    )
    assert src.exists()
    report = verify(wheelhouse=str(house), profile=str(prof), cache_dir=str(tmp_path / "c"))
    (host,) = _checks(report)["host-version"]
    assert host.severity == "error"
    assert host.message.startswith(
        "libm.so.6: version 'GLIBC_2.27' not found (required by libpklog.so) (logf)"
    )


@pytest.mark.slow
def test_real_cusparselt_glibc_from_libm(tmp_path, cache_dir):
    """nvidia-cusparselt-cu12 0.7.1 from PyPI is tagged manylinux2014 (glibc 2.17); readelf -V
    shows its libc needs stop at 2.17, but it needs GLIBC_2.27 from libm.so.6."""
    wheel = builders.real_wheel(
        "nvidia-cusparselt-cu12==0.7.1", "nvidia_cusparselt_cu12-0.7.1-*manylinux2014*.whl"
    )
    if wheel is None:
        pytest.skip("cannot download nvidia-cusparselt-cu12 0.7.1")
    house = tmp_path / "house"
    house.mkdir()
    os.symlink(os.path.realpath(wheel), house / os.path.basename(wheel))
    report = verify(wheelhouse=str(house), cache_dir=cache_dir)
    (tag,) = _checks(report)["wheel-glibc-tag"]
    assert tag.message == "tagged manylinux_2_17 but needs GLIBC_2.27"
    assert any("GLIBC_2.27 from libm.so.6" in e for e in tag.evidence), tag.evidence
    member = "nvidia/cusparselt/lib/libcusparseLt.so.0"
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(member, tmp_path)
    out = subprocess.run(
        ["readelf", "-V", "-W", str(tmp_path / member)], capture_output=True, text=True
    ).stdout
    by_lib: dict[str, set] = {}
    lib = None
    for line in out.splitlines():
        m = re.search(r"File: (\S+)", line)
        if m:
            lib = m.group(1)
        m = re.search(r"Name: (GLIBC_[\d.]+)", line)
        if m and lib:
            by_lib.setdefault(lib, set()).add(m.group(1))
    newest = {k: max(v, key=lambda x: tuple(map(int, x[6:].split(".")))) for k, v in by_lib.items()}
    assert newest["libc.so.6"] == "GLIBC_2.17" and newest["libm.so.6"] == "GLIBC_2.27"


# ---------------------------------------------------------------- host independence


def _verify_json(args: list[str], env: dict, hide: list[str] | None = None) -> dict:
    cmd = [sys.executable, "-m", "patchkit", "verify", *args, "--json", "--no-cache"]
    if hide:
        empty = env["PK_EMPTY"]
        mounts = " && ".join(
            f"mount --bind {empty}{'/f' if os.path.isfile(p) else ''} {p}" for p in hide
        )
        cmd = ["unshare", "-m", "sh", "-c", f'{mounts} && exec "$@"', "sh", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode in (0, 1), proc.stderr
    doc = result_of(proc.stdout)
    doc.pop("seconds")
    return doc


def test_same_result_with_the_cuda_toolkit_hidden(tmp_path):
    """Libraries this machine's CUDA 13 toolkit has (libcupti.so.13, libcudart.so.13), with no
    wheel shipping them in the environment, are missing whether the toolkit is visible or not:
    the first fails without the loader's host independence (found through ld.so.cache)."""
    if builders.nvcc() is None or shutil.which("unshare") is None:
        pytest.skip("needs nvcc and unshare")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    cupti = "/usr/local/cuda-13.0/lib/libcupti.so.13"
    if probe.returncode or not os.path.exists(cupti):
        pytest.skip("cannot make a mount namespace here, or no CUDA 13 toolkit to hide")
    site = builders.make_site(
        str(tmp_path),
        None,
        {
            "sgl_kernel/common_ops.abi3.so": builders.linking("needs-host-cupti", [cupti]),
            "kern/_ops.so": builders.cuda_object("sm_120"),
        },
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "f").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "PATCHKIT_PROFILE"}
    env["PK_EMPTY"] = str(empty)
    hide = [p for p in ("/usr/local/cuda-13.0", "/etc/ld.so.cache") if os.path.exists(p)]
    seen = _verify_json(["--env", site], env)
    hidden = _verify_json(["--env", site], env, hide=hide)
    assert seen == hidden
    missing = sorted(
        f["message"].split(":")[0] for f in seen["findings"] if f["check"] == "needed-missing"
    )
    assert missing == ["libcudart.so.13", "libcupti.so.13"]


def test_partial_wheelhouse_notes_and_env_errors(tmp_path):
    """In a wheelhouse, a library another wheel of the stack ships is a note; in an installed
    environment, where that wheel should be, it is an error."""
    _need_gcc()
    cudart = builders.stub_library("libcudart.so.13", ("cudaGetLastError",))
    ext = builders.linking("needs-cudart13", [cudart], "cudaGetLastError")
    house = tmp_path / "house"
    house.mkdir()
    builders.make_wheel(
        str(house),
        "kx-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        {"kx/_ops.so": open(ext, "rb").read()},
    )
    report = verify(wheelhouse=str(house), cache_dir=str(tmp_path / "c"))
    found = _checks(report)
    (note,) = found["needed-elsewhere"]
    assert note.severity == "note" and report.errors == 0
    assert (
        note.message == "libcudart.so.13: provided by nvidia-cuda-runtime (not in this wheelhouse)"
    )
    site = builders.make_site(str(tmp_path / "env"), None, {"kx/_ops.so": ext})
    report = verify(env=site, cache_dir=str(tmp_path / "c"), host_checks=False)
    assert [f.check for f in report.findings if f.severity == "error"] == ["needed-missing"]


def test_cuda12_build_is_one_finding(tmp_path):
    """Six objects of one wheel needing CUDA 12 runtimes: one error with six lines of evidence."""
    _need_gcc()
    libs = [builders.stub_library(f"lib{n}.so.12", ("f",)) for n in ("cudart", "cublas")]
    ext = builders.linking("cu12-build", libs)
    members = {f"cu12pkg/m{i}.so": open(ext, "rb").read() for i in range(5)}
    members["cu12pkg/bin/tool"] = open(ext, "rb").read()  # an ELF with no .so name
    house = tmp_path / "house"
    house.mkdir()
    builders.make_wheel(str(house), "cu12pkg-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", members)
    report = verify(wheelhouse=str(house), cache_dir=str(tmp_path / "c"))
    errors = [f for f in report.findings if f.severity == "error"]
    assert [f.check for f in errors] == ["cuda-major"], [f.line() for f in errors]
    (f,) = errors
    assert f.file == "cu12pkg-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert "a CUDA 12 build: 6 object(s) need libcublas.so.12, libcudart.so.12" in f.message
    assert len(f.evidence) == 6 and any("cu12pkg/bin/tool" in e for e in f.evidence)


# ---------------------------------------------------------------- command line


@pytest.mark.parametrize(
    "text,cc",
    [("12", "12.0"), ("12.0", "12.0"), ("sm_120", "12.0"), ("120", "12.0"), ("90", "9.0")],
)
def test_gpu_accepted(text, cc):
    assert str(CC.parse(text)) == cc


@pytest.mark.parametrize("text", ["13", "1.2", "sm_12", "hopper", "12.0.1"])
def test_gpu_refused(tmp_path, capsys, text):
    assert main(["verify", "--env", str(tmp_path), "--gpu", text]) == 2
    err = capsys.readouterr().err
    assert "compute capability" in err and len(err.strip().splitlines()) <= 2


def test_patchkit_profile_applies_to_verify(tmp_path, capsys, monkeypatch):
    _need_gcc()
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATCHKIT_PROFILE", "cu130-sm90")
    site = builders.make_site(str(tmp_path), None, {"d/libd.so": builders.stub_library("libd.so")})
    main(["verify", "--env", site, "--json"])
    doc = result_of(capsys.readouterr().out)
    assert doc["profile"] == "cu130-sm90" and doc["targets"] == ["9.0"]
    main(["verify", "--env", site, "--json", "--profile", "cu130-sm120"])
    assert result_of(capsys.readouterr().out)["profile"] == "cu130-sm120"
    monkeypatch.setenv("PATCHKIT_PROFILE", "no-such")
    assert main(["verify", "--env", site]) == 2
    err = capsys.readouterr().err
    assert "no profile 'no-such' (available: cu130-sm120, cu130-sm120-0.5.17" in err


# ---------------------------------------------------------------- the cache


def test_cache_is_json_checked_on_read_under_xdg(tmp_path, monkeypatch):
    _need_gcc()
    monkeypatch.delenv("PATCHKIT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    ext = builders.linking("needs-other", [builders.stub_library("libpk_other.so.1", ("pk_one",))])
    site = builders.make_site(str(tmp_path), None, {"pk/_ops.so": ext})
    first = verify(env=site, host_checks=False)
    entries = [
        os.path.join(d, f)
        for d, _, fs in os.walk(tmp_path / "xdg" / "patchkit" / "verify")
        for f in fs
    ]
    assert entries and all(e.endswith(".json") for e in entries)
    for e in entries:
        json.load(open(e))  # data, never code
    for bad in ("{not json", "[]", '{"format": 6, "value": {"kind": "elf"}}', "\x80\x04K."):
        for e in entries:
            with open(e, "w") as fh:
                fh.write(bad)
        again = verify(env=site, host_checks=False)
        assert [f.line() for f in again.findings] == [f.line() for f in first.findings]
        assert not again.cached
    # A well-formed entry with a wrong type inside is a miss too.
    again = verify(env=site, host_checks=False)
    assert again.cached
    tampered = 0
    for e in entries:
        doc = json.load(open(e))
        if str(doc.get("key")).startswith("files:"):  # the folder's one entry for its files
            for item in doc["value"].values():
                item[2]["elf"]["needed"] = [1, 2]
                tampered += 1
            json.dump(doc, open(e, "w"))
    assert tampered  # pk/_ops.so
    os.utime(os.path.join(site, "pk", "_ops.so"))  # invalidates the run entry only
    third = verify(env=site, host_checks=False)
    assert [f.line() for f in third.findings] == [f.line() for f in first.findings]


def test_installed_files_share_one_entry_each_a_miss_of_its_own(tmp_path, monkeypatch):
    """An installed environment's files are one cache entry (one file to write, not one per
    object); a file changed since is read again, the others come from that entry."""
    _need_gcc()
    from patchkit.abi import scan

    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    ext = builders.linking("needs-other", [builders.stub_library("libpk_other.so.1", ("pk_one",))])
    site = builders.make_site(str(tmp_path), None, {"pk/_ops.so": ext})
    first = verify(env=site, host_checks=False, jobs=1)
    entries = [f for _, _, fs in os.walk(tmp_path / "cache") for f in fs]
    assert len(entries) == 2  # the run, the folder's files
    read: list[str] = []
    real = scan._analyze_member
    monkeypatch.setattr(scan, "_analyze_member", lambda m: read.append(m.relpath) or real(m))
    os.utime(os.path.join(site, "pk", "_ops.so"))
    again = verify(env=site, host_checks=False, jobs=1)
    assert read == ["pk/_ops.so"] and not again.cached
    assert [f.line() for f in again.findings] == [f.line() for f in first.findings]
    read.clear()
    assert verify(env=site, host_checks=False, profile="cu130-sm90", jobs=1).files == first.files
    assert read == []  # another profile: every file from the entry rewritten above


def test_a_file_rewritten_with_its_size_and_mtime_kept_is_read_again(tmp_path, monkeypatch):
    """A library renamed in an extension's NEEDED in place, its modification time set back
    (as `cp -p`, `rsync -a` or `tar x` of another build of the same size leave it): the cache
    must not answer for it; the missing library is found."""
    _need_gcc()
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    ext = builders.linking("needs-other", [builders.stub_library("libpk_other.so.1", ("pk_one",))])
    site = builders.make_site(str(tmp_path), None, {"pk/_ops.so": ext})
    first = verify(env=site, host_checks=False, jobs=1)
    assert [f for f in first.findings if f.check == "needed-missing" and "libpk_other" in f.line()]
    path = os.path.join(site, "pk", "_ops.so")
    st = os.stat(path)
    data = open(path, "rb").read()
    assert data.count(b"libpk_other.so.1\0") == 1
    with open(path, "r+b") as fh:
        fh.write(data.replace(b"libpk_other.so.1\0", b"libpk_othex.so.1\0"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(path).st_size, os.stat(path).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    again = verify(env=site, host_checks=False, jobs=1)
    assert [f for f in again.findings if f.check == "needed-missing" and "libpk_othex" in f.line()]


# ---------------------------------------------------------------- an installed patchkit


@pytest.mark.slow
def test_verify_from_a_non_editable_install(tmp_path):
    """patchkit built as a wheel and installed into a fresh venv runs verify outside any
    checkout with its packaged profiles, and a project's build/profiles/ overrides them."""
    _need_gcc()
    # Built from a copy: an in-tree build would write build/lib into the project's build/.
    src = tmp_path / "src"
    shutil.copytree(os.path.join(REPO, "patchkit"), src / "patchkit", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copytree(os.path.join(REPO, "build", "profiles"), src / "build" / "profiles")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if os.path.exists(os.path.join(REPO, name)):
            shutil.copy(os.path.join(REPO, name), src / name)
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(dist), str(src)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    (wheel,) = dist.glob("patchkit-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert "patchkit/abi/profiles/cu130-sm120.toml" in names
    assert "patchkit/abi/profiles/torch-2.9.1.symbols.json.gz" in names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    deps = subprocess.run(
        [sys.executable, "-c", "import click, os; print(os.path.dirname(click.__path__[0]))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # The dependencies come from the test interpreter's site-packages, after the install.
    with open(os.path.join(site, "zz-deps.pth"), "w") as fh:
        fh.write(deps + "\n")
    house = tmp_path / "house"
    house.mkdir()
    lib = builders.stub_library("libdemo.so", ("demo",))
    builders.make_wheel(
        str(house), "demo-1.0-py3-none-any.whl", {"demo/libdemo.so": open(lib, "rb").read()}
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PATCHKIT_", "PYTHON"))}
    env["PATCHKIT_CACHE"] = str(tmp_path / "cache")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = lambda *a, cwd: subprocess.run(  # noqa: E731
        [py, "-m", "patchkit", "verify", "--wheelhouse", str(house), "--json", *a],
        capture_output=True, text=True, cwd=cwd, env=env,
    )  # fmt: skip
    proc = run(cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    doc = result_of(proc.stdout)
    assert doc["profile"] == "cu130-sm120" and doc["files"] == 1
    where = subprocess.run(
        [py, "-c", "import patchkit; print(patchkit.__file__)"], capture_output=True, text=True,
        cwd=elsewhere, env=env,
    ).stdout  # fmt: skip
    assert where.startswith(site)
    # A project's own build/profiles/ wins over the packaged profiles and adds to them.
    project = tmp_path / "project"
    (project / "patches").mkdir(parents=True)
    (project / "patches" / "targets.toml").write_text("")
    (project / "build" / "profiles").mkdir(parents=True)
    text = open(os.path.join(REPO, "build", "profiles", "cu130-sm90.toml")).read()
    (project / "build" / "profiles" / "team.toml").write_text(text.replace("cu130-sm90", "team"))
    proc = run("--profile", "team", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert result_of(proc.stdout)["profile"] == "team"
    proc = run("--profile", "team", cwd=elsewhere)
    assert proc.returncode == 2 and "no profile 'team'" in proc.stderr


def test_env_names_a_venv_or_its_python(tmp_path, capsys, monkeypatch):
    """`--env .venv` (what `make verify` passes) checks that venv's site-packages; a venv with
    nothing to check is a failure, not a pass."""
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    for arg in (str(venv), str(venv / "bin" / "python")):
        rc = main(["verify", "--env", arg, "--json"])
        doc = result_of(capsys.readouterr().out)
        assert rc == 1 and doc["source"].endswith("site-packages"), doc
        assert doc["source"].startswith(str(venv))
        assert [f["check"] for f in doc["findings"] if f["severity"] == "error"] == [
            "nothing-checked"
        ]


def test_make_verify_checks_the_named_environment(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("needs make")
    out = subprocess.run(
        ["make", "-n", "verify", f"VERIFY_ENV={tmp_path}", "PATCHKIT_PROFILE=cu130-sm90"],
        cwd=REPO, capture_output=True, text=True,
    ).stdout  # fmt: skip
    line = [ln for ln in out.splitlines() if "patchkit verify" in ln][-1]
    assert f"--env {tmp_path}" in line and "--profile cu130-sm90" in line


@pytest.mark.parametrize(
    "edit",
    [
        ('GLIBC = "2.35"', 'GLIBC = "two"'),
        ("[host.versions]", "versions = 3\n[hostx]"),
        ('symbols = "torch-2.9.1.symbols.json.gz"', 'symbols = "missing.json.gz"'),
    ],
)
def test_broken_profile_is_one_line(tmp_path, capsys, edit):
    """A malformed profile is a one-line error (exit 2), a missing torch symbol set one error."""
    text = open(os.path.join(REPO, "build", "profiles", "cu130-sm120.toml")).read()
    assert edit[0] in text
    prof = tmp_path / "p.toml"
    prof.write_text(text.replace(edit[0], edit[1]))
    house = tmp_path / "house"
    house.mkdir()
    builders.make_wheel(str(house), "pure-1.0-py3-none-any.whl", {"pure/x.py": b""})
    rc = main(["verify", "--wheelhouse", str(house), "--profile", str(prof)])
    out, err = capsys.readouterr()
    if "missing" in edit[1]:
        assert rc == 1 and "the profile's torch symbol set cannot be used" in out
    else:
        assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) <= 2, err


# ---------------------------------------------------------------- interrupted


def _verify_with_workers(site, env, interrupt_after: float | None, twice: bool = False):
    """verify of `site` as a terminal's foreground job; once its workers are forked, Ctrl-C
    to its process group `interrupt_after` seconds later (twice, 50 ms apart, with `twice`).
    (returncode or None when still running 10 s after, output, seconds the workers ran)"""
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "patchkit", "verify", "--env", str(site), "--no-cache"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group, SIGINT not ignored: a foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True)
        if len(workers.stdout.split()) >= 2:
            break
        time.sleep(0.005)
    forked = time.monotonic()
    if interrupt_after is not None:
        time.sleep(interrupt_after)
        for _ in range(2 if twice else 1):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.05)
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out.decode(errors="replace"), 0.0
    left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True)
    assert not left.stdout.split(), f"processes left: {left.stdout}"
    return proc.returncode, out.decode(errors="replace"), time.monotonic() - forked


def _site_for_workers(site) -> None:
    """120 objects, long exported names (a large result each) beside 1 MiB libraries: more
    than verify reads in one process (scan.PARALLEL_BYTES)."""
    _need_gcc()
    names = tuple(f"pk_exported_function_with_a_long_name_{'x' * 60}_{i}" for i in range(3000))
    lib = builders.string_library("libpk_many.so.1", "x" * (1 << 20))
    big = builders.stub_library("libpk_names.so.1", names)
    for i in range(120):
        (site / f"pk{i // 20}").mkdir(parents=True, exist_ok=True)
        shutil.copy(lib if i % 2 else big, site / f"pk{i // 20}" / f"_m{i}.so")


def test_ctrl_c_while_the_workers_read_ends_the_run_at_once(tmp_path):
    """Ctrl-C reaches the whole process group, the workers too. Runs interrupted at eight
    points of the workers' reading (once, or twice 50 ms apart) each end with 130 and one
    line within 10 s, leaving no process. (A worker stopped inside the pool's protocol left
    the parent reading a half-written result for ever.)"""
    site = tmp_path / "site"
    _site_for_workers(site)
    env = {**os.environ, "PATCHKIT_CACHE": str(tmp_path / "cache"), "PYTHONDONTWRITEBYTECODE": "1"}
    rc, text, reading = _verify_with_workers(site, env, None)
    assert rc == 0 and "120 objects" in text, text[-2000:]
    interrupted = 0
    for k in range(8):
        rc, text, _ = _verify_with_workers(site, env, reading * k / 8, twice=k % 2 == 1)
        assert rc is not None, f"still running 10 s after Ctrl-C at {reading * k / 8:.2f} s"
        assert "Traceback" not in text, text[-2000:]
        if rc == 130:
            interrupted += 1
            assert text.strip().splitlines()[-1].startswith("patchkit: interrupted"), text
        else:  # finished before the signal landed
            assert rc == 0 and "120 objects" in text, text[-2000:]
    assert interrupted >= 4


# Ctrl-C landing the moment before a thread of the given name or class starts: the pool's
# manager thread (started once the workers are forked), a cache write, the keep-alive ticker
INTERRUPT_AS_A_THREAD_STARTS = """
import os, signal, sys, threading
from patchkit import cli
start, which = threading.Thread.start, sys.argv.pop(1)
def interrupted(self):
    if which in (self.name, type(self).__name__):
        os.kill(os.getpid(), signal.SIGINT)
    start(self)
threading.Thread.start = interrupted
sys.exit(cli.main(sys.argv[1:], exiting=True))  # as the console script
"""


@pytest.mark.parametrize("thread", ["_ExecutorManagerThread", "patchkit-cache-write"])
def test_ctrl_c_as_a_thread_starts_ends_the_run_as_an_interrupt(tmp_path, thread):
    """An interrupt between a thread's making and its start (the thread recorded to be waited
    for) is raised once it has started: exit 130, one line, no process left. (It was an
    internal error, 'cannot join thread before it is started', once in a make test.)"""
    site = tmp_path / "site"
    _site_for_workers(site)
    env = {**os.environ, "PATCHKIT_CACHE": str(tmp_path / "cache"), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", INTERRUPT_AS_A_THREAD_STARTS, thread, "verify", "--env", str(site)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"still running 60 s after the interrupt: {proc.communicate()[0][-2000:]}")
    left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True)
    assert not left.stdout.split(), f"processes left: {left.stdout}"
    assert "Traceback" not in out and "internal error" not in out, out[-2000:]
    assert proc.returncode == 130, out[-2000:]
    assert out.strip().splitlines()[-1].startswith("patchkit: interrupted"), out
