"""What the verify checks read: the Context (the tree, the profile, the loader, the facts
gathered before any check runs), the Finding records they emit, the installed torch's facts
and the driver's."""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field

from packaging.version import InvalidVersion, Version

from patchkit.abi.archs import CC
from patchkit.abi.cache import ResultCache
from patchkit.abi.loader import Closure, Loader, read_ld_cache
from patchkit.abi.profiles import CheckSpec, Profile, ProfileChoice, load_catalogue
from patchkit.abi.scan import FileReport
from patchkit.abi.sources import Tree
from patchkit.archives import read_regular

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


# torch's stable C interface: the AOTInductor shim (torch/csrc/inductor/aoti_torch/c/shim.h)
# and the stable ABI's own (torch/csrc/stable/c/shim.h), plain C names exported by
# libtorch_cpu.so and libtorch_cuda.so. An extension built against the stable ABI imports
# these instead of mangled C++ names; it runs on the torch it was built for and later ones.
TORCH_SHIM_PREFIXES = ("aoti_torch_", "torch_")


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
        text = read_regular(proc, 1 << 16).decode("utf-8", "replace")
        m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
        if m:
            return DriverInfo(m.group(1), proc)
    except (OSError, ValueError):
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
    choice: ProfileChoice | None = None  # how the profile was chosen (profiles.choose_profile)
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
