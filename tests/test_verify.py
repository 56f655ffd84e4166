"""`patchkit verify` end to end: CLI contract, wheelhouse reading, a real third-party wheel,
and malformed inputs (property-based)."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from helpers import result_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from patchkit.abi import verify
from patchkit.abi.scan import analyze_file
from patchkit.cli import main
from tests.abi import builders

pytest_plugins = ["tests.abi.fixtures"]

LINE = re.compile(r"^(error|warning|note) +\S.*: .+ — .+$")


def _wheel(path, name="demo", version="1.0", members=None, metadata_version=None, symlink=None):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(
            f"{name}-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {metadata_version or version}\n\n",
        )
        for arc, data in (members or {}).items():
            zf.writestr(arc, data)
        zf.writestr(f"{name}-{version}.dist-info/RECORD", "")
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = 0o120777 << 16
            zf.writestr(info, "/etc/passwd")
    return path


# ---------------------------------------------------------------- CLI contract


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main(["verify", "--env", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["verify", "--env", str(tmp_path), "--profile", "no-such"]) == 2
    assert "no profile 'no-such'" in capsys.readouterr().err
    assert main(["verify", "--env", str(tmp_path), "--gpu", "hopper"]) == 2
    assert "not a compute capability" in capsys.readouterr().err
    # "$VENV" of an unset variable: an empty path, not this interpreter's by accident
    for option in ("--env", "--wheelhouse"):
        assert main(["verify", option, ""]) == 2
        assert f"{option}: empty path" in capsys.readouterr().err


def test_nothing_checked_is_a_failure(tmp_path, capsys, monkeypatch):
    """A folder with nothing verify reads is a failure; a wheelhouse of pure-Python wheels
    (their metadata checked) is a note saying so, not a failure of the wheels."""
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    house = tmp_path / "house"
    house.mkdir()
    _wheel(house / "pure-1.0-py3-none-any.whl", name="pure", members={"pure/__init__.py": ""})
    for args, rc_wanted, check in (
        (["--wheelhouse", str(house)], 0, "pure-python"),
        (["--env", str(house)], 1, "nothing-checked"),
    ):
        rc = main(["verify", *args, "--json"])
        doc = result_of(capsys.readouterr().out)
        assert rc == rc_wanted and doc["files"] == 0
        assert check in [f["check"] for f in doc["findings"]]


def test_clean_wheelhouse_exit_0_and_json(tmp_path, capsys, monkeypatch):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    house = tmp_path / "house"
    house.mkdir()
    lib = builders.stub_library("libdemo.so", ("demo",))
    _wheel(house / "demo-1.0-py3-none-any.whl", members={"demo/libdemo.so": open(lib, "rb").read()})
    rc = main(["verify", "--wheelhouse", str(house), "--json"])
    doc = result_of(capsys.readouterr().out)
    # no torch in the wheelhouse: the profile's torch symbol set stands in, as a note
    assert rc == 0 and doc["errors"] == 0 and doc["warnings"] == 0 and doc["files"] == 1
    assert [f["check"] for f in doc["findings"]] == ["torch-from-profile"]


def test_wheel_filename_version_mismatch(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    house = tmp_path / "house"
    house.mkdir()
    _wheel(
        house / "sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl",
        name="sgl_kernel",
        version="0.3.21+cu130",
        metadata_version="0.3.21",
    )
    assert main(["verify", "--wheelhouse", str(house), "--profile", "cu130-sm90"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(
        line.startswith(
            "error    sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl: "
            "filename version 0.3.21+cu130 != METADATA Version 0.3.21; pip will discard it"
        )
        for line in out
    ), out
    # no code in it: the pure-python note, not nothing-checked; the filename error stays
    assert re.match(r"^1 error\(s\), 0 warning\(s\), 2 note\(s\) in 0 objects", out[-1])


@pytest.mark.parametrize(
    "file,name,why",
    [
        ("foo-1.0-py3-none-any.whl", "bar", "the file name says foo, METADATA says bar"),
        ("not a wheel name.whl", "demo", "not a wheel file name"),
        ("Demo_Pkg-1.0-py3-none-any.whl", "demo-pkg", None),  # the same project, as pip reads it
    ],
)
def test_a_wheel_pip_refuses_for_its_name_is_an_error(
    tmp_path, capsys, monkeypatch, file, name, why
):
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    house = tmp_path / "house"
    house.mkdir()
    _wheel(house / file, name=name)
    rc = main(["verify", "--wheelhouse", str(house), "--json"])
    doc = result_of(capsys.readouterr().out)
    named = [f for f in doc["findings"] if f["check"] == "wheel-name"]
    if why is None:
        assert not named and rc == 0, doc["findings"]
    else:
        assert rc == 1 and len(named) == 1 and why in named[0]["message"], doc["findings"]
        assert "pip refuses to install it" in named[0]["message"]


def test_a_metadata_folder_of_another_project_is_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    house = tmp_path / "house"
    house.mkdir()
    with zipfile.ZipFile(house / "foo-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr(
            "bar-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: foo\nVersion: 1.0\n\n"
        )
        zf.writestr("bar-1.0.dist-info/RECORD", "")
    assert main(["verify", "--wheelhouse", str(house), "--json"]) == 1
    doc = result_of(capsys.readouterr().out)
    (named,) = [f for f in doc["findings"] if f["check"] == "wheel-name"]
    assert "its metadata folder is bar-1.0.dist-info" in named["message"]


@pytest.mark.parametrize("kind", ["slip", "absolute", "symlink", "duplicate", "bomb"])
def test_hostile_wheels_are_one_line(tmp_path, capsys, monkeypatch, kind):
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    house = tmp_path / "house"
    house.mkdir()
    path = house / "evil-1.0-py3-none-any.whl"
    if kind == "slip":
        _wheel(path, members={"../../evil.so": b"\x7fELF"})
    elif kind == "absolute":
        _wheel(path, members={"/tmp/evil.so": b"\x7fELF"})
    elif kind == "symlink":
        _wheel(path, symlink="evil/lib.so")
    elif kind == "duplicate":
        with pytest.warns(UserWarning):
            _wheel(path, members={"evil/a.so": b"1"})
            with zipfile.ZipFile(path, "a") as zf:
                zf.writestr("evil/a.so", b"2")
    else:
        _wheel(path, members={"evil/bomb.so": b"\0" * (32 << 20)})
    before = set(os.listdir(tmp_path))
    assert main(["verify", "--wheelhouse", str(house)]) == 1
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "evil-1.0" in ln]
    assert len(lines) == 1 and "invalid archive" in lines[0], lines
    assert set(os.listdir(tmp_path)) - {"cache"} == before  # nothing extracted next to it
    assert not os.path.exists("/tmp/evil.so")


def test_a_library_padded_to_2_mb_pages_is_no_bomb(tmp_path, capsys, monkeypatch):
    """A real library linked with 2 MB page alignment is mostly zeros: 2 MB that deflate to
    kilobytes (pillow 13.0.0's libXau: 224x). It was refused as a decompression bomb."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "pad.c"
    src.write_text("int pk_pad(void) { return 1; }\n")
    lib = tmp_path / "libpad.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-z,max-page-size=0x200000",
                    "-Wl,-z,separate-code", str(src), "-o", str(lib)], check=True)  # fmt: skip
    data = lib.read_bytes()
    house = tmp_path / "house"
    house.mkdir()
    wheel = _wheel(house / "pad-1.0-py3-none-any.whl", name="pad",
                   members={"pad.libs/libpad.so": data})  # fmt: skip
    (info,) = [i for i in zipfile.ZipFile(wheel).infolist() if i.filename.endswith(".so")]
    assert info.file_size > (1 << 20) and info.file_size > 200 * info.compress_size
    assert main(["verify", "--wheelhouse", str(house), "--json"]) == 0
    doc = result_of(capsys.readouterr().out)
    assert doc["files"] == 1 and not [f for f in doc["findings"] if f["severity"] == "error"]


# ---------------------------------------------------------------- malformed shared objects


def _mutations():
    return st.one_of(
        st.tuples(st.just("truncate"), st.integers(0, 20000), st.just(b"")),
        st.tuples(st.just("overwrite"), st.integers(0, 0x40), st.binary(min_size=1, max_size=8)),
        st.tuples(st.just("overwrite"), st.integers(0, 20000), st.binary(min_size=1, max_size=64)),
        st.tuples(st.just("huge"), st.sampled_from([0x28, 0x3C, 0x3E, 0x20]), st.just(b"\xff" * 8)),
        st.tuples(st.just("magic"), st.integers(0, 3), st.binary(min_size=1, max_size=1)),
    )


def _mutate(data: bytes, op, at, blob) -> bytes:
    if op == "truncate":
        return data[:at]
    if op == "magic":
        return data[:at] + bytes([data[at] ^ 0x55]) + data[at + 1 :]
    out = bytearray(data)
    out[at : at + len(blob)] = blob
    return bytes(out)


@pytest.fixture(scope="module")
def small_objects():
    objs = []
    if shutil.which("gcc"):
        objs.append(builders.stub_library("libpk_stub.so.1", ("pk_one", "pk_two")))
    if builders.nvcc():
        objs.append(builders.cuda_object("sm_120+compute_120"))
    if not objs:
        pytest.skip("needs gcc or nvcc")
    return [open(p, "rb").read() for p in objs]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(which=st.integers(0, 1), mutation=_mutations())
def test_malformed_object_is_one_finding_never_a_traceback(
    tmp_path_factory, small_objects, which, mutation
):
    data = _mutate(small_objects[which % len(small_objects)], *mutation)
    folder = tmp_path_factory.mktemp("m")
    path = folder / "common_ops.abi3.so"
    path.write_bytes(data)
    report = analyze_file(str(path), "sgl_kernel/common_ops.abi3.so", str(path))
    messages = [m for m in (report.error, report.fatbin_error) if m]
    assert all("\n" not in m for m in messages)


def test_malformed_in_env_gives_one_line(tmp_path, capsys, monkeypatch, small_objects):
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    bad = small_objects[-1][:3000]
    site = builders.make_site(
        str(tmp_path),
        None,
        {
            "sgl_kernel/common_ops.abi3.so": bad,
            "sgl_kernel/spatial_ops.abi3.so": b"\x7fELF\x02\x01" + b"\xff" * 80,
        },
    )
    rc = main(["verify", "--env", site])
    out = capsys.readouterr().out.splitlines()
    mine = [ln for ln in out if "sgl_kernel/" in ln]
    assert rc == 1 and len(mine) == 2 and all(LINE.match(ln) for ln in mine), out


@pytest.mark.parametrize("size", [4, 11, 19])
def test_a_truncated_elf_of_a_few_bytes_is_named_in_env_and_wheelhouse(
    tmp_path, capsys, monkeypatch, size
):
    """An ELF cut off inside its first 20 bytes (an interrupted copy) was skipped without a
    word, where one cut at 21 bytes is malformed: both are one finding naming the file."""
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    stub = (b"\x7fELF\x02\x01\x01" + bytes(16))[:size]
    site = builders.make_site(str(tmp_path / "env"), None, {"sgl_kernel/common_ops.abi3.so": stub})
    house = tmp_path / "house"
    house.mkdir()
    builders.make_wheel(
        str(house), "pkstub-1.0-cp311-cp311-linux_x86_64.whl", {"pkstub/_core.so": stub}
    )
    for args, name in (
        (["verify", "--env", site], "sgl_kernel/common_ops.abi3.so"),
        (["verify", "--wheelhouse", str(house)], "pkstub/_core.so"),
    ):
        rc = main(args)
        out = capsys.readouterr().out.splitlines()
        mine = [ln for ln in out if name in ln]
        assert rc == 1 and len(mine) == 1 and "too short" in mine[0], out


def test_a_link_loop_in_the_env_is_skipped_like_a_dangling_link(
    tmp_path, monkeypatch, small_objects
):
    """A link loop anywhere in site-packages stopped verify ("Too many levels of symbolic
    links", exit 2); it is no file to check, as a dangling link is not: the same findings."""
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    objects = {"sgl_kernel/common_ops.abi3.so": small_objects[-1]}
    site = builders.make_site(str(tmp_path / "a"), None, objects)
    plain = verify(env=site, use_cache=False).to_dict()
    os.symlink("loop2.so", os.path.join(site, "sgl_kernel", "loop1.so"))
    os.symlink("loop1.so", os.path.join(site, "sgl_kernel", "loop2.so"))
    os.symlink("nowhere.so", os.path.join(site, "sgl_kernel", "dangling.so"))
    looped = verify(env=site, use_cache=False).to_dict()
    for report in (plain, looped):
        report.pop("seconds", None)
    assert looped == plain


# ---------------------------------------------------------------- a real third-party wheel

WHEEL_SPEC = "torchao==0.14.1"


def _fetch_wheel() -> str:
    folder = os.path.join(os.path.dirname(builders.ARTIFACTS), "wheels")
    found = glob.glob(os.path.join(folder, "torchao-0.14.1-*.whl"))
    if found:
        return found[0]
    os.makedirs(folder, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "--platform",
        "manylinux_2_28_x86_64",
        "-d",
        folder,
        WHEEL_SPEC,
    ]
    if subprocess.run(cmd, capture_output=True, timeout=300).returncode:
        pytest.skip(f"cannot download {WHEEL_SPEC}")
    return glob.glob(os.path.join(folder, "torchao-0.14.1-*.whl"))[0]


def _readelf(args: list[str], path: str) -> str:
    return subprocess.run(
        ["readelf", *args, path], capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.slow
def test_real_cuda_extension_wheel(tmp_path, cache_dir):
    if shutil.which("readelf") is None:
        pytest.skip("needs readelf")
    wheel = _fetch_wheel()
    house = tmp_path / "house"
    house.mkdir()
    shutil.copy(wheel, house)
    report = verify(wheelhouse=str(house), profile="cu130-sm120", cache_dir=cache_dir)
    by_check: dict[str, list] = {}
    for f in report.findings:
        by_check.setdefault(f.check, []).append(f)
        assert LINE.match(f.line())

    # Independently: what readelf says each shared object NEEDs.
    with zipfile.ZipFile(wheel) as zf:
        sos = [n for n in zf.namelist() if n.endswith(".so")]
        zf.extractall(tmp_path / "x", members=sos)
    needs_cu12 = set()
    for so in sos:
        needed = re.findall(
            r"\(NEEDED\)\s+Shared library: \[(.+?)\]", _readelf(["-d"], str(tmp_path / "x" / so))
        )
        if "libcudart.so.12" in needed:
            needs_cu12.add(so)
    assert needs_cu12, "torchao 0.14.1 links the CUDA 12 runtime"
    # One finding for the CUDA 12 build, every such object in its evidence; the missing
    # libcudart.so.12 is part of it, not a second error per object.
    (major,) = by_check["cuda-major"]
    assert major.file == wheel.rsplit("/", 1)[1]
    assert {e.split(": ", 1)[0].split("!", 1)[1] for e in major.evidence} == needs_cu12
    assert "a CUDA 12 build" in major.message and "but torch is CUDA 13" in major.message
    assert not [f for f in by_check.get("needed-missing", []) if "libcudart.so.12" in f.message]
    assert [f.check for f in by_check["torch-from-profile"]] == ["torch-from-profile"]
    # GLIBC: the newest GLIBC_ version readelf -V lists vs the manylinux_2_28 tag.
    need = max(
        tuple(map(int, v))
        for so in sos
        for v in re.findall(r"GLIBC_(\d+)\.(\d+)", _readelf(["-V"], str(tmp_path / "x" / so)))
    )
    assert ("wheel-glibc-tag" in by_check) == (need > (2, 28))


@pytest.mark.slow
def test_real_wheel_over_env_symbols(tmp_path, cache_dir, torch_dir):
    """Over the venv's torch, each undefined torch symbol the verifier reports is one that
    `nm -D` finds undefined in the extension and defined in none of torch's libraries."""
    wheel = _fetch_wheel()
    house = tmp_path / "house"
    house.mkdir()
    shutil.copy(wheel, house)
    site = builders.make_site(str(tmp_path), torch_dir)
    report = verify(env=site, wheelhouse=str(house), cache_dir=cache_dir, host_checks=False)
    reported = {
        f.message.split()[2]
        for f in report.findings
        if f.check == "undefined-symbol" and f.file.endswith("torchao/_C.abi3.so")
    }
    with zipfile.ZipFile(wheel) as zf:
        zf.extract("torchao/_C.abi3.so", tmp_path / "x")
    ext = str(tmp_path / "x" / "torchao" / "_C.abi3.so")
    nm = subprocess.run(
        ["nm", "-D", "--undefined-only", ext], capture_output=True, text=True
    ).stdout
    undefined = {ln.split()[-1].split("@")[0] for ln in nm.splitlines() if " U " in ln}
    defined = set()
    for lib in (
        "libc10.so",
        "libtorch.so",
        "libtorch_cpu.so",
        "libtorch_cuda.so",
        "libc10_cuda.so",
    ):
        out = subprocess.run(
            ["nm", "-D", "--defined-only", f"{torch_dir}/lib/{lib}"], capture_output=True, text=True
        ).stdout
        defined |= {ln.split()[-1].split("@")[0] for ln in out.splitlines() if ln.strip()}
    torch_undefined = {
        s
        for s in undefined
        if s.startswith(("_ZN3c10", "_ZNK3c10", "_ZN2at", "_ZNK2at", "_ZN5torch", "_ZNK5torch"))
    }
    expected = torch_undefined - defined
    assert reported == set(sorted(expected)[: len(reported)]) or reported <= expected
    assert bool(reported) == bool(expected)


def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton  # carries NVIDIA's binary utilities
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return path if os.access(path, os.X_OK) else None


@pytest.mark.slow
def test_real_wheel_fatbin_images_match_cuobjdump(tmp_path):
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("needs cuobjdump (CUDA toolkit or triton)")
    wheel = _fetch_wheel()
    with zipfile.ZipFile(wheel) as zf:
        sos = [n for n in zf.namelist() if n.endswith(".so")]
        zf.extractall(tmp_path, members=sos)
    for so in sos:
        path = str(tmp_path / so)
        report = analyze_file(path, so, path)
        ours = sorted(
            f"sm_{e.arch}" for f in report.fatbins for e in f.entries if e.kind == "cubin"
        )
        listing = subprocess.run([tool, "--list-elf", path], capture_output=True, text=True).stdout
        theirs = sorted(re.findall(r"\.(sm_\d+)[a-z]?\.cubin", listing))
        assert ours == theirs, so
