"""The one source chain for upstream bases, shared by apply, build, rebase, review and fetch.

Sources, in order: an explicit `--upstream` (clone, bare repository or URL), the target's git
URL (exactly the pinned commit), then the package index (the release's sdist, else its pinned
wheel).  When every source fails, the error names each one tried and why.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from patchkit import gitops, ui
from patchkit.errors import (
    ConfigError,
    FetchError,
    PatchkitError,
    PinError,
    UsageError,
    did_you_mean,
)
from patchkit.locks import locked
from patchkit.project import cache_root
from patchkit.targets import HEX_RE, Release, Target, check_git_source
from patchkit.upstream.mirror import (
    SDIST_REF,
    WHEEL_REF,
    Mirror,
    first_line,
    import_fields,
    wheel_fields,
)
from patchkit.upstream.reach import known_unreachable, note_failure

if TYPE_CHECKING:
    from patchkit.upstream.newbase import NewPin

# What obtaining a base the mirror does not hold yet needs (the package index client, the
# sdist and wheel importers) is imported there: a run on a base already held never loads it.

GIT_REF = "refs/patchkit/git/{sha}"


@dataclass(frozen=True)
class Base:
    """The upstream commit a series applies onto, and what it stands for."""

    target: str
    commit: str  # the commit in the mirror (an sdist/wheel import or a real upstream commit)
    source: str  # "git" | "sdist" | "wheel" | "upstream"
    release: Release | None
    upstream_commit: str | None  # the real upstream commit, when known
    sdist_sha256: str | None = None
    pinned: bool = True
    notes: tuple[str, ...] = ()
    wheel: str | None = None  # the wheel file a wheel import stands for
    wheel_sha256: str | None = None

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
        if self.source == "wheel":
            parts.append(f"wheel {self.wheel}")
        if self.upstream_commit:
            parts.append(f"upstream {self.upstream_commit}")
        else:
            parts.append("upstream commit unknown")
        return ", ".join(parts)

    def to_json(self) -> dict:
        return {
            "commit": self.commit,
            "source": self.source,
            "stands_for": self.stands_for,
            "upstream_commit": self.upstream_commit,
            "release": self.release.version if self.release else None,
            "sdist_sha256": self.sdist_sha256,
            "wheel": self.wheel,
            "wheel_sha256": self.wheel_sha256,
            "pinned": self.pinned,
        }


@dataclass
class Attempt:
    """One source of the chain that was tried, and why it gave no base."""

    source: str
    outcome: str

    def to_json(self) -> dict:
        return {"source": self.source, "outcome": self.outcome}


class BaseUnavailable(FetchError):
    """No source of the chain could provide the base (exit 2: nothing was tried on a tree)."""

    exit_code = 2

    def __init__(self, message: str, attempts: list[Attempt], hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.attempts = attempts

    def to_json(self) -> dict:
        return {
            "error": "cannot-obtain-base",
            "message": self.message,
            "next_step": self.hint,
            "attempts": [a.to_json() for a in self.attempts],
        }


_SCP_LIKE = re.compile(r"^[\w.-]+@[\w.-]+:")


def _check_upstream_path(upstream: str) -> None:
    """A `--upstream` that is neither a URL nor an existing path is a typo, not a source to
    skip silently in favour of the next one."""
    if "://" in upstream or _SCP_LIKE.match(upstream):
        return
    if not Path(upstream).expanduser().exists():
        raise UsageError(
            f"--upstream {upstream}: no such file or directory",
            hint="pass a clone, a bare repository or a URL (https://, ssh://, file://)",
        )


def acquire(
    target: Target,
    ref: str | None,
    *,
    upstream: str | None = None,
    allow_unpinned: bool = False,
    offline_git: bool | None = None,
    cache: Path | None = None,
) -> Base:
    """Resolve `target@ref` to a commit in the mirror, fetching or importing as needed.

    Sources, in order: `upstream` (a local clone, bare repo or URL), the target's git URL
    (exactly the pinned commit), then the package index: the release's sdist, else its
    pinned wheel.  Imports already in the mirror are reused.  Raises BaseUnavailable, listing
    every source tried, when none gives the base.
    """
    if upstream is not None:
        try:
            check_git_source(upstream, "--upstream")
        except ConfigError as exc:
            raise UsageError(exc.message) from None
        _check_upstream_path(upstream)
    mirror = Mirror(target, cache or cache_root())
    ref = ref or target.pin
    release, want_sha = _interpret_ref(target, ref)
    if release is None and not allow_unpinned:
        if want_sha is None and not HEX_RE.match(ref):
            known = ", ".join(r.tag or r.version for r in target.releases)
            raise PinError(
                f"cannot resolve {target.name}@{ref}: not a pinned release or tag "
                f"(pinned: {known})" + did_you_mean(ref, target.refs),
                hint=f"use a pinned ref, pass --allow-unpinned to use it unverified, or "
                f"`patchkit rebase --target {target.name}@{ref} --write` to add a pin",
            )
    attempts: list[Attempt] = []
    with locked(mirror.lock_path, f"the {target.name} mirror"):
        mirror.sweep()
        mirror.ensure()
        base = _chain(mirror, target, release, want_sha, ref, upstream, offline_git, attempts)
        if base is not None:
            mirror.check_objects(base.commit)
    if base is None:
        tried = "; ".join(f"{a.source}: {a.outcome}" for a in attempts) or "no source"
        raise BaseUnavailable(
            f"cannot obtain the {target.name}@{ref} base (tried {tried})"
            + (did_you_mean(ref, target.refs) if release is None else ""),
            attempts,
            hint="pass --upstream PATH_OR_URL with a clone that has it, or make the package "
            "index reachable (PATCHKIT_INDEX_URL)",
        )
    if not base.pinned and not allow_unpinned:
        raise PinError(
            f"{target.name}@{ref} resolves to {base.commit[:12]}, which no pin in targets.toml "
            "names",
            hint="pass --allow-unpinned to use it unverified, or rebase --write to pin it",
        )
    return base


def _chain(
    mirror: Mirror,
    target: Target,
    release: Release | None,
    want_sha: str | None,
    ref: str,
    upstream: str | None,
    offline_git: bool | None,
    attempts: list[Attempt],
) -> Base | None:
    """The sources in order; the first that gives a base wins."""
    # What the mirror holds of them, read at once: the pinned commit, the release's imports.
    held = gitops.read_commits(mirror.repo, _held_names(release, want_sha))
    # A git commit already in the mirror, then an explicit --upstream.
    base = _from_mirror(mirror, target, release, want_sha, ref, held, sdist=False)
    if base is None and upstream:
        base = _from_git(mirror, target, release, want_sha, ref, upstream, "upstream", attempts)
    # Imports already in the mirror (pinned: their recorded sha256 is checked).
    if base is None:
        base = _from_mirror(mirror, target, release, want_sha, ref, held, sdist=True)
    if base is None and release is not None and not release.sdist:
        base = _cached_wheel(mirror, target, release, held)
    if base is None:
        base = _from_target_git(mirror, target, release, want_sha, ref, offline_git, attempts)
    if base is None and release is not None and release.sdist:
        base = _from_sdist(mirror, target, release, attempts)
    elif base is None and release is not None and release.wheels:
        base = _from_wheel(mirror, target, release, attempts)
    elif base is None:
        version = _index_version(target, ref) if release is None else None
        if version:
            base = _from_index_unpinned(mirror, target, version, attempts)
        else:
            attempts.append(
                Attempt("index", "no pinned release with an sdist or wheel for this ref")
            )
    return base


def _from_target_git(
    mirror: Mirror,
    target: Target,
    release: Release | None,
    want_sha: str | None,
    ref: str,
    offline_git: bool | None,
    attempts: list[Attempt],
) -> Base | None:
    """The target's git URL, unless git is off, the release pins no commit, or its host was
    found unreachable a short while ago (`reach`)."""
    if _skip_git(offline_git):
        attempts.append(Attempt("git", "skipped: PATCHKIT_OFFLINE_GIT is set"))
    elif release is not None and release.commit is None:
        attempts.append(
            Attempt("git", f"release {release.version} pins no upstream commit to fetch")
        )
    elif (known := known_unreachable(target.git, mirror.root)) is not None:
        attempts.append(Attempt("git", known))
    else:
        return _from_git(mirror, target, release, want_sha, ref, target.git, "git", attempts)
    return None


def _index_version(target: Target, ref: str) -> str | None:
    """The release version `ref` names when the target's releases are on an index."""
    from patchkit.upstream.newbase import index_name, version_of

    return version_of(ref) if index_name(target) else None


def _from_index_unpinned(
    mirror: Mirror, target: Target, version: str, attempts: list[Attempt]
) -> Base | None:
    from patchkit.upstream.newbase import from_index_unpinned

    try:
        release, sha, trust = from_index_unpinned(mirror, target, version)
    except FetchError as exc:
        attempts.append(Attempt("index", exc.message))
        return None
    return unpinned_base(target, release, sha, trust)


def unpinned_base(target: Target, release: Release, sha: str, trust: str) -> Base:
    """The Base of a release no pin names, imported from its index file (wheel or sdist)."""
    wheel = release.base_wheel
    return Base(
        target.name,
        sha,
        "wheel" if wheel else "sdist",
        release,
        release.commit,
        sdist_sha256=release.sdist_sha256,
        pinned=False,
        notes=(trust,),
        wheel=wheel.filename if wheel else None,
        wheel_sha256=wheel.sha256 if wheel else None,
    )


def resolve_new_base(
    target: Target,
    ref: str,
    *,
    upstream: str | None = None,
    cache: Path | None = None,
) -> tuple[Base, NewPin | None]:
    """The base `target@ref` names, and the pin `--write` would record (None: no change).

    The same chain as every verb: a pinned release as `apply` gets it; otherwise git (a tag or
    commit, from --upstream or the target's URL), then the release's sdist or wheels on the
    package index, trusted on first use.
    """
    from patchkit.upstream.newbase import NewPin, version_of

    release = target.release(ref)
    if release is not None:
        base = acquire(target, ref, upstream=upstream, cache=cache)
        if release.version == target.pin:
            return base, None
        return base, NewPin(
            release.version,
            release.commit,
            release.tag,
            release.sdist,
            release.sdist_sha256,
            base.upstream_commit,
            new=False,
            trust="already pinned in targets.toml",
            wheels=[w.to_json() for w in release.wheels],
        )
    base = acquire(target, ref, upstream=upstream, allow_unpinned=True, cache=cache)
    if base.source in ("sdist", "wheel") and base.release is not None:
        new = base.release
        tag = ref if ref.startswith("v") and version_of(ref) else None
        return base, NewPin(
            new.version,
            new.commit,
            tag,
            new.sdist,
            new.sdist_sha256,
            new.commit,
            trust=base.notes[0] if base.notes else "",
            wheels=[w.to_json() for w in new.wheels],
        )
    version = version_of(ref) or f"{target.pin}+g{base.commit[:12]}"
    tag = None if HEX_RE.match(ref.lower()) else ref
    return base, NewPin(
        version,
        base.commit,
        tag,
        None,
        None,
        base.commit,
        trust=f"git commit {base.commit} from {base.source}",
    )


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


def _held_names(release: Release | None, want_sha: str | None) -> list[str]:
    """What `_from_mirror` and `_cached_wheel` look up: the full commit id, the imports."""
    names = [want_sha] if want_sha and len(want_sha) == 40 else []
    if release is not None:
        names += [SDIST_REF.format(version=release.version)]
        names += [WHEEL_REF.format(version=release.version)]
    return names


def _from_mirror(
    mirror: Mirror,
    target: Target,
    release: Release | None,
    want_sha: str | None,
    ref: str,
    held: dict[str, str | None],
    *,
    sdist: bool,
) -> Base | None:
    """A base the mirror holds (`held`: what `_held_names` named, as the mirror has it)."""
    repo = mirror.repo
    if not sdist and want_sha and len(want_sha) == 40 and held.get(want_sha) == want_sha:
        return Base(target.name, want_sha, "git", release, want_sha, pinned=release is not None)
    if sdist and release is not None:
        imported = held.get(SDIST_REF.format(version=release.version))
        if imported:
            return _sdist_base(repo, target, release, imported)
    if not sdist and release is None and HEX_RE.match(ref.lower()):
        sha = gitops.resolve(repo, ref.lower())
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
) -> Base | None:
    repo = mirror.repo
    ui.progress(f"fetching {target.name}@{ref} from {source}")
    try:
        if release is not None and release.tag:
            _refuse_moved_tag(target, release, source)
        if want_sha and len(want_sha) == 40:
            local = Path(source)
            if local.exists():
                gitops.fetch(repo, str(local), [f"{want_sha}:{GIT_REF.format(sha=want_sha)}"])
            else:
                gitops.fetch(repo, source, [f"{want_sha}:{GIT_REF.format(sha=want_sha)}"], depth=1)
            sha = want_sha
        else:
            remote_refs = gitops.list_remote(source)
            sha = _match_remote_ref(remote_refs, ref)
            if sha is None:
                attempts.append(Attempt(label, f"{source} has no ref '{ref}'"))
                return None
            gitops.fetch(repo, source, [f"{sha}:{GIT_REF.format(sha=sha)}"])
    except gitops.GitError as exc:
        attempts.append(Attempt(label, first_line(str(exc))))
        note_failure(source, str(exc), mirror.root)  # the next runs skip a host that is down
        return None
    if not gitops.has_commit(repo, sha):
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


def _from_sdist(
    mirror: Mirror, target: Target, release: Release, attempts: list[Attempt]
) -> Base | None:
    from patchkit.upstream.sdist import download_sdist, import_sdist

    try:
        archive = download_sdist(release, mirror.root)
    except FetchError as exc:
        attempts.append(Attempt("sdist", exc.message))
        return None
    ui.progress(f"importing {archive.name} into the {target.name} mirror")
    sha = import_sdist(mirror, target, release, archive)
    return _sdist_base(mirror.repo, target, release, sha)


def _sdist_base(repo: gitops.Repo, target: Target, release: Release, sha: str) -> Base:
    message = gitops.commit_message(repo, sha)
    fields = import_fields(message)
    upstream = fields.get("Patchkit-Upstream-Commit")
    recorded_sha = fields.get("Patchkit-Sdist-Sha256")
    if release.sdist_sha256 and recorded_sha and recorded_sha != release.sdist_sha256:
        raise PinError(
            f"the mirror's import of {release.sdist} has sha256 {recorded_sha}, the pin says "
            f"{release.sdist_sha256}; refusing",
            hint=f"remove {repo.path} and run again",
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


def _cached_wheel(
    mirror: Mirror, target: Target, release: Release, held: dict[str, str | None]
) -> Base | None:
    sha = held.get(WHEEL_REF.format(version=release.version))
    return _wheel_base(mirror.repo, target, release, sha) if sha else None


def _from_wheel(
    mirror: Mirror, target: Target, release: Release, attempts: list[Attempt]
) -> Base | None:
    pin = release.base_wheel
    assert pin is not None
    from patchkit.upstream.wheel import download_wheel, import_wheel

    try:
        archive = download_wheel(pin, mirror.root)
    except FetchError as exc:
        attempts.append(Attempt("wheel", exc.message))
        return None
    ui.progress(f"importing {archive.name} into the {target.name} mirror")
    sha = import_wheel(mirror, target, release, pin, archive)
    return _wheel_base(mirror.repo, target, release, sha)


def _wheel_base(repo: gitops.Repo, target: Target, release: Release, sha: str) -> Base:
    fields = wheel_fields(gitops.commit_message(repo, sha))
    pins = {w.filename: w.sha256 for w in release.wheels}
    name, recorded = fields.get("Patchkit-Wheel"), fields.get("Patchkit-Wheel-Sha256")
    if release.wheels and (name not in pins or pins[name] != recorded):
        raise PinError(
            f"the mirror's import of {target.name} {release.version} stands for {name} "
            f"(sha256 {recorded}), which the pin does not name; refusing",
            hint=f"remove {repo.path} and run again",
        )
    upstream = fields.get("Patchkit-Upstream-Commit")
    return Base(
        target=target.name,
        commit=sha,
        source="wheel",
        release=release,
        upstream_commit=None if upstream in (None, "unknown") else upstream,
        pinned=bool(release.wheels),
        wheel=name,
        wheel_sha256=recorded,
    )


def error_document(exc: PatchkitError) -> dict:
    """The `--json` document of a failure (a BaseUnavailable lists every source tried)."""
    if isinstance(exc, BaseUnavailable):
        return {"status": "error", **exc.to_json()}
    kind = re.sub(r"(?<!^)(?=[A-Z])", "-", type(exc).__name__).lower().removesuffix("-error")
    return {"status": "error", "error": kind, "message": exc.message, "next_step": exc.hint}
