"""SGLang 0.5.17 and 0.5.23: a step without drafts keeps the draft's KV history with its K/V alone.

Above ``--speculative-disable-batch-threshold`` the draft does not draft; what it must keep
is its KV history, so that drafting resumes on it. The EAGLE-3 draft's one layer takes the
token's embedding and the target's hidden states; its K/V depend on nothing else, so
``EagleDraftWorker.write_draft_kv_for_decode`` writes them (``write_draft_kv``) without the
attention, MLP, LM head and top-k of a draft extend.

Real parts: the line's ``LlamaForCausalLMEagle3`` (tiny, random weights, a one-rank gloo
group), its real ``MHATokenToKVPool`` on the CPU and the real ``EagleDraftWorker`` methods.
The reference is the model's own full forward of the same tokens at the same positions with
the draft extend's hidden states; the attention kernel, the one part that cannot run here,
is stood in for by a recorder of the K/V it is handed (which it would write). The write's
CUDA graphs (``draft_kv_graph.DraftKVGraphs``) run on a stand-in for ``torch.cuda``'s graph
API with its contract: a replay runs again what was captured, over the same tensors.
"""

from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace

import pytest
from doctor_fixtures import sglang_config
from spec_fixtures import real_eagle3, spec_tree

LINES = ("0.5.17", "0.5.23")
pytestmark = [pytest.mark.payload, pytest.mark.sglang_lines(*LINES)]

SLOTS = 64
TARGET_HIDDEN = 3 * 64  # three aux layers of a target as wide as the draft


@pytest.fixture
def eagle3(request, tmp_path):
    spec_tree(request, os.environ.get("PATCHKIT_PAYLOAD_LINE") or LINES[0])
    with real_eagle3(tmp_path) as cls:
        yield cls


def _model(eagle3, **config):
    import torch
    from transformers import LlamaConfig

    torch.manual_seed(0)
    model = eagle3(LlamaConfig(**{**sglang_config(), "torch_dtype": "float32", **config}))
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn_like(param) * 0.2)
    return model


def _pool(model):
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    attn = model.model.layers[0].self_attn.attn
    return MHATokenToKVPool(
        size=SLOTS, page_size=1, dtype=torch.float32, head_num=attn.tp_k_head_num,
        head_dim=attn.qk_head_dim, layer_num=1, device="cpu", enable_memory_saver=False,
        enable_alt_stream=False,
    )  # fmt: skip


def _full_forward_kv(model, tokens, positions, target_hidden):
    """The K/V the model's full forward hands its attention (which writes them), for
    ``tokens`` at ``positions`` fed ``target_hidden``, as a draft extend runs it."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    attn = model.model.layers[0].self_attn.attn
    handed = {}

    def attention(q, k, v, forward_batch, *args, **kwargs):  # records what it writes
        handed["k"] = k.view(-1, attn.tp_k_head_num, attn.qk_head_dim).clone()
        handed["v"] = v.view(-1, attn.tp_v_head_num, attn.v_head_dim).clone()
        return torch.zeros(q.shape[0], attn.tp_q_head_num * attn.v_head_dim)

    forward_batch = SimpleNamespace(
        forward_mode=ForwardMode.DRAFT_EXTEND_V2,
        mm_input_embeds=None,
        contains_mm_inputs=lambda: False,
        spec_info=SimpleNamespace(hidden_states=target_hidden),
    )
    attn.forward = attention
    try:
        with torch.no_grad():
            model.model(tokens, positions, forward_batch)
    finally:
        del attn.forward
    return handed["k"], handed["v"]


def _draft_worker(model, pool, dcp_size=1):
    """A real ``EagleDraftWorker`` holding the draft model and its KV pool (its constructor
    loads them on a GPU)."""
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    worker = object.__new__(EagleDraftWorker)
    worker.draft_runner = SimpleNamespace(model=model, token_to_kv_pool=pool)
    worker.server_args = SimpleNamespace(dcp_size=dcp_size)
    worker.draft_kv_graphs = None
    return worker


class CudaGraphStandIn:
    """``torch.cuda``'s graph API without a GPU, keeping its contract: what runs inside
    ``graph(g)`` is recorded (the write and the very tensors it was given) and each
    ``g.replay()`` runs it again over them; capture needs ``synchronize`` and a pool."""

    def __init__(self):
        self.capturing = None
        self.captured = 0

    def CUDAGraph(self):  # noqa: N802 (torch's name)
        return SimpleNamespace(work=[], replay=None)

    @contextlib.contextmanager
    def graph(self, graph, pool=None):
        assert pool is not None  # the graphs share a pool of their own
        self.capturing = graph
        yield
        self.capturing = None
        work = list(graph.work)
        graph.replay = lambda: [fn(*args) for fn, args in work]
        self.captured += 1

    def recording(self, write):
        def recorded(*args):
            if self.capturing is not None:
                self.capturing.work.append((write, args))
            return write(*args)

        return recorded


@pytest.fixture
def cuda_graphs(monkeypatch):
    import torch

    stand_in = CudaGraphStandIn()
    monkeypatch.setattr(torch.cuda, "CUDAGraph", stand_in.CUDAGraph)
    monkeypatch.setattr(torch.cuda, "graph", stand_in.graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    return stand_in


def _captured_worker(model, pool, cuda_graphs, monkeypatch, sizes):
    """A draft worker whose K/V writes replay the real ``DraftKVGraphs`` captured by the real
    ``capture_draft_kv_graphs`` (the write recorded as the stand-in's capture)."""
    worker = _draft_worker(model, pool)
    monkeypatch.setattr(
        model, "write_draft_kv_embedded", cuda_graphs.recording(model.write_draft_kv_embedded)
    )
    worker.capture_draft_kv_graphs(sizes)
    assert cuda_graphs.captured == len(sizes)
    return worker


def _decode(worker, tokens, seq_lens, slots, target_hidden):
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    batch = SimpleNamespace(forward_mode=ForwardMode.DECODE, seq_lens=seq_lens, out_cache_loc=slots)
    result = SimpleNamespace(
        next_token_ids=tokens.to(torch.int32),
        logits_output=SimpleNamespace(hidden_states=target_hidden),
    )
    with torch.no_grad():
        worker.write_draft_kv_for_decode(batch, result)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda-graph"])
def test_a_step_without_drafts_writes_the_kv_a_draft_extend_writes(
    eagle3, graphs, request, monkeypatch
):
    """The K/V written for each request's new token, fed the target's hidden states of the
    pending token, are those the full forward computes for it at the pending token's position
    (``seq_lens``), in the slot the verify reserved there; no other slot changes but the
    padding slot 0 (a graph's rows past the batch)."""
    import torch

    model = _model(eagle3)
    pool = _pool(model)
    if graphs:  # 4 requests replay the graph of 8
        worker = _captured_worker(model, pool, request.getfixturevalue("cuda_graphs"),
                                  monkeypatch, [2, 8, 12])  # fmt: skip
    else:
        worker = _draft_worker(model, pool)
    assert worker.writes_draft_kv_alone()
    seq_lens = torch.tensor([5, 17, 9, 30])
    slots = torch.tensor([40, 3, 22, 57])
    tokens = torch.tensor([7, 200, 31, 99])
    target_hidden = torch.randn(4, TARGET_HIDDEN)
    _decode(worker, tokens, seq_lens, slots, target_hidden)

    want_k, want_v = _full_forward_kv(model, tokens, seq_lens, target_hidden)
    k, v = pool.get_kv_buffer(0)
    torch.testing.assert_close(k[slots], want_k)
    torch.testing.assert_close(v[slots], want_v)
    others = torch.ones(SLOTS + 1, dtype=torch.bool)
    others[slots] = False
    others[0] = False  # the padding slot
    assert not k[others].any() and not v[others].any()
    # the position matters: the same token one position on has other K (rotary)
    moved_k, _ = _full_forward_kv(model, tokens, seq_lens + 1, target_hidden)
    assert not torch.allclose(moved_k, want_k)


def test_a_replay_writes_only_its_own_batchs_slots(eagle3, cuda_graphs, monkeypatch):
    """A graph's rows past the batch write the padding slot, not the slots of the batch it
    replayed before (freed since and given to another request, whose K/V it would erase);
    a batch larger than every graph is left to the eager write."""
    import torch

    model = _model(eagle3)
    pool = _pool(model)
    worker = _captured_worker(model, pool, cuda_graphs, monkeypatch, [8])
    hidden = torch.randn(7, TARGET_HIDDEN)
    _decode(worker, torch.arange(7), torch.arange(10, 17), torch.arange(30, 37), hidden)
    k = pool.get_key_buffer(0)
    reused = k[36].clone().normal_()
    k[36] = reused  # slot 36 freed and written for another request
    _decode(worker, torch.arange(5), torch.arange(20, 25), torch.arange(40, 45), hidden[:5])
    assert torch.equal(k[36], reused)
    before = pool.get_key_buffer(0).clone()
    nine = (torch.zeros(9, 64), torch.arange(9), torch.zeros(9, TARGET_HIDDEN), torch.arange(9))
    assert not worker.draft_kv_graphs.replay(*nine)
    assert torch.equal(pool.get_key_buffer(0), before)  # no graph of 9: nothing written
    hidden = torch.randn(9, TARGET_HIDDEN)
    eager = _pool(model)
    for writer in (_draft_worker(model, eager), worker):  # nine requests: written eagerly
        _decode(writer, torch.arange(9), torch.arange(9), torch.arange(50, 59), hidden)
    assert torch.equal(pool.get_key_buffer(0)[50:59], eager.get_key_buffer(0)[50:59])


def test_an_idle_batch_writes_nothing(eagle3):
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    model = _model(eagle3)
    pool = _pool(model)
    idle = SimpleNamespace(
        forward_mode=ForwardMode.IDLE, seq_lens=torch.empty(0), out_cache_loc=None
    )
    _draft_worker(model, pool).write_draft_kv_for_decode(idle, None)
    assert not pool.get_key_buffer(0).any()


def test_the_kv_alone_only_where_it_is_the_whole_history(eagle3):
    """A draft of more than one layer (a later layer's K/V need the first one's attention),
    a KV pool of another layout, of virtual slot ids (the unified pool) or quantisation, or
    KV split over decode-context-parallel ranks keeps the full draft extend."""
    from sglang.srt.mem_cache.memory_pool import PageMajorMHATokenToKVPool
    from sglang.srt.mem_cache.unified_memory_pool import UnifiedMHATokenToKVPool

    model = _model(eagle3)
    pool = _pool(model)
    assert _draft_worker(model, pool).writes_draft_kv_alone()
    two_layers = _model(eagle3, num_hidden_layers=2)
    assert not _draft_worker(two_layers, pool).writes_draft_kv_alone()
    for other in (PageMajorMHATokenToKVPool, UnifiedMHATokenToKVPool):  # virtual slot ids
        other_pool = object.__new__(other)  # only its type is read
        assert not _draft_worker(model, other_pool).writes_draft_kv_alone()
    assert not _draft_worker(model, pool, dcp_size=2).writes_draft_kv_alone()
    no_writer = SimpleNamespace(model=SimpleNamespace(layers=[None]))
    assert not _draft_worker(no_writer, pool).writes_draft_kv_alone()
