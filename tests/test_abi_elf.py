"""ELF facts and the loader/symbol checks, on objects gcc builds against the installed torch."""

from __future__ import annotations

import subprocess

import pytest

from patchkit.abi import verify
from patchkit.abi.elf import MalformedElf, read_elf
from tests.abi import builders

pytest_plugins = ["tests.abi.fixtures"]

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _readelf_needed(path: str) -> list[str]:
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def _nm_undefined(path: str) -> set[str]:
    """Strong undefined dynamic symbols (nm's "U"; weak ones are "w"/"v")."""
    out = subprocess.run(
        ["nm", "-D", "--undefined-only", path], capture_output=True, text=True
    ).stdout
    return {
        line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()[:1] == ["U"]
    }


def test_elf_facts_match_readelf_and_nm(torch_dir):
    ext = builders.torch_extension("ok")
    info = read_elf(ext)
    assert info.needed == _readelf_needed(ext)
    assert set(info.undefined) == _nm_undefined(ext)
    assert info.cxx11_abi == 1
    c10 = read_elf(f"{torch_dir}/lib/libc10.so")
    assert c10.soname == "libc10.so"
    assert "_ZN3c1010TensorImpl17release_resourcesEv" in c10.defined
    assert "GLIBCXX_3.4" in c10.verneed["libstdc++.so.6"]


def test_elf_facts_match_pyelftools(torch_dir):
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    path = f"{torch_dir}/lib/libc10.so"
    info = read_elf(path)
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        dyn = next(s for s in elf.iter_sections() if isinstance(s, DynamicSection))
        needed = [t.needed for t in dyn.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
        symtab = elf.get_section_by_name(".dynsym")
        defined = {
            sym.name
            for sym in symtab.iter_symbols()
            if sym["st_shndx"] != "SHN_UNDEF"
            and sym.name
            and sym["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE", "STB_LOOS")
            and sym["st_other"]["visibility"] in ("STV_DEFAULT", "STV_PROTECTED")
        }
        vn = next(s for s in elf.iter_sections() if isinstance(s, GNUVerNeedSection))
        verneed = {v.name: [a.name for a in auxes] for v, auxes in vn.iter_versions()}
    assert info.needed == needed
    assert info.defined == defined
    assert info.verneed == verneed


def test_abi0_build_is_detected(torch_dir):
    assert read_elf(builders.torch_extension("abi0")).cxx11_abi == 0


def test_not_elf_is_one_error(tmp_path):
    bad = tmp_path / "x.so"
    bad.write_bytes(b"not an elf file at all" * 8)
    with pytest.raises(MalformedElf, match="wrong magic"):
        read_elf(str(bad))


def _findings(report, file_part: str) -> list:
    return [f for f in report.findings if file_part in f.file]


def test_resolvable_torch_symbols_give_no_finding(tmp_path, torch_dir, cache_dir):
    site = builders.make_site(
        str(tmp_path), torch_dir, {"myext/_ok.so": builders.torch_extension("ok")}
    )
    report = verify(env=site, profile="cu130-sm120", cache_dir=cache_dir, host_checks=False)
    assert _findings(report, "myext") == []
    # torch's own closure loads; the only error allowed is the venv's torch build (PyPI's
    # 2.9.1 is +cu128, not the profile's +cu130).
    assert {f.check for f in report.findings if f.severity == "error"} <= {"torch-variant"}


def test_unresolvable_torch_symbol(tmp_path, torch_dir, cache_dir):
    site = builders.make_site(
        str(tmp_path), torch_dir, {"myext/_missing.so": builders.torch_extension("missing")}
    )
    report = verify(env=site, cache_dir=cache_dir, host_checks=False)
    found = _findings(report, "myext")
    assert [f.check for f in found] == ["undefined-symbol"]
    assert found[0].message == (
        "undefined symbol: _ZNK3c1010TensorImpl15decref_pyobjectEv "
        "(c10::TensorImpl::decref_pyobject() const)"
    )
    assert "rebuild it against this torch" in found[0].hint
    assert found[0].severity == "error"


def test_cxx11_abi_mismatch(tmp_path, torch_dir, cache_dir):
    """The Ss-mangled overload sglang#5100 describes, which torch exports with the C++11 ABI's
    mangling: one cxx11-abi finding with both names as evidence, not also an undefined-symbol
    finding saying to rebuild against another torch."""
    site = builders.make_site(
        str(tmp_path), torch_dir, {"myext/_abi0.so": builders.torch_extension("abi0")}
    )
    report = verify(env=site, cache_dir=cache_dir, host_checks=False)
    checks = {f.check: f for f in _findings(report, "myext")}
    assert set(checks) == {"cxx11-abi"}
    f = checks["cxx11-abi"]
    assert "_GLIBCXX_USE_CXX11_ABI=0 but torch uses 1" in f.message
    assert "symbols like c10::detail::torchCheckFail(" in f.message
    assert f.hint == "rebuild with -D_GLIBCXX_USE_CXX11_ABI=1"
    (line,) = f.evidence
    assert line.startswith("_ZN3c106detail14torchCheckFailEPKcS2_jRKSs: undefined (")
    assert line.endswith(
        "torch exports _ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_string"
        "IcSt11char_traitsIcESaIcEEE"
    )


def test_missing_needed_and_cuda_major(tmp_path, torch_dir, cache_dir):
    # The verifying host's own CUDA toolkit (this machine has a CUDA 13 one) is never searched.
    cudart13 = builders.stub_library("libcudart.so.13", ("cudaGetLastError",))
    ext = builders.linking("needs-cudart13", [cudart13], "cudaGetLastError")
    other = builders.stub_library("libpk_other.so.1", ("pk_one",))
    ext2 = builders.linking("needs-other", [other], "pk_one")
    site = builders.make_site(
        str(tmp_path),
        torch_dir,
        {"sgl_kernel/common_ops.abi3.so": ext, "sgl_kernel/spatial_ops.abi3.so": ext2},
    )
    report = verify(env=site, cache_dir=cache_dir, host_checks=False)
    found = {f.check: f for f in _findings(report, "sgl_kernel")}
    # One finding for the wrong CUDA build, its missing runtime as evidence, not a second error.
    major = found["cuda-major"]
    assert "a CUDA 13 build: 1 object(s) need libcudart.so.13 but torch is CUDA 12" in (
        major.message
    )
    assert major.evidence == (f"{site}/sgl_kernel/common_ops.abi3.so: needs libcudart.so.13",)
    assert found["needed-missing"].message.startswith(
        "libpk_other.so.1: cannot open shared object file: No such file or directory"
    )
    assert found["needed-missing"].file.endswith("spatial_ops.abi3.so")


def test_needed_found_through_ld_library_path(tmp_path, torch_dir, cache_dir):
    cudart13 = builders.stub_library("libpk_other.so.1", ("pk_one",))
    ext = builders.linking("needs-other", [cudart13], "pk_one")
    site = builders.make_site(
        str(tmp_path),
        torch_dir,
        {
            "cudalibs/libpk_other.so.1": cudart13,
            "sgl_kernel/common_ops.abi3.so": ext,
        },
    )
    env = {"LD_LIBRARY_PATH": f"{site}/cudalibs"}
    report = verify(env=site, cache_dir=cache_dir, host_checks=False, environ=env)
    assert "needed-missing" not in {f.check for f in report.findings}
    report = verify(env=site, cache_dir=cache_dir, host_checks=False, environ={})
    assert "needed-missing" in {f.check for f in report.findings}


def test_exported_names_stored_joined_unless_a_name_holds_the_separator():
    """Exports are stored as one SEP-joined string and made a set on first lookup; a name
    holding SEP (ELF allows any byte but NUL) is stored as a list, so no name is split."""
    from patchkit.abi.elf import SEP, Names, _lines, _names_of, name_set

    plain = {"_ZN3c106detail", "cudaMalloc", "f"}
    stored = _lines(frozenset(plain))
    assert isinstance(stored, str) and stored.count(SEP) == 2
    back = _names_of(stored)
    assert isinstance(back, Names) and _lines(back) == stored  # kept as read until looked up
    assert back == plain and name_set(back) == plain
    assert sorted(_lines(back).split(SEP)) == sorted(plain)  # joined again from the set
    odd = {f"a{SEP}b", "c"}
    assert _lines(frozenset(odd)) in ([f"a{SEP}b", "c"], ["c", f"a{SEP}b"])
    assert _names_of(_lines(frozenset(odd))) == odd
    assert _names_of("") == set() and _lines(_names_of("")) == ""


# -- crafted objects whose entries all point at one string ---------------------------------

SHT_STRTAB, SHT_DYNAMIC, SHT_DYNSYM, SHT_VERNEED = 3, 6, 11, 0x6FFFFFFE


def _crafted(sections) -> bytes:
    """An ELF64 object of section headers only: (name, type, data, sh_link, entsize) each."""
    import struct

    shstr = b"\0" + b"".join(name.encode() + b"\0" for name, *_ in sections) + b".shstrtab\0"
    body, offsets = bytearray(64), []
    for _, _, data, _, _ in sections:
        body += b"\0" * (-len(body) % 16)
        offsets.append(len(body))
        body += data
    body += b"\0" * (-len(body) % 16)
    shstr_off = len(body)
    body += shstr + b"\0" * (-len(shstr) % 16)
    shoff = len(body)

    def header(name, kind, off, size, link=0, entsize=0):
        return struct.pack("<IIQQQQIIQQ", name, kind, 0, off, off, size, link, 0, 8, entsize)

    table, name_off = header(0, 0, 0, 0), 1
    for (name, kind, data, link, entsize), off in zip(sections, offsets, strict=True):
        table += header(name_off, kind, off, len(data), link, entsize)
        name_off += len(name) + 1
    table += header(name_off, SHT_STRTAB, shstr_off, len(shstr))
    count = len(sections) + 2
    body += table
    body[:64] = (
        b"\x7fELF"
        + bytes([2, 1, 1, 0])
        + b"\0" * 8
        + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 56, 0, 64, count, count - 1)
    )
    return bytes(body)


def _dynamic(entries) -> bytes:
    import struct

    return b"".join(struct.pack("<qQ", tag, value) for tag, value in [*entries, (0, 0)])


@pytest.mark.parametrize(
    "count,length,why",
    [(8192, 131072, "longer than 4096 bytes"), (8192, 100, "more than 4096 needed")],
)
def test_needed_entries_naming_one_long_string_are_malformed(tmp_path, count, length, why):
    """8,192 DT_NEEDED entries at one 128 kB name would read as 1 GiB of names."""
    strings = b"\0" + b"x" * length + b"\0"
    path = tmp_path / "bomb.so"
    dynamic = _dynamic([(1, 1)] * count)
    path.write_bytes(_crafted([(".dynstr", SHT_STRTAB, strings, 0, 0),
                               (".dynamic", SHT_DYNAMIC, dynamic, 1, 16)]))  # fmt: skip
    with pytest.raises(MalformedElf, match=why):
        read_elf(str(path))
    dynamic = _dynamic([(1, 1)] * 3)
    path.write_bytes(_crafted([(".dynstr", SHT_STRTAB, b"\0libc.so.6\0", 0, 0),
                               (".dynamic", SHT_DYNAMIC, dynamic, 1, 16)]))  # fmt: skip
    assert read_elf(str(path)).needed == ["libc.so.6"] * 3  # a few repeats stand


def test_version_needs_sharing_one_chain_are_malformed(tmp_path):
    """4,096 libraries' version entries all pointing at one 4,096-long chain: 16.7 M names."""
    import struct

    k = 256
    strings = b"\0libx.so\0" + b"V" * 100 + b"\0"
    data = bytearray()
    for i in range(k):
        data += struct.pack("<HHIII", 1, k, 1, k * 16 - i * 16, 16)
    for j in range(k):
        data += struct.pack("<IHHII", 0, 0, 2 + j, 9, 16 if j < k - 1 else 0)
    path = tmp_path / "v.so"
    path.write_bytes(_crafted([(".dynstr", SHT_STRTAB, strings, 0, 0),
                               (".gnu.version_r", SHT_VERNEED, bytes(data), 1, 0)]))  # fmt: skip
    with pytest.raises(MalformedElf, match="overlap"):
        read_elf(str(path))


def test_symbols_naming_one_long_string_are_malformed(tmp_path):
    import struct

    strings = b"\0" + b"s" * 65536 + b"\0"
    symbols = b"\0" * 24 + struct.pack("<IBBHQQ", 1, 0x12, 0, 1, 0, 0) * 16384
    path = tmp_path / "s.so"
    path.write_bytes(_crafted([(".dynstr", SHT_STRTAB, strings, 0, 0),
                               (".dynsym", SHT_DYNSYM, symbols, 1, 24)]))  # fmt: skip
    with pytest.raises(MalformedElf, match="symbol names overlap"):
        read_elf(str(path))
