"""Talking to other repositories: the allowed sources, fetch and ls-remote."""

from __future__ import annotations

import os
import re

from patchkit.errors import UsageError
from patchkit.gitops.repo import _NOWHERE, ALLOWED_SCHEMES, Repo, verb


class UnsafeSourceError(UsageError):
    """An upstream source that could make git run a command or read an option."""


def check_source(source: str) -> str:
    """`source` as given when it is a local path or a URL of an allowed scheme, else refuse.

    A leading '-' would be read as an option (`--upload-pack=...` runs a command) and
    `transport::address` selects a remote helper, a program.
    """
    allowed = ", ".join(ALLOWED_SCHEMES)
    if not source or source.startswith("-") or "\0" in source or "\n" in source:
        raise UnsafeSourceError(
            f"upstream source {source!r} is not allowed (it would be read as a git option)",
            hint=f"pass a local path or a URL ({allowed})",
        )
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", source)
    helper = re.match(r"^([A-Za-z0-9+.-]+)::", source)
    if helper or (scheme and scheme.group(1).lower() not in ALLOWED_SCHEMES):
        name = (helper or scheme).group(1)
        raise UnsafeSourceError(
            f"upstream source {source!r} uses the transport {name!r}, which is not allowed",
            hint=f"pass a local path or a URL ({allowed})",
        )
    return source


def _source_argument(source: str) -> str:
    """`source` checked, a local path made absolute: git runs in patchkit's scratch folder
    when it fetches into a bare mirror, not where the path was given."""
    source = check_source(source)
    head = source.split(":", 1)[0]
    if "://" in source or (":" in source and "/" not in head):  # a URL, or scp-like host:path
        return source
    return os.path.abspath(os.path.expanduser(source))


@verb
def fetch(repo: Repo, source: str, refspecs: list[str], *, depth: int | None = None) -> None:
    """Fetch `refspecs` from `source` (a URL or a path) into `repo`."""
    args = ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head"]
    if depth:
        args.append(f"--depth={depth}")
    repo.run(*args, "--", _source_argument(source), *refspecs)


@verb
def fetch_commit_from(repo: Repo, source: Repo, sha: str) -> None:
    """Bring one commit (and its history) from another local repository. Where the source
    is shallow (a mirror's `--depth=1` fetch) and `repo` lacks what it cut off, the cut is
    added to `repo`'s `shallow` file (`--update-shallow`): else git takes the objects, says
    nothing, and `repo` names parents it does not hold."""
    repo.run(
        "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--update-shallow",
        "--", str(source.path), sha,
    )  # fmt: skip


def list_remote(source: str) -> dict[str, str]:
    """ref name -> sha of a remote (tags peeled)."""
    out = Repo.bare_at(_NOWHERE).run("ls-remote", "--", _source_argument(source))
    refs = {}
    for line in str(out).splitlines():
        sha, _, name = line.partition("\t")
        refs[name.removesuffix("^{}")] = sha
    return refs


def remote_tag(source: str, tag: str) -> str | None:
    """The commit the tag `tag` names in a remote (peeled), or None when it has no such tag."""
    out = str(
        Repo.bare_at(_NOWHERE).run(
            "ls-remote",
            "--tags",
            "--",
            _source_argument(source),
            f"refs/tags/{tag}",
            f"refs/tags/{tag}^{{}}",
        )
    )
    found: dict[str, str] = {}
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        found[name] = sha
    return found.get(f"refs/tags/{tag}^{{}}") or found.get(f"refs/tags/{tag}")
