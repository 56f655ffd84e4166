"""Verify profiles (``build/profiles/<name>.toml``) and the check catalogue (``checks.toml``).

A profile name is looked up in the project's ``build/profiles/`` first (the checkout patchkit
runs in, or ``$PATCHKIT_PROJECT``), then in the copies shipped inside the package
(``patchkit/abi/profiles/``), so an installed patchkit works anywhere and a project can
override or add profiles.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

from patchkit.abi.archs import CC
from patchkit.archives import read_regular
from patchkit.compat import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGED_DIR = os.path.join(HERE, "profiles")
DEFAULT_PROFILE = "cu130-sm120"
# A profile is read whole, from a regular file of at most this many bytes (`--profile FILE` may
# name anything).
MAX_PROFILE_BYTES = 1 << 20
CATALOGUE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checks.toml")


class ProfileError(Exception):
    """A profile cannot be found or read."""


@dataclass
class Profile:
    """What the stack is expected to be: torch build, CUDA major, targets, pins, coverage sets."""

    name: str
    torch_version: str
    torch_cuda: str
    index_url: str
    cuda_major: int
    min_driver: str
    targets: list[CC]
    pins: dict[str, str] = field(default_factory=dict)
    extension_packages: list[str] = field(default_factory=list)
    required: list[str] = field(default_factory=list)
    optional: list[str] = field(default_factory=list)
    common_ops: dict[str, str] = field(default_factory=dict)
    jit_arch: list[str] = field(default_factory=list)
    severity: dict[str, str] = field(default_factory=dict)
    # What the target host provides besides the checked files (sonames), and its C runtime.
    host_libraries: list[str] = field(default_factory=list)
    host_versions: dict[str, str] = field(default_factory=dict)  # GLIBC -> 2.35, GLIBCXX -> ...
    # Which distribution of the stack ships a library: dist -> soname globs.
    provides: dict[str, list[str]] = field(default_factory=dict)
    torch_symbols: str = ""  # file name of the torch symbol set, next to the profile
    # objects their package loads only where they load (it tries alternatives or goes on
    # without them): a library they miss is a note (`[loading] optional`, globs)
    optional_loads: list[str] = field(default_factory=list)
    path: str = ""

    def provider(self, soname: str) -> str | None:
        """The distribution of the stack that ships ``soname``, if the profile knows one."""
        for dist, globs in self.provides.items():
            if any(fnmatch.fnmatchcase(soname, g) for g in globs):
                return dist
        return None

    def host_provides(self, soname: str) -> bool:
        """True if ``soname`` matches one of the ``[host] libraries`` globs (one regex for all
        of them, compiled on first use: the loader asks thousands of times a run)."""
        pattern = self.__dict__.get("_host_pattern")
        if pattern is None or pattern[0] != self.host_libraries:
            globs = list(self.host_libraries)
            joined = "|".join(f"(?:{fnmatch.translate(g)})" for g in globs) or "(?!)"
            pattern = self.__dict__["_host_pattern"] = (globs, re.compile(joined))
        return pattern[1].match(soname) is not None

    def data_file(self, name: str) -> str:
        """A data file named by the profile: beside it, else among the packaged profiles."""
        for folder in (os.path.dirname(self.path), PACKAGED_DIR):
            candidate = os.path.join(folder, name)
            if os.path.isfile(candidate):
                return candidate
        return os.path.join(os.path.dirname(self.path), name)


def search_dirs() -> list[str]:
    """Where profile names are looked up: the project's build/profiles, then the package's."""
    dirs = []
    try:
        from patchkit.project import find_project

        dirs.append(str(find_project().build_dir / "profiles"))
    except Exception:  # no project here: the packaged profiles only
        pass
    if PACKAGED_DIR not in dirs:
        dirs.append(PACKAGED_DIR)
    return dirs


def available(directories: list[str] | None = None) -> list[str]:
    """Profile names found in ``directories`` (default: search_dirs())."""
    names: set[str] = set()
    for directory in directories if directories is not None else search_dirs():
        try:
            names.update(f[:-5] for f in os.listdir(directory) if f.endswith(".toml"))
        except OSError:
            pass
    return sorted(names)


def find_profile(name: str, directories: list[str] | None = None) -> str | None:
    """The file of profile ``name``: the first search directory that has it."""
    for directory in directories if directories is not None else search_dirs():
        path = os.path.join(directory, f"{name}.toml")
        if os.path.isfile(path):
            return path
    return None


def load_profile(name_or_path: str | None = None, directories: list[str] | None = None) -> Profile:
    """Load a profile by name (project build/profiles, then packaged) or by path to a file."""
    name_or_path = name_or_path or DEFAULT_PROFILE
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        path = name_or_path
    else:
        dirs = directories if directories is not None else search_dirs()
        path = find_profile(name_or_path, dirs)
        if path is None:
            names = ", ".join(available(dirs)) or "none"
            raise ProfileError(f"no profile {name_or_path!r} (available: {names})")
    try:
        data = tomllib.loads(read_regular(path, MAX_PROFILE_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise ProfileError(f"no profile file {path}") from None
    except (OSError, ValueError) as exc:  # TOMLDecodeError, UnicodeDecodeError: ValueErrors
        raise ProfileError(f"cannot read profile {path}: {exc}") from None
    try:
        return _build(data, path)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProfileError(f"profile {path} is incomplete or malformed: {exc}") from None


@dataclass(frozen=True)
class ProfileChoice:
    """Which profile a run uses and why: ``how`` is ``option`` (``--profile``), ``environment``
    (``$PATCHKIT_PROFILE``), ``stack`` (the profile pinning the sglang found), ``torch`` (no
    sglang found: the profile of the one line on the torch found) or ``default``;
    ``stack_profile`` is the profile pinning that sglang, when one does (even if not chosen)."""

    name: str
    how: str
    reason: str
    sglang: str | None = None  # the sglang version found, and where (a wheel, or installed)
    found_in: str | None = None
    stack_profile: str | None = None

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "how": self.how,
            "reason": self.reason,
            "sglang": self.sglang,
            "stack_profile": self.stack_profile,
        }


def choose_profile(
    given: str | Profile | None = None,
    from_environment: str | None = None,
    sglang: list[tuple[str, str]] | None = None,
    gpus: list[CC] | None = None,
    directories: list[str] | None = None,
    torch: list[tuple[str, str]] | None = None,
) -> tuple[Profile, ProfileChoice]:
    """The profile to verify with: ``given`` (``--profile``), else ``from_environment``
    (``$PATCHKIT_PROFILE``), else the profile whose ``[pins] sglang`` is the version found
    (``sglang``: (version, where found) for each version), else, where no sglang is found,
    the line whose profiles' torch is the one found (``torch``, the same way) when exactly
    one line's is, else the default. Of several profiles of the line, the one whose targets
    are ``gpus`` (else the default profile's) wins."""
    dirs = directories if directories is not None else search_dirs()
    # builds of one release (local labels apart: two series hashes in dist/) are one sglang
    one = sglang and len({_public_version(v) for v, _ in sglang}) == 1
    version, found_in = sglang[0] if one else (None, None)
    stack = _stack_profile(version, gpus, dirs) if version else None
    stack_name = stack.name if stack else None
    if given or from_environment:
        how = "option" if given else "environment"
        if isinstance(given, Profile):
            prof = given
        else:
            prof = load_profile(given or from_environment, dirs)
        reason = f"given by {'--profile' if given else '$PATCHKIT_PROFILE'}"
    elif stack is not None:
        prof, how = stack, "stack"
        reason = f"the profile of sglang {version} (found in {found_in})"
    elif not sglang and (by_torch := _torch_profile(torch, gpus, dirs)) is not None:
        prof, how = by_torch, "torch"
        reason = (
            f"the profile of torch {torch[0][0]}'s line, sglang {by_torch.pins['sglang']} "
            f"(no sglang in the checked files; torch found in {torch[0][1]})"
        )
    else:
        prof, how = load_profile(DEFAULT_PROFILE, dirs), "default"
        if version:
            reason = f"the default: no profile pins sglang {version} (found in {found_in})"
        elif sglang:
            found = ", ".join(f"{v} in {where}" for v, where in sglang)
            reason = f"the default: several sglang versions ({found})"
        else:
            reason = "the default: no sglang in the checked files"
    choice = ProfileChoice(prof.name, how, reason, version, found_in, stack_name)
    return prof, choice


def _line_profiles(dirs: list[str]) -> list[Profile]:
    """The profiles that pin an sglang (a line's), broken ones left out (they are reported
    when asked for by name)."""
    out = []
    for name in available(dirs):
        try:
            prof = load_profile(name, dirs)
        except ProfileError:
            continue
        if prof.pins.get("sglang"):
            out.append(prof)
    return out


def _stack_profile(version: str, gpus: list[CC] | None, dirs: list[str]) -> Profile | None:
    """The profile pinning sglang ``version`` (local labels ignored) for ``gpus``, if any."""
    public = _public_version(version)
    matching = [p for p in _line_profiles(dirs) if _public_version(p.pins["sglang"]) == public]
    return _for_gpus(matching, gpus, dirs)


def _torch_profile(
    torch: list[tuple[str, str]] | None, gpus: list[CC] | None, dirs: list[str]
) -> Profile | None:
    """The profile, for ``gpus``, of the one line whose torch is the one torch found (none
    where several torches are found, or several lines share that torch)."""
    if not torch or len(torch) != 1:
        return None
    public = _public_version(torch[0][0])
    matching = [p for p in _line_profiles(dirs) if _public_version(p.torch_version) == public]
    if len({_public_version(p.pins["sglang"]) for p in matching}) != 1:
        return None
    return _for_gpus(matching, gpus, dirs)


def _for_gpus(matching: list[Profile], gpus: list[CC] | None, dirs: list[str]) -> Profile | None:
    """Of one line's profiles, the one whose targets are ``gpus`` (else the default's)."""
    if not matching:
        return None
    wanted = gpus
    if not wanted:
        try:
            wanted = load_profile(DEFAULT_PROFILE, dirs).targets
        except ProfileError:
            wanted = []
    wanted_set = {str(cc) for cc in wanted}
    return min(matching, key=lambda p: ({str(cc) for cc in p.targets} != wanted_set, p.name))


def _public_version(version: str) -> str:
    """``version`` without its local label, normalised (0.5.23+cu130.pk1 -> 0.5.23)."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version.split("+", 1)[0]


def _build(data: dict[str, Any], path: str) -> Profile:
    torch = data["torch"]
    cuda = data["cuda"]
    for key, value in data.get("host", {}).get("versions", {}).items():
        if not isinstance(value, str) or not re.fullmatch(r"\d+(\.\d+)*", value):
            raise ValueError(f"[host.versions] {key} = {value!r} is not a version like 2.35")
    return Profile(
        name=data.get("name", os.path.basename(path)[:-5]),
        torch_version=torch["version"],
        torch_cuda=torch.get("cuda", f"{cuda['major']}.0"),
        index_url=torch.get("index_url", ""),
        cuda_major=int(cuda["major"]),
        min_driver=str(cuda.get("min_driver", "")),
        targets=[CC.parse(t) for t in data.get("targets", {}).get("compute_capabilities", [])],
        pins=dict(data.get("pins", {})),
        extension_packages=list(data.get("extensions", {}).get("packages", [])),
        required=list(data.get("coverage", {}).get("required", [])),
        optional=list(data.get("coverage", {}).get("optional", [])),
        common_ops=dict(data.get("sgl_kernel", {}).get("common_ops", {})),
        jit_arch=list(data.get("flashinfer", {}).get("jit_arch", [])),
        severity=dict(data.get("severity", {})),
        host_libraries=[str(x) for x in data.get("host", {}).get("libraries", [])],
        host_versions={str(k): str(v) for k, v in data.get("host", {}).get("versions", {}).items()},
        provides={str(k): [str(g) for g in v] for k, v in data.get("provides", {}).items()},
        torch_symbols=str(torch.get("symbols", "")),
        optional_loads=[str(g) for g in data.get("loading", {}).get("optional", [])],
        path=path,
    )


@dataclass(frozen=True)
class CheckSpec:
    """One entry of the check catalogue."""

    id: str
    number: int
    severity: str
    message: str
    hint: str


def load_catalogue(path: str = CATALOGUE) -> dict[str, CheckSpec]:
    """The check catalogue: id -> CheckSpec."""
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    return {
        key: CheckSpec(key, int(v["number"]), v["severity"], v["message"], v.get("hint", ""))
        for key, v in data.items()
    }
