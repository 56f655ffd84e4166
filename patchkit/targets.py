"""targets.toml: the pinned upstreams, their releases and how refs resolve to them."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from patchkit.errors import ConfigError, UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

HEX_RE = re.compile(r"^[0-9a-f]{4,40}$")
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Release:
    """One pinned upstream release: its tag, commit and (optionally) its sdist on the index."""

    version: str
    commit: str | None  # None: the release's sdist records no upstream commit (sha256 only)
    tag: str | None = None
    sdist: str | None = None  # requirement, e.g. "sglang==0.5.9"
    sdist_sha256: str | None = None

    @property
    def sdist_name(self) -> str | None:
        return self.sdist.split("==", 1)[0].strip() if self.sdist else None


@dataclass(frozen=True)
class Target:
    """An upstream the series patches."""

    name: str
    git: str
    subdir: str
    pin: str
    releases: tuple[Release, ...]
    commit_id_file: str | None = None

    @property
    def pinned(self) -> Release:
        for release in self.releases:
            if release.version == self.pin:
                return release
        raise ConfigError(f"targets.toml: [{self.name}] pin {self.pin} has no [[releases]] entry")

    def release(self, version_or_tag: str) -> Release | None:
        for release in self.releases:
            if version_or_tag in (release.version, release.tag):
                return release
        try:
            wanted = Version(version_or_tag.removeprefix("v"))
        except InvalidVersion:
            return None
        for release in self.releases:
            try:
                if Version(release.version) == wanted:
                    return release
            except InvalidVersion:
                continue
        return None


@dataclass(frozen=True)
class Targets:
    """The whole targets.toml."""

    series_version: str
    targets: dict[str, Target] = field(default_factory=dict)
    path: Path | None = None

    def get(self, name: str) -> Target:
        try:
            return self.targets[name]
        except KeyError:
            known = ", ".join(sorted(self.targets)) or "none"
            raise UsageError(f"unknown target '{name}' (known: {known})") from None


@dataclass(frozen=True)
class RefSpec:
    """`sglang@v0.5.9` split into its parts."""

    target: str
    ref: str | None


def parse_target_spec(spec: str) -> RefSpec:
    """Split `name@ref` (ref optional: the pin)."""
    name, sep, ref = spec.partition("@")
    if not name or (sep and not ref):
        raise UsageError(f"bad --target '{spec}': expected NAME or NAME@REF (e.g. sglang@v0.5.9)")
    return RefSpec(name.strip(), ref.strip() if ref else None)


def load_targets(path: Path) -> Targets:
    """Parse and validate targets.toml."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    version = str(data.get("series", {}).get("version", ""))
    try:
        Version(version)
    except InvalidVersion:
        raise ConfigError(f"{path}: [series] version '{version}' is not a version") from None
    targets: dict[str, Target] = {}
    for name, table in data.get("targets", {}).items():
        targets[name] = _load_target(path, name, table)
    return Targets(series_version=version, targets=targets, path=path)


def _load_target(path: Path, name: str, table: dict) -> Target:
    releases = []
    for entry in table.get("releases", []):
        commit = str(entry["commit"]).lower() if "commit" in entry else None
        if commit is not None and not SHA_RE.match(commit):
            raise ConfigError(
                f"{path}: [{name}] release {entry.get('version')}: bad commit '{commit}'"
            )
        sha256 = entry.get("sdist_sha256")
        if commit is None and not sha256:
            raise ConfigError(
                f"{path}: [{name}] release {entry.get('version')}: "
                "needs a commit or an sdist_sha256"
            )
        if sha256 is not None and not SHA256_RE.match(str(sha256)):
            raise ConfigError(f"{path}: [{name}] release {entry.get('version')}: bad sdist_sha256")
        releases.append(
            Release(
                version=str(entry.get("version", "")),
                commit=commit,
                tag=entry.get("tag"),
                sdist=entry.get("sdist"),
                sdist_sha256=sha256,
            )
        )
    for key in ("git", "pin"):
        if key not in table:
            raise ConfigError(f"{path}: [targets.{name}] lacks '{key}'")
    subdir = str(table.get("subdir", "")).strip("/")
    if subdir.startswith(".") or ".." in subdir.split("/"):
        raise ConfigError(
            f"{path}: [targets.{name}] subdir '{subdir}' must stay inside the repository"
        )
    target = Target(
        name=name,
        git=table["git"],
        subdir=subdir,
        pin=str(table["pin"]),
        releases=tuple(releases),
        commit_id_file=table.get("commit_id_file"),
    )
    target.pinned  # noqa: B018 - validates that the pin names a release
    return target


def bump_version(version: str, part: str = "minor") -> str:
    """Semver bump of the series version."""
    v = Version(version)
    major, minor, micro = (list(v.release) + [0, 0, 0])[:3]
    if part == "major":
        return f"{major + 1}.0.0"
    if part == "minor":
        return f"{major}.{minor + 1}.0"
    return f"{major}.{minor}.{micro + 1}"
