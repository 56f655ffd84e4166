"""Stand-ins for what a CPU cannot run on SGLang 0.5.12's EAGLE decode paths.

Each stand-in keeps the contract of the part it replaces, so that a misuse fails here as it
would fail (or silently corrupt) on a GPU:

* ``TinyTarget`` / ``TinyDraft`` (stand-ins for the target and EAGLE-3 draft models): their KV
  lives in per-slot tensors read through the real ``req_to_token`` table, and the target's next
  token depends strongly on every KV row and position, so a wrong slot, position or missing KV
  row changes the greedy tokens. The draft reads its own KV history, so a skipped draft extend
  changes its proposals. Hidden states are returned per the batch's ``capture_hidden_mode``
  (NULL: none), as SGLang's logits processor does.
* ``StandInModelRunner`` (for ``ModelRunner``): ``forward`` dispatches like
  ``ModelRunner._forward_raw`` on CUDA (DECODE / TARGET_VERIFY / IDLE batches replay
  ``graph_runner`` when its ``can_run`` says so, and ``can_run`` does not look at the forward
  mode); eager forwards plan ``attn_backend`` first. A model forward checks that the attention
  backend it reads was planned for this very batch, and that a DECODE batch has no
  ``spec_info``.
* ``StandInAttnBackend`` (for an attention backend): records what it was planned for.
* ``StandInCUDAGraph`` (for ``torch.cuda.CUDAGraph``): the real ``CudaGraphRunner`` captures
  into it; a replay re-runs the captured forward on the runner's static buffers and copies the
  result into the captured output tensors, as a CUDA graph replay does.
* Kernels: ``verify_tree_greedy`` (sgl_kernel), ``assign_req_to_token_pool``,
  ``assign_extend_cache_locs``, ``fill_bonus_tokens`` and
  ``create_extend_after_decode_spec_info`` (Triton) in torch, with their argument contracts.
* ``StandInEvent`` (for ``torch.cuda.Event``) and ``LaunchLog``: CPU execution is synchronous,
  so the order in which work is launched on the stream is recorded instead: each event
  records its position in the launch log, each stand-in forward and each traced ``seq_lens``
  op (``TracedLens``) its own.
"""

from __future__ import annotations

import contextlib
import types
from collections import Counter

import torch

VOCAB = 48
HIDDEN = 16
AUX = 3 * HIDDEN
STEPS = 2
NUM_DRAFT = STEPS + 1
POOL_TOKENS = 1200
MAX_REQS = 24
CONTEXT = 128
EOS = 1


# --------------------------------------------------------------------------------------
# the two lines' names for the same things
# --------------------------------------------------------------------------------------
LINE_NAMES = {
    "0.5.12": types.SimpleNamespace(
        line="0.5.12",
        root="bonus_tokens",  # EagleDraftInput: the pending token of each request
        retrieve="retrieve_",  # EagleVerifyInput's tree fields
        accepted="num_correct_drafts",  # GenerationBatchResult: accepted drafts
        histogram="spec_correct_drafts_histogram",
        sched_accepted="spec_num_accept_tokens",  # the scheduler's accepted-token counter
        metrics_mixin="sglang.srt.observability.scheduler_metrics_mixin",
        fill_root="fill_bonus_tokens",
        v2_penalties=True,  # spec v2 verify sampling applies penalties and logit bias
    ),
    "0.5.9": types.SimpleNamespace(
        line="0.5.9",
        root="verified_id",
        retrieve="retrive_",
        accepted="num_accepted_tokens",
        histogram="spec_acceptance_histogram",
        sched_accepted="spec_num_accepted_tokens",
        metrics_mixin="sglang.srt.managers.scheduler_metrics_mixin",
        fill_root="fill_new_verified_id",
        v2_penalties=False,
    ),
}


def names():
    """The running tree's line: 0.5.12 renamed the draft input's root to bonus_tokens."""
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    fields = EagleDraftInput.__dataclass_fields__
    return LINE_NAMES["0.5.12" if "bonus_tokens" in fields else "0.5.9"]


# --------------------------------------------------------------------------------------
# launch order
# --------------------------------------------------------------------------------------
class LaunchLog:
    """The order of launches on the (single) stream of a CPU run."""

    def __init__(self):
        self.entries: list[tuple[str, object]] = []

    def add(self, kind: str, what: object = None) -> int:
        self.entries.append((kind, what))
        return len(self.entries) - 1

    def index(self, kind: str, start: int = 0) -> int:
        for i in range(start, len(self.entries)):
            if self.entries[i][0] == kind:
                return i
        return -1


LAUNCHES = LaunchLog()


class StandInEvent:
    """Stands in for ``torch.cuda.Event``: ``record`` notes where in the launch order it was
    recorded; ``synchronize`` notes that the host waited on it."""

    def __init__(self, *args, **kwargs):
        self.recorded_at = None
        self.waited = 0

    def record(self, stream=None):
        self.recorded_at = LAUNCHES.add("event", self)

    def synchronize(self):
        assert self.recorded_at is not None, "synchronize() on an event never recorded"
        self.waited += 1

    def wait(self, stream=None):
        pass

    def query(self):
        return True


class TracedLens(torch.Tensor):
    """A ``seq_lens`` tensor whose arithmetic is entered in the launch log (the GPU kernel
    that computes ``seq_lens + n`` is launched there)."""

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        out = super().__torch_function__(func, types_, args, kwargs or {})
        name = getattr(func, "__name__", str(func))
        if name in ("add", "__add__", "__radd__", "add_"):
            LAUNCHES.add("seq_lens-arith", (name, args[1] if len(args) > 1 else None))
        if isinstance(out, TracedLens):
            return out.as_subclass(torch.Tensor)
        return out


def traced(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(TracedLens)


# --------------------------------------------------------------------------------------
# tiny models
# --------------------------------------------------------------------------------------
def _rows_of(fb, num_tokens: int) -> torch.Tensor:
    """Request-pool row of every token of a forward batch."""
    bs = max(len(fb.req_pool_indices), 1)
    mode = fb.forward_mode
    per_request = mode.is_decode() or mode.is_target_verify() or mode.is_draft_extend_v2()
    if per_request or fb.extend_seq_lens_cpu is None:
        assert num_tokens % bs == 0, (mode.name, num_tokens, bs)
        return torch.repeat_interleave(fb.req_pool_indices, num_tokens // bs)
    lens = torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int64)
    return torch.repeat_interleave(fb.req_pool_indices, lens)


def mix(emb_t, pos_p, summary):
    """Hidden state from the token, its position and the context summary: the sine makes
    the next token depend on every KV row (a small change of the summary moves it a lot)."""
    return emb_t + pos_p + 3.0 * torch.sin(2.0 * summary)


class TinyTarget:
    """Stand-in target. KV row of token t at position p: tanh(E[t] W + P[p]); hidden at p:
    mix(E[t], P[p], S_p) with S_p = sum_j c_j kv_j over the whole context 0..p (random c_j):
    every KV row and every position moves the logits. Aux (EAGLE-3) state at p:
    [A, hidden, S_p] with A = c_0 kv_0."""

    def __init__(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(VOCAB, HIDDEN, generator=g, dtype=torch.float64)
        self.pos = torch.randn(CONTEXT, HIDDEN, generator=g, dtype=torch.float64)
        self.wk = torch.randn(HIDDEN, HIDDEN, generator=g, dtype=torch.float64) / 2
        self.coef = 1.5 * torch.randn(CONTEXT, 1, generator=g, dtype=torch.float64)
        self.wo = torch.randn(HIDDEN, VOCAB, generator=g, dtype=torch.float64)
        self.kv = torch.zeros(POOL_TOKENS + 1, HIDDEN, dtype=torch.float64)
        self.forward_calls = 0

    def token_kv(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.emb[tokens.long()] @ self.wk + self.pos[positions.long()])

    def run(self, input_ids, positions, out_cache_loc, rows, req_to_token):
        """Write the tokens' KV, then read the KV of positions 0..p of each token's row."""
        self.forward_calls += 1
        input_ids, positions = input_ids.long(), positions.long()
        self.kv[out_cache_loc.long()] = self.token_kv(input_ids, positions)
        hidden, summary, first = [], [], []
        for t in range(len(input_ids)):
            p = int(positions[t])
            ctx = self.kv[req_to_token[int(rows[t]), : p + 1].long()]
            s = (self.coef[: p + 1] * ctx).sum(dim=0)
            summary.append(s)
            first.append(self.coef[0, 0] * ctx[0])
            hidden.append(mix(self.emb[input_ids[t]], self.pos[p], s))
        hidden = torch.stack(hidden)
        aux = torch.cat([torch.stack(first), hidden, torch.stack(summary)], dim=-1)
        return hidden @ self.wo, aux

    def logits_dense(self, tokens: list[int]) -> torch.Tensor:
        """Logits after ``tokens`` (the next token's), with no KV pool at all."""
        ids = torch.tensor(tokens)
        pos = torch.arange(len(tokens))
        kvs = self.token_kv(ids, pos)
        p = len(tokens) - 1
        s = (self.coef[: p + 1] * kvs).sum(dim=0)
        return mix(self.emb[ids[-1]], self.pos[p], s) @ self.wo

    def greedy(self, prompt: list[int], num_tokens: int, process=None) -> list[int]:
        """Reference: dense greedy decoding. ``process(logits, outputs)`` may edit the
        logits first (logit bias, penalties, min_new_tokens)."""
        tokens, out = list(prompt), []
        for _ in range(num_tokens):
            logits = self.logits_dense(tokens)
            if process is not None:
                logits = process(logits.clone(), out)
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            tokens.append(nxt)
            if nxt == EOS:
                break
        return out


class TinyDraft:
    """Stand-in EAGLE-3 draft. Position p takes token t_{p+1} and the target's aux state at
    p, writes its KV row c_{p+1} kv(t_{p+1}, p+1), and predicts from
    mix(E[t_{p+1}], P[p+1], A + sum of its own KV rows 0..p): the target's own formula, so
    its proposals are right exactly when its KV history and positions are. A deterministic
    per-position bias makes some proposals wrong (acceptance below 1)."""

    def __init__(self, target: TinyTarget, seed: int = 1, noise: float = 2.5):
        g = torch.Generator().manual_seed(seed)
        self.target = target
        self.bias = noise * torch.randn(CONTEXT + 8, VOCAB, generator=g, dtype=torch.float64)
        self.kv = torch.zeros(POOL_TOKENS + 1, HIDDEN, dtype=torch.float64)
        self.forward_calls = 0

    def row(self, tokens, positions):
        """KV row written at draft position p for token t_{p+1}."""
        t = self.target
        nxt = positions.long() + 1
        return t.coef[nxt.clamp(max=CONTEXT - 1)] * t.token_kv(tokens, nxt.clamp(max=CONTEXT - 1))

    def predict(self, tokens, positions, first, history_sum):
        t = self.target
        nxt = (positions.long() + 1).clamp(max=CONTEXT - 1)
        summary = first + history_sum
        hidden = mix(t.emb[tokens.long()], t.pos[nxt], summary)
        logits = hidden @ t.wo + self.bias[positions.long()]
        return logits, torch.cat([first, hidden, summary], dim=-1)

    def run(self, input_ids, hidden_in, positions, out_cache_loc, rows, req_to_token):
        self.forward_calls += 1
        hidden_in = hidden_in.to(torch.float64)
        first = hidden_in[:, :HIDDEN]
        self.kv[out_cache_loc.long()] = self.row(input_ids, positions)
        sums = torch.stack(
            [
                self.kv[req_to_token[int(rows[t]), : int(positions[t]) + 1].long()].sum(0)
                for t in range(len(input_ids))
            ]
        )
        return self.predict(input_ids, positions, first, sums)

    def chain(self, root, hidden, topk_index, seq_lens, pool_indices, req_to_token):
        """The draft's multi-step decode for topk 1 (stand-in for ``EagleDraftWorker.draft``'s
        kernels): (bs, NUM_DRAFT) tokens, the root first. Reads the draft KV history and
        keeps its own new rows in memory (a real draft writes them to slots the draft extend
        overwrites)."""
        first = hidden.to(torch.float64)[:, :HIDDEN]
        tokens = [root.long(), topk_index.view(-1).long()]
        extra = torch.zeros(len(root), HIDDEN, dtype=torch.float64)
        for step in range(STEPS - 1):
            pos = seq_lens.long() + step  # position of the proposal being fed back
            hist = torch.stack(
                [
                    self.kv[req_to_token[int(r), : int(p)].long()].sum(0)
                    for r, p in zip(pool_indices.tolist(), pos.tolist(), strict=True)
                ]
            )
            extra = self.row(tokens[-1], pos)
            logits, _ = self.predict(tokens[-1], pos, first, hist + extra)
            tokens.append(torch.argmax(logits, dim=-1))
        return torch.stack(tokens, dim=1)


class StandInModel:
    """The ``forward(input_ids, positions, forward_batch)`` of a tiny model, as a model
    runner's ``model`` (what a CUDA graph captures)."""

    def __init__(self, tiny, runner):
        self.tiny = tiny
        self.runner = runner

    def forward(self, input_ids, positions, forward_batch, **kwargs):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        fb = forward_batch
        backend = fb.attn_backend
        assert backend.planned_for is fb, (
            f"{backend.name}: attention metadata was planned for another batch "
            f"({backend.planned_mode}), not this {fb.forward_mode.name} batch"
        )
        if fb.forward_mode.is_decode():
            assert fb.spec_info is None, "a DECODE batch carries spec_info"
        n = len(input_ids)
        rows = _rows_of(fb, n)
        table = self.runner.req_to_token_pool.req_to_token
        LAUNCHES.add("forward", (self.runner.name, fb.forward_mode.name))
        if self.runner.is_draft:
            logits, hidden = self.tiny.run(
                input_ids, fb.spec_info.hidden_states, positions, fb.out_cache_loc, rows, table
            )
        else:
            logits, hidden = self.tiny.run(input_ids, positions, fb.out_cache_loc, rows, table)
        mode = fb.capture_hidden_mode
        if fb.forward_mode.is_extend() and not fb.forward_mode.is_target_verify():
            if not fb.forward_mode.is_draft_extend_v2():
                # one logit row per request: its last token
                last = torch.cumsum(torch.tensor(fb.extend_seq_lens_cpu), dim=0) - 1
                logits = logits[last]
                if mode.is_last():
                    hidden = hidden[last]
        if mode == CaptureHiddenMode.NULL:
            hidden = None
        return LogitsProcessorOutput(
            next_token_logits=logits.to(torch.float32),
            hidden_states=hidden.to(torch.float32) if hidden is not None else None,
        )

    __call__ = forward


class StandInAttnBackend:
    """Stands in for an attention backend: the tiny models need no metadata, but the
    backend records for which batch it was last planned (``planned_for``), and whether a
    graph replay was prepared (``replay_planned``, consumed by the replay)."""

    def __init__(self, name: str):
        self.name = name
        self.planned_for = None
        self.planned_mode = None
        self.replay_planned = False
        self.plans: Counter = Counter()
        self.graph_state = None
        self._replay_forward_batch = None

    def init_forward_metadata(self, forward_batch):
        self.planned_for = forward_batch
        self.planned_mode = forward_batch.forward_mode.name
        self.plans[self.planned_mode] += 1

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        self.graph_state = (max_bs, max_num_tokens)

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, *args, **kwargs):
        pass

    def init_forward_metadata_replay_cuda_graph(self, bs, *args, **kwargs):
        fb = self._replay_forward_batch
        self.replay_planned = True
        self.planned_mode = fb.forward_mode.name if fb is not None else None
        self.plans["replay:" + str(self.planned_mode)] += 1

    def on_after_cuda_graph_warmup(self):
        pass

    def get_verify_buffers_to_fill_after_draft(self):
        return None, None

    def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):
        pass


class StandInCUDAGraph:
    """Stands in for ``torch.cuda.CUDAGraph``: keeps the captured forward and its static
    outputs; a replay re-runs that forward on the runner's static input buffers (so it reads
    exactly what the runner copied there) and writes into the captured output tensors. A
    replay needs its attention backend's replay metadata prepared for it."""

    def __init__(self, attn_backend, current_backend):
        self.attn_backend = attn_backend
        self.current_backend = current_backend
        self.run_once = None
        self.captured_fb = None
        self.output = None
        self.replays = 0

    def capture(self, run_once, captured_fb):
        self.run_once, self.captured_fb = run_once, captured_fb
        self.output = run_once()
        return self.output

    def replay(self):
        backend = self.attn_backend
        assert self.current_backend() is backend, (
            f"graph captured on {backend.name} replayed with {self.current_backend().name} "
            "installed: its replay metadata went to another backend"
        )
        assert backend.replay_planned, (
            f"{backend.name}: graph replayed without its replay metadata prepared"
        )
        backend.replay_planned = False
        backend.planned_for = self.captured_fb
        self.replays += 1
        fresh = self.run_once()
        backend.planned_for = None
        for name in ("next_token_logits", "hidden_states"):
            dst, src = getattr(self.output, name), getattr(fresh, name)
            assert (dst is None) == (src is None), f"{name} changed presence at replay"
            if dst is not None:
                dst.copy_(src)


def graph_runner_cls():
    """``CudaGraphRunner`` (the real, patched class) with only the CUDA-graph object and the
    GPU-only capture scaffolding stood in."""
    from sglang.srt.model_executor import cuda_graph_runner as cgr

    class StandInGraphCudaGraphRunner(cgr.CudaGraphRunner):
        def _backend(self):
            # 0.5.12 runners own a backend; 0.5.9 runners use the model runner's
            return getattr(self, "attn_backend", None) or self.model_runner.attn_backend

        def _create_device_graph(self):
            if getattr(self, "attn_backend", None) is not None:
                return StandInCUDAGraph(self.attn_backend, lambda: self.attn_backend)
            runner = self.model_runner
            return StandInCUDAGraph(runner.attn_backend, lambda: runner.attn_backend)

        def _capture_graph(self, graph, pool, stream, run_once_fn):
            return graph.capture(run_once_fn, self._last_capture_fb)

        def capture_one_batch_size(self, bs, forward, stream_idx=None):
            def capturing_forward(input_ids, positions, forward_batch, **kw):
                # init_forward_metadata_capture_cuda_graph planned this very batch
                self._last_capture_fb = forward_batch
                if self._backend().planned_for is None:
                    self._backend().planned_for = forward_batch
                return forward(input_ids, positions, forward_batch, **kw)

            self._backend().planned_for = None
            out = super().capture_one_batch_size(bs, capturing_forward, stream_idx)
            self._backend().planned_for = None
            return out

        def replay(self, forward_batch, skip_attn_backend_init=False, pp_proxy_tensors=None):
            out = super().replay(forward_batch, skip_attn_backend_init, pp_proxy_tensors)
            self.model_runner.graph_replays[self.capture_forward_mode.name] += 1
            return out

    return StandInGraphCudaGraphRunner


@contextlib.contextmanager
def graph_capture_standin(stream=None):
    yield types.SimpleNamespace(stream=None)


class StandInModelRunner:
    """Plays ``ModelRunner`` for a tiny model on CPU (see the module docstring)."""

    def __init__(self, tiny, server_args, req_to_token_pool, is_draft: bool, spec_algorithm):
        self.name = "draft" if is_draft else "target"
        self.model = StandInModel(tiny, self)
        self.tiny = tiny
        self.server_args = server_args
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = types.SimpleNamespace(name="stand-in KV pool", set_swa_loc=None)
        self.attn_backend = StandInAttnBackend(self.name)
        self.graph_runner = None
        self.device = "cpu"
        self.gpu_id = 0
        self.model_is_mrope = False
        self.is_draft = is_draft
        self.is_draft_worker = is_draft
        self.spec_algorithm = spec_algorithm
        self.tp_group = types.SimpleNamespace(barrier=lambda: None)
        self.hybrid_gdn_config = None
        self.mamba2_config = None
        self.hybrid_lightning_config = None
        self.is_hybrid_swa = False
        self.sliding_window_size = None
        self.init_new_workspace = False
        self.use_ngram_embedding = False
        self.hisparse_coordinator = None
        self.device_timer = None
        self.lora_manager = None
        self.token_table = None
        self.graph_replays: Counter = Counter()
        self.eager_forwards: Counter = Counter()
        self.model_config = types.SimpleNamespace(
            is_encoder_decoder=False,
            hidden_size=HIDDEN,
            vocab_size=VOCAB,
            dtype=torch.float32,
            hf_config=types.SimpleNamespace(),
            spec_hidden_size=AUX,
        )
        self.new_backends: list[StandInAttnBackend] = []

    def _get_attention_backend(self, init_new_workspace: bool = False):
        self.init_new_workspace = init_new_workspace
        backend = StandInAttnBackend(f"{self.name}-extra-{len(self.new_backends)}")
        self.new_backends.append(backend)
        return backend

    def forward(self, fb, skip_attn_backend_init=False, pp_proxy_tensors=None, **kwargs):
        """``ModelRunner._forward_raw``'s dispatch on CUDA."""
        can_run_graph = bool(
            fb.forward_mode.is_cuda_graph() and self.graph_runner and self.graph_runner.can_run(fb)
        )
        if can_run_graph:
            ret = self.graph_runner.replay(fb, skip_attn_backend_init=skip_attn_backend_init)
        else:
            self.eager_forwards[fb.forward_mode.name] += 1
            if not skip_attn_backend_init:
                self.attn_backend.init_forward_metadata(fb)
            ret = self.model.forward(fb.input_ids, fb.positions, fb)
        return types.SimpleNamespace(
            logits_output=ret,
            can_run_graph=can_run_graph,
            expert_distribution_metrics=None,
            routed_experts_output=None,
            indexer_topk_output=None,
        )

    def sample(self, logits_output, forward_batch):
        """``ModelRunner.sample`` for greedy batches: the plain sampler's logits processing
        (the batch's real ``SamplingBatchInfo.apply_logits_bias``: penalties, logit bias,
        vocab mask), then argmax."""
        sampling_info = forward_batch.sampling_info
        assert sampling_info.is_all_greedy
        sampling_info.apply_logits_bias(logits_output.next_token_logits)
        return torch.argmax(logits_output.next_token_logits, dim=-1)


# --------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------
def verify_tree_greedy_standin(
    predicts, accept_index, accept_token_num, candidates, *tree, target_predict=None,
    topk=-1, **named,
):  # fmt: skip
    """sgl_kernel ``verify_tree_greedy``: walk each request's tree from the root, accepting
    a child while it equals the target's prediction at its parent; the prediction at the
    last accepted node is the bonus. Writes predicts / accept_index / accept_token_num.
    (0.5.9 spells the tree arguments ``retrive_*``, 0.5.12 ``retrieve_*``.)"""
    if tree:
        retrieve_index, retrieve_next_token, retrieve_next_sibling, target_predict = tree[:4]
    else:
        pick = lambda name: named.get("retrieve_" + name, named.get("retrive_" + name))  # noqa: E731
        retrieve_index, retrieve_next_token, retrieve_next_sibling = (
            pick("index"), pick("next_token"), pick("next_sibling")
        )  # fmt: skip
    bs, num_draft = candidates.shape
    assert target_predict.shape == (bs, num_draft)
    assert accept_index.shape[0] == bs and accept_token_num.shape == (bs,)
    for b in range(bs):
        node, depth = 0, 0
        accept_index[b, 0] = int(retrieve_index[b, 0])
        while True:
            child = int(retrieve_next_token[b, node])
            found = None
            while child != -1:
                if int(candidates[b, child]) == int(target_predict[b, node]):
                    found = child
                    break
                child = int(retrieve_next_sibling[b, child])
            if found is None:
                break
            predicts[int(retrieve_index[b, node])] = int(candidates[b, found])
            depth += 1
            accept_index[b, depth] = int(retrieve_index[b, found])
            node = found
        predicts[int(retrieve_index[b, node])] = int(target_predict[b, node])
        accept_token_num[b] = depth
    return predicts, accept_index, accept_token_num


def assign_req_to_token_pool_standin(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, batch_size
):
    """Triton ``assign_req_to_token_pool``: req_to_token[r, start:end] = the next slots."""
    pt = 0
    for i in range(batch_size):
        start, end = int(start_offset[i]), int(end_offset[i])
        req_to_token[int(req_pool_indices[i]), start:end] = out_cache_loc[pt : pt + end - start]
        pt += end - start
    assert pt == len(out_cache_loc), "out_cache_loc length != sum(end - start)"


def assign_extend_cache_locs_func_standin(
    req_pool_indices, req_to_token, start_offset, end_offset, batch_size, draft_token_num,
    device,
):  # fmt: skip
    """Triton ``assign_extend_cache_locs``: the slots req_to_token[r, start:end]."""
    out = [
        req_to_token[int(req_pool_indices[i]), int(start_offset[i]) : int(end_offset[i])]
        for i in range(batch_size)
    ]
    out = torch.cat(out).to(torch.int64)
    assert len(out) == batch_size * draft_token_num
    return out


class _Grid:
    """Triton's ``kernel[grid](...)`` launch syntax over a torch function."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return self.fn


def _fill_bonus_tokens(accept_tokens, accept_lens, bonus_tokens, num_draft_tokens):
    flat = accept_tokens.reshape(-1)  # the kernel reads a flat pointer
    for i in range(len(accept_lens)):
        bonus_tokens[i] = flat[num_draft_tokens * i + int(accept_lens[i]) - 1]


def _create_extend_after_decode_spec_info(
    verified_id, seq_lens, accept_lens, positions, new_verified_id, bs_upper
):
    pt = 0
    for i in range(len(seq_lens)):
        n = int(accept_lens[i])
        positions[pt : pt + n] = torch.arange(int(seq_lens[i]) - n, int(seq_lens[i]))
        new_verified_id[i] = verified_id[pt + n - 1]
        pt += n


fill_bonus_tokens_standin = _Grid(_fill_bonus_tokens)
create_extend_after_decode_spec_info_standin = _Grid(_create_extend_after_decode_spec_info)


def install(monkeypatch):
    """Put the kernel, event and graph scaffolding stand-ins in place."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.model_executor import cuda_graph_runner as cgr
    from sglang.srt.speculative import eagle_info, eagle_info_v2, eagle_worker_v2, spec_utils

    LAUNCHES.entries.clear()
    n = names()
    for module in (eagle_info, eagle_info_v2):
        monkeypatch.setattr(module, "verify_tree_greedy_func", verify_tree_greedy_standin)
    for module in (spec_utils, eagle_info):
        if hasattr(module, "assign_req_to_token_pool_func"):
            monkeypatch.setattr(
                module, "assign_req_to_token_pool_func", assign_req_to_token_pool_standin
            )
    monkeypatch.setattr(
        eagle_info_v2, "assign_extend_cache_locs_func", assign_extend_cache_locs_func_standin
    )
    monkeypatch.setattr(
        eagle_info, "create_extend_after_decode_spec_info",
        create_extend_after_decode_spec_info_standin,
    )  # fmt: skip
    monkeypatch.setattr(eagle_worker_v2, n.fill_root, fill_bonus_tokens_standin)
    monkeypatch.setattr(torch.cpu, "Event", StandInEvent, raising=False)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    monkeypatch.setattr(parallel_state, "_MOE_EP", types.SimpleNamespace(world_size=1))
    # CUDA-graph capture scaffolding: one rank, no process group, no device memory
    for name, value in (
        ("get_attention_tp_size", 1),
        ("get_attention_tp_rank", 0),
        ("get_attention_cp_size", 1),
        ("get_attention_cp_rank", 0),
    ):
        monkeypatch.setattr(cgr, name, lambda value=value: value, raising=False)
    monkeypatch.setattr(cgr, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(cgr, "graph_capture", graph_capture_standin)
    monkeypatch.setattr(cgr, "get_available_gpu_memory", lambda *a, **k: 0.0)
    monkeypatch.setattr(cgr, "get_global_graph_memory_pool", lambda: "stand-in pool")
    monkeypatch.setattr(cgr, "set_graph_pool_id", lambda pool: None, raising=False)
    monkeypatch.setattr(torch.cpu, "synchronize", lambda *a, **k: None, raising=False)
