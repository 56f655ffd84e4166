"""Classifying each patch of a series on a new upstream base, with its evidence.

Labels: `clean` (applies unchanged), `offset` (applies, only line numbers moved), `merged`
(needed a 3-way merge, no conflict), `conflict` (needs a human; `parts` says which of its files
still apply or are needed and which upstream already has or rewrote), `upstreamed` (the new
base already has the change), `obsolete` (a packaging patch whose files a wheel base lacks,
its purpose met by the release's own requirements).  `upstreamed` is decided from several
signals, each reported (`patchkit.classify.signals`, `patchkit.classify.definitions`):

- one strong signal (patch-id, reverse-apply, empty-after-3way), or both weak ones
  (reverse-apply -C1, added-lines-present), or an equivalent one (definitions present in the
  patch's files, or relocated anywhere in the new tree);
- or, for a patch that no longer applies, its own `Applied-Upstream:` trailer naming this
  release or an earlier one.

Every signal is reported because any single one is wrong in some cases (a change merged upstream
after an unrelated edit nearby fools patch-id and the full-context reverse check, not -C1).
`rebase` and `outlook` both classify through `carry_series`; nothing here prints.
"""

from __future__ import annotations

from patchkit.classify.carry import Carry, NewBase, carry_series, clean_or_offset
from patchkit.classify.hints import wheel_requires
from patchkit.classify.model import (
    DECLARED_SIGNALS,
    EQUIVALENT_SIGNALS,
    LABELS,
    PART_STATES,
    REMOVED_LABELS,
    STRONG_SIGNALS,
    WEAK_SIGNALS,
    Part,
    PatchOutcome,
    Signal,
)

__all__ = [
    "DECLARED_SIGNALS",
    "EQUIVALENT_SIGNALS",
    "LABELS",
    "PART_STATES",
    "REMOVED_LABELS",
    "STRONG_SIGNALS",
    "WEAK_SIGNALS",
    "Carry",
    "NewBase",
    "Part",
    "PatchOutcome",
    "Signal",
    "carry_series",
    "clean_or_offset",
    "wheel_requires",
]
