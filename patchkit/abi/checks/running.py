"""Checks 12-17, running: the loader's hard-coded paths, the driver, the GPU architectures
the device code covers, and the toolkit the device files need."""

from __future__ import annotations

import fnmatch
import os
import re
from collections import defaultdict

from patchkit.abi.archs import CC, arch_list_runs_on, coverage, family_hint
from patchkit.abi.checks.context import CUDA_RUNTIME, Context, Finding, is_extension, owner_label
from patchkit.abi.elf import open_mapped
from patchkit.abi.fatbin import PTX_ISA_TO_CUDA, decide_kernels
from patchkit.abi.profiles import Profile
from patchkit.abi.scan import FileReport


def check_loader_hardcode(ctx: Context) -> None:
    text = ctx.tree.texts.get("sgl_kernel/load_utils.py")
    major = ctx.torch.major or ctx.profile.cuda_major
    if text and "libcudart.so.12" in text and "libcudart.so.13" not in text and major >= 13:
        ctx.emit("loader-hardcode", "sgl_kernel/load_utils.py")


def check_driver(ctx: Context) -> None:
    if ctx.driver is None:
        return
    if ctx.driver.version is None:
        ctx.emit("driver-missing", "host")
        return
    need = ctx.profile.cuda_major
    minimum = ctx.profile.min_driver
    cuda = ctx.driver.cuda
    too_old = cuda is not None and cuda[0] < need
    if minimum:
        want = tuple(int(p) for p in minimum.split("."))
        too_old = too_old or ctx.driver.tuple < want
    if too_old:
        ctx.emit(
            "driver",
            "host",
            v=ctx.driver.version,
            x=f"{cuda[0]}.{cuda[1]}" if cuda else "?",
            need=need,
            min=minimum or f"{need}.0",
        )


def _variant(profile: Profile, cc: CC) -> str:
    return profile.common_ops.get(str(cc), profile.common_ops.get("default", "*"))


def coverage_subjects(ctx: Context, cc: CC) -> dict[str, str]:
    """relpath -> "required" | "optional" for shared objects whose kernels must run on ``cc``."""
    out: dict[str, str] = {}
    variant = _variant(ctx.profile, cc)
    required = [p.replace("{common_ops}", variant) for p in ctx.profile.required]
    optional = [p.replace("{common_ops}", variant) for p in ctx.profile.optional]
    others = {v for v in ctx.profile.common_ops.values() if v != variant}
    for rel, rep in ctx.reports.items():
        if not rep.fatbins or rep.kind != "elf":
            continue
        parts = rel.split("/")
        if parts[0] == "sgl_kernel" and len(parts) > 2 and parts[1] in others:
            continue  # load_utils.py loads another variant on this GPU
        if any(fnmatch.fnmatch(rel, p) for p in optional):
            out[rel] = "optional"
        elif any(fnmatch.fnmatch(rel, p) for p in required):
            out[rel] = "required"
        elif is_extension(ctx, rel, rep) or re.fullmatch(r"torch/lib/libtorch_cuda.*\.so", rel):
            out[rel] = "required"
    return out


def _open_undecided(ctx: Context, rel: str, rep: FileReport, fats) -> None:
    member = ctx.tree.members.get(rel)
    if member is None or member.path is None or not os.path.exists(member.path):
        return
    sec = rep.elf.section(".nv_fatbin") if rep.elf else None
    if sec is None:
        return
    try:
        buf = open_mapped(member.path)
    except Exception:
        return
    try:
        for fat in fats:
            try:
                decide_kernels(buf, sec[0], fat)
            except Exception:
                fat.has_kernels = None
    finally:
        buf.close()


def predict(rep: FileReport, cc: CC) -> dict:
    """Launch prediction for one file on ``cc``: counts of kernel fatbins by verdict."""
    counts = {"sass": 0, "jit": 0, "none": 0}
    images = {}
    for fat in rep.kernel_fatbins:
        cov = coverage(fat, cc)
        counts[cov.verdict] += 1
        if cov.image:
            images[cov.image] = cov.ptx_version
    verdict = (
        "none"
        if counts["none"]
        else "jit"
        if counts["jit"]
        else "sass"
        if counts["sass"]
        else "no-kernels"
    )
    return {"verdict": verdict, "counts": counts, "images": sorted(images)}


def check_coverage(ctx: Context) -> None:
    max_isa = _driver_max_isa(ctx)
    for cc in ctx.targets:
        # PTX-only objects of one package: one note-like warning, the objects as evidence
        jits: dict[tuple, list[str]] = defaultdict(list)
        for rel, kind in sorted(coverage_subjects(ctx, cc).items()):
            _cover_object(ctx, cc, rel, kind, max_isa, jits)
        _emit_jits(ctx, jits)


def _driver_max_isa(ctx: Context) -> tuple[int, int] | None:
    """The newest PTX ISA the driver's CUDA compiles, or None when the driver is unknown."""
    if not (ctx.driver and ctx.driver.cuda):
        return None
    isas = [isa for isa, cuda in PTX_ISA_TO_CUDA.items() if cuda <= ctx.driver.cuda]
    return max(isas) if isas else None


def _cover_object(ctx: Context, cc, rel: str, kind: str, max_isa, jits: dict) -> None:
    """Check 14-15 for one object on one target: kernels with no image for `cc` are an error
    (a warning when the object is optional), PTX newer than the driver compiles is one, and
    PTX-only coverage is gathered in `jits` by package."""
    rep = ctx.reports[rel]
    lacking = [f for f in rep.kernel_fatbins if coverage(f, cc).verdict == "none"]
    undecided = [f for f in lacking if f.has_kernels is None]
    if undecided:
        _open_undecided(ctx, rel, rep, undecided)
    kernel_fats = rep.kernel_fatbins
    if not kernel_fats:
        return
    covs = [coverage(f, cc) for f in kernel_fats]
    none = sum(c.verdict == "none" for c in covs)
    if none:
        _emit_uncovered(ctx, rep, kind, cc, kernel_fats, none)
        return
    jit = [c for c in covs if c.verdict == "jit"]
    if not jit:
        return
    isa = max(c.ptx_version for c in jit)
    if max_isa is not None and isa > max_isa:
        ctx.emit(
            "ptx-isa",
            rep.origin,
            n=len(jit),
            cc=cc.sm,
            isa=f"{isa[0]}.{isa[1]}",
            v=ctx.driver.version,
        )
    else:
        jits[(owner_label(ctx, rel, rep), cc.sm, jit[0].image, isa)].append(rep.origin)


def _emit_uncovered(ctx: Context, rep, kind: str, cc, kernel_fats: list, none: int) -> None:
    archs = sorted({a for f in kernel_fats for a in f.archs}, key=_arch_key)
    note = family_hint(archs, cc)
    check = "arch-coverage-optional" if kind == "optional" else "arch-coverage"
    extra = "a" if cc.major >= 9 and any(a.endswith("a") for a in archs) else ""
    ctx.emit(
        check,
        rep.origin,
        k=none,
        n=len(kernel_fats),
        cc=cc.sm,
        archs=" ".join(archs),
        extra=extra,
    )
    if note:
        f = ctx.findings[-1]
        ctx.findings[-1] = Finding(
            f.check, f.number, f.severity, f.file, f.message + f"; {note}", f.hint
        )


def _emit_jits(ctx: Context, jits: dict[tuple, list[str]]) -> None:
    for (label, sm, image, isa), files in sorted(jits.items()):
        ctx.emit(
            "arch-jit",
            files[0] if len(files) == 1 else f"{label} ({len(files)} objects)",
            evidence=tuple(files) if len(files) > 1 else (),
            cc=sm,
            ptx=image,
            isa=f"{isa[0]}.{isa[1]}",
        )


def check_device_files(ctx: Context) -> None:
    """Raw cubins, fatbins and PTX files (``cuModuleLoad`` inputs), one finding per package.

    A wheel may hold thousands (flashinfer-cubin: 5,363): files are grouped by the images
    they hold (kind, SM, variant), and each distinct set is judged once per target."""
    groups: dict[str, list[tuple[str, FileReport]]] = defaultdict(list)
    for rel, rep in sorted(ctx.reports.items()):
        if rep.kind != "elf" and rep.fatbins:
            groups[owner_label(ctx, rel, rep)].append((rel, rep))
    is_optional = _optional_matcher(ctx.profile.optional)
    lacks = _ImageJudge()
    for label, files in sorted(groups.items()):
        by_arch: dict[str, int] = defaultdict(int)
        for _, rep in files:
            for f in rep.fatbins:
                for a in f.archs:
                    by_arch[a] += 1
        for cc in ctx.targets:
            lacking = [rel for rel, rep in files if lacks(rep, cc)]
            if lacking:
                optional = is_optional is not None and all(is_optional(rel) for rel in lacking)
                _emit_device_files(ctx, label, cc, lacking, len(files), by_arch, optional)


def _optional_matcher(patterns: list[str]):
    """A match function for the profile's optional globs (fnmatch.fnmatch over posix paths,
    every pattern in one expression), or None where there are none."""
    optional = [p.replace("{common_ops}", "*") for p in patterns]
    if not optional:
        return None
    return re.compile("|".join(fnmatch.translate(p) for p in optional)).match


class _ImageJudge:
    """Whether a device file has no image that runs on a target; decided once per distinct
    set of images (kind, SM, variant) and target."""

    def __init__(self) -> None:
        self.verdicts: dict[tuple, bool] = {}

    def __call__(self, rep: FileReport, cc: CC) -> bool:
        fats = rep.kernel_fatbins
        key = (cc, tuple(frozenset((e.kind, e.arch, e.variant) for e in f.entries) for f in fats))
        got = self.verdicts.get(key)
        if got is None:
            got = self.verdicts[key] = bool(fats) and all(
                coverage(f, cc).verdict == "none" for f in fats
            )
        return got


def _emit_device_files(
    ctx: Context,
    label: str,
    cc: CC,
    lacking: list[str],
    n: int,
    by_arch: dict[str, int],
    optional: bool,
) -> None:
    """One package's device files lacking an image for ``cc``: the images found and five of
    the files as evidence."""
    archs = sorted(by_arch, key=_arch_key)
    ctx.emit(
        "device-files-optional" if optional else "device-files",
        label,
        evidence=tuple(
            [f"{a}: {by_arch[a]} file(s)" for a in archs]
            + [f"no image for sm_{cc.sm}: {r}" for r in lacking[:5]]
            + ([f"... and {len(lacking) - 5} more"] if len(lacking) > 5 else [])
        ),
        k=len(lacking),
        n=n,
        cc=cc.sm,
        archs=" ".join(archs),
    )


def _arch_key(name: str):
    m = re.match(r"(sm|compute)_(\d+)([af]?)", name)
    return (m.group(1) != "sm", int(m.group(2)), m.group(3)) if m else (True, 0, name)


def check_device_toolkit(ctx: Context, extensions: dict[str, FileReport]) -> None:
    for rel, rep in extensions.items():
        if rel in ctx.grouped:
            continue  # its CUDA build is already one finding (check 6)
        tk = next((f.toolkit for f in rep.fatbins if f.toolkit), None)
        if tk is None and rep.kernel_fatbins:
            fat = next((f for f in rep.kernel_fatbins if f.kernels is None), None)
            if fat is not None:
                _open_undecided(ctx, rel, rep, [fat])
                tk = fat.toolkit
        if not tk or rep.elf is None:
            continue
        host = next((int(m.group(2)) for n in rep.elf.needed if (m := CUDA_RUNTIME.match(n))), None)
        if host is None:
            host = ctx.torch.major
        if host is not None and int(tk.split(".")[0]) != host:
            ctx.emit("device-toolkit", rep.origin, x=tk, y=host)


def check_torch_archs(ctx: Context) -> None:
    t = ctx.torch
    if not t.present or t.cuda is None:
        return
    flags = t.arch_flags
    if not flags:
        rep = ctx.reports.get("torch/lib/libtorch_cuda.so")
        if rep:
            flags = sorted({e.name for f in rep.kernel_fatbins for e in f.entries}, key=_arch_key)
    if not flags:
        return
    for cc in ctx.targets:
        if not arch_list_runs_on(flags, cc):
            ctx.emit("torch-archs", "torch/lib/libtorch_python.so", cc=cc.sm, list=" ".join(flags))
