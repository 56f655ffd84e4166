"""Carrying the series onto a new upstream base: the report, the conflict work tree and
`--continue`, and writing the result into patches/ and targets.toml.

The classification of each patch (labels and their evidence) is `patchkit.classify`, which
`outlook` shares.  Nothing here prints; `patchkit.commands.rebase` renders the report.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import gitops, ui
from patchkit.apply import BASE_REF, BRANCH, ApplyOptions, build_series
from patchkit.carry_record import carry_stamp, read_carry, record_carry
from patchkit.classify import (
    LABELS,
    REMOVED_LABELS,
    NewBase,
    PatchOutcome,
    Signal,
    carry_series,
    wheel_requires,
)
from patchkit.errors import ApplyError, Interrupted, UsageError
from patchkit.export import ExportedPatch, SeriesRead, export_commits, unchanged_since, write_series
from patchkit.locks import locked
from patchkit.pins import check_targets, render_targets, write_targets
from patchkit.project import Project
from patchkit.scratch import folder_beside
from patchkit.series import PATCH_FILE_TRAILER, Series
from patchkit.targets import Release, Target, WheelPin, bump_version, load_targets
from patchkit.upstream import Base, NewPin, resolve_new_base

IMPORTS = ("sdist", "wheel")  # bases imported from the index: no upstream git history
# The new-base finding lives in patchkit.upstream, targets.toml edits in patchkit.pins.
# The labels and outcomes are patchkit.classify's.
__all__ = [
    "LABELS",
    "REMOVED_LABELS",
    "NewPin",
    "PatchOutcome",
    "Signal",
    "render_targets",
    "resolve_new_base",
]

DROPPED_NOTE = (
    "left out while resolving (git rebase --skip, or resolved to no change); no upstream "
    "evidence: --write removes it from the series without an Applied-Upstream trailer"
)
# Labels whose patch the replay and --write leave out: the new base has it, or no longer needs it.
_UPSTREAM_HAS_IT = ("upstreamed", "obsolete")
STATE_FILE = "patchkit-rebase.json"
REBASE_DIR = "rebase"
REBASE_IDENTITY = gitops.Identity("patchkit rebase", "rebase@patchkit.invalid", "946684800 +0000")


@dataclass
class RebaseReport:
    """The outcome of classifying (and possibly writing) a rebase of one target's series."""

    target: str
    ref: str
    old_base: Base
    new_base: Base
    series_version: str
    next_series_version: str
    outcomes: list[PatchOutcome] = field(default_factory=list)
    pin: NewPin | None = None
    history: bool = False
    conflict_tree: Path | None = None
    next_steps: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    commit_message: str | None = None
    tip: str | None = None
    write_requested: bool = False
    line: str = ""  # the line whose series was carried
    new_line: str | None = None  # --new-line: the line --write starts

    @property
    def conflicted(self) -> list[PatchOutcome]:
        return [o for o in self.outcomes if o.label == "conflict"]

    @property
    def status(self) -> str:
        if self.conflicted:
            return "conflict"
        return "written" if self.written else "classified"

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.outcomes:
            out[o.label] = out.get(o.label, 0) + 1
        return out

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "line": self.line,
            "new_line": self.new_line,
            "ref": self.ref,
            "status": self.status,
            "old_base": _base_json(self.old_base),
            "new_base": _base_json(self.new_base),
            "history": self.history,
            "series": {"version": self.series_version, "next": self.next_series_version},
            "pin": self.pin.to_json() if self.pin else None,
            "counts": self.counts(),
            "patches": [o.to_json() for o in self.outcomes],
            "conflict_tree": str(self.conflict_tree) if self.conflict_tree else None,
            "next_steps": self.next_steps,
            "written": self.written,
            "commit_message": self.commit_message,
        }


def _base_json(base: Base) -> dict:
    return base.to_json()


# --- classification --------------------------------------------------------------------------


def classify_rebase(
    mirror: gitops.Repo,
    target: Target,
    series: Series,
    old_base: Base,
    new_base: Base,
    *,
    series_version: str,
    ref: str,
    pin: NewPin | None = None,
) -> RebaseReport:
    """Carry every patch of `series` from `old_base` onto `new_base` and label each one.

    Works in the bare mirror with scratch indexes; no work tree, no refs moved.
    """
    report = RebaseReport(
        target.name,
        ref,
        old_base,
        new_base,
        series_version,
        bump_version(series_version, "minor"),
        pin=pin,
    )
    report.history = _has_history(mirror, old_base, new_base)
    range_ids: dict[str, str] | None = None
    if report.history:
        paths = sorted(
            {f.path for p in series.patches for f in p.files}
            | {f.source for p in series.patches for f in p.files if f.source}
        )
        range_ids = gitops.patch_ids_in_range(mirror, old_base.commit, new_base.commit, paths)
    cache = mirror.path.parent.parent  # <cache>/mirrors/<name>.git
    stamp = carry_stamp(cache, target.name, series, old_base.commit, new_base, range_ids)
    carry = read_carry(stamp, mirror)  # the same carry, made before: read, not redone
    if carry is None:
        facts = new_base_facts(new_base, cache)
        carry = carry_series(mirror, series, old_base.commit, facts, range_ids=range_ids)
        record_carry(stamp, carry)
    report.outcomes = carry.outcomes
    report.tip = carry.tip
    return report


def new_base_facts(base: Base, cache: Path) -> NewBase:
    """What the classification reads of a base: its release and, for a wheel base, the
    wheel's Requires-Dist (the wheel is in the cache the base was imported from)."""
    requires = None
    if base.source == "wheel" and base.wheel:
        from patchkit.upstream.wheel import wheel_path

        pin = WheelPin(base.wheel, base.wheel_sha256 or "")
        requires = wheel_requires(wheel_path(pin, cache))
    return NewBase(base.commit, base.release.version if base.release else None, requires)


def _has_history(mirror: gitops.Repo, old: Base, new: Base) -> bool:
    if old.source in IMPORTS or new.source in IMPORTS:
        return False
    return gitops.is_ancestor(mirror, old.commit, new.commit)


# --- conflicts: a scratch work tree and --continue -------------------------------------------


def rebase_dir(work_dir: Path, target: str) -> Path:
    return work_dir / REBASE_DIR / target


def leave_conflict_tree(
    report: RebaseReport,
    mirror: gitops.Repo,
    series: Series,
    dest: Path,
    *,
    write: bool,
    read: SeriesRead | None = None,
) -> None:
    """Replay the series from the first conflicting patch with `git rebase` in a scratch clone,
    stopping at the conflict with markers in the files; records what --continue needs (with
    `read`, what the carried series was read from: --continue --write refuses to write over
    a change made there since).

    The tree is made in a scratch directory beside `dest` and renamed into place with its
    state file, so `dest` holds a complete conflict tree or nothing, whenever the run stops.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    with locked(
        dest.parent / f".{dest.name}.patchkit.lock",
        f"the conflict work tree {dest}",
        notify=ui.progress,
    ):
        if dest.exists():
            raise UsageError(
                f"{dest} already holds a rebase in progress",
                hint="`patchkit rebase --continue` or `patchkit rebase --abort`",
            )
        sweep_removed(dest)  # left by a killed run
        ui.progress(f"leaving a work tree with the conflict in {dest}")
        scratch = Path(folder_beside(dest, "patchkit"))
        try:
            finished = _make_conflict_tree(
                report, mirror, series, scratch / "tree", write=write, read=read
            )
            os.replace(scratch / "tree", dest)
        except KeyboardInterrupt:
            raise Interrupted(
                f"no conflict work tree was left in {dest} and patches/ is unchanged; "
                "run the same command again"
            ) from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    report.conflict_tree = dest
    try:
        report.next_steps = conflict_steps(gitops.Repo.checkout(dest), report.target, finished)
    except KeyboardInterrupt:
        raise Interrupted(
            f"the conflict work tree in {dest} is complete; resolve it and "
            f"`patchkit rebase --target {report.target} --continue`, or `--abort`"
        ) from None


def _make_conflict_tree(
    report: RebaseReport,
    mirror: gitops.Repo,
    series: Series,
    dest: Path,
    *,
    write: bool,
    read: SeriesRead | None,
) -> bool:
    """Build the conflict tree and its state file in `dest`; True if git finished the replay."""
    first = report.conflicted[0]
    old_tip, old_results = _replayed_series(report, mirror, series)
    index = next(i for i, r in enumerate(old_results) if r.name == first.name)
    upstream = old_results[index - 1].commit if index else report.old_base.commit
    carried = report.new_base.commit
    for outcome in report.outcomes:
        if outcome.name == first.name:
            break
        if outcome.commit and outcome.label not in _UPSTREAM_HAS_IT:
            carried = outcome.commit
    tree = gitops.clone_local(mirror, dest)
    for sha in {old_tip, carried, report.new_base.commit}:
        gitops.fetch_commit_from(tree, mirror, sha)
    gitops.update_ref(tree, BASE_REF.format(target=report.target), report.new_base.commit)
    finished, _ = gitops.rebase_onto(
        tree, carried, upstream, old_tip, BRANCH.format(target=report.target), REBASE_IDENTITY
    )
    state = {
        "target": report.target,
        "ref": report.ref,
        "write": write,
        "line": report.line,
        "new_line": report.new_line,
        "old_base": dataclasses.asdict(report.old_base),
        "new_base": dataclasses.asdict(report.new_base),
        "pin": report.pin.to_json() if report.pin else None,
        "series_version": report.series_version,
        "outcomes": [{k: v for k, v in o.to_json().items()} for o in report.outcomes],
        "series_read": read.to_json() if read is not None else None,
    }
    state["fingerprint"] = worktree_fingerprint(tree)
    _state_path(dest).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    return finished


def _replayed_series(report: RebaseReport, mirror: gitops.Repo, series: Series):
    """The old series as commits for the replay, without the patches upstream already has: the
    replay would otherwise re-add them next to upstream's own version (an equivalent upstream
    applies cleanly as a duplicate).  When a later patch needs one of them, all are kept."""
    upstreamed = {o.name for o in report.outcomes if o.label in _UPSTREAM_HAS_IT}
    kept = dataclasses.replace(
        series,
        entries=[e for e in series.entries if e.name not in upstreamed],
        patches=[p for p in series.patches if p.name not in upstreamed],
    )
    if upstreamed:
        try:
            return build_series(mirror, report.old_base.commit, kept, ApplyOptions())
        except ApplyError:
            pass
    return build_series(mirror, report.old_base.commit, series, ApplyOptions())


def conflict_steps(tree: gitops.Repo, target: str, finished: bool) -> list[str]:
    """The shell commands that finish a rebase stopped in the work tree `tree`; every path
    from data is quoted (a folder or an upstream file name may hold spaces, `;` or `$(...)`)."""
    if finished:
        return [f"patchkit rebase --target {target} --continue"]
    files = gitops.conflicted_files(tree)
    quoted = " ".join(shlex.quote(f) for f in files)
    return [
        f"cd {shlex.quote(str(tree.path))}",
        "git status --short        # conflicted: see git status",
        f"$EDITOR {quoted or '<files>'}   # resolve the <<<<<<< markers",
        f"git add -- {quoted or '<files>'}",
        f"cd - && patchkit rebase --target {target} --continue [--write]",
        f"# or give up: patchkit rebase --target {target} --abort",
    ]


def _state_path(dest: Path) -> Path:
    return dest / ".git" / STATE_FILE


def worktree_fingerprint(tree: gitops.Repo) -> str:
    """What a conflict work tree holds: HEAD, each changed path's status and bytes."""
    digest = hashlib.sha256(f"{gitops.head(tree)}\n".encode())
    for entry in gitops.status_entries(tree):
        digest.update(entry.encode() + b"\0")
        path = tree.path / entry[3:]
        if path.is_file() and not path.is_symlink():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _read_state(dest: Path) -> dict | None:
    try:
        return json.loads(_state_path(dest).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def stopped_read(dest: Path) -> SeriesRead | None:
    """What the rebase stopped in `dest` read its series from (None: no record of it)."""
    data = (_read_state(dest) or {}).get("series_read")
    if not data:
        return None
    return SeriesRead.from_json(data, by=f"since the rebase that left {dest} read it")


def stopped_line(dest: Path) -> str | None:
    """The line a stopped rebase carries (None: no rebase stopped there)."""
    state = _read_state(dest)
    return (state or {}).get("line") or None


def replace_untouched(dest: Path) -> bool:
    """Remove the conflict work tree patchkit left in `dest` if nobody touched it since;
    refuse (UsageError) a tree holding someone's work or not made by patchkit."""
    state = _read_state(dest)
    if state is None:
        raise UsageError(
            f"{dest} is in the way: it is not a conflict work tree patchkit left (it has no "
            f".git/{STATE_FILE}); nothing was touched",
            hint=f"move it elsewhere or remove it ({shlex.quote(str(dest))}), then run again",
        )
    if state.get("fingerprint") == worktree_fingerprint(gitops.Repo.checkout(dest)):
        _remove_tree(dest)
        return True
    raise UsageError(
        f"a rebase of {dest.name} is in progress in {dest} (its files were changed since it "
        "stopped)",
        hint="`patchkit rebase --continue` or `patchkit rebase --abort`",
    )


def _base_from(data: dict) -> Base:
    release = None
    if data.get("release"):
        fields = dict(data["release"])
        fields["wheels"] = tuple(
            WheelPin(w["filename"], w["sha256"]) for w in fields.get("wheels", ())
        )
        release = Release(**fields)
    data = {**data, "release": release, "notes": tuple(data.get("notes", ()))}
    return Base(**data)


def continue_rebase(dest: Path, target: Target, series: Series) -> tuple[RebaseReport, bool]:
    """Resume a rebase stopped on a conflict; returns (report, wants_write)."""
    path = _state_path(dest)
    if not path.is_file():
        raise UsageError(
            f"no rebase in progress for {target.name} ({dest} has none)",
            hint=f"start one: patchkit rebase --target {target.name}@<ref>",
        )
    state = json.loads(path.read_text(encoding="utf-8"))
    tree = gitops.Repo.checkout(dest)
    if gitops.rebase_in_progress(tree):
        unresolved = gitops.conflicted_files(tree)
        if unresolved:
            raise UsageError(
                f"{dest} still has unresolved conflicts: {', '.join(unresolved)}",
                hint=f"resolve them, `git add` the files in {dest}, then --continue again",
            )
        ui.progress("git rebase --continue")
        gitops.rebase_continue(tree, REBASE_IDENTITY)
    old_base, new_base = _base_from(state["old_base"]), _base_from(state["new_base"])
    pin = NewPin(**state["pin"]) if state.get("pin") else None
    report = RebaseReport(
        target.name,
        state["ref"],
        old_base,
        new_base,
        state["series_version"],
        bump_version(state["series_version"], "minor"),
        pin=pin,
        conflict_tree=dest,
        line=state.get("line") or "",
        new_line=state.get("new_line"),
    )
    by_label = {o["name"]: o for o in state["outcomes"]}
    base, head = new_base.commit, gitops.head(tree)
    exported = {p.name: p for p in export_commits(tree, base, head)}
    if gitops.rebase_in_progress(tree):
        stopped = gitops.rebase_stopped_at(tree)
        name = gitops.trailers_of(tree, stopped).get(PATCH_FILE_TRAILER) if stopped else None
        for entry in state["outcomes"]:
            outcome = _stored_outcome(entry)
            if entry["name"] == name:
                outcome.label = "conflict"
                outcome.conflicts = gitops.conflicted_files(tree)
            elif entry["label"] == "conflict" and entry["name"] in exported:
                outcome.label = "resolved"  # replayed since: resolved at an earlier stop
                outcome.note = f"resolved by hand in {dest}"
            report.outcomes.append(outcome)
        report.next_steps = conflict_steps(tree, target.name, False)
        return report, bool(state["write"])
    for name in series.names:
        entry = by_label.get(name, {"name": name, "label": "clean", "note": ""})
        outcome = _stored_outcome(entry)
        patch = series.by_name(name)
        if name in exported:
            outcome.refreshed = exported[name].raw
            outcome.commit = exported[name].commit
            outcome.changed = patch is not None and exported[name].raw != patch.raw
            if entry["label"] == "conflict":
                outcome.label = "resolved"
                outcome.note = f"resolved by hand in {dest}"
            elif outcome.label in _UPSTREAM_HAS_IT:
                outcome.label = "merged"
                outcome.note = "kept by git rebase after the resolution"
                outcome.signals = []
        elif outcome.label not in _UPSTREAM_HAS_IT:  # these keep their preview's evidence
            outcome.label = "dropped"
            outcome.note = DROPPED_NOTE
            outcome.signals = []
        outcome.provisional = False
        report.outcomes.append(outcome)
    report.tip = head
    return report, bool(state["write"])


def _stored_outcome(entry: dict) -> PatchOutcome:
    """A patch's outcome as the preview stored it in the conflict tree's state file."""
    return PatchOutcome(
        entry["name"],
        entry["label"],
        signals=[Signal(s["name"], s["fired"], s["detail"]) for s in entry.get("signals", ())],
        note=entry["note"],
    )


def rebase_stopped(dest: Path) -> bool:
    """Whether `dest` is the work tree of a rebase patchkit stopped (its state file is there)."""
    return _state_path(dest).is_file()


def abort_rebase(dest: Path) -> bool:
    """Remove the scratch work tree of a stopped rebase; False when there was none.  Under
    the tree's lock, as it is made: what a killed run left beside it is swept then."""
    if not dest.parent.is_dir():
        return False
    with locked(dest.parent / f".{dest.name}.patchkit.lock", f"the conflict work tree {dest}"):
        sweep_removed(dest)
        if not rebase_stopped(dest):
            return False
        _remove_tree(dest)
        return True


def _remove_tree(dest: Path) -> None:
    """Remove `dest` whole: renamed aside first, so a kill part-way leaves the complete tree
    or none (a tree that lost its state file and kept the rest was refused by --continue,
    --abort and a new rebase alike), and what it left aside is swept by `sweep_removed`."""
    aside = Path(folder_beside(dest, "patchkit"))
    os.replace(dest, aside / "tree")
    shutil.rmtree(aside, ignore_errors=True)


def sweep_removed(dest: Path) -> None:
    """Remove what a killed run left beside `dest` (`.<name>.patchkit-*`: a tree being made
    or being removed); the caller holds the tree's lock."""
    for stale in dest.parent.glob(f".{glob.escape(dest.name)}.patchkit-*"):
        shutil.rmtree(stale, ignore_errors=True)


# --- writing ---------------------------------------------------------------------------------


def write_rebase(
    report: RebaseReport,
    series_dir: Path,
    targets_file: Path,
    line: str | None = None,
    *,
    new_line: str | None = None,
    read: SeriesRead | None = None,
) -> None:
    """Refresh changed patches, drop upstreamed ones, move the line's pin (or, with
    `new_line`, start that line beside it), bump the series version.  Under the project's
    and the series folder's locks, refused when the folder or targets.toml changed since
    `read` (taken before the series was carried; without it, as the locks find them)."""
    if read is None:
        read = SeriesRead.take(series_dir, Project(targets_file.parent.parent))
    with unchanged_since(read):
        _write_rebase(report, series_dir, targets_file, line, new_line)


def _write_rebase(
    report: RebaseReport,
    series_dir: Path,
    targets_file: Path,
    line: str | None,
    new_line: str | None,
) -> None:
    report.write_requested = True
    if report.conflicted:
        raise UsageError(
            f"{len(report.conflicted)} patch(es) in conflict; nothing was written",
            hint="resolve them in the scratch work tree and `patchkit rebase --continue --write`",
        )
    if (
        new_line is None
        and report.pin is None
        and not any(o.changed or o.label in REMOVED_LABELS for o in report.outcomes)
    ):
        return  # already on this ref and every patch exports unchanged: nothing to record
    kept = [
        ExportedPatch(o.name, o.refreshed)
        for o in report.outcomes
        if o.label not in REMOVED_LABELS and o.refreshed is not None
    ]
    if new_line is None and report.pin is not None and line is not None:
        whole = load_targets(targets_file).get(report.target)
        taken = [ln.name for ln in whole.lines if ln.name != line and ln.pin == report.pin.version]
        if taken:
            raise UsageError(
                f"line {taken[0]} of {report.target} is already pinned to {report.pin.version}; "
                f"moving line {line} there too would leave two lines on one pin; nothing was "
                "written",
                hint=f"start a line instead (--write --new-line NAME), or rebase line {taken[0]}",
            )
    new_series = None
    if new_line is not None:
        new_series = f"{report.target}/{new_line}"
        dest = targets_file.parent / new_series
        if dest.exists() and any(dest.iterdir()):
            raise UsageError(
                f"--new-line {new_line}: {dest} already exists; nothing was written",
                hint="name another line: --new-line NAME",
            )
    new_toml = render_targets(
        targets_file.read_text(encoding="utf-8"),
        report.target,
        report.pin,
        report.next_series_version,
        line=line,
        new_line=new_line,
        new_series=new_series,
        version=report.pin.version if report.pin else report.ref.removeprefix("v"),
    )
    check_targets(new_toml)
    if new_series is not None:
        old_series = series_dir / "series"
        series_dir = targets_file.parent / new_series
        series_dir.mkdir(parents=True, exist_ok=True)
        if old_series.is_file():  # keep its comments
            shutil.copyfile(old_series, series_dir / "series")
    export = write_series(series_dir, report.target, kept)
    where = series_dir.relative_to(targets_file.parent).as_posix()
    report.written = [f"{where}/{n}" for n in export.written]
    report.written += [f"{where}/{n} (removed)" for n in export.removed]
    if export.series_changed or new_series is not None:
        report.written.append(f"{where}/series")
    write_targets(targets_file, new_toml)
    report.written.append(targets_file.name)
    report.commit_message = commit_message(report)


def commit_message(report: RebaseReport) -> str:
    """The suggested message of the project commit that records the rebase."""
    new = report.pin.version if report.pin else report.ref
    lines = [
        f"Rebase the {report.target} series onto {new} (series {report.next_series_version})",
        "",
    ]
    refreshed = [o for o in report.outcomes if o.label not in REMOVED_LABELS and o.changed]
    if refreshed:
        lines.append("Refreshed: " + ", ".join(f"{o.name} ({o.label})" for o in refreshed) + ".")
    dropped = [o for o in report.outcomes if o.label == "upstreamed"]
    for o in dropped:
        lines.append(
            f"Dropped {o.name}: applied upstream (signals: "
            f"{', '.join(o.fired) or 'dropped as empty'})."
        )
    for o in report.outcomes:
        if o.label == "obsolete":
            lines.append(f"Dropped {o.name}: obsolete on {new} ({o.note}).")
        if o.label == "dropped":
            lines.append(
                f"Dropped {o.name} while resolving the rebase; upstream was not seen to have "
                "it: <say why it is no longer needed>."
            )
    if report.pin and report.pin.new:
        lines.append(f"Pinned {report.target} {report.pin.version}: {report.pin.trust}.")
    trailers = [f"Applied-Upstream: {report.target} {new} ({o.name})" for o in dropped]
    if trailers:
        lines += ["", *trailers]
    return "\n".join(lines).rstrip() + "\n"
