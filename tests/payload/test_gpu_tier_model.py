"""The GPU tier's model of the 0.5.17 line's step policies (``gpu/steps.py``), against the
patched tree's own code: the threshold's hysteresis replayed over the steps a probe records is
the real ``BatchThresholdStepParams``, and the slots the tier routes a batch size to are those
of the real ``AdaptiveSpeculativeParams`` (upstream's default config and the threshold written
as a config). The GPU tier cannot run here; its checks must decide as the code it checks.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import pytest
from spec_fixtures import spec_tree

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))

import engines  # noqa: E402
import steps as decode  # noqa: E402

LINE = "0.5.17"
pytestmark = [pytest.mark.payload, pytest.mark.sglang_lines(LINE)]


@pytest.fixture(scope="module")
def tree(request):
    return spec_tree(request, os.environ.get("PATCHKIT_PAYLOAD_LINE") or LINE)


def _batch_sizes(seed: int, n: int = 600) -> list[int]:
    """Decode batch sizes as a ramp gives them: runs that drift up and down, 1 to 128."""
    rng, bs, out = random.Random(seed), 1, []
    for _ in range(n):
        bs = min(128, max(1, bs + rng.choice((-9, -3, -1, 0, 1, 3, 9))))
        out.append(bs)
    return out


def test_the_tiers_policy_model_decides_as_the_lines_code(tree, tmp_path):
    """One test (the patched policy first, so that it fails on the unpatched tree): the
    hysteresis replay over recorded steps, then the adaptive slots of each configuration."""
    from sglang.srt.speculative.adaptive_spec_params import (
        AdaptiveSpeculativeParams,
        BatchThresholdStepParams,
    )

    hysteresis = engines.CONFIGS["eagle3-v2+threshold"].hysteresis()
    for seed in range(4):
        params = BatchThresholdStepParams(engines.STEPS, *hysteresis)
        params.set_cuda_graph_bs(engines.CUDA_GRAPH_BS)
        run = [decode.Step("TARGET_VERIFY", bs, True, params.get_steps_for_batch(bs))
               for bs in _batch_sizes(seed)]  # fmt: skip
        assert {s.drafts for s in run} == {0, engines.STEPS}
        assert decode.hysteresis_mismatches(run, *hysteresis) == []
        # a stateless threshold (what an adaptive config does) differs from it between M and N
        stateless = [decode.Step(s.mode, s.bs, True, 0 if s.bs > 8 else 2) for s in run]
        assert stateless == run or decode.hysteresis_mismatches(stateless, *hysteresis)

    for label in ("eagle3-v2+adaptive", "eagle3-v2+threshold-config"):
        config = engines.CONFIGS[label]
        path = None
        if config.adaptive_config is not None:
            path = tmp_path / f"{label}.json"
            path.write_text(json.dumps(config.adaptive_config))
        params = AdaptiveSpeculativeParams(config.steps, cfg_path=path and str(path))
        params.set_cuda_graph_bs(engines.CUDA_GRAPH_BS)
        for bs in range(1, engines.MAX_RUNNING + 20):
            want = params._route(bs).candidate_steps
            assert decode.slot_steps(bs, config.slot_config(), engines.CUDA_GRAPH_BS) == want
            assert params.get_steps_for_batch(bs) in want
        assert config.steps in params.candidate_steps  # 0.5.17 refuses to start otherwise
