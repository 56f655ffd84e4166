"""Tiny real SGLang model objects for the payload tests, built without weights or a TP group."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

NUM_LAYERS = 8
VOCAB = 32
HIDDEN = 16


def tiny_deepseek_v3(monkeypatch: pytest.MonkeyPatch):
    """A real ``DeepseekV3ForCausalLM`` object with tiny parts and no weights loaded.

    Built with ``object.__new__`` (its ``__init__`` needs a TP group and a full config); the
    EAGLE-3 hooks under test only touch ``config``, ``pp_group``, ``model`` and ``lm_head``.
    """
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

    lm = object.__new__(DeepseekV3ForCausalLM)
    nn.Module.__init__(lm)
    lm.config = SimpleNamespace(num_hidden_layers=NUM_LAYERS)
    lm.pp_group = SimpleNamespace(is_last_rank=True, is_first_rank=True)
    lm.capture_aux_hidden_states = False
    lm.model = nn.Module()
    lm.model.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
    lm.model.layers_to_capture = []
    lm.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
    # set_embed_and_head() frees the CUDA cache afterwards; there is no CUDA here.
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    return lm
