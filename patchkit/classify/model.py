"""What a classification is made of: the labels, the signals and a patch's outcome."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

LABELS = (
    "clean",
    "offset",
    "merged",
    "conflict",
    "upstreamed",
    "obsolete",
    "resolved",
    "dropped",
)
# Leave the series when --write records a rebase: upstreamed (the new base has the change),
# obsolete (what it edits is gone and the release meets its purpose) and dropped (left out by
# hand while resolving: no upstream evidence, so no Applied-Upstream).
REMOVED_LABELS = ("upstreamed", "obsolete", "dropped")
STRONG_SIGNALS = ("patch-id", "reverse-apply", "empty-after-3way")
WEAK_SIGNALS = ("reverse-apply-reduced-context", "added-lines-present")
# Fire for a patch upstream implemented differently: its definitions are new in the new base
# (in its own files, or under another name elsewhere), its other additions and removals matched.
EQUIVALENT_SIGNALS = ("definitions-present", "definitions-relocated")
# The patch's own `Applied-Upstream:` trailer names this release or an earlier one.
DECLARED_SIGNALS = ("applied-upstream-trailer",)
# The states of one file of a patch that does not carry as a whole (`PatchOutcome.parts`).
# `moved`: the file is gone, the code its hunks change lives on in another module (still
# needed there); `upstreamed` also covers a file the patch's own Applied-Upstream-Part: names.
PART_STATES = ("applies", "needed", "moved", "upstreamed", "rewritten", "gone")


@dataclass
class Signal:
    """One piece of upstream-detection evidence; fired is None when it could not be computed."""

    name: str
    fired: bool | None
    detail: str

    @property
    def strong(self) -> bool:
        return self.name in STRONG_SIGNALS


@dataclass
class Part:
    """One file of a patch in conflict: whether that part still applies, is still needed (in
    place, or where its code moved), is upstream already, patches code upstream rewrote, or
    edits a file that is gone."""

    path: str
    state: str
    detail: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class PatchOutcome:
    """The classification of one patch on the new base."""

    name: str
    label: str
    signals: list[Signal] = field(default_factory=list)
    commit: str | None = None
    refreshed: bytes | None = None
    changed: bool = False
    conflicts: list[str] = field(default_factory=list)
    note: str = ""
    provisional: bool = False  # classified while an earlier patch was left out (conflict)
    tree: str | None = field(default=None, repr=False)  # the carried tree, before committing
    parts: list[Part] = field(default_factory=list)

    @property
    def fired(self) -> list[str]:
        return [s.name for s in self.signals if s.fired]

    @property
    def partly_upstreamed(self) -> bool:
        """In conflict, but some of its files are upstream already or patch code upstream
        rewrote, while others are still needed."""
        states = {p.state for p in self.parts}
        return (
            self.label == "conflict"
            and bool(states & {"upstreamed", "rewritten"})
            and bool(states & {"applies", "needed", "moved", "gone"})
        )

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "label": self.label,
            "changed": self.changed,
            "commit": self.commit,
            "signals": [dataclasses.asdict(s) for s in self.signals],
            "conflicts": self.conflicts,
            "note": self.note,
            "provisional": self.provisional,
            "parts": [p.to_json() for p in self.parts],
        }
