"""Which fatbin image a GPU of compute capability X.Y runs: SASS, a PTX JIT, or nothing.

CUDA 13 rules:
- ``sm_XY`` cubin: CC X.Z with Z >= Y, same major.
- ``sm_XYa`` cubin: CC X.Y only (sm_120a runs on 12.0, not on 12.1).
- ``sm_XYf`` cubin: its family, same major and Z >= Y (sm_120f: 12.0, 12.1; sm_100f: 10.0, 10.3).
- ``compute_XY`` PTX: JIT on any CC >= X.Y (any major), if the driver knows the PTX ISA.
- ``compute_XYa`` PTX: CC X.Y only; ``compute_XYf``: its family.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from patchkit.abi.fatbin import Fatbin, FatbinEntry


@dataclass(frozen=True, order=True)
class CC:
    """A compute capability, e.g. CC(12, 0)."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> CC:
        """Accept ``12.0``, ``12``, ``sm_120``, ``compute_120a``, ``120``; refuse the ambiguous.

        A bare number is read both as a major (``12`` -> 12.0) and as an SM number (``120`` ->
        12.0); exactly one reading must be a compute capability that exists (KNOWN), so
        ``12`` is 12.0 (there is no CC 1.2), ``90`` is 9.0, and ``13`` (13.0? 1.3?) is refused;
        so is ``1.2``, which no GPU CUDA 13 supports (``12.0`` was meant).
        """
        raw = text
        text = text.strip().lower()
        m = re.fullmatch(r"(\d{1,2})\.(\d)", text)
        if m:
            cc = cls(int(m.group(1)), int(m.group(2)))
            if cc.major < 3:
                raise ValueError(
                    f"compute capability {raw!r} is older than any GPU CUDA 13 runs on; "
                    f"did you mean {cc.major}{cc.minor}.0 (sm_{cc.major}{cc.minor}0)?"
                )
            return cc
        m = re.fullmatch(r"(?:sm|compute)_(\d{2,3})[af]?", text)
        if m:
            n = int(m.group(1))
            cc = cls(n // 10, n % 10)
            if cc.major < 3:
                raise ValueError(f"{raw!r} is older than any GPU CUDA 13 runs on")
            return cc
        m = re.fullmatch(r"\d{1,3}", text)
        if m:
            n = int(text)
            readings = sorted({cls(n, 0), cls(n // 10, n % 10)} & KNOWN)
            if len(readings) == 1:
                return readings[0]
            raise ValueError(
                f"cannot read compute capability {raw!r}: neither {n}.0 nor {n // 10}.{n % 10} "
                "is a GPU CUDA knows; write it as X.Y or sm_XY (e.g. 12.0, sm_120)"
            )
        raise ValueError(f"not a compute capability: {raw!r} (expected e.g. 12.0 or sm_120)")

    @classmethod
    def from_arch(cls, arch: int) -> CC:
        return cls(arch // 10, arch % 10)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    def __repr__(self) -> str:
        return f"CC({self.major}, {self.minor})"

    @property
    def sm(self) -> str:
        return f"{self.major}{self.minor}"


# Compute capabilities of shipped NVIDIA GPUs (CUDA's list), used to read a bare number.
KNOWN = {
    CC(*map(int, v.split(".")))
    for v in (
        "3.5 3.7 5.0 5.2 5.3 6.0 6.1 6.2 7.0 7.2 7.5 8.0 8.6 8.7 8.8 8.9 9.0 10.0 10.1 10.3 "
        "11.0 12.0 12.1"
    ).split()
}


def runs_on(entry: FatbinEntry, cc: CC) -> bool:
    """True if the image executes (natively or after a PTX JIT) on a GPU of capability ``cc``."""
    return image_runs_on(entry.kind, CC.from_arch(entry.arch), entry.variant, cc)


def image_runs_on(kind: str, built: CC, variant: str, cc: CC) -> bool:
    """The §4 rule on plain values: ``kind`` "cubin"/"ptx", ``variant`` ""/"a"/"f"."""
    if variant == "a":
        return cc == built
    if variant == "f" or kind == "cubin":
        return cc.major == built.major and cc.minor >= built.minor
    return cc >= built


@dataclass(frozen=True)
class Coverage:
    """How a fatbin serves one target: ``sass`` (a cubin runs), ``jit`` (PTX only), ``none``."""

    verdict: str
    image: str | None = None  # the best image's name (sm_90a, compute_120 ...)
    ptx_version: tuple[int, int] | None = None


def coverage(fat: Fatbin, cc: CC) -> Coverage:
    """What the driver loads for ``cc``: a matching cubin, else PTX to JIT, else nothing."""
    cubins = [e for e in fat.entries if e.kind == "cubin" and runs_on(e, cc)]
    if cubins:
        best = max(cubins, key=lambda e: (e.arch, e.variant == "a"))
        return Coverage("sass", best.name)
    ptx = [e for e in fat.entries if e.kind == "ptx" and runs_on(e, cc)]
    if ptx:
        best = max(ptx, key=lambda e: e.arch)
        return Coverage("jit", best.name, best.version)
    return Coverage("none")


def arch_list_runs_on(arch_flags: list[str], cc: CC) -> bool:
    """torch's ``_cuda_getArchFlags()`` style list (``sm_90``, ``compute_120``) covers ``cc``."""
    for flag in arch_flags:
        m = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", flag)
        if not m:
            continue
        kind = "cubin" if m.group(1) == "sm" else "ptx"
        if image_runs_on(kind, CC.from_arch(int(m.group(2))), m.group(3), cc):
            return True
    return False


def family_hint(fat_archs: list[str], cc: CC) -> str | None:
    """The CC 12.1 special case: sm_120a cubins exist but only run on 12.0."""
    if cc == CC(12, 1) and "sm_120a" in fat_archs:
        return (
            "sm_120a cubins run only on CC 12.0; CC 12.1 (GB10) needs sm_121/sm_120f "
            "or compute_120 PTX"
        )
    return None
