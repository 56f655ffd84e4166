"""The review model: per target a table of patches with their upstream status, the combined
delta against the base, optionally each patch's rebase classification for a newer ref, and a
range-diff between two versions of the series taken from this project's git history."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from patchkit import gitops
from patchkit.apply import ApplyOptions, build_series
from patchkit.compat import tomllib
from patchkit.errors import PatchkitError, UsageError
from patchkit.lines import line_series
from patchkit.rebase import RebaseReport, classify_rebase, resolve_new_base
from patchkit.series import Patch, Series, parse_patch
from patchkit.upstream import Mirror, acquire
from patchkit.workspace import Workspace

URL_RE = re.compile(r"https?://\S+")


@dataclass
class FileRow:
    path: str
    added: int
    removed: int


@dataclass
class PatchRow:
    """One patch as a reviewer sees it."""

    name: str
    purpose: str
    status: str  # applied-upstream | forwarded | backport | not-needed | not-forwarded | unknown
    status_text: str
    links: list[str]
    origin: str | None
    forwarded: str | None
    applied_upstream: str | None
    last_update: str | None
    files: list[FileRow]
    added: int
    removed: int
    tests: list[str]
    description: str
    diff: str
    classification: str | None = None
    evidence: list[str] = field(default_factory=list)
    note: str = ""  # the rebase note (e.g. "equivalent implementation: read it before dropping")
    provisional: bool = False  # classified while an earlier patch was left out
    conflicts: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            k: (v if k != "files" else [vars(f) for f in v])
            for k, v in vars(self).items()
            if k != "diff"
        }


@dataclass
class TargetReview:
    name: str
    base: str
    base_commit: str | None
    series_hash: str
    patches: list[PatchRow] = field(default_factory=list)
    diffstat: str = ""
    delta: str = ""
    against: str | None = None
    against_base: str | None = None
    error: str | None = None
    line: str = ""

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "line": self.line,
            "base": self.base,
            "base_commit": self.base_commit,
            "series_hash": self.series_hash,
            "against": self.against,
            "against_base": self.against_base,
            "error": self.error,
            "patches": [p.to_json() for p in self.patches],
            "diffstat": self.diffstat,
        }


@dataclass
class RangeEntry:
    """One patch across two versions of the series."""

    target: str
    name: str
    state: str  # unchanged | changed | added | dropped
    interdiff: str = ""
    note: str = ""

    def to_json(self) -> dict:
        return vars(self)


@dataclass
class SeriesComparison:
    since: str
    since_commit: str
    since_version: str | None
    version: str
    entries: list[RangeEntry] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.entries:
            out[e.state] = out.get(e.state, 0) + 1
        return out

    def to_json(self) -> dict:
        return {
            "since": self.since,
            "since_commit": self.since_commit,
            "since_version": self.since_version,
            "version": self.version,
            "counts": self.counts(),
            "entries": [e.to_json() for e in self.entries],
        }


@dataclass
class Review:
    series_version: str
    targets: list[TargetReview] = field(default_factory=list)
    comparison: SeriesComparison | None = None

    def to_json(self) -> dict:
        return {
            "series_version": self.series_version,
            "targets": [t.to_json() for t in self.targets],
            "comparison": self.comparison.to_json() if self.comparison else None,
        }


# --- building ---------------------------------------------------------------------------------


def upstream_status(patch: Patch) -> tuple[str, str, list[str]]:
    """(status key, words, links) from the DEP-3 fields."""
    origin = patch.trailer("Origin") or ""
    forwarded = patch.trailer("Forwarded")
    applied = patch.trailer("Applied-Upstream")
    links = URL_RE.findall(
        " ".join(x for x in (origin, forwarded or "", patch.trailer("Bug") or "", applied or ""))
    )
    if applied:
        return "applied-upstream", f"applied upstream: {applied}", links
    if forwarded and forwarded.startswith(("http://", "https://")):
        return "forwarded", f"forwarded: {forwarded}", links
    kind = origin.split(",", 1)[0].strip()
    if kind in ("backport", "upstream"):
        where = origin.split(",", 1)[1].strip() if "," in origin else "?"
        return "backport", f"{kind} of {where}", links
    if forwarded == "not-needed":
        return "not-needed", "not needed upstream", links
    if forwarded == "no":
        return "not-forwarded", "not forwarded yet", links
    return "unknown", "upstream status not recorded", links


def patch_row(patch: Patch) -> PatchRow:
    status, words, links = upstream_status(patch)
    description = patch.body
    for key, value in patch.trailers:
        description = description.replace(f"{key}: {value}\n", "")
    return PatchRow(
        name=patch.name,
        purpose=patch.subject,
        status=status,
        status_text=words,
        links=links,
        origin=patch.trailer("Origin"),
        forwarded=patch.trailer("Forwarded"),
        applied_upstream=patch.trailer("Applied-Upstream"),
        last_update=patch.trailer("Last-Update"),
        files=[FileRow(f.path, f.added, f.removed) for f in patch.files],
        added=patch.added,
        removed=patch.removed,
        tests=patch.tests,
        description=description.strip(),
        diff=patch.diff,
    )


def target_review(
    ws: Workspace,
    name: str,
    *,
    against: str | None = None,
    with_delta: bool = True,
    line: str | None = None,
) -> TargetReview:
    """One target's line (default: its default line): its patch table, the combined delta
    and (with `against`) classifications."""
    target = ws.targets.get(name, line)
    series = line_series(ws.project, target)
    review = TargetReview(
        name, target.pin, None, series.hash(), [patch_row(p) for p in series.patches]
    )
    review.line = target.line
    try:
        base = acquire(target, None)
        review.base = base.stands_for
        review.base_commit = base.commit
        if with_delta:
            mirror = Mirror(target).repo
            tip, _ = build_series(mirror, base.commit, series, ApplyOptions())
            review.diffstat = gitops.diff_trees(mirror, base.commit, tip, stat=True)
            review.delta = gitops.diff_trees(mirror, base.commit, tip)
        if against:
            _classify_against(review, target, series, base, against, ws)
    except PatchkitError as exc:
        review.error = exc.message
    return review


def _classify_against(
    review: TargetReview, target, series: Series, base, ref: str, ws: Workspace
) -> None:
    new, pin = resolve_new_base(target, ref)
    report: RebaseReport = classify_rebase(
        Mirror(target).repo,
        target,
        series,
        base,
        new,
        series_version=ws.targets.series_version,
        ref=ref,
        pin=pin,
    )
    review.against = ref
    review.against_base = new.stands_for
    labels = {o.name: o for o in report.outcomes}
    for row in review.patches:
        outcome = labels.get(row.name)
        if outcome is None:
            continue
        row.classification = outcome.label
        row.evidence = [f"{s.name}: {s.detail}" for s in outcome.signals if s.fired]
        row.note = outcome.note
        row.provisional = outcome.provisional
        row.conflicts = list(outcome.conflicts)
        if outcome.conflicts:
            row.evidence.append("conflicts in " + ", ".join(outcome.conflicts))


def build_review(
    ws: Workspace,
    *,
    targets: list[str] | None = None,
    against: dict[str, str] | None = None,
    since: str | None = None,
    with_delta: bool = True,
    line: str | None = None,
) -> Review:
    """The whole review: every target (or `targets`), `against` = {target: ref}; with
    `line`, that line of each target that has one."""
    review = Review(ws.targets.series_version)
    for name in targets or list(ws.targets.targets):
        if line is not None and line not in ws.target(name).line_names:
            continue
        review.targets.append(
            target_review(
                ws,
                name,
                against=(against or {}).get(name),
                with_delta=with_delta,
                line=line,
            )
        )
    if since:
        review.comparison = compare_series(ws, since, targets or list(ws.targets.targets))
    return review


# --- range-diff between two versions of the series ---------------------------------------------


def _series_names(raw: bytes) -> list[str]:
    """Entries of a series file's bytes (same syntax as series.read_series_file)."""
    names = []
    for line in raw.decode("utf-8", "replace").splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            names.append(name)
    return names


def _series_at(project: gitops.Repo, rev: str, target: str, folder: str) -> dict[str, bytes]:
    """The series of `target` at `rev`: in `folder` (its line's folder now), else in the
    one-folder-per-target layout of projects before series lines."""
    directory = folder
    raw = gitops.show_file(project, rev, f"{directory}/series")
    if raw is None:
        directory = f"patches/{target}"
        raw = gitops.show_file(project, rev, f"{directory}/series")
    out = {}
    for name in _series_names(raw or b""):
        data = gitops.show_file(project, rev, f"{directory}/{name}")
        if data is not None:
            out[name] = data
    return out


def _series_version_at(project: gitops.Repo, rev: str) -> str | None:
    raw = gitops.show_file(project, rev, "patches/targets.toml")
    try:
        return str(tomllib.loads(raw.decode("utf-8"))["series"]["version"]) if raw else None
    except (tomllib.TOMLDecodeError, KeyError, UnicodeDecodeError):
        return None


def _normalized(raw: bytes) -> list[str]:
    """The patch text as range-diff compares it: no blob ids, no line numbers."""
    out = []
    for line in raw.decode("utf-8", "replace").splitlines():
        if line.startswith("index ") or line.startswith("From "):
            continue
        out.append(re.sub(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", "@@", line))
    return out


def interdiff(old: bytes, new: bytes, old_name: str, new_name: str) -> str:
    return "\n".join(
        difflib.unified_diff(
            _normalized(old), _normalized(new), f"a/{old_name}", f"b/{new_name}", n=3, lineterm=""
        )
    )


def _subject(raw: bytes) -> str | None:
    try:
        return parse_patch("x.patch", raw).subject
    except PatchkitError:
        return None


def compare_series(ws: Workspace, since: str, targets: list[str]) -> SeriesComparison:
    """Per patch: unchanged, changed (with the interdiff), added or dropped since `since`."""
    root = ws.project.root
    project = gitops.Repo.checkout(root)
    commit = gitops.resolve(project, since) if gitops.is_repository(project) else None
    if commit is None:
        raise UsageError(f"--since {since}: not a commit of this project's repository ({root})")
    since_version = _series_version_at(project, commit)
    comparison = SeriesComparison(since, commit, since_version, ws.targets.series_version)
    for name in targets:
        folder = ws.project.series_dir(name).relative_to(root).as_posix()
        old = _series_at(project, commit, name, folder)
        new = {p.name: p.raw for p in ws.series(name).patches}
        old_by_subject = {_subject(raw): n for n, raw in old.items() if n not in new}
        paired: set[str] = set()
        for patch_name, raw in new.items():
            if patch_name in old:
                before = old[patch_name]
                if before == raw:
                    comparison.entries.append(RangeEntry(name, patch_name, "unchanged"))
                    continue
                text = interdiff(before, raw, patch_name, patch_name)
                note = "refreshed: only blob ids / line numbers moved" if not text else ""
                comparison.entries.append(RangeEntry(name, patch_name, "changed", text, note))
                continue
            renamed = old_by_subject.get(_subject(raw))
            if renamed:
                paired.add(renamed)
                comparison.entries.append(
                    RangeEntry(
                        name,
                        patch_name,
                        "changed",
                        interdiff(old[renamed], raw, renamed, patch_name),
                        f"renamed from {renamed}",
                    )
                )
            else:
                comparison.entries.append(RangeEntry(name, patch_name, "added"))
        for patch_name in old:
            if patch_name not in new and patch_name not in paired:
                comparison.entries.append(RangeEntry(name, patch_name, "dropped"))
    return comparison
