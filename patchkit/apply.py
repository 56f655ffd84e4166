"""Transactional application of a series: build the commits off to the side, then publish.

Commits are made with `git apply --cached` into a private index on the mirror, with identities
and dates taken from each patch, so the same base and series always give the same commit ids.
Only when every patch applied is the work tree touched: a new directory appears by rename, an
existing checkout moves to the result with one `git checkout` (which refuses to clobber files).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shlex
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from unidiff import PatchSet

from patchkit import gitops, ui
from patchkit.errors import (
    ApplyError,
    DirtyTreeError,
    Interrupted,
    NothingToDo,
    PatchFormatError,
    UsageError,
)
from patchkit.files import leftovers, replace_file
from patchkit.locks import locked
from patchkit.scratch import folder_beside, temporary_folder
from patchkit.series import (
    PATCH_FILE_TRAILER,
    Patch,
    Series,
    hunk_header_at,
    parse_author,
    parse_date,
    touched_paths,
)
from patchkit.stamps import Stamp, module_files, series_key
from patchkit.upstream import Base
from patchkit.upstream.mirror import first_line

BRANCH = "patchkit/{target}"
BASE_REF = "refs/patchkit/{target}/base"
SERIES_REF = "refs/patchkit/{target}/series"
FULL_CONTEXT = 3


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
    tree: str | None = None  # the commit's tree (not reported: what a build record keeps)
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
    series_size: int = 0  # patches in the series (a failed apply reports only those it reached)
    next_step: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "status": self.status,
            "series_size": self.series_size,
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
    name, addr = parse_author(patch.author)
    when = "0 +0000"
    if patch.date:
        parsed = parse_date(patch.date)
        if parsed is None:  # parse_patch refuses these; a Patch made elsewhere may not
            raise PatchFormatError(f"{patch.name}: Date header '{patch.date}' is not a date")
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
    repo: gitops.Repo,
    base: str,
    series: Series,
    options: ApplyOptions = ApplyOptions(),
) -> tuple[str, list[PatchResult]]:
    """Apply every patch of `series` onto `base` as commits in `repo`; never touches a work tree.

    Returns the resulting commit and per-patch results; raises ApplyError naming the first
    patch that does not apply (no refs are moved, so nothing is left behind).

    A run of patches whose paths do not meet (no path of one is a path, or a folder above a
    path, of another) is applied by one `git apply --cached`: each patch of such a run reads
    and writes only its own paths, so one apply of all gives every path the bytes one apply
    after the other would. The trees between are computed from the index's entries
    (`gitops.TreeModel`); the last one must equal git's `write-tree`, else the run is built
    patch by patch. A run that does not apply as a whole is built patch by patch too (git
    applies none of it), which finds the failing patch and its already-applied, fuzz and
    3-way outcomes exactly as before.
    """
    results: list[PatchResult] = []
    tree = base  # the tree-ish the next patch applies to (the scratch index holds it)
    links = _symlinks_of_series(repo, base, series)
    # The commits are written together once the trees are: (result, tree, message, identity).
    pending: list[tuple[PatchResult, str, str, gitops.Identity]] = []
    runs = RunTrees(repo)
    # One private index for the whole series: after each commit it already holds the tip's
    # tree, and `git apply` changes nothing when it fails, so no re-read is needed.
    with (
        temporary_folder("patches-") as tmp,
        gitops.scratch_index(repo, base) as env,
    ):
        for run in (
            disjoint_runs(series.patches) if links is not None else [[p] for p in series.patches]
        ):
            files = []
            for patch in run:
                ui.progress(f"applying {patch.name}")
                _refuse_symlinked_paths(
                    patch, links if links is not None else _symlinks_at(repo, tree, patch)
                )
                patch_file = Path(tmp) / patch.name
                patch_file.write_bytes(patch.raw)
                files.append(patch_file)
            trees = runs.apply(env, tree, run, files)
            if trees is not None:
                runs.accept()
                for patch, run_tree in zip(run, trees, strict=True):
                    result = PatchResult(patch.name, "applied")
                    pending.append(
                        (result, run_tree, commit_message_for(patch), patch_identity(patch))
                    )
                    results.append(result)
                tree = trees[-1]
                continue
            for patch, patch_file in zip(run, files, strict=True):
                result = _apply_one(repo, env, patch, patch_file, options)
                if result.status == "failed":
                    results.append(result)
                    _write_commits(repo, base, pending, runs)  # the report names them
                    raise _apply_failure(series, patch, result, results)
                if result.status == "already-applied":
                    results.append(result)
                    continue
                tree = gitops.write_tree(repo, env)
                pending.append((result, tree, commit_message_for(patch), patch_identity(patch)))
                results.append(result)
    return _write_commits(repo, base, pending, runs), results


def disjoint_runs(patches: list[Patch]) -> list[list[Patch]]:
    """The series cut into runs of consecutive patches whose paths do not meet: no path of
    one patch is a path of another patch of the run, or a folder above one."""
    runs: list[list[Patch]] = []
    paths: set[str] = set()
    folders: set[str] = set()
    for patch in patches:
        mine = touched_paths(patch)
        above = {p.rsplit("/", i)[0] for p in mine for i in range(1, p.count("/") + 1)}
        if not runs or any(p in paths or p in folders for p in mine) or above & paths:
            runs.append([])
            paths, folders = set(), set()
        runs[-1].append(patch)
        paths.update(mine)
        folders.update(above)
    return runs


class RunTrees:
    """Runs of patches whose paths do not meet, each applied by one `git apply --cached`
    (see build_series): the trees between computed from the index's entries by a
    `gitops.TreeModel`, the last checked against git's `write-tree`. The computed tree
    objects are written, by one `gitops.write_objects`, when `write` is called."""

    def __init__(self, repo: gitops.Repo) -> None:
        self.repo = repo
        self.model: tuple[str, gitops.TreeModel] | None = None  # (the tree it holds, model)
        self.computed: dict[str, bytes] = {}  # of the last run applied, until accepted
        self.accepted: dict[str, bytes] = {}

    def apply(
        self, env: dict[str, str], start: str, run: list[Patch], files: list[Path]
    ) -> list[str] | None:
        """Apply `run` as a whole to the scratch index (holding `start`); the tree after each
        of its patches, or None with the index holding `start` (a run of one patch, one whose
        file sections git reads otherwise than patchkit, one that does not apply as a whole,
        or a model that disagrees with git)."""
        self.computed = {}
        if len(run) < 2:
            return None
        # The run's premise, that no patch writes a path of another, rests on each patch's
        # paths: git must read the same file sections, in the same order, as patchkit did.
        ours = [change.path for patch in run for change in patch.files]
        if gitops.patch_file_paths(self.repo, files) != ours:
            return None
        if not gitops.apply_all_to_index(self.repo, env, files):
            return None
        if self.model is None or self.model[0] != start:
            self.model = (start, gitops.TreeModel.read(self.repo, start))
        touched = [touched_paths(patch) for patch in run]
        wanted = sorted({p for paths in touched for p in paths})
        entries = gitops.index_entries(self.repo, env, wanted)
        final = gitops.write_tree(self.repo, env)
        trees: list[str] = []
        for paths in touched if entries is not None else []:
            root, bodies, ids = self.model[1].change({p: entries.get(p) for p in paths})
            trees.append(root)
            self.computed.update(zip(ids, bodies, strict=True))
        if not trees or trees[-1] != final:
            self.model, self.computed = None, {}
            gitops.read_tree_into(self.repo, env, start)
            return None
        self.model = (final, self.model[1])
        return trees

    def accept(self) -> None:
        """Keep the trees of the last run applied (they are written by `write`)."""
        self.accepted.update(self.computed)
        self.computed = {}

    def write(self) -> None:
        trees = self.accepted
        gitops.write_objects(self.repo, "tree", list(trees.values()), list(trees))
        self.accepted = {}


def _write_commits(
    repo: gitops.Repo,
    base: str,
    pending: list[tuple[PatchResult, str, str, gitops.Identity]],
    runs: RunTrees,
) -> str:
    """Write the trees computed for the series, then its commits (one chain on `base`);
    record each commit in its result; return the tip."""
    runs.write()
    ids = gitops.commit_chain(repo, base, [(t, m, who) for _, t, m, who in pending])
    for (result, tree, *_), commit in zip(pending, ids, strict=True):
        result.commit, result.tree = commit, tree
    return ids[-1] if ids else base


def _symlinks_of_series(repo: gitops.Repo, base: str, series: Series) -> dict[str, str] | None:
    """path -> the symlink at or above it in `base`, for every path the series touches, read
    by one `ls-tree`. It holds for every tip the series builds: no patch may create a
    symlink (series.parse_patch) and one touching a symlink is refused before it applies,
    so no patch adds or removes one. None (check each tip) when a patch names the symlink
    mode at all."""
    if any(_SYMLINK_MODE_RE.search(patch.diff) for patch in series.patches):
        return None
    paths = sorted({path for patch in series.patches for path in touched_paths(patch)})
    return gitops.symlinks_along(repo, base, paths)


_SYMLINK_MODE_RE = re.compile(r"^(?:.* )?(?:mode|index \S+) 120000$", re.M)


def _symlinks_at(repo: gitops.Repo, tree: str, patch: Patch) -> dict[str, str]:
    return gitops.symlinks_along(repo, tree, touched_paths(patch))


def _refuse_symlinked_paths(patch: Patch, series_links: dict[str, str]) -> None:
    """A path at or below a symlink of the tree could write outside it once checked out."""
    links = {p: series_links[p] for p in touched_paths(patch) if p in series_links}
    if links:
        path, link = sorted(links.items())[0]
        where = "is" if path == link else "goes through"
        raise PatchFormatError(
            f"{patch.name}: {path} {where} a symlink ({link}) in the tree; patches may not "
            "write through symlinks; nothing was written",
            hint="rewrite the patch against the real path the symlink points to",
        )


def _apply_one(
    repo: gitops.Repo,
    env: dict[str, str],
    patch: Patch,
    patch_file: Path,
    options: ApplyOptions,
) -> PatchResult:
    applied, err = gitops.apply_to_index(repo, env, patch_file)
    if applied:
        return PatchResult(patch.name, "applied")
    if gitops.apply_to_index(repo, env, patch_file, reverse=True, check=True)[0]:
        return PatchResult(
            patch.name, "already-applied", message="the base already contains this change"
        )
    if options.fuzz > 0:
        context = max(FULL_CONTEXT - options.fuzz, 0)
        fuzzed = _fuzzed_hunks(repo, env, patch)
        if gitops.apply_to_index(repo, env, patch_file, context=context)[0]:
            return PatchResult(patch.name, "fuzzed", fuzzed=fuzzed)
    if options.threeway:
        merged, merge_err = gitops.apply_to_index(repo, env, patch_file, threeway=True)
        if merged:
            return PatchResult(
                patch.name, "merged", message="applied with a 3-way merge of the recorded blobs"
            )
        err = merge_err or err
    return PatchResult(patch.name, "failed", failure=_locate_failure(patch, err), message=err)


def _fuzzed_hunks(repo: gitops.Repo, env: dict[str, str], patch: Patch) -> list[HunkNote]:
    """Hunks that do not apply with full context (each checked alone against the same tree)."""
    notes = []
    with temporary_folder("hunk-") as tmp:
        for pf in PatchSet(patch.diff):
            header = "\n".join(_file_header_lines(pf))
            for hunk in pf:
                single = Path(tmp) / "hunk.patch"
                single.write_text(f"{header}\n{hunk}", encoding="utf-8")
                if not gitops.apply_to_index(repo, env, single, check=True)[0]:
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
    mirror: gitops.Repo,
    base: Base,
    series: Series,
    into: Path,
    *,
    series_version: str,
    options: ApplyOptions = ApplyOptions(),
    verified: Path | None = None,
) -> ApplyReport:
    """Apply `series` onto `base` and make `into` a checkout of the result, atomically.

    With `verified` (a folder of the cache), the series' build is recorded there and an
    unchanged series on the same base is read from that record (`BuildRecord`)."""
    checkout = gitops.Repo.checkout(into)
    report = ApplyReport(series.target, base, into, series_version, series.hash())
    report.series_size = len(series.names)
    lock = into.parent / f".{into.name}.patchkit.lock"
    with locked(lock, f"the work tree {into}"):
        _sweep_scratch(into)
        recovered = _recover_interrupted(checkout)
        if recovered:
            ui.progress(recovered)
        state = _target_state(checkout)
        if state == "repo":
            _refuse_unsafe_checkout(checkout)
            result = _build(mirror, base, series, options, report, verified)
            if gitops.head(checkout) == result:
                _nothing_to_do(report, series, series_version, into, result)
            _publish_existing(mirror, checkout, series.target, base, result)
        else:
            result = _build(mirror, base, series, options, report, verified)
            _publish_new(mirror, into, series.target, base, result)
    return report


def _build(
    mirror: gitops.Repo,
    base: Base,
    series: Series,
    options: ApplyOptions,
    report: ApplyReport,
    verified: Path | None,
) -> str:
    record = BuildRecord.of(verified, series, base.commit, options) if verified else None
    recalled = record.recall(mirror, base.commit, series) if record else None
    if recalled is not None:
        report.patches = recalled
        report.result = recalled[-1].commit if recalled else base.commit
        return report.result
    try:
        result, results = build_series(mirror, base.commit, series, options)
    except ApplyError as exc:
        exc.hint = _refresh_hint(base, series)
        report.patches = getattr(exc, "results", [])
        report.status = "failed"
        report.error = exc.message
        report.next_step = exc.hint
        exc.report = report  # type: ignore[attr-defined]
        raise
    if record is not None:
        record.remember(base.commit, series, results)
    report.patches = results
    report.result = result
    return result


def _refresh_hint(base: Base, series: Series) -> str:
    """The next step after a patch failed on `base`, with the ref and line spelled out."""
    ref = base.release.version if base.release else (base.upstream_commit or base.commit)[:12]
    line = f" --line {shlex.quote(series.directory.name)}" if series.directory.name else ""
    return (
        "retry with --3way (3-way merge on the recorded blobs) or --fuzz 1, or carry the "
        f"series onto it: `patchkit rebase --target {base.target}@{ref}{line}`"
    )


# The modules whose code decides which commits a series build writes.
BUILD_MODULES = ("patchkit.apply", "patchkit.gitops", "patchkit.series", "unidiff.patch")


@dataclass(frozen=True)
class BuildRecord:
    """The trees and commits a build of this series on this base wrote, kept so that the
    next build of the same inputs reads them instead of applying every patch again.

    The key (`stamps.series_key`) covers what the commits' bytes depend on: the base commit,
    each patch's name and bytes, the build's options, the code of `BUILD_MODULES`, the Python
    version and the git program. Only a build in which every patch applied as it stands is
    recorded (no fuzz, no 3-way merge, none already applied), with identities written as
    they stand. A record is used only when each commit is the one this build writes for its
    patch over the recorded tree (its id recomputed from the patch's message and identity,
    the tree and its parent: `gitops.chain_objects`) and the chain is in the mirror with
    every object (`gitops.chain_present`); else the series is built. What is taken on trust
    is the trees, as the build wrote them into the same cache. One file per target and base
    (`<cache>/verified/build-<target>-<base>`) holds the last build.
    """

    stamp: Stamp

    @classmethod
    def of(cls, verified: Path, series: Series, base: str, options: ApplyOptions) -> BuildRecord:
        key = series_key(
            "build 1",
            base,
            series.patches,
            module_files(BUILD_MODULES),
            gitops.program_identity(),
            f"fuzz={options.fuzz} threeway={options.threeway}",
        )
        return cls(Stamp(verified / f"build-{series.target}-{base}", key))

    def recall(self, repo: gitops.Repo, base: str, series: Series) -> list[PatchResult] | None:
        payload = self.stamp.payload()
        if payload is None:
            return None
        try:
            built = json.loads(payload)["built"]
            trees = [tree for tree, _ in built]
            commits = [commit for _, commit in built]
        except (ValueError, KeyError, TypeError):
            return None
        if not (
            len(built) == len(series.patches)
            and all(isinstance(i, str) and gitops.HEX_ID_RE.fullmatch(i) for i in trees + commits)
        ):
            return None
        chain = gitops.chain_objects(base, _commit_specs(series.patches, trees))
        if chain is None or [oid for oid, _ in chain] != commits:
            return None
        if not gitops.chain_present(repo, base, commits):
            return None
        return [
            PatchResult(p.name, "applied", commit=c, tree=t)
            for p, c, t in zip(series.patches, commits, trees, strict=True)
        ]

    def remember(self, base: str, series: Series, results: list[PatchResult]) -> None:
        """Record a build in which every patch applied as it stands (else nothing)."""
        if len(results) != len(series.patches) or not all(
            r.status == "applied" and r.commit and r.tree for r in results
        ):
            return
        trees = [str(r.tree) for r in results]
        chain = gitops.chain_objects(base, _commit_specs(series.patches, trees))
        if chain is None or [oid for oid, _ in chain] != [r.commit for r in results]:
            return  # identities commit-tree rewrites: the record could not be checked
        self.stamp.record(json.dumps({"built": [[r.tree, r.commit] for r in results]}))


def _commit_specs(patches: list[Patch], trees: list[str]) -> list[tuple[str, str, gitops.Identity]]:
    return [
        (tree, commit_message_for(p), patch_identity(p))
        for p, tree in zip(patches, trees, strict=True)
    ]


def _nothing_to_do(
    report: ApplyReport, series: Series, series_version: str, into: Path, result: str
) -> None:
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


def _target_state(checkout: gitops.Repo) -> str:
    into = checkout.path
    if into.is_symlink():
        raise UsageError(f"{into} is a symlink; pass the real directory")
    if not into.exists():
        return "new"
    if not into.is_dir():
        raise UsageError(f"{into} exists and is not a directory")
    if gitops.is_repository(checkout):
        return "repo"
    if any(into.iterdir()):
        raise UsageError(
            f"{into} is a non-empty directory that is not a git checkout; "
            "pass an empty or new directory"
        )
    if os.path.ismount(into):  # the checkout is renamed into place: a mount point cannot be
        raise UsageError(
            f"{into} is a mount point; pass a new directory inside it",
            hint=f"e.g. --into {into / 'tree'}",
        )
    return "empty"


def _publish_new(mirror: gitops.Repo, into: Path, target: str, base: Base, result: str) -> None:
    into.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(folder_beside(into, "patchkit"))
    try:
        clone = scratch / "tree"
        refs = _patchkit_refs(target, base, result)
        branch = BRANCH.format(target=target)
        try:
            gitops.clone_checked_out(
                mirror, clone, [result, base.commit], refs, branch, result, base=base.commit
            )
        except gitops.DamagedObjectError as exc:
            raise ApplyError(
                f"cannot make the checkout {into}: the {target} mirror is damaged: {exc}; "
                "nothing was written there",
                hint=f"remove {exc.path} and run again (the series' build writes it again)",
            ) from None
        except gitops.GitError as exc:
            raise ApplyError(
                f"cannot make the checkout {into}: {first_line(exc.stderr) or exc}; "
                "nothing was written there",
                hint=f"free space or fix what git names; if it names an object, remove "
                f"{mirror.path} and run again",
            ) from None
        if into.exists():  # an empty directory (checked by _target_state): its mode and group
            st = into.stat()  # stay, and rename() replaces it in one step
            os.chmod(clone, stat.S_IMODE(st.st_mode))
            with contextlib.suppress(OSError):
                os.chown(clone, -1, st.st_gid)
        os.replace(clone, into)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _refuse_unsafe_checkout(checkout: gitops.Repo) -> None:
    """Refuse a checkout that moving to the result could damage; name what is in the way."""
    into = checkout.path
    operation = gitops.operation_in_progress(checkout)
    if operation:
        what, marker, finish = operation
        raise DirtyTreeError(
            f"{into} has a {what} in progress ({marker}); nothing was touched",
            hint=f"finish it or abort it ({finish}), then run again",
        )
    dirty = gitops.dirty_files(checkout)
    if dirty:
        shown = ", ".join(dirty[:3]) + (" ..." if len(dirty) > 3 else "")
        raise DirtyTreeError(
            f"{into} has uncommitted changes to tracked files ({shown}); nothing was touched",
            hint="commit or stash them, then run again",
        )
    head = gitops.head(checkout)
    orphan = head and not gitops.current_branch(checkout)
    if orphan and not gitops.contained_in_refs(checkout, head):
        raise DirtyTreeError(
            f"{into} has a detached HEAD at {head[:12]}, which no branch or tag contains; "
            "checking out the result would orphan its commits; nothing was touched",
            hint=f"keep them on a branch (`git -C {shlex.quote(str(into))} branch NAME "
            f"{head[:12]}`), then run again",
        )


def _refuse_files_in_the_way(checkout: gitops.Repo, mirror: gitops.Repo, result: str) -> None:
    """git checkout overwrites ignored files silently: refuse, naming them."""
    into = checkout.path
    blocked = gitops.untracked_in_the_way(checkout, mirror, result)
    if blocked:
        shown = ", ".join(blocked[:5]) + (
            f" and {len(blocked) - 5} more" if len(blocked) > 5 else ""
        )
        raise DirtyTreeError(
            f"{into}: untracked or ignored files are where the series puts its files ({shown}); "
            "git would overwrite them; nothing was touched",
            hint="move them out of the way, then run again",
        )


def _publish_existing(
    mirror: gitops.Repo, checkout: gitops.Repo, target: str, base: Base, result: str
) -> None:
    into = checkout.path
    _refuse_files_in_the_way(checkout, mirror, result)
    gitops.fetch_commit_from(checkout, mirror, result)
    head = gitops.head(checkout)
    previous = {ref: sha for ref, sha in gitops.refs(checkout, f"refs/patchkit/{target}/").items()}
    journal = {
        "pid": os.getpid(),
        "target": target,
        "result": result,
        "result_branch": BRANCH.format(target=target),
        "branch": gitops.current_branch(checkout),
        "head": head,
        "git_dir": _git_dir_identity(checkout),
        "refs": {
            ref.format(target=target): previous.get(ref.format(target=target))
            for ref in (BASE_REF, SERIES_REF)
        },
    }
    _write_journal(into, journal)
    try:
        _keep_previous_branch(checkout, target, result)
        _record_refs(checkout, target, base, result)
        gitops.checkout_branch(checkout, BRANCH.format(target=target), result)
    except gitops.GitError as exc:
        _restore_refs(checkout, journal)  # git refused before it touched a file
        if isinstance(exc, gitops.GitLockError):
            raise ApplyError(exc.message, hint=exc.hint) from None
        raise ApplyError(
            f"cannot check out the result in {into}: {exc.stderr.strip().splitlines()[0]}",
            hint="move the files git names out of the way, then run again",
        ) from None
    except BaseException as exc:
        # An interrupt (or a failure) mid-checkout: git was stopped; put the checkout back.
        _put_back_after(exc, checkout, journal)
        raise
    _journal_path(into).unlink()


def _put_back_after(exc: BaseException, checkout: gitops.Repo, journal: dict) -> None:
    """Undo an unfinished publish in-process; an interrupt then says exactly what was left."""
    into = checkout.path
    where = _describe_head(journal)
    try:
        state, _ = _recover(checkout, journal)
    except BaseException:
        if not isinstance(exc, KeyboardInterrupt):
            return  # the original failure is the one to report; the journal stays
        raise Interrupted(
            f"the checkout of {into} stopped part-way and could not be put back; the journal "
            f"{_journal_path(into)} is kept: the next `patchkit apply` puts it back at "
            f"{where} if nothing changed there"
        ) from None
    if isinstance(exc, KeyboardInterrupt) and state == "finished":  # git had done it all
        raise Interrupted(
            f"interrupted as the checkout finished: {into} is at {journal['result'][:12]} "
            f"on branch {journal.get('result_branch')}; nothing was left half-done"
        ) from None
    if isinstance(exc, KeyboardInterrupt):
        raise Interrupted(f"{into} was put back at {where}; nothing was left half-done") from None


def _keep_previous_branch(checkout: gitops.Repo, target: str, result: str) -> None:
    """A patchkit branch that moved on (user commits) is kept under a new name, never dropped."""
    branch = BRANCH.format(target=target)
    tip = gitops.resolve(checkout, f"refs/heads/{branch}")
    if tip and tip != result:
        gitops.update_ref(checkout, f"refs/heads/{branch}-{tip[:12]}", tip)


def _record_refs(checkout: gitops.Repo, target: str, base: Base, result: str) -> None:
    gitops.update_refs(checkout, _patchkit_refs(target, base, result))


def _patchkit_refs(target: str, base: Base, result: str) -> dict[str, str]:
    return {BASE_REF.format(target=target): base.commit, SERIES_REF.format(target=target): result}


# --- interruption: scratch sweep and the publish journal ------------------------------------
# Only the holder of the target lock creates scratch directories or a journal beside `into`,
# so whatever the next holder finds there was left by a process that died (SIGKILL, power).


def _journal_path(into: Path) -> Path:
    return into.parent / f".{into.name}.patchkit.journal"


def _sweep_scratch(into: Path) -> None:
    """Remove scratch clones a killed `apply` left beside `into`."""
    if not into.parent.is_dir():
        return
    for stale in into.parent.glob(f".{glob.escape(into.name)}.patchkit-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _write_journal(into: Path, journal: dict) -> None:
    replace_file(_journal_path(into), json.dumps(journal).encode("utf-8"), durable=True)


def _git_dir_identity(checkout: gitops.Repo) -> list[int] | None:
    """Which repository the checkout is (device and inode of its git directory): a checkout
    that was removed and made again is another one."""
    try:
        st = os.stat(checkout.git_dir())
    except (OSError, gitops.GitError):
        return None
    return [st.st_dev, st.st_ino]


def _describe_head(journal: dict) -> str:
    head = (journal.get("head") or "?")[:12]
    branch = journal.get("branch")
    if not journal.get("head") and branch:
        return f"no commit yet on branch {branch}"
    return f"{head} on branch {branch}" if branch else f"{head} (detached)"


def _recover_interrupted(checkout: gitops.Repo) -> str | None:
    """Finish the roll-back of a publish that was killed before it could clean up.

    Acts only when the checkout is exactly as the killed run left it; otherwise refuses,
    naming what changed, and keeps the journal. Returns a line saying what it did, if any.
    """
    into = checkout.path
    path = _journal_path(into)
    for stale in leftovers(path):  # a journal write that was killed
        stale.unlink(missing_ok=True)
    if not path.exists():
        return None
    try:
        journal = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(journal, dict) or not isinstance(journal.get("result"), str):
            raise ValueError("not a journal")
    except (OSError, ValueError):
        raise ApplyError(
            f"{path} is not a journal patchkit can read (it writes them whole, then renames); "
            f"nothing was touched",
            hint=f"check {into}, then remove {path} and run again",
        ) from None
    head = journal.get("head")
    if (
        not gitops.is_repository(checkout)
        or _git_dir_identity(checkout) != journal.get("git_dir")
        or (head and not gitops.has_commit(checkout, head))
    ):
        path.unlink()  # the checkout it describes is gone: nothing to put back
        return f"removed {path.name}: the checkout it described no longer exists"
    return _recover(checkout, journal)[1]


def _recover(checkout: gitops.Repo, journal: dict) -> tuple[str, str]:
    """Undo (or, when it had finished, complete) the publish the journal describes: the
    state found ("finished", or what was put back) and a line saying what was done."""
    into = checkout.path
    state, changed = gitops.interrupted_checkout_state(
        checkout,
        journal.get("head"),
        journal.get("branch"),
        journal["result"],
        journal.get("result_branch") or "",
    )
    git_dir = checkout.git_dir()
    if state == "changed":
        shown = "; ".join(changed[:4]) + (
            f"; and {len(changed) - 4} more" if len(changed) > 4 else ""
        )
        undo = _undo_by_hand(into, journal)
        lock = git_dir / "index.lock"
        killed_git = ""
        if lock.exists():  # git's own checkout refuses to run while it is there
            killed_git = (
                f"; git's lock file {lock} is still there: the git the interrupted apply ran "
                "was killed, perhaps as it wrote the files named"
            )
            undo = f"if no git process is running there, remove {lock}; then {undo}"
        raise ApplyError(
            f"an interrupted apply left {into} part-way to {journal['result'][:12]}, and it "
            f"changed since ({shown}){killed_git}; patchkit will not guess, nothing was touched",
            hint=f"{undo}; when the checkout is as you want it, "
            f"remove {_journal_path(into)} and run again",
        )
    locks = [p for p in gitops.stale_lock_files(checkout) if p.name.endswith(".lock")]
    gitops.remove_leftovers(locks)
    if state == "finished":
        _journal_path(into).unlink(missing_ok=True)
        return state, f"the interrupted apply of {into} had finished; its journal was removed"
    head = journal.get("head")
    if head or journal.get("branch"):
        start = head or gitops.empty_tree(checkout)  # no head: an unborn branch
        written = gitops.files_written_by_checkout(checkout, start, journal["result"])
        if head:
            gitops.force_checkout(checkout, head, journal.get("branch"))
        else:
            gitops.unborn_checkout(checkout, journal["branch"])
        for rel in written:
            (into / rel).unlink(missing_ok=True)
    _restore_refs(checkout, journal)
    return (
        state,
        f"put {into} back at {_describe_head(journal)}, where an interrupted apply left it",
    )


def _undo_by_hand(into: Path, journal: dict) -> str:
    git = f"git -C {shlex.quote(str(into))}"
    if journal.get("head"):
        head = journal["head"][:12]
        return f"to undo the interrupted apply by hand: `{git} checkout --force {head}`"
    return (
        f"the checkout had no commit yet (branch {journal.get('branch')}): to undo the "
        f"interrupted apply by hand, `{git} read-tree --empty` and remove the files it wrote"
    )


def _restore_refs(checkout: gitops.Repo, journal: dict) -> None:
    into = checkout.path
    for name, sha in journal.get("refs", {}).items():
        if sha:
            gitops.update_ref(checkout, name, sha)
        else:
            gitops.delete_ref(checkout, name)
    _journal_path(into).unlink(missing_ok=True)
