"""The proposal: input -> reference tree -> per-concern patches -> proof -> (on request) files.

1. The input is applied onto the base (or the existing series' result) at zero fuzz in a
   private index: that tree is the reference, what the input means.
2. git's own diff of base..reference is split into concerns (areas, the mapping file) or, for
   an mbox of several messages, kept one patch per message.
3. The concerns become commits (`apply.build_series`) and are exported in the series' exact
   format (`export.export_commits`); the exported bytes are applied again from scratch and the
   tree compared with the reference. Unequal trees refuse the proposal and show the difference.
Nothing here writes outside the mirror's object store until `write_proposal` is called.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import os
import shlex
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from patchkit import gitops
from patchkit.apply import ApplyOptions, build_series
from patchkit.errors import ApplyError, FetchError, PatchkitError, UsageError
from patchkit.export import ExportedPatch, SeriesRead, export_commits, slug, write_series
from patchkit.import_.diagnose import applies_cleanly, failing_hunks, normalize_paths
from patchkit.import_.diffparse import Message, ParsedInput, parse_input, render_file
from patchkit.import_.overlay import Overlay
from patchkit.import_.release import imported_releases, index_blobs, made_against, match_blobs
from patchkit.import_.split import Mapping, assign, concern_diffs, enclosing_names
from patchkit.scratch import temporary_folder
from patchkit.series import (
    PATCH_FILE_TRAILER,
    Patch,
    Series,
    SeriesEntry,
    load_series,
    parse_patch,
    parse_trailers,
)
from patchkit.upstream import Base

DEFAULT_AUTHOR = "patchkit import <import@patchkit.invalid>"
TESTS_PLACEHOLDER = "TODO"  # lint flags it: not a test id, so the user must name the tests
ZERO_FROM = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001"


@dataclass
class ImportSource:
    """What is imported: a diff file's text, or an overlay directory."""

    label: str  # the file (or directory) name, as Origin names it
    sha256: str
    text: str | None = None
    overlay: Overlay | None = None

    @classmethod
    def from_file(cls, path: Path) -> ImportSource:
        try:
            raw = path.read_bytes()
        except IsADirectoryError:
            raise UsageError(
                f"{path} is a directory", hint="pass an overlay with --overlay DIR"
            ) from None
        except FileNotFoundError:
            raise UsageError(f"{path}: no such file") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"{path.name}: not UTF-8 (byte {exc.start}); is it a binary file?"
            ) from None
        return cls(path.name, hashlib.sha256(raw).hexdigest(), text=text)


@dataclass
class ProposedPatch:
    name: str
    subject: str
    files: list[str]
    added: int
    removed: int
    raw: bytes

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "subject": self.subject,
            "files": self.files,
            "added": self.added,
            "removed": self.removed,
            "sha256": hashlib.sha256(self.raw).hexdigest(),
        }


NEW_FILE = "the new file"


@dataclass
class Overlap:
    path: str
    hunk: str
    patch: str
    existing: str
    lines: str

    def text(self) -> str:
        if self.hunk == self.lines == NEW_FILE:
            return f"{self.path} is created by {self.patch} and by {self.existing}"
        return (
            f"{self.path} {self.hunk} in {self.patch} meet {self.lines} changed by {self.existing}"
        )


@dataclass
class ImportReport:
    """The proposed series, its proof, and everything said about the input."""

    target: str
    source: str
    source_sha256: str
    base: Base
    onto: str  # "base" | "series"
    mode: str = "areas"  # areas | mapping | messages
    patches: list[ProposedPatch] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    overlaps: list[Overlap] = field(default_factory=list)
    expected_tree: str | None = None
    proved_tree: str | None = None
    difference: str = ""
    status: str = "proposed"  # proposed | refused | mismatch | written
    failed_on_base: bool = False  # the input itself does not apply to the base release
    # (patch, path, old start, old length) of every hunk, in the coordinates of the tree the
    # import starts from (base, or the existing series' result)
    hunk_ranges: list[tuple[str, str, int, int]] = field(default_factory=list)
    directory: Path | None = None
    written: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status in ("proposed", "written")

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "source": {"name": self.source, "sha256": self.source_sha256},
            "base": self.base.commit,
            "onto": self.onto,
            "mode": self.mode,
            "status": self.status,
            "patches": [p.to_json() for p in self.patches],
            "problems": self.problems,
            "notes": self.notes,
            "overlaps": [vars(o) for o in self.overlaps],
            "proof": {
                "expected_tree": self.expected_tree,
                "series_tree": self.proved_tree,
                "equal": bool(self.expected_tree) and self.expected_tree == self.proved_tree,
                "difference": self.difference,
            },
            "directory": str(self.directory) if self.directory else None,
            "written": self.written,
        }


@dataclass
class ImportOptions:
    mapping: Mapping | None = None
    by_area: bool = False  # split an mbox of several messages by area too
    threeway: bool = False
    author: str = DEFAULT_AUTHOR
    today: dt.date | None = None
    line: str | None = None  # the line imported into (named in the commands a refusal offers)
    lines_at: dict[str, str] = field(default_factory=dict)  # release -> the line pinned there
    # Releases the mirror lacks, to tell the diff's release by: (version, commit), nearest first
    more_releases: Callable[[], Iterator[tuple[str, str]]] | None = None


@dataclass
class _Draft:
    name: str
    subject: str
    body: str
    author: str
    date: str
    diff: str


# Other pinned bases to try when the input does not apply: () -> [(release label, commit)].
OtherBases = Callable[[], list[tuple[str, str]]]


def propose_import(
    mirror: gitops.Repo,
    base: Base,
    source: ImportSource,
    *,
    subdir: str,
    existing: Series | None = None,
    on_top: bool = False,
    options: ImportOptions | None = None,
    other_bases: OtherBases | None = None,
) -> ImportReport:
    """Propose a series for `source` against `base`, or on top of the `existing` series with
    `on_top`; overlaps with `existing` are reported either way. `mirror` is the target's."""
    options = options or ImportOptions()
    report = ImportReport(
        base.target, source.label, source.sha256, base, "series" if on_top else "base"
    )
    start = _series_result(mirror, base, existing) if on_top else base.commit
    release = _release_label(base)
    if source.overlay is not None:
        report.notes += _overlay_notes(source.overlay)
        messages: list[Message] = []
        reference = _overlay_reference(mirror, base.commit, start, source.overlay, options, report)
    else:
        messages, reference = _diff_reference(
            mirror, base, start, source, subdir, options, report, other_bases
        )
    if reference is None:
        report.status = "refused"
        return report
    report.expected_tree = reference
    if reference == gitops.tree_of(mirror, start):
        raise UsageError(f"{source.label} changes nothing in the {release} tree; nothing to import")
    drafts = _drafts(mirror, start, reference, messages, source, subdir, options, report)
    _build_and_prove(mirror, start, drafts, options, report)
    if existing is not None and report.patches:
        _report_overlaps(existing, report, on_top=on_top, carried=start != base.commit)
    return report


def _series_result(mirror: gitops.Repo, base: Base, existing: Series | None) -> str:
    """The commit an import on top of the existing series starts from: the series' result."""
    if existing is None or not existing.patches:
        return base.commit
    try:
        start, _ = build_series(mirror, base.commit, existing)
    except ApplyError as exc:
        raise UsageError(
            f"the existing {base.target} series does not apply to its base: {exc.message}",
            hint="fix the series first (patchkit lint), or import without --into-series",
        ) from None
    return start


def _overlay_reference(
    mirror: gitops.Repo, base: str, start: str, overlay: Overlay, options: ImportOptions,
    report: ImportReport,
) -> str | None:  # fmt: skip
    """The overlay's files laid over the base, carried onto `start`."""
    ref0 = gitops.tree_with_files(mirror, base, overlay.files)
    return _carry(mirror, base, ref0, start, options.threeway, report, _release_label(report.base))


def _diff_reference(
    mirror: gitops.Repo, base: Base, start: str, source: ImportSource, subdir: str,
    options: ImportOptions, report: ImportReport, other_bases: OtherBases | None,
) -> tuple[list[Message], str | None]:  # fmt: skip
    """The diff (or mbox) read, checked and applied: (its messages, the reference tree), the
    tree None when it is refused (the reasons in `report.problems`)."""
    release = _release_label(base)
    parsed = _read_input(source)
    messages = parsed.messages
    _check_input(mirror, base, start, parsed, subdir, report)
    if report.problems:
        if not parsed.problems:
            _name_the_release(mirror, base, messages, options, report, release)
        return messages, None
    if _per_message(parsed, options):
        report.mode = "messages"
        messages = _with_diffs(messages, report)
        reference = _apply_messages(mirror, start, messages, options.threeway, report, release)
    else:
        reference = _apply_whole(
            mirror, base.commit, start, messages, options.threeway, report, release
        )
    named = _name_the_release(mirror, base, messages, options, report, release)
    if reference is None and report.failed_on_base and other_bases is not None and not named:
        _say_which_release_fits(mirror, messages, other_bases, report)
    # a diff made on another release may apply here, but to other code than it was made on
    return messages, None if named else reference


def _read_input(source: ImportSource) -> ParsedInput:
    parsed = parse_input(source.text or "")
    if not any(m.files for m in parsed.messages):
        raise UsageError(f"{source.label}: contains no diff (no ---/+++ or diff --git lines)")
    return parsed


def _check_input(
    mirror: gitops.Repo, base: Base, start: str, parsed: ParsedInput, subdir: str,
    report: ImportReport,
) -> None:  # fmt: skip
    """Place the input's paths in the tree it applies to; every defect goes to the report."""
    base_paths = set(gitops.tree_paths(mirror, start))
    notes, problems = normalize_paths(parsed.messages, base_paths, subdir, base.target)
    report.notes += notes
    if problems and all(p.what.startswith("changes a file the") for p in problems):
        # Say every file that fails, not only the missing ones.
        release = _release_label(base)
        problems += _failing_on_base(mirror, start, parsed.messages, problems, release)
    report.problems += [p.text(report.source) for p in [*parsed.problems, *problems]]


def _with_diffs(messages: list[Message], report: ImportReport) -> list[Message]:
    """The messages that hold a diff; each one skipped is noted."""
    for number, message in enumerate(messages, 1):
        if not message.files:
            report.notes.append(
                f"skipped message {number} ({message.subject or 'no subject'}): "
                "it holds no diff (a cover letter?)"
            )
    return [m for m in messages if m.files]


def _drafts(
    mirror: gitops.Repo, start: str, reference: str, messages: list[Message],
    source: ImportSource, subdir: str, options: ImportOptions, report: ImportReport,
) -> list[_Draft]:  # fmt: skip
    """One draft per message of an mbox kept as it is, else one per concern."""
    today = options.today or dt.datetime.now(dt.timezone.utc).date()
    if report.mode == "messages":
        return _message_drafts(messages, source, options, today)
    report.mode = "mapping" if options.mapping else "areas"
    return _concern_drafts(mirror, start, reference, source, subdir, options, today, report)


def _report_overlaps(
    existing: Series, report: ImportReport, *, on_top: bool, carried: bool
) -> None:
    """The import's hunks that meet the existing series' (`carried`: the import starts from
    the series' result, so its post-images are compared)."""
    if not report.hunk_ranges:  # one patch per message: each hunk as its patch says
        report.hunk_ranges = [
            (p.name, c.source or c.path, src, src_len)
            for p in report.patches
            for c in parse_patch(p.name, p.raw).files
            for src, src_len, _, _ in c.hunks
        ]
    report.overlaps = find_overlaps(existing, report.hunk_ranges, on_top=carried)
    if report.overlaps and not on_top:
        report.notes.append(
            "the import overlaps the existing series: to carry both, import on top of it "
            "(--into-series, with --3way where needed)"
        )


def _failing_on_base(
    mirror: gitops.Repo, start: str, messages: list[Message], missing: list, release: str
) -> list:
    """The hunks of the files the base has that do not apply to it either."""
    gone = {p.path for p in missing}
    files = [f for m in messages for f in m.files if f.old not in gone and f.new not in gone]
    if not files:
        return []
    with gitops.scratch_index(mirror, start) as env:
        return failing_hunks(mirror, env, files, release)


def _name_the_release(
    mirror: gitops.Repo, base: Base, messages: list[Message], options: ImportOptions,
    report: ImportReport, release: str,
) -> bool:  # fmt: skip
    """Compare the diff's `index` lines with the base's blobs, and with every release in the
    mirror when they differ: a diff made against another release is refused (True), naming
    it and the commands that import it there (it may well apply here, to other code)."""
    blobs = index_blobs([f for m in messages for f in m.files])
    if not blobs:
        return False
    own = match_blobs(mirror, base.commit, blobs, release)
    if own.whole:
        report.notes.append(
            f"made against {release}: its index lines name {release}'s blobs ({len(blobs)} file(s))"
        )
        return False
    mine = base.release.version if base.release else None
    others = [m.label for m in made_against(mirror, blobs, imported_releases(mirror))]
    others = [v for v in others if v != mine]
    if not others and options.more_releases is not None:
        others = _scan_more_releases(mirror, blobs, options.more_releases, report)
    if not others:
        report.notes.append(
            f"its index lines name {release}'s blobs for {len(own.matching)} of {len(blobs)} "
            f"file(s) and no known release's for all (made against a tree of its own?); "
            f"differing: {', '.join(own.differing)}"
        )
        return False
    version = _nearest(others, mine)
    report.problems.append(
        f"{report.source}: made against {base.target} {' or '.join(others)}, not {release}: "
        f"its index lines name the blobs of {version}; in {release} "
        f"{len(own.differing)} of {len(blobs)} file(s) differ: {', '.join(own.differing)}"
    )
    report.problems.append(f"{report.source}: {_import_there(report, version, options)}")
    return True


def _scan_more_releases(
    mirror: gitops.Repo, blobs: dict[str, str], more: Callable[[], Iterator[tuple[str, str]]],
    report: ImportReport,
) -> list[str]:  # fmt: skip
    """The first release the mirror lacked whose files are the diff's every pre-image,
    obtained one by one from the index, nearest first; what was compared goes to the notes."""
    checked = []
    try:
        for version, commit in more():
            checked.append(version)
            if match_blobs(mirror, commit, blobs, version).whole:
                return [version]
    except FetchError as exc:
        report.notes.append(f"releases on the index not compared: {exc.message}")
    if checked:
        report.notes.append(f"compared with the index's {', '.join(checked)} too: none matches")
    return []


def _nearest(versions: list[str], mine: str | None) -> str:
    """The release closest above `mine` (a post-release of it, say), else the newest."""
    if mine is not None:
        above = [v for v in versions if Version(v) > Version(mine)]
        if above:
            return min(above, key=Version)
    return max(versions, key=Version)


def _import_there(report: ImportReport, version: str, options: ImportOptions) -> str:
    where = f"{report.target}@{version}"
    again = f"patchkit import {shlex.quote(report.source)} --target {where}"
    line = options.lines_at.get(version)
    if line is not None:
        return f"line {line} is pinned to {version}: {again}"
    start = f" --line {options.line}" if options.line else ""
    return (
        f"no line is pinned to {version}; start one there, then import into it: "
        f"patchkit rebase --target {where}{start} --write --new-line {version} && {again}"
    )


def _release_label(base: Base) -> str:
    if base.release:
        return f"{base.target} {base.release.version}"
    return f"{base.target}@{base.commit[:12]}"


def _overlay_notes(overlay: Overlay) -> list[str]:
    notes = []
    if overlay.skipped:
        shown = ", ".join(overlay.skipped[:5]) + (" ..." if len(overlay.skipped) > 5 else "")
        notes.append(f"skipped {len(overlay.skipped)} backup/cache file(s): {shown}")
    if overlay.new_files:
        notes.append(f"{len(overlay.new_files)} file(s) are new: {', '.join(overlay.new_files)}")
    return notes


def _per_message(parsed: ParsedInput, options: ImportOptions) -> bool:
    return parsed.mbox and len(parsed.messages) > 1 and not options.by_area and not options.mapping


def _diff_text(message: Message) -> str:
    return "".join(render_file(f) for f in message.files)


def _apply_messages(
    mirror: gitops.Repo,
    start: str,
    messages: list[Message],
    threeway: bool,
    report: ImportReport,
    release: str,
) -> str | None:
    """Apply each message in turn (the mbox's own order); the final tree or None."""
    with (
        temporary_folder("import-") as tmp,
        gitops.scratch_index(mirror, start) as env,
    ):
        for number, message in enumerate(messages, 1):
            path = Path(tmp) / f"{number}.patch"
            path.write_text(_diff_text(message), encoding="utf-8")
            if gitops.apply_to_index(mirror, env, path)[0]:
                continue
            if threeway and gitops.apply_to_index(mirror, env, path, threeway=True)[0]:
                report.notes.append(f"message {number} ({message.subject}) needed a 3-way merge")
                continue
            where = release + (" + the series" if report.onto == "series" else "")
            report.failed_on_base = report.onto == "base"
            for problem in failing_hunks(mirror, env, message.files, where):
                report.problems.append(problem.text(report.source))
            if not threeway and report.onto == "series":
                report.problems.append(
                    f"{report.source}: message {number} does not apply on top of the existing "
                    "series; retry with --3way"
                )
            return None
        return gitops.write_tree(mirror, env)


def _apply_whole(
    mirror: gitops.Repo,
    base: str,
    start: str,
    messages: list[Message],
    threeway: bool,
    report: ImportReport,
    release: str,
) -> str | None:
    """The input applied as one change: onto `start` directly when it was made there, else
    onto the base and then carried over the existing series."""
    files = [f for m in messages for f in m.files]
    text = "".join(render_file(f) for f in files)
    with temporary_folder("import-") as tmp:
        path = Path(tmp) / "input.patch"
        path.write_text(text, encoding="utf-8")
        if start != base:
            with gitops.scratch_index(mirror, start) as env:
                if gitops.apply_to_index(mirror, env, path)[0]:
                    report.notes.append("the input was made on top of the existing series")
                    return gitops.write_tree(mirror, env)
        with gitops.scratch_index(mirror, base) as env:
            applied, _ = gitops.apply_to_index(mirror, env, path)
            if not applied:
                report.failed_on_base = True
                for problem in failing_hunks(mirror, env, files, release):
                    report.problems.append(problem.text(report.source))
                if not report.problems:
                    report.problems.append(
                        f"{report.source}: does not apply to {release} at zero fuzz "
                        "(each hunk alone does: the hunks conflict with each other)"
                    )
                return None
            ref0 = gitops.write_tree(mirror, env)
    return _carry(mirror, base, ref0, start, threeway, report, release)


def _carry(
    mirror: gitops.Repo,
    base: str,
    ref0: str,
    start: str,
    threeway: bool,
    report: ImportReport,
    release: str,
) -> str | None:
    """Carry the change base..ref0 over onto `start` (the existing series' result)."""
    if start == base:
        return ref0
    change = gitops.diff_trees(mirror, base, ref0)
    with (
        temporary_folder("import-") as tmp,
        gitops.scratch_index(mirror, start) as env,
    ):
        path = Path(tmp) / "carry.patch"
        path.write_text(change, encoding="utf-8")
        if gitops.apply_to_index(mirror, env, path)[0]:
            return gitops.write_tree(mirror, env)
        if threeway and gitops.apply_to_index(mirror, env, path, threeway=True)[0]:
            report.notes.append("merged onto the existing series with a 3-way merge")
            return gitops.write_tree(mirror, env)
        if gitops.apply_to_index(mirror, env, path, reverse=True, check=True)[0]:
            report.problems.append(
                f"{report.source}: the existing series already carries every change of it; "
                "nothing to import"
            )
            return None
        carried = parse_input(change).messages[0].files
        for problem in failing_hunks(mirror, env, carried, f"{release} + the series"):
            report.problems.append(
                f"{report.source}: {problem.path} {problem.hunk or ''}: "
                f"{problem.what}; it overlaps the existing series"
                + ("" if threeway else ": retry with --3way")
            )
        if not report.problems:
            report.problems.append(f"{report.source}: conflicts with the existing series")
        return None


def _say_which_release_fits(
    mirror: gitops.Repo, messages: list[Message], other_bases: OtherBases, report: ImportReport
) -> None:
    text = "".join(_diff_text(m) for m in messages)
    others = other_bases()
    fitting = [label for label, commit in others if _fits(mirror, commit, text)]
    if fitting:
        # the line pinned to that release takes it (`import` refuses a release no line has,
        # naming `rebase --new-line`)
        plural = "s" if len(fitting) > 1 else ""
        report.problems.append(
            f"{report.source}: applies cleanly to the pinned release{plural} "
            f"{', '.join(fitting)}: import it with --target "
            f"{report.target}@{fitting[0].split()[-1]}"
        )
        return
    if others:
        tried = ", ".join(label for label, _ in others)
        report.problems.append(f"{report.source}: the other pinned releases ({tried}) do not fit")


def _fits(mirror: gitops.Repo, commit: str, text: str) -> bool:
    try:
        return applies_cleanly(mirror, commit, text)
    except (PatchkitError, gitops.GitError):
        return False


# --- drafts ---------------------------------------------------------------------------------


def _trailers(source: ImportSource, today: dt.date) -> list[tuple[str, str]]:
    return [
        ("Origin", f"vendor, imported from {source.label} (sha256 {source.sha256})"),
        ("Forwarded", "no"),
        ("Last-Update", today.isoformat()),
        ("Patchkit-Tests", TESTS_PLACEHOLDER),
    ]


def _date(today: dt.date) -> str:
    midnight = dt.datetime(today.year, today.month, today.day, tzinfo=dt.timezone.utc)
    return email.utils.format_datetime(midnight)


def _concern_drafts(
    mirror: gitops.Repo,
    start: str,
    reference: str,
    source: ImportSource,
    subdir: str,
    options: ImportOptions,
    today: dt.date,
    report: ImportReport,
) -> list[_Draft]:
    canonical = gitops.diff_trees(mirror, start, reference)
    files = parse_input(canonical).messages[0].files
    names_of = {
        f.path: enclosing_names(gitops.show_file(mirror, start, f.old), f.path, f.hunks)
        for f in files
        if f.old and not f.whole
    }
    concerns, notes = assign(files, names_of, subdir, options.mapping, source.label)
    report.notes += notes
    report.hunk_ranges = [
        (f"{c.name}.patch", diff.path, diff.hunks[i].old_start, diff.hunks[i].old_len)
        for c in concerns
        for diff, indexes in c.parts
        for i in indexes
    ]
    block = "\n".join(f"{k}: {v}" for k, v in _trailers(source, today))
    drafts = []
    for concern, diff in zip(concerns, concern_diffs(concerns), strict=True):
        body = f"{concern.description.strip()}\n\n{block}\n"
        drafts.append(
            _Draft(concern.name, concern.subject, body, options.author, _date(today), diff)
        )
    return drafts


def _message_drafts(
    messages: list[Message], source: ImportSource, options: ImportOptions, today: dt.date
) -> list[_Draft]:
    drafts = []
    taken: set[str] = set()
    for number, message in enumerate(messages, 1):
        text = message.text.strip("\n")
        trailers = parse_trailers(text)
        name = dict((k.lower(), v) for k, v in trailers).get(PATCH_FILE_TRAILER.lower())
        if name:
            lines = text.split("\n")
            text = "\n".join(
                ln for ln in lines if not ln.lower().startswith(PATCH_FILE_TRAILER.lower() + ":")
            ).strip("\n")
            trailers = parse_trailers(text)
        subject = message.subject or f"Imported change {number} of {source.label}"
        name = (name or slug(subject)).removesuffix(".patch")
        while f"{name}.patch" in taken:
            name = f"{name}-{number}"
        taken.add(f"{name}.patch")
        have = {k.lower() for k, _ in trailers}
        missing = [(k, v) for k, v in _trailers(source, today) if k.lower() not in have]
        if not text.strip() or (trailers and text.strip() == _trailer_text(trailers)):
            text = f"Imported from {source.label} (message {number}).\n\n{text}".strip()
        if missing:
            sep = "\n" if trailers else "\n\n"
            text += sep + "\n".join(f"{k}: {v}" for k, v in missing)
        drafts.append(
            _Draft(
                name,
                subject,
                text + "\n",
                message.author or options.author,
                message.date or _date(today),
                _diff_text(message),
            )
        )
    return drafts


def _trailer_text(trailers: list[tuple[str, str]]) -> str:
    return "\n".join(f"{k}: {v}" for k, v in trailers)


def _as_patch(draft: _Draft) -> Patch:
    raw = (
        f"{ZERO_FROM}\nFrom: {draft.author}\nDate: {draft.date}\nSubject: {draft.subject}\n\n"
        f"{draft.body}---\n{draft.diff}"
    )
    return parse_patch(f"{draft.name}.patch", raw.encode("utf-8"))


def _series_of(target: str, patches: list[Patch]) -> Series:
    entries = [SeriesEntry(p.name, n) for n, p in enumerate(patches, 1)]
    return Series(target, Path("."), entries, patches)


# --- building and proving -------------------------------------------------------------------


def _build_and_prove(
    mirror: gitops.Repo,
    start: str,
    drafts: list[_Draft],
    options: ImportOptions,
    report: ImportReport,
) -> None:
    patches = [_as_patch(d) for d in drafts]
    threeway = ApplyOptions(threeway=options.threeway and report.mode == "messages")
    tip, _ = build_series(mirror, start, _series_of(report.target, patches), threeway)
    exported = export_commits(mirror, start, tip)
    again = [parse_patch(p.name, p.raw) for p in exported]
    try:
        proved, _ = build_series(mirror, start, _series_of(report.target, again))
        report.proved_tree = gitops.tree_of(mirror, proved)
        # what `lint` checks: apply + export gives back the very bytes
        reexported = {p.name: p.raw for p in export_commits(mirror, start, proved)}
        for first in exported:
            if reexported.get(first.name) != first.raw:
                report.difference = (
                    f"{first.name} does not re-export byte for byte (apply + export changes "
                    "it; a header with non-ASCII text?)"
                )
                report.proved_tree = None
                break
    except ApplyError as exc:
        report.difference = f"the exported series does not apply: {exc.message}"
    for patch in again:
        report.patches.append(
            ProposedPatch(
                patch.name,
                patch.subject,
                [f.path for f in patch.files],
                patch.added,
                patch.removed,
                patch.raw,
            )
        )
    if report.proved_tree != report.expected_tree:
        report.status = "mismatch"
        if report.proved_tree and report.expected_tree:
            report.difference = gitops.diff_trees(
                mirror, report.expected_tree, report.proved_tree, stat=True
            )


def find_overlaps(
    existing: Series, hunks: list[tuple[str, str, int, int]], *, on_top: bool
) -> list[Overlap]:
    """Hunks of the import that meet hunks of the existing series on the same file (as lint
    compares them: the series' post-images when the import sits on top of it, pre-images of
    both when both start from the base)."""
    ranges: dict[str, list[tuple[str, int, int]]] = {}
    for patch in existing.patches:
        for change in patch.files:
            for src, src_len, tgt, tgt_len in change.hunks:
                start, length = (tgt, tgt_len) if on_top else (src, src_len)
                key = change.path if on_top else (change.source or change.path)
                ranges.setdefault(key, []).append((patch.name, start, start + max(length, 1) - 1))
    found = []
    for name, path, start, length in hunks:
        lo, hi = start, start + max(length, 1) - 1
        for other, a, b in ranges.get(path, []):
            if a <= hi and lo <= b:
                found.append(Overlap(path, _span(lo, hi), name, other, _span(a, b)))
    return found


def _span(first: int, last: int) -> str:
    """A hunk's lines as a reader says them; line 0 is a file not there before (created)."""
    return NEW_FILE if first == 0 else f"lines {first}-{last}"


# --- writing --------------------------------------------------------------------------------


def write_proposal(
    report: ImportReport,
    *,
    out: Path | None,
    series_dir: Path | None,
    proved_on: Series | None = None,
    read: SeriesRead | None = None,
) -> None:
    """Write a proved proposal: a new series in `out` (new or empty directory), or appended to
    `proved_on`, the target's series in `series_dir` the proof was made with, which `read`
    was taken just before (refused when the folder or targets.toml changed since: the proof
    would not hold).  Refuses anything that would overwrite a file."""
    if report.status != "proposed":
        raise UsageError("the proposal was not proved; nothing was written")
    new = [ExportedPatch(p.name, p.raw) for p in report.patches]
    if series_dir is not None:
        if read is None:
            read = SeriesRead.take(series_dir, by="while the import was proved")
        proved_on = proved_on if proved_on is not None else load_series(series_dir, report.target)

        def free() -> None:  # under the series folder's lock, the folder as `read` found it
            present = {p.name for p in series_dir.glob("*.patch")}
            clash = sorted(present & {p.name for p in new})
            if clash:
                raise UsageError(
                    f"{series_dir} already has {', '.join(clash)}; nothing was written",
                    hint="rename the patches in a mapping file (name = ...)",
                )

        kept = [ExportedPatch(p.name, p.raw) for p in proved_on.patches]
        result = write_series(series_dir, report.target, kept + new, read=read, check=free)
        report.directory, report.written = series_dir, result.written
        report.status = "written"
        return
    assert out is not None
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        raise UsageError(f"{out} exists and is not an empty directory; nothing was written")
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.import-"))
    try:
        result = write_series(scratch / "series-dir", report.target, new)
        if out.exists():
            out.rmdir()
        os.replace(scratch / "series-dir", out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report.directory, report.written = out, result.written
    report.status = "written"
