"""Verify profiles (``build/profiles/<name>.toml``) and the check catalogue (``checks.toml``)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from patchkit.abi.archs import CC

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROFILE_DIR = os.path.join(PROJECT_ROOT, "build", "profiles")
DEFAULT_PROFILE = "cu130-sm120"
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
    path: str = ""


def available(directory: str = PROFILE_DIR) -> list[str]:
    """Profile names in ``directory``."""
    try:
        return sorted(f[:-5] for f in os.listdir(directory) if f.endswith(".toml"))
    except OSError:
        return []


def load_profile(name_or_path: str | None = None, directory: str = PROFILE_DIR) -> Profile:
    """Load a profile by name (from ``build/profiles``) or by path to a TOML file."""
    name_or_path = name_or_path or DEFAULT_PROFILE
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        path = name_or_path
    else:
        path = os.path.join(directory, f"{name_or_path}.toml")
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        names = ", ".join(available(directory)) or "none"
        raise ProfileError(f"no profile {name_or_path!r} (available: {names})") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ProfileError(f"cannot read profile {path}: {exc}") from None
    try:
        return _build(data, path)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"profile {path} is incomplete: {exc}") from None


def _build(data: dict[str, Any], path: str) -> Profile:
    torch = data["torch"]
    cuda = data["cuda"]
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
