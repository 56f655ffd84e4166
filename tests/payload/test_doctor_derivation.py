"""The doctor's derivation against the real model of the line under test.

`patchkit doctor draft` derives what SGLang's EAGLE-3 draft model does without importing it:
`doctor/interp.py` walks the line's model code (its parameters and shapes for a config, and
what its ``load_weights`` does with each checkpoint name).  Here the real
``LlamaForCausalLMEagle3`` of the line (0.5.9, 0.5.17, 0.5.23: each in its payload tier, in
that line's torch venv) is built on torch's ``meta`` device (no memory, no kernel), every
parameter's weight loader is replaced by a recording hook, and its real ``load_weights`` runs
over each checkpoint name on its own.  The derivation must equal what was recorded: the
parameters and their shapes, a config the model refuses, and for each name the parameters
(and shards) it loads and the model attributes it sets; a name that does neither is skipped.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from doctor_fixtures import VOCAB, sglang_config, sglang_tensors, speculators_record
from spec_fixtures import real_eagle3

from patchkit.doctor import sources
from patchkit.doctor.expected import SourceTree, derive_draft
from patchkit.doctor.interp import TensorValue

# The doctor's derivation against the line's own model code: a check of patchkit's reading
# of the line, which holds on the unpatched tree too.
pytestmark = [pytest.mark.payload, pytest.mark.of_the_line]

CASES = {
    "plain": {}, "target-hidden": {"target_hidden_size": 96},
    "tied": {"tie_word_embeddings": True, "draft_vocab_size": VOCAB},
    "no-draft-vocab": {"draft_vocab_size": None}, "bias": {"attention_bias": True},
    "fc-norm": {"fc_norm": True}, "two-layers": {"num_hidden_layers": 2},
    "two-aux": {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5]}},
}  # fmt: skip
TORCH_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                "BOOL": "bool"}  # fmt: skip
NP_CODES = {"float16": "F16", "float32": "F32", "int64": "I64", "bool": "BOOL"}


def checkpoint_names() -> dict[str, TensorValue]:
    """Both layouts' names at once (each is loaded on its own), a legacy fc norm name, names
    under ``model.`` and one no parameter takes."""
    tensors = {
        name: TensorValue(tuple(a.shape), NP_CODES[str(a.dtype)])
        for name, a in sglang_tensors().items()
    }
    for name, meta in speculators_record()["tensors"].items():
        tensors[name] = TensorValue(tuple(meta["shape"]), meta["dtype"])
    tensors["model.norm.weight"] = tensors["norm.weight"]
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors["midlayer.mlp.up_proj.weight"]
    tensors["aux_norm_low.weight"] = tensors["norm.weight"]
    tensors["fc_norm.1.weight"] = tensors["norm.weight"]
    tensors["no_such_module.weight"] = tensors["norm.weight"]
    return tensors


@pytest.fixture(scope="module")
def eagle3(sglang_tree: Path, tmp_path_factory):
    """The line's real ``LlamaForCausalLMEagle3``, constructible in a one-rank gloo group."""
    with real_eagle3(tmp_path_factory.mktemp("model")) as cls:
        yield cls


@dataclasses.dataclass
class Recorded:
    """What the real model did: its parameters, or the refusal; per name, what loading did."""

    params: dict[str, list] = dataclasses.field(default_factory=dict)
    refused: str | None = None
    outcomes: dict[str, tuple[set, set]] = dataclasses.field(default_factory=dict)


def run_real(eagle3, config: dict, tensors: dict[str, TensorValue]) -> Recorded:
    """Build the real model on ``meta`` and run its load_weights over each name alone, every
    parameter's weight loader a recording hook."""
    import torch
    from transformers import LlamaConfig

    out = Recorded()
    try:
        with torch.device("meta"):
            model = eagle3(LlamaConfig(**config))
    except Exception as exc:  # the model refuses this config
        out.refused = f"{type(exc).__name__}: {exc}"
        return out
    named = list(model.named_parameters())
    out.params = {name: list(p.shape) for name, p in named}
    names = {id(p): name for name, p in named}
    calls: list[tuple[str, object]] = []

    def record(param, weight, *shard, **kwargs):
        shard_id = shard[0] if shard else kwargs.get("shard_id", kwargs.get("loaded_shard_id"))
        calls.append((names[id(param)], shard_id))

    for _, param in named:
        try:
            param.weight_loader = record
        except AttributeError:  # SGLang's parameter classes expose it as a read-only property
            param._weight_loader = record
    for key, value in sorted(tensors.items()):
        calls.clear()
        before = dict(vars(model))
        with torch.device("meta"):
            weight = torch.empty(value.shape, dtype=getattr(torch, TORCH_DTYPES[value.dtype]))
            model.load_weights([(key, weight)])
        after = vars(model)
        changed = {k for k, v in after.items() if k not in before or before[k] is not v}
        out.outcomes[key] = (set(calls), changed)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_derivation_is_what_the_real_model_builds_and_loads(eagle3, sglang_tree, case):
    config = {**sglang_config(), **CASES[case]}
    config = {k: v for k, v in config.items() if v is not None}
    tensors = checkpoint_names()

    real = run_real(eagle3, config, tensors)
    derived = derive_draft(SourceTree(sources.from_path(sglang_tree / "python")), config, tensors)

    assert (derived.refused is not None) == (real.refused is not None), (
        derived.refused,
        real.refused,
    )
    if real.refused is not None:
        # the model's own words ("only supports 1 layer"), or the config attribute it lacks
        missing = re.findall(r"has no '(\w+)'", derived.refused)
        assert (
            all(m in real.refused for m in missing)
            if missing
            else (derived.refused in real.refused)
        ), (derived.refused, real.refused)
        return
    assert {n: list(s.shape) for n, s in derived.params.items()} == real.params
    assert sorted(derived.outcomes) == sorted(real.outcomes)
    for key, (loads, attrs) in real.outcomes.items():
        outcome = derived.outcomes[key]
        assert (set(outcome.loads), set(outcome.consumed_as)) == (loads, attrs), key
    fc = next(name for name in real.params if name.endswith("fc.weight"))
    assert (fc, None) in real.outcomes["fc.weight"][0]  # the hook saw the real loading
    assert real.outcomes["d2t"][1] == {"hot_token_id"}
