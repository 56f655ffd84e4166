"""torch's stable C interface (the shim: ``aoti_torch_*``, ``torch_*``) checked like its C++
names, against each line's torch symbol set and against a real torch wheel in the wheelhouse,
on real wheels from the package index (torchaudio, torch) and an extension compiled here."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import zipfile

import pytest

from patchkit.abi import torchsyms, verify
from patchkit.abi.profiles import load_profile
from tests.abi import builders

pytest_plugins = ["tests.abi.fixtures"]

SHIM = ("aoti_torch_", "torch_")

# line -> (its profiles, the torchaudio its constraints install, the torch it runs on)
LINES = {
    "0.5.9": (("cu130-sm120", "cu130-sm90"), "2.9.1", "2.9.1"),
    "0.5.17": (("cu130-sm120-0.5.17", "cu130-sm90-0.5.17"), "2.11.0", "2.11.0"),
    "0.5.23": (("cu130-sm120-0.5.23", "cu130-sm90-0.5.23"), "2.11.0", "2.14.1"),
}

# The torch libraries verify treats as torch (checks.context.TORCH_SONAMES, global deps aside).
TORCH_LIBRARIES = (
    "libc10.so",
    "libc10_cuda.so",
    "libtorch.so",
    "libtorch_cpu.so",
    "libtorch_cuda.so",
    "libtorch_python.so",
)


_checks = builders.findings_by_check
_nm = builders.nm_names


def _profile_exports(name: str) -> set[str]:
    prof = load_profile(name)
    with gzip.open(prof.data_file(prof.torch_symbols)) as fh:
        doc = json.load(fh)
    return {n for lib in doc["libraries"].values() for n in lib["defined"]}


def _torchaudio(version: str) -> str:
    if shutil.which("nm") is None:
        pytest.skip("needs nm")
    wheel = builders.real_wheel(
        f"torchaudio=={version}", f"torchaudio-{version}-cp311-cp311-manylinux_2_28_x86_64.whl"
    )
    if wheel is None:
        pytest.skip(f"cannot download torchaudio {version}")
    return wheel


def _shim_imports(wheel: str, dest) -> dict[str, set[str]]:
    """member -> the shim functions nm says it leaves undefined."""
    out = {}
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(".so"):
                zf.extract(name, dest)
                names = {
                    n for n in _nm(["--undefined-only"], str(dest / name)) if n.startswith(SHIM)
                }
                if names:
                    out[name] = names
    return out


def _house(tmp_path, *wheels: str):
    house = tmp_path / "house"
    house.mkdir(exist_ok=True)
    for wheel in wheels:
        os.symlink(os.path.realpath(wheel), house / os.path.basename(wheel))
    return house


def test_stable_abi_wheel_for_a_newer_torch_is_an_error(tmp_path, cache_dir):
    """torchaudio 2.11.0 (PyPI) calls torch only through the stable C shim; 17 of the shim
    functions it calls came after torch 2.9.1. Against the 0.5.9 line's torch 2.9.1 that is
    one error for the wheel naming each of them (it passed: the shim's C names were nobody's
    to check); against 2.11.0 and 2.14.1, whose torch exports them all, nothing."""
    wheel = _torchaudio("2.11.0")
    imports = _shim_imports(wheel, tmp_path / "x")
    assert len(imports) == 3  # every extension of it
    exports = _profile_exports("cu130-sm120")
    lacking = {(m, n) for m, names in imports.items() for n in names if n not in exports}
    assert {n for _, n in lacking} >= {"torch_library_impl", "torch_call_dispatcher"}
    house = _house(tmp_path, wheel)
    report = verify(wheelhouse=str(house), profile="cu130-sm120", cache_dir=cache_dir)
    found = _checks(report)
    (shim,) = found["undefined-symbol-shim"]
    assert (shim.severity, shim.file) == ("error", os.path.basename(wheel))
    evidence = {tuple(e.split("!", 1)[1].split(": ")) for e in shim.evidence}
    assert evidence == lacking  # nm's undefined shim names that 2.9.1 does not export
    assert "torch 2.9.1+cu130" in shim.hint and "stable ABI" in shim.hint
    assert not {"undefined-symbol-profile", "undefined-symbol-other"} & set(found)
    for profile in ("cu130-sm120-0.5.17", "cu130-sm120-0.5.23"):
        report = verify(wheelhouse=str(house), profile=profile, cache_dir=cache_dir)
        assert report.errors == 0, [f.line() for f in report.findings]


@pytest.mark.parametrize("line", sorted(LINES))
def test_each_lines_profiles_hold_its_torch_and_shim_sets(line):
    """Each line's profiles name the symbol set of the torch the line runs on, with every
    library verify reads as torch and their C++ and stable-shim exports in it: no line falls
    back on another torch, or checks the shim against a set that lacks it."""
    profiles, _, torch = LINES[line]
    for name in profiles:
        prof = load_profile(name)
        assert prof.torch_version.split("+")[0] == torch and prof.torch_symbols, name
        doc = torchsyms.load(prof.data_file(prof.torch_symbols))
        assert doc["torch"].split("+")[0] == torch
        libs = {os.path.basename(rel): lib for rel, lib in doc["libraries"].items()}
        assert set(TORCH_LIBRARIES) <= set(libs), name
        for lib in TORCH_LIBRARIES:
            assert libs[lib]["defined"], (name, lib)
        cpu, cuda = (set(libs[k]["defined"]) for k in ("libtorch_cpu.so", "libtorch_cuda.so"))
        assert any(n.startswith("_ZN2at") for n in cpu) and any(
            n.startswith("_ZN3c10") for n in libs["libc10.so"]["defined"]
        )
        # the AOTInductor shim in both, and from 2.10 on the stable ABI's own functions
        assert {"aoti_torch_abi_version", "aoti_torch_get_data_ptr"} <= cpu, name
        assert "aoti_torch_get_current_cuda_stream" in cuda, name
        if torch != "2.9.1":
            assert {"torch_call_dispatcher", "torch_library_impl"} <= cpu, name
            assert "torch_cuda_stream_synchronize" in cuda, name


@pytest.mark.parametrize("line", sorted(LINES))
def test_each_lines_torchaudio_passes_its_profiles(line, tmp_path, cache_dir):
    """The torchaudio each line installs (build/constraints) calls shim functions; every one
    of them is in the line's profiles' symbol sets (nm, independently), and verify finds none
    missing — a profile whose set lacked one would fail here."""
    profiles, audio, _ = LINES[line]
    wheel = _torchaudio(audio)
    imports = set().union(*_shim_imports(wheel, tmp_path / "x").values())
    assert imports
    house = _house(tmp_path, wheel)
    for name in profiles:
        assert imports <= _profile_exports(name), (name, sorted(imports - _profile_exports(name)))
        report = verify(wheelhouse=str(house), profile=name, cache_dir=cache_dir)
        found = _checks(report)
        assert not {"undefined-symbol-shim", "undefined-symbol-profile"} & set(found), [
            f.line() for f in report.findings
        ]


def test_real_torch_wheel_beside_an_extension_for_another_torch(tmp_path, cache_dir):
    """The real torch 2.11.0 wheel in the wheelhouse with an extension built for torch 2.14
    that also NEEDs a library no wheel ships: the missing library is an error, the torch names
    are checked against the torch wheel's own libraries all the same — the C++ name and the
    stable-shim function 2.11.0 lacks are errors, the shim functions it has are not — and the
    one name the missing library may define is a note naming it."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    torch = builders.real_wheel(
        "torch==2.11.0", "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    )
    if torch is None:
        pytest.skip("cannot download torch 2.11.0")
    ext = builders.torch_214_extension()
    undefined = _nm(["--undefined-only"], ext)
    assert {"torch_delete_generator", "_ZNK4c10d7Backend15decref_pyobjectEv", "pk_one"} <= undefined
    house = _house(tmp_path, torch)
    name = "newer_ext-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    builders.make_wheel(str(house), name, {"newer_ext/_C.so": open(ext, "rb").read()})
    report = verify(wheelhouse=str(house), profile="cu130-sm120-0.5.17", cache_dir=cache_dir)
    found = _checks(report)
    assert "torch-from-profile" not in found  # the wheel's torch, not the profile's set
    obj = f"{name}!newer_ext/_C.so"
    (missing,) = [f for f in found["needed-missing"] if f.file == obj]
    assert missing.message.startswith("libpk_other.so.1: cannot open shared object file")
    (api,) = found["undefined-symbol"]
    assert api.file == obj and "_ZNK4c10d7Backend15decref_pyobjectEv" in api.message
    (shim,) = found["undefined-symbol-shim"]
    assert shim.file == obj and shim.evidence == (f"{obj}: torch_delete_generator",)
    assert shim.hint.startswith("torch 2.11.0+cu130 does not export it")
    (note,) = [f for f in found["undefined-symbol-unchecked"] if f.file == obj]
    assert note.message.startswith("1 undefined symbol(s) not checked: libpk_other.so.1")


def test_shim_function_torch_exports_outside_the_objects_scope(tmp_path):
    """An extension calling aoti_torch_abi_version, which libtorch_cpu.so exports, while it
    NEEDs libc10.so only: ld.so does not find it (libtorch_cpu.so is loaded RTLD_LOCAL by
    torch/_C), but torch does export it — the finding says the library is not in the object's
    NEEDED closure, not that it was built for another torch."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    ext = builders.shim_caller_without_libtorch()
    assert "aoti_torch_abi_version" in _nm(["--undefined-only"], ext)
    assert "aoti_torch_abi_version" in _profile_exports("cu130-sm120")
    house = tmp_path / "house"
    house.mkdir()
    name = "narrow_ext-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    builders.make_wheel(str(house), name, {"narrow_ext/_C.so": open(ext, "rb").read()})
    found = _checks(verify(wheelhouse=str(house), profile="cu130-sm120", cache_dir=str(tmp_path)))
    assert "undefined-symbol-shim" not in found
    (other,) = found["undefined-symbol-other"]
    assert other.file == f"{name}!narrow_ext/_C.so"
    assert other.message.startswith("undefined symbol: aoti_torch_abi_version")
    assert "(torch-shim) is not in this object's NEEDED closure" in other.hint


def test_cxx_function_torch_exports_outside_the_objects_scope(tmp_path):
    """The C++ form of the case above: at::_ops::add_Tensor::call is libtorch_cpu.so's, the
    extension NEEDs libc10.so only. Not an API change ("exports it in neither mangling") nor
    an ABI flag: the library is not in the object's NEEDED closure."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    ext = builders.cxx_caller_without_libtorch()
    assert builders.ADD_TENSOR in _nm(["--undefined-only"], ext)
    assert builders.ADD_TENSOR in _profile_exports("cu130-sm120")
    house = tmp_path / "house"
    house.mkdir()
    name = "narrow_ext-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    builders.make_wheel(str(house), name, {"narrow_ext/_C.so": open(ext, "rb").read()})
    found = _checks(verify(wheelhouse=str(house), profile="cu130-sm120", cache_dir=str(tmp_path)))
    assert "undefined-symbol-torch" not in found and "cxx11-abi" not in found, found.keys()
    (other,) = found["undefined-symbol-other"]
    assert other.file == f"{name}!narrow_ext/_C.so"
    assert "at::_ops::add_Tensor::call" in other.message
    assert "is not in this object's NEEDED closure" in other.hint
