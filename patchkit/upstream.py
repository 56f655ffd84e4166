"""Obtaining upstream trees: bare mirrors, git fetch of pinned commits, PyPI sdist import.

An sdist import is a parentless commit with a fixed identity and date, so its id is the same on
every machine; its message records the sdist hash and the upstream commit the sdist stands for.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from patchkit import gitops
from patchkit.errors import FetchError, PinError, UsageError
from patchkit.locks import locked
from patchkit.project import cache_root
from patchkit.targets import HEX_RE, Release, Target

IMPORT_IDENTITY_NAME = "patchkit import"
IMPORT_IDENTITY_EMAIL = "import@patchkit.invalid"
SDIST_REF = "refs/patchkit/sdist/{version}"
GIT_REF = "refs/patchkit/git/{sha}"
MAX_SDIST_BYTES = 512 * 1024 * 1024
COMMIT_ID_RES = (
    re.compile(r"""commit_id\s*=\s*['"]g?([0-9a-f]{7,40})['"]"""),
    re.compile(r"""__git_version__\s*=\s*['"]([0-9a-f]{7,40})['"]"""),
)

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class Base:
    """The upstream commit a series applies onto, and what it stands for."""

    target: str
    commit: str  # the commit in the mirror (an sdist import or a real upstream commit)
    source: str  # "git" | "sdist" | "upstream"
    release: Release | None
    upstream_commit: str | None  # the real upstream commit, when known
    sdist_sha256: str | None = None
    pinned: bool = True
    notes: tuple[str, ...] = ()

    @property
    def unverified(self) -> str:
        """What was not checked about an unpinned base, in words (empty when pinned)."""
        if self.pinned:
            return ""
        return (
            f"{self.target} base {self.commit[:12]} is not pinned in targets.toml, so its "
            "identity was not verified: no pinned commit or sdist sha256 vouches for it, and no "
            "release tag or recorded commit id was compared"
        )

    @property
    def stands_for(self) -> str:
        parts = []
        if self.release:
            parts.append(self.release.tag or self.release.version)
        if self.source == "sdist":
            parts.append(f"sdist {self.release.sdist if self.release else '?'}")
        if self.upstream_commit:
            parts.append(f"upstream {self.upstream_commit}")
        else:
            parts.append("upstream commit unknown")
        return ", ".join(parts)


@dataclass
class Attempt:
    source: str
    outcome: str


@dataclass
class Mirror:
    """A per-target bare repository in the cache."""

    target: Target
    root: Path = field(default_factory=cache_root)

    @property
    def path(self) -> Path:
        return self.root / "mirrors" / f"{self.target.name}.git"

    @property
    def lock_path(self) -> Path:
        return self.root / "locks" / f"mirror-{self.target.name}.lock"

    def ensure(self) -> Path:
        """Create the mirror (atomically: init off to the side, then rename) if it is missing."""
        if not (self.path / "HEAD").is_file():
            scratch = self.root / "tmp"
            scratch.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=scratch, prefix=f"init-{self.target.name}-"))
            try:
                gitops.init_bare(tmp / "repo")
                shutil.rmtree(self.path, ignore_errors=True)  # no HEAD: a torn pre-rename init
                self.path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp / "repo", self.path)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return self.path

    def sweep(self) -> None:
        """Remove what a killed holder of the mirror lock left: scratch dirs, partial downloads
        and git's own lock files (only holders of the mirror lock write there)."""
        scratch = self.root / "tmp"
        for prefix in (f"import-{self.target.name}-", f"init-{self.target.name}-"):
            for stale in scratch.glob(f"{prefix}*") if scratch.is_dir() else ():
                shutil.rmtree(stale, ignore_errors=True)
        for release in self.target.releases:
            if release.sdist:
                dest = sdist_path(release, self.root)
                for stale in dest.parent.glob(f".{dest.name}.download-*"):
                    stale.unlink(missing_ok=True)
        if self.path.is_dir():
            for lock in gitops.stale_lock_files(self.path):
                lock.unlink(missing_ok=True)

    def _objects_signature(self, commit: str) -> str:
        """Identity of the files holding `commit`'s objects: every pack (git never rewrites a
        pack in place) and those of the base's objects that are loose; any replacement or
        rewrite of one of them changes it."""
        digest = hashlib.sha256()
        objects = self.path / "objects"
        files = sorted((objects / "pack").glob("pack-*"))
        loose = {
            f"{entry.name}{obj.name}"
            for entry in os.scandir(objects)
            if len(entry.name) == 2 and entry.is_dir()
            for obj in os.scandir(entry.path)
        }
        if loose:
            wanted = loose.intersection(gitops.object_ids(self.path, commit, bare=True))
            files += [objects / oid[:2] / oid[2:] for oid in sorted(wanted)]
        for path in files:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            # not ctime: hard-linked clones of the mirror change it without touching a byte
            digest.update(
                f"{path.relative_to(objects)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode()
            )
        return digest.hexdigest()

    def check_objects(self, commit: str) -> None:
        """Refuse a base whose objects in the mirror no longer hash to their ids.

        The full re-hash runs once per state of the object files; while no object file has
        changed since the last clean check, the recorded verdict stands.
        """
        stamp = self.root / "verified" / f"{self.target.name}-{commit}"
        signature = self._objects_signature(commit)
        try:
            if stamp.read_text() == signature:
                return
        except OSError:
            pass
        try:
            bad = gitops.corrupt_objects(self.path, commit, bare=True)
        except gitops.GitError as exc:
            bad = [_first_line(str(exc))]
        if bad:
            raise PinError(
                f"the {self.target.name} mirror is damaged or tampered: {len(bad)} object(s) of "
                f"{commit[:12]} do not match their hash (first: {bad[0][:40]}); refusing",
                hint=f"remove {self.path} and run again to fetch or import it afresh",
            )
        stamp.parent.mkdir(parents=True, exist_ok=True)
        tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}")
        tmp.write_text(signature)
        os.replace(tmp, stamp)


def acquire(
    target: Target,
    ref: str | None,
    *,
    upstream: str | None = None,
    allow_unpinned: bool = False,
    offline_git: bool | None = None,
    progress: Progress = _quiet,
    cache: Path | None = None,
) -> Base:
    """Resolve `target@ref` to a commit in the mirror, fetching or importing as needed.

    Sources, in order: `upstream` (a local clone, bare repo or URL), the target's git URL
    (exactly the requested commit), and the release's sdist on the package index.
    """
    mirror = Mirror(target, cache or cache_root())
    ref = ref or target.pin
    release, want_sha = _interpret_ref(target, ref)
    if release is None and not allow_unpinned:
        if want_sha is None and not HEX_RE.match(ref):
            known = ", ".join(r.tag or r.version for r in target.releases)
            raise PinError(
                f"cannot resolve {target.name}@{ref}: not a pinned release or tag "
                f"(pinned: {known})",
                hint=f"use a pinned ref, pass --allow-unpinned to use it unverified, or "
                f"`patchkit rebase --target {target.name}@{ref} --write` to add a pin",
            )
    attempts: list[Attempt] = []
    with locked(mirror.lock_path, f"the {target.name} mirror"):
        mirror.sweep()
        mirror.ensure()
        # Cached git commit, then an explicit --upstream, then a cached sdist import.
        base = _from_mirror(mirror, target, release, want_sha, ref, sdist=False)
        if base is None and upstream:
            base = _from_git(
                mirror, target, release, want_sha, ref, upstream, "upstream", attempts, progress
            )
        if base is None:
            base = _from_mirror(mirror, target, release, want_sha, ref, sdist=True)
        if base is None and not _skip_git(offline_git):
            base = _from_git(
                mirror, target, release, want_sha, ref, target.git, "git", attempts, progress
            )
        if base is None and release is not None and release.sdist:
            base = _from_sdist(mirror, target, release, attempts, progress)
        elif base is None:
            attempts.append(Attempt("sdist", "no pinned release with an sdist for this ref"))
        if base is not None:
            mirror.check_objects(base.commit)
    if base is None:
        tried = "; ".join(f"{a.source}: {a.outcome}" for a in attempts) or "no source"
        raise FetchError(
            f"cannot resolve {target.name}@{ref} (tried {tried})",
            hint="pass --upstream PATH_OR_URL with a clone that has it",
        )
    if not base.pinned and not allow_unpinned:
        raise PinError(
            f"{target.name}@{ref} resolves to {base.commit[:12]}, which no pin in targets.toml "
            "names",
            hint="pass --allow-unpinned to use it unverified, or rebase --write to pin it",
        )
    return base


def _skip_git(offline_git: bool | None) -> bool:
    if offline_git is not None:
        return offline_git
    return os.environ.get("PATCHKIT_OFFLINE_GIT", "") not in ("", "0")


def _interpret_ref(target: Target, ref: str) -> tuple[Release | None, str | None]:
    release = target.release(ref)
    if release is not None:
        return release, release.commit
    lowered = ref.lower()
    if HEX_RE.match(lowered):
        matches = [r for r in target.releases if r.commit and r.commit.startswith(lowered)]
        if len(matches) == 1:
            return matches[0], matches[0].commit
        if len(matches) > 1:
            raise UsageError(f"{target.name}@{ref} is ambiguous among pinned releases")
        return None, lowered if len(lowered) == 40 else None
    return None, None


def _from_mirror(
    mirror: Mirror,
    target: Target,
    release: Release | None,
    want_sha: str | None,
    ref: str,
    *,
    sdist: bool,
) -> Base | None:
    repo = mirror.path
    if (
        not sdist
        and want_sha
        and len(want_sha) == 40
        and gitops.has_commit(repo, want_sha, bare=True)
    ):
        return Base(target.name, want_sha, "git", release, want_sha, pinned=release is not None)
    if sdist and release is not None:
        imported = gitops.resolve(repo, SDIST_REF.format(version=release.version), bare=True)
        if imported:
            return _sdist_base(repo, target, release, imported)
    if not sdist and release is None and HEX_RE.match(ref.lower()):
        sha = gitops.resolve(repo, ref.lower(), bare=True)
        if sha:
            return Base(
                target.name,
                sha,
                "git",
                _release_for_commit(target, sha),
                sha,
                pinned=_release_for_commit(target, sha) is not None,
            )
    return None


def _release_for_commit(target: Target, sha: str) -> Release | None:
    for release in target.releases:
        if release.commit == sha:
            return release
    return None


def _from_git(
    mirror: Mirror,
    target: Target,
    release: Release | None,
    want_sha: str | None,
    ref: str,
    source: str,
    label: str,
    attempts: list[Attempt],
    progress: Progress,
) -> Base | None:
    repo = mirror.path
    progress(f"fetching {target.name}@{ref} from {source}")
    try:
        if release is not None and release.tag:
            _refuse_moved_tag(target, release, source)
        if want_sha and len(want_sha) == 40:
            local = Path(source)
            if local.exists():
                gitops.fetch(
                    repo, str(local), [f"{want_sha}:{GIT_REF.format(sha=want_sha)}"], bare=True
                )
            else:
                gitops.fetch(
                    repo, source, [f"{want_sha}:{GIT_REF.format(sha=want_sha)}"], depth=1, bare=True
                )
            sha = want_sha
        else:
            remote_refs = gitops.list_remote(source)
            sha = _match_remote_ref(remote_refs, ref)
            if sha is None:
                attempts.append(Attempt(label, f"{source} has no ref '{ref}'"))
                return None
            gitops.fetch(repo, source, [f"{sha}:{GIT_REF.format(sha=sha)}"], bare=True)
    except gitops.GitError as exc:
        attempts.append(Attempt(label, _first_line(str(exc))))
        return None
    if not gitops.has_commit(repo, sha, bare=True):
        attempts.append(Attempt(label, f"{source} did not provide {sha[:12]}"))
        return None
    pinned_release = release or _release_for_commit(target, sha)
    if release is not None and release.commit and sha != release.commit:
        raise PinError(
            f"{target.name}@{ref} resolved to {sha[:12]} in {source}, but the pin says "
            f"{release.commit[:12]}; refusing",
        )
    return Base(target.name, sha, label, pinned_release, sha, pinned=pinned_release is not None)


def _refuse_moved_tag(target: Target, release: Release, source: str) -> None:
    """A remote whose release tag names another commit than the pin is not trusted at all."""
    tagged = gitops.remote_tag(source, release.tag or "")
    if tagged and release.commit and tagged != release.commit:
        raise PinError(
            f"{target.name}: {source} says tag {release.tag} is {tagged[:12]}, but the pin says "
            f"{release.commit[:12]}; refusing (nothing was fetched)",
            hint="if upstream moved the tag on purpose, re-pin with `patchkit rebase --write`",
        )


def _match_remote_ref(remote_refs: dict[str, str], ref: str) -> str | None:
    for name in (ref, f"refs/tags/{ref}", f"refs/heads/{ref}"):
        if name in remote_refs:
            return remote_refs[name]
    if HEX_RE.match(ref.lower()):
        hits = {sha for sha in remote_refs.values() if sha.startswith(ref.lower())}
        if len(hits) == 1:
            return hits.pop()
    return None


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line.removeprefix("fatal: ")
    return text.strip()


# --- sdists ----------------------------------------------------------------------------------


def index_url() -> str:
    return os.environ.get("PATCHKIT_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def sdist_path(release: Release, cache: Path) -> Path:
    name, _, version = (release.sdist or "").partition("==")
    return cache / "sdists" / f"{_normalize(name)}-{version.strip()}.tar.gz"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name.strip()).lower()


def download_sdist(release: Release, cache: Path, progress: Progress = _quiet) -> Path:
    """Download the release's sdist into the cache (write-then-rename) and check its sha256."""
    dest = sdist_path(release, cache)
    if dest.is_file() and file_sha256(dest) == release.sdist_sha256:
        return dest
    name, _, version = (release.sdist or "").partition("==")
    url, index_sha = _find_sdist_url(name.strip(), version.strip())
    progress(f"downloading {url.rsplit('/', 1)[-1]}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.download-")
    try:
        digest = hashlib.sha256()
        size = 0
        with os.fdopen(fd, "wb") as out, _urlopen(url) as response:
            while chunk := response.read(1 << 20):
                size += len(chunk)
                if size > MAX_SDIST_BYTES:
                    raise FetchError(f"{url}: larger than {MAX_SDIST_BYTES >> 20} MiB; refusing")
                digest.update(chunk)
                out.write(chunk)
        got = digest.hexdigest()
        check_sdist_hash(release, got, index_sha)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def check_sdist_hash(release: Release, got: str, index_sha: str | None = None) -> None:
    """Refuse an sdist whose sha256 differs from the pin (or, unpinned, from the index)."""
    expected = release.sdist_sha256 or index_sha
    if expected and got != expected:
        raise PinError(
            f"{release.sdist}: sha256 {got} does not match the pin {expected}; refusing "
            "(nothing was written)",
            hint="if upstream re-published on purpose, re-pin with `patchkit rebase --write`",
        )


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _urlopen(url: str, accept: str | None = None):
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        return urllib.request.urlopen(request, timeout=120)
    except (urllib.error.URLError, OSError) as exc:
        raise FetchError(f"cannot download {url}: {getattr(exc, 'reason', exc)}") from None


def _find_sdist_url(name: str, version: str) -> tuple[str, str | None]:
    project = re.sub(r"[-_.]+", "-", name).lower()
    url = f"{index_url()}/{project}/"
    with _urlopen(url, "application/vnd.pypi.simple.v1+json") as response:
        try:
            listing = json.load(response)
        except json.JSONDecodeError:
            raise FetchError(f"{url}: the index did not answer with its JSON API") from None
    wanted = {
        f"{_normalize(name)}-{version}.tar.gz",
        f"{project}-{version}.tar.gz",
        f"{name}-{version}.tar.gz",
    }
    for entry in listing.get("files", []):
        if entry.get("filename") in wanted:
            return entry["url"], entry.get("hashes", {}).get("sha256")
    raise FetchError(f"{name}=={version}: no sdist on {index_url()}")


def release_commit_id(tree: Path, target: Target) -> str | None:
    """The upstream commit id an unpacked sdist records about itself, if any."""
    if not target.commit_id_file:
        return None
    path = tree / target.commit_id_file
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for pattern in COMMIT_ID_RES:
        match = pattern.search(text)
        if match:
            return match.group(1)
    return None


def safe_extract_sdist(archive: Path, dest: Path) -> Path:
    """Extract a .tar.gz refusing links, devices, absolute and climbing names; returns its top
    directory."""
    try:
        return _extract_checked(archive, dest)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        cause = str(exc).splitlines()[0].rstrip(":") if str(exc) else type(exc).__name__
        raise FetchError(
            f"{archive.name}: not a readable .tar.gz ({cause})",
            hint="the file is damaged or is not an sdist; nothing was imported",
        ) from None


def _extract_checked(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        tops = set()
        total = 0
        for member in members:
            name = PurePosixPath(member.name)
            if name.is_absolute() or ".." in name.parts:
                raise FetchError(f"{archive.name}: member {member.name} escapes the archive")
            if any(part.lower() == ".git" for part in name.parts):
                raise FetchError(f"{archive.name}: member {member.name} is inside a .git directory")
            if not (member.isfile() or member.isdir()):
                raise FetchError(f"{archive.name}: member {member.name} is a link or device")
            total += member.size
            if total > 4 * MAX_SDIST_BYTES:
                raise FetchError(
                    f"{archive.name}: unpacks to more than {4 * MAX_SDIST_BYTES >> 20} MiB"
                )
            tops.add(name.parts[0])
        if len(tops) != 1:
            raise FetchError(f"{archive.name}: expected one top-level directory, found {len(tops)}")
        tar.extractall(dest, members=members, filter="data")
    return dest / tops.pop()


def sdist_identity(archive: Path) -> gitops.Identity:
    """A fixed identity dated by the sdist itself: the newest member mtime (same everywhere)."""
    with tarfile.open(archive, "r:*") as tar:
        stamp = max((m.mtime for m in tar.getmembers()), default=0)
    return gitops.Identity(IMPORT_IDENTITY_NAME, IMPORT_IDENTITY_EMAIL, f"{int(stamp)} +0000")


def import_sdist(mirror: Mirror, target: Target, release: Release, archive: Path) -> str:
    """Import an sdist's tree under the target's subdir as a deterministic commit."""
    repo = mirror.path
    scratch_root = mirror.root / "tmp"
    scratch_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch_root, prefix=f"import-{target.name}-") as tmp:
        top = safe_extract_sdist(archive, Path(tmp) / "x")
        recorded = release_commit_id(top, target)
        _check_recorded_commit(release, recorded)
        layout = Path(tmp) / "tree"
        dest = layout / target.subdir if target.subdir else layout
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(top, dest)
        upstream = (release.commit or recorded) if recorded else None
        message = (
            f"Import {release.sdist} from its sdist\n\n"
            f"Patchkit-Sdist: {archive.name}\n"
            f"Patchkit-Sdist-Sha256: {file_sha256(archive)}\n"
            f"Patchkit-Sdist-Commit-Id: {recorded or 'none'}\n"
            f"Patchkit-Upstream-Commit: {upstream or 'unknown'}\n"
        )
        sha = gitops.import_directory(repo, layout, message, sdist_identity(archive))
    gitops.update_ref(repo, SDIST_REF.format(version=release.version), sha, bare=True)
    gitops.pack_objects(repo)
    return sha


def _check_recorded_commit(release: Release, recorded: str | None) -> None:
    if recorded and release.commit and not release.commit.startswith(recorded.lower()):
        raise PinError(
            f"{release.sdist}: the sdist records upstream commit {recorded}, but the pin says "
            f"{release.commit[:12]}; refusing",
        )


def _from_sdist(
    mirror: Mirror, target: Target, release: Release, attempts: list[Attempt], progress: Progress
) -> Base | None:
    try:
        archive = download_sdist(release, mirror.root, progress)
    except FetchError as exc:
        attempts.append(Attempt("sdist", exc.message))
        return None
    progress(f"importing {archive.name} into the {target.name} mirror")
    sha = import_sdist(mirror, target, release, archive)
    return _sdist_base(mirror.path, target, release, sha)


def import_fields(message: str) -> dict[str, str]:
    """The `Patchkit-*` fields an sdist import commit records about itself."""
    return dict(re.findall(r"^(Patchkit-[A-Za-z0-9-]+): (.*)$", message, re.M))


def _sdist_base(repo: Path, target: Target, release: Release, sha: str) -> Base:
    message = gitops.commit_message(repo, sha, bare=True)
    fields = import_fields(message)
    upstream = fields.get("Patchkit-Upstream-Commit")
    recorded_sha = fields.get("Patchkit-Sdist-Sha256")
    if release.sdist_sha256 and recorded_sha and recorded_sha != release.sdist_sha256:
        raise PinError(
            f"the mirror's import of {release.sdist} has sha256 {recorded_sha}, the pin says "
            f"{release.sdist_sha256}; refusing",
            hint=f"remove {repo} and run again",
        )
    return Base(
        target=target.name,
        commit=sha,
        source="sdist",
        release=release,
        upstream_commit=None if upstream in (None, "unknown") else upstream,
        sdist_sha256=recorded_sha,
        pinned=True,
    )


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
