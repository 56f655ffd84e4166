"""`status`: what a work tree carries compared with what the series produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from patchkit import gitops
from patchkit.apply import BASE_REF, ApplyOptions, PatchResult, build_series
from patchkit.errors import ApplyError, UsageError
from patchkit.series import PATCH_FILE_TRAILER, Series
from patchkit.targets import Target
from patchkit.upstream import import_fields


@dataclass
class PatchState:
    name: str
    state: str  # applied | modified | missing | already-applied
    commit: str | None = None
    changed_files: list[str] = field(default_factory=list)


@dataclass
class StatusReport:
    target: str
    directory: Path
    base: str
    stands_for: str
    upstream_commit: str | None
    series_version: str
    series_hash: str
    head: str | None
    patches: list[PatchState] = field(default_factory=list)
    extra_commits: list[str] = field(default_factory=list)
    expected: str | None = None
    error: str | None = None

    @property
    def clean(self) -> bool:
        return all(p.state in ("applied", "already-applied") for p in self.patches)

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "directory": str(self.directory),
            "base": self.base,
            "stands_for": self.stands_for,
            "upstream_commit": self.upstream_commit,
            "series": {"version": self.series_version, "hash": self.series_hash},
            "head": self.head,
            "expected_head": self.expected,
            "patches": [vars(p) for p in self.patches],
            "extra_commits": self.extra_commits,
            "error": self.error,
        }


def detect_target(checkout: gitops.Repo) -> str:
    """The target a work tree was made for, from its refs/patchkit/<target>/base ref."""
    directory = checkout.path
    if not gitops.is_repository(checkout):
        raise UsageError(f"{directory} is not a git checkout made by `patchkit apply`")
    names = sorted(
        ref.split("/")[2]
        for ref in gitops.refs(checkout, "refs/patchkit/")
        if ref.endswith("/base")
    )
    if not names:
        raise UsageError(
            f"{directory} carries no patchkit base ref; was it made by `patchkit apply`?"
        )
    return names[0]


def describe_base(checkout: gitops.Repo, target: Target, base: str) -> tuple[str, str | None]:
    """What the base commit stands for: a pinned release (git) or an sdist import."""
    for release in target.releases:
        if release.commit == base:
            return f"{release.tag or release.version} (git {base[:12]})", base
    message = gitops.commit_message(checkout, base)
    fields = import_fields(message)
    upstream = fields.get("Patchkit-Upstream-Commit", "unknown")
    upstream = None if upstream == "unknown" else upstream
    for kind, key in (("sdist", "Patchkit-Sdist"), ("wheel", "Patchkit-Wheel")):
        name = fields.get(key)
        if name:
            label = f"{kind} {name} (sha256 {fields.get(f'{key}-Sha256', '?')[:16]}…)"
            label += f", upstream {upstream}" if upstream else ", upstream commit unknown"
            return label, upstream
    return f"unpinned commit {base[:12]}", None


def status(
    checkout: gitops.Repo, target: Target, series: Series, series_version: str
) -> StatusReport:
    """Compare the work tree with base + series, patch by patch."""
    directory = checkout.path
    base = gitops.resolve(checkout, BASE_REF.format(target=target.name))
    if base is None:
        raise UsageError(f"{directory} has no {BASE_REF.format(target=target.name)} ref")
    stands_for, upstream = describe_base(checkout, target, base)
    head = gitops.head(checkout)
    report = StatusReport(
        target.name, directory, base, stands_for, upstream, series_version, series.hash(), head
    )
    by_name = _commits_by_patch(checkout, base, head or base, report)
    expected, results = _series_result(checkout, base, series, report)
    report.expected = expected
    drift = set(gitops.changed_paths(checkout, expected)) if expected else set()
    owned = _owned_paths(series, results)
    for result in results:
        commit = by_name.get(result.name)
        state = _state_of(checkout, result, commit)
        changed = sorted(owned[result.name] & drift)
        if state == "applied" and changed:
            state = "modified"
        report.patches.append(PatchState(result.name, state, commit, changed))
    for name in series.names[len(results) :]:
        report.patches.append(PatchState(name, "missing"))
    return report


def _commits_by_patch(
    checkout: gitops.Repo, base: str, head: str, report: StatusReport
) -> dict[str, str]:
    """patch file -> the commit of base..head its trailer names; commits without the trailer
    are the report's extra commits."""
    by_name: dict[str, str] = {}
    for commit, trailers in gitops.trailers_in_range(checkout, base, head):
        name = trailers.get(PATCH_FILE_TRAILER)
        if name:
            by_name[name] = commit
        else:
            report.extra_commits.append(commit)
    return by_name


def _series_result(
    checkout: gitops.Repo, base: str, series: Series, report: StatusReport
) -> tuple[str | None, list[PatchResult]]:
    """The series built on the base: (its commit, the patches' results), the commit None and
    the results of the patches reached when it no longer applies (said in `report.error`)."""
    try:
        return build_series(checkout, base, series, ApplyOptions())
    except ApplyError as exc:
        report.error = f"the series no longer applies to this base: {exc.message}"
        return None, getattr(exc, "results", [])


def _owned_paths(series: Series, results: list[PatchResult]) -> dict[str, set[str]]:
    """Each patch's paths that no later patch touches. A path that differs from the series
    result is the last touching patch's drift, not that of every earlier patch that also
    edits the file (they are intact)."""
    touched_by = {
        r.name: {f.path for f in series.by_name(r.name).files}
        | {f.source for f in series.by_name(r.name).files if f.source}
        for r in results
    }
    owner = {path: name for name, paths in touched_by.items() for path in paths}
    return {
        name: {path for path in paths if owner.get(path) == name}
        for name, paths in touched_by.items()
    }


def _state_of(checkout: gitops.Repo, result: PatchResult, commit: str | None) -> str:
    """What the work tree did with a patch, before drift is looked at."""
    if result.status == "already-applied":
        return "already-applied"
    if commit is None:
        return "missing"
    if result.commit and _same_change(checkout, commit, result.commit):
        return "applied"
    return "modified"


def _same_change(repo: gitops.Repo, a: str, b: str) -> bool:
    return a == b or gitops.patch_id_of_commit(repo, a) == gitops.patch_id_of_commit(repo, b)
