"""The upstream-detection signals computed for a patch that does not carry as text.

- strong: patch-id equality with an upstream commit of old..new (needs git history on both
  sides), reverse-apply of the patch on the new base, the patch becoming empty after a 3-way
  merge;
- weak: reverse-apply with reduced context (-C1), every added line already present in the new
  base's files;
- equivalent: `patchkit.classify.definitions`;
- declared: the patch's own `Applied-Upstream:` trailer names this release or an earlier one;
  or its `Applied-Upstream-Part:` trailers (`<release> <file>... (<why>)`, one per release:
  upstream met the purpose of those files' hunks differently) together cover every file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version
from unidiff import PatchSet

from patchkit import gitops
from patchkit.classify.model import Signal
from patchkit.classify.text import TRIVIAL_LINE, decode, normalize, target_path
from patchkit.series import Patch

_VERSION_RE = re.compile(r"(?<![\w.])v?(\d+(?:\.\d+)+(?:\.?post\d+)?)")


def patch_id_signal(mirror: gitops.Repo, patch: Patch, range_ids: dict[str, str] | None) -> Signal:
    if range_ids is None:
        detail = "not available: a base is an sdist or wheel import (no upstream history)"
        return Signal("patch-id", None, detail)
    pid = gitops.patch_id(mirror, patch.diff.encode())
    hit = range_ids.get(pid or "")
    if hit:
        return Signal("patch-id", True, f"equal to upstream commit {hit}")
    return Signal(
        "patch-id", False, f"no commit of the upstream range has patch-id {(pid or '-')[:12]}"
    )


def reverse_signals(mirror: gitops.Repo, env: dict[str, str], patch_file: Path) -> list[Signal]:
    full = gitops.apply_to_index(mirror, env, patch_file, reverse=True, check=True)[0]
    reduced = (
        full
        or gitops.apply_to_index(mirror, env, patch_file, reverse=True, check=True, context=1)[0]
    )
    return [
        Signal(
            "reverse-apply",
            full,
            "git apply --reverse --check " + ("succeeds" if full else "fails") + " on the new base",
        ),
        Signal(
            "reverse-apply-reduced-context",
            reduced,
            "git apply --reverse --check -C1 " + ("succeeds" if reduced else "fails"),
        ),
    ]


def three_way(
    mirror: gitops.Repo, env: dict[str, str], tip: str, patch_file: Path
) -> tuple[Signal, str | None, list[str]]:
    """The empty-after-3way signal, the merged tree (None: conflict, impossible or empty) and
    the conflicted paths.  Leaves the index wherever the merge left it."""
    result, conflicts, err = gitops.apply_three_way(mirror, env, patch_file)
    if result == "applied":
        tree = gitops.write_tree(mirror, env)
        empty = tree == gitops.tree_of(mirror, tip)
        words = "nothing left (empty)" if empty else "changes remain"
        return (
            Signal("empty-after-3way", empty, f"3-way merge applied: {words}"),
            None if empty else tree,
            [],
        )
    if result == "conflict":
        detail = f"3-way merge conflicts in {', '.join(conflicts)}"
        return Signal("empty-after-3way", False, detail), None, conflicts
    first = next((ln for ln in err.splitlines() if ln.strip()), "failed")
    return Signal("empty-after-3way", None, f"3-way merge impossible: {first}"), None, []


def added_lines_signal(mirror: gitops.Repo, tip: str, patch: Patch) -> Signal:
    """Every non-trivial added line of the patch already present in the new base's file."""
    wanted = present = 0
    for pf in PatchSet(patch.diff):
        blob = gitops.show_file(mirror, tip, target_path(pf))
        have = {normalize(ln) for ln in decode(blob).splitlines()}
        for hunk in pf:
            for line in hunk:
                if not line.is_added or TRIVIAL_LINE.match(line.value):
                    continue
                wanted += 1
                present += normalize(line.value) in have
    fired = wanted > 0 and present == wanted
    return Signal(
        "added-lines-present",
        fired,
        f"{present}/{wanted} added lines already in the new base's files",
    )


PART_TRAILER = "Applied-Upstream-Part"


@dataclass(frozen=True)
class PartClaim:
    """One file of the patch its own `Applied-Upstream-Part:` trailer declares upstream."""

    path: str
    release: Version
    text: str  # the trailer's value

    def covers(self, release: str | None) -> bool:
        return release is not None and self.release <= Version(release)

    def words(self) -> str:
        return f"declared by the patch's own {PART_TRAILER}: {self.text}"


def part_claims(patch: Patch) -> dict[str, PartClaim]:
    """The patch's files its `Applied-Upstream-Part:` trailers name (a file is named by its
    path or a tail of it, `models/glm4_moe.py`), each with the release named first."""
    paths = [f.path for f in patch.files]
    out: dict[str, PartClaim] = {}
    for key, value in patch.trailers:
        if key.lower() != PART_TRAILER.lower():
            continue
        release = claimed_version(value)
        if release is None:
            continue
        for path in claimed_paths(value, paths):
            out.setdefault(path, PartClaim(path, release, value))
    return out


def claimed_paths(value: str, paths: list[str]) -> list[str]:
    """The paths of `paths` a trailer's words name, whole or by a tail after a `/`."""
    words = {w.strip("(),;:") for w in value.split()}
    return [p for p in paths if any(w and (p == w or p.endswith("/" + w)) for w in words)]


def trailer_signal(patch: Patch, release: str | None) -> Signal:
    """The patch's `Applied-Upstream:` trailer names `release` or an earlier one, or its
    `Applied-Upstream-Part:` trailers cover every one of its files by `release`."""
    claim = patch.trailer("Applied-Upstream")
    if not claim:
        claims = part_claims(patch)
        if not claims:
            return Signal(
                "applied-upstream-trailer", False, "the patch carries no Applied-Upstream:"
            )
        covered = [c for c in claims.values() if c.covers(release)]
        fired = len(covered) == len(patch.files)
        return Signal(
            "applied-upstream-trailer",
            fired,
            f"{len(covered)}/{len(patch.files)} of its files declared upstream by {release} "
            f"(its own {PART_TRAILER}: trailers)",
        )
    named = claimed_version(claim)
    if release is None or named is None:
        return Signal(
            "applied-upstream-trailer", None, f"Applied-Upstream: {claim} (no version to compare)"
        )
    fired = named <= Version(release)
    relation = "at or before" if fired else "after"
    return Signal(
        "applied-upstream-trailer",
        fired,
        f"the patch's own trailer, Applied-Upstream: {claim} ({named} is {relation} {release})",
    )


def claimed_version(claim: str) -> Version | None:
    """The first release a trailer names (None: none)."""
    match = _VERSION_RE.search(claim)
    if not match:
        return None
    try:
        return Version(match.group(1))
    except InvalidVersion:
        return None
