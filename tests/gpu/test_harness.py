"""CPU checks that the GPU tier's assertions can fail: planted mistakes in probe records.

The checks of ``test_spec_threshold_gpu.py`` read what the probe recorded in a real server
(``gpu/probe/sitecustomize.py``, classified by ``gpu/steps.py``). Here they get
recorded-looking sequences of correct runs, which must pass, and the same sequences with one
mistake planted, which must fail. Sequences are written per line as the line's code runs
them: a step without drafts of our flag is a DECODE forward (0.5.12: its own path, not booked
in the metrics; 0.5.17: the zero-step state's DECODE graphs), of upstream's adaptive modes a
one-token TARGET_VERIFY; on 0.5.17 either has a draft extend after it and no draft call, and
is booked with no accepted drafts.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1].parent
sys.path.insert(0, str(ROOT / "gpu"))

import engines  # noqa: E402
import steps as decode  # noqa: E402
from language import VOCAB, ChainLanguage, grammar_allows  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "gpu_tier_checks", ROOT / "tests" / "gpu" / "test_spec_threshold_gpu.py"
)
tier = importlib.util.module_from_spec(_spec)
sys.modules["gpu_tier_checks"] = tier
_spec.loader.exec_module(tier)

THRESHOLD = "eagle3-v2+threshold"
CONFIG = "eagle3-v2+threshold-config"
DISABLED = "Speculative decoding disabled: decode batch size {} > 8 (x).\n"
ENABLED = "Speculative decoding re-enabled: decode batch size {} <= 6 (x).\n"
# (speculative sizes, sizes without drafts, sizes after resuming) twice over, as the ramp runs
# them: our flag resumes at <= 6 (hysteresis: 7 stays without drafts), the config at <= 8
SEQUENCES = {
    THRESHOLD: ((1, 1, 8), ((48, (48, 40, 20, 7), (6, 3)), (96, (96, 50, 12), (5, 3)))),
    CONFIG: ((1, 1, 8), ((48, (48, 40, 20, 9), (8, 3)), (96, (96, 50, 12), (5, 3)))),
}


def _run(label: str, line: str, planted: str | None = None) -> tier.Ramp:
    events, log = [], ""
    zero_step = line == "0.5.17"

    def speculative(bs, graph=True, cold=False):
        events.append(("D", bs, 2))
        if planted == "drafts-twice" and bs == 3:
            events.append(("D", bs, 2))
        events.append(("F", False, "TARGET_VERIFY", bs, graph, 3))
        events.append(("F", True, "DRAFT_EXTEND_V2", bs, True, 0))  # the draft: not a target step
        events.append(("E", bs))
        events.append(("S", bs, 0 if cold else 2 * bs, 3))

    def nodraft(bs, graph=True):
        if planted == "drafted-without-drafts" and bs == 20:
            events.append(("D", bs, 2))
        mode = engines.nodraft_mode(label)
        if planted == "nodraft-wrong-mode":
            mode = {"DECODE": "TARGET_VERIFY", "TARGET_VERIFY": "DECODE"}[mode]
        events.append(("F", False, mode, bs, graph, 1))
        if not (planted == "missing-extend" and bs == 40):
            kv = engines.CONFIGS[label].zero_step_draft(line) == "kv"
            events.append(("K" if kv != (planted == "extend-for-kv" and bs == 40) else "E", bs))
        booked = zero_step != (planted == "unbooked-nodraft")
        if planted == "booked-no-draft" and bs == 20:
            booked = True
        if booked:
            correct = bs if planted == "booked-no-draft" and bs == 20 else 0
            events.append(("S", bs, correct, 1))

    start, crossings = SEQUENCES[label]
    for bs in start:
        speculative(bs)
    for up, sizes, resumed in crossings:
        events.append(("F", False, "EXTEND", up, False, 0))
        log += DISABLED.format(up)
        for bs in sizes:
            nodraft(bs, not (planted == "eager-nodraft" and bs == 40))
        if planted == "nodraft-below-reenable":
            nodraft(4)
        if planted == "early-resume":
            speculative(7)
        if planted == "nodraft-at-threshold" and up == 48:
            speculative(3)
            nodraft(8)
        log += ENABLED.format(resumed[0])
        # the first step after a resume drafts from a zero top-k where only the draft's K/V
        # were written: it accepts nothing, allowed; a cold step where it is not, a mistake
        kv_only = engines.CONFIGS[label].zero_step_draft(line) == "kv"
        for i, bs in enumerate(resumed):
            cold = (kv_only and i == 0) or (planted == "cold-resume" and i == int(kv_only))
            speculative(bs, not (planted == "eager-verify" and bs == 5), cold)
    if planted == "double-log":
        log += DISABLED.format(50)
    return tier.Ramp(label, line, events=events, log=log)


def _ramps(run):
    return lambda label: run


C = tier
CHECKS = {
    "eager-verify": (C.test_verify_graphs_replayed_after_speculation_resumes,
                     C.test_decode_steps_replay_cuda_graphs),
    "eager-nodraft": (C.test_decode_steps_replay_cuda_graphs,),
    "booked-no-draft": (C.test_acceptance_metrics_book_what_the_line_books,),
    "unbooked-nodraft": (C.test_acceptance_metrics_book_what_the_line_books,),
    "double-log": (C.test_one_info_line_per_transition,),
    "nodraft-below-reenable": (C.test_draft_steps_follow_the_policy,),
    "early-resume": (C.test_draft_steps_follow_the_policy,),
    "nodraft-at-threshold": (C.test_draft_steps_follow_the_policy,),
    "drafted-without-drafts": (C.test_draft_work_matches_each_step,),
    "drafts-twice": (C.test_draft_work_matches_each_step,),
    "missing-extend": (C.test_draft_work_matches_each_step,),
    "extend-for-kv": (C.test_draft_work_matches_each_step,),
    "nodraft-wrong-mode": (C.test_decode_steps_replay_cuda_graphs,),
    "cold-resume": (C.test_acceptance_after_resume_is_continuous_speculations,),
}  # fmt: skip
ALL_CHECKS = sorted({c for cs in CHECKS.values() for c in cs}, key=lambda f: f.__name__)
# which planted mistakes each (label, line) can show: the 0.5.12 line's own path has no
# zero-step state (its steps without drafts are DECODE, unbooked); the config has no log
CASES = [
    (THRESHOLD, "0.5.17", sorted(CHECKS)),
    (CONFIG, "0.5.17", sorted(set(CHECKS) - {"double-log", "early-resume"})),
    (THRESHOLD, "0.5.12", ["eager-verify", "eager-nodraft", "booked-no-draft", "double-log",
                           "nodraft-below-reenable", "early-resume", "nodraft-at-threshold",
                           "drafted-without-drafts", "missing-extend"]),
]  # fmt: skip


def _applies(check, label: str) -> bool:
    name = check.__name__
    return not (name == "test_one_info_line_per_transition" and label == CONFIG)


@pytest.mark.parametrize("label,line", [(label, line) for label, line, _ in CASES])
@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda f: f.__name__)
def test_a_correct_run_passes(check, label, line):
    if _applies(check, label):
        check(_ramps(_run(label, line)), label)


@pytest.mark.parametrize(
    "label,line,planted",
    [(label, line, p) for label, line, planted in CASES for p in planted],
)
def test_each_planted_mistake_fails_its_check(label, line, planted):
    for check in CHECKS[planted]:
        with pytest.raises(AssertionError):
            check(_ramps(_run(label, line, planted)), label)


def test_the_labels_of_each_line_meet_their_checks():
    """Our flag is a configuration of the 0.5.17 line beside upstream's modes, and each
    check runs on the configurations it is about."""
    line = engines.LINE_LABELS["0.5.17"]
    assert {"eagle3-v2+threshold", "eagle3-v2+adaptive", "eagle3-v2+adaptive-skip", CONFIG} < set(
        line
    )
    assert tier.THRESHOLD_LABELS == [
        "eagle3-v1+threshold", "eagle3-v2+threshold", "eagle3-v2+threshold-skip",
        "eagle3-v2+threshold-full",
    ]  # fmt: skip
    assert set(tier.POLICY_LABELS) == {
        "eagle3-v1+threshold", "eagle3-v2+threshold", "eagle3-v2+threshold-skip",
        "eagle3-v2+threshold-full", "eagle3-v2+adaptive", "eagle3-v2+adaptive-skip", CONFIG,
    }  # fmt: skip
    assert "eagle3-v1" not in tier.V2_LABELS and CONFIG in tier.V2_LABELS
    assert set(tier.ALL_LABELS) == set(engines.CONFIGS)


def test_upstream_adaptive_runs_what_its_slots_allow():
    """Upstream's adaptive modes: a step's draft steps among its slot's candidates, steps
    without drafts where the slot has 0 (above 48 requests for the default config)."""
    label = "eagle3-v2+adaptive"
    events = []
    for bs, tokens in ((1, 4), (3, 8), (8, 2), (30, 2), (60, 1), (100, 1), (40, 2), (2, 2)):
        events += [("F", False, "TARGET_VERIFY", bs, True, tokens), ("E", bs)]
        events.append(("S", bs, 0, tokens))
    run = tier.Ramp(label, "0.5.17", events=events)
    tier.test_draft_steps_follow_the_policy(_ramps(run), label)
    bad = list(events)
    bad[bad.index(("F", False, "TARGET_VERIFY", 60, True, 1))] = (
        "F", False, "TARGET_VERIFY", 60, True, 2,
    )  # fmt: skip
    with pytest.raises(AssertionError, match="batch size 60: 1 draft steps"):
        tier.test_draft_steps_follow_the_policy(_ramps(tier.Ramp(label, events=bad)), label)


def test_slots_are_routed_as_upstream_routes_them():
    sizes = engines.CUDA_GRAPH_BS
    default = engines.ADAPTIVE_DEFAULT_CONFIG
    assert decode.slot_steps(3, default, sizes) == [1, 3, 7]  # pads to 4: slot 1
    assert decode.slot_steps(5, default, sizes) == [0, 1, 3]  # pads to 8
    assert decode.slot_steps(25, default, sizes) == [0, 1]  # pads to 32
    assert decode.slot_steps(49, default, sizes) == [0]  # pads to 64
    assert decode.slot_steps(200, default, sizes) == [0]  # above every graph size
    config = engines.CONFIGS[CONFIG].slot_config()
    assert config == {1: [2], 12: [0]}
    assert [decode.slot_steps(bs, config, sizes) for bs in (8, 9, 12, 13)] == [[2], [0], [0], [0]]


def test_probe_lines_parse_on_either_line():
    parse = engines.parse_probe_line
    assert parse("F 0 TARGET_VERIFY 12 1 1") == ("F", False, "TARGET_VERIFY", 12, True, 1)
    assert parse("F 0 DECODE 12 1") == ("F", False, "DECODE", 12, True, None)  # 0.5.12 records
    assert parse("F 1 EXTEND 3 0 0") == ("F", True, "EXTEND", 3, False, None)
    assert parse("S 12 0 1") == ("S", 12, 0, 1)
    assert parse("S 12 20") == ("S", 12, 20, None)
    assert parse("S 12 20 0") == ("S", 12, 20, None)
    assert parse("D 4 2") == ("D", 4, 2) and parse("E 4") == ("E", 4)
    assert parse("") is None and parse("X 1") is None and parse("F 0 DECODE") is None
    # records without token counts: a verify is taken to carry the configured drafts
    (step,) = decode.decode_steps([parse("F 0 TARGET_VERIFY 4 1")], draft_tokens=3)
    assert step.drafts == 2 and step.speculative


def test_a_differing_output_is_reported_with_position_and_phase():
    lang = ChainLanguage.make(0)
    prompt = tier._prompt_of(lang, "p0-w0-r0")
    want = lang.continue_(prompt, 10)
    reference = tier.Ramp("baseline", outputs={"p0-w0-r0": want}, phase_of={"p0-w0-r0": 0})
    reference.phases = [tier.Phase(1, events=(0, 0))]
    got = want[:3] + [want[3] + 1] + want[4:]
    ramp = tier.Ramp(THRESHOLD, outputs={"p0-w0-r0": got}, phase_of={"p0-w0-r0": 0})
    ramp.phases = [tier.Phase(1, events=(0, 0))]
    (report,) = tier._mismatches(ramp, reference, lang)
    assert "output token 3" in report and "phase C=1" in report
    assert not tier._mismatches(reference, reference, lang)
    assert engines.THRESHOLD == 8 and engines.REENABLE == 6  # the log lines above


# a speculative step as the probe records it: the draft call, the verify, the draft extend,
# the booking
SPEC_STEP = [("D", 1, 2), ("F", False, "TARGET_VERIFY", 1, True, 3), ("E", 1), ("S", 1, 2, 3)]


class _FakeServer:
    """What run_ramp uses of engines.Server, answering at once; ``broken`` fails requests.
    Each request leaves one speculative step in the probe's records; ``events`` and
    ``log_text`` may hold what the server did before."""

    def __init__(self, label, log_dir, broken=False):
        self.config, self.broken = engines.CONFIGS[label], broken
        self.log = log_dir / f"{label}.log"
        self.events, self.log_text = [], ""

    def generate(self, prompt, n, rid=None, timeout=None, kind="greedy"):
        assert kind in engines.REQUEST_KINDS
        if self.broken:
            raise OSError("connection refused")
        self.events += SPEC_STEP
        return {"output_ids": list(range(n)), "meta_info": {}}

    def loads(self):
        return {"num_used_tokens": 0, "num_running_reqs": 0, "num_waiting_reqs": 0}

    def server_info(self):
        return {"grammar_backend": "none" if self.config.label == "baseline" else "xgrammar"}

    def healthy(self):
        return True

    def set_probe(self, on):
        pass

    def probe_flush(self, wait=1.0):
        pass

    def probe_events(self):
        return list(self.events)

    def serving_text(self):
        return self.log_text

    def tail(self):
        return ""


def test_ramps_run_for_every_server_at_once_and_fail_only_their_own_label(tmp_path, monkeypatch):
    monkeypatch.setattr(engines, "installed_line", lambda version=None: "0.5.17")
    started = []
    real = tier.run_ramp

    def run_ramp(server, language):
        started.append(server.config.label)
        return real(server, language)

    monkeypatch.setattr(tier, "run_ramp", run_ramp)
    servers = {
        "baseline": _FakeServer("baseline", tmp_path),
        THRESHOLD: _FakeServer(THRESHOLD, tmp_path, broken=True),
        "eagle3-v2": _FakeServer("eagle3-v2", tmp_path),
        "eagle3-v1": _FakeServer("eagle3-v1", tmp_path),  # of the other line: never ramped
    }
    lang = ChainLanguage.make(0)
    get = tier.ramps.__wrapped__(servers, lang)
    ramp = get("baseline")
    assert sorted(started) == ["baseline", "eagle3-v2", THRESHOLD]  # all at the first use
    keys = [key for p, c in enumerate(tier.RAMP) for items in tier._requests(lang, p, c)
            for key, _, _ in items]  # fmt: skip
    assert len(keys) == 2 * sum(tier.RAMP) and ramp.line == "0.5.17"
    # the constrained requests go where the server runs a grammar backend (the stand-ins:
    # every one but the baseline)
    assert sorted(get("eagle3-v2").outputs) == sorted(keys)
    assert sorted(ramp.outputs) == sorted(k for k in keys if tier._kind(k) != "grammar")
    assert any(tier._kind(k) == "grammar" for k in keys)
    with pytest.raises(OSError, match="connection refused"):
        get(THRESHOLD)
    assert get("baseline") is ramp and len(started) == 3
    with pytest.raises(pytest.skip.Exception, match="not a configuration of"):
        get("eagle3-v1")


def test_a_ramp_reads_only_its_own_records_and_log_lines(tmp_path, monkeypatch):
    """An attached server has served earlier runs: a batch cut off with a killed run (its
    verify with no draft extend and no booking), a switch logged, a traceback. None of it is
    the ramp's."""
    monkeypatch.setattr(engines, "installed_line", lambda version=None: "0.5.17")
    server = _FakeServer("eagle3-v2", tmp_path)
    server.events = SPEC_STEP + [("D", 8, 2), ("F", False, "TARGET_VERIFY", 8, True, 3)]
    server.log_text = "ready\nTraceback (most recent call last): client went away\n"
    ramp = tier.run_ramp(server, ChainLanguage.make(0))
    steps = tier._steps(ramp)
    assert len(steps) == 1 + 2 * sum(tier.RAMP)  # the warm-up and every request's step
    assert not decode.draft_work_mismatches(steps, "extend")
    assert len(decode.bookings(ramp.events)) == len(steps)
    assert "Traceback" not in ramp.log
    assert ramp.phases[0].events[0] == 4 and ramp.phases[-1].events[1] == len(ramp.events)
    for phase, concurrency in zip(ramp.phases, tier.RAMP, strict=True):
        lo, hi = phase.events
        assert len(tier._steps(ramp, lo, hi)) == 2 * concurrency


# -- the request kinds and the phase above the graphs -------------------------------------

# _kind: (w + r) % 6
GREEDY, LOGPROB, SAMPLED, GRAMMAR = "p4-w1-r1", "p4-w0-r1", "p4-w2-r1", "p4-w10-r1"


def _outputs_ramp(label: str, planted: str | None = None) -> tier.Ramp:
    """A ramp of one request of each kind in the phase of MAX_RUNNING, as a server answers."""
    ramp = tier.Ramp(label, "0.5.17")
    ramp.phases = [tier.Phase(c, events=(0, 0)) for c in tier.RAMP]
    for key in (GREEDY, LOGPROB, SAMPLED, GRAMMAR):
        n = tier._max_new_tokens(key)
        ramp.outputs[key] = [(7 * i) % 50 for i in range(n)]
        ramp.phase_of[key] = 4
        ramp.meta[key] = {}
    # the language while the grammar allows it (2 tokens), then tokens the grammar allows
    lang, allowed = ChainLanguage.make(0), [t for t in range(VOCAB) if grammar_allows(t)]
    rule = lang.continue_(tier._prompt_of(lang, GRAMMAR), n)
    decided = tier._decided(lang, GRAMMAR, rule)
    assert decided == 2
    ramp.outputs[GRAMMAR] = rule[:decided] + [allowed[(11 * i) % 128] for i in range(n - 2)]
    if planted == "grammar-not-applied":  # the language's own continuation: half disallowed
        ramp.outputs[GRAMMAR] = rule
    if planted == "grammar-empty":
        ramp.outputs[GRAMMAR] = []
    if planted == "grammar-differs-where-decided":
        ramp.outputs[GRAMMAR][1] = next(t for t in allowed if t != rule[1])
    if planted == "grammar-differs-where-forced":  # a near tie broken otherwise: allowed
        forced = ramp.outputs[GRAMMAR][decided]
        ramp.outputs[GRAMMAR][decided] = next(t for t in allowed if t != forced)
    n = len(ramp.outputs[LOGPROB])
    logprobs = [[-0.001 * i, t, None] for i, t in enumerate(ramp.outputs[LOGPROB])]
    ramp.meta[LOGPROB] = {"output_token_logprobs": logprobs}
    if planted == "logprob-drift":
        logprobs[n // 2][0] -= 0.2
    if planted == "logprob-missing":
        logprobs.pop()
    if planted == "sampled-short":
        ramp.outputs[SAMPLED].pop()
    if planted == "sampled-out-of-vocab":
        ramp.outputs[SAMPLED][3] = 1000
    if planted == "sampled-differs":  # sampling differs between configurations: allowed
        ramp.outputs[SAMPLED][0] += 1
    if planted == "logprob-request-differs":
        ramp.outputs[LOGPROB][0] += 1
    bs = {"no-phase-above": engines.CUDA_GRAPH_MAX_BS}.get(planted, engines.MAX_RUNNING)
    ramp.events = [("F", False, "DECODE", bs, planted == "graph-above", 1)]
    return ramp


@pytest.fixture
def vocab_50(tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text('{"vocab_size": 50}')
    return tmp_path


OUTPUT_CHECKS = {
    None: [],
    "sampled-differs": [],
    "logprob-drift": [C.test_logprobs_equal_baselines],
    "logprob-missing": [C.test_logprobs_equal_baselines],
    "logprob-request-differs": [C.test_ramp_outputs_equal_baseline],
    "sampled-short": [C.test_sampled_requests_give_their_length_in_the_vocabulary],
    "sampled-out-of-vocab": [C.test_sampled_requests_give_their_length_in_the_vocabulary],
    "grammar-not-applied": [C.test_constrained_requests_emit_what_their_grammar_allows],
    "grammar-differs-where-decided": [C.test_ramp_outputs_equal_baseline],
    "grammar-differs-where-forced": [],
    "grammar-empty": [
        C.test_ramp_outputs_equal_baseline,
        C.test_constrained_requests_emit_what_their_grammar_allows,
    ],
    "no-phase-above": [C.test_a_phase_runs_above_the_graph_sizes],
    "graph-above": [C.test_a_phase_runs_above_the_graph_sizes],
}


@pytest.mark.parametrize("planted", list(OUTPUT_CHECKS), ids=str)
def test_the_request_kind_checks_fail_on_their_mistakes_only(planted, vocab_50):
    reference, ramp = _outputs_ramp("baseline"), _outputs_ramp(THRESHOLD, planted)
    lang = ChainLanguage.make(0)

    def ramps(label):
        return reference if label == "baseline" else ramp

    args = {
        C.test_logprobs_equal_baselines: (ramps, THRESHOLD),
        C.test_ramp_outputs_equal_baseline: (ramps, THRESHOLD, lang),
        C.test_sampled_requests_give_their_length_in_the_vocabulary: (ramps, THRESHOLD, vocab_50),
        C.test_a_phase_runs_above_the_graph_sizes: (ramps, THRESHOLD),
        C.test_constrained_requests_emit_what_their_grammar_allows: (ramps, THRESHOLD),
    }
    for check, given in args.items():
        if check in OUTPUT_CHECKS[planted]:
            with pytest.raises(AssertionError):
                check(*given)
        else:
            check(*given)
