"""CPU checks that the GPU tier's assertions can fail: planted mistakes in probe records.

The checks of ``test_spec_threshold_gpu.py`` read what the probe recorded in a real server
(``gpu/probe/sitecustomize.py``). Here they get a recorded-looking sequence of a correct
threshold run, which must pass, and the same sequence with one mistake planted, which must
fail: a verify step run eagerly after speculation resumes, a step without drafts booked into
the acceptance metrics, a transition logged twice, a step without drafts below the re-enable
threshold, a decode step without a CUDA graph, a mismatching output.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1].parent
sys.path.insert(0, str(ROOT / "gpu"))

import engines  # noqa: E402
from language import ChainLanguage  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "gpu_tier_checks", ROOT / "tests" / "gpu" / "test_spec_threshold_gpu.py"
)
tier = importlib.util.module_from_spec(_spec)
sys.modules["gpu_tier_checks"] = tier
_spec.loader.exec_module(tier)

LABEL = "eagle3-v2+threshold"
DISABLED = "Speculative decoding disabled: decode batch size {} > 8 (x).\n"
ENABLED = "Speculative decoding re-enabled: decode batch size {} <= 6 (x).\n"


def _run(planted: str | None = None) -> tier.Ramp:
    events, log = [], ""

    def forward(mode, bs, graph=True):
        events.append(("F", False, mode, bs, graph))

    def spec(bs):
        forward("TARGET_VERIFY", bs, not (planted == "eager-verify" and bs == 5))
        events.append(("F", True, "DECODE", bs, True))  # the draft: not a target step
        events.append(("S", bs, 2 * bs))

    for bs in (1, 1, 8):
        spec(bs)
    for up, sizes, down in ((48, (48, 40, 20, 7), 6), (96, (96, 50, 12), 5)):
        forward("EXTEND", up, False)
        log += DISABLED.format(up)
        for bs in sizes:
            forward("DECODE", bs, not (planted == "eager-decode" and bs == 40))
            if planted == "booked-no-draft" and bs == 20:
                events.append(("S", bs, 0))
        if planted == "no-draft-below-reenable":
            forward("DECODE", 4)
        log += ENABLED.format(down)
        spec(down)
        spec(3)
    if planted == "double-log":
        log += DISABLED.format(50)
    return tier.Ramp(LABEL, events=events, log=log)


def _ramps(run):
    return lambda label: run


CHECKS = {
    "eager-verify": tier.test_verify_graphs_replayed_after_speculation_resumes,
    "eager-decode": tier.test_decode_steps_replay_cuda_graphs,
    "booked-no-draft": tier.test_acceptance_metrics_count_speculative_steps_only,
    "double-log": tier.test_one_info_line_per_transition,
    "no-draft-below-reenable": tier.test_verify_graphs_replayed_after_speculation_resumes,
}


@pytest.mark.parametrize("check", sorted(set(CHECKS.values()), key=lambda f: f.__name__))
def test_a_correct_run_passes(check):
    check(_ramps(_run()), LABEL)


@pytest.mark.parametrize("planted", sorted(CHECKS))
def test_each_planted_mistake_fails_its_check(planted):
    with pytest.raises(AssertionError):
        CHECKS[planted](_ramps(_run(planted)), LABEL)


def test_a_differing_output_is_reported_with_position_and_phase():
    lang = ChainLanguage.make(0)
    prompt = tier._prompt_of(lang, "p0-w0-r0")
    want = lang.continue_(prompt, 10)
    reference = tier.Ramp("baseline", outputs={"p0-w0-r0": want}, phase_of={"p0-w0-r0": 0})
    reference.phases = [tier.Phase(1, events=(0, 0))]
    got = want[:3] + [want[3] + 1] + want[4:]
    ramp = tier.Ramp(LABEL, outputs={"p0-w0-r0": got}, phase_of={"p0-w0-r0": 0})
    ramp.phases = [tier.Phase(1, events=(0, 0))]
    (report,) = tier._mismatches(ramp, reference, lang)
    assert "output token 3" in report and "phase C=1" in report
    assert not tier._mismatches(reference, reference, lang)
    assert engines.THRESHOLD == 8 and engines.REENABLE == 6  # the log lines above
