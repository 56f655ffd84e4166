"""The doctor against the real model: SGLang 0.5.9's patched `LlamaForCausalLMEagle3` on CPU.

The draft model is built by the real code (one-rank gloo group, the payload tier's stand-in
for sgl_kernel) and loaded with its real ``load_weights``.  What the doctor derives statically
(parameter names and shapes, which parameters stay untrained) must be what the real model
does, and a speculators draft repaired by ``--fix`` must fill every parameter.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.payload

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from doctor_fixtures import HIDDEN, sglang_config, sglang_draft, speculators_draft, target_config  # noqa: E402

from patchkit.doctor import sources  # noqa: E402
from patchkit.doctor.checkpoint import load_checkpoint, sglang_view  # noqa: E402
from patchkit.doctor.draft import check_draft  # noqa: E402
from patchkit.doctor.expected import SourceTree, derive_draft  # noqa: E402
from patchkit.doctor.fix import write_fixed  # noqa: E402

PAYLOAD_CONFTEST = Path(__file__).resolve().parent / "payload" / "conftest.py"
SPEC_FIXTURES = PAYLOAD_CONFTEST.with_name("spec_fixtures.py")


def _payload_helpers():
    spec = importlib.util.spec_from_file_location("doctor_payload_trees", PAYLOAD_CONFTEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def patched_tree() -> Path:
    """The patched SGLang 0.5.9 tree of the payload tier, first on sys.path with its stand-ins."""
    helpers = _payload_helpers()
    root = helpers.prepare_tree("sglang", patched=True)
    helpers._put_first_on_path(helpers.STANDINS)
    helpers._put_first_on_path(root / "python")
    return root / "python"


@pytest.fixture(scope="module")
def eagle3(patched_tree, tmp_path_factory):
    """The real ``LlamaForCausalLMEagle3`` class, importable and constructible on CPU."""
    spec = importlib.util.spec_from_file_location("doctor_spec_fixtures", SPEC_FIXTURES)
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    with fixtures.real_eagle3(tmp_path_factory.mktemp("model")) as cls:
        yield cls


def build(eagle3, config: dict):
    from transformers import LlamaConfig

    model = eagle3(LlamaConfig(**config))
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(float("nan"))  # anything left NaN was never loaded
    return model


def load(model, folder: Path) -> None:
    from safetensors.torch import load_file

    weights = {}
    for shard in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(str(shard)))
    model.load_weights(list(weights.items()))


def untrained(model) -> set[str]:
    return {name for name, p in model.named_parameters() if torch.isnan(p).any()}


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"target_hidden_size": 96},
        {"tie_word_embeddings": True, "draft_vocab_size": 256},
        {"attention_bias": True},
    ],
    ids=["plain", "target-hidden", "tied", "bias"],
)
def test_derived_parameters_are_the_real_models(eagle3, patched_tree, extra):
    config = {**sglang_config(), **extra}
    real = {name: tuple(p.shape) for name, p in eagle3_model(eagle3, config).named_parameters()}

    derived = derive_draft(SourceTree(sources.from_path(patched_tree)), config, {})

    assert {name: tuple(spec.shape) for name, spec in derived.params.items()} == real


def eagle3_model(eagle3, config):
    from transformers import LlamaConfig

    return eagle3(LlamaConfig(**config))


def test_fixed_speculators_draft_loads_every_tensor(eagle3, patched_tree, tmp_path):
    from safetensors.torch import load_file

    draft = speculators_draft(tmp_path / "spec")
    target = target_config(tmp_path / "target")
    source = sources.from_path(patched_tree)
    report = check_draft(draft, target, source)
    fix = write_fixed(report, draft, tmp_path / "fixed")

    model = build(eagle3, json.loads((fix.out / "config.json").read_text()))
    load(model, fix.out)

    assert untrained(model) == set()
    original = load_file(str(draft / "model.safetensors"))
    params = dict(model.named_parameters())
    attn, mlp = "model.midlayer.self_attn", "model.midlayer.mlp"
    qkv = torch.cat([original[f"layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    gate_up = torch.cat([original[f"layers.0.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    assert torch.equal(params[f"{attn}.qkv_proj.weight"], qkv)
    assert torch.equal(params[f"{mlp}.gate_up_proj.weight"], gate_up)
    assert torch.equal(params["model.fc.weight"], original["fc.weight"])
    assert torch.equal(params["lm_head.weight"], original["lm_head.weight"])
    assert torch.equal(model.hot_token_id, original["d2t"] + torch.arange(original["d2t"].shape[0]))
    assert check_draft(fix.out, target, source).ok


def test_doctor_names_exactly_what_the_real_load_leaves_untrained(eagle3, patched_tree, tmp_path):
    """The unfixed speculators draft, with only its config flattened: the real load_weights
    leaves the decoder layer at its initial values, and the doctor said which."""
    draft = speculators_draft(tmp_path / "spec")
    view = sglang_view(load_checkpoint(draft).config)
    report = check_draft(draft, target_config(tmp_path / "target"), sources.from_path(patched_tree))

    model = build(eagle3, view)
    load(model, draft)

    left = untrained(model)
    assert left and all(".midlayer." in name for name in left)
    flagged = by_id(report)["keys.expected"]
    assert flagged.status == "fail"
    assert f"{len(left)} of {len(dict(model.named_parameters()))} parameters" in flagged.detail
    derived = derive_draft(
        SourceTree(sources.from_path(patched_tree)), view, load_checkpoint(draft).tensor_values()
    )
    assert set(derived.unfilled()) == left


def test_sglang_layout_draft_loads_every_tensor(eagle3, patched_tree, tmp_path):
    draft = sglang_draft(tmp_path / "draft")
    model = build(eagle3, json.loads((draft / "config.json").read_text()))
    load(model, draft)

    assert untrained(model) == set()
    assert dict(model.named_parameters())["model.fc.weight"].shape[1] == 3 * HIDDEN


def by_id(report) -> dict:
    return {c.id: c for c in report.checks}
