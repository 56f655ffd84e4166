"""A patch in conflict, file by file and hunk by hunk: which parts still apply or are needed,
which moved to another module (`patchkit.classify.moved`), which upstream has already (the
whole file reverse-applies, every line it adds is there, or each of its hunks' effect is in the
release: `patchkit.classify.hunks`; or the patch's own `Applied-Upstream-Part:` declares it
upstream by this release), which patch code upstream rewrote (most of what the hunks anchor on
is gone from the file: read it), and which files are gone."""

from __future__ import annotations

from pathlib import Path

from unidiff import PatchSet

from patchkit import gitops
from patchkit.classify.delta import Delta
from patchkit.classify.hunks import hunk_verdicts
from patchkit.classify.model import HUNKS_SIGNAL, Part, Signal
from patchkit.classify.moved import moved_code
from patchkit.classify.signals import PART_TRAILER, PartClaim, part_claims
from patchkit.classify.text import decode, identifying, normalize, target_path
from patchkit.series import Patch

# Below this share of its anchoring lines (context and removed lines that name something) in
# the new file, a hunk's code is taken as gone.
ANCHOR_SHARE = 0.5


def patch_parts(
    mirror: gitops.Repo, env: dict[str, str], tip: str, patch: Patch, patch_file: Path,
    delta: Delta, release: str | None, old_base: str,
) -> list[Part]:  # fmt: skip
    """One Part per file of the patch.  `env` holds `tip`; only checks run against it.
    `release`: the version the new base stands for (the patch's per-file trailers are
    compared with it); `old_base`: the base the patch was written against."""
    claims = part_claims(patch)
    parts = []
    for pf in PatchSet(patch.diff):
        part = _part(mirror, env, tip, pf, patch_file, delta, old_base)
        parts.append(_declared(part, claims.get(part.path), release))
    return parts


def hunks_signal(parts: list[Part]) -> Signal:
    """Every file of the patch upstream, read from the release's code (not declared)."""
    by_code = [p for p in parts if p.state == "upstreamed" and PART_TRAILER not in p.detail]
    fired = bool(parts) and len(by_code) == len(parts)
    detail = f"{len(by_code)}/{len(parts)} of its files upstream by the release's code"
    if by_code:
        detail += ": " + "; ".join(f"{p.path.rsplit('/', 1)[-1]}: {p.detail}" for p in by_code)
    return Signal(HUNKS_SIGNAL, fired, detail)


def _declared(part: Part, claim: PartClaim | None, release: str | None) -> Part:
    """A part the patch's own trailer declares upstream by `release`, and that no longer
    applies (a part that still applies contradicts the claim: it stays as it is)."""
    if claim is None or not claim.covers(release) or part.state in ("applies", "upstreamed"):
        return part
    words = f"{claim.words()}; here: {part.state}, {part.detail}"
    return Part(part.path, "upstreamed", words, part.hunks)


def _part(mirror, env, tip, pf, patch_file: Path, delta: Delta, old_base: str) -> Part:
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
    part = _read_against(pf, path, where, {normalize(ln) for ln in text.splitlines()})
    if part.state == "upstreamed":
        return part
    old_text = decode(gitops.show_file(mirror, old_base, source))
    return _by_hunk(part, hunk_verdicts(pf, where, old_text, text, delta))


def _by_hunk(part: Part, verdicts) -> Part:
    """The part as its hunks say: upstreamed when every hunk's effect is in the release,
    else as read, listing the hunks that are."""
    part.hunks = [v.to_json() for v in verdicts]
    upstream = [v for v in verdicts if v.state == "upstream"]
    if not upstream:
        return part
    words = "; ".join(f"{v.header} {v.how}: {v.evidence}" for v in upstream)
    if len(upstream) == len(verdicts):
        return Part(part.path, "upstreamed", f"every hunk's effect is in the release: {words}",
                    part.hunks)  # fmt: skip
    needed = "; ".join(f"{v.header}: {v.evidence}" for v in verdicts if v.state != "upstream")
    state = "needed" if part.state == "rewritten" else part.state
    detail = f"{len(upstream)}/{len(verdicts)} hunk(s) upstream ({words}); still needed: {needed}"
    return Part(part.path, state, detail, part.hunks)


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
