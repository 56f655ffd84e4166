"""targets.toml: the pinned upstreams, their releases, their series lines and how refs resolve.

A target carries one or more *lines*: each line is its own series (a folder under patches/)
against its own pinned release, e.g. `sglang/0.5.9` and `sglang/0.5.12`.  A target written
without `lines` has one line, named after its `pin`, whose series is `patches/<target>/`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.version import InvalidVersion, Version

from patchkit.compat import tomllib
from patchkit.errors import ConfigError, UsageError, closest, did_you_mean

HEX_RE = re.compile(r"^[0-9a-f]{4,40}\Z")
SHA_RE = re.compile(r"^[0-9a-f]{40}\Z")
SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
# Target and line names become file and directory names in the cache and under patches/.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}\Z")
TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+-]{0,127}\Z")
REQUIREMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*\Z")


@dataclass(frozen=True)
class WheelPin:
    """One pinned wheel of a release: its file name on the index and its sha256."""

    filename: str
    sha256: str

    @property
    def tags(self) -> tuple[str, str, str]:
        """(python tag, abi tag, platform tag) of the file name, e.g. cp312, cp312, manylinux."""
        parts = self.filename[: -len(".whl")].split("-")
        return parts[-3], parts[-2], parts[-1]

    @property
    def python_tag(self) -> str:
        return self.tags[0]

    @property
    def platform_tag(self) -> str:
        return self.tags[2]

    @property
    def distribution(self) -> str:
        from packaging.utils import parse_wheel_filename

        return str(parse_wheel_filename(self.filename)[0])

    def to_json(self) -> dict:
        return {"file": self.filename, "sha256": self.sha256}


@dataclass(frozen=True)
class Release:
    """One pinned upstream release: its tag, commit, sdist and/or pinned wheels on the index."""

    version: str
    commit: str | None  # None: no upstream commit is known (sha256 only)
    tag: str | None = None
    sdist: str | None = None  # requirement, e.g. "sglang==0.5.9"
    sdist_sha256: str | None = None
    wheels: tuple[WheelPin, ...] = ()

    @property
    def sdist_name(self) -> str | None:
        return self.sdist.split("==", 1)[0].strip() if self.sdist else None

    @property
    def base_wheel(self) -> WheelPin | None:
        """The wheel whose files stand for the release's source tree (the first listed)."""
        return self.wheels[0] if self.wheels else None


@dataclass(frozen=True)
class Line:
    """One series line of a target: a series folder against one pinned release."""

    name: str
    pin: str
    series: str  # folder relative to patches/
    # The lines of other targets built with this one (`with = { flashinfer = "0.6.15.post1" }`).
    companions: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RetiredLine:
    """A line no longer carried: where its users go, and the commit its series was last at."""

    name: str
    pin: str
    successor: str
    why: str
    last_commit: str


@dataclass(frozen=True)
class Target:
    """An upstream the series patches, seen through one of its lines (`line`, `pin`)."""

    name: str
    git: str
    subdir: str
    pin: str  # the pin of the line this view is of
    releases: tuple[Release, ...]
    commit_id_file: str | None = None
    lines: tuple[Line, ...] = ()
    line: str = ""  # the line this view is of ("" for a target built by hand: its pin)
    default_line: str = ""
    retired: tuple[RetiredLine, ...] = ()

    @property
    def pinned(self) -> Release:
        for release in self.releases:
            if release.version == self.pin:
                return release
        raise ConfigError(f"targets.toml: [{self.name}] pin {self.pin} has no [[releases]] entry")

    @property
    def current_line(self) -> Line:
        for line in self.lines:
            if line.name == self.line:
                return line
        return Line(self.line or self.pin, self.pin, self.name)

    @property
    def line_names(self) -> list[str]:
        return [line.name for line in self.lines]

    def on_line(self, name: str | None) -> Target:
        """This target seen through line `name` (None: the default line)."""
        wanted = name or self.default_line or self.line
        for line in self.lines:
            if line.name == wanted:
                return dataclasses.replace(self, pin=line.pin, line=line.name)
        for old in self.retired:
            if old.name == wanted:
                # One line, so that a script reading the first line has it all
                raise UsageError(
                    f"{self.name} line {wanted} is retired: {old.why}; use --line "
                    f"{old.successor} (the {wanted} series is in git: "
                    f"`git show {old.last_commit[:12]}:patches/{self.name}/{wanted}/series`)"
                )
        known = ", ".join(self.line_names) or "none"
        raise UsageError(
            f"{self.name} has no line {wanted!r} (lines: {known})"
            + did_you_mean(wanted, self.line_names)
        )

    def companion(self, line: str, target: str) -> str | None:
        """The line of `target` that this target's line `line` is built with, if any."""
        for own in self.lines:
            if own.name == line:
                return dict(own.companions).get(target)
        return None

    def line_for_release(self, release: Release) -> Line | None:
        """The line whose pin is `release` (the default line first when several are)."""
        ordered = sorted(self.lines, key=lambda ln: ln.name != self.default_line)
        for line in ordered:
            if line.pin == release.version:
                return line
        return None

    @property
    def refs(self) -> list[str]:
        """The refs naming a pinned release: each release's version and tag."""
        return [ref for r in self.releases for ref in (r.version, r.tag) if ref]

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

    def get(self, name: str, line: str | None = None) -> Target:
        """The target `name` seen through `line` (None: its default line)."""
        try:
            target = self.targets[name]
        except KeyError:
            known = ", ".join(sorted(self.targets)) or "none"
            raise UsageError(
                f"unknown target {name!r} (known: {known})" + did_you_mean(name, self.targets)
            ) from None
        return target.on_line(line) if line else target


@dataclass(frozen=True)
class RefSpec:
    """`sglang@v0.5.9` split into its parts."""

    target: str
    ref: str | None


def parse_target_spec(spec: str) -> RefSpec:
    """Split `name@ref` (ref optional: the pin)."""
    name, sep, ref = spec.partition("@")
    if not name or (sep and not ref):
        raise UsageError(f"bad --target {spec!r}: expected NAME or NAME@REF (e.g. sglang@v0.5.9)")
    return RefSpec(name.strip(), ref.strip() if ref else None)


def load_targets(path: Path) -> Targets:
    """Parse and validate targets.toml; every error is one line naming the file and the key."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    series = data.get("series", {})
    if not isinstance(series, dict):
        raise ConfigError(f"{path}: [series] must be a table")
    version = _str(path, "series", series, "version") or ""
    try:
        Version(version)
    except InvalidVersion:
        raise ConfigError(f"{path}: [series] version {version!r} is not a version") from None
    tables = data.get("targets", {})
    if not isinstance(tables, dict):
        raise ConfigError(f"{path}: 'targets' must be a table of [targets.NAME] tables")
    targets: dict[str, Target] = {}
    for name, table in tables.items():
        if not NAME_RE.match(name):
            raise ConfigError(
                f"{path}: target name {name!r} must be letters, digits and . _ + - "
                "(it names files in the cache)"
            )
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: targets.{name} must be a table")
        targets[name] = _load_target(path, name, table)
    for target in targets.values():
        for line in target.lines:
            for other, other_line in line.companions:
                if other not in targets or other_line not in targets[other].line_names:
                    raise ConfigError(
                        f'{path}: [targets.{target.name}.lines."{line.name}"] with names '
                        f"{other} line {other_line!r}, which is not a carried line"
                    )
    return Targets(series_version=version, targets=targets, path=path)


# The keys each table of targets.toml may hold; `unknown_keys` names any other (a typo such
# as `defualt_line` would otherwise be read as absent and change nothing but the outcome).
KNOWN_KEYS = {
    "top": ("series", "targets"),
    "series": ("version",),
    "target": ("git", "subdir", "commit_id_file", "default_line", "pin", "lines", "releases"),
    "line": ("pin", "series", "with", "retired", "why", "last_commit"),
    "release": ("version", "tag", "commit", "sdist", "sdist_sha256", "wheels"),
}


@dataclass(frozen=True)
class UnknownKey:
    """A key targets.toml holds that patchkit does not read, and the known key nearest it."""

    table: str  # e.g. `targets.sglang.lines."0.5.9"`
    key: str
    nearest: str | None  # a known key close enough to be what was meant
    known: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        if self.nearest:
            near = f"did you mean {self.nearest!r}?"
        else:
            near = f"the table's keys are {', '.join(self.known)}"
        return f"[{self.table}] has the unknown key {self.key!r}, which is ignored; {near}"


def unknown_keys(data: dict) -> list[UnknownKey]:
    """Every key of a parsed targets.toml outside `KNOWN_KEYS`, table by table."""
    found: list[UnknownKey] = []

    def check(table: object, kind: str, where: str) -> None:
        if not isinstance(table, dict):
            return
        known = KNOWN_KEYS[kind]
        for key in table:
            if key not in known:
                # a short key's typo (`tga`) is further from it by ratio than a long one's
                found.append(UnknownKey(where, key, closest(key, known, cutoff=0.6), known))

    check(data, "top", "top level")
    check(data.get("series"), "series", "series")
    targets = data.get("targets")
    for name, table in targets.items() if isinstance(targets, dict) else ():
        check(table, "target", f"targets.{name}")
        if not isinstance(table, dict):
            continue
        lines = table.get("lines")
        for line, entry in lines.items() if isinstance(lines, dict) else ():
            check(entry, "line", f'targets.{name}.lines."{line}"')
        releases = table.get("releases")
        for i, entry in enumerate(releases if isinstance(releases, list) else ()):
            version = entry.get("version", f"#{i + 1}") if isinstance(entry, dict) else ""
            check(entry, "release", f"targets.{name}.releases {version}")
    return found


def _str(path: Path, where: str, table: dict, key: str, *, required: bool = False) -> str | None:
    value = table.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{path}: [{where}] lacks {key!r}")
        return None
    if not isinstance(value, str):
        raise ConfigError(
            f"{path}: [{where}] {key} must be a string, not {type(value).__name__} ({value!r})"
        )
    return value


def _load_release(path: Path, name: str, entry: object, index: int) -> Release:
    where = f"targets.{name}.releases #{index + 1}"
    if not isinstance(entry, dict):
        raise ConfigError(f"{path}: [{where}] must be a table")
    version = _str(path, where, entry, "version", required=True) or ""
    where = f"targets.{name}.releases {version}"
    try:
        Version(version)
    except InvalidVersion:
        raise ConfigError(f"{path}: [{where}] version {version!r} is not a version") from None
    commit = _str(path, where, entry, "commit")
    commit = commit.lower() if commit is not None else None
    if commit is not None and not SHA_RE.match(commit):
        raise ConfigError(f"{path}: [{name}] release {version}: bad commit {commit!r}")
    sdist = _str(path, where, entry, "sdist")
    if sdist is not None and not REQUIREMENT_RE.match(sdist.replace(" ", "")):
        raise ConfigError(f"{path}: [{where}] sdist {sdist!r} is not NAME==VERSION")
    sha256 = _str(path, where, entry, "sdist_sha256")
    if sha256 is not None and not SHA256_RE.match(sha256):
        raise ConfigError(f"{path}: [{name}] release {version}: bad sdist_sha256")
    wheels = _load_wheels(path, where, entry.get("wheels", []), version)
    if commit is None and not sha256 and not wheels:
        raise ConfigError(
            f"{path}: [{name}] release {version}: needs a commit, an sdist_sha256 or pinned wheels"
        )
    tag = _str(path, where, entry, "tag")
    if tag is not None and (not TAG_RE.match(tag) or ".." in tag or tag.endswith((".lock", "/"))):
        raise ConfigError(f"{path}: [{where}] tag {tag!r} is not a plain git tag name")
    return Release(
        version=version,
        commit=commit,
        tag=tag,
        sdist=sdist,
        sdist_sha256=sha256,
        wheels=wheels,
    )


# A wheel file name as the wheel format writes one, name-version[-build]-python-abi-platform
# .whl; a name this does not match (or whose version does not parse) goes to packaging's own
# parser, which accepts or refuses it with its reason (and costs its tags module's import).
_WHEEL_NAME_RE = re.compile(
    r"^(?!.*__)[A-Za-z0-9._]+-([^-]+)(?:-[0-9][^-]*)?-[^-]+-[^-]+-[^-]+\.whl\Z"
)


def wheel_filename_version(filename: str) -> Version:
    """The version a wheel's file name states (ValueError when it is not a wheel's name)."""
    match = _WHEEL_NAME_RE.match(filename)
    if match:
        try:
            return Version(match.group(1))
        except InvalidVersion:
            pass
    from packaging.utils import parse_wheel_filename

    return parse_wheel_filename(filename)[1]


def _load_wheels(path: Path, where: str, value: object, version: str) -> tuple[WheelPin, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{path}: [{where}] wheels must be a list of {{file, sha256}} tables")
    pins: list[WheelPin] = []
    for item in value:
        if not isinstance(item, dict) or set(item) != {"file", "sha256"}:
            raise ConfigError(f"{path}: [{where}] each wheel is {{file = ..., sha256 = ...}}")
        filename, sha256 = item["file"], item["sha256"]
        if not isinstance(filename, str) or not isinstance(sha256, str):
            raise ConfigError(f"{path}: [{where}] wheel file and sha256 must be strings")
        if "/" in filename or "\\" in filename:
            raise ConfigError(f"{path}: [{where}] wheel {filename!r} must be a bare file name")
        try:
            wheel_version = wheel_filename_version(filename)
        except ValueError as exc:  # packaging's InvalidWheelFilename, with its reason
            raise ConfigError(f"{path}: [{where}] {exc}") from None
        if wheel_version != Version(version):
            raise ConfigError(
                f"{path}: [{where}] wheel {filename} is version {wheel_version}, not {version}"
            )
        if not SHA256_RE.match(sha256):
            raise ConfigError(f"{path}: [{where}] wheel {filename}: bad sha256")
        if any(p.filename == filename for p in pins):
            raise ConfigError(f"{path}: [{where}] wheel {filename} is listed twice")
        pins.append(WheelPin(filename, sha256))
    return tuple(pins)


def _load_lines(path: Path, name: str, table: dict) -> tuple[tuple[Line, ...], str]:
    raw = table.get("lines")
    if raw is None:
        pin = _str(path, f"targets.{name}", table, "pin", required=True) or ""
        return (Line(pin, pin, name),), pin
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(
            f'{path}: [targets.{name}] lines must be tables: [targets.{name}.lines."X"]'
        )
    lines = []
    for line_name, entry in raw.items():
        line = _load_line(path, name, line_name, entry)
        if line is not None:
            lines.append(line)
    _check_carried_lines(path, name, lines)
    default = _default_line(path, name, table, lines)
    if "pin" in table:
        raise ConfigError(
            f"{path}: [targets.{name}] has both 'pin' and 'lines': each line has its own pin"
        )
    return tuple(lines), default


def _load_line(path: Path, name: str, line_name: str, entry: object) -> Line | None:
    """One `[targets.T.lines."X"]` table; None for a retired line (see _load_retired)."""
    where = f'targets.{name}.lines."{line_name}"'
    if not NAME_RE.match(line_name):
        raise ConfigError(
            f"{path}: line name {line_name!r} of {name} must be letters, digits and . _ + -"
        )
    if not isinstance(entry, dict):
        raise ConfigError(f"{path}: [{where}] must be a table")
    if "retired" in entry:
        return None
    pin = _str(path, where, entry, "pin", required=True) or ""
    series = _str(path, where, entry, "series") or f"{name}/{line_name}"
    parts = PurePosixPath(series).parts
    if not parts or series.startswith("/") or any(p in (".", "..") for p in parts):
        raise ConfigError(f"{path}: [{where}] series {series!r} must stay inside patches/")
    return Line(line_name, pin, "/".join(parts), _companions(path, where, entry))


def _check_carried_lines(path: Path, name: str, lines: list[Line]) -> None:
    """At least one line is carried, and no two carried lines share a series folder."""
    if not lines:
        raise ConfigError(f"{path}: [targets.{name}] has no line that is not retired")
    folders = [ln.series for ln in lines]
    for folder in folders:
        if folders.count(folder) > 1:
            raise ConfigError(f"{path}: [targets.{name}] two lines share the series {folder}")


def _default_line(path: Path, name: str, table: dict, lines: list[Line]) -> str:
    default = _str(path, f"targets.{name}", table, "default_line") or lines[0].name
    if default not in {ln.name for ln in lines}:
        raise ConfigError(
            f"{path}: [targets.{name}] default_line {default!r} is not one of its lines "
            f"({', '.join(ln.name for ln in lines)})"
        )
    return default


def _companions(path: Path, where: str, entry: dict) -> tuple[tuple[str, str], ...]:
    raw = entry.get("with", {})
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and NAME_RE.match(v) for k, v in raw.items()
    ):
        raise ConfigError(
            f'{path}: [{where}] with must map targets to line names: with = {{ flashinfer = "X" }}'
        )
    return tuple(sorted(raw.items()))


def _load_retired(path: Path, name: str, table: dict, active: set[str]) -> tuple[RetiredLine, ...]:
    """`[targets.T.lines."X"]` tables with `retired = "<successor line>"`, `why` and
    `last_commit` (the commit whose patches/ still holds the line's series)."""
    retired = []
    for line_name, entry in (table.get("lines") or {}).items():
        if not isinstance(entry, dict) or "retired" not in entry:
            continue
        where = f'targets.{name}.lines."{line_name}"'
        successor = _str(path, where, entry, "retired", required=True) or ""
        if successor not in active:
            raise ConfigError(
                f"{path}: [{where}] retired names {successor!r}, not a carried line of {name}"
            )
        why = _str(path, where, entry, "why", required=True) or ""
        last = _str(path, where, entry, "last_commit", required=True) or ""
        if not re.fullmatch(r"[0-9a-f]{40}", last):
            raise ConfigError(f"{path}: [{where}] last_commit must be a full commit id")
        pin = _str(path, where, entry, "pin", required=True) or ""
        retired.append(RetiredLine(line_name, pin, successor, why, last))
    return tuple(retired)


def _load_target(path: Path, name: str, table: dict) -> Target:
    raw_releases = table.get("releases", [])
    if not isinstance(raw_releases, list):
        raise ConfigError(f"{path}: [targets.{name}] releases must be [[targets.{name}.releases]]")
    releases = [_load_release(path, name, entry, i) for i, entry in enumerate(raw_releases)]
    seen: set[Version] = set()
    for release in releases:
        if Version(release.version) in seen:
            raise ConfigError(f"{path}: [targets.{name}] release {release.version} is listed twice")
        seen.add(Version(release.version))
    git = _str(path, f"targets.{name}", table, "git", required=True) or ""
    check_git_source(git, f"{path}: [targets.{name}] git")
    subdir = (_str(path, f"targets.{name}", table, "subdir") or "").strip("/")
    if subdir.startswith(".") or ".." in subdir.split("/") or "\\" in subdir:
        raise ConfigError(
            f"{path}: [targets.{name}] subdir {subdir!r} must stay inside the repository"
        )
    commit_id_file = _str(path, f"targets.{name}", table, "commit_id_file")
    if commit_id_file and (commit_id_file.startswith("/") or ".." in commit_id_file.split("/")):
        raise ConfigError(f"{path}: [targets.{name}] commit_id_file must be a relative path")
    lines, default = _load_lines(path, name, table)
    target = Target(
        name=name,
        git=git,
        subdir=subdir,
        pin="",
        releases=tuple(releases),
        commit_id_file=commit_id_file,
        lines=lines,
        line=default,
        default_line=default,
        retired=_load_retired(path, name, table, {ln.name for ln in lines}),
    )
    for line in lines:
        view = target.on_line(line.name)
        try:
            view.pinned  # noqa: B018 - validates that the pin names a release
        except ConfigError:
            where = f"line {line.name} of {name}" if "lines" in table else f"[{name}]"
            raise ConfigError(
                f"{path}: {where}: pin {line.pin} has no [[releases]] entry"
            ) from None
    return target.on_line(default)


def check_git_source(source: str, where: str) -> None:
    """Refuse a git URL or path that git would read as an option or a command transport."""
    if (
        not source
        or source.startswith("-")
        or any(c.isspace() or ord(c) < 32 for c in source)
        or "::" in source.split("/", 1)[0]  # ext::cmd, fd::... run or reach beyond git
    ):
        raise ConfigError(f"{where} {source!r} is not allowed: not a repository URL or path")


def bump_version(version: str, part: str = "minor") -> str:
    """Semver bump of the series version."""
    v = Version(version)
    major, minor, micro = (list(v.release) + [0, 0, 0])[:3]
    if part == "major":
        return f"{major + 1}.0.0"
    if part == "minor":
        return f"{major}.{minor + 1}.0"
    return f"{major}.{minor}.{micro + 1}"
