"""Wheel members read by verify's own inflater (abi_members._pieces): real gcc/nvcc-built objects,
zipped stored and deflated, give the same report as the extracted file; a corrupt or lying
member is an ``invalid archive`` error, never a wrong report."""

from __future__ import annotations

import glob
import importlib
import json
import os
import struct
import zipfile
import zlib

import pytest

from patchkit.abi import members as abi_members
from patchkit.abi import scan, sources, verify
from patchkit.abi.cache import ResultCache
from patchkit.abi.scan import analyze_file
from tests.abi import builders

METHODS = {"stored": zipfile.ZIP_STORED, "deflated": zipfile.ZIP_DEFLATED}
# Read through zipfile (the member reader handles stored and deflated only).
OTHER_METHODS = {"bzip2": zipfile.ZIP_BZIP2, "lzma": zipfile.ZIP_LZMA}


def _backends():
    out = [pytest.param(zlib, id="zlib")]
    for name in ("zlib_ng.zlib_ng", "isal.isal_zlib"):
        try:
            out.append(pytest.param(importlib.import_module(name), id=name.split(".")[0]))
        except ImportError:
            out.append(pytest.param(None, id=name.split(".")[0], marks=pytest.mark.skip(
                reason=f"{name} not installed")))  # fmt: skip
    return out


def _objects() -> dict[str, str]:
    """Installed path -> a real object built here (gcc always; nvcc where present)."""
    try:
        cudart = builders.stub_library("libcudart.so.13", ("cudaLaunchKernel",))
        objs = {
            "demo/libcudart.so.13": cudart,
            "demo/libuse.so": builders.linking("use", [cudart], call="cudaLaunchKernel"),
            "demo/liblogf.so": builders.logf_library(),
        }
    except FileNotFoundError:
        pytest.skip("gcc not installed")
    if builders.nvcc():
        objs["demo/libkern.so"] = builders.cuda_object("sm_120a")
        objs["demo/kern.cubin"] = builders.device_code("cubin", "sm_120a")
        objs["demo/kern.fatbin"] = builders.device_code("fatbin", "sm_90")
        objs["demo/kern.ptx"] = builders.device_code("ptx", "sm_120")
    return objs


def _wheel(path, objs: dict[str, str], method: int) -> str:
    with zipfile.ZipFile(path, "w", method) as zf:
        zf.writestr(
            "demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n\n"
        )
        for arc, src in objs.items():
            zf.write(src, arc)
        zf.writestr("demo-1.0.dist-info/RECORD", "")
    return str(path)


def _same(report) -> dict:
    d = report.to_json()
    if d["elf"]:
        d["elf"]["defined"] = sorted(report.elf.defined)
        d["elf"]["path"] = None
    return d


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("method", list(METHODS) + list(OTHER_METHODS))
def test_member_reports_equal_extracted_file(tmp_path, monkeypatch, method, backend):
    if method in OTHER_METHODS and backend is not zlib:
        pytest.skip("bz2 and lzma decode these: the inflate backend plays no part")
    monkeypatch.setattr(abi_members, "_BACKEND", [backend])
    monkeypatch.setattr(abi_members, "INFLATE_STEP", 4096)  # many steps per member
    objs = _objects()
    house = tmp_path / "house"
    house.mkdir()
    _wheel(house / "demo-1.0-py3-none-any.whl", objs, {**METHODS, **OTHER_METHODS}[method])
    tree = sources.read_wheelhouse(str(house), str(tmp_path / "scratch"))
    sources.classify_pending(tree)
    assert set(tree.members) == set(objs)
    for rel, src in objs.items():
        member = tree.members[rel]
        got = scan._analyze_member(member)
        want = analyze_file(src, rel, member.origin, member.kind)
        assert got.error is None, got.error
        if member.kind == "elf":
            # Over an mmap the fatbin images stay closed until a check needs them; bytes in
            # memory (a member) have them opened at once: compare like with like, and the
            # facts both give.
            with open(src, "rb") as fh:
                in_memory = scan.analyze_buffer(fh.read(), rel, member.origin)
            assert _same(got) == _same(in_memory), rel
            assert _same(got)["elf"] == _same(want)["elf"], rel
            assert [f.archs for f in got.fatbins] == [f.archs for f in want.fatbins], rel
        else:
            assert _same(got) == _same(want), rel
        # the whole member, byte for byte, as stored
        with open(src, "rb") as fh:
            assert bytes(abi_members.read_member(member)) == fh.read()
    # the extraction path (members too large for memory) inflates the same way
    monkeypatch.setattr(scan, "IN_MEMORY_BYTES", 0)
    member = tree.members["demo/libuse.so"]
    assert _same(scan._analyze_member(member)) == _same(  # a plain library: no fatbin
        analyze_file(objs["demo/libuse.so"], "demo/libuse.so", member.origin)
    )
    assert not os.listdir(tmp_path / "scratch" / "demo")  # the scratch copy is gone


def _data_offset(path: str, name: str) -> tuple[int, zipfile.ZipInfo]:
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name)
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        head = fh.read(30)
    n, e = struct.unpack("<HH", head[26:30])
    return info.header_offset + 30 + n + e, info


def _patch(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def _central_entry(path: str, name: str) -> int:
    """Offset of ``name``'s central-directory entry."""
    raw = open(path, "rb").read()
    pos = raw.index(b"PK\x01\x02")
    while True:
        n = struct.unpack_from("<H", raw, pos + 28)[0]
        if raw[pos + 46 : pos + 46 + n] == name.encode():
            return pos
        pos = raw.index(b"PK\x01\x02", pos + 4)


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("damage", ["flipped byte", "size understated", "renamed header"])
def test_damaged_member_is_invalid_archive(tmp_path, method, damage):
    objs = {"demo/libuse.so": _objects()["demo/libuse.so"]}
    house = tmp_path / "house"
    house.mkdir()
    wheel = _wheel(house / "demo-1.0-py3-none-any.whl", objs, METHODS[method])
    start, info = _data_offset(wheel, "demo/libuse.so")
    if damage == "flipped byte":
        # a byte in the middle of the member's stored data (past the 64-byte head verify
        # classifies by, so the member is still taken for an ELF object)
        at = start + info.compress_size // 2
        _patch(wheel, at, bytes([open(wheel, "rb").read()[at] ^ 0x55]))
    elif damage == "size understated":
        cd = _central_entry(wheel, "demo/libuse.so")
        _patch(wheel, cd + 24, struct.pack("<I", info.file_size - 100))
    else:
        _patch(wheel, info.header_offset + 30, b"d" + b"X")  # "dXmo/libuse.so"
    abi_members.forget_open()
    if damage == "renamed header":  # refused where the member's head is read
        tree = sources.read_wheelhouse(str(house), str(tmp_path / "scratch"))
        sources.classify_pending(tree)
        assert tree.invalid and "local header names" in tree.invalid[0][1]
        assert not tree.members and not tree.dists
        # the same where verify reads it: in the worker that classifies the member
        tree = sources.read_wheelhouse(str(house), str(tmp_path / "scratch"))
        reports = scan.analyze_tree(tree, ResultCache(str(tmp_path / "cache")), jobs=1)
        assert not reports and not tree.members and not tree.dists
        assert tree.invalid and "local header names" in tree.invalid[0][1]
        return
    tree = sources.read_wheelhouse(str(house), str(tmp_path / "scratch"))
    sources.classify_pending(tree)
    report = scan._analyze_member(tree.members["demo/libuse.so"])
    assert report.error and report.error.startswith("invalid archive"), report.error
    assert report.elf is None
    # read unclassified, as verify's workers read it: the same error for the member
    tree = sources.read_wheelhouse(str(house), str(tmp_path / "scratch"))
    reports = scan.analyze_tree(tree, ResultCache(str(tmp_path / "cache")), jobs=1)
    assert reports["demo/libuse.so"].error == report.error
    assert tree.members["demo/libuse.so"].kind == "elf" and not tree.invalid


def test_verify_damaged_wheel_in_workers(tmp_path, monkeypatch):
    """The renamed local header, found by a forked worker: the wheel is one invalid-archive
    error and nothing else, as when it was found listing the wheel; the other wheel is read."""
    objs = _objects()
    house = tmp_path / "house"
    house.mkdir()
    wheel = _wheel(house / "demo-1.0-py3-none-any.whl", objs, zipfile.ZIP_DEFLATED)
    _, info = _data_offset(wheel, "demo/libuse.so")
    _patch(wheel, info.header_offset + 30, b"dX")
    _wheel(house / "good-1.0-py3-none-any.whl", {"good/liblogf.so": objs["demo/liblogf.so"]},
           zipfile.ZIP_DEFLATED)  # fmt: skip
    abi_members.forget_open()
    monkeypatch.setattr(scan, "PARALLEL_BYTES", 0)  # a pool of workers however small
    report = verify(wheelhouse=str(house), cache_dir=str(tmp_path / "c"), jobs=2)
    demo = [f for f in report.findings if "demo-1.0" in f.file]
    assert [f.check for f in demo] == ["invalid-archive"]
    assert "local header names" in demo[0].message
    assert report.files == 1  # good/liblogf.so


def test_a_wheel_that_is_a_fifo_or_a_device_is_named_not_read(tmp_path):
    """`*.whl` names a FIFO (reading it would block forever) and a link to /dev/zero (its
    end is never found: it read until memory ran out): each is one invalid-archive error,
    and the real wheel beside them is read."""
    objs = _objects()
    house = tmp_path / "house"
    house.mkdir()
    os.mkfifo(house / "fifo-1.0-py3-none-any.whl")
    (house / "zero-1.0-py3-none-any.whl").symlink_to("/dev/zero")
    _wheel(house / "good-1.0-py3-none-any.whl", {"good/liblogf.so": objs["demo/liblogf.so"]},
           zipfile.ZIP_DEFLATED)  # fmt: skip
    abi_members.forget_open()
    report = verify(wheelhouse=str(house), cache_dir=str(tmp_path / "c"), jobs=1)
    bad = {f.file: f.message for f in report.findings if f.check == "invalid-archive"}
    assert sorted(bad) == ["fifo-1.0-py3-none-any.whl", "zero-1.0-py3-none-any.whl"], bad
    assert "a FIFO, not a regular file" in bad["fifo-1.0-py3-none-any.whl"]
    assert "a character device" in bad["zero-1.0-py3-none-any.whl"]
    assert report.files == 1


def _zipinfo_entries(path: str) -> list:
    with zipfile.ZipFile(path) as zf:
        return [
            (i.filename, i.header_offset, i.compress_size, i.file_size, i.CRC, i.compress_type,
             i.flag_bits, i.external_attr)
            for i in zf.infolist()
        ]  # fmt: skip


def test_central_directory_equals_zipfile(tmp_path):
    """The one-read directory parser gives zipfile's entries, on real wheels from the index
    (where cached) and on a zip with bytes prepended, which goes through zipfile itself."""
    paths = sorted(glob.glob(os.path.join(builders.WHEELS, "*.whl")))
    odd = tmp_path / "odd.zip"
    with zipfile.ZipFile(odd, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("a/b\u00e9.so", b"\x7fELF" + b"\0" * 60)  # a UTF-8 name
        zf.writestr(zipfile.ZipInfo("c/d.so"), b"x" * 100)
    prepended = tmp_path / "prepended.zip"
    prepended.write_bytes(b"#!/bin/sh\n" * 10 + odd.read_bytes())
    for path in [*paths, str(odd), str(prepended)]:
        got = [
            (e.filename, e.header_offset, e.compress_size, e.file_size, e.CRC, e.compress_type,
             e.flag_bits, e.external_attr)
            for e in abi_members.central_directory(path)
        ]  # fmt: skip
        assert got == _zipinfo_entries(path), path
    assert abi_members._fast_directory(str(odd)) is not None
    assert abi_members._fast_directory(str(prepended)) is None  # zipfile's way


def test_unchanged_wheelhouse_is_not_opened(tmp_path, monkeypatch):
    """Warm: each wheel known by (path, size, mtime) -- no central directory is parsed, the
    same findings come back; a wheel touched since is listed again, the others are not."""
    objs = _objects()
    house = tmp_path / "house"
    house.mkdir()
    _wheel(house / "demo-1.0-py3-none-any.whl", objs, zipfile.ZIP_DEFLATED)
    _wheel(house / "other-1.0-py3-none-any.whl", {"other/liblogf.so": objs["demo/liblogf.so"]},
           zipfile.ZIP_DEFLATED)  # fmt: skip
    cache = str(tmp_path / "cache")
    cold = verify(wheelhouse=str(house), cache_dir=cache)
    listed: list[str] = []
    real = abi_members.central_directory
    monkeypatch.setattr(
        sources, "central_directory", lambda path: listed.append(path) or real(path)
    )
    warm = verify(wheelhouse=str(house), cache_dir=cache)
    assert warm.cached and not listed
    assert [f.to_dict() for f in warm.findings] == [f.to_dict() for f in cold.findings]
    assert warm.files == cold.files == len(objs) + 1
    # another profile: the run misses, each wheel's listing and reports are reused
    other = verify(wheelhouse=str(house), cache_dir=cache, profile="cu130-sm90")
    assert not other.cached and not listed and other.files == cold.files
    st = os.stat(house / "other-1.0-py3-none-any.whl")
    os.utime(house / "other-1.0-py3-none-any.whl", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    again = verify(wheelhouse=str(house), cache_dir=cache)
    assert not again.cached and [os.path.basename(p) for p in listed] == [
        "other-1.0-py3-none-any.whl"
    ]
    assert [f.to_dict() for f in again.findings] == [f.to_dict() for f in cold.findings]


def test_small_cubins_read_to_their_note(tmp_path):
    """flashinfer-cubin 0.6.3's raw cubins (real, from PyPI): each member is inflated only as
    far as its tkinfo note, and says what the whole file says -- SM, a/f variant, toolkit, that
    it holds kernels (its section names, first in the file, name `.text.` sections)."""
    wheel = builders.real_wheelhouse(
        tmp_path / "house", "flashinfer-cubin==0.6.3", "flashinfer_cubin-0.6.3-*.whl"
    )
    house = wheel.parent
    tree = sources.read_wheelhouse(str(house), str(tmp_path / "scratch"))
    members = sorted(tree.members.values(), key=lambda m: m.size)
    sample = members[:: max(1, len(members) // 40)]
    inflated = []
    real = abi_members.head_chunks

    def counting(member, step=abi_members.HEAD_STEP):
        for piece in real(member, step):
            inflated.append(len(piece))
            yield piece

    def whole(member):
        data = abi_members.read_member(member)
        inflated.append(len(data))
        return data

    abi_members.forget_open()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(abi_members, "head_chunks", counting)
        mp.setattr(scan, "head_chunks", counting)
        mp.setattr(scan, "read_member", whole)
        got = {m.relpath: scan._analyze_member(m) for m in sample}
    with zipfile.ZipFile(wheel) as zf:
        for m in sample:
            path = tmp_path / "one.cubin"
            path.write_bytes(zf.read(m.relpath))
            want = analyze_file(str(path), m.relpath, m.origin, "cubin")
            (g,), (w,) = got[m.relpath].fatbins, want.fatbins
            assert got[m.relpath].kind == "cubin" and got[m.relpath].error is None
            assert (g.archs, g.toolkit, g.has_kernels) == (w.archs, w.toolkit, True), m.relpath
            assert w.kernels and w.kernels > 0
    assert sum(inflated) < sum(m.size for m in sample) / 2  # read whole: all of it


def test_tampered_listing_is_a_miss(tmp_path):
    """A wheel's cached listing is data checked field by field: one naming a member of an
    unknown kind, or with a field of the wrong type, is a miss -- the wheel is listed again
    and the findings are those of a cold run."""
    objs = _objects()
    house = tmp_path / "house"
    house.mkdir()
    wheel = _wheel(house / "demo-1.0-py3-none-any.whl", objs, zipfile.ZIP_DEFLATED)
    cache = ResultCache(str(tmp_path / "cache"))
    cold = verify(wheelhouse=str(house), cache_dir=str(tmp_path / "cache"))
    stamp = sources._stamp(wheel)
    path = cache._path("listing:" + stamp[0])
    doc = json.loads(open(path, encoding="utf-8").read())
    assert {m[0] for m in doc["value"]["members"]} == set(objs)
    for tamper in ("kind", "type"):
        bad = json.loads(json.dumps(doc))
        if tamper == "kind":
            bad["value"]["members"][0][1] = "shell"
        else:
            bad["value"]["members"][0][2] = "0"
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(bad, fh)
        assert sources._load_listing(cache, wheel, os.path.basename(wheel), stamp, "x") is None
        os.unlink(cache._path("run:" + str(house)))  # so the run reads the listing
        listed: list[str] = []
        real = abi_members.central_directory
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(
                sources, "central_directory", lambda p, seen=listed, f=real: seen.append(p) or f(p)
            )
            again = verify(wheelhouse=str(house), cache_dir=str(tmp_path / "cache"))
        assert listed and not again.cached  # listed again, not taken from the entry
        assert [f.to_dict() for f in again.findings] == [f.to_dict() for f in cold.findings]
