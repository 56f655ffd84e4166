"""Checks 1-5, the distributions: torch's variant and pins, the CUDA wheels, sgl-kernel and
wheel file names; and whether the sglang checked is the profile's (0, ``profile-stack``)."""

from __future__ import annotations

import os
import posixpath
import re

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from patchkit.abi.checks.context import Context, _public, _same_public, _top


def check_profile_stack(ctx: Context) -> None:
    """The sglang of the checked files is the one the profile pins: another line's profile
    checks against another torch, other pins and other kernels."""
    sglang = ctx.tree.dists.get("sglang")
    pin = ctx.profile.pins.get("sglang")
    if sglang is None or not pin or _same_public(sglang.version, pin):
        return
    stack = ctx.choice.stack_profile if ctx.choice else None
    if stack:
        fix = f"--profile {stack}, or no --profile and no $PATCHKIT_PROFILE (verify picks it)"
    else:
        fix = "no profile pins it; add one to build/profiles/ (docs/verify.md)"
    ctx.emit(
        "profile-stack",
        sglang.wheel or "sglang",
        version=sglang.version,
        profile=ctx.profile.name,
        pin=pin,
        torch=ctx.profile.torch_version,
        fix=fix,
    )


def check_torch_variant(ctx: Context) -> None:
    t, p = ctx.torch, ctx.profile
    if not t.present:
        if ctx.profile_torch:
            ctx.emit(
                "torch-from-profile",
                "torch",
                expected=p.torch_version,
                source=ctx.profile_torch_source,
            )
        else:
            ctx.emit("torch-missing", "torch", expected=p.torch_version)
        return
    if t.cuda is None:
        ctx.emit("torch-cpu-only", "torch/version.py", ver=t.version, index_url=p.index_url)
        return
    want_major = p.cuda_major
    if t.version != p.torch_version or int(t.cuda.split(".")[0]) != want_major:
        ctx.emit(
            "torch-variant",
            "torch/version.py",
            ver=t.version,
            cuda=t.cuda,
            expected=p.torch_version,
            index_url=p.index_url,
        )


def check_torch_dist(ctx: Context) -> None:
    dist = ctx.tree.dists.get("torch")
    if dist and ctx.torch.version and dist.version != ctx.torch.version:
        if dist.version != _public(ctx.torch.version):
            ctx.emit("torch-dist-version", "torch", a=dist.version, b=ctx.torch.version)


# The target host's marker values: a requirement made only off Linux does not apply there.
TARGET_MARKERS = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix"}


def _torch_requirements(dist) -> list[Requirement]:
    """The dist's Requires-Dist on torch that apply on the target host without an extra."""
    out = []
    for text in dist.requires:
        try:
            req = Requirement(text)
            if canonicalize_name(req.name) != "torch" or not req.specifier:
                continue
            if req.marker is None or req.marker.evaluate({"extra": "", **TARGET_MARKERS}):
                out.append(req)
        except Exception:  # InvalidRequirement, or a marker that cannot be evaluated
            continue
    return out


def check_torch_pins(ctx: Context) -> None:
    """Every dist (wheel or installed) whose Requires-Dist excludes the profile's torch."""
    want = ctx.profile.torch_version
    for name, dist in sorted(ctx.tree.dists.items()):
        if name == "torch":
            continue
        for req in _torch_requirements(dist):
            try:
                ok = req.specifier.contains(want, prereleases=True)
            except InvalidVersion:
                continue
            if not ok:
                ctx.emit(
                    "torch-pin",
                    dist.wheel or f"{dist.name} {dist.version}",
                    dist=dist.name,
                    version=dist.version,
                    req=str(req).split(";")[0].strip(),
                    torch=want,
                )
                break


def check_cuda_wheels(ctx: Context) -> None:
    """torch's Requires-Dist on the nvidia-*/cuda-* wheels against the versions present;
    nvidia-*-cu12 wheels in a CUDA 13 stack, worse where torch's loader searches them."""
    torch = ctx.tree.dists.get("torch")
    if torch is None:
        return
    for req in _cuda_requirements(torch.requires):
        have = ctx.tree.dists.get(req.name.lower().replace("_", "-"))
        if have is None or not req.specifier:
            continue
        if not req.specifier.contains(have.version, prereleases=True):
            ctx.emit(
                "cuda-wheel-pin",
                have.wheel or have.name,
                req=str(req).split(";")[0].strip(),
                name=have.name,
                have=have.version,
            )
    # CUDA-12 wheels matter only where torch (or, without torch, the profile) is CUDA >= 13;
    # a CUDA-12 torch is check 1's finding.
    if (ctx.torch.major or ctx.profile.cuda_major) >= 13:
        _check_cuda12_wheels(ctx)


def _cuda_requirements(requires: list[str]) -> list[Requirement]:
    """The parseable requirements on nvidia-* and cuda-* wheels whose markers hold (no
    extra)."""
    out = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if not req.name.startswith(("nvidia-", "cuda-")) or not _marker_holds(req):
            continue
        out.append(req)
    return out


def _marker_holds(req: Requirement) -> bool:
    """Whether a requirement applies without an extra (an unevaluable marker does not)."""
    if req.marker is None:
        return True
    try:
        return bool(req.marker.evaluate({"extra": ""}))
    except Exception:
        return False


def _check_cuda12_wheels(ctx: Context) -> None:
    """Each nvidia-*-cu12 dist: an error where torch's RPATH or LD_LIBRARY_PATH searches its
    folder, else a warning."""
    searched = _searched_dirs(ctx)
    for name, dist in sorted(ctx.tree.dists.items()):
        if re.fullmatch(r"nvidia-.*-cu12", name):
            where = next((w for d, w in searched if dist.owns(d + "/")), None)
            if where:
                ctx.emit("cuda12-wheel-on-path", dist.wheel or name, dist=name, where=where)
            else:
                ctx.emit("cuda12-wheel", dist.wheel or name, dist=name)


def _searched_dirs(ctx: Context) -> list[tuple[str, str]]:
    out = []
    for rel, rep in ctx.reports.items():
        if rep.elf is None or _top(rel) != "torch":
            continue
        for entry in rep.elf.rpath + rep.elf.runpath:
            if "$ORIGIN" in entry:
                d = posixpath.normpath(entry.replace("$ORIGIN", posixpath.dirname(rel)))
                out.append((d, f"the RPATH of {rel}"))
    root = ctx.tree.root
    for entry in ctx.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if entry and os.path.abspath(entry).startswith(root + os.sep):
            out.append((os.path.relpath(os.path.abspath(entry), root), "LD_LIBRARY_PATH"))
    return out


def check_sgl_kernel(ctx: Context) -> None:
    dists = ctx.tree.dists
    owners = [d for name, d in sorted(dists.items()) if d.owns("sgl_kernel/")]
    if len(owners) > 1:
        a, b = owners[0], owners[1]
        ctx.emit(
            "sgl-kernel-owner", "sgl_kernel/", a=f"{a.name} {a.version}", b=f"{b.name} {b.version}"
        )
    sglang = dists.get("sglang")
    if sglang is None:
        return
    for text in sglang.requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name.lower() not in ("sgl-kernel", "sglang-kernel") or (
            req.marker and "extra" in str(req.marker)
        ):
            continue
        pins = [s.version for s in req.specifier if s.operator == "=="]
        have = dists.get(req.name.lower()) or (owners[0] if owners else None)
        if pins and have and not _same_public(pins[0], have.version):
            ctx.emit(
                "sgl-kernel-pin",
                have.wheel or "sgl_kernel/",
                v=sglang.version,
                x=pins[0],
                y=have.version,
            )


def check_wheel_filenames(ctx: Context) -> None:
    """A wheelhouse's file names against what each wheel holds, as pip reads them: a wheel
    file name, the project it names that of METADATA and of the `.dist-info` folder, the
    version METADATA's."""
    if ctx.tree.kind != "wheelhouse":
        return
    for dist in ctx.tree.dists.values():
        if dist.wheel and _wheel_name_problem(ctx, dist):
            continue
        if dist.wheel and dist.filename_version:
            try:
                same = Version(dist.filename_version) == Version(dist.version)
            except InvalidVersion:
                same = dist.filename_version == dist.version
            if not same:
                ctx.emit("wheel-filename", dist.wheel, f=dist.filename_version, m=dist.version)


def _wheel_name_problem(ctx: Context, dist) -> bool:
    """Emit `wheel-name` when the wheel's file name is no wheel name, or names another
    project than its METADATA or its `.dist-info` folder; True when it did."""
    if dist.filename_name is None:
        why = "not a wheel file name (NAME-VERSION[-BUILD]-PYTHON-ABI-PLATFORM.whl)"
        fix = "name the wheel as pip builds it, or leave it out of the wheelhouse"
    else:
        want = dist.filename_name
        tops = {f.split("/", 1)[0] for f in dist.files()}
        infos = sorted(t.removesuffix(".dist-info") for t in tops if t.endswith(".dist-info"))
        others = [t for t in infos if canonicalize_name(t.rsplit("-", 1)[0]) != want]
        if dist.name != want:
            why = f"the file name says {want}, METADATA says {dist.name}"
        elif others:
            why = f"the file name says {want}, its metadata folder is {others[0]}.dist-info"
        else:
            return False
        fix = "rebuild the wheel, or rename it to the project its METADATA names"
    ctx.emit("wheel-name", dist.wheel, why=why, fix=fix)
    return True
