"""Dynamic speculation disable in EAGLEWorker (v1) and EAGLEWorkerV2 (overlap), on CPU.

Each test drives the patched worker's decode step the way the scheduler does, across the
threshold both ways (below -> above -> below), with the real scheduler-side consumers of the
result: ``FutureMap`` store/resolve (v2), ``ScheduleBatch`` filtering and merging, and
``process_batch_result_decode`` with its speculative output processing and metrics.
``spec_fixtures`` documents what stands in for the model runner and the GPU kernels.
"""

from __future__ import annotations

import logging
import re
import types

import pytest
import torch
from spec_fixtures import (
    CONTEXT,
    HIDDEN,
    MAX_REQS,
    NUM_DRAFT,
    POOL_TOKENS,
    STEPS,
    VOCAB,
    StandInAttnBackend,
    StandInModelRunner,
    TinyDraft,
    TinyTarget,
    acceptance,
    chain_draft_tokens,
    make_target_worker,
    model_config_standin,
)

pytestmark = pytest.mark.payload

THRESHOLD = 4
REENABLE = 3
# (prompt, max_new_tokens): two requests start below the threshold, four join (6 > 4),
# the four finish early and the batch drops back to 2 <= 3.
FIRST = [([3, 17, 5, 9], 24), ([11, 2, 30], 24)]
JOINING = [([7, 7, 1], 5), ([25, 4, 19, 8, 2], 6), ([13], 5), ([36, 21], 7)]
JOIN_AT_STEP = 3


class SchedulerStandIn:
    """The scheduler's state that ``process_batch_result_decode`` reads, with the real
    output-processor and metrics mixins bound to it."""

    def __init__(self, server_args, allocator, tree_cache, draft_worker):
        from sglang.srt.managers.scheduler_metrics_mixin import SchedulerMetricsMixin
        from sglang.srt.managers.scheduler_output_processor_mixin import (
            SchedulerOutputProcessorMixin,
        )

        for mixin in (SchedulerOutputProcessorMixin, SchedulerMetricsMixin):
            for name, value in vars(mixin).items():
                own = name in type(self).__dict__  # the stand-ins below
                if callable(value) and not name.startswith("__") and not own:
                    setattr(self, name, types.MethodType(value, self))
        self.server_args = server_args
        self.enable_overlap = not server_args.disable_overlap_schedule
        self.token_to_kv_pool_allocator = allocator
        self.tree_cache = tree_cache
        self.draft_worker = draft_worker
        self.enable_metrics = False
        self.current_scheduler_metrics_enabled = False
        self.forward_ct_decode = 0
        self.num_generated_tokens = 0
        self.spec_num_accepted_tokens = 0
        self.spec_num_forward_ct = 0
        self.streamed = []

    def stream_output(self, reqs, return_logprob, skip_req=None):
        self.streamed.append([r.rid for r in reqs])

    def maybe_collect_routed_experts(self, req):
        pass

    def maybe_collect_customized_info(self, i, req, logits_output):
        pass


class Harness:
    """Pools, models, the worker under test and a scheduler loop for one spec version."""

    def __init__(self, server_args, spec_v2: bool, monkeypatch):
        from sglang.srt.distributed import parallel_state
        from sglang.srt.managers.overlap_utils import FutureMap
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.chunk_cache import ChunkCache
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        # single process: the expert-parallel group ForwardBatch asks about has one rank
        monkeypatch.setattr(parallel_state, "_MOE_EP", types.SimpleNamespace(world_size=1))
        # a CUDA caching-allocator lifetime hint; CPU tensors have no streams
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
        self.spec_v2 = spec_v2
        # the session-wide ServerArgs (also the global one), restored after the test
        settings = {
            "speculative_algorithm": "EAGLE3",
            "speculative_num_steps": STEPS,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": NUM_DRAFT,
            "speculative_disable_batch_threshold": THRESHOLD,
            "speculative_reenable_batch_threshold": REENABLE,
            "disable_overlap_schedule": not spec_v2,
            "page_size": 1,
            "device": "cpu",
            "attention_backend": "torch_native",
        }
        for name, value in settings.items():
            monkeypatch.setattr(server_args, name, value, raising=False)
        self.server_args = server_args
        self.algorithm = SpeculativeAlgorithm.from_string("EAGLE3")

        self.req_to_token_pool = ReqToTokenPool(
            size=MAX_REQS, max_context_len=CONTEXT, device="cpu", enable_memory_saver=False
        )
        self.allocator = TokenToKVPoolAllocator(
            POOL_TOKENS, torch.float32, "cpu", kvcache=None, need_sort=False
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
        self.target = TinyTarget()
        self.draft = TinyDraft(self.target)
        self.target_runner = StandInModelRunner(
            self.target, server_args, self.req_to_token_pool, is_draft=False
        )
        self.draft_runner = StandInModelRunner(
            self.draft, server_args, self.req_to_token_pool, is_draft=True
        )
        self.target_worker = make_target_worker(self.target_runner, server_args)
        self.plain_backend = StandInAttnBackend("plain-decode")
        self.worker = self._make_worker(monkeypatch)
        self.scheduler = SchedulerStandIn(
            server_args, self.allocator, self.tree_cache, self.worker_for_scheduler
        )
        self.future_map = (
            FutureMap(MAX_REQS, None, CONTEXT, "cpu", self.algorithm) if spec_v2 else None
        )
        self.batch = None
        self.step_log = []  # per decode step: (batch size, speculated?)
        self.step_rids = []  # per decode step: the requests in the batch
        self.freed_total = 0
        self.allocated_total = 0
        self._count_allocator_traffic(monkeypatch)

    # -- construction -------------------------------------------------------------------
    def _make_worker(self, monkeypatch):
        from sglang.srt.speculative.spec_disable import SpecDisableController
        from sglang.srt.utils.common import empty_context

        common = dict(
            server_args=self.server_args,
            topk=1,
            speculative_num_steps=STEPS,
            speculative_num_draft_tokens=NUM_DRAFT,
            enable_nan_detection=False,
            device="cpu",
            gpu_id=0,
            tp_rank=0,
            page_size=1,
            speculative_algorithm=self.algorithm,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator,
            spec_disable=SpecDisableController.from_server_args(self.server_args),
            plain_decode_attn_backend=self.plain_backend,
            plan_stream=None,
            plan_stream_ctx=empty_context(),
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
                cuda_graph_runner=None,
                cuda_graph_runner_for_draft_extend=None,
                hot_token_id=None,
            )
            worker = object.__new__(EAGLEWorkerV2)
            vars(worker).update(common)
            vars(worker).update(_target_worker=self.target_worker, _draft_worker=draft_worker)
            monkeypatch.setattr(draft_worker, "draft", self._standin_draft_v2, raising=False)
            monkeypatch.setattr(worker, "verify", self._standin_verify_v2, raising=False)
            self.worker_for_scheduler = draft_worker
        else:
            from sglang.srt.speculative.eagle_worker import EAGLEWorker

            worker = object.__new__(EAGLEWorker)
            vars(worker).update(common)
            vars(worker).update(
                target_worker=self.target_worker,
                _model_runner=self.draft_runner,
                model_config=types.SimpleNamespace(hidden_size=3 * HIDDEN, dtype=torch.float32),
                draft_tp_context=empty_context,
                cuda_graph_runner=None,
                cuda_graph_runner_for_draft_extend=None,
                draft_attn_backend=StandInAttnBackend("draft-decode"),
                hot_token_id=None,
                eagle_use_aux_hidden_state=True,
            )
            monkeypatch.setattr(worker, "draft", self._standin_draft_v1, raising=False)
            monkeypatch.setattr(worker, "verify", self._standin_verify_v1, raising=False)
            self.worker_for_scheduler = worker
        return worker

    def _count_allocator_traffic(self, monkeypatch):
        alloc, free = self.allocator.alloc, self.allocator.free

        def counting_alloc(need_size):
            out = alloc(need_size)
            if out is not None:
                self.allocated_total += len(out)
            return out

        def counting_free(index):
            if self.allocator.is_not_in_free_group:  # a group frees once, at its end
                self.freed_total += len(index)
            return free(index)

        monkeypatch.setattr(self.allocator, "alloc", counting_alloc)
        monkeypatch.setattr(self.allocator, "free", counting_free)

    # -- prefill (stand-in for the extend step, which is not under test) ---------------
    def prefill(self, specs, start_rid: int):
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        reqs = []
        for offset, (prompt, max_new) in enumerate(specs):
            params = SamplingParams(max_new_tokens=max_new, temperature=0.0)
            params.normalize(None)
            req = Req(f"r{start_rid + offset}", "", list(prompt), params, vocab_size=VOCAB)
            req.prompt = list(prompt)
            reqs.append(req)
        batch = ScheduleBatch.init_new(
            reqs, self.req_to_token_pool, self.allocator, self.tree_cache,
            model_config_standin(), self.spec_v2, self.algorithm,
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
            # draft prefill: position p takes token p+1 (the sampled one for the last)
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
        batch.sampling_info = SamplingBatchInfo.from_schedule_batch(batch, VOCAB)
        draft_input = EagleDraftInput(
            verified_id=torch.tensor(first_tokens, dtype=torch.int32),
            hidden_states=torch.stack(draft_hidden).to(torch.float32),
            topk_p=torch.cat([t.values for t in topk]).view(-1, 1).to(torch.float32),
            topk_index=torch.cat([t.indices for t in topk]).view(-1, 1),
            new_seq_lens=batch.seq_lens.clone(),
            capture_hidden_mode=None,
        )
        if self.spec_v2:
            indices = self.future_map.alloc_future_indices(len(reqs))
            self.future_map.store_to_map_for_new_batch(indices, draft_input)
            draft_input = EagleDraftInput(future_indices=indices)
            batch.output_ids = -indices.indices
        else:
            batch.output_ids = torch.tensor(first_tokens, dtype=torch.int64)
        batch.spec_info = draft_input
        if self.batch is None:
            self.batch = batch
        else:
            self.batch.merge_batch(batch)

    # -- one decode step as Scheduler.run_batch + process_batch_result_decode ----------
    def decode_step(self):
        batch = self.batch
        bs = batch.batch_size()
        if self.spec_v2:
            self._prepare_for_decode_v2(batch)
            mwb = batch.get_model_worker_batch()
            future_indices = self.future_map.alloc_future_indices(bs)
            self.future_map.resolve_future(mwb)
            result = self.worker.forward_batch_generation(mwb)
            result.copy_done = torch.get_device_module("cpu").Event()
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
        self.step_log.append((bs, not getattr(result, "spec_skipped", False), result))
        self.step_rids.append([req.rid for req in batch.reqs])
        self.scheduler.process_batch_result_decode(batch, result)
        batch.filter_batch(v1_spec_info_filtered=True)

    def _prepare_for_decode_v2(self, batch):
        """``EagleDraftInputV2Mixin.prepare_for_decode`` minus its Triton write into
        ``req_to_token`` (done here in torch), on the real allocator."""
        from sglang.srt.managers.utils import get_alloc_len_per_decode
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        batch.forward_mode = ForwardMode.DECODE
        alloc_len = get_alloc_len_per_decode(self.server_args)
        table = self.req_to_token_pool.req_to_token
        for req in batch.reqs:
            extra = req.kv_committed_len + 2 * alloc_len - req.kv_allocated_len
            if extra > 0:
                slots = self.allocator.alloc(extra)
                table[req.req_pool_idx, req.kv_allocated_len : req.kv_allocated_len + extra] = (
                    slots.to(torch.int32)
                )
                req.kv_allocated_len += extra
            req.decode_batch_idx += 1
        batch.seq_lens_cpu = batch.seq_lens.cpu()
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())

    # -- stand-ins for the speculative draft + verify (GPU kernels in SGLang) -----------
    def _target_verify(self, draft_tokens, seq_lens, pool_indices, out_cache_loc):
        positions = (seq_lens.view(-1, 1) + torch.arange(NUM_DRAFT)).view(-1)
        rows = torch.repeat_interleave(pool_indices, NUM_DRAFT)
        table = self.req_to_token_pool.req_to_token
        self.target_runner.calls.append({"mode": "TARGET_VERIFY", "attn_backend": "target"})
        return self.target.run(draft_tokens.view(-1), positions, out_cache_loc, rows, table)

    def _standin_draft_v2(self, mwb):
        tokens = chain_draft_tokens(self.draft, mwb.spec_info)
        return types.SimpleNamespace(draft_token=tokens, is_verify_input=lambda: True)

    def _standin_verify_v2(self, mwb):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.speculative.eagle_info import EagleDraftInput
        from sglang.srt.speculative.spec_disable import extend_cache_locs

        bs = len(mwb.seq_lens)
        candidates = mwb.spec_info.draft_token
        mwb.out_cache_loc = extend_cache_locs(
            self.req_to_token_pool.req_to_token, mwb.req_pool_indices, mwb.seq_lens, NUM_DRAFT
        )
        logits, aux = self._target_verify(
            candidates, mwb.seq_lens, mwb.req_pool_indices, mwb.out_cache_loc
        )
        target_predict = torch.argmax(logits, dim=-1).view(bs, NUM_DRAFT)
        accept = torch.tensor(acceptance(candidates, target_predict), dtype=torch.int32) + 1
        predict = torch.zeros(bs, NUM_DRAFT, dtype=torch.int32)
        for i in range(bs):
            predict[i, : accept[i]] = target_predict[i, : accept[i]]
        verified_id = target_predict[torch.arange(bs), accept.long() - 1].to(torch.int32)
        return GenerationBatchResult(
            logits_output=LogitsProcessorOutput(
                next_token_logits=logits.float(), hidden_states=aux.float()
            ),
            next_token_ids=predict.view(-1),
            accept_lens=accept,
            next_draft_input=EagleDraftInput(
                verified_id=verified_id,
                new_seq_lens=mwb.seq_lens + accept,
                verify_done=torch.get_device_module("cpu").Event(),
            ),
        )

    def _standin_draft_v1(self, batch):
        for req in batch.reqs:
            req.decode_batch_idx += 1
        tokens = chain_draft_tokens(self.draft, batch.spec_info)
        return types.SimpleNamespace(draft_token=tokens)

    def _standin_verify_v1(self, batch, spec_info):
        """``EAGLEWorker.verify`` + ``EagleVerifyInput.verify`` for topk 1, page size 1."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.mem_cache.common import alloc_token_slots
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        bs = batch.batch_size()
        table = self.req_to_token_pool.req_to_token
        out_cache_loc = alloc_token_slots(batch.tree_cache, bs * NUM_DRAFT)
        for i in range(bs):
            start = int(batch.seq_lens[i])
            table[batch.req_pool_indices[i], start : start + NUM_DRAFT] = out_cache_loc[
                i * NUM_DRAFT : (i + 1) * NUM_DRAFT
            ].to(torch.int32)
        candidates = spec_info.draft_token
        logits, aux = self._target_verify(
            candidates, batch.seq_lens, batch.req_pool_indices, out_cache_loc
        )
        target_predict = torch.argmax(logits, dim=-1).view(bs, NUM_DRAFT)
        accept = acceptance(candidates, target_predict)
        keep_rows, keep_accept, verified, unfinished, evict = [], [], [], [], []
        for i, req in enumerate(batch.reqs):
            n_tokens = 0
            for j in range(accept[i] + 1):
                token = int(target_predict[i, j])
                req.output_ids.append(token)
                verified.append(token)
                n_tokens += 1
                req.check_finished()
                if req.finished():
                    break
            req.kv_committed_len += n_tokens
            req.kv_allocated_len = req.kv_committed_len
            req.spec_verify_ct += 1
            req.spec_accepted_tokens += n_tokens - 1
            rows = list(range(i * NUM_DRAFT, i * NUM_DRAFT + n_tokens))
            evict += list(range(i * NUM_DRAFT + n_tokens, (i + 1) * NUM_DRAFT))
            accept[i] = n_tokens - 1
            if not req.finished():
                unfinished.append(i)
                keep_rows += rows
                keep_accept.append(n_tokens - 1)
        self.allocator.free(out_cache_loc[torch.tensor(evict, dtype=torch.int64)])
        batch.seq_lens.add_(torch.tensor(accept) + 1)
        batch.seq_lens_cpu.add_(torch.tensor(accept) + 1)
        keep = torch.tensor(keep_rows, dtype=torch.int64)
        index = torch.tensor(unfinished, dtype=torch.int64)
        batch.out_cache_loc = out_cache_loc[keep]
        flat_predict = target_predict.view(-1)
        batch.spec_info = EagleDraftInput(
            hidden_states=aux.float()[keep],
            verified_id=flat_predict[keep].to(torch.int32),
            accept_length=torch.tensor(keep_accept, dtype=torch.int32),
            accept_length_cpu=keep_accept,
            seq_lens_for_draft_extend=batch.seq_lens[index],
            seq_lens_for_draft_extend_cpu=batch.seq_lens_cpu[index],
            req_pool_indices_for_draft_extend=batch.req_pool_indices[index],
        )
        if not unfinished:
            batch.spec_info = EagleDraftInput.create_idle_input(
                "cpu", 3 * HIDDEN, torch.float32, 1, None
            )
        logits_output = LogitsProcessorOutput(next_token_logits=logits.float())
        res = types.SimpleNamespace(
            verified_id=torch.tensor(verified), accept_length_per_req_cpu=list(accept)
        )
        return logits_output, res, None, False

    # -- the run ------------------------------------------------------------------------
    def run(self):
        self.prefill(FIRST, 0)
        all_reqs = list(self.batch.reqs)
        step = 0
        while self.batch.reqs:
            if step == JOIN_AT_STEP:
                self.prefill(JOINING, len(FIRST))
                all_reqs += self.batch.reqs[len(self.batch.reqs) - len(JOINING) :]
            self.decode_step()
            step += 1
            assert step < 100
        return all_reqs


@pytest.fixture(params=["v1", "v2-overlap"])
def harness(request, server_args, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="sglang.srt.speculative.spec_disable")
    h = Harness(server_args, spec_v2=request.param == "v2-overlap", monkeypatch=monkeypatch)
    h.all_reqs = h.run()
    return h


def test_crosses_threshold_both_ways(harness):
    sizes = [(bs, speculated) for bs, speculated, _ in harness.step_log]
    assert sizes[0] == (2, True)
    assert (6, False) in sizes
    assert sizes[-1][0] <= REENABLE and sizes[-1][1]
    first_off = next(i for i, (_, s) in enumerate(sizes) if not s)
    back_on = next(i for i, (_, s) in enumerate(sizes) if s and i > first_off)
    assert all(not s for _, s in sizes[first_off:back_on])
    for bs, speculated in sizes:
        if bs > THRESHOLD:
            assert not speculated
        if bs <= REENABLE:
            assert speculated


def test_outputs_equal_greedy_target(harness):
    for req in harness.all_reqs:
        max_new = req.sampling_params.max_new_tokens
        expected = harness.target.greedy(req.prompt, max_new)
        # a verify step may overshoot; the request reports its first finished_len tokens
        assert req.finished_len == max_new
        assert req.output_ids[:max_new] == expected, req.rid
        assert req.finished()


def test_no_spec_steps_produce_one_greedy_token_each(harness):
    skipped = [result for _, speculated, result in harness.step_log if not speculated]
    assert skipped
    for result in skipped:
        assert result.spec_skipped
        assert result.num_accepted_tokens == 0
        if harness.spec_v2:
            assert result.accept_lens.tolist() == [1] * len(result.accept_lens)
            assert result.accept_length_per_req_cpu == [0] * len(result.accept_lens)
    modes = [c["mode"] for c in harness.target_runner.calls]
    backends = [c["attn_backend"] for c in harness.target_runner.calls if c["mode"] == "DECODE"]
    assert modes.count("DECODE") == len(skipped)
    assert set(backends) == {"plain-decode"}
    # the live backend's graphs are restored after every plain step
    assert harness.target_runner.attn_backend.name == "target"
    assert harness.target_runner.graph_runner is None


def test_kv_slots_allocated_equal_freed(harness):
    assert harness.allocator.available_size() == harness.initial_free
    free_pages = harness.allocator.free_pages.tolist()
    assert len(set(free_pages)) == len(free_pages)  # no slot freed twice
    assert harness.allocated_total == harness.freed_total
    assert harness.req_to_token_pool.available_size() == MAX_REQS


def test_acceptance_metrics_count_only_speculative_steps(harness):
    spec_steps = [(bs, r) for bs, speculated, r in harness.step_log if speculated]
    assert harness.scheduler.spec_num_forward_ct == sum(bs for bs, _ in spec_steps)
    accepted = sum(r.num_accepted_tokens for _, r in spec_steps)
    assert accepted > 0  # the stand-in draft agrees with the target often enough
    assert harness.scheduler.spec_num_accepted_tokens == accepted + sum(bs for bs, _ in spec_steps)
    # per request: one verify per speculative step it was in, none for the others
    for req in harness.all_reqs:
        expected = sum(
            req.rid in rids
            for rids, (_, speculated, _) in zip(harness.step_rids, harness.step_log, strict=True)
            if speculated
        )
        assert req.spec_verify_ct == expected, req.rid
    total_verify = sum(req.spec_verify_ct for req in harness.all_reqs)
    assert total_verify == harness.scheduler.spec_num_forward_ct


def test_switch_logged_once_per_transition(harness, caplog):
    messages = [
        r.getMessage()
        for r in caplog.get_records("setup")  # the run happens in the fixture
        if r.name == "sglang.srt.speculative.spec_disable" and r.levelno == logging.INFO
    ]
    assert len(messages) == 2
    assert re.search(r"disabled: decode batch size 6 > 4", messages[0])
    assert re.search(r"re-enabled: decode batch size [0-3] <= 3", messages[1])
    assert harness.worker.spec_disable.num_transitions == 2


def test_draft_state_after_no_spec_step_equals_draft_extend(server_args, monkeypatch):
    """After a step without drafts, top-k / hidden / draft KV are those of a direct
    one-token extend of the tiny draft (token x at position seq_len, target aux at seq_len)."""
    for spec_v2 in (False, True):
        h = Harness(server_args, spec_v2=spec_v2, monkeypatch=monkeypatch)
        h.prefill(FIRST + JOINING, 0)
        h.worker.spec_disable.speculating = True
        table = h.req_to_token_pool.req_to_token
        batch = h.batch
        before = batch.seq_lens.clone()
        pool_indices = batch.req_pool_indices.clone()
        if spec_v2:
            pending = h.future_map.verified_id_buf[batch.spec_info.future_indices.indices].clone()
        else:
            pending = batch.spec_info.verified_id.clone()
        draft_kv_before = h.draft.kv.clone()
        h.decode_step()
        draft_kv_after = h.draft.kv.clone()
        bs, speculated, result = h.step_log[-1]
        assert (bs, speculated) == (6, False)

        new_tokens = torch.tensor([req.output_ids[-1] for req in batch.reqs])
        slots = table[pool_indices, before.long()].long()
        _, aux = h.target.run(pending, before, slots, pool_indices, table)
        expect_logits, expect_hidden = h.draft.run(
            new_tokens, aux, before, slots, pool_indices, table
        )
        expect_p, expect_idx = torch.max(torch.softmax(expect_logits.float(), -1), -1)
        if spec_v2:
            state = result.next_draft_input
            assert state.new_seq_lens.tolist() == (before + 1).tolist()
            assert state.verified_id.tolist() == new_tokens.tolist()
            assert result.next_token_ids.view(-1, NUM_DRAFT)[:, 0].tolist() == new_tokens.tolist()
            assert result.next_token_ids.view(-1, NUM_DRAFT)[:, 1:].abs().sum() == 0
        else:
            state = batch.spec_info
            assert state.verified_id.tolist() == new_tokens.tolist()
            assert batch.seq_lens.tolist() == (before + 1).tolist()
        assert state.topk_index.view(-1).tolist() == expect_idx.tolist()
        assert torch.allclose(state.topk_p.view(-1), expect_p, atol=1e-6)
        assert torch.allclose(state.hidden_states, expect_hidden.float(), atol=1e-5)
        # the draft KV of position seq_len is the extend's, and nothing below it moved
        assert torch.allclose(
            draft_kv_after[slots], torch.tanh(h.draft.mix_input(new_tokens, aux) @ h.draft.wk)
        )
        for i, req in enumerate(batch.reqs):
            prompt_slots = table[req.req_pool_idx, : int(before[i])].long()
            assert torch.equal(draft_kv_after[prompt_slots], draft_kv_before[prompt_slots])


def test_hysteresis_decision_and_logging(sglang_tree, caplog):
    from sglang.srt.speculative.spec_disable import SpecDisableController

    caplog.set_level(logging.INFO, logger="sglang.srt.speculative.spec_disable")
    controller = SpecDisableController(disable_above=8, reenable_at_or_below=6)
    sizes = [4, 8, 9, 12, 8, 7, 6, 7, 8, 9, 9, 1]
    decisions = [controller.should_speculate(bs) for bs in sizes]
    assert decisions == [
        True,
        True,
        False,
        False,
        False,
        False,
        True,
        True,
        True,
        False,
        False,
        True,
    ]
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
