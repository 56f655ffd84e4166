"""The upstream-detection signals computed for a patch that does not carry as text.

- strong: patch-id equality with an upstream commit of old..new (needs git history on both
  sides), reverse-apply of the patch on the new base, the patch becoming empty after a 3-way
  merge;
- weak: reverse-apply with reduced context (-C1), every added line already present in the new
  base's files;
- equivalent: `patchkit.classify.definitions`;
- declared: the patch's own `Applied-Upstream:` trailer names this release or an earlier one.
"""

from __future__ import annotations

import re
from pathlib import Path

from packaging.version import InvalidVersion, Version
from unidiff import PatchSet

from patchkit import gitops
from patchkit.classify.model import Signal
from patchkit.classify.text import TRIVIAL_LINE, decode, normalize, target_path
from patchkit.series import Patch

_VERSION_RE = re.compile(r"(?<![\w.])v?(\d+(?:\.\d+)+(?:\.?post\d+)?)")


def patch_id_signal(mirror: Path, patch: Patch, range_ids: dict[str, str] | None) -> Signal:
    if range_ids is None:
        detail = "not available: a base is an sdist or wheel import (no upstream history)"
        return Signal("patch-id", None, detail)
    pid = gitops.patch_id_bare(mirror, patch.diff.encode(), bare=True)
    hit = range_ids.get(pid or "")
    if hit:
        return Signal("patch-id", True, f"equal to upstream commit {hit}")
    return Signal(
        "patch-id", False, f"no commit of the upstream range has patch-id {(pid or '-')[:12]}"
    )


def reverse_signals(mirror: Path, env: dict[str, str], patch_file: Path) -> list[Signal]:
    full = gitops.apply_to_index(mirror, env, patch_file, reverse=True, check=True, bare=True)[0]
    reduced = (
        full
        or gitops.apply_to_index(
            mirror, env, patch_file, reverse=True, check=True, context=1, bare=True
        )[0]
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
    mirror: Path, env: dict[str, str], tip: str, patch_file: Path
) -> tuple[Signal, str | None, list[str]]:
    """The empty-after-3way signal, the merged tree (None: conflict, impossible or empty) and
    the conflicted paths.  Leaves the index wherever the merge left it."""
    result, conflicts, err = gitops.apply_three_way(mirror, env, patch_file, bare=True)
    if result == "applied":
        tree = gitops.write_tree(mirror, env, bare=True)
        empty = tree == gitops.tree_of(mirror, tip, bare=True)
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


def added_lines_signal(mirror: Path, tip: str, patch: Patch) -> Signal:
    """Every non-trivial added line of the patch already present in the new base's file."""
    wanted = present = 0
    for pf in PatchSet(patch.diff):
        blob = gitops.show_file(mirror, tip, target_path(pf), bare=True)
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


def trailer_signal(patch: Patch, release: str | None) -> Signal:
    """The patch's `Applied-Upstream:` trailer names `release` or an earlier one."""
    claim = patch.trailer("Applied-Upstream")
    if not claim:
        return Signal("applied-upstream-trailer", False, "the patch carries no Applied-Upstream:")
    named = _claimed_version(claim)
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


def _claimed_version(claim: str) -> Version | None:
    match = _VERSION_RE.search(claim)
    if not match:
        return None
    try:
        return Version(match.group(1))
    except InvalidVersion:
        return None
