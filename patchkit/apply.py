"""Transactional application of a series: build the commits off to the side, then publish.

Commits are made with `git apply --cached` into a private index on the mirror, with identities
and dates taken from each patch, so the same base and series always give the same commit ids.
Only when every patch applied is the work tree touched: a new directory appears by rename, an
existing checkout moves to the result with one `git checkout` (which refuses to clobber files).
"""

from __future__ import annotations

import email.utils
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from unidiff import PatchSet

from patchkit import gitops
from patchkit.errors import ApplyError, DirtyTreeError, NothingToDo, PatchFormatError, UsageError
from patchkit.locks import locked
from patchkit.series import PATCH_FILE_TRAILER, Patch, Series, hunk_header_at, touched_paths
from patchkit.upstream import Base

BRANCH = "patchkit/{target}"
BASE_REF = "refs/patchkit/{target}/base"
SERIES_REF = "refs/patchkit/{target}/series"
FULL_CONTEXT = 3

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass
class HunkNote:
    path: str
    header: str
    note: str


@dataclass
class PatchResult:
    """What happened to one patch."""

    name: str
    status: str  # applied | fuzzed | merged | already-applied | failed | skipped
    commit: str | None = None
    fuzzed: list[HunkNote] = field(default_factory=list)
    failure: HunkNote | None = None
    message: str = ""

    def to_json(self) -> dict:
        out = {"name": self.name, "status": self.status, "commit": self.commit}
        if self.fuzzed:
            out["fuzzed_hunks"] = [vars(h) for h in self.fuzzed]
        if self.failure:
            out["failure"] = vars(self.failure)
        if self.message:
            out["message"] = self.message
        return out


@dataclass
class ApplyReport:
    """The outcome of `apply` for one target."""

    target: str
    base: Base
    into: Path | None
    series_version: str
    series_hash: str
    patches: list[PatchResult] = field(default_factory=list)
    result: str | None = None
    status: str = "applied"  # applied | nothing-to-do | failed
    next_step: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "status": self.status,
            "into": str(self.into) if self.into else None,
            "base": {
                "commit": self.base.commit,
                "source": self.base.source,
                "stands_for": self.base.stands_for,
                "upstream_commit": self.base.upstream_commit,
                "release": self.base.release.version if self.base.release else None,
                "sdist_sha256": self.base.sdist_sha256,
                "pinned": self.base.pinned,
            },
            "series": {"version": self.series_version, "hash": self.series_hash},
            "result": self.result,
            "patches": [p.to_json() for p in self.patches],
            "error": self.error,
            "next_step": self.next_step,
        }


@dataclass(frozen=True)
class ApplyOptions:
    fuzz: int = 0
    threeway: bool = False


# --- building commits ------------------------------------------------------------------------


def patch_identity(patch: Patch) -> gitops.Identity:
    """Author and committer from the patch's From/Date headers (reproducible commit ids)."""
    name, addr = email.utils.parseaddr(patch.author)
    when = "0 +0000"
    if patch.date:
        parsed = email.utils.parsedate_to_datetime(patch.date)
        offset = parsed.utcoffset()
        minutes = int(offset.total_seconds() // 60) if offset else 0
        sign = "+" if minutes >= 0 else "-"
        when = f"{int(parsed.timestamp())} {sign}{abs(minutes) // 60:02d}{abs(minutes) % 60:02d}"
    return gitops.Identity(name or addr, addr, when)


def commit_message_for(patch: Patch) -> str:
    """The patch's message with a trailer naming the patch file (kept in the trailer block)."""
    message = patch.message.rstrip("\n")
    separator = "\n" if patch.trailers else "\n\n"
    return f"{message}{separator}{PATCH_FILE_TRAILER}: {patch.name}\n"


def build_series(
    repo: Path,
    base: str,
    series: Series,
    options: ApplyOptions = ApplyOptions(),
    *,
    bare: bool = False,
    progress: Progress = _quiet,
) -> tuple[str, list[PatchResult]]:
    """Apply every patch of `series` onto `base` as commits in `repo`; never touches a work tree.

    Returns the resulting commit and per-patch results; raises ApplyError naming the first
    patch that does not apply (no refs are moved, so nothing is left behind).
    """
    results: list[PatchResult] = []
    tip = base
    # One private index for the whole series: after each commit it already holds the tip's
    # tree, and `git apply` changes nothing when it fails, so no re-read is needed.
    with (
        tempfile.TemporaryDirectory(prefix="patchkit-patches-") as tmp,
        gitops.scratch_index(repo, base, bare=bare) as env,
    ):
        for patch in series.patches:
            progress(f"applying {patch.name}")
            _refuse_symlinked_paths(repo, tip, patch, bare)
            patch_file = Path(tmp) / patch.name
            patch_file.write_bytes(patch.raw)
            result = _apply_one(repo, env, patch, patch_file, options, bare)
            if result.status == "failed":
                results.append(result)
                raise _apply_failure(series, patch, result, results)
            if result.status == "already-applied":
                results.append(result)
                continue
            tree = gitops.write_tree(repo, env, bare=bare)
            tip = gitops.commit_tree(
                repo, tree, tip, commit_message_for(patch), patch_identity(patch), bare=bare
            )
            result.commit = tip
            results.append(result)
    return tip, results


def _refuse_symlinked_paths(repo: Path, tree: str, patch: Patch, bare: bool) -> None:
    """A path at or below a symlink of the tree could write outside it once checked out."""
    links = gitops.symlinks_along(repo, tree, touched_paths(patch), bare=bare)
    if links:
        path, link = sorted(links.items())[0]
        where = "is" if path == link else "goes through"
        raise PatchFormatError(
            f"{patch.name}: {path} {where} a symlink ({link}) in the tree; patches may not "
            "write through symlinks; nothing was written",
            hint="rewrite the patch against the real path the symlink points to",
        )


def _apply_one(
    repo: Path,
    env: dict[str, str],
    patch: Patch,
    patch_file: Path,
    options: ApplyOptions,
    bare: bool,
) -> PatchResult:
    applied, err = gitops.apply_to_index(repo, env, patch_file, bare=bare)
    if applied:
        return PatchResult(patch.name, "applied")
    if gitops.apply_to_index(repo, env, patch_file, reverse=True, check=True, bare=bare)[0]:
        return PatchResult(
            patch.name, "already-applied", message="the base already contains this change"
        )
    if options.fuzz > 0:
        context = max(FULL_CONTEXT - options.fuzz, 0)
        fuzzed = _fuzzed_hunks(repo, env, patch, bare)
        if gitops.apply_to_index(repo, env, patch_file, context=context, bare=bare)[0]:
            return PatchResult(patch.name, "fuzzed", fuzzed=fuzzed)
    if options.threeway:
        merged, merge_err = gitops.apply_to_index(repo, env, patch_file, threeway=True, bare=bare)
        if merged:
            return PatchResult(
                patch.name, "merged", message="applied with a 3-way merge of the recorded blobs"
            )
        err = merge_err or err
    return PatchResult(patch.name, "failed", failure=_locate_failure(patch, err), message=err)


def _fuzzed_hunks(repo: Path, env: dict[str, str], patch: Patch, bare: bool) -> list[HunkNote]:
    """Hunks that do not apply with full context (each checked alone against the same tree)."""
    notes = []
    with tempfile.TemporaryDirectory(prefix="patchkit-hunk-") as tmp:
        for pf in PatchSet(patch.diff):
            header = "\n".join(_file_header_lines(pf))
            for hunk in pf:
                single = Path(tmp) / "hunk.patch"
                single.write_text(f"{header}\n{hunk}", encoding="utf-8")
                if not gitops.apply_to_index(repo, env, single, check=True, bare=bare)[0]:
                    path = pf.path
                    notes.append(HunkNote(path, _hunk_header(hunk), "needed reduced context"))
    return notes


def _file_header_lines(pf) -> list[str]:
    text = str(pf)
    lines = []
    for line in text.splitlines():
        if line.startswith("@@"):
            break
        lines.append(line)
    return lines


def _hunk_header(hunk) -> str:
    return (
        f"@@ -{hunk.source_start},{hunk.source_length} +{hunk.target_start},{hunk.target_length} @@"
    )


_FAIL_RE = re.compile(r"error: patch failed: (.+):(\d+)")
_MISSING_RE = re.compile(r"error: (.+): (does not exist in index|already exists in index)")


def _locate_failure(patch: Patch, err: str) -> HunkNote:
    match = _FAIL_RE.search(err)
    if match:
        path, line = match.group(1), int(match.group(2))
        header = hunk_header_at(patch, path, line) or f"line {line}"
        return HunkNote(path, header, "context does not match the base")
    match = _MISSING_RE.search(err)
    if match:
        return HunkNote(match.group(1), "-", match.group(2).replace(" in index", " in the base"))
    first = next((ln for ln in err.splitlines() if ln.strip()), "git apply failed")
    return HunkNote("-", "-", first.removeprefix("error: "))


def _apply_failure(
    series: Series, patch: Patch, result: PatchResult, results: list[PatchResult]
) -> ApplyError:
    where = result.failure
    message = f"{patch.name} does not apply"
    if where and where.path != "-":
        message += f": {where.path} {where.header}: {where.note}"
    elif where:
        message += f": {where.note}"
    error = ApplyError(
        message,
        hint=(
            f"retry with --3way (3-way merge on the recorded blobs) or --fuzz 1, or refresh the "
            f"patch: `patchkit rebase --target {series.target}@<ref>`"
        ),
    )
    error.results = results  # type: ignore[attr-defined]
    return error


# --- publishing into a directory -------------------------------------------------------------


def apply_series(
    mirror: Path,
    base: Base,
    series: Series,
    into: Path,
    *,
    series_version: str,
    options: ApplyOptions = ApplyOptions(),
    progress: Progress = _quiet,
) -> ApplyReport:
    """Apply `series` onto `base` and make `into` a checkout of the result, atomically."""
    report = ApplyReport(series.target, base, into, series_version, series.hash())
    lock = into.parent / f".{into.name}.patchkit.lock"
    with locked(lock, f"the work tree {into}"):
        _sweep_scratch(into)
        _recover_interrupted(into)
        state = _target_state(into)
        if state == "repo":
            dirty = gitops.dirty_files(into)
            if dirty:
                shown = ", ".join(dirty[:3]) + (" ..." if len(dirty) > 3 else "")
                raise DirtyTreeError(
                    f"{into} has uncommitted changes to tracked files ({shown}); "
                    "nothing was touched",
                    hint="commit or stash them, then run again",
                )
        try:
            result, results = build_series(
                mirror, base.commit, series, options, bare=True, progress=progress
            )
        except ApplyError as exc:
            report.patches = getattr(exc, "results", [])
            report.status = "failed"
            report.error = exc.message
            report.next_step = exc.hint
            exc.report = report  # type: ignore[attr-defined]
            raise
        report.patches = results
        report.result = result
        if state == "repo" and gitops.head(into) == result:
            report.status = "nothing-to-do"
            for r in report.patches:
                if r.status == "applied":
                    r.status = "present"
            exc = NothingToDo(
                f"{into} already carries the {series.target} series "
                f"{series_version} ({result[:12]}); nothing to do"
            )
            exc.report = report  # type: ignore[attr-defined]
            raise exc
        if state == "repo":
            _publish_existing(mirror, into, series.target, base, result)
        else:
            _publish_new(mirror, into, series.target, base, result)
    return report


def _target_state(into: Path) -> str:
    if into.is_symlink():
        raise UsageError(f"{into} is a symlink; pass the real directory")
    if not into.exists():
        return "new"
    if not into.is_dir():
        raise UsageError(f"{into} exists and is not a directory")
    if gitops.is_repository(into):
        return "repo"
    if any(into.iterdir()):
        raise UsageError(
            f"{into} is a non-empty directory that is not a git checkout; "
            "pass an empty or new directory"
        )
    return "empty"


def _publish_new(mirror: Path, into: Path, target: str, base: Base, result: str) -> None:
    into.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=into.parent, prefix=f".{into.name}.patchkit-"))
    try:
        clone = scratch / "tree"
        gitops.clone_local(mirror, clone, [result, base.commit])
        _record_refs(clone, target, base, result)
        gitops.checkout_branch(clone, BRANCH.format(target=target), result)
        if into.exists():
            into.rmdir()  # empty: checked by _target_state
        os.replace(clone, into)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _publish_existing(mirror: Path, into: Path, target: str, base: Base, result: str) -> None:
    gitops.fetch_commit_from(into, mirror, result)
    previous = {ref: sha for ref, sha in gitops.refs(into, f"refs/patchkit/{target}/").items()}
    journal = {
        "pid": os.getpid(),
        "target": target,
        "result": result,
        "branch": gitops.current_branch(into),
        "head": gitops.head(into),
        "refs": {
            ref.format(target=target): previous.get(ref.format(target=target))
            for ref in (BASE_REF, SERIES_REF)
        },
    }
    _write_journal(into, journal)
    try:
        _keep_previous_branch(into, target, result)
        _record_refs(into, target, base, result)
        gitops.checkout_branch(into, BRANCH.format(target=target), result)
    except gitops.GitError as exc:
        _restore_refs(into, journal)  # git refused before it touched a file
        raise ApplyError(
            f"cannot check out the result in {into}: {exc.stderr.strip().splitlines()[0]}",
            hint="move the files git names out of the way, then run again",
        ) from None
    except BaseException:
        _roll_back(into, journal)  # an interrupt mid-checkout: put the checkout back as it was
        raise
    _journal_path(into).unlink()


def _keep_previous_branch(repo: Path, target: str, result: str) -> None:
    """A patchkit branch that moved on (user commits) is kept under a new name, never dropped."""
    branch = BRANCH.format(target=target)
    tip = gitops.resolve(repo, f"refs/heads/{branch}")
    if tip and tip != result:
        gitops.update_ref(repo, f"refs/heads/{branch}-{tip[:12]}", tip)


def _record_refs(repo: Path, target: str, base: Base, result: str) -> None:
    gitops.update_ref(repo, BASE_REF.format(target=target), base.commit)
    gitops.update_ref(repo, SERIES_REF.format(target=target), result)


# --- interruption: scratch sweep and the publish journal ------------------------------------
# Only the holder of the target lock creates scratch directories or a journal beside `into`,
# so whatever the next holder finds there was left by a process that died (SIGKILL, power).


def _journal_path(into: Path) -> Path:
    return into.parent / f".{into.name}.patchkit.journal"


def _sweep_scratch(into: Path) -> None:
    """Remove scratch clones a killed `apply` left beside `into`."""
    if not into.parent.is_dir():
        return
    for stale in into.parent.glob(f".{into.name}.patchkit-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _write_journal(into: Path, journal: dict) -> None:
    path = _journal_path(into)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(journal, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _recover_interrupted(into: Path) -> None:
    """Finish the roll-back of a publish that was killed before it could clean up."""
    path = _journal_path(into)
    path.with_name(path.name + ".tmp").unlink(missing_ok=True)
    if not path.exists():
        return
    try:
        journal = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        journal = None  # torn before the rename cannot happen; unreadable means hand-edited
    if not journal or not gitops.is_repository(into):
        path.unlink()
        return
    _roll_back(into, journal)


def _roll_back(into: Path, journal: dict) -> None:
    """Put `into` back on the branch, commit and patchkit refs the journal recorded.

    Tracked files were clean when the publish began (checked), so forcing them back loses
    nothing; of the untracked files, only those the interrupted checkout wrote (the result's
    bytes at a path the result adds) are removed.
    """
    git_dir = into / ".git"
    if git_dir.is_dir():
        for lock in gitops.stale_lock_files(git_dir):
            lock.unlink(missing_ok=True)
    if journal.get("head"):
        gitops.force_checkout(into, journal["head"], journal.get("branch"))
        for path in gitops.files_written_by_checkout(into, journal["head"], journal["result"]):
            (into / path).unlink()
    _restore_refs(into, journal)


def _restore_refs(into: Path, journal: dict) -> None:
    for name, sha in journal.get("refs", {}).items():
        if sha:
            gitops.update_ref(into, name, sha)
        else:
            gitops.delete_ref(into, name)
    _journal_path(into).unlink(missing_ok=True)
