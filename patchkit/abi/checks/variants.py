"""Builds of one object for several stacks, of which the package loads the one for its stack.

A package may ship an object once per CUDA major (``torch_memory_saver_hook_mode_torch_cu12``
and ``_cu13``, ``cuda/core/cu12/`` and ``cu13/``) or per torch release
(``libtorch_c_dlpack_addon_torch24-cpu.so`` … ``torch29``) and load the one whose tag names
the CUDA or torch it runs with. The objects whose paths differ only in such a tag (a CUDA
tag's untagged twin counted as one of them) are one set; where a member's tag names this
stack, the others are not loaded here and are left out of the checks (one note per package);
where none does, none is checked (a warning: the package loads none of them, or fails).
"""

from __future__ import annotations

import re
from collections import defaultdict

from patchkit.abi.checks.context import Context, owner_label

# A CUDA tag (cu12, cu13, cu130, cuda12) or a torch tag (torch29, torch210) between separators.
CUDA_TAG = re.compile(r"(?:^|(?<=/)|[_-])cu(?:da)?(?P<n>\d{2,3})(?=$|[/._-])")
TORCH_TAG = re.compile(r"(?:^|(?<=/)|[_-])torch(?P<n>\d{2,3})(?=$|[/._-])")


def _cuda_major(tag: str) -> int:
    """cu12 -> 12, cu130 -> 13."""
    return int(tag[:2])


def select_variants(ctx: Context) -> None:
    """Leave out of ``ctx.reports`` the builds for another stack (see the module)."""
    cuda = ctx.torch.major or ctx.profile.cuda_major
    torch_version = (ctx.torch.version or ctx.profile.torch_version).split("+", 1)[0]
    torch_tag = "".join(torch_version.split(".")[:2])
    dropped: dict[str, list[str]] = defaultdict(list)
    kept: dict[str, list[str]] = defaultdict(list)
    none: dict[str, list[str]] = defaultdict(list)
    tests = (
        (CUDA_TAG, lambda n: n is not None and _cuda_major(n) == cuda),
        (TORCH_TAG, lambda n: n == torch_tag),
    )
    for pattern, wanted in tests:
        for members in _sets(ctx.reports, pattern).values():
            match = [r for r, n in members if wanted(n)]
            label = owner_label(ctx, members[0][0], ctx.reports[members[0][0]])
            others = [r for r, _ in members if r not in match]
            (dropped if match else none)[label].extend(others)
            kept[label].extend(match)
    gone = {r for rels in (*dropped.values(), *none.values()) for r in rels}
    if gone:
        ctx.reports = {rel: rep for rel, rep in ctx.reports.items() if rel not in gone}
        _emit(ctx, dropped, kept, none, f"CUDA {cuda}, torch {torch_version}")


def _emit(ctx: Context, dropped: dict, kept: dict, none: dict, stack: str) -> None:
    """One note per package whose builds for another stack were left out, one warning per
    package with none for this stack."""
    for label, rels in sorted(dropped.items()):
        used = sorted(kept[label])
        ctx.emit(
            "variant-unused",
            label,
            evidence=tuple(sorted(rels)),
            n=len(rels),
            stack=stack,
            used=", ".join(used[:3]) + (" …" if len(used) > 3 else ""),
        )
    for label, rels in sorted(none.items()):
        ctx.emit("variant-none", label, evidence=tuple(sorted(rels)), n=len(rels), stack=stack)


def _sets(reports: dict, pattern: re.Pattern) -> dict[str, list[tuple[str, str | None]]]:
    """key -> [(tree path, tag number or None for the untagged twin)] for each set of two or
    more objects whose paths differ only in a tag ``pattern`` finds."""
    groups: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for rel in reports:
        found = list(pattern.finditer(rel))
        if len(found) == 1:
            m = found[0]
            groups[rel[: m.start()] + rel[m.end() :]].append((rel, m.group("n")))
    if pattern is CUDA_TAG:  # the untagged twin of a CUDA-tagged build is its default one
        for rel in reports:
            if rel in groups and not pattern.search(rel):
                groups[rel].append((rel, None))
    return {
        key: sorted(members, key=lambda m: m[0])
        for key, members in groups.items()
        if len(members) > 1 and len({n for _, n in members}) > 1
    }
