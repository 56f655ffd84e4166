"""kimi-k25-eagle3-delegation.patch: the EAGLE-3 hooks of KimiK25ForConditionalGeneration."""

from __future__ import annotations

import pytest
import torch
from tiny_models import HIDDEN, NUM_LAYERS, VOCAB, tiny_deepseek_v3
from torch import nn

# Upstream has an equivalent from 0.5.10: carried on the 0.5.9 line only.
pytestmark = [pytest.mark.payload, pytest.mark.sglang_lines("0.5.9")]


def kimi_wrapping(language_model: nn.Module):
    """``KimiK25ForConditionalGeneration`` around ``language_model``, without the vision tower."""
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration

    kimi = object.__new__(KimiK25ForConditionalGeneration)
    nn.Module.__init__(kimi)
    kimi.language_model = language_model
    return kimi


def test_kimi_delegates_eagle3_hooks(sglang_tree, server_args, monkeypatch):
    lm = tiny_deepseek_v3(monkeypatch)
    kimi = kimi_wrapping(lm)

    kimi.set_eagle3_layers_to_capture([1, 3, 5])
    assert lm.capture_aux_hidden_states is True
    assert lm.model.layers_to_capture == [2, 4, 6]
    kimi.set_eagle3_layers_to_capture()
    assert lm.model.layers_to_capture == [2, NUM_LAYERS // 2, NUM_LAYERS - 3]

    embed, head = kimi.get_embed_and_head()
    assert embed is lm.model.embed_tokens.weight
    assert head is lm.lm_head.weight

    new_embed = nn.Parameter(torch.randn(VOCAB, HIDDEN))
    new_head = nn.Parameter(torch.randn(VOCAB, HIDDEN))
    kimi.set_embed_and_head(new_embed, new_head)
    assert lm.model.embed_tokens.weight is new_embed
    assert lm.lm_head.weight is new_head


@pytest.mark.parametrize(
    ("hook", "args"),
    [
        ("set_eagle3_layers_to_capture", ([1, 3, 5],)),
        ("get_embed_and_head", ()),
        ("set_embed_and_head", (None, None)),
    ],
)
def test_kimi_delegation_clear_error(sglang_tree, server_args, hook, args):
    kimi = kimi_wrapping(nn.Linear(2, 2))

    with pytest.raises(AttributeError, match=rf"language model Linear has no {hook}\(\)"):
        getattr(kimi, hook)(*args)
