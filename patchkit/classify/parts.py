"""A patch in conflict, file by file: which parts still apply or are needed, which moved to
another module (`patchkit.classify.moved`), which upstream has already (or the patch's own
`Applied-Upstream-Part:` declares upstream by this release), which patch code upstream rewrote
(most of what the hunks anchor on is gone from the file: that part is probably no longer
needed, read it), and which files are gone."""

from __future__ import annotations

from pathlib import Path

from unidiff import PatchSet

from patchkit import gitops
from patchkit.classify.delta import Delta
from patchkit.classify.model import Part
from patchkit.classify.moved import moved_code
from patchkit.classify.signals import PartClaim, part_claims
from patchkit.classify.text import decode, identifying, normalize, target_path
from patchkit.series import Patch

# Below this share of its anchoring lines (context and removed lines that name something) in
# the new file, a hunk's code is taken as gone.
ANCHOR_SHARE = 0.5


def patch_parts(
    mirror: gitops.Repo, env: dict[str, str], tip: str, patch: Patch, patch_file: Path,
    delta: Delta, release: str | None,
) -> list[Part]:  # fmt: skip
    """One Part per file of a multi-file patch (none for a one-file patch: the patch's own
    label says it).  `env` holds `tip`; only checks run against it.  `release`: the version
    the new base stands for (the patch's per-file trailers are compared with it)."""
    files = PatchSet(patch.diff)
    if len(files) < 2:
        return []
    claims = part_claims(patch)
    parts = []
    for pf in files:
        part = _part(mirror, env, tip, pf, patch_file, delta)
        parts.append(_declared(part, claims.get(part.path), release))
    return parts


def _declared(part: Part, claim: PartClaim | None, release: str | None) -> Part:
    """A part the patch's own trailer declares upstream by `release`, and that no longer
    applies (a part that still applies contradicts the claim: it stays as it is)."""
    if claim is None or not claim.covers(release) or part.state in ("applies", "upstreamed"):
        return part
    return Part(part.path, "upstreamed", f"{claim.words()}; here: {part.state}, {part.detail}")


def _part(mirror, env, tip, pf, patch_file: Path, delta: Delta) -> Part:
    path = target_path(pf)
    if _applies(mirror, env, patch_file, path):
        return Part(path, "applies", "applies on its own")
    if _applies(mirror, env, patch_file, path, reverse=True):
        return Part(path, "upstreamed", "git apply --reverse --check succeeds for this file")
    source = pf.source_file[2:] if pf.source_file.startswith("a/") else path
    where = delta.renames.get(source, source)
    text = decode(gitops.show_file(mirror, tip, where))
    if not text and not pf.is_added_file:
        moved = moved_code(pf, delta, source)
        if moved is not None:
            return Part(path, "moved", f"{source} is gone; {moved.words()}: carry it there")
        return Part(path, "gone", f"{source} is gone from the new base (moved or removed)")
    return _read_against(pf, path, where, {normalize(ln) for ln in text.splitlines()})


def _read_against(pf, path: str, where: str, have: set[str]) -> Part:
    """A file's part that does not apply, read against the new file's lines (`have`)."""
    added = [normalize(ln.value) for h in pf for ln in h if ln.is_added and identifying(ln.value)]
    if added and all(a in have for a in added):
        return Part(path, "upstreamed", f"all {len(added)} added lines are in {where}")
    anchors = [
        normalize(ln.value)
        for h in pf
        for ln in h
        if (ln.is_context or ln.is_removed) and identifying(ln.value)
    ]
    found = sum(1 for a in anchors if a in have)
    if anchors and found < ANCHOR_SHARE * len(anchors):
        return Part(
            path,
            "rewritten",
            f"{found}/{len(anchors)} of the lines its hunks patch are left in {where}: the code "
            "it changes was rewritten upstream (read it: is this part still needed?)",
        )
    return Part(path, "needed", f"does not apply to {where}; {found}/{len(anchors)} anchors left")


def _applies(mirror, env, patch_file: Path, path: str, reverse: bool = False) -> bool:
    return gitops.apply_to_index(
        mirror, env, patch_file, check=True, reverse=reverse, include=path
    )[0]
