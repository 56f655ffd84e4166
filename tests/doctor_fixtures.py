"""Tiny EAGLE-3 draft checkpoints and target configs for the doctor tests.

Written as real safetensors files with the `safetensors` package and numpy.  The SGLang layout
is the one SGLang's EAGLE-3 drafts ship in (``midlayer.*``, unfused q/k/v and gate/up); the
speculators layout is what the real `speculators` package writes, as recorded by
``fixtures/doctor/make_speculators_draft.py`` in ``fixtures/doctor/speculators-eagle3.json``
(config.json verbatim, every tensor's name, shape and dtype).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "doctor"
SPECULATORS_RECORD = FIXTURES / "speculators-eagle3.json"

HIDDEN = 64
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
INTER = 128
VOCAB = 256
DRAFT_VOCAB = 128
TARGET_LAYERS = 8
AUX_IDS = [1, 3, 5]
NP_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "BOOL": np.bool_}


def target_config(
    folder: Path,
    *,
    layers: int = TARGET_LAYERS,
    hidden: int = HIDDEN,
    vocab: int = VOCAB,
    kimi: bool = True,
) -> Path:
    """A Kimi-K2.5-shaped target config (DeepseekV3 text model inside), tiny sizes."""
    text = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": vocab,
        "num_attention_heads": 4, "rope_theta": 50000.0, "torch_dtype": "bfloat16",
    }  # fmt: skip
    doc = (
        {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
         "torch_dtype": "bfloat16", "text_config": text}
        if kimi else text
    )  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(doc, indent=2))
    return folder / "config.json"


def vocab_maps(draft_vocab: int = DRAFT_VOCAB, vocab: int = VOCAB) -> tuple[np.ndarray, np.ndarray]:
    """d2t (target id - draft id, per draft token) and t2d (drafted target tokens)."""
    targets = np.arange(draft_vocab) * (vocab // draft_vocab)
    d2t = (targets - np.arange(draft_vocab)).astype(np.int64)
    t2d = np.zeros(vocab, dtype=np.bool_)
    t2d[targets] = True
    return d2t, t2d


def sglang_tensors(
    *,
    n_aux: int = 3,
    hidden: int = HIDDEN,
    target_hidden: int = HIDDEN,
    vocab: int = VOCAB,
    draft_vocab: int = DRAFT_VOCAB,
    prefix: str = "midlayer",
    d2t: bool = True,
    dtype=np.float32,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape):
        return rng.standard_normal(shape).astype(dtype)

    out = {
        "embed_tokens.weight": w(vocab, hidden),
        "fc.weight": w(hidden, n_aux * target_hidden),
        f"{prefix}.hidden_norm.weight": w(hidden),
        f"{prefix}.input_layernorm.weight": w(hidden),
        f"{prefix}.post_attention_layernorm.weight": w(hidden),
        f"{prefix}.self_attn.q_proj.weight": w(HEADS * HEAD_DIM, 2 * hidden),
        f"{prefix}.self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, 2 * hidden),
        f"{prefix}.self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, 2 * hidden),
        f"{prefix}.self_attn.o_proj.weight": w(hidden, HEADS * HEAD_DIM),
        f"{prefix}.mlp.gate_proj.weight": w(INTER, hidden),
        f"{prefix}.mlp.up_proj.weight": w(INTER, hidden),
        f"{prefix}.mlp.down_proj.weight": w(hidden, INTER),
        "norm.weight": w(hidden),
        "lm_head.weight": w(draft_vocab, hidden),
    }
    if d2t:
        out["d2t"], out["t2d"] = vocab_maps(draft_vocab, vocab)
    return out


def sglang_config(
    *,
    aux_ids: list[int] | None = AUX_IDS,
    vocab: int = VOCAB,
    draft_vocab: int = DRAFT_VOCAB,
    **extra,
) -> dict:
    doc = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": INTER, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_hidden_layers": 1,
        "vocab_size": vocab, "draft_vocab_size": draft_vocab, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "hidden_act": "silu",
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }  # fmt: skip
    if aux_ids is not None:
        doc["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": aux_ids,
            "use_aux_hidden_state": True,
        }
    doc.update(extra)
    return {k: v for k, v in doc.items() if v is not None}


def write_draft(folder: Path, config: dict, tensors: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def sglang_draft(folder: Path, *, config: dict | None = None, **tensor_args) -> Path:
    """A draft in SGLang's layout; bfloat16 is claimed but float16 is not used: float32 here
    would trip the dtype check, so tensors are written as float16 and the config says so."""
    tensor_args.setdefault("dtype", np.float16)
    cfg = config if config is not None else sglang_config(torch_dtype="float16")
    return write_draft(folder, cfg, sglang_tensors(**tensor_args))


def speculators_record() -> dict:
    return json.loads(SPECULATORS_RECORD.read_text())


def speculators_draft(folder: Path, *, seed: int = 0) -> Path:
    """A draft exactly as the speculators package lays it out (names, shapes, dtypes, config)."""
    record = speculators_record()
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, meta in record["tensors"].items():
        if name == "d2t":
            tensors[name] = vocab_maps()[0]
        elif name == "t2d":
            tensors[name] = vocab_maps()[1]
        else:
            tensors[name] = rng.standard_normal(meta["shape"]).astype(NP_DTYPES[meta["dtype"]])
    write_draft(folder, copy.deepcopy(record["config"]), tensors)
    for name in record["files"]:  # config.py: the auto_map code save_pretrained writes beside
        if not (folder / name).exists():
            (folder / name).write_text("# the config class speculators' save_pretrained writes\n")
    return folder


# Kimi-K2.5's text model and an EAGLE-3 draft of the size teams train for it.
KIMI_TEXT = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840,
    "num_attention_heads": 64, "rope_theta": 50000.0, "torch_dtype": "bfloat16",
    "max_position_embeddings": 262144,
}  # fmt: skip
KIMI_DRAFT = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 7168,
    "intermediate_size": 18432, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 128, "num_hidden_layers": 1, "vocab_size": 163840, "draft_vocab_size": 32000,
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-5, "rope_theta": 50000.0,
    "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": True},
}  # fmt: skip


def kimi_size_draft(folder: Path) -> Path:
    """A full-size Kimi-K2.5 EAGLE-3 draft as a sparse file: real safetensors header (written
    here with json + struct), bf16 weights left as holes (about 4 GB apparent, nothing on disk),
    real d2t / t2d bytes."""
    import struct

    c = KIMI_DRAFT
    h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd, inter = c["head_dim"], c["intermediate_size"]
    shapes = {
        "fc.weight": [h, 3 * h],
        "midlayer.hidden_norm.weight": [h],
        "midlayer.input_layernorm.weight": [h],
        "midlayer.post_attention_layernorm.weight": [h],
        "midlayer.self_attn.q_proj.weight": [heads * hd, 2 * h],
        "midlayer.self_attn.k_proj.weight": [kv * hd, 2 * h],
        "midlayer.self_attn.v_proj.weight": [kv * hd, 2 * h],
        "midlayer.self_attn.o_proj.weight": [h, heads * hd],
        "midlayer.mlp.gate_proj.weight": [inter, h],
        "midlayer.mlp.up_proj.weight": [inter, h],
        "midlayer.mlp.down_proj.weight": [h, inter],
        "norm.weight": [h],
        "lm_head.weight": [c["draft_vocab_size"], h],
    }
    d2t, t2d = vocab_maps(c["draft_vocab_size"], c["vocab_size"])
    header, cursor = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [cursor, cursor + size]}
        cursor += size
    maps = {"d2t": (d2t, "I64"), "t2d": (t2d, "BOOL")}
    for name, (array, dtype) in maps.items():
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [cursor, cursor + array.nbytes]}  # fmt: skip
        cursor += array.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(c, indent=2))
    with (folder / "model.safetensors").open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        start = fh.tell()
        for name, (array, _) in maps.items():
            fh.seek(start + header[name]["data_offsets"][0])
            fh.write(array.tobytes())
        fh.truncate(start + cursor)
    return folder


def kimi_target(folder: Path, **text) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "torch_dtype": "bfloat16", "text_config": {**KIMI_TEXT, **text},
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(doc, indent=2))
    return folder / "config.json"
