"""Decode steps read from the GPU probe's records, and the step counts each policy allows.

A speculative server's decode step is one target forward of the decode class (``DECODE`` or
``TARGET_VERIFY``) with the draft work around it. A step without drafts of the threshold is a
plain ``DECODE`` forward of the target (0.5.12: the line's own path; 0.5.17: the zero-step
runtime state's DECODE graphs); of upstream's adaptive modes (0.5.14+) a ``TARGET_VERIFY``
forward of one token per request (a one-node tree, ``draft_token_num`` 1); from 0.5.14 either
has no draft call before it and the draft extend after it unless
``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND`` is set. So a step's draft steps are ``tokens per
request - 1`` of its verify (topk 1), 0 for a ``DECODE`` forward.

Probe records (``gpu/probe/sitecustomize.py``, parsed by ``engines.Server.probe_events``):
``("F", draft, mode, bs, graph, tokens)`` a model forward (tokens: per request, ``None`` in
records made before the field existed), ``("D", bs, steps)`` a call of the draft worker's
``draft``, ``("E", bs)`` a draft extend after a decode verify, ``("K", bs)`` the draft's K/V
written alone after a step without drafts (0.5.17's threshold), ``("S", bs, correct, stride)``
a booking into the acceptance metrics (stride: the booked step's draft tokens per request,
``None`` where the probe could not see it). Stdlib only.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DECODE_MODES = ("DECODE", "TARGET_VERIFY")


@dataclass(frozen=True)
class Step:
    """One target decode-class forward and the draft work recorded around it."""

    mode: str
    bs: int
    graph: bool
    drafts: int  # draft steps verified; 0: a step without drafts
    draft_calls: int = 0  # the draft worker's draft() calls before it
    draft_extends: int = 0  # draft extends after it
    draft_kv_writes: int = 0  # the draft's K/V written alone after it (0.5.17's threshold)

    @property
    def speculative(self) -> bool:
        return self.drafts > 0


def draft_steps(mode: str, tokens: int | None, draft_tokens: int) -> int:
    """Draft steps of a target decode-class forward: tokens per request - 1 of a verify
    (``draft_tokens`` where the record has no token count), none for a plain decode."""
    if mode != "TARGET_VERIFY":
        return 0
    return (tokens if tokens else draft_tokens) - 1


def decode_steps(events: Sequence[tuple], draft_tokens: int = 3) -> list[Step]:
    """The target decode-class steps of ``events`` in order, each with the draft calls
    recorded since the previous step and the draft extends recorded after it."""
    steps: list[Step] = []
    calls = 0
    for event in events:
        kind = event[0]
        if kind == "D":
            calls += 1
        elif kind in ("E", "K") and steps:
            last = steps[-1]
            extends, kv = (1, 0) if kind == "E" else (0, 1)
            steps[-1] = Step(last.mode, last.bs, last.graph, last.drafts, last.draft_calls,
                             last.draft_extends + extends, last.draft_kv_writes + kv)  # fmt: skip
        elif kind == "F" and not event[1] and event[2] in DECODE_MODES:
            tokens = event[5] if len(event) > 5 else None
            drafts = draft_steps(event[2], tokens, draft_tokens)
            steps.append(Step(event[2], event[3], event[4], drafts, calls))
            calls = 0
    return steps


def bookings(events: Iterable[tuple]) -> list[tuple[int, int, int | None]]:
    """The acceptance-metrics bookings: (batch size, correct drafts, draft tokens or None)."""
    return [(e[1], e[2], e[3] if len(e) > 3 else None) for e in events if e[0] == "S"]


def acceptance_after_resume(
    booked: Iterable[tuple[int, int, int | None]], window: int, cold: int = 0
) -> tuple[tuple[int, int], tuple[int, int]]:
    """(accepted drafts, drafts) of the first ``window`` speculative bookings after each stretch
    of steps without drafts (booked with one draft token: 0.5.14+), past its first ``cold``
    ones (counted nowhere), and of every other speculative booking: the draft's acceptance
    right after speculation resumes, against continuous speculation."""
    after, steady = [0, 0], [0, 0]
    since = None  # speculative bookings since the last step without drafts
    for bs, correct, stride in booked:
        if stride == 1:
            since = 0
            continue
        drafts = ((stride or 1) - 1) * bs
        if since is not None and since < cold:
            since += 1
            continue
        into = after if since is not None and since < cold + window else steady
        into[0] += correct
        into[1] += drafts
        if since is not None:
            since += 1
    return (after[0], after[1]), (steady[0], steady[1])


def hysteresis_mismatches(steps: Sequence[Step], disable_above: int, reenable_at: int) -> list[str]:
    """Steps whose kind is not what the batch-size threshold decides: no drafts once a batch
    has more than ``disable_above`` requests, drafts again once one has at most
    ``reenable_at``; in between the last decision holds. Steps before the first deciding
    batch size are not judged (the state there depends on steps not recorded)."""
    bad = []
    speculating: bool | None = None
    for i, step in enumerate(steps):
        if step.bs > disable_above:
            speculating = False
        elif step.bs <= reenable_at:
            speculating = True
        if speculating is not None and step.speculative != speculating:
            want = "with drafts" if speculating else "without drafts"
            bad.append(f"step {i} at batch size {step.bs}: {step.drafts} draft steps, want {want}")
    return bad


def padded(bs: int, graph_sizes: Sequence[int]) -> int:
    """The CUDA-graph batch size a decode batch of ``bs`` is padded to (itself above them)."""
    sizes = sorted(graph_sizes)
    i = bisect.bisect_left(sizes, bs)
    return sizes[i] if i < len(sizes) else bs


def slot_steps(bs: int, config: dict[int, list[int]], graph_sizes: Sequence[int]) -> list[int]:
    """The candidate steps upstream's adaptive mode may run a batch of ``bs`` at: the batch is
    padded to a CUDA-graph size, then routed to the largest config key <= that size (the
    smallest key below all of them), as ``AdaptiveSpeculativeParams._route`` does."""
    keys = sorted(config)
    i = bisect.bisect_right(keys, padded(bs, graph_sizes)) - 1
    return sorted(config[keys[max(0, i)]])


def slot_mismatches(steps: Sequence[Step], config: dict[int, list[int]],
                    graph_sizes: Sequence[int]) -> list[str]:  # fmt: skip
    """Steps whose draft steps are not among the candidates of their batch size's slot."""
    bad = []
    for i, step in enumerate(steps):
        allowed = slot_steps(step.bs, config, graph_sizes)
        if step.drafts not in allowed:
            bad.append(f"step {i} at batch size {step.bs}: {step.drafts} draft steps, "
                       f"the slot allows {allowed}")  # fmt: skip
    return bad


def switches(steps: Sequence[Step]) -> tuple[int, int]:
    """How often the steps went from drafts to none (off) and back (on)."""
    kinds = [s.speculative for s in steps]
    off = sum(1 for a, b in zip(kinds, kinds[1:], strict=False) if a and not b)
    on = sum(1 for a, b in zip(kinds, kinds[1:], strict=False) if b and not a)
    return off, on


def draft_work_mismatches(steps: Sequence[Step], without_drafts: str) -> list[str]:
    """Steps whose draft work is not what their kind runs: one draft call and one draft
    extend around a step with drafts; no draft call around one without, and after it what
    ``without_drafts`` says the configuration runs (``engines.EngineConfig.zero_step_draft``):
    a draft extend (``extend``), the draft's K/V alone (``kv``) or nothing (``skip``)."""
    bad = []
    after = {"extend": (1, 0), "kv": (0, 1), "skip": (0, 0)}[without_drafts]
    for i, step in enumerate(steps):
        want = (1, 1, 0) if step.speculative else (0, *after)
        got = (step.draft_calls, step.draft_extends, step.draft_kv_writes)
        if got != want:
            bad.append(
                f"step {i} ({step.drafts} draft steps, batch size {step.bs}): {got[0]} draft "
                f"calls / {got[1]} draft extends / {got[2]} K/V writes, want {want}"
            )
    return bad
