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
is stood in for by a recorder of the K/V it is handed (which it would write).
"""

from __future__ import annotations

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
    return worker


def test_a_step_without_drafts_writes_the_kv_a_draft_extend_writes(eagle3):
    """The K/V written for each request's new token, fed the target's hidden states of the
    pending token, are those the full forward computes for it at the pending token's position
    (``seq_lens``), in the slot the verify reserved there; no other slot changes."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    model = _model(eagle3)
    pool = _pool(model)
    worker = _draft_worker(model, pool)
    assert worker.writes_draft_kv_alone()
    bs = 4
    seq_lens = torch.tensor([5, 17, 9, 30])
    slots = torch.tensor([40, 3, 22, 57])
    tokens = torch.tensor([7, 200, 31, 99])
    target_hidden = torch.randn(bs, TARGET_HIDDEN)
    batch = SimpleNamespace(forward_mode=ForwardMode.DECODE, seq_lens=seq_lens, out_cache_loc=slots)
    result = SimpleNamespace(
        next_token_ids=tokens.to(torch.int32),
        logits_output=SimpleNamespace(hidden_states=target_hidden),
    )
    with torch.no_grad():
        worker.write_draft_kv_for_decode(batch, result)

    want_k, want_v = _full_forward_kv(model, tokens, seq_lens, target_hidden)
    k, v = pool.get_kv_buffer(0)
    torch.testing.assert_close(k[slots], want_k)
    torch.testing.assert_close(v[slots], want_v)
    others = torch.ones(SLOTS + 1, dtype=torch.bool)
    others[slots] = False
    assert not k[others].any() and not v[others].any()
    # the position matters: the same token one position on has other K (rotary)
    moved_k, _ = _full_forward_kv(model, tokens, seq_lens + 1, target_hidden)
    assert not torch.allclose(moved_k, want_k)


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
