"""What a patch guarantees, checked on each release: its `Patchkit-Probe:` trailers.

A probe is a line the patched tree must not hold, as data in the patch's own message:

    Patchkit-Probe: absent `REGEX` in PATHSPEC... [where `ERE`] (what it guarantees)

`REGEX` is a Python regular expression matched against each line of the files under the git
pathspecs (only files holding a line that matches the extended regular expression `ERE`, when
given); every line it matches is a failure, quoted with its file and line number.  The
probe runs on the tree the patch leaves: the carried tree when the patch carries, the release
with the files whose part still applies when it is in conflict, the release itself when it is
upstream.  A probe that fails says so in the cell whatever the label (a patch that applies
clean may still miss a second gate upstream added on the same path).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from patchkit import gitops
from patchkit.classify.text import decode
from patchkit.series import Patch

PROBE_TRAILER = "Patchkit-Probe"
_PROBE_RE = re.compile(
    r"^absent `(?P<forbid>[^`]+)` in (?P<paths>[^`(]+?)"
    r"(?: where `(?P<where>[^`]+)`)?\s*\((?P<why>.+)\)$"
)
# Failures quoted per probe; the rest are counted.
MAX_QUOTED = 5


@dataclass(frozen=True)
class Probe:
    """One `Patchkit-Probe:` trailer, parsed."""

    forbid: re.Pattern
    paths: tuple[str, ...]
    where: str | None
    why: str


@dataclass
class ProbeResult:
    """A probe run on one tree: passed, or the lines that break it."""

    why: str
    passed: bool
    on: str  # which tree: "the patched tree", "the release with the parts that apply", ...
    failures: list[str] = field(default_factory=list)  # "path:line: `text`"

    def words(self) -> str:
        """What a failed probe found (only failed probes are shown)."""
        more = len(self.failures) - MAX_QUOTED
        quoted = "; ".join(self.failures[:MAX_QUOTED]) + (f"; {more} more" if more > 0 else "")
        return f"probe fails on {self.on}: {self.why}: {quoted}"

    def to_json(self) -> dict:
        return {"probe": self.why, "passed": self.passed, "on": self.on,
                "failures": self.failures}  # fmt: skip


def parse_probe(value: str) -> Probe | str:
    """The probe a trailer's value states, or why it states none."""
    match = _PROBE_RE.match(value.strip())
    if match is None:
        return "not 'absent `REGEX` in PATHSPEC... [where `ERE`] (what it guarantees)'"
    try:
        forbid = re.compile(match.group("forbid"))
    except re.error as exc:
        return f"`{match.group('forbid')}` is not a regular expression ({exc})"
    paths = tuple(match.group("paths").split())
    return Probe(forbid, paths, match.group("where"), match.group("why").strip())


def patch_probes(patch: Patch) -> list[Probe]:
    """The well-formed probes of a patch (`lint` reports the others)."""
    found = (parse_probe(v) for k, v in patch.trailers if k.lower() == PROBE_TRAILER.lower())
    return [p for p in found if isinstance(p, Probe)]


def run_probes(mirror: gitops.Repo, tree: str, probes: list[Probe], on: str) -> list[ProbeResult]:
    """Each probe on the tree (or commit) `tree` of the mirror."""
    results = []
    for probe in probes:
        files = gitops.files_matching(mirror, tree, probe.where or ".", list(probe.paths))
        failures = []
        for path in files:
            text = decode(gitops.show_file(mirror, tree, path))
            for number, line in enumerate(text.splitlines(), 1):
                if probe.forbid.search(line):
                    failures.append(f"{path}:{number}: `{line.strip()}`")
        results.append(ProbeResult(probe.why, not failures, on, failures))
    return results
