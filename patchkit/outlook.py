"""`outlook`: every release upstream published after a line's pin, and what each does to each
patch of the line, before anyone moves the pin.

For each release (the package index: its sdist, else its wheel for the pinned platforms) the
line's series is carried onto it exactly as `rebase` would (`patchkit.classify`), and each
patch gets a state: clean, offset, merged, conflict, partly-upstreamed, upstreamed, obsolete.
A patch can be retired from the first release from which every later release has it
upstreamed or obsolete.  Each (patch, release) classification is kept in the cache, keyed by
the classifier's version, both bases and the patch with every patch before it (a patch's
state depends on what was carried before it), so a second run only reads the index.

Nothing here prints.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from patchkit import gitops, ui
from patchkit.carry_pool import CarryPool
from patchkit.classify import PatchOutcome
from patchkit.errors import FetchError, InvalidArchiveError, PinError, UsageError
from patchkit.files import replace_file
from patchkit.series import Series
from patchkit.targets import Target

# Bump when the classification changes what it says: cached states of older versions are
# then classified again.
CLASSIFIER_VERSION = "5"
STATES = (
    "clean",
    "offset",
    "merged",
    "conflict",
    "partly-upstreamed",
    "upstreamed",
    "obsolete",
)
NEEDS_WORK = ("conflict", "partly-upstreamed")
RETIRED = ("upstreamed", "obsolete")
LEGEND = {
    "clean": "applies as it is",
    "offset": "applies, its hunks moved",
    "merged": "needs a 3-way merge, no conflict (rebase --write refreshes it)",
    "conflict": "needs work by hand",
    "partly-upstreamed": "in conflict, but upstream has some of its files or hunks already",
    "upstreamed": "upstream has it (see the evidence): retire it",
    "obsolete": "what it edits is gone and the release meets its purpose: retire it",
}


# One letter a state, in the terminal and Markdown tables and on the HTML page.
CODES = {
    "clean": "c",
    "offset": "o",
    "merged": "m",
    "conflict": "X",
    "partly-upstreamed": "x",
    "upstreamed": "U",
    "obsolete": "O",
}
# What `?` after a state means (Cell.provisional).
PROVISIONAL = "classified while an earlier patch was in conflict"


@dataclass
class Cell:
    """One patch on one release."""

    state: str
    note: str = ""
    evidence: list[str] = field(default_factory=list)  # the signals that fired, in words
    conflicts: list[str] = field(default_factory=list)
    parts: list[dict] = field(default_factory=list)
    provisional: bool = False
    probes: list[dict] = field(default_factory=list)  # the patch's probes on this release

    @property
    def probe_failed(self) -> bool:
        """A probe of what the patch guarantees fails here, whatever the state."""
        return any(not p["passed"] for p in self.probes)

    @property
    def code(self) -> str:
        """Its letter, `?` when provisional, `!` when a probe of the patch fails."""
        return (
            CODES[self.state]
            + ("?" if self.provisional else "")
            + ("!" if self.probe_failed else "")
        )

    @classmethod
    def of(cls, outcome: PatchOutcome) -> Cell:
        state = "partly-upstreamed" if outcome.partly_upstreamed else outcome.label
        return cls(
            state,
            outcome.note,
            [f"{s.name}: {s.detail}" for s in outcome.signals if s.fired]
            + [p.words() for p in outcome.probes if not p.passed],
            list(outcome.conflicts),
            [p.to_json() for p in outcome.parts],
            outcome.provisional,
            [p.to_json() for p in outcome.probes],
        )

    def to_json(self) -> dict:
        return {
            "state": self.state,
            "note": self.note,
            "evidence": self.evidence,
            "conflicts": self.conflicts,
            "parts": self.parts,
            "provisional": self.provisional,
            "probes": self.probes,
        }

    @classmethod
    def from_json(cls, data: dict) -> Cell:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass
class ReleaseColumn:
    """One release the line's series was carried onto."""

    version: str
    source: str  # "sdist" | "wheel" | "git"
    base: str  # the commit of its import in the mirror
    stands_for: str
    cached: bool = False  # every state came from the cache

    def to_json(self) -> dict:
        return {
            "version": self.version,
            "source": self.source,
            "base": self.base,
            "stands_for": self.stands_for,
            "cached": self.cached,
        }


@dataclass
class PatchRow:
    name: str
    cells: dict[str, Cell] = field(default_factory=dict)  # release version -> cell
    retire_at: str | None = None  # the first release from which every later one retires it

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "retire_at": self.retire_at,
            "releases": {v: c.to_json() for v, c in self.cells.items()},
        }


@dataclass
class LineOutlook:
    """One line of a target across the releases after its pin."""

    target: str
    line: str
    pin: str
    releases: list[ReleaseColumn] = field(default_factory=list)
    patches: list[PatchRow] = field(default_factory=list)
    stamp: str = ""  # outlook_stamp of the series it was made from
    unusable: dict[str, str] = field(default_factory=dict)  # release version -> why

    @property
    def newest(self) -> str | None:
        return self.releases[-1].version if self.releases else None

    @property
    def needs_work(self) -> list[str]:
        """Patches the newest release does not take as they are (or where a probe of what
        the patch guarantees fails)."""
        newest = self.newest
        if newest is None:
            return []
        return [
            p.name
            for p in self.patches
            if p.cells[newest].state in NEEDS_WORK or p.cells[newest].probe_failed
        ]

    @property
    def retire_at(self) -> str | None:
        """The first release at which every patch of the line could be retired."""
        dates = [p.retire_at for p in self.patches]
        if not dates or None in dates:
            return None
        return max(dates, key=Version)

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "line": self.line,
            "pin": self.pin,
            "newest": self.newest,
            "retire_at": self.retire_at,
            "needs_work": self.needs_work,
            "releases": [r.to_json() for r in self.releases],
            "patches": [p.to_json() for p in self.patches],
            "unusable": [{"version": v, "why": why} for v, why in self.unusable.items()],
        }


@dataclass
class OutlookReport:
    lines: list[LineOutlook] = field(default_factory=list)

    @property
    def needs_work(self) -> bool:
        return any(line.needs_work for line in self.lines)

    def to_json(self) -> dict:
        return {
            "states": list(STATES),
            "legend": LEGEND,
            "needs_work": self.needs_work,
            "lines": [line.to_json() for line in self.lines],
        }


@dataclass
class BaseSource:
    """How outlook obtains bases: the release list and one base per release (injected so the
    core stays free of the index and the mirror's locking)."""

    releases: Callable[[Target, str], list[str]]
    old_base: Callable[[Target], object]  # -> patchkit.upstream.Base
    new_base: Callable[[Target, str], object]
    facts: Callable[[object], object]  # Base -> patchkit.classify.NewBase
    mirror: Callable[[Target], gitops.Repo]
    # version -> base, for the releases the mirror already holds (read at once, no network);
    # a base whose states are not all cached is obtained again through `new_base`
    held: Callable[[Target, list[str]], dict[str, object]] = lambda target, versions: {}
    jobs: int = 1  # releases classified at once (worker processes when more than one)


def line_outlook(
    target: Target,
    series: Series,
    source: BaseSource,
    cache: Path,
    *,
    since: str | None = None,
) -> LineOutlook:
    """Carry `series` (the line `target` is seen through) onto every release after its pin
    (and after `since`), reading states from the cache where they are."""
    floor = target.pin
    if since is not None:
        if Version(since) < Version(target.pin):
            raise UsageError(
                f"--since {since} is before line {target.line}'s pin {target.pin}",
                hint="outlook looks at releases after the pin; leave --since out",
            )
        floor = since
    result = LineOutlook(target.name, target.line, target.pin, stamp=outlook_stamp(series))
    result.patches = [PatchRow(p.name) for p in series.patches]
    versions = source.releases(target, floor)
    if not versions:
        return result
    old = source.old_base(target)
    held = source.held(target, versions)
    found = []  # (version, base, its cells or None while being classified)
    with CarryPool(source.jobs) as pool:
        for k, version in enumerate(versions, 1):
            where = f"{target.name} {version} (release {k} of {len(versions)})"
            new = held.get(version)
            cells = _cached_cells(target, series, old, new, cache) if new is not None else None
            if cells is None:
                ui.progress(f"{where}: obtaining its base")
                try:
                    new = source.new_base(target, version)
                except (FetchError, PinError, InvalidArchiveError) as exc:
                    # One release whose base cannot be had (damaged, hostile, unreachable) is
                    # a row that says why; the other releases are still classified.
                    ui.progress(f"{where}: unusable ({exc.message})")
                    result.unusable[version] = exc.message
                    continue
                cells = _cached_cells(target, series, old, new, cache)
            if cells is None:  # classified meanwhile the next releases are obtained
                facts = source.facts(new)
                pool.submit(version, source.mirror(target), series, old.commit, facts, where)
            found.append((version, new, cells))
        for version, new, cells in found:
            cached = cells is not None
            if cells is None:
                cells = [Cell.of(o) for o in pool.outcomes(version)]
                _keep_cells(target, series, old, new, cache, cells)
            column = ReleaseColumn(version, new.source, new.commit, new.stands_for, cached)
            for row, cell in zip(result.patches, cells, strict=True):
                row.cells[version] = cell
            result.releases.append(column)
    for row in result.patches:
        row.retire_at = _retire_at(row, [r.version for r in result.releases])
    return result


def _cell_paths(target, series, old, new, cache: Path) -> list[Path]:
    keys = _keys(series, old.commit, new.commit)
    return [cache / "outlook" / target.name / new.commit / f"{k}.json" for k in keys]


def _cached_cells(target, series, old, new, cache: Path) -> list[Cell] | None:
    """Every patch's state on `new` from the cache, or None when one is not there."""
    cells = [_read_cell(p) for p in _cell_paths(target, series, old, new, cache)]
    return cells if all(c is not None for c in cells) else None  # type: ignore[return-value]


def _keep_cells(target, series, old, new, cache: Path, cells: list[Cell]) -> None:
    """Each patch's state on `new`, kept in the cache."""
    for path, cell in zip(_cell_paths(target, series, old, new, cache), cells, strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, json.dumps(cell.to_json(), indent=1).encode() + b"\n")


def _keys(series: Series, old: str, new: str) -> list[str]:
    """One cache key per patch: the classifier, both bases, the patch and those before it."""
    digest = hashlib.sha256(f"outlook {CLASSIFIER_VERSION}\n{old}\n{new}\n".encode())
    keys = []
    for patch in series.patches:
        digest.update(f"{patch.sha256}\n".encode())
        keys.append(digest.copy().hexdigest()[:32])
    return keys


def outlook_stamp(series: Series) -> str:
    """What a rendered outlook of `series` depends on besides the releases: the classifier and
    every patch's bytes, in order (a table stamped with another value is out of date)."""
    digest = hashlib.sha256(f"outlook {CLASSIFIER_VERSION}\n".encode())
    for patch in series.patches:
        digest.update(f"{patch.name} {patch.sha256}\n".encode())
    return digest.hexdigest()[:12]


def _read_cell(path: Path) -> Cell | None:
    try:
        return Cell.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _retire_at(row: PatchRow, versions: list[str]) -> str | None:
    """The first release from which the patch is upstreamed or obsolete in every later one."""
    first = None
    for version in versions:
        if row.cells[version].state in RETIRED:
            first = first or version
        else:
            first = None
    return first


def index_source(cache: Path) -> BaseSource:
    """Bases as every verb obtains them: the package index's releases, each imported into
    the target's mirror (`patchkit.upstream`: sdist, else the wheel for the pinned platforms,
    sha256-checked, downloads bounded)."""
    from patchkit.carry_pool import default_jobs
    from patchkit.rebase import new_base_facts
    from patchkit.upstream import Mirror, acquire, resolve_new_base
    from patchkit.upstream.held import held_bases
    from patchkit.upstream.releases import releases_after

    def mirror(target: Target) -> gitops.Repo:
        return Mirror(target, cache).repo

    return BaseSource(
        releases=lambda target, after: releases_after(target, after, cache=cache),
        old_base=lambda target: acquire(target, None, cache=cache),
        new_base=lambda target, version: resolve_new_base(target, version, cache=cache)[0],
        facts=lambda base: new_base_facts(base, cache),
        mirror=mirror,
        held=lambda target, versions: held_bases(target, versions, cache),
        jobs=default_jobs(),
    )
