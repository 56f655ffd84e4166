"""Build profiles (`build/profiles/NAME.toml`): what a wheel build reads from them.

The profiles are shared with `verify`; a build needs only the CUDA variant label that goes into
the wheel's local version (`cu130`).  It is `[build] variant` when a profile sets it, else the
local label of `[torch] version` (`2.9.1+cu130` -> `cu130`), else `cu<[cuda] major>0`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from patchkit.compat import tomllib
from patchkit.errors import ConfigError, UsageError

DEFAULT_PROFILE = "cu130-sm120"
VARIANT_RE = re.compile(r"^[a-z0-9]+\Z")


@dataclass(frozen=True)
class BuildProfile:
    """The parts of a profile a build records and uses."""

    name: str
    path: Path
    sha256: str
    variant: str
    variant_source: str  # which key the variant came from

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "file": f"build/profiles/{self.path.name}",
            "sha256": self.sha256,
            "variant": self.variant,
        }


def load_build_profile(profiles_dir: Path, name: str) -> BuildProfile:
    """Read `profiles_dir/NAME.toml` and derive the variant label."""
    path = profiles_dir / f"{name}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in profiles_dir.glob("*.toml")) if profiles_dir.is_dir() else []
        raise UsageError(
            f"no build profile '{name}' in {profiles_dir} (known: {', '.join(known) or 'none'})"
        )
    raw = path.read_bytes()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    variant, source = _variant(data)
    if variant is None:
        raise ConfigError(
            f"{path}: cannot tell the CUDA variant label",
            hint='add [build] variant = "cu130" (or a [torch] version with a local label)',
        )
    if not VARIANT_RE.match(variant):
        raise ConfigError(
            f"{path}: variant '{variant}' ({source}) is not a lowercase "
            "alphanumeric local-version segment"
        )
    return BuildProfile(name, path, hashlib.sha256(raw).hexdigest(), variant, source)


def _variant(data: dict) -> tuple[str | None, str]:
    explicit = data.get("build", {}).get("variant")
    if explicit:
        return str(explicit), "[build] variant"
    torch_version = str(data.get("torch", {}).get("version", ""))
    if "+" in torch_version:
        return torch_version.split("+", 1)[1], "[torch] version"
    major = data.get("cuda", {}).get("major")
    if major is not None:
        return f"cu{int(major)}0", "[cuda] major"
    return None, ""
