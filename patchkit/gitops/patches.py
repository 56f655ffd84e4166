"""Patches in and out: `git apply` into a scratch index, `format-patch` in the series'
canonical form, patch ids."""

from __future__ import annotations

from pathlib import Path

from patchkit.gitops.faults import GitError
from patchkit.gitops.repo import Repo, verb


@verb
def apply_to_index(
    repo: Repo,
    env: dict[str, str],
    patch_file: Path,
    *,
    reverse: bool = False,
    check: bool = False,
    context: int | None = None,
    threeway: bool = False,
    include: str | None = None,
) -> tuple[bool, str]:
    """`git apply --cached` into the scratch index; returns (applied, git's messages)."""
    args = ["apply", "--cached", "--whitespace=nowarn"]
    if reverse:
        args.append("--reverse")
    if check:
        args.append("--check")
    if context is not None:
        args.append(f"-C{context}")
    if threeway:
        args.append("--3way")
    if include:
        args.append(f"--include={include}")
    return _apply_cached(repo, env, [*args, str(patch_file)])


def _apply_cached(repo: Repo, env: dict[str, str], args: list[str]) -> tuple[bool, str]:
    try:
        repo.run(*args, env=env)
    except GitError as exc:
        return False, exc.stderr
    return True, ""


@verb
def apply_all_to_index(repo: Repo, env: dict[str, str], patch_files: list[Path]) -> bool:
    """One `git apply --cached` of several patches, in order, into the scratch index. git
    checks every patch before it writes the index: when one does not apply, the index is
    left as it was and False is returned."""
    args = ["apply", "--cached", "--whitespace=nowarn", *map(str, patch_files)]
    return _apply_cached(repo, env, args)[0]


@verb
def patch_file_paths(repo: Repo, patch_files: list[Path]) -> list[str]:
    """The path of every file section of `patch_files`, in order, as `git apply` reads them
    (its new name, or the old one for a deletion); one `git apply --numstat -z`, which
    applies nothing."""
    out = bytes(repo.run("apply", "--numstat", "-z", *map(str, patch_files), binary=True))
    fields = out.split(b"\0")
    paths = []
    i = 0
    while i < len(fields):
        parts = fields[i].split(b"\t", 2)
        i += 1
        if len(parts) != 3:
            continue
        name = parts[2]
        if not name and i + 1 < len(fields):  # "added\tdeleted\t\0old\0new": the new name
            name = fields[i + 1]
            i += 2
        paths.append(name.decode("utf-8", "surrogateescape"))
    return paths


@verb
def apply_three_way(
    repo: Repo, env: dict[str, str], patch_file: Path
) -> tuple[str, list[str], str]:
    """`git apply --cached --3way` into a scratch index.

    Returns (outcome, conflicted paths, git's messages); outcome is "applied", "conflict" or
    "failed" (the recorded pre-image blobs are missing or the patch is unusable).
    """
    try:
        repo.run(
            "apply",
            "--cached",
            "--3way",
            "--whitespace=nowarn",
            str(patch_file),
            env=env,
        )
    except GitError as exc:
        conflicted = unmerged_paths(repo, env)
        if conflicted:
            return "conflict", conflicted, exc.stderr
        return "failed", [], exc.stderr
    return "applied", [], ""


@verb
def unmerged_paths(repo: Repo, env: dict[str, str]) -> list[str]:
    out = str(repo.run("ls-files", "--unmerged", "-z", env=env, check=False))
    paths = []
    for entry in out.split("\0"):
        if "\t" in entry:
            path = entry.split("\t", 1)[1]
            if path not in paths:
                paths.append(path)
    return paths


# Electron's export: renames detected, no stat, no signature, zeroed commit id, full index lines
# (so `git apply --3way` keeps working on the exported files), subject kept as written.
EXPORT_ARGS = (
    "format-patch",
    "--keep-subject",
    "--no-stat",
    "--no-signature",
    "--zero-commit",
    "--full-index",
    "--stdout",
    "--no-color",
    "--no-attach",
    "--no-numbered",
    "--no-thread",
    "--no-cover-letter",
    "--encode-email-headers",
)


@verb
def format_patches(repo: Repo, base: str, tip: str) -> bytes:
    """`git format-patch` of base..tip in the series' canonical form, as one mbox stream."""
    # The sealed environment (no user or system configuration, pinned settings): the bytes
    # depend on the commits and git only.
    return bytes(repo.run("-c", "diff.renames=true", *EXPORT_ARGS, f"{base}..{tip}", binary=True))


@verb
def patch_id(repo: Repo, diff: bytes) -> str | None:
    """git's stable patch id of a diff (None for an empty diff)."""
    out = str(repo.run("patch-id", "--stable", stdin=diff)).strip()
    return out.split()[0] if out else None


@verb
def patch_id_of_commit(repo: Repo, commit: str) -> str | None:
    diff = repo.run("diff-tree", "-p", "--full-index", commit, binary=True)
    return patch_id(repo, bytes(diff))


@verb
def patch_ids_in_range(repo: Repo, base: str, tip: str, paths: list[str]) -> dict[str, str]:
    """patch-id -> commit for the non-merge commits of base..tip that touch `paths`."""
    log = bytes(
        repo.run(
            "log",
            "--no-merges",
            "-p",
            "--full-index",
            "--no-color",
            "--format=commit %H",
            f"{base}..{tip}",
            "--",
            *paths,
            binary=True,
        )
    )
    if not log.strip():
        return {}
    out = str(repo.run("patch-id", "--stable", stdin=log))
    ids = {}
    for line in out.splitlines():
        pid, _, commit = line.partition(" ")
        ids.setdefault(pid, commit)
    return ids
