"""The verify checks: functions from a Context to Finding records. Nothing here prints.

Severities, messages and next steps come from ``checks.toml`` (overridable per profile); the
functions only decide whether a rule is broken and fill in the fields.
"""

from __future__ import annotations

import bisect
import fnmatch
import json
import os
import posixpath
import re
import shutil
import subprocess
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from patchkit.abi.archs import CC, arch_list_runs_on, coverage, family_hint
from patchkit.abi.cache import ResultCache
from patchkit.abi.elf import name_set, open_mapped
from patchkit.abi.fatbin import PTX_ISA_TO_CUDA, decide_kernels
from patchkit.abi.loader import EXEMPT, Closure, Loaded, Loader, read_ld_cache
from patchkit.abi.profiles import CheckSpec, Profile, load_catalogue
from patchkit.abi.scan import FileReport
from patchkit.abi.sources import Tree

TORCH_SONAMES = {
    "libc10.so",
    "libc10_cuda.so",
    "libtorch.so",
    "libtorch_cpu.so",
    "libtorch_cuda.so",
    "libtorch_python.so",
    "libtorch_global_deps.so",
}
TORCH_PREFIXES = (
    "_ZN3c10",
    "_ZNK3c10",
    "_ZN2at",
    "_ZNK2at",
    "_ZN5torch",
    "_ZNK5torch",
    "_ZNR5torch",
    "THP",
    "_ZN4c10d",
    "_ZNK4c10d",
)
CUDA_RUNTIME = re.compile(r"^lib(cudart|cublas|cublasLt|nvrtc|nvJitLink|cupti|nvblas)\.so\.(\d+)$")
ONE_RUNTIME = re.compile(r"^lib(cudart|cublas|cublasLt|nvrtc)\.so\.(\d+)$")
MAX_SYMBOLS_PER_FILE = 5
# What `import torch` dlopens after libtorch_global_deps.so: (nvidia/<folder>/lib, file glob).
TORCH_PRELOADS = (
    ("cuda_nvrtc", "libnvrtc.so.*[0-9]"),
    ("cuda_nvrtc", "libnvrtc-builtins.so.*[0-9]"),
    ("nvjitlink", "libnvJitLink.so.*[0-9]"),
)
# NVIDIA driver branch -> newest CUDA it runs (CUDA's release notes, table 3).
DRIVER_CUDA = [
    ((590, 0), (13, 1)),
    ((580, 0), (13, 0)),
    ((575, 0), (12, 9)),
    ((570, 0), (12, 8)),
    ((560, 0), (12, 6)),
    ((555, 0), (12, 5)),
    ((550, 0), (12, 4)),
    ((545, 0), (12, 3)),
    ((535, 0), (12, 2)),
    ((530, 0), (12, 1)),
    ((525, 0), (12, 0)),
]


@dataclass(frozen=True)
class Finding:
    """One broken rule: which check, how bad, which file, what the failure says, what to do."""

    check: str
    number: int
    severity: str  # "error" | "warning" | "note"
    file: str
    message: str
    hint: str
    evidence: tuple[str, ...] = ()  # the facts behind a grouped finding, one per line

    def line(self) -> str:
        return f"{self.severity:<7}  {self.file}: {self.message} — {self.hint}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["evidence"] = list(self.evidence)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Finding:
        """Rebuild from to_dict() output (the run cache); raises on anything else."""
        strs = ("check", "severity", "file", "message", "hint")
        if not all(isinstance(d[k], str) for k in strs) or type(d["number"]) is not int:
            raise TypeError("finding fields")
        if d["severity"] not in ("error", "warning", "note"):
            raise ValueError("severity")
        ev = d["evidence"]
        if not isinstance(ev, list) or not all(isinstance(x, str) for x in ev):
            raise TypeError("evidence")
        return cls(
            *(d[k] for k in ("check", "number", "severity", "file", "message", "hint")), tuple(ev)
        )


@dataclass
class TorchFacts:
    """torch as read from files: version.py, dist-info, its libraries."""

    present: bool = False
    version: str | None = None
    cuda: str | None = None
    linked_major: int | None = None
    cxx11_abi: int | None = None
    arch_flags: list[str] = field(default_factory=list)

    @property
    def major(self) -> int | None:
        if self.linked_major is not None:
            return self.linked_major
        if self.cuda:
            return int(self.cuda.split(".")[0])
        return None


@dataclass
class DriverInfo:
    """The host's NVIDIA driver, if any: version and the CUDA version it supports."""

    version: str | None
    source: str = ""

    @property
    def tuple(self) -> tuple[int, ...] | None:
        return tuple(int(p) for p in self.version.split(".")) if self.version else None

    @property
    def cuda(self) -> tuple[int, int] | None:
        v = self.tuple
        if v is None:
            return None
        for branch, cuda in DRIVER_CUDA:
            if v[:2] >= branch:
                return cuda
        return (11, 8)


def detect_driver(
    proc: str = "/proc/driver/nvidia/version", ld_cache: dict | None = None
) -> DriverInfo:
    """The driver version from /proc, else from libcuda.so.1's real file name."""
    try:
        with open(proc, encoding="utf-8", errors="replace") as fh:
            m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", fh.read())
            if m:
                return DriverInfo(m.group(1), proc)
    except OSError:
        pass
    cache = read_ld_cache() if ld_cache is None else ld_cache
    path = cache.get("libcuda.so.1")
    if path:
        m = re.search(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$", os.path.realpath(path))
        if m:
            return DriverInfo(m.group(1), os.path.realpath(path))
    return DriverInfo(None)


@dataclass
class Context:
    """Everything the checks read."""

    tree: Tree
    reports: dict[str, FileReport]
    profile: Profile
    targets: list[CC]
    cache: ResultCache
    driver: DriverInfo | None = None  # None: not a host check (wheelhouse)
    environ: dict[str, str] = field(default_factory=dict)
    ld_cache: dict[str, str] | None = None
    catalogue: dict[str, CheckSpec] = field(default_factory=load_catalogue)
    findings: list[Finding] = field(default_factory=list)
    torch: TorchFacts = field(default_factory=TorchFacts)
    loader: Loader | None = None
    closures: dict[str, Closure] = field(default_factory=dict)
    # Stand-ins for the profile's torch libraries when torch is not among the checked files.
    profile_torch: dict[str, FileReport] = field(default_factory=dict)
    profile_torch_source: str | None = None
    grouped: set[str] = field(default_factory=set)  # files whose CUDA build is one finding
    # rel -> (undefined torch name, the name torch exports with the other C++ ABI's mangling)
    abi_twins: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def emit(self, check: str, file: str, evidence: tuple[str, ...] = (), **fields) -> None:
        spec = self.catalogue[check]
        severity = self.profile.severity.get(check, spec.severity)
        values = _Fields(fields)
        self.findings.append(
            Finding(
                check,
                spec.number,
                severity,
                file,
                spec.message.format_map(values),
                spec.hint.format_map(values),
                tuple(evidence),
            )
        )


class _Fields(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def _same_public(a: str, b: str) -> bool:
    try:
        return Version(_public(a)) == Version(_public(b))
    except InvalidVersion:
        return _public(a) == _public(b)


# ---------------------------------------------------------------- torch facts and subjects


def read_torch(ctx: Context) -> None:
    text = ctx.tree.texts.get("torch/version.py")
    facts = TorchFacts()
    if text is not None:
        facts.present = True
        m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        facts.version = m.group(1) if m else None
        m = re.search(r"^cuda(?::[^=]*)?=\s*(?:['\"]([^'\"]+)['\"]|None)", text, re.M)
        facts.cuda = m.group(1) if m and m.group(1) else None
    for rel in (
        "torch/lib/libc10_cuda.so",
        "torch/lib/libtorch_global_deps.so",
        "torch/lib/libtorch_cuda.so",
    ):
        rep = ctx.reports.get(rel)
        if rep and rep.elf:
            majors = [int(m.group(2)) for n in rep.elf.needed if (m := CUDA_RUNTIME.match(n))]
            if majors:
                facts.linked_major = majors[0]
                break
    c10 = ctx.reports.get("torch/lib/libc10.so")
    if c10 and c10.elf:
        facts.cxx11_abi = c10.elf.cxx11_abi
    py = ctx.reports.get("torch/lib/libtorch_python.so")
    if py and py.arch_flags:
        facts.arch_flags = py.arch_flags
    ctx.torch = facts


def _top(rel: str) -> str:
    return rel.split("/", 1)[0]


def is_extension(ctx: Context, rel: str, rep: FileReport) -> bool:
    """Any ELF object outside torch and the nvidia-* CUDA wheels (whatever its name)."""
    if rep.kind != "elf" or rel in ctx.profile_torch:
        return False
    top = _top(rel)
    # auditwheel's <dist>.libs/ hold vendored libraries, loaded only as an extension's NEEDED
    if top in ("torch", "nvidia") or top.endswith(".libs"):
        return False
    owner = ctx.tree.owner(rel)
    return not (owner and (owner.name == "torch" or owner.name.startswith("nvidia-")))


def extension_reports(ctx: Context) -> dict[str, FileReport]:
    return {rel: rep for rel, rep in sorted(ctx.reports.items()) if is_extension(ctx, rel, rep)}


def owner_label(ctx: Context, rel: str, rep: FileReport) -> str:
    """What to name a grouped finding after: the wheel, else the installed dist, else the top."""
    if "!" in rep.origin:
        return rep.origin.split("!", 1)[0]
    owner = ctx.tree.owner(rel)
    return f"{owner.name} {owner.version}" if owner else _top(rel)


# ---------------------------------------------------------------- checks 1-5: distributions


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
    dists = ctx.tree.dists
    torch = dists.get("torch")
    if torch is None:
        return
    for text in torch.requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None:
            try:
                if not req.marker.evaluate({"extra": ""}):
                    continue
            except Exception:
                continue
        if not (req.name.startswith("nvidia-") or req.name.startswith("cuda-")):
            continue
        have = dists.get(req.name.lower().replace("_", "-"))
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
    if (ctx.torch.major or ctx.profile.cuda_major) < 13:
        return
    searched = _searched_dirs(ctx)
    for name, dist in sorted(dists.items()):
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
    if ctx.tree.kind != "wheelhouse":
        return
    for dist in ctx.tree.dists.values():
        if dist.wheel and dist.filename_version:
            try:
                same = Version(dist.filename_version) == Version(dist.version)
            except InvalidVersion:
                same = dist.filename_version == dist.version
            if not same:
                ctx.emit("wheel-filename", dist.wheel, f=dist.filename_version, m=dist.version)


# ---------------------------------------------------------------- checks 6-11: loading


def check_cuda_major(ctx: Context, extensions: dict[str, FileReport]) -> None:
    """One finding per distribution built for another CUDA major, its files as evidence."""
    t = ctx.torch.major or ctx.profile.cuda_major
    builds: dict[str, list[tuple[str, str, list[str]]]] = defaultdict(list)
    for rel, rep in extensions.items():
        if rep.elf is None:
            continue
        wrong = [n for n in rep.elf.needed if (m := CUDA_RUNTIME.match(n)) and int(m.group(2)) != t]
        if wrong:
            builds[owner_label(ctx, rel, rep)].append((rel, rep.origin, wrong))
    for label, files in sorted(builds.items()):
        sonames = sorted({n for _, _, names in files for n in names})
        majors = sorted({CUDA_RUNTIME.match(n).group(2) for n in sonames})
        m = "/".join(majors)
        if len(files) == 1 and "!" not in label and label == _top(files[0][0]):
            label = files[0][1]
        ctx.grouped.update(rel for rel, _, _ in files)
        ctx.emit(
            "cuda-major",
            label,
            evidence=tuple(f"{origin}: needs {', '.join(names)}" for _, origin, names in files),
            n=len(files),
            soname=sonames[0],
            sonames=", ".join(sonames),
            m=m,
            t=t,
        )


def load_profile_torch(ctx: Context) -> None:
    """Stand-ins for the profile's torch libraries, when torch is not among the checked files."""
    if ctx.torch.present or not ctx.profile.torch_symbols:
        return
    from patchkit.abi import torchsyms

    path = ctx.profile.data_file(ctx.profile.torch_symbols)
    try:
        doc = torchsyms.load(path)
    except ValueError as exc:
        ctx.emit("torch-symbols-unreadable", ctx.profile.name, reason=str(exc))
        return
    label = f"profile torch {doc.get('torch')}"
    for rel, elf in torchsyms.elf_infos(doc, label).items():
        ctx.profile_torch[rel] = FileReport(relpath=rel, origin=elf.path, elf=elf)
    ctx.profile_torch_source = f"{doc.get('wheel')}, sha256 {str(doc.get('sha256'))[:12]}…"
    c10 = ctx.profile_torch.get("torch/lib/libc10.so")
    if c10 and c10.elf:
        ctx.torch.cxx11_abi = c10.elf.cxx11_abi


def _elsewhere(ctx: Context):
    """soname -> the dist of the stack that ships it, when that dist is not being checked."""
    partial = ctx.tree.kind == "wheelhouse" and not ctx.tree.has_env

    def where(name: str) -> str | None:
        dist = ctx.profile.provider(name)
        if dist is None or not partial:
            return None
        if dist in ctx.tree.dists:
            return None  # it is here, so the library should have been found: an error
        if dist == "torch" and ctx.profile_torch:
            return None
        return dist

    return where


def build_loader(ctx: Context) -> Loader:
    reports = {**ctx.reports, **ctx.profile_torch}
    root = ctx.tree.root
    lib_path = []
    for entry in ctx.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if entry and os.path.abspath(entry).startswith(root + os.sep):
            lib_path.append(os.path.relpath(os.path.abspath(entry), root).replace(os.sep, "/"))
    prof = ctx.profile

    def host_provides(name: str) -> bool:
        return prof.host_provides(name) if prof.host_libraries else name in EXEMPT

    loader = Loader(
        reports, host_provides, lib_path, tree_root=ctx.tree.root, elsewhere=_elsewhere(ctx)
    )
    local = [rel for rel in reports if re.fullmatch(r"torch/_C\..*so", rel)]
    if not local and "torch/lib/libtorch_python.so" in ctx.profile_torch:
        local = ["torch/lib/libtorch_python.so"]  # what torch/_C loads
    global_ = [rel for rel in ("torch/lib/libtorch_global_deps.so",) if rel in reports]
    for cl in loader.preload(local[:1], global_):
        if cl.objects[0].key not in ctx.profile_torch:
            ctx.closures[cl.objects[0].key] = cl
    if any(name.startswith("libcudart.so") for name in loader.preloaded):
        # torch/__init__.py then preloads nvrtc and nvJitLink from the nvidia wheels (pytorch
        # #138460, #145580), so extensions find them by SONAME.
        major = ctx.torch.major or ctx.profile.cuda_major
        for folder, pattern in TORCH_PRELOADS:
            rels = [
                r
                for d in (f"nvidia/{folder}/lib", f"nvidia/cu{major}/lib")
                for r in sorted(ctx.reports)
                if posixpath.dirname(r) == d and fnmatch.fnmatch(posixpath.basename(r), pattern)
            ]
            if rels:
                cl = loader.closure(rels[0], ctx.reports[rels[0]], loader.preloaded)
                loader.add_preloaded(cl)
    ctx.loader = loader
    return loader


def check_needed(ctx: Context, extensions: dict[str, FileReport]) -> None:
    loader = ctx.loader
    seen: set = set()
    elsewhere: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    missing: dict[tuple[str, str], list[str]] = defaultdict(list)
    for cl in list(ctx.closures.values()):
        _report_missing(ctx, cl, seen, elsewhere, missing)
    for rel, rep in extensions.items():
        if rep.elf is None:
            continue
        cl = loader.closure(rel, rep)
        ctx.closures[rel] = cl
        _report_missing(ctx, cl, seen, elsewhere, missing)
    _emit_missing(ctx, missing)
    for dist, names in sorted(elsewhere.items()):
        users = sorted({u for us in names.values() for u in us})
        ctx.emit(
            "needed-elsewhere",
            users[0] if len(users) == 1 else _many(users),
            evidence=tuple(
                f"{u}: needs {', '.join(sorted(n for n in names if u in names[n]))}" for u in users
            ),
            names=", ".join(sorted(names)),
            dist=dist,
        )


def _many(origins: list[str]) -> str:
    """A name for a group of files: their wheel, if they share one."""
    wheels = {o.split("!", 1)[0] for o in origins if "!" in o}
    if len(wheels) == 1 and all("!" in o for o in origins):
        return f"{wheels.pop()} ({len(origins)} objects)"
    return f"{len(origins)} objects"


def _report_missing(ctx: Context, cl: Closure, seen: set, elsewhere, missing) -> None:
    t = ctx.torch.major or ctx.profile.cuda_major
    for name, needed_by in cl.missing:
        if (name, needed_by) in seen:
            continue
        seen.add((name, needed_by))
        m = CUDA_RUNTIME.match(name)
        obj = next((o for o in cl.objects if o.report.origin == needed_by), None)
        if m and int(m.group(2)) != t and obj is not None and obj.key in ctx.grouped:
            continue  # part of the CUDA-build finding (check 6)
        label = owner_label(ctx, obj.key, obj.report) if obj else needed_by
        missing[(label, name)].append(needed_by)
    for name, needed_by, dist in cl.elsewhere:
        elsewhere[dist][name].add(needed_by)


def _emit_missing(ctx: Context, missing: dict[tuple[str, str], list[str]]) -> None:
    for (label, name), users in sorted(missing.items()):
        if len(users) == 1:
            ctx.emit("needed-missing", users[0], name=name, so=os.path.basename(users[0]))
            continue
        ctx.emit(
            "needed-missing",
            label,
            evidence=tuple(f"{u}: needs {name}" for u in users),
            name=name,
            so=f"{len(users)} objects",
        )


def _bucket(name: str) -> str:
    if name.startswith(TORCH_PREFIXES):
        return "torch-abi"
    if name.startswith(("cu", "nvrtc", "nvJitLink")):
        return "cuda-lib"
    if name.startswith(("Py", "_Py")):
        return "python-abi"
    if name.startswith(
        (
            "_ZNSt",
            "_ZNKSt",
            "_ZSt",
            "_ZTISt",
            "_ZTVSt",
            "_ZNSs",
            "_ZNKSs",
            "__cxa",
            "_ZTVN10__cxxabiv",
        )
    ):
        return "libstdc++"
    return "other"


class _Unresolved(NamedTuple):
    """One strong undefined name of an extension that no library of its scope defines."""

    rel: str
    origin: str
    name: str
    bucket: str
    total: int  # the object's unresolved names, all buckets


def check_symbols(ctx: Context, extensions: dict[str, FileReport]) -> None:
    """Undefined symbols: torch's grouped per package (an ABI-flag mismatch is check 9's, see
    _split_abi_flag), other buckets per file; an object whose NEEDED closure misses a library
    has its torch names checked against every torch library present and the rest named as
    not checked (_emit_unchecked)."""
    global_sets = [name_set(o.report.elf.defined) for o in ctx.loader.global_scope if o.report.elf]
    torch_known = ctx.torch.present or bool(ctx.profile_torch)
    pending: list[_Unresolved] = []
    unchecked: list[tuple[str, str, list[str], int]] = []  # (rel, origin, libraries, names)
    for rel, rep in extensions.items():
        cl = ctx.closures.get(rel)
        if rep.elf is None or cl is None:
            continue
        unresolved = _unresolved(rep, cl, global_sets)
        if cl.missing:
            found, skipped = _decidable(ctx, rep.elf, cl, unresolved)
            if skipped:
                unchecked.append((rel, rep.origin, sorted({n for n, _ in cl.missing}), skipped))
        else:
            unread = _unread(cl)
            found = [
                (n, b)
                for n, b in unresolved
                if not _left_alone(rep.elf.symbol_library(n), b, cl, unread, torch_known)
            ]
        pending += [_Unresolved(rel, rep.origin, n, b, len(found)) for n, b in found]
    names = demangle([p.name for p in pending])
    torch_items = [p for p in pending if p.bucket == "torch-abi"]
    api = _split_abi_flag(ctx, torch_items, extensions)
    _emit_other(ctx, [p for p in pending if p.bucket != "torch-abi"], names)
    _emit_torch(ctx, api, extensions, names)
    _emit_unchecked(ctx, unchecked, extensions)


def _unresolved(rep: FileReport, cl: Closure, global_sets: list) -> list[tuple[str, str]]:
    """(name, bucket) of the object's strong undefined names that neither the global scope nor
    its own NEEDED closure (dlopen order) defines."""
    own = [name_set(o.report.elf.defined) for o in cl.objects[1:] if o.report.elf]
    # Found set by set in C (a set intersection walks the smaller side), not name by name
    # through every library of the scope.
    unresolved = set(rep.elf.undefined)
    for defined in global_sets + own:
        if not unresolved:
            break
        unresolved -= unresolved.intersection(defined)
    return [(name, _bucket(name)) for name in rep.elf.undefined if name in unresolved]


def _unread(cl: Closure) -> set[str]:
    """The libraries of the closure not read here: the host's, those of wheels not present."""
    return cl.exempt | {name for name, _, _ in cl.elsewhere}


def _left_alone(lib: str | None, bucket: str, cl: Closure, unread: set, torch_known: bool) -> bool:
    """Whether an unresolved name is left to a library this check does not read."""
    if lib is not None and lib in unread:
        return True  # bound by version to a host library or one from another wheel
    if bucket == "python-abi":
        return True  # the interpreter defines these
    if bucket == "cuda-lib" and ({"libcuda.so.1", "libcuda.so"} & cl.exempt or cl.elsewhere):
        return True  # libcuda.so.1 comes with the driver; others from wheels not here
    if bucket == "torch-abi" and not torch_known:
        return True  # torch-missing already says these cannot be checked
    # an unversioned name a host library may define: not decidable here
    return bucket in ("libstdc++", "other") and lib is None and bool(unread)


def _decidable(
    ctx: Context, elf, cl: Closure, unresolved: list[tuple[str, str]]
) -> tuple[list[tuple[str, str]], int]:
    """ld.so stops at a missing library (check 7 says so), and that library, or what it
    would load, might define any name. Torch's names are still decided, against every torch
    library present (a name none of them defines is not torch's either way), unless what is
    missing is a torch library; the others are counted as not checked."""
    unread = _unread(cl)
    torch_known = ctx.torch.present or bool(ctx.profile_torch)
    torch_lib_missing = any(_is_torch_library(ctx, name) for name, _ in cl.missing)
    exports = _torch_exports(ctx) if torch_known and not torch_lib_missing else None
    keep, skipped = [], 0
    for name, bucket in unresolved:
        lib = elf.symbol_library(name)
        if bucket == "python-abi" or (lib is not None and lib in unread):
            continue
        if bucket == "torch-abi" and not torch_known:
            continue  # torch-missing says so
        if bucket == "torch-abi" and exports is not None:
            if name not in exports:
                keep.append((name, bucket))
            continue
        skipped += 1
    return keep, skipped


def _is_torch_library(ctx: Context, name: str) -> bool:
    return (
        name in TORCH_SONAMES
        or name.startswith("libtorch")
        or ctx.profile.provider(name) == "torch"
    )


def _torch_libraries(ctx: Context) -> list:
    """The ElfInfo of every torch library: the checked torch's, else the profile's stand-ins."""
    reports = {**ctx.reports, **ctx.profile_torch}
    return [
        rep.elf
        for rel, rep in sorted(reports.items())
        if rep.elf and (rel.startswith("torch/lib/") or rep.elf.soname in TORCH_SONAMES)
    ]


def _torch_exports(ctx: Context) -> frozenset[str]:
    names = ctx.__dict__.get("_torch_exports")
    if names is None:
        names = frozenset().union(*(name_set(elf.defined) for elf in _torch_libraries(ctx)))
        ctx.__dict__["_torch_exports"] = names
    return names


def _emit_other(ctx: Context, items: list[_Unresolved], names: dict[str, str]) -> None:
    """Names of other buckets: one finding per name, five per file at most."""
    per_file: dict[str, int] = defaultdict(int)
    for item in items:
        per_file[item.origin] += 1
        if per_file[item.origin] > MAX_SYMBOLS_PER_FILE:
            continue
        demangled = names.get(item.name, item.name)
        if per_file[item.origin] == MAX_SYMBOLS_PER_FILE and item.total > MAX_SYMBOLS_PER_FILE:
            demangled += f"; and {item.total - MAX_SYMBOLS_PER_FILE} more undefined symbols"
        ctx.emit(
            "undefined-symbol-other",
            item.origin,
            mangled=item.name,
            demangled=demangled,
            bucket=item.bucket,
        )


def _emit_torch(
    ctx: Context, items: list[_Unresolved], extensions: dict[str, FileReport], names: dict
) -> None:
    """Torch names no mangling of which torch exports: one finding per package (a build
    against another torch's API), the names as evidence."""
    by_owner: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for item in items:
        by_owner[owner_label(ctx, item.rel, extensions[item.rel])].append((item.origin, item.name))
    for label, found in sorted(by_owner.items()):
        files = sorted({o for o, _ in found})
        symbols = sorted({n for _, n in found})
        first = symbols[0]
        more = f"; {len(symbols)} torch symbols undefined in {len(files)} object(s)"
        ctx.emit(
            "undefined-symbol" if ctx.torch.present else "undefined-symbol-profile",
            files[0] if len(files) == 1 else label,
            evidence=tuple(f"{o}: {n} ({names.get(n, n)})" for o, n in sorted(found)),
            mangled=first,
            demangled=names.get(first, first),
            more=more if len(found) > 1 else "",
            torch_ver=ctx.torch.version or ctx.profile.torch_version,
            source=ctx.profile_torch_source or "",
        )


def _emit_unchecked(
    ctx: Context, unchecked: list[tuple[str, str, list[str], int]], extensions: dict
) -> None:
    """One note per package: the undefined names of objects whose NEEDED closure misses a
    library, left unchecked because that library might define them."""
    by_owner: dict[str, list[tuple[str, list[str], int]]] = defaultdict(list)
    for rel, origin, libs, count in unchecked:
        by_owner[owner_label(ctx, rel, extensions[rel])].append((origin, libs, count))
    for label, items in sorted(by_owner.items()):
        libs = sorted({lib for _, names, _ in items for lib in names})
        ctx.emit(
            "undefined-symbol-unchecked",
            items[0][0] if len(items) == 1 else label,
            evidence=tuple(
                f"{o}: {n} undefined symbol(s) not checked, {', '.join(ls)} missing"
                for o, ls, n in sorted(items)
            ),
            n=sum(n for _, _, n in items),
            libs=", ".join(libs),
        )


# Mangled pieces whose spelling depends on _GLIBCXX_USE_CXX11_ABI: the C++11 ABI's
# std::__cxx11 types and [abi:cxx11] tags; the old ABI's std::string (Ss), std::list and the
# string streams. A name holding none of them is mangled the same under both, and two
# manglings of one name are alike up to the first such piece (a name is mangled left to right).
_ABI_DEPENDENT = re.compile(
    r"N?St7__cxx11|B5cxx11|cxx11|Ss|St4list|St12basic_string|St15basic_stringbuf"
    r"|St18basic_stringstream|St19basic_[io]stringstream"
)
# The most other-ABI candidates demangled for one name (names sharing its mangled prefix).
MAX_TWIN_CANDIDATES = 256


_STRING = "std::basic_string<char, std::char_traits<char>, std::allocator<char> >"


def _abi_neutral(demangled: str) -> str:
    """A demangled name as both ABIs would spell it."""
    text = demangled.replace("[abi:cxx11]", "").replace("std::__cxx11::", "std::")
    return text.replace(_STRING, "std::string")


def _split_abi_flag(
    ctx: Context, items: list[_Unresolved], extensions: dict[str, FileReport]
) -> list[_Unresolved]:
    """Keep in ``ctx.abi_twins`` (per object) the undefined torch names that torch exports
    with the other _GLIBCXX_USE_CXX11_ABI mangling: the same name once demangled and rid of
    the ABI's spelling, the one holding ``cxx11`` where the other does not, the object built
    with another ABI than torch's (as far as either is known). Return the others: names no
    torch library exports in any mangling, an API change."""
    twins = _abi_twins(ctx, sorted({i.name for i in items if _ABI_DEPENDENT.search(i.name)}))
    y = ctx.torch.cxx11_abi
    api = []
    for item in items:
        twin = twins.get(item.name)
        x = extensions[item.rel].elf.cxx11_abi
        if twin is None or (x is not None and x == y):
            api.append(item)
        else:
            ctx.abi_twins.setdefault(item.rel, []).append((item.name, twin))
    return api


def _abi_twins(ctx: Context, wanted: list[str]) -> dict[str, str]:
    """name -> an exported torch name it equals but for the ABI's spelling (c++filt)."""
    if not wanted:
        return {}
    exports = sorted(_torch_exports(ctx))
    candidates: dict[str, list[str]] = {}
    for name in wanted:
        prefix = name[: _ABI_DEPENDENT.search(name).start()]  # spelt alike by both ABIs
        start = bisect.bisect_left(exports, prefix)
        near = exports[start : start + MAX_TWIN_CANDIDATES]
        is_new = "cxx11" in name
        candidates[name] = [e for e in near if e.startswith(prefix) and ("cxx11" in e) != is_new]
    shown = demangle(sorted(set(wanted) | {c for cs in candidates.values() for c in cs}))
    out = {}
    for name, cands in candidates.items():
        key = _abi_neutral(shown[name]) if name in shown else None
        twin = next((c for c in cands if c in shown and _abi_neutral(shown[c]) == key), None)
        if twin is not None:
            out[name] = twin
    return out


def demangle(names: list[str]) -> dict[str, str]:
    """Demangle C++ names with c++filt when it is installed (one process for all)."""
    if not names:
        return {}
    tool = shutil.which("c++filt")
    if tool is None:
        return {}
    try:
        out = subprocess.run(
            [tool], input="\n".join(names), capture_output=True, text=True, timeout=30, check=False
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(zip(names, out, strict=True)) if len(out) == len(names) else {}


def check_cxx11(ctx: Context, extensions: dict[str, FileReport]) -> None:
    """An object built with the other _GLIBCXX_USE_CXX11_ABI than torch: by the undefined
    torch names torch exports with the other mangling (_split_abi_flag), else by the std::string
    spellings in its dynamic string table; the names as evidence."""
    for rel, rep in extensions.items():
        twins = ctx.abi_twins.get(rel, [])
        if twins:  # torch's mangling of the first name says which ABI torch uses
            y = 1 if "cxx11" in twins[0][1] else 0
            x = 1 - y
        elif not _other_abi(ctx, rep):
            continue
        else:
            x, y = rep.elf.cxx11_abi, ctx.torch.cxx11_abi
        shown = demangle([n for pair in twins for n in pair])
        ctx.emit(
            "cxx11-abi",
            rep.origin,
            evidence=tuple(
                f"{n}: undefined ({shown.get(n, n)}); torch exports {t}" for n, t in sorted(twins)
            ),
            x=x,
            y=y,
            example=shown.get(twins[0][0], twins[0][0]) if twins else "std::string overloads",
        )


def _other_abi(ctx: Context, rep: FileReport) -> bool:
    """A torch-linked object whose std::string spellings say another ABI than libc10's."""
    x, y = (rep.elf.cxx11_abi if rep.elf else None), ctx.torch.cxx11_abi
    if x is None or y is None or x == y:
        return False
    return any(n in TORCH_SONAMES for n in rep.elf.needed)


_VERSION = re.compile(r"^([A-Z]+)_(\d+(?:\.\d+)*)$")


def _vtuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def check_symbol_versions(ctx: Context) -> None:
    """Versioned references: against the verdefs of the library the loader picks in the tree,
    or, for the target host's libraries, against the versions the profile says it provides."""
    seen = set()
    host = {k: _vtuple(v) for k, v in ctx.profile.host_versions.items()}
    for cl in ctx.closures.values():
        by_soname = {}
        for obj in cl.objects:
            if obj.report.elf and obj.report.elf.soname:
                by_soname[obj.report.elf.soname] = obj
        for obj in cl.objects:
            elf = obj.report.elf
            if elf is None:
                continue
            for lib, versions in elf.verneed.items():
                target = by_soname.get(lib)
                if target is None or target.report.elf is None or not target.report.elf.verdef:
                    continue
                provided = set(target.report.elf.verdef)
                for v in versions:
                    if v not in provided and (lib, v, elf.path) not in seen:
                        seen.add((lib, v, elf.path))
                        ctx.emit("symbol-version", elf.path, lib=lib, v=v, so=elf.path)
    # Every object, loaded by an extension or not: what it needs from the host's runtime.
    if host:
        for _rel, rep in sorted(ctx.reports.items()):
            elf = rep.elf
            if elf is None:
                continue
            for lib, versions in sorted(elf.verneed.items()):
                if not ctx.profile.host_provides(lib) or lib in _tree_sonames(ctx):
                    continue
                for v in versions:
                    m = _VERSION.match(v)
                    if not m or m.group(1) not in host or (lib, v, elf.path) in seen:
                        continue
                    if _vtuple(m.group(2)) > host[m.group(1)]:
                        seen.add((lib, v, elf.path))
                        sym = elf.example(lib, v)
                        ctx.emit(
                            "host-version",
                            rep.origin,
                            lib=lib,
                            v=v,
                            so=os.path.basename(rep.relpath),
                            sym=f" ({sym})" if sym else "",
                            family=m.group(1),
                            have=ctx.profile.host_versions[m.group(1)],
                        )
    _check_glibc_tags(ctx)


def _tree_sonames(ctx: Context) -> set[str]:
    names = ctx.__dict__.get("_tree_sonames")
    if names is None:
        names = {rep.elf.soname for rep in ctx.reports.values() if rep.elf and rep.elf.soname}
        ctx.__dict__["_tree_sonames"] = names
    return names


def _check_glibc_tags(ctx: Context) -> None:
    """A wheel's manylinux tag against the newest GLIBC_ version any of its objects needs,
    from any library (libc, libm, libpthread, ld-linux ...)."""
    for dist in ctx.tree.dists.values():
        if not dist.wheel:
            continue
        tags = [tuple(map(int, m)) for m in re.findall(r"manylinux_(\d+)_(\d+)", dist.wheel)]
        if "manylinux2014" in dist.wheel:
            tags.append((2, 17))
        if "manylinux2010" in dist.wheel:
            tags.append((2, 12))
        if "manylinux1" in dist.wheel:
            tags.append((2, 5))
        if not tags:
            continue
        tag = max(tags)
        need: tuple[int, ...] = (0, 0)
        evidence: list[str] = []
        for rep in ctx.reports.values():
            if not (rep.elf and rep.origin.startswith(dist.wheel + "!")):
                continue
            for lib, versions in rep.elf.verneed.items():
                for v in versions:
                    m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", v)
                    if not m:
                        continue
                    have = (int(m.group(1)), int(m.group(2)))
                    if have > tag:
                        sym = rep.elf.example(lib, v)
                        evidence.append(
                            f"{rep.relpath}: {v} from {lib}" + (f" ({sym})" if sym else "")
                        )
                    need = max(need, have)
        if need > tag:
            ctx.emit(
                "wheel-glibc-tag",
                dist.wheel,
                evidence=tuple(sorted(set(evidence))),
                tag=f"manylinux_{tag[0]}_{tag[1]}",
                x=f"{need[0]}.{need[1]}",
            )


def check_one_runtime(ctx: Context) -> None:
    preload = [o for o in (ctx.loader.preloaded.values() if ctx.loader else [])]
    for cl in ctx.closures.values():
        families: dict[str, dict[str, Loaded]] = defaultdict(dict)
        for obj in list(cl.objects) + preload:
            name = (obj.report.elf.soname if obj.report.elf else None) or posixpath.basename(
                obj.key
            )
            m = ONE_RUNTIME.match(name)
            if m:
                families[m.group(1)][name] = obj
        for names in families.values():
            if len(names) > 1:
                (a, oa), (b, ob) = sorted(names.items())[:2]
                ctx.emit(
                    "one-runtime",
                    cl.objects[0].report.origin,
                    a=a,
                    b=b,
                    so_a=oa.report.origin,
                    so_b=ob.report.origin,
                )
                break


# ---------------------------------------------------------------- checks 12-17: running


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
    max_isa = None
    if ctx.driver and ctx.driver.cuda:
        isas = [isa for isa, cuda in PTX_ISA_TO_CUDA.items() if cuda <= ctx.driver.cuda]
        max_isa = max(isas) if isas else None
    for cc in ctx.targets:
        # PTX-only objects of one package: one note-like warning, the objects as evidence
        jits: dict[tuple, list[str]] = defaultdict(list)
        for rel, kind in sorted(coverage_subjects(ctx, cc).items()):
            rep = ctx.reports[rel]
            lacking = [f for f in rep.kernel_fatbins if coverage(f, cc).verdict == "none"]
            undecided = [f for f in lacking if f.has_kernels is None]
            if undecided:
                _open_undecided(ctx, rel, rep, undecided)
            kernel_fats = rep.kernel_fatbins
            if not kernel_fats:
                continue
            covs = [coverage(f, cc) for f in kernel_fats]
            none = sum(c.verdict == "none" for c in covs)
            archs = sorted({a for f in kernel_fats for a in f.archs}, key=_arch_key)
            if none:
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
                continue
            jit = [c for c in covs if c.verdict == "jit"]
            if jit:
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
    optional = [p.replace("{common_ops}", "*") for p in ctx.profile.optional]
    # fnmatch.fnmatch over posix paths, every pattern in one expression
    is_optional = (
        re.compile("|".join(fnmatch.translate(p) for p in optional)).match if optional else None
    )
    verdicts: dict[tuple, bool] = {}

    def lacks(rep: FileReport, cc: CC) -> bool:
        fats = rep.kernel_fatbins
        key = (cc, tuple(frozenset((e.kind, e.arch, e.variant) for e in f.entries) for f in fats))
        got = verdicts.get(key)
        if got is None:
            got = verdicts[key] = bool(fats) and all(
                coverage(f, cc).verdict == "none" for f in fats
            )
        return got

    for label, files in sorted(groups.items()):
        by_arch: dict[str, int] = defaultdict(int)
        for _, rep in files:
            for f in rep.fatbins:
                for a in f.archs:
                    by_arch[a] += 1
        archs = sorted(by_arch, key=_arch_key)
        for cc in ctx.targets:
            lacking = [rel for rel, rep in files if lacks(rep, cc)]
            if not lacking:
                continue
            kind = (
                "optional"
                if is_optional is not None and all(is_optional(rel) for rel in lacking)
                else "required"
            )
            ctx.emit(
                "device-files-optional" if kind == "optional" else "device-files",
                label,
                evidence=tuple(
                    [f"{a}: {by_arch[a]} file(s)" for a in archs]
                    + [f"no image for sm_{cc.sm}: {r}" for r in lacking[:5]]
                    + ([f"... and {len(lacking) - 5} more"] if len(lacking) > 5 else [])
                ),
                k=len(lacking),
                n=len(files),
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


# ---------------------------------------------------------------- checks 18-20: JIT stack


def check_flashinfer(ctx: Context) -> None:
    dists = ctx.tree.dists
    fi = dists.get("flashinfer-python")
    if fi is None:
        return
    cubin = dists.get("flashinfer-cubin")
    if cubin and cubin.version != fi.version:
        ctx.emit(
            "flashinfer-cubin", cubin.wheel or "flashinfer_cubin", x=cubin.version, y=fi.version
        )
    jit = dists.get("flashinfer-jit-cache")
    cuda = ctx.torch.cuda or ctx.profile.torch_cuda
    want = "cu" + cuda.replace(".", "")
    if jit:
        local = jit.version.split("+", 1)[1] if "+" in jit.version else ""
        if not jit.version.startswith(fi.version) or local != want:
            ctx.emit(
                "flashinfer-jit-cache",
                jit.wheel or "flashinfer_jit_cache",
                v=jit.version,
                cu=local or "an unknown CUDA",
                want=want,
                y=fi.version,
            )


def nvcc_version(environ: dict[str, str]) -> tuple[str | None, str | None]:
    """(version, CUDA_HOME) of the nvcc FlashInfer's JIT would use."""
    home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    if not home:
        nvcc = shutil.which("nvcc", path=environ.get("PATH"))
        home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None
    if not home:
        return None, None
    try:
        with open(os.path.join(home, "version.json"), encoding="utf-8") as fh:
            return json.load(fh)["cuda"]["version"], home
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        out = subprocess.run(
            [os.path.join(home, "bin", "nvcc"), "--version"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, home
    m = re.search(r"release (\d+\.\d+)", out)
    return (m.group(1) if m else None), home


def check_jit_toolchain(ctx: Context) -> None:
    if ctx.tree.kind != "env" or "flashinfer-python" not in ctx.tree.dists:
        return
    version, home = nvcc_version(ctx.environ)
    major = ctx.torch.major or ctx.profile.cuda_major
    if version and int(version.split(".")[0]) != major:
        ctx.emit("jit-nvcc", "flashinfer", x=version, p=home, y=major)
    arch_list = ctx.environ.get("FLASHINFER_CUDA_ARCH_LIST")
    if arch_list is None:
        return
    have = arch_list.replace(",", " ").split()
    for arch in ctx.profile.jit_arch:
        base = CC.parse(arch.rstrip("af"))
        if base in ctx.targets and arch not in have and arch.rstrip("a") + "f" not in have:
            ctx.emit("jit-arch-list", "FLASHINFER_CUDA_ARCH_LIST", arch=arch, sm=base.sm)


def check_cuda_python(ctx: Context) -> None:
    sglang = ctx.tree.dists.get("sglang")
    major = ctx.torch.major or ctx.profile.cuda_major
    if sglang is None or major < 13:
        return
    for text in sglang.requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name.lower() != "cuda-python" or (req.marker and "extra" in str(req.marker)):
            continue
        for spec in req.specifier:
            if spec.operator in ("==", "~=", "<=") and spec.version.split(".")[0] == "12":
                ctx.emit("cuda-python", sglang.wheel or "sglang", pin=f"cuda-python{spec}")
                return


# ---------------------------------------------------------------- driver


def check_malformed(ctx: Context) -> None:
    for wheel, reason in ctx.tree.invalid:
        ctx.emit("invalid-archive", wheel, reason=reason)
    for rel, rep in sorted(ctx.reports.items()):
        if rep.error:
            if rep.error.startswith("invalid archive"):
                ctx.emit("invalid-archive", rep.origin, reason=rep.error)
            elif (
                "wrong magic" not in rep.error
                or rep.kind != "elf"
                or _top(rel) == "torch"
                or any(fnmatch.fnmatch(_top(rel), p) for p in ctx.profile.extension_packages)
            ):
                ctx.emit("malformed-elf", rep.origin, reason=rep.error)
        elif rep.fatbin_error:
            ctx.emit("malformed-fatbin", rep.origin, reason=rep.fatbin_error)


def check_nothing(ctx: Context) -> None:
    if not ctx.reports:
        ctx.emit(
            "nothing-checked",
            ctx.tree.root if ctx.tree.kind == "env" else "wheelhouse",
            n=len(ctx.tree.dists),
        )


def run_checks(ctx: Context) -> list[Finding]:
    """Run every check over ``ctx`` and return the findings, errors first."""
    read_torch(ctx)
    load_profile_torch(ctx)
    check_nothing(ctx)
    check_malformed(ctx)
    check_torch_variant(ctx)
    check_torch_dist(ctx)
    check_torch_pins(ctx)
    check_cuda_wheels(ctx)
    check_sgl_kernel(ctx)
    check_wheel_filenames(ctx)
    extensions = extension_reports(ctx)
    check_cuda_major(ctx, extensions)
    build_loader(ctx)
    check_needed(ctx, extensions)
    check_symbols(ctx, extensions)
    check_cxx11(ctx, extensions)
    check_symbol_versions(ctx)
    check_one_runtime(ctx)
    check_loader_hardcode(ctx)
    check_driver(ctx)
    check_coverage(ctx)
    check_device_files(ctx)
    check_device_toolkit(ctx, extensions)
    check_torch_archs(ctx)
    check_flashinfer(ctx)
    check_jit_toolchain(ctx)
    check_cuda_python(ctx)
    order = {"error": 0, "warning": 1, "note": 2}
    return sorted(ctx.findings, key=lambda f: (order.get(f.severity, 3), f.number, f.file))
