"""Configurations of a larger target and draft, loaded with dummy weights, for the benchmark.

    python gpu/large_models.py --out DIR [--layers N]

Writes ``DIR/target/config.json`` (a ``DeepseekV3ForCausalLM``: 16 layers, hidden 2048, MLA,
64 routed experts top-6 + 1 shared expert, about 13 GB in bf16), ``DIR/draft/config.json`` (a
``LlamaForCausalLMEagle3`` draft of the same width) and ``DIR/language.json`` (prompt ids
for the benchmark). No weights: ``gpu/engines.py`` starts a model folder without weights with
``--load-format dummy``.

The trained tiny models of ``gpu/train_models.py`` decide correctness and acceptance; their
decode step is bound by launch and scheduler overhead (a forward of 8 layers at hidden 256
takes less GPU time than SGLang's Python around it). This target's decode step is bound by
the GPU (at batch 16 and more a step reads nearly every expert, 12 GB), as Kimi-K2.5's is on
the target box, so the benchmark on it says what the fixed per-step cost of a step without
drafts weighs where the forward dominates. Acceptance is meaningless with dummy weights: only
batches above the threshold, where no draft is verified, are compared.

``--layers N`` makes the target deeper (N layers, about 0.8 GB each) with the same draft: the
target's step grows while the cost of a step without drafts beyond the target's forward (the
draft extend, the step's own kernels) stays the same, which is how the gap between the two
kinds of step depends on the target's step time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_models  # noqa: E402
from language import ChainLanguage  # noqa: E402

HIDDEN = 2048
# The tiny target's and draft's configurations (train_models), wider and deeper
TARGET_CONFIG = {
    **train_models.TARGET_CONFIG,
    "hidden_size": HIDDEN,
    "intermediate_size": 8192,
    "moe_intermediate_size": 1024,
    "num_hidden_layers": 16,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}
DRAFT_CONFIG = {
    **{k: v for k, v in train_models.DRAFT_CONFIG.items() if k != "eagle_config"},
    "hidden_size": HIDDEN,
    "intermediate_size": 8192,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 128,
    "max_position_embeddings": 4096,
}  # SGLang's default aux layers: nothing is trained to depend on them


def write(out: Path, seed: int = 0, layers: int | None = None) -> None:
    target = {**TARGET_CONFIG, **({"num_hidden_layers": layers} if layers else {})}
    for name, config in (("target", target), ("draft", DRAFT_CONFIG)):
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "config.json").write_text(json.dumps(config, indent=1))
    (out / "target" / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    ChainLanguage.make(seed).save(out / "language.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=None, help="target layers (default 16)")
    args = parser.parse_args(argv)
    write(args.out, layers=args.layers)
    print(f"large model configurations in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
