"""SGLang 0.5.17+: ``--speculative-disable-batch-threshold`` carried by upstream's adaptive
runtime states.

From 0.5.14 SGLang runs a zero-step speculative state (a one-token verify replayed from the
TARGET_VERIFY graphs captured for one draft token, no drafting) behind
``--speculative-adaptive``.  On these lines the threshold is a step policy for that machinery:
the configured steps while the decode batch is at or below the threshold, zero steps above it
until the batch is back at or below the re-enable threshold.  The server arguments go through
the real parser and the real ``handle_speculative_decoding``; the step policy and the state
swaps are the real ``BatchThresholdStepParams`` and ``AdaptiveController``; the worker is the
real ``EAGLEWorkerV2.__init__`` with its draft worker stood in for (it loads a model on a GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import logging
from types import SimpleNamespace

import pytest
from spec_fixtures import (
    EAGLE3_TOPK1,
    THRESHOLD_FLAG,
    parse_server_args,
    spec_tree,
    write_model_dir,
)
from spec_server_args_rules import (  # noqa: F401  (collected here: the rules every line shares)
    test_no_warning_below_explicit_max_running_requests,
    test_reenable_defaults_to_three_quarters,
    test_reenable_must_lie_in_range,
    test_reenable_needs_threshold,
    test_threshold_must_be_positive,
    test_threshold_without_speculation_refused,
    test_topk_must_be_one,
    test_unset_threshold_changes_nothing,
    test_warns_about_implicit_cap_of_48,
    test_warns_when_threshold_reaches_max_running_requests,
)

LINES = ("0.5.17", "0.5.23")
pytestmark = [pytest.mark.payload, pytest.mark.sglang_lines(*LINES)]

GRAPH_BS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 96, 128]


@pytest.fixture(scope="module")
def tree(request):
    import os

    return spec_tree(request, os.environ.get("PATCHKIT_PAYLOAD_LINE") or LINES[0])


@pytest.fixture
def model_dir(tmp_path):
    return write_model_dir(tmp_path)


@pytest.fixture
def resolve(tree, model_dir):
    """Parse a command line and run SGLang's speculative-decoding handling on it."""
    from sglang.srt.arg_groups import speculative_hook

    def _resolve(*argv: str, spec_v2: bool = True):
        args = parse_server_args(model_dir, argv)
        speculative_hook.handle_speculative_decoding(args)
        # 0.5.23 declares resolved values instead of assigning them; __post_init__ (skipped
        # here) writes the declarations onto the record at its end, as this does.
        for _source, declared in getattr(args, "_resolved_overrides", None) or ():
            for name, value in declared.items():
                setattr(args, name, value)
        return args

    return _resolve


def test_cli_parses_thresholds(resolve):
    args = resolve(
        *EAGLE3_TOPK1,
        THRESHOLD_FLAG, "32",
        "--speculative-reenable-batch-threshold", "20",
        "--max-running-requests", "128",
    )  # fmt: skip
    assert (
        args.speculative_disable_batch_threshold,
        args.speculative_reenable_batch_threshold,
    ) == (
        32,
        20,
    )
    assert args.speculative_adaptive is False


def test_algorithm_must_be_eagle(resolve):
    argv = list(EAGLE3_TOPK1)
    argv[1] = "STANDALONE"
    with pytest.raises(ValueError, match=r"only the EAGLE and EAGLE3.*STANDALONE"):
        resolve(*argv, THRESHOLD_FLAG, "8")


@pytest.mark.parametrize(
    ("field", "words"),
    [
        ("enable_dp_attention", "enable_dp_attention|attention DP"),
        ("enable_two_batch_overlap", "enable_two_batch_overlap"),
        ("enable_pdmux", "enable_pdmux"),
    ],
)
def test_modes_the_adaptive_states_cannot_serve_refused(resolve, field, words):
    """Where upstream's adaptive mode falls back silently to static steps, the threshold is
    refused: a user who asked for steps without drafts is told they will not happen."""
    from sglang.srt.arg_groups import speculative_hook

    args = resolve(*EAGLE3_TOPK1, THRESHOLD_FLAG, "8", "--max-running-requests", "64")
    setattr(args, field, True)
    if field == "enable_dp_attention" and hasattr(args, "attn_dp_size"):
        args.attn_dp_size = 2  # 0.5.23 reads attention DP from the width it resolved
    with pytest.raises(ValueError, match=f"cannot serve this configuration: .*({words})"):
        speculative_hook._handle_speculative_disable_batch_threshold(args)


def test_adaptive_refused_and_alone_still_allowed(resolve):
    with pytest.raises(ValueError, match=r"cannot be combined with\s+--speculative-adaptive"):
        resolve(*EAGLE3_TOPK1, THRESHOLD_FLAG, "8", "--speculative-adaptive")
    args = resolve("--speculative-algorithm", "EAGLE3", "--speculative-adaptive")
    assert args.speculative_adaptive is True


def test_flags_are_documented_options(tree):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    dests = {a.dest: a for a in parser._actions}
    for flag in (THRESHOLD_FLAG, "--speculative-reenable-batch-threshold"):
        action = dests[flag[2:].replace("-", "_")]
        assert flag in action.option_strings and action.help


def _params(steps=2, disable_above=8, reenable_at=6):
    from sglang.srt.speculative.adaptive_spec_params import BatchThresholdStepParams

    return BatchThresholdStepParams(steps, disable_above, reenable_at)


def test_hysteresis_decision_and_logging(tree, caplog):
    caplog.set_level(logging.INFO)
    params = _params()
    ramp = [1, 8, 9, 12, 7, 0, 6, 8, 9, 0, 3]
    steps = [params.get_steps_for_batch(bs) for bs in ramp]
    # Above 8 off, back on only at <= 6; an idle batch (0) decides nothing.
    assert steps == [2, 2, 0, 0, 0, 0, 2, 2, 0, 0, 2]
    switches = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("Speculative decoding")
    ]
    assert switches == [
        "Speculative decoding disabled: decode batch size 9 > 8 "
        "(--speculative-disable-batch-threshold).",
        "Speculative decoding re-enabled: decode batch size 6 <= 6 "
        "(--speculative-reenable-batch-threshold).",
        "Speculative decoding disabled: decode batch size 9 > 8 "
        "(--speculative-disable-batch-threshold).",
        "Speculative decoding re-enabled: decode batch size 3 <= 6 "
        "(--speculative-reenable-batch-threshold).",
    ]
    # Acceptance does not move it (that is --speculative-adaptive's policy).
    assert all(params.on_verify_complete([0] * 4, 4) is None for _ in range(40))
    assert params.get_steps_for_batch(4) == 2


def test_graphs_only_for_batch_sizes_each_state_can_run(tree):
    params = _params(steps=2, disable_above=30, reenable_at=22)
    assert params.cuda_graph_bs_for_step(0) is None  # CUDA graphs off
    params.set_cuda_graph_bs(GRAPH_BS)
    assert params.candidate_steps == [0, 2]
    # Zero steps: batches above the re-enable threshold, padded up to a graph size.
    assert params.cuda_graph_bs_for_step(0) == [24, 32, 40, 48, 64, 96, 128]
    # The configured state is the worker's own (captured before the controller builds any):
    # asking for it here is a misuse, not a silent full list.
    with pytest.raises(ValueError, match="only the zero-step state"):
        params.cuda_graph_bs_for_step(2)


@pytest.mark.parametrize(("steps", "reenable"), [(0, 4), (2, 0), (2, 9)])
def test_params_refuse_what_cannot_work(tree, steps, reenable):
    with pytest.raises(ValueError):
        _params(steps=steps, disable_above=8, reenable_at=reenable)


class RecordingWorker:
    """Stands in for EAGLEWorkerV2's side of the AdaptiveSpecWorker protocol (building a
    state captures CUDA graphs on a GPU): records what is built and which state is live."""

    def __init__(self, steps: int):
        self.speculative_num_steps = steps
        self.built: list[tuple[int, int, list[int] | None]] = []
        self.applied: list[int] = []

    def build_adaptive_runtime_state(
        self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None
    ):
        self.built.append((speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs))
        return SimpleNamespace(speculative_num_steps=speculative_num_steps)

    def apply_runtime_state(self, state) -> None:
        if state.speculative_num_steps != self.speculative_num_steps:
            self.applied.append(state.speculative_num_steps)
        self.speculative_num_steps = state.speculative_num_steps


def test_controller_swaps_states_across_the_threshold(tree):
    from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController

    worker = RecordingWorker(steps=2)
    # The policy argument: `params` on 0.5.17, `policy` (upstream's own) from 0.5.23.
    accepted = inspect.signature(AdaptiveController.__init__).parameters
    keyword = "policy" if "policy" in accepted else "params"
    controller = AdaptiveController(worker, **{keyword: _params(2, 8, 6)})
    controller.register(SimpleNamespace(speculative_num_steps=2))
    controller.init_states(cuda_graph_bs=GRAPH_BS)
    # Only the zero-step state is built (the configured one exists), with one draft token
    # and graphs for batch sizes above the re-enable threshold.
    assert worker.built == [(0, 1, [8, 12, 16, 24, 32, 40, 48, 64, 96, 128])]
    for bs in [1, 9, 40, 7, 6, 3, 12]:
        controller.activate_step_by_batch(bs)
    assert worker.applied == [0, 2, 0]
    controller.on_verify_complete([0, 0, 0], batch_size=3)
    assert worker.speculative_num_steps == 0


def _worker(monkeypatch, resolve, *extra: str):
    from sglang.srt.speculative import eagle_worker_v2

    class DraftWorkerStandIn:
        """EagleDraftWorker loads the draft model on a GPU; the worker's constructor only
        keeps it."""

        def __init__(self, *args, **kwargs):
            pass

    monkeypatch.setattr(eagle_worker_v2, "EagleDraftWorker", DraftWorkerStandIn)
    args = resolve(*EAGLE3_TOPK1, "--max-running-requests", "64", *extra)
    args.device = "cpu"
    init = eagle_worker_v2.EAGLEWorkerV2.__init__
    if "ps" in inspect.signature(init).parameters:  # 0.5.17: the parallel state is passed
        return eagle_worker_v2.EAGLEWorkerV2(args, 0, None, 0, SimpleNamespace())
    # 0.5.23 reads the pipeline rank from the runtime context (one rank here) and the
    # speculative configuration from the published arguments.
    last_rank = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True))
    monkeypatch.setattr(eagle_worker_v2, "get_parallel", lambda: last_rank)
    from sglang.srt import server_args as server_args_module

    server_args_module.set_global_server_args_for_scheduler(args)
    return eagle_worker_v2.EAGLEWorkerV2(args, 0, 0, SimpleNamespace())


def test_worker_builds_the_threshold_policy(resolve, monkeypatch):
    from sglang.srt.speculative.adaptive_spec_params import BatchThresholdStepParams

    worker = _worker(monkeypatch, resolve, THRESHOLD_FLAG, "16")
    params = worker.adaptive_controller.params
    assert isinstance(params, BatchThresholdStepParams)
    assert (params.steps, params.disable_above, params.reenable_at) == (2, 16, 12)
    assert _worker(monkeypatch, resolve).adaptive_controller is None


class DecodeStepDraftStandIn:
    """EagleDraftWorker with its GPU parts stood in for: its model (draft_runner), its own TP
    group, the drafting and the draft extend (GPU kernels), each call recorded."""

    def __init__(self, *args, **kwargs):
        import torch

        self.calls: list[tuple[str, int]] = []
        self.draft_runner = SimpleNamespace(
            tp_group=None,
            spec_algorithm=SimpleNamespace(is_standalone=lambda: False),
            model_config=SimpleNamespace(spec_hidden_size=16, dtype=torch.float32),
        )
        self.parallel_layout = None

    @staticmethod
    def tp(*args):
        return contextlib.nullcontext()  # the draft's own TP group (a GPU process group)

    draft_tp_context = tp

    def _rebuild_topk1_chain_buffers(self):
        pass  # GPU buffers of the top-1 chain

    def draft(self, batch):
        from sglang.srt.speculative.eagle_info import EagleVerifyInput

        bs = batch.seq_lens.shape[0]
        self.calls.append(("draft", bs))
        tokens = self.speculative_num_draft_tokens
        return EagleVerifyInput.create_idle_input(
            topk=1, spec_steps=self.speculative_num_steps, num_verify_tokens=tokens, device="cpu"
        )

    def _draft_extend_for_decode(self, batch, batch_output, **kwargs):
        self.calls.append(("draft_extend", batch.seq_lens.shape[0]))

    def writes_draft_kv_alone(self):
        return True  # test_spec_draft_kv.py: the real one, over the real draft model

    def write_draft_kv_for_decode(self, batch, batch_output):
        self.calls.append(("draft_kv", batch.seq_lens.shape[0]))


def _decode_batch(bs: int):
    """A decode batch as the worker reads it: its size from ``seq_lens``, the pending token."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return SimpleNamespace(
        forward_mode=ForwardMode.DECODE,
        is_extend_in_batch=False,
        seq_lens=torch.full((bs,), 20, dtype=torch.int64),
        seq_lens_sum=20 * bs,
        seq_lens_cpu=None,
        spec_info=SimpleNamespace(bonus_tokens=torch.arange(bs), is_verify_input=lambda: False),
    )


def test_worker_decode_steps_follow_the_threshold(tree, resolve, monkeypatch):
    """The real EAGLEWorkerV2 decode step over a ramp: it asks the policy with the batch's own
    size, drafts only while speculating, and above the threshold verifies the pending token
    alone (one draft token, zero steps) as a plain decode (``plain_decode``) with no draft
    call, its new lengths published before the target runs.  Stand-ins: the draft worker's GPU
    parts and its TP group, state building (CUDA-graph capture) and the verify's kernels
    (recorded); the state swaps are the real ``apply_runtime_state``."""
    from sglang.srt import server_args as server_args_module
    from sglang.srt.speculative import eagle_worker_v2

    monkeypatch.setattr(eagle_worker_v2, "EagleDraftWorker", DecodeStepDraftStandIn)
    args = resolve(*EAGLE3_TOPK1, THRESHOLD_FLAG, "8", "--speculative-reenable-batch-threshold",
                   "6", "--max-running-requests", "64")  # fmt: skip
    args.device = "cpu"
    server_args_module.set_global_server_args_for_scheduler(args)
    attn = SimpleNamespace(verify_mask=None, max_context_len=64)
    target = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=attn))
    if "ps" in inspect.signature(eagle_worker_v2.EAGLEWorkerV2.__init__).parameters:
        worker = eagle_worker_v2.EAGLEWorkerV2(args, 0, None, 0, target)  # 0.5.17
    else:  # 0.5.23: one pipeline rank from the runtime context, the draft's own TP context
        one_rank = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True), pp_size=1)
        monkeypatch.setattr(eagle_worker_v2, "get_parallel", lambda: one_rank)
        monkeypatch.setattr(eagle_worker_v2, "draft_tp_context", DecodeStepDraftStandIn.tp)
        worker = eagle_worker_v2.EAGLEWorkerV2(args, 0, 0, target)
    draft = worker._draft_worker
    draft.speculative_num_steps, draft.speculative_num_draft_tokens = 2, 3

    def build_state(speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None):
        return SimpleNamespace(  # what capture builds; apply_runtime_state is the real one
            speculative_num_steps=speculative_num_steps,
            speculative_num_draft_tokens=speculative_num_draft_tokens,
            **dict.fromkeys(RUNTIME_STATE_PARTS),
            target_attn_backend=attn,
        )

    monkeypatch.setattr(worker, "build_adaptive_runtime_state", build_state)
    worker.adaptive_controller.register(build_state(2, 3))
    worker.adaptive_controller.init_states(cuda_graph_bs=GRAPH_BS)
    events: list[tuple] = []

    def verify(batch, **kwargs):
        plain = kwargs.get("plain_decode", False)
        events.append(("verify", batch.seq_lens.shape[0], batch.spec_info.draft_token_num, plain))
        return SimpleNamespace(new_seq_lens=batch.seq_lens + 3, next_draft_input=SimpleNamespace())

    monkeypatch.setattr(worker, "verify", verify)
    ramp = [4, 8, 9, 12, 7, 5, 3]  # disabled above 8, re-enabled at <= 6 (5 pads to 8)
    for bs in ramp:
        step = worker.forward_batch_generation(
            _decode_batch(bs), on_publish=lambda lens: events.append(("publish", lens.tolist()))
        )
        events.append(("result", step.new_seq_lens.tolist()))
        if bs > 8 or bs == 7:  # no drafts: the draft's top-k left zero for the FutureMap
            assert step.next_draft_input.topk_p.tolist() == [[0.0]] * bs
    verified = [e[1:] for e in events if e[0] == "verify"]
    assert verified == [(4, 3, False), (8, 3, False), (9, 1, True), (12, 1, True),
                        (7, 1, True), (5, 3, False), (3, 3, False)]  # fmt: skip
    drafted = [bs for kind, bs in draft.calls if kind == "draft"]
    assert drafted == [4, 8, 5, 3]
    extended = [bs for kind, bs in draft.calls if kind == "draft_extend"]
    assert extended == drafted  # a step without drafts writes the draft's K/V alone
    assert [bs for kind, bs in draft.calls if kind == "draft_kv"] == [9, 12, 7]
    # A step without drafts publishes seq_lens + 1 before the target runs (the scheduler's
    # next batch waits for no forward) and returns what it published; a verify step
    # publishes its own result after it.
    i = events.index(("verify", 9, 1, True))
    assert events[i - 1 : i + 2] == [("publish", [21] * 9), events[i], ("result", [21] * 9)]
    i = events.index(("verify", 4, 3, False))
    assert events[i : i + 3] == [events[i], ("publish", [23] * 4), ("result", [23] * 4)]
    monkeypatch.setenv("SGLANG_SPEC_ZERO_STEP_FULL_DRAFT_EXTEND", "1")  # when asked for,
    draft.calls.clear()  # the full draft extend
    worker.forward_batch_generation(_decode_batch(12))
    assert draft.calls == [("draft_extend", 12)]


RUNTIME_STATE_PARTS = (
    "draft_attn_backend",
    "cuda_graph_runner",
    "target_graph_runner",
    "draft_extend_attn_backend",
    "cuda_graph_runner_for_draft_extend",
)


class GraphRunnerRecorder:
    """The zero-step state's target graph runner, recording the batch it is asked about and
    loaded with (capturing and replaying a graph needs a GPU)."""

    def __init__(self):
        self.asked, self.loaded = [], []

    def can_run_graph(self, forward_batch):
        self.asked.append(forward_batch)
        return True

    def load_batch(self, forward_batch):
        self.loaded.append(forward_batch)


def _pending_token_batch(bs: int):
    """A real ScheduleBatch as spec v2 hands a decode step to the worker: ``seq_lens`` counts
    the tokens in the KV cache, the pending token (not yet in it) is the tree's root, the
    scheduler reserved KV slots from ``seq_lens`` on."""
    import torch
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    pool = ReqToTokenPool(size=8, max_context_len=64, device="cpu", enable_memory_saver=False)
    seq_lens = torch.tensor([11, 20, 7][:bs], dtype=torch.int64)
    pool.req_to_token[:bs] = 1000 + torch.arange(bs * 64, dtype=torch.int32).view(bs, 64)
    reqs = [SimpleNamespace(lora_id=None, rid=str(i), token_type_ids=None) for i in range(bs)]
    batch = ScheduleBatch(reqs=reqs)
    batch.forward_mode = ForwardMode.DECODE
    batch.req_pool_indices = torch.arange(bs, dtype=torch.int64)
    batch.seq_lens, batch.seq_lens_cpu = seq_lens, seq_lens.clone()
    batch.orig_seq_lens, batch.seq_lens_sum = seq_lens.to(torch.int32), int(seq_lens.sum())
    batch.spec_algorithm = SpeculativeAlgorithm.EAGLE3
    batch.device = "cpu"
    batch.model_config = SimpleNamespace(vocab_size=VOCAB_STANDIN)
    return batch, pool


VOCAB_STANDIN = 64
# the worker's fields its one-node tree reads (the target's live attention backend has no
# verify mask to fill for a plain decode)
TREE_BUILDER = SimpleNamespace(
    device="cpu", topk=1,
    _target_worker=SimpleNamespace(
        model_runner=SimpleNamespace(attn_backend=SimpleNamespace(verify_mask=None))
    ),
)  # fmt: skip
ONE_RANK = SimpleNamespace(moe_ep_size=1, attn_tp_size=1, attn_tp_rank=0, attn_dcp_size=1,
                           dcp_enabled=False, dcp_size=1, dcp_rank=0)  # fmt: skip


def test_a_step_without_drafts_decodes_the_pending_token(tree, resolve, monkeypatch):
    """The real ``eagle_prepare_for_verify`` with ``plain_decode`` and the real
    ``ForwardBatch.init_new``: the target is handed a DECODE batch of each request's pending
    token at position ``seq_lens`` (one KV slot, the first the scheduler reserved), with
    ``seq_lens + 1``, no ``spec_info`` and FULL hidden-state capture (the EAGLE-3 aux states
    the draft extend reads); the graph runner is asked about that batch; the schedule batch
    keeps the verify step's shape for the draft extend.  Stand-in: the model runner's
    attributes and its graph runner (capture and replay need a GPU), one rank's parallel
    state, the Triton kernel that reads the reserved slots (in torch)."""
    import torch
    from sglang.srt import server_args as server_args_module
    from sglang.srt.model_executor import forward_batch_info
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.speculative import eagle_utils, eagle_worker_v2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    batch, pool = _pending_token_batch(3)
    roots = torch.tensor([5, 9, 13])
    batch.spec_info = SimpleNamespace(bonus_tokens=roots)  # the pending tokens (EagleDraftInput)
    # the worker's own one-node tree, as its step without drafts builds it
    batch.spec_info = verify_input = eagle_worker_v2.EAGLEWorkerV2._build_trivial_verify_input(
        TREE_BUILDER, batch, plain_decode=True
    )
    graphs = GraphRunnerRecorder()
    args = resolve(*EAGLE3_TOPK1, THRESHOLD_FLAG, "8", "--max-running-requests", "64")
    args.device = "cpu"
    server_args_module.set_global_server_args_for_scheduler(args)
    monkeypatch.setattr(forward_batch_info, "get_parallel", lambda: ONE_RANK)
    from sglang.kernels.ops.speculative import cache_locs

    monkeypatch.setattr(cache_locs, "assign_extend_cache_locs_uniform_func", reserved_slots)
    runner = SimpleNamespace(
        spec_algorithm=SpeculativeAlgorithm.EAGLE3, is_draft_worker=False, device="cpu",
        server_args=args,
        model_config=SimpleNamespace(
            model_is_mrope=False, vocab_size=VOCAB_STANDIN, requires_mm_token_modalities=False
        ),
        ngram_embedding_manager=SimpleNamespace(enabled=False), lora_manager=None,
        decode_cuda_graph_runner=graphs,
    )  # fmt: skip
    _add_kv_index_translator(runner, pool, monkeypatch)
    forward_batch, graph = eagle_utils.eagle_prepare_for_verify(
        verify_input, pool, batch, SimpleNamespace(model_runner=runner), plain_decode=True
    )
    assert graph and graphs.asked == [forward_batch] and graphs.loaded == [forward_batch]
    assert forward_batch.forward_mode == ForwardMode.DECODE
    assert forward_batch.spec_info is None
    assert forward_batch.capture_hidden_mode == CaptureHiddenMode.FULL
    assert forward_batch.input_ids.tolist() == roots.tolist()
    assert forward_batch.positions.tolist() == [11, 20, 7]  # the pending token's position
    assert forward_batch.seq_lens.tolist() == [12, 21, 8]  # it is attended to
    assert forward_batch.seq_lens_cpu.tolist() == [12, 21, 8]
    assert forward_batch.seq_lens_sum == 41
    # the first reserved slot of each request: req_to_token[i, seq_lens[i]]
    want_slots = [1000 + i * 64 + n for i, n in enumerate([11, 20, 7])]
    assert forward_batch.out_cache_loc.tolist() == want_slots
    if hasattr(runner, "kv_index_translator"):  # 0.5.23+: the forward's KV plan is its own
        plan = forward_batch.kv_loc_plan
        assert plan is not None and plan.seq_lens.tolist() == [12, 21, 8]
    # the batch itself: what the draft extend and the scheduler read after a verify
    assert batch.forward_mode == ForwardMode.TARGET_VERIFY
    assert batch.seq_lens.tolist() == [11, 20, 7] and batch.spec_info is verify_input
    assert batch.out_cache_loc.tolist() == want_slots


def _add_kv_index_translator(runner, pool, monkeypatch):
    """0.5.23+: the runner's real KVIndexTranslator over the real req_to_token table (a plain
    pool: no translated id spaces), which every ForwardBatch binds its KV plan to."""
    try:
        from sglang.srt.mem_cache import kv_index_translator
    except ImportError:  # 0.5.17: no KV plans
        return
    monkeypatch.setattr(kv_index_translator, "get_parallel", lambda: ONE_RANK)
    runner.kv_index_translator = kv_index_translator.KVIndexTranslator(
        req_to_token=pool.req_to_token, token_to_kv_pool_allocator=object(),
        token_to_kv_pool=object(), page_size=1, device="cpu",
    )  # fmt: skip


def reserved_slots(req_pool_indices, req_to_token, start_offset, batch_size, draft_token_num,
                   device):  # fmt: skip
    """``assign_extend_cache_locs_uniform_func`` (Triton) in torch: the slots
    ``[start, start + draft_token_num)`` of each request, request-major."""
    import torch

    assert len(req_pool_indices) == batch_size == len(start_offset)
    cols = start_offset.to(torch.int64).unsqueeze(1) + torch.arange(draft_token_num)
    return req_to_token[req_pool_indices.unsqueeze(1), cols].reshape(-1).to(torch.int64)
