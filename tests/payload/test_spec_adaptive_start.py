"""SGLang 0.5.17: upstream's ``--speculative-adaptive`` starts with its default config.

Every decode CUDA graph of a model runner writes its logits into one shared buffer
(``GraphSharedOutput``) sized by ``ModelRunner.max_decode_logits_rows``.  With
``--speculative-adaptive`` each candidate step count gets a runtime state whose TARGET_VERIFY
graphs hold ``steps + 1`` rows per request; unpatched 0.5.17 sized the buffer for the
configured steps only, so the default config (candidates up to 7 steps) with
``--speculative-num-steps 3`` failed at start: ``shared logits buffer holds 512 rows but caller
needs 1024``.  The server arguments go through the real parser and SGLang's own handling, the
buffer is the real ``GraphSharedOutput`` (on the CPU) and the sizes are the real
``get_batch_sizes_to_capture``; the model runner is a real ``ModelRunner`` whose ``__init__``
(it loads a model on a GPU) is skipped, holding the fields the sizing reads.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from spec_fixtures import EAGLE3_TOPK1, parse_server_args, spec_tree, write_model_dir

LINE = "0.5.17"
pytestmark = [pytest.mark.payload, pytest.mark.sglang_lines(LINE)]

VOCAB = 512


@pytest.fixture
def tree(request, monkeypatch):
    path = spec_tree(request, LINE)
    from sglang.srt.utils import common

    # A one-rank parallel context (no process group): the graph sizes' alignment reads it.
    one_rank = SimpleNamespace(attn_tp_size=1, attn_cp_size=1)
    monkeypatch.setattr(common, "get_parallel", lambda: one_rank)
    return path


def _runner(tree, tmp_path, *argv: str):
    """A ModelRunner of the target for a command line, as far as the graph sizing reads it."""
    from sglang.srt import server_args as server_args_module
    from sglang.srt.arg_groups import speculative_hook
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    args = parse_server_args(write_model_dir(tmp_path), argv)
    speculative_hook.handle_speculative_decoding(args)
    args._handle_cuda_graph_config()
    decode = args.cuda_graph_config.decode  # the GPU-memory handler's step, on its own
    decode.bs = args._generate_decode_cuda_graph_batch_sizes(decode.max_bs)
    server_args_module.set_global_server_args_for_scheduler(args)  # the sizing reads it
    runner = object.__new__(ModelRunner)
    runner.server_args = args
    runner.device = "cpu"
    runner.is_draft_worker = False
    runner.spec_algorithm = SpeculativeAlgorithm.from_string(args.speculative_algorithm)
    runner.req_to_token_pool = SimpleNamespace(size=args.max_running_requests)
    return runner


def _rows_each_state_needs(runner, steps: list[int]) -> dict[int, int]:
    """Logits rows of the widest TARGET_VERIFY graph of each runtime state."""
    from sglang.srt.model_executor.runner.base_cuda_graph_runner import (
        get_batch_sizes_to_capture,
    )

    need = {}
    for step in steps:
        width = runner.decode_num_tokens_per_req(num_draft_tokens=step + 1)
        capture_bs, _ = get_batch_sizes_to_capture(runner, width)
        need[step] = max(capture_bs) * width
    return need


def _shared_buffer(runner):
    from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput

    GraphSharedOutput._process_shared = None  # one per process: each test sizes its own
    return GraphSharedOutput.create_for_model_runner(runner)


ADAPTIVE = (*EAGLE3_TOPK1[:2], "--speculative-adaptive", "--speculative-num-steps", "3")
COMMON = ("--max-running-requests", "128", "--cuda-graph-max-bs-decode", "128")


def test_default_adaptive_config_fits_every_state(tree, tmp_path):
    """The default config's candidates 0, 1, 3, 7: each state's widest graph fits the buffer."""
    from sglang.srt.speculative.adaptive_spec_params import (
        resolve_candidate_steps_from_config,
    )

    runner = _runner(tree, tmp_path, *ADAPTIVE, *COMMON)
    candidates = resolve_candidate_steps_from_config(None)
    assert 7 in candidates and runner.server_args.speculative_num_steps == 3
    shared = _shared_buffer(runner)
    need = _rows_each_state_needs(runner, candidates)
    assert need[7] == 128 * 8
    for step, rows in need.items():
        assert shared.get_logits_buffer(VOCAB, rows=rows).shape == (rows, VOCAB), step
    assert shared.max_rows == max(need.values())  # not more than the widest state needs
    # Without --speculative-adaptive the configured steps alone size it, as before.
    (tmp_path / "plain").mkdir()
    plain = _runner(tree, tmp_path / "plain", *EAGLE3_TOPK1, *COMMON)
    steps = plain.server_args.speculative_num_steps
    assert _shared_buffer(plain).max_rows == 128 * (steps + 1)


def test_a_config_file_sizes_by_its_own_candidates(tree, tmp_path):
    config = {"1": {"candidate_steps": [1, 5]}, "16": {"candidate_steps": [0, 1]}}
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps(config))
    argv = (*EAGLE3_TOPK1[:2], "--speculative-adaptive", "--speculative-num-steps", "1")
    runner = _runner(tree, tmp_path, *argv, "--speculative-adaptive-config", str(path), *COMMON)
    shared = _shared_buffer(runner)
    assert shared.max_rows == max(_rows_each_state_needs(runner, [0, 1, 5]).values()) == 128 * 6


def test_each_state_captures_its_draft_extend_at_its_own_width(tree, tmp_path):
    """An adaptive state is built under the runtime context's override of its steps and
    draft tokens (``EAGLEWorkerV2._override_worker_state``, the same ``override`` call here);
    the draft-extend graphs it captures take their width from ``resolve_num_tokens_per_req``,
    which must read that override, not ``server_args`` (the startup record): else every state
    but the configured one captures at the configured width and replays nothing (its draft
    extend runs eagerly)."""
    from sglang.srt.runtime_context import get_context
    from sglang.srt.speculative.spec_utils import resolve_num_tokens_per_req

    runner = _runner(tree, tmp_path, *ADAPTIVE, *COMMON)
    args = runner.server_args
    assert resolve_num_tokens_per_req(phase="draft_extend", server_args=args) == 4
    try:
        for steps in (0, 1, 7):
            get_context().override(
                "adaptive_spec.capture_override",
                speculative_num_steps=steps,
                speculative_num_draft_tokens=steps + 1,
            )
            width = resolve_num_tokens_per_req(phase="draft_extend", server_args=args)
            assert width == steps + 1, steps
    finally:  # as _override_worker_state restores it: later tests read the startup values
        get_context().override(
            "adaptive_spec.capture_restore",
            speculative_num_steps=args.speculative_num_steps,
            speculative_num_draft_tokens=args.speculative_num_draft_tokens,
        )
    assert args.speculative_num_draft_tokens == 4  # the startup record is left as it was
    assert resolve_num_tokens_per_req(phase="draft_extend", server_args=args) == 4
