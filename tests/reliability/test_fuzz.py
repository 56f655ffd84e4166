"""Fuzz the parsers that read untrusted bytes: series.parse_patch, abi.elf.read_elf and the
fatbin reader (abi.fatbin.describe / cubin_info). A seeded mutation generator gives a fixed,
bounded number of inputs per run; hypothesis adds structured patches; atheris (coverage-guided)
runs for a fixed number of iterations when it is installed.

The only exceptions allowed out are each parser's own error type.
"""

from __future__ import annotations

import random
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import make_corpus
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_support import ROOT, make_upstream, record

from patchkit.errors import PatchFormatError
from patchkit.series import parse_patch

SEED = 8
SECTION = "fuzz (tests/reliability/test_fuzz.py)"
PATCH_INPUTS = 10_000
ELF_INPUTS = 3_000
FATBIN_INPUTS = 5_000
TIME_LIMIT_S = 240  # a bound, far above the normal run; hitting it fails the test


def mutate(rng: random.Random, data: bytes, tokens: list[bytes]) -> bytes:
    """One to four random edits: byte flips, cuts, duplicated or dropped lines, injected tokens,
    odd numbers in hunk headers."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        if not out:
            out += rng.choice(tokens)
            continue
        i = rng.randrange(len(out))
        if op == 0:
            out[i] = rng.randrange(256)
        elif op == 1:
            del out[i : i + rng.randint(1, 64)]
        elif op == 2:
            out[i:i] = rng.choice(tokens)
        elif op == 3:
            out = out[:i]
        elif op in (4, 5):
            lines = bytes(out).split(b"\n")
            j = rng.randrange(len(lines))
            if op == 4:
                lines.insert(j, lines[rng.randrange(len(lines))])
            else:
                del lines[j]
            out = bytearray(b"\n".join(lines))
        elif op == 6:
            number = str(rng.choice([0, 1, 2, 7, 40, 10**9, 10**20, -1])).encode()
            out[i : i + 1] = number
        else:
            out[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(out)


PATCH_TOKENS = [
    b"\n",
    b"@@ -1,3 +1,4 @@\n",
    b"@@ -0,0 +1 @@\n",
    b"diff --git a/x b/x\n",
    b"--- a/x\n",
    b"+++ b/x\n",
    b"--- /dev/null\n",
    b"+++ /dev/null\n",
    b"new file mode 120000\n",
    b"deleted file mode 100644\n",
    b"rename from ../x\n",
    b"rename to /etc/x\n",
    b"GIT binary patch\n",
    b"\\ No newline at end of file\n",
    b"\r\n",
    b"\x00",
    b"\xff\xfe",
    b"From: <>\n",
    b"Subject: \n",
    b"Date: x\n",
    b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n",
    b"-- \n",
    b" context\n",
    b"+added\n",
    b"-removed\n",
    b"a/.git/config",
]


@pytest.fixture(scope="module")
def patch_seeds(tmp_path_factory) -> list[bytes]:
    _, _, patches, _ = make_upstream(tmp_path_factory.mktemp("fuzz-toy"))
    seeds = list(patches.values())
    seeds += [p.read_bytes() for p in sorted((ROOT / "patches").glob("*/*.patch"))]
    seeds += [data for _, data in make_corpus.patch_cases().values()]
    return seeds


def test_fuzz_parse_patch(patch_seeds):
    rng = random.Random(SEED)
    start = time.monotonic()
    uncaught: list[str] = []
    refused = 0
    for n in range(PATCH_INPUTS):
        data = mutate(rng, rng.choice(patch_seeds), PATCH_TOKENS)
        try:
            parse_patch("fuzz.patch", data)
        except PatchFormatError:
            refused += 1
        except Exception as exc:  # noqa: BLE001 - the figure counts exactly these
            uncaught.append(f"input {n}: {type(exc).__name__}: {exc}")
        assert time.monotonic() - start < TIME_LIMIT_S, "fuzzing exceeded its time bound"
    seconds = time.monotonic() - start
    record(
        SECTION,
        f"series.parse_patch: {PATCH_INPUTS} mutated patches (seed {SEED}) in "
        f"{seconds:.1f}s -> {refused} refused with PatchFormatError, "
        f"{len(uncaught)} uncaught exceptions (goal 0)",
    )
    assert not uncaught, uncaught[:5]


_line = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.one_of(
            _line,
            st.sampled_from([t.decode("latin-1") for t in PATCH_TOKENS]),
            st.builds(
                lambda a, b, c, d: f"@@ -{a},{b} +{c},{d} @@",
                st.integers(-2, 10**12),
                st.integers(-2, 99),
                st.integers(0, 10**12),
                st.integers(0, 99),
            ),
            st.builds(lambda p: f"diff --git a/{p} b/{p}", _line),
        ),
        max_size=40,
    )
)
def test_fuzz_parse_patch_structured(lines):
    text = make_corpus.HEADER.format(subject="fuzz") + "\n".join(lines)
    try:
        parse_patch("fuzz.patch", text.encode("utf-8", "surrogatepass"))
    except PatchFormatError:
        pass


def _small_shared_objects() -> list[Path]:
    found = sorted(p for p in Path(sys.prefix).rglob("*.so") if p.stat().st_size < 100_000)
    return found[:6]


def test_fuzz_elf_reader():
    from patchkit.abi.elf import MalformedElf, read_elf

    seeds = [p.read_bytes() for p in _small_shared_objects()]
    if not seeds:
        pytest.skip("no small shared objects in this environment to seed the ELF fuzzer")
    rng = random.Random(SEED)
    tokens = [b"\x7fELF", b"\x00" * 8, b"\xff" * 8, struct.pack("<Q", 2**63), struct.pack("<I", 1)]
    start = time.monotonic()
    uncaught: list[str] = []
    parsed = 0
    for n in range(ELF_INPUTS):
        seed = rng.choice(seeds)
        if rng.random() < 0.5:  # most parsing happens in the headers and tables: aim there
            head = rng.randrange(64, min(len(seed), 4096))
            data = mutate(rng, seed[:head], tokens) + seed[head:]
        else:
            data = mutate(rng, seed, tokens)
        try:
            read_elf("fuzz.so", data)
            parsed += 1
        except MalformedElf:
            pass
        except Exception as exc:  # noqa: BLE001
            uncaught.append(f"input {n}: {type(exc).__name__}: {exc}")
        assert time.monotonic() - start < TIME_LIMIT_S, "fuzzing exceeded its time bound"
    record(
        SECTION,
        f"abi.elf.read_elf: {ELF_INPUTS} mutated shared objects in "
        f"{time.monotonic() - start:.1f}s -> {parsed} read, the rest refused with "
        f"MalformedElf, {len(uncaught)} uncaught exceptions (goal 0)",
    )
    assert not uncaught, uncaught[:5]


def _fatbin_seed(rng: random.Random) -> bytes:
    """A fatbin container with a PTX entry and a cubin entry (layout of abi/fatbin.py)."""
    from patchkit.abi import fatbin

    ptx = b".version 8.8\n.target sm_120a\n.visible .entry kern(\n)\n{\nret;\n}\n"
    cubin = bytearray(b"\x7fELF\x02\x01\x01" + bytes(57))
    struct.pack_into("<H", cubin, 18, fatbin.EM_CUDA)
    entries = b""
    for kind, payload, arch, flags in (
        (fatbin.KIND_PTX, ptx, 120, fatbin.FLAG_ARCH_A),
        (fatbin.KIND_CUBIN, bytes(cubin), 120, 0),
        (fatbin.KIND_CUBIN, bytes(3000), 100, fatbin.FLAG_LZ4),
    ):
        header = struct.pack(
            "<HHIQIIHHI8xQ8xQ",
            kind,
            0x101,
            0x40,
            len(payload),
            len(payload),
            0,
            8,
            8,
            arch,
            flags,
            len(payload) * 4,
        )
        entries += header + payload
    return struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(entries)) + entries


def test_fuzz_fatbin_reader():
    from patchkit.abi import fatbin

    rng = random.Random(SEED)
    seed = _fatbin_seed(rng)
    tokens = [
        struct.pack("<I", fatbin.FATBIN_MAGIC),
        struct.pack("<Q", 2**64 - 1),
        struct.pack("<H", 2),
        struct.pack("<I", fatbin.FLAG_ZSTD),
        b"\x7fELF",
        bytes(16),
    ]
    allowed = (fatbin.MalformedFatbin, fatbin.CompressionUnavailable)
    start = time.monotonic()
    uncaught: list[str] = []
    parsed = 0
    for n in range(FATBIN_INPUTS):
        data = mutate(rng, seed, tokens)
        try:
            parsed += bool(fatbin.describe(data, 0, len(data)))
            fatbin.cubin_info(data[rng.randrange(len(data) or 1) :] if data else data)
        except allowed:
            pass
        except Exception as exc:  # noqa: BLE001
            uncaught.append(f"input {n}: {type(exc).__name__}: {exc}")
        assert time.monotonic() - start < TIME_LIMIT_S, "fuzzing exceeded its time bound"
    record(
        SECTION,
        f"abi.fatbin.describe + cubin_info: {FATBIN_INPUTS} mutated fatbins in "
        f"{time.monotonic() - start:.1f}s -> {parsed} described, the rest refused, "
        f"{len(uncaught)} uncaught exceptions (goal 0)",
    )
    assert not uncaught, uncaught[:5]


ATHERIS_RUNS = 20_000
ATHERIS_SCRIPT = textwrap.dedent("""
    import sys
    import atheris
    with atheris.instrument_imports():
        from patchkit.errors import PatchFormatError
        from patchkit.series import parse_patch
    def one(data):
        try:
            parse_patch("fuzz.patch", data)
        except PatchFormatError:
            pass
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
""")


def test_fuzz_parse_patch_atheris(tmp_path, patch_seeds):
    pytest.importorskip("atheris")
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    for i, data in enumerate(patch_seeds):
        (seeds / f"seed{i}").write_bytes(data)
    start = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            ATHERIS_SCRIPT,
            f"-runs={ATHERIS_RUNS}",
            "-max_len=8192",
            "-seed=8",
            str(seeds),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIME_LIMIT_S,
    )
    crashed = done.returncode != 0
    record(
        SECTION,
        f"atheris (coverage-guided) on series.parse_patch: {ATHERIS_RUNS} runs in "
        f"{time.monotonic() - start:.1f}s -> "
        f"{'an uncaught exception' if crashed else '0 uncaught exceptions'}",
    )
    assert not crashed, done.stderr[-2000:]
