"""The record of a carried series: a rebase preview (or a review against a release) of the
same series between the same two bases gives the same outcomes, so the second one reads them.

The key covers both bases (a commit id names its bytes), each patch's name and bytes, what
the classification knows of the new base (its release, its wheel's sha256, upstream's
patch-ids), the source of the code that classifies, applies and exports, the Python version
and the git program. A record is used only while every commit it names is still in the
mirror (`cache --prune` removes the unnamed ones): else the series is carried again.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path

from patchkit import gitops
from patchkit.classify import Carry, Part, PatchOutcome, Signal
from patchkit.classify.probes import ProbeResult
from patchkit.series import Series
from patchkit.stamps import Stamp, module_files, series_key
from patchkit.upstream import Base

CODE = (
    "patchkit.classify",
    "patchkit.carry_record",
    "patchkit.apply",
    "patchkit.export",
    "patchkit.gitops",
    "patchkit.series",
    "unidiff.patch",
)


def carry_stamp(
    cache: Path,
    target: str,
    series: Series,
    old: str,
    new: Base,
    range_ids: dict[str, str] | None,
) -> Stamp:
    """Where the carry of `series` from `old` onto `new` is recorded, under its key (a wheel
    base by its wheel's name and sha256: its Requires-Dist is read from that file)."""
    facts = [new.release.version if new.release else None, new.wheel, new.wheel_sha256]
    key = series_key(
        "carry",
        old,
        series.patches,
        module_files(CODE),
        gitops.program_identity(),
        new.commit,
        json.dumps([facts, range_ids], sort_keys=True),
    )
    return Stamp(cache / "verified" / f"carry-{target}-{old[:12]}-{new.commit[:12]}", key)


def read_carry(stamp: Stamp, mirror: gitops.Repo) -> Carry | None:
    """The recorded carry, or None (none, another key, unreadable, or a commit it names is
    no longer in the mirror)."""
    payload = stamp.payload()
    if not payload:
        return None
    try:
        data = json.loads(payload)
        carry = Carry([_outcome(o) for o in data["outcomes"]], data["tip"])
    except (ValueError, KeyError, TypeError):
        return None
    commits = [carry.tip] + [o.commit for o in carry.outcomes if o.commit]
    held = gitops.read_commits(mirror, commits)
    if any(held.get(c) != c for c in commits):
        return None
    return carry


def record_carry(stamp: Stamp, carry: Carry) -> None:
    """Record `carry` (a cache that cannot be written is skipped: the next run carries)."""
    try:
        outcomes = [_outcome_json(o) for o in carry.outcomes]
        payload = json.dumps({"tip": carry.tip, "outcomes": outcomes})
    except TypeError:  # a field this record does not know how to keep: carried next time
        return
    stamp.record(payload)


# PatchOutcome's fields that hold lists of these records (any other field is plain JSON)
_RECORDS = {"signals": Signal, "parts": Part, "probes": ProbeResult}


def _outcome_json(outcome: PatchOutcome) -> dict:
    data = {f.name: getattr(outcome, f.name) for f in dataclasses.fields(PatchOutcome)}
    for name in _RECORDS.keys() & data.keys():
        data[name] = [dataclasses.asdict(item) for item in data[name]]
    if outcome.refreshed is not None:
        data["refreshed"] = base64.b64encode(outcome.refreshed).decode()
    return data


def _outcome(data: dict) -> PatchOutcome:
    known = {f.name for f in dataclasses.fields(PatchOutcome)}
    if set(data) != known:
        raise KeyError("a record of another PatchOutcome")
    fields = dict(data)
    for name in _RECORDS.keys() & known:
        fields[name] = [_RECORDS[name](**item) for item in data[name]]
    if data["refreshed"] is not None:
        fields["refreshed"] = base64.b64decode(data["refreshed"])
    return PatchOutcome(**fields)
