"""Decode steps without drafts in SGLang's EAGLEWorker (v1) and EAGLEWorkerV2 (v2).

The 0.5.9 line's tree (``PATCHKIT_SPEC_TREE`` names another tree, e.g. a planted copy); the
0.5.17 line carries the threshold through upstream's adaptive runtime states instead
(``test_spec_threshold_adaptive.py``).

Each run drives the patched worker the way the scheduler does, across the threshold both
ways several times, with the real scheduler-side consumers of its result (``FutureMap``,
``prepare_for_decode``, batch filter/merge, ``process_batch_result_decode`` and the metrics
mixin), the real ``CudaGraphRunner`` (TARGET_VERIFY graphs of the target and the patch's
DECODE graphs; only the CUDA-graph object is stood in), the real verify sampling and
bookkeeping and the real draft extend. ``standins/spec_runtime.py`` documents every stand-in.
After every step the harness checks the target and draft KV of every live request against a
dense recomputation, so a wrong slot, position or missing draft extend is caught at the step.
"""

from __future__ import annotations

import logging
import re
import types

import pytest
import torch
from spec_fixtures import default_server_args, running_line, spec_tree

pytestmark = [pytest.mark.payload, pytest.mark.sglang_lines("0.5.9")]

LINE = running_line()
THRESHOLD = 4
REENABLE = 3
GRAPH_BS = [1, 2, 3, 4, 6, 8, 12, 16]
# (prompt, max_new_tokens). Two requests start; four join (6 > 4: off) and finish early
# (2 <= 3: on); five more join (7: off) and finish (2: on).
FIRST = [([3, 17, 5, 9, 22, 40, 6], 40), ([11, 2, 30, 44, 8], 40)]
WAVES = {
    3: [([7, 7, 2, 19], 6), ([25, 4, 19, 8, 2], 7), ([13, 3], 5), ([36, 21, 9], 8)],
    16: [([5, 5, 5], 6), ([9, 31, 2, 4], 7), ([46, 12], 5), ([20, 3, 3, 8, 14], 6),
         ([33, 2, 27], 8)],
}  # fmt: skip


@pytest.fixture(scope="module")
def rt(request):
    """The line's patched tree on ``sys.path`` and the stand-in runtime module."""
    spec_tree(request, LINE)
    import spec_runtime

    spec_runtime.N = spec_runtime.names()
    assert spec_runtime.N.line == LINE
    return spec_runtime


@pytest.fixture
def server_args(rt):
    from sglang.srt import server_args as module

    return default_server_args(module)


class SchedulerStandIn:
    """The scheduler state ``process_batch_result_decode`` reads, with the real
    output-processor and metrics mixins bound to it."""

    def __init__(self, server_args, allocator, tree_cache, model_worker, spec_algorithm):
        import importlib

        import spec_runtime
        from sglang.srt.managers.scheduler_output_processor_mixin import (
            SchedulerOutputProcessorMixin,
        )

        metrics = importlib.import_module(spec_runtime.names().metrics_mixin)
        SchedulerMetricsMixin = metrics.SchedulerMetricsMixin

        for mixin in (SchedulerOutputProcessorMixin, SchedulerMetricsMixin):
            for name, value in vars(mixin).items():
                own = name in type(self).__dict__
                if callable(value) and not name.startswith("__") and not own:
                    setattr(self, name, types.MethodType(value, self))
        self.server_args = server_args
        self.enable_overlap = not server_args.disable_overlap_schedule
        self.token_to_kv_pool_allocator = allocator
        self.tree_cache = tree_cache
        self.model_worker = model_worker
        self.draft_worker = model_worker  # 0.5.9 reads the stride from it
        self.spec_algorithm = spec_algorithm
        self.enable_metrics = False
        self.current_scheduler_metrics_enabled = False
        self.forward_ct_decode = 0
        self.num_generated_tokens = 0
        setattr(self, spec_runtime.names().sched_accepted, 0)
        self.spec_num_forward_ct = 0
        self.streamed = []
        self.model_config = types.SimpleNamespace(think_end_id=None, vocab_size=None)
        self.enable_hisparse = False
        self.enable_overlap_mlx = False
        self.req_to_token_pool = tree_cache.req_to_token_pool

    def stream_output(self, reqs, return_logprob, skip_req=None):
        self.streamed.append([r.rid for r in reqs])

    def report_decode_stats(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        # scheduler features the decode output path only consults when enabled
        if name.startswith(("maybe_", "_maybe_")):
            return lambda *a, **k: None
        raise AttributeError(name)


class Harness:
    """Pools, models, the worker under test and a scheduler loop, for one spec version."""

    def __init__(self, rt, server_args, spec_v2: bool, monkeypatch, **settings):
        from sglang.srt.managers.overlap_utils import FutureMap
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.chunk_cache import ChunkCache
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.model_executor import cuda_graph_runner as cgr
        from sglang.srt.speculative import spec_disable
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        rt.install(monkeypatch)
        self.rt = rt
        self.spec_v2 = spec_v2
        base = {
            "speculative_algorithm": "EAGLE3",
            "speculative_num_steps": rt.STEPS,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": rt.NUM_DRAFT,
            "speculative_disable_batch_threshold": THRESHOLD,
            "speculative_reenable_batch_threshold": REENABLE,
            "disable_overlap_schedule": not spec_v2,
            "page_size": 1,
            "device": "cpu",
            "disable_cuda_graph": False,
            "cuda_graph_bs": list(GRAPH_BS),
            "cuda_graph_max_bs": max(GRAPH_BS),
            "enable_torch_compile": False,
            # ForwardBatch positions in torch (its Triton kernel needs a GPU)
            "attention_backend": "torch_native",
        }
        base.update(settings)
        for name, value in base.items():
            monkeypatch.setattr(server_args, name, value, raising=False)
        self.server_args = server_args
        self.algorithm = SpeculativeAlgorithm.from_string("EAGLE3")

        self.req_to_token_pool = ReqToTokenPool(
            size=rt.MAX_REQS, max_context_len=rt.CONTEXT, device="cpu", enable_memory_saver=False
        )
        self.allocator = TokenToKVPoolAllocator(
            rt.POOL_TOKENS, torch.float32, "cpu", kvcache=None, need_sort=False
        )
        self.initial_free = self.allocator.available_size()
        self.tree_cache = ChunkCache(
            CacheInitParams(
                disable=True,
                req_to_token_pool=self.req_to_token_pool,
                token_to_kv_pool_allocator=self.allocator,
                page_size=1,
            )
        )
        self.target = rt.TinyTarget()
        self.draft = rt.TinyDraft(self.target)
        self.target_runner = rt.StandInModelRunner(
            self.target, server_args, self.req_to_token_pool, False, self.algorithm
        )
        self.draft_runner = rt.StandInModelRunner(
            self.draft, server_args, self.req_to_token_pool, True, self.algorithm
        )
        self.live_backend = self.target_runner.attn_backend
        # the target's TARGET_VERIFY graphs, as ModelRunner.init_device_graphs captures them
        graph_cls = rt.graph_runner_cls()
        monkeypatch.setattr(cgr, "CudaGraphRunner", graph_cls)
        monkeypatch.setattr(spec_disable, "CudaGraphRunner", graph_cls)
        self.verify_graphs = graph_cls(self.target_runner)
        self.target_runner.graph_runner = self.verify_graphs
        self.target_worker = self._target_worker()
        self.worker = self._make_worker(monkeypatch)
        self.scheduler = SchedulerStandIn(
            server_args, self.allocator, self.tree_cache, self.worker, self.algorithm
        )
        self.future_map = (
            FutureMap(rt.MAX_REQS, None, rt.CONTEXT, "cpu", self.algorithm) if spec_v2 else None
        )
        self.batch = None
        self.steps = []  # per decode step: dict(bs, speculated, result, rids, ...)
        self.all_reqs = []

    # -- construction -------------------------------------------------------------------
    def _target_worker(self):
        from sglang.srt.managers.tp_worker import TpModelWorker

        worker = object.__new__(TpModelWorker)
        worker._model_runner = self.target_runner
        worker.server_args = self.server_args
        worker.hicache_layer_transfer_counter = None
        worker.dllm_algorithm = None
        worker.pp_group = types.SimpleNamespace(is_last_rank=True)
        worker.enable_overlap = not self.server_args.disable_overlap_schedule
        worker.enable_spec = True
        worker.device = "cpu"
        worker.model_config = self.target_runner.model_config
        return worker

    def _make_worker(self, monkeypatch):
        from sglang.srt.utils.common import empty_context

        rt = self.rt
        common = dict(
            server_args=self.server_args,
            topk=1,
            speculative_num_steps=rt.STEPS,
            speculative_num_draft_tokens=rt.NUM_DRAFT,
            device="cpu",
            gpu_id=0,
            tp_rank=0,
            page_size=1,
            speculative_algorithm=self.algorithm,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator,
            plan_stream=None,
            plan_stream_ctx=empty_context(),
            adaptive_controller=None,
            enable_nan_detection=False,
            hot_token_id=None,
            eagle_use_aux_hidden_state=True,
            cuda_graph_runner=None,
            cuda_graph_runner_for_draft_extend=None,
            draft_extend_attn_backend=None,
        )
        if self.spec_v2:
            from sglang.srt.speculative.eagle_worker_v2 import (
                EagleDraftWorker,
                EAGLEWorkerV2,
            )

            draft_worker = object.__new__(EagleDraftWorker)
            vars(draft_worker).update(common)
            vars(draft_worker).update(
                draft_runner=self.draft_runner,
                target_worker=self.target_worker,
                draft_tp_context=empty_context,
            )
            worker = object.__new__(EAGLEWorkerV2)
            vars(worker).update(common)
            vars(worker).update(_target_worker=self.target_worker, _draft_worker=draft_worker)
            monkeypatch.setattr(draft_worker, "draft", self._standin_draft_v2, raising=False)
        else:
            from sglang.srt.speculative.eagle_worker import EAGLEWorker

            worker = object.__new__(EAGLEWorker)
            vars(worker).update(common)
            vars(worker).update(
                target_worker=self.target_worker,
                _model_runner=self.draft_runner,
                model_config=self.draft_runner.model_config,
                draft_tp_context=empty_context,
                draft_attn_backend=rt.StandInAttnBackend("draft-decode"),
            )
            monkeypatch.setattr(worker, "draft", self._standin_draft_v1, raising=False)
        worker.init_spec_disable(self.server_args)
        return worker

    # -- stand-ins for the draft's multi-step decode (sgl_kernel tree kernels) ----------
    def _verify_input(self, draft_input, seq_lens, pool_indices):
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.eagle_info import EagleVerifyInput

        rt = self.rt
        bs = len(seq_lens)
        tokens = self.draft.chain(
            getattr(draft_input, rt.N.root), draft_input.hidden_states, draft_input.topk_index,
            seq_lens, pool_indices, self.req_to_token_pool.req_to_token,
        )  # fmt: skip
        nxt = torch.full((bs, rt.NUM_DRAFT), -1, dtype=torch.int64)
        nxt[:, :-1] = torch.arange(1, rt.NUM_DRAFT)
        return EagleVerifyInput(
            draft_token=tokens.reshape(-1),
            custom_mask=None,
            positions=(seq_lens.view(-1, 1) + torch.arange(rt.NUM_DRAFT)).reshape(-1),
            **{
                rt.N.retrieve + "index": torch.arange(bs * rt.NUM_DRAFT).view(bs, rt.NUM_DRAFT),
                rt.N.retrieve + "next_token": nxt,
                rt.N.retrieve + "next_sibling": torch.full(
                    (bs, rt.NUM_DRAFT), -1, dtype=torch.int64
                ),
                rt.N.retrieve + "cum_len": None,
            },
            spec_steps=rt.STEPS,
            topk=1,
            draft_token_num=rt.NUM_DRAFT,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=int(seq_lens.sum()),
            seq_lens_cpu=seq_lens.cpu(),
        )

    def _standin_draft_v2(self, mwb):
        return self._verify_input(mwb.spec_info, mwb.seq_lens, mwb.req_pool_indices)

    def _standin_draft_v1(self, batch):
        # EAGLEWorker._draft_preprocess_decode's bookkeeping (the rest is kernels)
        for req in batch.reqs:
            req.decode_batch_idx += 1
        if batch.sampling_info.penalizer_orchestrator.is_required:
            batch.sampling_info.penalizer_orchestrator.cumulate_output_tokens(
                getattr(batch.spec_info, self.rt.N.root).to(torch.int64)
            )
        return self._verify_input(batch.spec_info, batch.seq_lens, batch.req_pool_indices)

    # -- prefill (stand-in for the extend step, which is not under test) ---------------
    def make_reqs(self, specs, start_rid: int, **params):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        reqs = []
        for offset, (prompt, max_new, *own) in enumerate(specs):
            merged = {**params, **(own[0] if own else {})}
            sp = SamplingParams(max_new_tokens=max_new, temperature=0.0, **merged)
            sp.normalize(None)
            req = Req(f"r{start_rid + offset}", "", list(prompt), sp, vocab_size=self.rt.VOCAB)
            req.tokenizer = types.SimpleNamespace(
                eos_token_id=self.rt.EOS, additional_stop_token_ids=None
            )
            req.prompt = list(prompt)
            reqs.append(req)
        return reqs

    def prefill(self, reqs):
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        rt = self.rt
        batch = ScheduleBatch.init_new(
            reqs, self.req_to_token_pool, self.allocator, self.tree_cache,
            types.SimpleNamespace(vocab_size=rt.VOCAB, hidden_size=rt.HIDDEN,
                                  dtype=torch.float32, is_encoder_decoder=False,
                                  is_multimodal=False, context_len=rt.CONTEXT,
                                  think_end_id=None),
            self.spec_v2, self.algorithm,
        )  # fmt: skip
        self.req_to_token_pool.alloc(reqs)
        table = self.req_to_token_pool.req_to_token
        first_tokens, draft_hidden, topk = [], [], []
        for req in reqs:
            n = len(req.prompt)
            slots = self.allocator.alloc(n)
            table[req.req_pool_idx, :n] = slots.to(torch.int32)
            req.kv_committed_len = req.kv_allocated_len = n
            rows = torch.full((n,), req.req_pool_idx)
            positions = torch.arange(n)
            tokens = torch.tensor(req.prompt)
            logits, aux = self.target.run(tokens, positions, slots, rows, table)
            first = int(torch.argmax(logits[-1]))
            req.output_ids.append(first)
            req.fill_ids = req.prompt + [first]
            shifted = torch.cat([tokens[1:], torch.tensor([first])])
            d_logits, d_hidden = self.draft.run(shifted, aux, positions, slots, rows, table)
            first_tokens.append(first)
            draft_hidden.append(d_hidden[-1])
            topk.append(torch.max(torch.softmax(d_logits[-1], -1), dim=-1, keepdim=True))
        batch.req_pool_indices = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
        batch.seq_lens = torch.tensor([len(r.prompt) for r in reqs], dtype=torch.int64)
        batch.seq_lens_cpu = batch.seq_lens.clone()
        batch.orig_seq_lens = batch.seq_lens.to(torch.int32)
        batch.seq_lens_sum = int(batch.seq_lens.sum())
        batch.prefix_lens = [0] * len(reqs)
        batch.extend_lens = [len(r.prompt) for r in reqs]
        batch.sampling_info = SamplingBatchInfo.from_schedule_batch(batch, rt.VOCAB)
        draft_input = EagleDraftInput(
            **{rt.N.root: torch.tensor(first_tokens, dtype=torch.int32)},
            hidden_states=torch.stack(draft_hidden).to(torch.float32),
            topk_p=torch.cat([t.values for t in topk]).view(-1, 1).to(torch.float32),
            topk_index=torch.cat([t.indices for t in topk]).view(-1, 1),
            new_seq_lens=batch.seq_lens.clone(),
        )
        if self.spec_v2:
            indices = self.future_map.alloc_future_indices(len(reqs))
            self.future_map.store_to_map_for_new_batch(indices, draft_input)
            draft_input = EagleDraftInput(future_indices=indices)
            batch.output_ids = -indices.indices
        else:
            batch.output_ids = torch.tensor(first_tokens, dtype=torch.int64)
        batch.spec_info = draft_input
        self.all_reqs += reqs
        if self.batch is None or not self.batch.reqs:
            self.batch = batch
        else:
            self.batch.merge_batch(batch)

    # -- one decode step as Scheduler.run_batch + process_batch_result_decode ----------
    def decode_step(self):
        rt = self.rt
        batch = self.batch
        bs = batch.batch_size()
        mark = len(rt.LAUNCHES.entries)
        replays_before = dict(self.target_runner.graph_replays)
        if self.spec_v2:
            batch.prepare_for_decode()
            mwb = batch.get_model_worker_batch()
            mwb.sampling_info = mwb.sampling_info.copy_for_forward()
            mwb.seq_lens = rt.traced(mwb.seq_lens)
            future_indices = self.future_map.alloc_future_indices(bs)
            self.future_map.resolve_future(mwb)
            result = self.worker.forward_batch_generation(mwb)
            result.copy_done = rt.StandInEvent()
            self.future_map.store_to_map(future_indices, result)
            result.copy_to_cpu(return_logprob=batch.return_logprob)
            batch.spec_info = result.next_draft_input
            batch.spec_info.future_indices = future_indices
            batch.seq_lens = result.next_draft_input.new_seq_lens
            batch.output_ids = -future_indices.indices
        else:
            batch.prepare_for_decode()
            result = self.worker.forward_batch_generation(batch)
            batch.output_ids = result.next_token_ids
        replays = {
            k: v - replays_before.get(k, 0)
            for k, v in self.target_runner.graph_replays.items()
            if v - replays_before.get(k, 0)
        }
        self.steps.append(
            dict(
                bs=bs,
                speculated=not result.spec_skipped,
                result=result,
                rids=[req.rid for req in batch.reqs],
                launches=rt.LAUNCHES.entries[mark:],
                replays=replays,
            )
        )
        self.scheduler.process_batch_result_decode(batch, result)
        batch.filter_batch(v1_spec_info_filtered=True)
        self.check_kv(batch)

    def check_kv(self, batch):
        """Target KV rows 0..L-1 and draft KV rows 0..L-1 of every live request equal a
        dense recomputation from its tokens (L = the committed length)."""
        if self.spec_v2:
            batch.maybe_wait_verify_done()
        table = self.req_to_token_pool.req_to_token
        for i, req in enumerate(batch.reqs):
            tokens = req.prompt + req.output_ids
            length = int(batch.seq_lens[i])
            assert length == len(tokens) - 1, (req.rid, length, len(tokens))
            slots = table[req.req_pool_idx, :length].long()
            pos = torch.arange(length)
            ids = torch.tensor(tokens[:length])
            assert torch.allclose(self.target.kv[slots], self.target.token_kv(ids, pos)), req.rid
            nxt = torch.tensor(tokens[1 : length + 1])
            assert torch.allclose(self.draft.kv[slots], self.draft.row(nxt, pos)), req.rid

    # -- the run ------------------------------------------------------------------------
    def run(self, first=FIRST, waves=WAVES, **params):
        self.prefill(self.make_reqs(first, 0, **params))
        step, rid = 0, len(first)
        while self.batch.reqs:
            if step in waves:
                self.prefill(self.make_reqs(waves[step], rid, **params))
                rid += len(waves[step])
            self.decode_step()
            step += 1
            assert step < 200
        return self


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture(scope="module", params=["v1", "v2"])
def harness(request, rt):
    """One run across the threshold per spec version, shared by the tests that read it."""
    from sglang.srt import server_args as module

    logger = logging.getLogger("sglang.srt.speculative.spec_disable")
    records, level = _Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    try:
        with pytest.MonkeyPatch.context() as monkeypatch:
            h = Harness(rt, default_server_args(module), request.param == "v2", monkeypatch)
            h.log = records.records
            yield h.run()
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)


def spec_steps(h):
    return [s for s in h.steps if s["speculated"]]


def plain_steps(h):
    return [s for s in h.steps if not s["speculated"]]


def test_crosses_threshold_both_ways_twice(harness):
    sizes = [(s["bs"], s["speculated"]) for s in harness.steps]
    assert sizes[0] == (2, True)
    switches = sum(1 for a, b in zip(sizes, sizes[1:], strict=False) if a[1] != b[1])
    assert switches == 4
    state = True
    for bs, speculated in sizes:
        if bs > THRESHOLD:
            state = False
        elif bs <= REENABLE:
            state = True
        assert speculated == state, sizes


def test_outputs_equal_greedy_target(harness):
    for req in harness.all_reqs:
        max_new = req.sampling_params.max_new_tokens
        expected = harness.target.greedy(req.prompt, max_new)
        assert req.finished()
        assert req.output_ids[: len(expected)] == expected, req.rid


def test_steps_without_drafts_replay_decode_graphs(harness):
    """Each step without drafts replays one DECODE graph of the dedicated runtime and
    nothing of the verify graphs; the live backend is never planned for DECODE; the
    target's TARGET_VERIFY graphs are back (and replayed) once speculation resumes."""
    runtime = harness.worker.plain_decode
    assert runtime.graph_runner is not None
    assert runtime.graph_runner.capture_forward_mode.name == "DECODE"
    assert runtime.graph_runner.capture_bs == [bs for bs in GRAPH_BS if bs > REENABLE]
    graphs = list(runtime.graph_runner.graphs.values())
    assert graphs and all(g.attn_backend is runtime.attn_backend for g in graphs)
    assert runtime.attn_backend is not harness.live_backend
    for s in plain_steps(harness):
        assert s["replays"] == {"DECODE": 1}, s["replays"]
        assert s["result"].can_run_cuda_graph
    for s in spec_steps(harness):
        assert s["replays"].get("DECODE", 0) == 0
    resumed = [
        s for a, s in zip(harness.steps, harness.steps[1:], strict=False)
        if s["speculated"] and not a["speculated"]
    ]  # fmt: skip
    assert len(resumed) == 2
    for s in resumed:
        assert s["replays"].get("TARGET_VERIFY", 0) == 1
    assert harness.target_runner.graph_runner is harness.verify_graphs
    assert harness.target_runner.attn_backend is harness.live_backend
    assert "DECODE" not in harness.live_backend.plans
    assert not any(k.startswith("replay:DECODE") for k in harness.live_backend.plans)


def test_kv_pool_back_to_initial_free_size(harness):
    assert harness.allocator.available_size() == harness.initial_free
    free_pages = harness.allocator.free_pages.tolist()
    assert len(set(free_pages)) == len(free_pages)  # no slot freed twice
    assert harness.req_to_token_pool.available_size() == harness.rt.MAX_REQS


def test_acceptance_metrics_count_speculative_steps_only(harness):
    specs = spec_steps(harness)
    assert harness.scheduler.spec_num_forward_ct == sum(s["bs"] for s in specs)
    accepted = sum(getattr(s["result"], harness.rt.N.accepted) for s in specs)
    assert accepted > 0
    counted = getattr(harness.scheduler, harness.rt.N.sched_accepted)
    assert counted == accepted + sum(s["bs"] for s in specs)
    for req in harness.all_reqs:
        expected = sum(req.rid in s["rids"] for s in specs)
        assert req.spec_verify_ct == expected, req.rid
        assert sum(getattr(req, harness.rt.N.histogram)) == expected, req.rid
    for s in plain_steps(harness):
        assert getattr(s["result"], harness.rt.N.accepted) == 0


def test_switch_logged_once_per_transition(harness):
    messages = [
        r.getMessage()
        for r in harness.log
        if r.name == "sglang.srt.speculative.spec_disable" and r.levelno == logging.INFO
        and r.getMessage().startswith("Speculative decoding")
    ]  # fmt: skip
    assert len(messages) == 4
    assert re.search(r"disabled: decode batch size 6 > 4", messages[0])
    assert re.search(r"re-enabled: decode batch size [0-3] <= 3", messages[1])
    assert re.search(r"disabled: decode batch size 7 > 4", messages[2])
    assert harness.worker.spec_disable.num_transitions == 4


def test_v2_new_lengths_published_before_the_target_runs(rt, server_args, monkeypatch):
    """Spec v2: verify_done is recorded after ``seq_lens + 1`` is launched (the scheduler
    orders its read of seq_lens by it) and before the target's forward (so the scheduler's
    wait does not wait for the step)."""
    h = Harness(rt, server_args, True, monkeypatch).run()
    for s in plain_steps(h):
        kinds = [k for k, _ in s["launches"]]
        event = s["result"].next_draft_input.verify_done
        assert event.recorded_at is not None
        at = [i for i, (k, what) in enumerate(s["launches"]) if what is event][0]
        assert "seq_lens-arith" in kinds[:at], kinds
        first_forward = kinds.index("forward")
        assert at < first_forward, kinds
        # the scheduler never waited on it before it was recorded
        assert event.waited >= 1


def test_draft_state_after_step_without_drafts_equals_direct_extend(rt, server_args, monkeypatch):
    """After a step without drafts: the new token equals greedy decoding, the draft's top-k
    and hidden state are those of a direct one-token extend of the tiny draft (token x at
    position seq_len with the target's aux state there), and the draft's first proposal of
    the next speculative step is right whenever the draft's formula says so."""
    for spec_v2 in (False, True):
        h = Harness(rt, server_args, spec_v2, monkeypatch)
        h.prefill(h.make_reqs(FIRST + WAVES[3], 0))
        batch = h.batch
        table = h.req_to_token_pool.req_to_token
        before = batch.seq_lens.clone()
        pool_indices = batch.req_pool_indices.clone()
        pending = torch.tensor([req.output_ids[-1] for req in batch.reqs])
        h.decode_step()
        s = h.steps[-1]
        assert (s["bs"], s["speculated"]) == (6, False)
        new_tokens = torch.tensor([req.output_ids[-1] for req in batch.reqs])
        for req, tok in zip(batch.reqs, new_tokens.tolist(), strict=True):
            assert tok == h.target.greedy(req.prompt, len(req.output_ids))[-1]
        slots = table[pool_indices, before.long()].long()
        _, aux = h.target.run(pending, before, slots, pool_indices, table)
        expect_logits, expect_hidden = h.draft.run(
            new_tokens, aux, before, slots, pool_indices, table
        )
        expect_p, expect_idx = torch.max(torch.softmax(expect_logits.float(), -1), -1)
        if spec_v2:
            state = s["result"].next_draft_input
            assert state.new_seq_lens.tolist() == (before + 1).tolist()
            assert getattr(state, rt.N.root).tolist() == new_tokens.tolist()
            ids = s["result"].next_token_ids.view(-1, rt.NUM_DRAFT)
            assert ids[:, 0].tolist() == new_tokens.tolist()
            assert s["result"].accept_lens.tolist() == [1] * 6
        else:
            state = batch.spec_info
            assert getattr(state, rt.N.root).tolist() == new_tokens.tolist()
        assert state.topk_index.view(-1).tolist() == expect_idx.tolist()
        assert torch.allclose(state.topk_p.view(-1), expect_p, atol=1e-5)
        assert torch.allclose(state.hidden_states, expect_hidden.float(), atol=1e-4)


def test_hysteresis_decision_and_logging(rt, caplog):
    from sglang.srt.speculative.spec_disable import SpecDisableController

    caplog.set_level(logging.INFO, logger="sglang.srt.speculative.spec_disable")
    controller = SpecDisableController(disable_above=8, reenable_at_or_below=6)
    sizes = [4, 8, 9, 12, 8, 7, 6, 7, 8, 9, 9, 1]
    decisions = [controller.should_speculate(bs) for bs in sizes]
    assert decisions == [True, True, False, False, False, False, True, True, True, False,
                         False, True]  # fmt: skip
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert [m.split(":")[0] for m in messages] == [
        "Speculative decoding disabled",
        "Speculative decoding re-enabled",
        "Speculative decoding disabled",
        "Speculative decoding re-enabled",
    ]
    assert "batch size 9 > 8" in messages[0] and "batch size 6 <= 6" in messages[1]
    with pytest.raises(ValueError):
        SpecDisableController(disable_above=4, reenable_at_or_below=5)


# -- one sampling semantics for both kinds of step ----------------------------------------
NEVER = 47  # a token no request may sample (logit bias -1e9): the rejecting draft's proposal


def _reference_process(params):
    """Dense reference of SGLang's one-token sampling semantics: additive penalties
    (frequency, presence, min_new_tokens on the stop tokens) on the tokens output so far,
    then the logit bias. The first token comes from the harness's prefill stand-in, a plain
    argmax."""
    from collections import Counter

    def process(logits, out):
        if not out:
            return logits
        for token, count in Counter(out).items():
            logits[token] -= params.get("frequency_penalty", 0.0) * count
            logits[token] -= params.get("presence_penalty", 0.0)
        if len(out) < params.get("min_new_tokens", 0):
            logits[1] = float("-inf")
        for token, bias in params.get("logit_bias", {}).items():
            logits[int(token)] += bias
        return logits

    return process


SAMPLING_CASES = [
    ([3, 17, 5, 9, 22], 14, {"frequency_penalty": 1.5, "presence_penalty": 0.7}),
    ([11, 2, 30, 44], 14, {"frequency_penalty": 2.5}),
    ([7, 7, 2, 19, 4], 20, {"min_new_tokens": 6, "logit_bias": {"1": 1e4}}),
    ([25, 4, 19, 8, 2, 6], 20, {"min_new_tokens": 9, "logit_bias": {"1": 1e4}}),
    ([13, 3, 30], 14, {"logit_bias": {"5": 6.0, "9": 4.0}}),
]


def _with_never(params):
    bias = {**params.get("logit_bias", {}), str(NEVER): -1e9}
    return {**params, "logit_bias": bias, "stop_token_ids": [1]}


@pytest.mark.parametrize("spec", ["v1", "v2"])
@pytest.mark.parametrize("kind", ["without-drafts", "speculative"])
def test_one_sampling_semantics_for_both_kinds_of_step(rt, server_args, monkeypatch, spec, kind):
    """Penalties, logit bias and min_new_tokens act the same on a step without drafts and
    on a speculative step whose drafts are all rejected (the one-token case), and both
    equal the dense one-token reference: the orchestrator is cumulated once per step and
    the verify sampling applies it. (With accepted drafts SGLang's speculative penalties
    are relaxed: they are cumulated once per step, not once per token.)"""
    threshold = 1 if kind == "without-drafts" else 64
    h = Harness(
        rt, server_args, spec == "v2", monkeypatch,
        speculative_disable_batch_threshold=threshold,
        speculative_reenable_batch_threshold=1,
    )  # fmt: skip
    monkeypatch.setattr(h.draft, "chain", lambda root, *a: _rejecting_chain(rt, root))
    cases = [(p, n, _with_never(params)) for p, n, params in SAMPLING_CASES]
    h.run(first=cases, waves={})
    processed = spec == "v1" or rt.N.v2_penalties
    steps = [s["speculated"] for s in h.steps]
    if kind == "without-drafts":
        assert steps.count(False) >= 6
    else:
        assert all(steps)
    plain = [h.target.greedy(p, n) for p, n, _ in cases]
    if not processed:
        # 0.5.9 spec v2: upstream's speculative sampling applies none of them, on either
        # kind of step
        for req, expected in zip(h.all_reqs, plain, strict=True):
            assert req.output_ids == expected, req.rid
        return
    for req, (prompt, max_new, params) in zip(h.all_reqs, cases, strict=True):
        expected = h.target.greedy(prompt, max_new, _reference_process(params))
        assert req.output_ids == expected, (req.rid, params)
    # the processing matters: plain greedy decoding differs for all but one case
    assert sum(r.output_ids != g for r, g in zip(h.all_reqs, plain, strict=True)) >= 4
    # min_new_tokens held the (strongly biased) stop token back exactly that long
    assert len(h.all_reqs[2].output_ids) == 7 and h.all_reqs[2].output_ids[-1] == rt.EOS
    assert len(h.all_reqs[3].output_ids) == 10 and h.all_reqs[3].output_ids[-1] == rt.EOS


def _rejecting_chain(rt, root):
    proposals = torch.full((len(root), rt.NUM_DRAFT), NEVER, dtype=torch.int64)
    proposals[:, 0] = root.long()
    return proposals


def test_logit_bias_across_the_threshold(rt, server_args, monkeypatch):
    """A static logit bias with an accepting draft, crossing the threshold both ways:
    every token equals the biased dense reference."""
    for spec_v2 in (False, True):
        params = {"logit_bias": {"5": 5.0, "12": 3.0, "30": -4.0}}
        h = Harness(rt, server_args, spec_v2, monkeypatch).run(**params)
        if spec_v2 and not rt.N.v2_penalties:
            params = {}  # 0.5.9 spec v2 sampling ignores the logit bias on every step
        assert {s["speculated"] for s in h.steps} == {True, False}
        assert sum(getattr(s["result"], rt.N.accepted) for s in spec_steps(h)) > 0
        for req in h.all_reqs:
            max_new = req.sampling_params.max_new_tokens
            expected = h.target.greedy(req.prompt, max_new, _reference_process(params))
            assert req.output_ids[: len(expected)] == expected, req.rid
        changed = [
            r.rid for r in h.all_reqs
            if h.target.greedy(r.prompt, r.sampling_params.max_new_tokens) != r.output_ids
        ]  # fmt: skip
        assert len(changed) >= len(h.all_reqs) // 2 or not params


# -- refusals, eager fallback and the stand-in target itself ------------------------------
@pytest.mark.parametrize(
    ("attribute", "value", "words"),
    [
        ("hybrid_gdn_config", object(), "hybrid linear-attention / Mamba"),
        ("mamba2_config", object(), "hybrid linear-attention / Mamba"),
        ("is_hybrid_swa", True, "sliding-window"),
        ("sliding_window_size", 4096, "sliding-window"),
    ],
)
@pytest.mark.parametrize("spec", ["v1", "v2"])
def test_unsupported_targets_refused_at_start_up(
    rt, server_args, monkeypatch, attribute, value, words, spec
):
    h = Harness(rt, server_args, spec == "v2", monkeypatch)
    setattr(h.target_runner, attribute, value)
    with pytest.raises(ValueError, match=words):
        h.worker.init_spec_disable(h.server_args)


def test_without_threshold_nothing_is_built(rt, server_args, monkeypatch):
    for spec_v2 in (False, True):
        h = Harness(
            rt, server_args, spec_v2, monkeypatch,
            speculative_disable_batch_threshold=None,
            speculative_reenable_batch_threshold=None,
        )  # fmt: skip
        assert h.worker.spec_disable is None and h.worker.plain_decode is None
        assert h.target_runner.new_backends == []
        h.run()
        assert all(s["speculated"] for s in h.steps)


@pytest.mark.parametrize("spec", ["v1", "v2"])
def test_batches_above_the_graphs_run_eagerly_on_the_dedicated_backend(
    rt, server_args, monkeypatch, spec
):
    """cuda_graph_bs up to 4: the DECODE graphs cover 4 only, so the 6- and 7-request steps
    run eagerly, on the dedicated backend; outputs and KV stay exact."""
    h = Harness(rt, server_args, spec == "v2", monkeypatch, cuda_graph_bs=[1, 2, 4])
    h.run()
    runtime = h.worker.plain_decode
    assert runtime.graph_runner.capture_bs == [4]
    eager = [s for s in plain_steps(h) if s["bs"] > 4]
    assert eager and all(s["replays"] == {} for s in eager)
    assert runtime.attn_backend.plans["DECODE"] == len(eager)
    assert "DECODE" not in h.live_backend.plans
    for req in h.all_reqs:
        expected = h.target.greedy(req.prompt, req.sampling_params.max_new_tokens)
        assert req.output_ids[: len(expected)] == expected, req.rid
    assert h.allocator.available_size() == h.initial_free


def test_no_decode_graphs_with_cuda_graphs_off(rt, server_args, monkeypatch):
    h = Harness(rt, server_args, True, monkeypatch, disable_cuda_graph=True)
    assert h.worker.plain_decode.graph_runner is None
    assert h.worker.plain_decode.attn_backend is not h.live_backend


def test_outputs_are_sensitive_to_every_kv_row_and_position(harness):
    """The run's target: dropping one KV row of the context, or shifting one position,
    changes most greedy tokens, so the exact outputs above leave KV and position mistakes
    nowhere to hide."""
    rt, target = harness.rt, harness.target
    g = torch.Generator().manual_seed(7)
    dropped = shifted = total = 0
    for _ in range(30):
        prompt = torch.randint(2, rt.VOCAB - 1, (6,), generator=g).tolist()
        tokens = prompt + target.greedy(prompt, 16)
        for k in range(len(prompt) + 1, len(tokens)):
            ids, pos = torch.tensor(tokens[:k]), torch.arange(k)
            kv = target.token_kv(ids, pos)
            coef = target.coef[:k]
            full = (coef * kv).sum(0)
            without = full - coef[k - 2] * kv[k - 2]
            moved = (
                full
                - coef[k - 1] * kv[k - 1]
                + coef[k - 1] * target.token_kv(ids[k - 1 :], pos[k - 1 :] + 1)[0]
            )
            head, here = target.emb[ids[-1]], target.pos[k - 1]
            for summary, kind in ((without, "dropped"), (moved, "shifted")):
                changed = int(torch.argmax(rt.mix(head, here, summary) @ target.wo)) != tokens[k]
                dropped += changed and kind == "dropped"
                shifted += changed and kind == "shifted"
            total += 1
    assert dropped / total > 0.5 and shifted / total > 0.5, (dropped / total, shifted / total)
