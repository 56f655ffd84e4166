"""Carrying a series patch by patch onto a new base, in the bare mirror with scratch indexes
(no work tree, no refs moved), and labelling each patch from what git and the signals say."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from unidiff import PatchSet

from patchkit import gitops, ui
from patchkit.apply import RunTrees, commit_message_for, disjoint_runs, patch_identity
from patchkit.classify.definitions import definitions_signal, relocated_signal
from patchkit.classify.delta import Delta, upstream_delta
from patchkit.classify.hints import is_packaging_patch, moved_hint, requires_dist_signal
from patchkit.classify.model import (
    DECLARED_SIGNALS,
    EQUIVALENT_SIGNALS,
    WEAK_SIGNALS,
    PatchOutcome,
    Signal,
)
from patchkit.classify.parts import hunks_signal, patch_parts
from patchkit.classify.probes import Probe, ProbeResult, patch_probes, run_probes
from patchkit.classify.signals import (
    added_lines_signal,
    patch_id_signal,
    reverse_signals,
    three_way,
    trailer_signal,
)
from patchkit.export import export_commits
from patchkit.scratch import temporary_folder
from patchkit.series import Patch, Series

EQUIVALENT_NOTE = (
    "the new base has an equivalent implementation (not the same text): "
    "read it before dropping the patch"
)
DECLARED_NOTE = (
    "the patch's own Applied-Upstream: trailer names this release or an earlier one, and it "
    "no longer applies: read upstream's version before dropping it"
)


@dataclass
class NewBase:
    """What the classification knows of the new base beyond its commit."""

    commit: str
    version: str | None = None  # the release it stands for (the trailer signal compares it)
    requires: list[str] | None = None  # a wheel base's Requires-Dist


@dataclass
class Carry:
    """The outcome of carrying a series: one outcome per patch, the carried tip."""

    outcomes: list[PatchOutcome] = field(default_factory=list)
    tip: str = ""


@dataclass
class _Context:
    mirror: gitops.Repo
    old_base: str
    new: NewBase
    range_ids: dict[str, str] | None
    _delta: Delta | None = None
    _paths: tuple[set[str], set[str]] | None = None

    @property
    def delta(self) -> Delta:
        """Upstream's changes between the bases, read when a signal first needs them."""
        if self._delta is None:
            self._delta = upstream_delta(self.mirror, self.old_base, self.new.commit)
        return self._delta

    def paths(self) -> tuple[set[str], set[str]]:
        """(paths of the new base, paths of the old base)."""
        if self._paths is None:
            new = set(gitops.tree_paths(self.mirror, self.new.commit))
            old = set(gitops.tree_paths(self.mirror, self.old_base))
            self._paths = (new, old)
        return self._paths


def carry_series(
    mirror: gitops.Repo,
    series: Series,
    old_base: str,
    new: NewBase,
    *,
    range_ids: dict[str, str] | None = None,
) -> Carry:
    """Carry every patch of `series` from `old_base` onto `new` and label each one; the
    carried patches are committed in a chain and exported (clean vs offset).  `range_ids`:
    the patch-ids of upstream's commits between the bases (None: no history)."""
    ctx = _Context(mirror, old_base, new, range_ids)
    tip = new.commit
    left_out: list[str] = []
    carried: list[tuple[PatchOutcome, Patch]] = []
    out = Carry()
    runs = RunTrees(mirror)
    # One scratch index for the whole carry: after a carried patch it already holds the new
    # tip, so it is only re-read when a 3-way attempt left it elsewhere.
    with (
        temporary_folder("rebase-") as tmp,
        gitops.scratch_index(mirror, tip) as env,
    ):
        for run in disjoint_runs(series.patches):
            files = []
            for patch in run:
                patch_file = Path(tmp) / patch.name
                patch_file.write_bytes(patch.raw)
                files.append(patch_file)
            outcomes = _carry_run(ctx, env, tip, run, files, runs)
            for i, (patch, patch_file) in enumerate(zip(run, files, strict=True)):
                ui.progress(f"carrying {patch.name}")  # as each is classified, not per run
                outcome = outcomes[i] if outcomes else _carry_one(ctx, env, tip, patch, patch_file)
                if outcome.label in ("upstreamed", "obsolete", "conflict"):
                    gitops.read_tree_into(mirror, env, tip)
                probes = patch_probes(patch)
                if probes:
                    outcome.probes = _probed(ctx, env, tip, patch_file, outcome, probes)
                if outcome.label in ("clean", "offset", "merged"):
                    tip = outcome.tree  # the signals read trees; the commits are written below
                    carried.append((outcome, patch))
                if left_out:
                    outcome.provisional = True
                    outcome.note = (outcome.note + "; " if outcome.note else "") + (
                        f"classified without {', '.join(left_out)} (in conflict)"
                    )
                if outcome.label == "conflict":
                    left_out.append(patch.name)
                out.outcomes.append(outcome)
    out.tip = _commit_carried(mirror, new.commit, carried, runs)
    return out


def _probed(
    ctx: _Context, env: dict[str, str], tip: str, patch_file: Path, outcome: PatchOutcome,
    probes: list[Probe],
) -> list[ProbeResult]:  # fmt: skip
    """The patch's probes on the tree it leaves: carried, or (in conflict) the release with
    the files whose part still applies, or the release itself (upstream)."""
    if outcome.label in ("clean", "offset", "merged"):
        return run_probes(ctx.mirror, outcome.tree, probes, "the patched tree")
    applying = [p.path for p in outcome.parts if p.state == "applies"]
    if outcome.label != "conflict" or not applying:
        return run_probes(ctx.mirror, tip, probes, "the release without the patch")
    for path in applying:
        gitops.apply_to_index(ctx.mirror, env, patch_file, include=path)
    tree = gitops.write_tree(ctx.mirror, env)
    gitops.read_tree_into(ctx.mirror, env, tip)
    return run_probes(ctx.mirror, tree, probes, "the release with the parts that apply")


def _commit_carried(
    mirror: gitops.Repo, base: str, carried: list[tuple[PatchOutcome, Patch]], runs: RunTrees
) -> str:
    """Write the carried commits as one first-parent chain (their computed trees first) and
    export them with one format-patch: refreshed bytes, clean or offset."""
    runs.write()
    commits = gitops.commit_chain(
        mirror,
        base,
        [(o.tree, commit_message_for(p), patch_identity(p)) for o, p in carried],
    )
    tip = commits[-1] if commits else base
    for (outcome, _), commit in zip(carried, commits, strict=True):
        outcome.commit = commit
    refreshed = export_commits(mirror, base, tip) if carried else []
    for (outcome, patch), exported in zip(carried, refreshed, strict=True):
        outcome.refreshed = exported.raw
        outcome.changed = exported.raw != patch.raw
        if outcome.label != "merged":
            outcome.label = clean_or_offset(patch, exported.raw)
    return tip


def _carry_run(
    ctx: _Context,
    env: dict[str, str],
    tip: str,
    run: list[Patch],
    files: list[Path],
    runs: RunTrees,
) -> list[PatchOutcome] | None:
    """The outcomes of a run of patches whose paths do not meet, when it applies as a whole
    and no patch of it fires the definitions signal: each is then what `_carry_one` gives
    (it applies, and the signal reads only the patch's own files, which no other patch of
    the run changes, so it reads them at `tip`). Else None, the index holding `tip`, and
    the run is classified patch by patch."""
    trees = runs.apply(env, tip, run, files)
    if trees is None:
        return None
    if any(definitions_signal(ctx.mirror, tip, ctx.old_base, patch).fired for patch in run):
        gitops.read_tree_into(ctx.mirror, env, tip)
        return None
    runs.accept()
    outcomes = []
    for patch, tree in zip(run, trees, strict=True):
        outcome = PatchOutcome(patch.name, "clean")
        outcome.tree = tree
        outcomes.append(outcome)
    return outcomes


def _carry_one(
    ctx: _Context, env: dict[str, str], tip: str, patch: Patch, patch_file: Path
) -> PatchOutcome:
    """Classify one patch against the index `env` (holding `tip`); `git apply` is atomic, so
    a failed forward apply leaves the index as it was for the signals."""
    outcome = PatchOutcome(patch.name, "clean")
    applied, _ = gitops.apply_to_index(ctx.mirror, env, patch_file)
    if applied:
        # It applies as text, but upstream may define the same API elsewhere in the file:
        # carrying it then defines everything twice.
        same_api = definitions_signal(ctx.mirror, tip, ctx.old_base, patch)
        if not same_api.fired:
            outcome.tree = gitops.write_tree(ctx.mirror, env)
            return outcome
        outcome.signals = [same_api]
        outcome.label = "upstreamed"
        outcome.note = EQUIVALENT_NOTE
        return outcome
    signals, merged_tree, conflicts = _upstream_signals(ctx, env, tip, patch, patch_file)
    outcome.signals = signals
    _decide(outcome, signals, merged_tree, conflicts)
    if outcome.label == "conflict":
        _explain_conflict(ctx, env, tip, patch, patch_file, outcome)
    elif outcome.note == DECLARED_NOTE:
        # Upstream on the patch's own word: read the code beside it (the evidence it gives).
        gitops.read_tree_into(ctx.mirror, env, tip)
        outcome.parts = patch_parts(
            ctx.mirror, env, tip, patch, patch_file, ctx.delta, ctx.new.version, ctx.old_base
        )
        outcome.signals.append(hunks_signal(outcome.parts))
    return outcome


def _decide(
    outcome: PatchOutcome, signals: list[Signal], merged_tree: str | None, conflicts: list[str]
) -> None:
    """The label the signals and the 3-way merge give."""
    by_name = {s.name: s for s in signals}
    strong = any(s.fired for s in signals if s.strong)
    weak = all(by_name[n].fired for n in WEAK_SIGNALS)
    equivalent = any(by_name[n].fired for n in EQUIVALENT_SIGNALS if n in by_name)
    declared = any(by_name[n].fired for n in DECLARED_SIGNALS if n in by_name)
    obsolete = by_name.get("requires-dist")
    if strong or weak:
        outcome.label, outcome.note = "upstreamed", "the new base already contains this change"
    elif equivalent:
        outcome.label, outcome.note = "upstreamed", EQUIVALENT_NOTE
    elif declared and merged_tree is None:
        outcome.label, outcome.note = "upstreamed", DECLARED_NOTE
    elif merged_tree is not None:
        outcome.label, outcome.tree = "merged", merged_tree
    elif obsolete is not None and obsolete.fired:
        outcome.label = "obsolete"
        outcome.note = (
            "the packaging files it edits are not in a wheel base; the release's own "
            "requirements meet its purpose"
        )
    else:
        outcome.label, outcome.conflicts = "conflict", conflicts


def _explain_conflict(
    ctx: _Context, env: dict[str, str], tip: str, patch: Patch, patch_file: Path,
    outcome: PatchOutcome,
) -> None:  # fmt: skip
    """Where the files it edits went, and which of its files are still needed."""
    gitops.read_tree_into(ctx.mirror, env, tip)
    if not outcome.conflicts:
        present, old_paths = ctx.paths()
        merge = next(s for s in outcome.signals if s.name == "empty-after-3way")
        outcome.note = merge.detail + moved_hint(patch, present, old_paths, ctx.delta)
    outcome.parts = patch_parts(
        ctx.mirror, env, tip, patch, patch_file, ctx.delta, ctx.new.version, ctx.old_base
    )
    signal = hunks_signal(outcome.parts)
    outcome.signals.append(signal)
    if signal.fired:
        outcome.label, outcome.note, outcome.conflicts = "upstreamed", EQUIVALENT_NOTE, []


def _upstream_signals(
    ctx: _Context, env: dict[str, str], tip: str, patch: Patch, patch_file: Path
) -> tuple[list[Signal], str | None, list[str]]:
    """The evidence, the tree of a conflict-free 3-way merge (if any) and conflicted paths."""
    signals = [patch_id_signal(ctx.mirror, patch, ctx.range_ids)]
    signals += reverse_signals(ctx.mirror, env, patch_file)
    merge, merged_tree, conflicts = three_way(ctx.mirror, env, tip, patch_file)
    signals.append(merge)
    signals.append(added_lines_signal(ctx.mirror, tip, patch))
    equivalent = definitions_signal(ctx.mirror, tip, ctx.old_base, patch)
    signals.append(equivalent)
    if not equivalent.fired and merged_tree is None and "no public" not in equivalent.detail:
        signals.append(relocated_signal(patch, ctx.delta))
    signals.append(trailer_signal(patch, ctx.new.version))
    if is_packaging_patch(patch):
        signals.append(requires_dist_signal(patch, ctx.new.requires))
    return signals, merged_tree, conflicts


def _hunks(diff: str) -> list[tuple[str, list[tuple[int, int, int, int]], list[str]]]:
    out = []
    for pf in PatchSet(diff):
        numbers = [(h.source_start, h.source_length, h.target_start, h.target_length) for h in pf]
        bodies = [str(line) for h in pf for line in h]
        out.append((pf.path, numbers, bodies))
    return out


def clean_or_offset(patch: Patch, refreshed: bytes) -> str:
    text = refreshed.decode("utf-8", "replace")
    cut = text.find("\ndiff --git ")
    new = _hunks(text[cut + 1 :]) if cut >= 0 else []
    old = _hunks(patch.diff)
    if [(p, n) for p, n, _ in new] == [(p, n) for p, n, _ in old]:
        return "clean"
    return "offset"
