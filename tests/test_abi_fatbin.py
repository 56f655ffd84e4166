"""The fatbin container and the CUDA 13 arch rules, on objects nvcc builds for each arch kind."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from patchkit.abi.archs import CC, coverage, image_runs_on
from patchkit.abi.checks import predict
from patchkit.abi.fatbin import (
    FATBIN_MAGIC,
    MalformedFatbin,
    cubin_info,
    parse_fatbins,
    payload,
)
from patchkit.abi.scan import analyze_file
from tests.abi import builders

pytest_plugins = ["tests.abi.fixtures"]

TARGETS = (CC(9, 0), CC(12, 0), CC(12, 1))


@pytest.mark.parametrize("variant", sorted(builders.EXPECTED))
def test_coverage_verdicts(cuda_objects, variant):
    report = analyze_file(cuda_objects[variant], variant, variant)
    assert report.error is None and report.fatbin_error is None
    # one kernel fatbin (the TU's); nvcc -shared also adds an empty device-link fatbin
    assert len(report.kernel_fatbins) == 1, [f.archs for f in report.fatbins]
    got = tuple(predict(report, cc)["verdict"] for cc in TARGETS)
    assert got == builders.EXPECTED[variant]


def test_entries_flags_and_compression(cuda_objects):
    def entries(variant):
        report = analyze_file(cuda_objects[variant], variant, variant)
        return [e for f in report.kernel_fatbins for e in f.entries]

    (a,) = entries("sm_120a")
    assert (a.kind, a.arch, a.variant) == ("cubin", 120, "a")
    (f,) = entries("sm_120f")
    assert (f.arch, f.variant) == (120, "f")
    (ptx,) = entries("compute_120")
    assert ptx.kind == "ptx" and ptx.version[0] == 9  # PTX ISA 9.x from CUDA 13
    assert ptx.compression == "zstd"  # nvcc 13 compresses PTX by default
    (z,) = entries("sm_90-zstd")
    assert z.compression in ("zstd", "lz4") and z.uncompressed_size > z.compressed_size


def test_cubin_header_and_tkinfo(cuda_objects):
    from patchkit.abi.elf import open_mapped, read_elf

    path = cuda_objects["sm_120a-zstd"]
    info = read_elf(path)
    off, size, _ = info.section(".nv_fatbin")
    buf = open_mapped(path)
    try:
        fats = parse_fatbins(buf, off, off + size)
        kernel = [f for f in fats if any(e.uncompressed_size > 2048 for e in f.entries)]
        entry = kernel[0].entries[0]
        assert entry.compression in ("zstd", "lz4")
        image = payload(buf, entry, off)
    finally:
        buf.close()
    cubin = cubin_info(image)
    assert cubin.sm == 120 and cubin.kernels == 1
    assert cubin.toolkit == "13.0"
    assert cubin.target and cubin.target.startswith("sm_120")


def test_dlink_fatbin_has_no_kernels(cuda_objects):
    report = analyze_file(cuda_objects["sm_100f+compute_80"], "x", "x")
    empty = [f for f in report.fatbins if f.has_kernels is False]
    assert empty and all(not any(e.kind == "ptx" for e in f.entries) for f in empty)
    # the empty sm_100f device-link image must not count as coverage or as a failure on 9.0
    assert predict(report, CC(9, 0))["verdict"] == "jit"


@pytest.mark.parametrize(
    "kind,built,variant,cc,runs",
    [
        ("cubin", CC(12, 0), "", CC(12, 1), True),
        ("cubin", CC(12, 0), "a", CC(12, 1), False),
        ("cubin", CC(12, 0), "f", CC(12, 1), True),
        ("cubin", CC(10, 0), "f", CC(10, 3), True),
        ("cubin", CC(10, 3), "f", CC(10, 0), False),
        ("cubin", CC(9, 0), "", CC(12, 0), False),
        ("ptx", CC(8, 0), "", CC(12, 0), True),
        ("ptx", CC(12, 0), "", CC(9, 0), False),
        ("ptx", CC(12, 0), "a", CC(12, 1), False),
        ("ptx", CC(12, 0), "f", CC(12, 1), True),
    ],
)
def test_arch_rules(kind, built, variant, cc, runs):
    assert image_runs_on(kind, built, variant, cc) is runs


def test_cc_parse():
    assert CC.parse("12.0") == CC(12, 0) == CC.parse("sm_120") == CC.parse("120")
    assert CC.parse("9.0") == CC.parse("90")
    with pytest.raises(ValueError):
        CC.parse("hopper")


def _fatbin(entries: list[tuple[int, int, int, bytes]]) -> bytes:
    body = b""
    for kind, arch, flags, data in entries:
        hdr = struct.pack("<HHIQIIHHI", kind, 0x101, 0x40, len(data), 0, 0, 7, 1, arch)
        hdr += b"\0" * (0x28 - len(hdr)) + struct.pack("<Q", flags | 0x11) + b"\0" * 8
        hdr += struct.pack("<Q", 0)
        body += hdr + data
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def test_synthetic_fatbin_roundtrip():
    blob = _fatbin([(2, 90, 0x100000, b"\0" * 64), (1, 120, 0, b".version 9.0\n.entry k()\n")])
    (fat,) = parse_fatbins(blob)
    assert [e.name for e in fat.entries] == ["sm_90a", "compute_120"]
    assert coverage(fat, CC(12, 1)).verdict == "jit"
    assert coverage(fat, CC(9, 0)).verdict == "sass"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512), st.integers(min_value=0, max_value=4096))
def test_random_fatbin_bytes_never_crash(data, cut):
    blob = _fatbin([(2, 120, 0, b"x" * 80), (1, 90, 0x8000, b"y" * 48)])
    for candidate in (
        data,
        blob[:cut],
        blob[:16] + data,
        struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, 1 << 60) + data,
    ):
        try:
            fats = parse_fatbins(candidate)
        except MalformedFatbin:
            continue
        for fat in fats:
            for entry in fat.entries:
                try:
                    payload(candidate, entry)
                except Exception as exc:  # only the documented failures
                    assert type(exc).__name__ in ("MalformedFatbin", "CompressionUnavailable")


def test_worker_reports_decode_as_cached_ones_do(cuda_objects, torch_dir):
    """A report a worker sends is rebuilt without checking each field (FileReport.from_worker);
    it must be the same object the checked reading of the cache gives, on real CUDA objects
    (fatbins, compressed images) and on torch's own libraries (exports kept joined)."""
    import json
    import os

    from patchkit.abi.cache import encode
    from patchkit.abi.elf import Names, name_set
    from patchkit.abi.scan import FileReport

    paths = list(cuda_objects.values())
    paths += [os.path.join(torch_dir, "lib", n) for n in ("libc10.so", "libtorch_cpu.so")]
    for path in paths:
        report = analyze_file(path, "x", path)
        data = json.loads(encode(report.to_json()))
        fast = FileReport.from_worker(data, "x", path)
        checked = FileReport.from_json(data, "x", path)
        assert fast == checked == report, path
        assert isinstance(fast.elf.defined, Names)
        assert (
            name_set(fast.elf.defined) == name_set(report.elf.defined) == set(checked.elf.defined)
        )


def _zstd_fatbin(count: int, claimed: int, frame: bytes) -> bytes:
    """`count` fatbins of one zstd sm_80 cubin entry whose stored frame is `frame`."""
    from patchkit.abi import fatbin

    out = bytearray()
    stored = len(frame) + (-len(frame) % 8)
    for _ in range(count):
        body = struct.pack("<HHIQIIHHI8xQ8xQ", fatbin.KIND_CUBIN, 0x101, 0x40, stored, len(frame),
                           0, 0, 13, 80, fatbin.FLAG_ZSTD, claimed)  # fmt: skip
        body += frame + b"\0" * (stored - len(frame))
        out += struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(body)) + body
    return bytes(out)


def test_a_zstd_entry_that_inflates_like_a_bomb_is_malformed_before_it_is_inflated():
    """200 fatbins, each a 32 kB zstd frame of 1 GiB of zeros (under the 1 GiB limit): each
    was inflated to count its kernels, more than 120 s for a 6.5 MB object."""
    zstandard = pytest.importorskip("zstandard")
    claimed = (1 << 30) - 4096
    frame = zstandard.ZstdCompressor(level=1).compress(bytes(claimed))
    assert claimed > 200 * len(frame)
    with pytest.raises(MalformedFatbin, match="a decompression bomb"):
        parse_fatbins(_zstd_fatbin(200, claimed, frame))
    # a cubin's ratio (a few times) stands
    image = b"".join(struct.pack("<Q", i * 2654435761 % (1 << 64)) for i in range(1 << 18))
    buf = _zstd_fatbin(1, len(image), zstandard.ZstdCompressor().compress(image))
    (fat,) = parse_fatbins(buf)
    assert payload(buf, fat.entries[0]) == image
