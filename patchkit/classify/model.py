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
# `hunks-upstream`: every file of a patch in conflict is upstream by the release's code, hunk by
# hunk (`patchkit.classify.hunks`).
HUNKS_SIGNAL = "hunks-upstream"
EQUIVALENT_SIGNALS = ("definitions-present", "definitions-relocated", HUNKS_SIGNAL)
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
    hunks: list[dict] = field(default_factory=list)  # HunkVerdict.to_json() of each hunk

    @property
    def upstream_hunks(self) -> int:
        return sum(1 for h in self.hunks if h.get("state") == "upstream")

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
    probes: list = field(default_factory=list)  # classify.probes.ProbeResult, one per probe

    @property
    def fired(self) -> list[str]:
        return [s.name for s in self.signals if s.fired]

    @property
    def partly_upstreamed(self) -> bool:
        """In conflict, with some of its files or hunks upstream already while others are
        still needed (a file upstream rewrote is not upstream: it is still to be read)."""
        upstream = any(p.state == "upstreamed" or p.upstream_hunks for p in self.parts)
        left = any(p.state != "upstreamed" for p in self.parts)
        return self.label == "conflict" and upstream and left

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
            "probes": [p.to_json() for p in self.probes],
        }
