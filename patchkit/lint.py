"""Series hygiene: the rules `patchkit lint` checks, as data, and the checks that apply them.

Vocabularies follow DEP-3 (Origin, Forwarded, Applied-Upstream, Bug, Last-Update) with
Yocto's distinction between a missing field and a malformed one.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from patchkit.classify.probes import PROBE_TRAILER, parse_probe
from patchkit.classify.signals import PART_TRAILER, claimed_paths, claimed_version
from patchkit.errors import ApplyError, ConfigError, DamagedBaseError, PatchkitError
from patchkit.series import (
    PATCH_NAME_RE,
    Patch,
    diff_line_paths,
    parse_patch,
    refuse_special_files,
    safe_repo_path,
)
from patchkit.stamps import Stamp, series_key

# rule id -> (severity, what it checks)
RULES: dict[str, tuple[str, str]] = {
    "series-missing": ("error", "a series entry names a file that does not exist"),
    "series-extra": ("error", "a .patch file is not listed in the series"),
    "series-duplicate": ("error", "a series entry is listed twice"),
    "series-name": ("error", "a series entry is not a NAME.patch file name"),
    "series-special": ("error", "a FIFO, device or link out of the project in the series folder"),
    "patch-malformed": ("error", "the file is not a well-formed format-patch mbox"),
    "description-missing": ("error", "no description (message body) explains the patch"),
    "metadata-missing": ("error", "a required field (Origin, Forwarded, Last-Update) is absent"),
    "metadata-malformed": ("error", "a field's value is outside its vocabulary or format"),
    "trailing-whitespace": ("error", "an added line ends in whitespace"),
    "crlf": ("error", "an added line ends in CRLF"),
    "path-escape": ("error", "a diff path leaves the target (absolute, '..', .git/)"),
    "path-outside-subdir": ("warning", "a diff path is outside the target's sdist subdir"),
    "overlap": ("warning", "two patches of the target change the same hunk region"),
    "reexport": ("error", "apply + export does not reproduce the file byte for byte"),
    "reexport-skipped": ("warning", "the re-export check could not run"),
    "base-damaged": ("error", "the pinned base in the mirror is damaged or tampered"),
    "targets-key-typo": ("error", "targets.toml has an unknown key close to a known one"),
    "targets-key-unknown": ("warning", "targets.toml has a key patchkit does not read"),
}
REQUIRED = ("Origin", "Forwarded", "Last-Update")
ORIGIN_RE = re.compile(r"^(upstream|backport|vendor|other)(?:,\s*(\S.*))?$")
FORWARDED_RE = re.compile(r"^(?:https?://\S+|no|not-needed)$")
URL_OR_COMMIT_RE = re.compile(r"^(?:https?://\S+|commit:[0-9a-f]{7,40})$")
DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True)
class Finding:
    rule: str
    target: str
    patch: str | None
    message: str
    line: int | None = None

    @property
    def severity(self) -> str:
        return RULES[self.rule][0]

    def to_json(self) -> dict:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "target": self.target,
            "patch": self.patch,
            "line": self.line,
            "message": self.message,
        }


@dataclass
class LintReport:
    findings: list[Finding] = field(default_factory=list)
    checked: dict[str, list[str]] = field(default_factory=dict)  # target -> patch names

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def to_json(self) -> dict:
        return {
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "checked": self.checked,
            "findings": [f.to_json() for f in self.findings],
        }


# A function that returns the re-exported bytes of a target's series (name -> bytes), or raises.
Reexport = Callable[[str], dict[str, bytes]]


@dataclass(frozen=True)
class RoundTripStamp:
    """The record that building a series on a base and exporting it gave back every patch
    byte for byte, so a later lint of the same inputs need not build it again.

    The key (`stamps.series_key`) covers everything the round trip's result depends on: the
    base commit (its id names its bytes; `acquire` still checks the mirror's objects on every
    run), each patch's name and bytes in series order, the source of the modules that build
    and export the series, the Python version and the git program (path, size, mtime, inode).
    One file per target and base (`<cache>/verified/roundtrip-<target>-<base>`) holds the key
    of the last proven state.
    """

    stamp: Stamp

    @property
    def path(self) -> Path:
        return self.stamp.path

    @property
    def key(self) -> str:
        return self.stamp.key

    @classmethod
    def of(
        cls,
        verified: Path,
        target: str,
        base: str,
        patches: list[Patch],
        code: list[Path],
        git_identity: str,
    ) -> RoundTripStamp:
        key = series_key("roundtrip 1", base, patches, code, git_identity)
        return cls(Stamp(verified / f"roundtrip-{target}-{base}", key))

    def holds(self) -> bool:
        return self.stamp.holds()

    def record(self, patches: list[Patch], exported: dict[str, bytes]) -> None:
        """Write the stamp when `exported` is exactly `patches` (nothing else is recorded)."""
        if set(exported) != {p.name for p in patches}:
            return
        if any(exported[p.name] != p.raw for p in patches):
            return
        self.stamp.record()


def lint_target(
    target: str,
    directory: Path,
    subdir: str = "",
    *,
    reexport: Reexport | None = None,
    today: dt.date | None = None,
) -> LintReport:
    """Lint one target's series directory."""
    report = LintReport()
    add = report.findings.append
    try:
        refuse_special_files(directory)  # before a byte is read, as every verb's load_series
    except ConfigError as exc:  # lint reports it, and reads nothing of that folder
        add(Finding("series-special", target, None, exc.message))
        report.checked[target] = []
        return report
    entries = _series_entries(directory, target, add)
    names = [n for n, _ in entries]
    report.checked[target] = names
    files = {p.name for p in directory.glob("*.patch")}
    for name in sorted(files - set(names)):
        add(Finding("series-extra", target, name, f"{name} is not listed in {directory}/series"))
    patches: list[Patch] = []
    for name, line in entries:
        path = directory / name
        if not path.is_file() or path.is_symlink():
            add(
                Finding(
                    "series-missing",
                    target,
                    name,
                    f"series line {line} names {name}, which is not a file",
                    line,
                )
            )
            continue
        raw = path.read_bytes()
        _check_paths(target, name, raw, subdir, add)
        _check_added_lines(target, name, raw, add)
        try:
            patch = parse_patch(name, raw)
        except PatchkitError as exc:
            if "CRLF" not in exc.message and "path" not in exc.message:
                add(Finding("patch-malformed", target, name, exc.message))
            continue
        _check_metadata(target, patch, add, today or dt.datetime.now(dt.timezone.utc).date())
        patches.append(patch)
    _check_overlaps(target, patches, add)
    if reexport is not None and patches and len(patches) == len(entries):
        _check_reexport(target, directory, patches, reexport, add)
    return report


def lint_targets_file(path: Path) -> LintReport:
    """Keys of targets.toml that patchkit does not read: an error when one is near a known key
    (a typo: `defualt_line` leaves the default line unset), else a warning."""
    from patchkit.compat import tomllib
    from patchkit.targets import unknown_keys

    report = LintReport()
    data = tomllib.loads(path.read_text(encoding="utf-8"))  # loaded once already: it parses
    for unknown in unknown_keys(data):
        rule = "targets-key-typo" if unknown.nearest else "targets-key-unknown"
        report.findings.append(Finding(rule, path.name, None, unknown.message))
    return report


def _series_entries(directory: Path, target: str, add) -> list[tuple[str, int]]:
    path = directory / "series"
    if not path.is_file():
        add(Finding("series-missing", target, None, f"{path} does not exist"))
        return []
    seen: dict[str, int] = {}
    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        if not PATCH_NAME_RE.match(name) or "/" in name:
            add(
                Finding(
                    "series-name",
                    target,
                    name,
                    f"series line {number}: '{name}' is not a patch file name",
                    number,
                )
            )
            continue
        if name in seen:
            add(
                Finding(
                    "series-duplicate",
                    target,
                    name,
                    f"series line {number} repeats {name} (first on line {seen[name]})",
                    number,
                )
            )
            continue
        seen[name] = number
        entries.append((name, number))
    return entries


def _diff_part(raw: bytes) -> tuple[str, int]:
    text = raw.decode("utf-8", "replace")
    match = re.search(r"^diff --git ", text, re.M)
    if match is None:
        return "", 0
    return text[match.start() :], text[: match.start()].count("\n")


def _check_paths(target: str, name: str, raw: bytes, subdir: str, add) -> None:
    diff, offset = _diff_part(raw)
    prefix = f"{subdir}/" if subdir else ""
    for number, line in enumerate(diff.split("\n"), offset + 1):
        for path in diff_line_paths(line):
            try:
                safe_repo_path(name, path)
            except PatchkitError as exc:
                add(Finding("path-escape", target, name, exc.message, number))
                continue
            if prefix and not path.startswith(prefix):
                add(
                    Finding(
                        "path-outside-subdir",
                        target,
                        name,
                        f"{path} is outside {prefix} (an sdist base has nothing there)",
                        number,
                    )
                )


def _check_added_lines(target: str, name: str, raw: bytes, add) -> None:
    diff, offset = _diff_part(raw)
    for number, line in enumerate(diff.split("\n"), offset + 1):
        if not line.startswith("+") or line.startswith("+++ "):
            continue
        if line.endswith("\r"):
            add(Finding("crlf", target, name, f"line {number} adds a CRLF line ending", number))
        elif line[1:] != line[1:].rstrip():
            add(
                Finding(
                    "trailing-whitespace",
                    target,
                    name,
                    f"line {number} adds trailing whitespace: {line[:60]!r}",
                    number,
                )
            )


def _check_metadata(target: str, patch: Patch, add, today: dt.date) -> None:
    for check in _METADATA_CHECKS:
        for kind, message in check(patch, today):
            add(Finding(kind, target, patch.name, message))


# A metadata check yields (finding kind, message) for each problem it finds in a patch.
_MetadataCheck = Callable[[Patch, dt.date], Iterator[tuple[str, str]]]
_MALFORMED = "metadata-malformed"


def _description_missing(patch: Patch, today: dt.date) -> Iterator[tuple[str, str]]:
    description = patch.body
    for key, value in patch.trailers:
        description = description.replace(f"{key}: {value}", "")
    if not description.strip():
        yield (
            "description-missing",
            "the message has no description: say why the patch exists and when it can go",
        )


def _required_missing(patch: Patch, today: dt.date) -> Iterator[tuple[str, str]]:
    for key in REQUIRED:
        if patch.trailer(key) is None:
            yield "metadata-missing", f"no {key}: trailer"


def _origin_malformed(patch: Patch, today: dt.date) -> Iterator[tuple[str, str]]:
    origin = patch.trailer("Origin")
    if origin is None:
        return
    match = ORIGIN_RE.match(origin)
    if match is None:
        yield _MALFORMED, f"Origin: '{origin}' is not 'upstream|backport|vendor|other[, <where>]'"
    elif match.group(1) in ("upstream", "backport") and not (
        match.group(2) and URL_OR_COMMIT_RE.match(match.group(2))
    ):
        yield _MALFORMED, f"Origin: {match.group(1)} needs a URL or commit:<sha> after the comma"


def _forwarded_malformed(patch: Patch, today: dt.date) -> Iterator[tuple[str, str]]:
    forwarded = patch.trailer("Forwarded")
    if forwarded is not None and not FORWARDED_RE.match(forwarded):
        yield _MALFORMED, f"Forwarded: '{forwarded}' is not a URL, 'no' or 'not-needed'"


def _links_malformed(patch: Patch, today: dt.date) -> Iterator[tuple[str, str]]:
    for key in ("Bug", "Applied-Upstream"):
        value = patch.trailer(key)
        if value is not None and not value.strip():
            yield _MALFORMED, f"{key}: is empty"
    bug = patch.trailer("Bug")
    if bug and not bug.startswith(("http://", "https://")):
        yield _MALFORMED, f"Bug: '{bug}' is not a URL"


def _last_update_malformed(patch: Patch, today: dt.date) -> Iterator[tuple[str, str]]:
    updated = patch.trailer("Last-Update")
    if updated is None:
        return
    try:
        if not DATE_RE.match(updated):
            raise ValueError
        when = dt.date.fromisoformat(updated)
    except ValueError:
        yield _MALFORMED, f"Last-Update: '{updated}' is not a YYYY-MM-DD date"
        return
    if when > today:
        yield _MALFORMED, f"Last-Update: {updated} is in the future"


def _tests_malformed(patch: Patch, today: dt.date) -> Iterator[tuple[str, str]]:
    for test in patch.tests:
        if "/" not in test and "::" not in test:
            yield _MALFORMED, f"Patchkit-Tests: '{test}' is not a test path or node id"


def _parts_malformed(patch: Patch, today: dt.date) -> Iterator[tuple[str, str]]:
    files = [f.path for f in patch.files]
    for key, value in patch.trailers:
        if key.lower() == PART_TRAILER.lower() and (
            claimed_version(value) is None or not claimed_paths(value, files)
        ):
            yield _MALFORMED, f"{PART_TRAILER}: '{value}' names no release and file of the patch"


def _probes_malformed(patch: Patch, today: dt.date) -> Iterator[tuple[str, str]]:
    for key, value in patch.trailers:
        if key.lower() == PROBE_TRAILER.lower() and isinstance(why := parse_probe(value), str):
            yield _MALFORMED, f"{PROBE_TRAILER}: '{value}': {why}"


# The metadata checks, in the order their findings are reported.
_METADATA_CHECKS: tuple[_MetadataCheck, ...] = (
    _description_missing,
    _required_missing,
    _origin_malformed,
    _forwarded_malformed,
    _links_malformed,
    _last_update_malformed,
    _tests_malformed,
    _parts_malformed,
    _probes_malformed,
)


def _check_overlaps(target: str, patches: list[Patch], add) -> None:
    """Hunks of two patches on the same file whose line ranges meet (post-image of the earlier
    against pre-image of the later: exact when no patch in between moved the lines)."""
    seen: dict[str, list[tuple[str, int, int]]] = {}
    for patch in patches:
        for change in patch.files:
            path = change.source or change.path
            mine = [(start, start + max(length, 1) - 1) for start, length, _, _ in change.hunks]
            for other, lo, hi in seen.get(path, []):
                for a, b in mine:
                    if a <= hi and lo <= b:
                        add(
                            Finding(
                                "overlap",
                                target,
                                patch.name,
                                f"{path}:{a}-{b} overlaps lines {lo}-{hi} changed by "
                                f"{other}: the two patches must be rebased together",
                            )
                        )
                        break
            targets = seen.setdefault(change.path, [])
            targets += [
                (patch.name, start, start + max(length, 1) - 1)
                for _, _, start, length in change.hunks
            ]


def _check_reexport(
    target: str, directory: Path, patches: list[Patch], reexport: Reexport, add
) -> None:
    try:
        exported = reexport(target)
    except ApplyError as exc:
        add(
            Finding(
                "reexport", target, None, f"the series does not apply to its pin: {exc.message}"
            )
        )
        return
    except DamagedBaseError as exc:  # not "could not run": nothing built on it can be trusted
        add(Finding("base-damaged", target, None, f"re-export not checked: {exc.message}"))
        return
    except PatchkitError as exc:
        add(Finding("reexport-skipped", target, None, f"re-export not checked: {exc.message}"))
        return
    for patch in patches:
        again = exported.get(patch.name)
        if again is None:
            add(
                Finding(
                    "reexport",
                    target,
                    patch.name,
                    "apply + export does not produce this file (named differently?)",
                )
            )
        elif again != patch.raw:
            add(
                Finding(
                    "reexport",
                    target,
                    patch.name,
                    "apply + export gives different bytes "
                    f"({_first_difference(patch.raw, again)}); regenerate it with "
                    "`patchkit apply` + `patchkit export`",
                )
            )


def _first_difference(a: bytes, b: bytes) -> str:
    la, lb = a.split(b"\n"), b.split(b"\n")
    for i, (x, y) in enumerate(zip(la, lb, strict=False), 1):
        if x != y:
            return f"line {i}: {x[:50]!r} vs {y[:50]!r}"
    return f"length {len(la)} vs {len(lb)} lines"
