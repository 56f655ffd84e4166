"""Deterministic export: commits of a work tree -> the series' patch files, byte for byte.

The bytes are those of `git format-patch --keep-subject --no-stat --no-signature --zero-commit
--full-index` (Electron's export), split per commit, with the `Patchkit-Patch:` trailer that
`apply` adds removed again and used as the file name (fallback: a slug of the subject).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import gitops
from patchkit.apply import BASE_REF, SERIES_REF
from patchkit.errors import (
    Interrupted,
    PatchFormatError,
    PatchkitError,
    SeriesChangedError,
    UsageError,
)
from patchkit.files import TMP_MARK, digest, replace_file
from patchkit.locks import locked
from patchkit.project import Project, cache_root
from patchkit.series import (
    PATCH_FILE_TRAILER,
    PATCH_NAME_RE,
    decode_header,
    parse_patch,
    read_series_file,
)

# format-patch --zero-commit starts every message with this line.
_FROM_RE = re.compile(rb"^From 0{40} Mon Sep 17 00:00:00 2001\n", re.M)
_TRAILER_LINE_RE = re.compile(rf"^{PATCH_FILE_TRAILER}: *(\S+) *\n", re.M | re.I)
_SUBJECT_RE = re.compile(r"^Subject: (.*(?:\n[ \t].*)*)", re.M)
SLUG_MAX = 63


@dataclass(frozen=True)
class ExportedPatch:
    """One patch file regenerated from one commit."""

    name: str
    raw: bytes
    commit: str | None = None
    named_by: str = "trailer"  # trailer | subject


@dataclass
class ExportReport:
    """What an export wrote (or, with dry_run, would write)."""

    target: str
    directory: Path
    patches: list[ExportedPatch] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # patch files the series never named: kept
    series_changed: bool = False
    dry_run: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.written or self.removed or self.series_changed)

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "directory": str(self.directory),
            "dry_run": self.dry_run,
            "patches": [
                {"name": p.name, "commit": p.commit, "named_by": p.named_by} for p in self.patches
            ],
            "written": self.written,
            "unchanged": self.unchanged,
            "removed": self.removed,
            "left": self.left,
            "series_changed": self.series_changed,
        }


def slug(subject: str) -> str:
    """`Fix the thing (SM120)` -> `fix-the-thing-sm120.patch` (gbp's limit of 63 characters);
    accented letters keep their base letter (`Überall` -> `uberall`)."""
    plain = "".join(
        c for c in unicodedata.normalize("NFKD", subject) if not unicodedata.combining(c)
    )
    text = re.sub(r"[^a-z0-9]+", "-", plain.lower()).strip("-")
    text = text[:SLUG_MAX].rstrip("-") or "patch"
    return f"{text}.patch"


def split_mbox(stream: bytes) -> list[bytes]:
    """Split a format-patch --stdout stream into one mbox message per commit."""
    starts = [m.start() for m in _FROM_RE.finditer(stream)]
    messages = [stream[a:b] for a, b in zip(starts, starts[1:] + [len(stream)], strict=True)]
    # --stdout separates messages with one blank line that the per-file output does not have.
    return [
        m[:-1] if i < len(messages) - 1 and m.endswith(b"\n\n") else m
        for i, m in enumerate(messages)
    ]


def strip_patch_trailer(message: bytes) -> tuple[str | None, bytes]:
    """Remove the `Patchkit-Patch:` trailer from one exported message; returns (name, bytes)."""
    text = message.decode("utf-8", "surrogateescape")
    cut = text.find("\ndiff --git ")
    head, tail = (text, "") if cut < 0 else (text[: cut + 1], text[cut + 1 :])
    matches = list(_TRAILER_LINE_RE.finditer(head))
    if not matches:
        return None, message
    match = matches[-1]
    name = match.group(1)
    head = head[: match.start()] + head[match.end() :]
    headers, _, body = head.partition("\n\n")
    if not body.strip():
        # The trailer was the whole body: format-patch's form of a message without one
        head = headers + "\n\n\n"
    else:
        # The trailer was a paragraph of its own: drop the blank line that introduced it.
        head = re.sub(r"\n\n\n\Z", "\n\n", head)
    return name, (head + tail).encode("utf-8", "surrogateescape")


def _subject(message: bytes) -> str:
    """The subject as written (RFC 2047 words decoded), for the file name of a patch."""
    text = message.decode("utf-8", "replace")
    match = _SUBJECT_RE.search(text.split("\n\n", 1)[0])
    if not match:
        return "patch"
    try:
        return decode_header("the commit", "Subject", match.group(1)).strip()
    except PatchFormatError:
        return re.sub(r"\n[ \t]+", " ", match.group(1)).strip()


def export_commits(repo: gitops.Repo, base: str, tip: str) -> list[ExportedPatch]:
    """The patch files the commits base..tip export to, in order."""
    commits = gitops.rev_list(repo, base, tip, first_parent=True)
    messages = split_mbox(gitops.format_patches(repo, base, tip)) if commits else []
    if len(messages) != len(commits):
        raise UsageError(
            f"{base[:12]}..{tip[:12]} holds {len(commits)} commits but exported "
            f"{len(messages)} patches (merge commits cannot be exported)",
            hint="make the history linear (git rebase) and export again",
        )
    out: list[ExportedPatch] = []
    taken: set[str] = set()
    for commit, message in zip(commits, messages, strict=True):
        name, raw = strip_patch_trailer(message)
        named_by = "trailer"
        if name is None or not PATCH_NAME_RE.match(name) or name in taken:
            name, named_by = _unique(slug(_subject(raw)), taken), "subject"
        taken.add(name)
        out.append(ExportedPatch(name, raw, commit, named_by))
    return out


def _unique(name: str, taken: set[str]) -> str:
    stem = name.removesuffix(".patch")
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{stem}-{n}.patch", n + 1
    return candidate


def worktree_range(worktree: gitops.Repo, target: str) -> tuple[str, str]:
    """(base, HEAD) of a work tree made by `apply` (base from refs/patchkit/<target>/base)."""
    base = gitops.resolve(worktree, BASE_REF.format(target=target))
    head = gitops.head(worktree)
    if base is None or head is None:
        raise UsageError(
            f"{worktree.path} has no {BASE_REF.format(target=target)} ref",
            hint="export a work tree made by `patchkit apply`",
        )
    if not gitops.is_ancestor(worktree, base, head):
        raise UsageError(
            f"{worktree.path}: HEAD does not descend from the {target} base {base[:12]}",
            hint="rebase the branch onto refs/patchkit/<target>/base first",
        )
    return base, head


def write_series(
    directory: Path,
    target: str,
    patches: list[ExportedPatch],
    *,
    dry_run: bool = False,
    read: SeriesRead | None = None,
    check: Callable[[], None] | None = None,
) -> ExportReport:
    """Make `directory` hold `patches` and a series file listing them, in order.

    Only what export owns is touched: the files it writes, and the files the series named
    before the run (removed when no longer in it). Other `*.patch` files, editor swap files
    and the like are left and reported (`left`). Unchanged files are not rewritten; the
    series file keeps its comments when the order is the same, its leading comment block
    otherwise. Interrupted (SIGINT, SIGTERM), every file is put back as it was.
    `read`: what the caller read of the folder (and targets.toml) before it got here; it is
    written only if all of that is still there under the locks (`unchanged_since`); without
    it, the folder as the lock finds it. `check` runs under the locks before anything is
    written and may refuse (raise): what it finds cannot change until the write is done.
    """
    if dry_run:
        return _write_series(directory, target, patches, dry_run=True)
    with unchanged_since(read if read is not None else SeriesRead.take(directory)):
        if check is not None:
            check()
        return _write_series(directory, target, patches, dry_run=False)


@dataclass(frozen=True)
class SeriesRead:
    """What a writer of patches/ read before it could lock anything: each `series` and
    `*.patch` file of one series folder, and (for a folder of the project) targets.toml, by
    digest. Taken before the reads it stands for, so a change made after it is never missed;
    `unchanged_since` compares it with the files under the locks."""

    directory: Path
    folder: dict[str, str]
    project: Project | None = None
    targets: str | None = None  # the digest of the project's targets.toml
    by: str = "since it was read"  # when the change came, in the refusal's words

    @classmethod
    def take(
        cls,
        directory: Path,
        project: Project | None = None,
        *,
        seen: str | None = None,
        by: str = "since it was read",
    ) -> SeriesRead:
        """Take it just before the folder is read. `seen`: targets.toml's digest taken when it
        was parsed, earlier (`Workspace.targets_digest`); without it, the file as it is now."""
        targets = None
        if project is not None:
            targets = seen if seen is not None else digest(project.targets_file)
        return cls(directory, _folder_digests(directory), project, targets, by)

    def to_json(self) -> dict:
        return {
            "directory": str(self.directory),
            "folder": self.folder,
            "project": str(self.project.root) if self.project else None,
            "targets": self.targets,
        }

    @classmethod
    def from_json(cls, data: dict, *, by: str) -> SeriesRead:
        project = Project(Path(data["project"])) if data.get("project") else None
        return cls(Path(data["directory"]), dict(data["folder"]), project, data["targets"], by)

    def refusal(self) -> SeriesChangedError | None:
        """The error naming every file that changed since the read; None when none did."""
        now = _folder_digests(self.directory)
        changed = []
        for name in sorted(self.folder.keys() | now.keys()):
            before, after = self.folder.get(name), now.get(name)
            if before != after:
                how = "added" if before is None else "removed" if after is None else "changed"
                changed.append(f"{name} {how}")
        places = [f"the series in {self.directory}"] if changed else []
        if self.project is not None and digest(self.project.targets_file) != self.targets:
            changed.append(f"{self.project.targets_file.name} changed")
            places.append(str(self.project.targets_file))
        if not changed:
            return None
        return SeriesChangedError(
            f"{' and '.join(places)} changed {self.by}; nothing was written "
            f"({', '.join(changed)}: another patchkit command or an editor wrote there)",
            hint="run the same command again: it starts from what is there now",
        )


@contextmanager
def unchanged_since(read: SeriesRead) -> Iterator[None]:
    """Hold the locks of what `read` covers (the project's for targets.toml first, then the
    series folder's) and refuse (`SeriesChangedError`) unless every file is as it was read:
    every writer of patches/ writes inside this, so nothing it read changes until it is
    done, and what another writer wrote meanwhile is never written over."""
    with ExitStack() as held:
        if read.project is not None:
            held.enter_context(locked(read.project.lock_path, str(read.project.patches_dir)))
        folder = read.directory
        held.enter_context(locked(_folder_lock(folder), f"the series folder {folder}"))
        refusal = read.refusal()
        if refusal is not None:
            raise refusal
        yield


def _folder_digests(directory: Path) -> dict[str, str]:
    """The digest of each file in `directory` a series writer reads: `series`, `*.patch`."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    found = {}
    for name in names:
        if name == "series" or name.endswith(".patch"):
            seen = digest(directory / name)
            if seen is not None:
                found[name] = seen
    return found


def _folder_lock(directory: Path) -> Path:
    """The lock of one series folder, kept in the cache so the folder gains no file: two
    writers (export, import --into-series, rebase --write) of one folder never interleave."""
    key = hashlib.sha256(str(directory.absolute().resolve()).encode()).hexdigest()[:20]
    return cache_root() / "locks" / f"series-{key}.lock"


def _write_series(
    directory: Path, target: str, patches: list[ExportedPatch], *, dry_run: bool
) -> ExportReport:
    report = ExportReport(target, directory, list(patches), dry_run=dry_run)
    if not dry_run and directory.is_dir():
        for leftover in directory.glob(f".*{TMP_MARK}*"):  # temp files of a killed write
            if leftover.is_file() and not leftover.is_symlink():
                leftover.unlink(missing_ok=True)
    names = [p.name for p in patches]
    series_path = directory / "series"
    old_entries = [e.name for e in read_series_file(series_path)]
    existing = {p.name for p in directory.glob("*.patch")} if directory.is_dir() else set()
    report.left = sorted(existing - set(old_entries) - set(names))
    writes: list[tuple[Path, bytes]] = []
    for patch in patches:
        path = directory / patch.name
        if path.is_file() and not path.is_symlink() and path.read_bytes() == patch.raw:
            report.unchanged.append(patch.name)
            continue
        report.written.append(patch.name)
        writes.append((path, patch.raw))
    stale = []
    for name in sorted(set(old_entries) - set(names)):
        path = directory / name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            report.left.append(name)  # not a file export could have written
            continue
        report.removed.append(name)
        if path.is_file():
            stale.append(path)
    if old_entries != names:
        report.series_changed = True
        writes.append((series_path, render_series(series_path, names).encode()))
    if not dry_run:
        _write_all(directory, writes, stale)
    return report


def _write_all(directory: Path, writes: list[tuple[Path, bytes]], stale: list[Path]) -> None:
    """Write (each file atomically), then remove; on an interrupt put every file back."""
    undo: list[tuple[Path, bytes | None]] = []
    try:
        for path, data in writes:
            before = path.read_bytes() if path.is_file() else None
            replace_file(path, data)
            undo.append((path, before))
        for path in stale:
            before = path.read_bytes()
            path.unlink()
            undo.append((path, before))
    except KeyboardInterrupt:
        for path, before in reversed(undo):
            if before is None:
                path.unlink(missing_ok=True)
            else:
                replace_file(path, before)
        raise Interrupted(
            f"export was stopped after {len(undo)} of {len(writes) + len(stale)} file "
            f"changes in {directory}; they were put back, nothing was left half-done"
        ) from None


def render_series(series_path: Path, names: list[str]) -> str:
    """The series file for `names`.

    When the new order only drops entries and appends new ones (what a rebase or an added
    commit does), the file is edited in place: comments stay where they were.  Otherwise the
    leading comment block is kept and the names follow, one a line.
    """
    lines = series_path.read_text(encoding="utf-8").splitlines() if series_path.is_file() else []
    old = [ln.split("#", 1)[0].strip() for ln in lines]
    kept = [n for n in old if n and n in names]
    if kept == names[: len(kept)]:
        body = [ln for ln, n in zip(lines, old, strict=True) if not n or n in names]
        return "\n".join([*body, *names[len(kept) :]]) + "\n"
    header: list[str] = []
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            break
        header.append(line)
    return "\n".join([*header, *names]) + "\n"


def export_worktree(
    worktree: gitops.Repo,
    target: str,
    directory: Path,
    *,
    dry_run: bool = False,
    read: SeriesRead | None = None,
) -> ExportReport:
    """Regenerate `directory` (a target's series) from the commits of an `apply` work tree.

    Refused when the series gained patches after the work tree was made: they are not in it,
    so the export would delete them (the series the work tree was made from is the history
    base..refs/patchkit/<target>/series); and when `directory` (or targets.toml) changed
    since `read`, taken when the export started."""
    read = read if read is not None else SeriesRead.take(directory, by="while the export ran")
    base, head = worktree_range(worktree, target)
    patches = export_commits(worktree, base, head)
    check = _no_patch_added_since(worktree, target, base, directory, patches)
    return write_series(directory, target, patches, dry_run=dry_run, read=read, check=check)


def _no_patch_added_since(
    worktree: gitops.Repo, target: str, base: str, directory: Path, patches: list[ExportedPatch]
) -> Callable[[], None] | None:
    """The check, under the series folder's lock, that the export loses nothing the series
    gained after `worktree` was made: a patch added since (the export would delete it) or a
    patch changed since (it would be written over)."""
    made = gitops.resolve(worktree, SERIES_REF.format(target=target))
    if made is None or not gitops.is_ancestor(worktree, base, made):
        return None  # a work tree made before the ref existed: nothing to compare with

    def check() -> None:
        was = {p.name: p.raw for p in export_commits(worktree, base, made)}
        now = {p.name: p.raw for p in patches}
        on_disk = [e.name for e in read_series_file(directory / "series")]
        added = [n for n in on_disk if n not in was and n not in now and (directory / n).is_file()]
        changed = [n for n in was if _changed_since(worktree, directory / n, was[n], now.get(n))]
        for names, what in ((added, "joined the series in"), (changed, "changed in")):
            if names:
                _refuse_stale(worktree, target, directory, names, what)

    return check


def _changed_since(worktree: gitops.Repo, path: Path, was: bytes, now: bytes | None) -> bool:
    """Whether the series file `path` says something other than it did when the work tree
    was made (`was`, regenerated from its commit) where the export would change it."""
    if not path.is_file():
        return False
    disk = path.read_bytes()
    return disk != now and not _same_change(worktree, path.name, disk, was)


def _same_change(worktree: gitops.Repo, name: str, a: bytes, b: bytes) -> bool:
    """Two versions of a patch file say the same: subject, body and the diff's patch id
    (a hand-written file and its regenerated form differ in layout only)."""
    try:
        one, two = parse_patch(name, a), parse_patch(name, b)
    except PatchkitError:
        return a == b
    if (one.subject, one.body.strip()) != (two.subject, two.body.strip()):
        return False
    diffs = (one.diff.encode("utf-8"), two.diff.encode("utf-8"))
    return gitops.patch_id(worktree, diffs[0]) == gitops.patch_id(worktree, diffs[1])


def _refuse_stale(
    worktree: gitops.Repo, target: str, directory: Path, names: list[str], what: str
) -> None:
    consequence = "write over those changes" if what == "changed in" else "delete them"
    raise UsageError(
        f"{', '.join(names)} {what} {directory} after {worktree.path} was "
        f"made (or belong to another series): the export would {consequence}; nothing "
        "was written",
        hint="apply the series to that checkout again (patchkit apply --target "
        f"{target} --into {shlex.quote(str(worktree.path))}) and export, or export into "
        "another folder (--out DIR)",
    )
