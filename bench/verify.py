"""Benchmark `patchkit verify` on a large real stack, cold and warm, against readelf/nm/cuobjdump.

    python bench/verify.py [--env SITE] [--wheelhouse DIR] [--jobs N] [--profile NAME]
                           [--cuobjdump PATH] [--no-cuobjdump] [--repeat N]

The stack is a site-packages folder (default: the repository's .venv, whose torch 2.9.1 brings
its nvidia-* libraries) and/or a folder of wheels. The baseline is the shell pipeline a person
would write for the same facts, over the same files verify reads (those it classifies as ELF
objects or device code): `readelf -d -V -W` (NEEDED, SONAME, RPATH, symbol versions), `nm -D`
(defined and undefined dynamic symbols) and, for each file holding device code,
`cuobjdump --list-elf --list-ptx` (the images of its fatbins), `--jobs` files at a time.
Wheel members are extracted for the baseline first; that extraction is timed and shown apart.

"cold" = the files evicted from the page cache (posix_fadvise DONTNEED on each, checked with
fincore) and an empty patchkit cache, before each of the two runs; "warm" = the page cache warm
(the baseline's second run) and, for patchkit, its result cache filled (best of three).
Goals: cold >= 10x the pipeline, warm < 0.5 s. ``--repeat N``: N cold pairs (verify, then the
pipeline), each printed, then their medians: the development machine is shared and one pair
says little.

For an installed environment the bench ends with the read floor: the pages of the installed
files verify reads (ELF header, section table, dynamic and version sections, fatbin and entry
headers), evicted and read back by a plain reader with every request in flight at once. No cold
verify can take less; the rest of its time is CPU.

For a wheelhouse the bench also times the inflate floor: inflating, once and nothing else, each
member verify reads whole (every deflated object but the raw cubins, read only to their note),
one member at a time with verify's inflate backend. A deflate stream can only be decoded from its
start, and an object's section table and fatbin headers lie throughout it, so no cold verify of
those wheels can take less than max(largest member, all members / jobs) of that.
"""

from __future__ import annotations

import argparse
import glob
import mmap
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.pagecache import evict  # noqa: E402
from patchkit.abi import verify  # noqa: E402
from patchkit.abi.elf import read_elf  # noqa: E402
from patchkit.abi.members import inflate_backend, read_member  # noqa: E402
from patchkit.abi.sources import classify_pending, read_env, read_wheelhouse  # noqa: E402


def _cuobjdump(site: str | None) -> str | None:
    """CUDA's cuobjdump, else the copy triton carries (found without importing triton, whose
    libtriton.so would then stay mapped and could not be evicted)."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    path = os.path.join(site or "", "triton", "backends", "nvidia", "bin", "cuobjdump")
    return path if os.access(path, os.X_OK) else None


def _files(site: str | None, house: str | None, scratch: str) -> tuple[list, float]:
    """(path, kind) of every object verify reads; wheel members extracted (and that timed)."""
    out = []
    if site:
        tree = read_env(site)
        out += [(m.path, m.kind) for m in tree.members.values()]
    started = time.perf_counter()
    if house:
        tree = read_wheelhouse(house, scratch)
        classify_pending(tree)
        by_wheel: dict[str, list] = {}
        for m in tree.members.values():
            by_wheel.setdefault(m.wheel, []).append(m)
        for wheel, members in by_wheel.items():
            with zipfile.ZipFile(wheel) as zf:
                for m in members:
                    out.append((zf.extract(m.relpath, os.path.join(scratch, "x")), m.kind))
    return out, time.perf_counter() - started


def _pipeline(files: list[tuple[str, str]], jobs: int, cuobjdump: str | None) -> float:
    elf = [p for p, k in files if k == "elf"]
    device = [p for p, k in files if k in ("cubin", "fatbin")]
    script = (
        'for f; do readelf -d -V -W "$f" >/dev/null 2>&1; nm -D "$f" >/dev/null 2>&1; '
        + (
            'if readelf -S -W "$f" 2>/dev/null | grep -q nv_fatbin; then '
            f'"{cuobjdump}" --list-elf --list-ptx "$f" >/dev/null 2>&1; fi; '
            if cuobjdump
            else ""
        )
        + "done"
    )
    dev_script = f'for f; do "{cuobjdump}" --list-elf "$f" >/dev/null 2>&1; done'
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            ["xargs", "-0", "-n", "8", "-P", str(jobs), "sh", "-c", script, "sh"],
            stdin=subprocess.PIPE,
        )
    ]
    procs[0].communicate("\0".join(elf).encode())
    if device and cuobjdump:
        p = subprocess.Popen(
            ["xargs", "-0", "-n", "64", "-P", str(jobs), "sh", "-c", dev_script, "sh"],
            stdin=subprocess.PIPE,
        )
        p.communicate("\0".join(device).encode())
    return time.perf_counter() - started


def _inflate_floor(house: str, scratch: str) -> tuple[float, float, int]:
    """(seconds for all, seconds for the largest, bytes) inflating what verify reads whole."""
    tree = read_wheelhouse(house, scratch)
    classify_pending(tree)
    total = largest = 0.0
    size = 0
    for m in tree.members.values():
        if m.kind == "cubin":  # read to its tkinfo note, not whole
            continue
        t0 = time.perf_counter()
        data = read_member(m)
        took = time.perf_counter() - t0
        size += len(data)
        del data
        total += took
        largest = max(largest, took)
    return total, largest, size


def _page_runs(reports: dict) -> list[tuple[str, list[tuple[int, int]]]]:
    """For each installed ELF object verify read: the runs of pages (start, end) it reads —
    ELF header, section table and names, the dynamic and version sections, and the fatbin
    and entry headers (each entry's place depends on the previous entry's size)."""
    page = mmap.PAGESIZE
    wanted = (".dynamic", ".dynsym", ".dynstr", ".gnu.version", ".gnu.version_r",
              ".gnu.version_d", ".nvFatBinSegment", ".shstrtab")  # fmt: skip
    plan = []
    for rep in reports.values():
        if rep.elf is None or not os.path.isfile(rep.origin):
            continue
        with open(rep.origin, "rb") as fh:
            head = fh.read(64)
        (shoff,) = struct.unpack_from("<Q", head, 0x28)
        (shnum,) = struct.unpack_from("<H", head, 0x3C)
        pages = {0, *range(shoff // page, (shoff + shnum * 64) // page + 1)}
        sections = read_elf(rep.origin).sections
        for name in wanted:
            off, size, _ = sections.get(name, (0, 0, 0))
            if size:
                pages.update(range(off // page, (off + size - 1) // page + 1))
        base = sections.get(".nv_fatbin", (0, 0, 0))[0]
        for fat in rep.fatbins:
            pages.add((base + fat.offset) // page)
            for e in fat.entries:
                pages.update(range((base + e.offset) // page, (base + e.offset + 63) // page + 1))
        runs: list[list[int]] = []
        for p in sorted(pages):
            if runs and runs[-1][1] == p:
                runs[-1][1] = p + 1
            else:
                runs.append([p, p + 1])
        plan.append((rep.origin, [(a * page, (b - a) * page) for a, b in runs]))
    return plan


def _io_floor(plan) -> float:
    """Seconds to read the plan's pages cold with a plain reader and every request in flight
    at once: each run asked for (POSIX_FADV_WILLNEED, in 128 kB pieces), then all read."""
    evict([path for path, _ in plan])
    started = time.perf_counter()
    fds = []
    for path, runs in plan:
        fd = os.open(path, os.O_RDONLY)
        fds.append(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for off, size in runs:
            for at in range(off, off + size, 128 << 10):
                os.posix_fadvise(fd, at, min(128 << 10, off + size - at), os.POSIX_FADV_WILLNEED)
    for fd, (_, runs) in zip(fds, plan, strict=True):
        for off, size in runs:
            os.pread(fd, size, off)
        os.close(fd)
    return time.perf_counter() - started


def _cpu() -> float:
    self_ = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return self_.ru_utime + self_.ru_stime + kids.ru_utime + kids.ru_stime


def _cold_pairs(args, site, house, files, inputs, caches, cuobjdump) -> tuple[list, object, str]:
    """``--repeat`` cold pairs, verify then the pipeline, each with the page cache evicted:
    (pipeline s, CPU s, verify s, CPU s) per pair, the last verify's result and cache."""
    runs = []  # (pipeline s, CPU s, verify s, CPU s), cold, one pair per repeat
    for i in range(args.repeat):  # verify, then the pipeline (then warm for its run)
        cache = os.path.join(caches, str(i))  # empty: nothing from the run before
        left = evict(inputs)
        c0, t0 = _cpu(), time.perf_counter()
        cold = verify(
            env=site, wheelhouse=house, profile=args.profile, cache_dir=cache, jobs=args.jobs
        )
        cold_s, cold_cpu = time.perf_counter() - t0, _cpu() - c0
        print(
            f"patchkit verify, cold ({left / 1e6:.0f} MB left resident): {cold_s:8.2f} s "
            f"({cold_cpu:.1f} s CPU)  {cold.errors} errors, {cold.warnings} warnings, "
            f"{cold.notes} notes, {cold.files} objects"
        )
        left = evict([p for p, _ in files])
        c0 = _cpu()
        base = _pipeline(files, args.jobs, cuobjdump)
        base_cpu = _cpu() - c0
        print(
            f"pipeline, cold ({left / 1e6:.0f} MB left resident): {base:8.2f} s "
            f"({base_cpu:.1f} s CPU)  -> {base / cold_s:.1f}x wall, "
            f"{base_cpu / cold_cpu:.1f}x CPU"
        )
        runs.append((base, base_cpu, cold_s, cold_cpu))
    return runs, cold, cache


def _floors(args, site, house, scratch, cold, base: float) -> None:
    """What no reader could beat: inflating every member (wheelhouse), reading the pages
    verify reads (environment)."""
    if house:
        z = inflate_backend()
        floor, largest, size = _inflate_floor(house, scratch)
        bound = max(largest, floor / max(args.jobs, 1), 1e-3)
        if not size:
            print("inflate floor: no member is read whole (raw cubins: to their note)")
        else:
            print(
                f"inflate floor ({z.__name__}, warm page cache): {size / 1e9:.2f} GB in "
                f"{floor:.2f} s, largest member {largest:.2f} s; bound with {args.jobs} jobs "
                f"{bound:.2f} s = at most {base / bound:.1f}x the pipeline cold"
            )
    plan = _page_runs(cold.reports) if site else []
    if plan:
        took = sorted(_io_floor(plan) for _ in range(3))
        size = sum(n for _, runs in plan for _, n in runs)
        count = sum(len(runs) for _, runs in plan)
        print(
            f"read floor: verify reads {size / 1e6:.1f} MB of the installed files in {count} "
            f"runs of pages; read cold by a plain reader, all asked for at once: "
            f"{', '.join(f'{t:.2f}' for t in took)} s = at most "
            f"{base / took[1]:.1f}x the pipeline cold with no CPU spent at all"
        )


def main() -> int:
    default_site = next(
        iter(glob.glob(os.path.join(REPO, ".venv/lib/python3*/site-packages"))), None
    )
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default=default_site, help="site-packages ('none': no env)")
    ap.add_argument("--wheelhouse", default=None)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--profile", default="cu130-sm120")
    ap.add_argument("--cuobjdump", default=None, help="path of cuobjdump (default: found)")
    ap.add_argument("--no-cuobjdump", action="store_true", help="baseline of readelf and nm only")
    ap.add_argument("--repeat", type=int, default=1, help="cold pipeline/verify pairs to run")
    args = ap.parse_args()
    site = None if args.env in (None, "none") else args.env
    house = args.wheelhouse if args.wheelhouse and glob.glob(f"{args.wheelhouse}/*.whl") else None
    cuobjdump = None if args.no_cuobjdump else args.cuobjdump or _cuobjdump(site or default_site)

    scratch = tempfile.mkdtemp(prefix="pk-bench-")
    caches = tempfile.mkdtemp(prefix="pk-bench-cache-")
    try:
        files, extract_s = _files(site, house, scratch)
        total = sum(os.path.getsize(p) for p, _ in files)
        wheels = sorted(glob.glob(f"{house}/*.whl")) if house else []
        inputs = [p for p, _ in files if not p.startswith(scratch)] + wheels
        print(f"stack: {site or 'no env'} + {house or 'no wheelhouse'}")
        if house:
            print(f"       wheel members inflated with {inflate_backend().__name__}")
        print(
            f"       {len(files)} objects ({sum(k != 'elf' for _, k in files)} raw device-code "
            f"files), {total / 1e9:.2f} GB; {args.jobs} jobs; load average "
            f"{os.getloadavg()[0]:.1f}; cuobjdump: {cuobjdump or 'not found'}"
        )
        if house:
            print(f"       wheel members extracted for the pipeline in {extract_s:.2f} s")

        runs, cold, cache = _cold_pairs(args, site, house, files, inputs, caches, cuobjdump)
        base, base_cpu, cold_s, cold_cpu = (statistics.median(r[k] for r in runs) for k in range(4))
        if len(runs) > 1:
            each = sorted(r[0] / r[2] for r in runs)
            print(
                f"medians of {len(runs)} cold pairs: pipeline {base:.2f} s ({base_cpu:.1f} s CPU), "
                f"verify {cold_s:.2f} s ({cold_cpu:.1f} s CPU); per pair "
                f"{', '.join(f'{x:.1f}x' for x in each)}"
            )
        base_warm = _pipeline(files, args.jobs, cuobjdump)
        print(f"pipeline, warm page cache:                 {base_warm:8.2f} s")
        warm_times = []
        for _ in range(3):  # best of three: this machine is shared and its load spikes
            t0 = time.perf_counter()
            warm = verify(
                env=site, wheelhouse=house, profile=args.profile, cache_dir=cache, jobs=args.jobs
            )
            warm_times.append(time.perf_counter() - t0)
        warm_s = min(warm_times)
        assert warm.cached and [f.line() for f in warm.findings] == [
            f.line() for f in cold.findings
        ]
        print(
            f"patchkit verify, warm (best of 3):          {warm_s:8.2f} s "
            f"({', '.join(f'{t:.2f}' for t in warm_times)})"
        )
        cmd = [sys.executable, "-m", "patchkit", "verify", "--profile", args.profile]
        cmd += (["--env", site] if site else []) + (["--wheelhouse", house] if house else [])
        t0 = time.perf_counter()
        subprocess.run(
            cmd, capture_output=True, cwd=REPO, env={**os.environ, "PATCHKIT_CACHE": cache}
        )
        print(f"`patchkit verify` command, warm (interpreter start included): "
              f"{time.perf_counter() - t0:.2f} s")  # fmt: skip
        line = (
            f"ratios: pipeline / verify cold = {base / cold_s:.1f}x wall, "
            f"{base_cpu / cold_cpu:.1f}x CPU; pipeline warm / verify warm = "
            f"{base_warm / warm_s:.0f}x"
        )
        if house:
            line += f"; with the extraction counted: {(base + extract_s) / cold_s:.1f}x cold"
        print(line)
        _floors(args, site, house, scratch, cold, base)
        print("goals:  cold >= 10x the pipeline, warm < 0.5 s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(caches, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
