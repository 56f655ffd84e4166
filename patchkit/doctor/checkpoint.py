"""A draft checkpoint on disk: its config.json, its safetensors headers, its naming convention.

Nothing here loads a weight.  The only tensor bytes ever read are the vocabulary maps ``d2t``
and ``t2d`` (integers and booleans, one entry per token), to check that they agree.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchkit.doctor.interp import TensorValue
from patchkit.doctor.safetensors import Header, SafetensorsError, TensorInfo, read_header
from patchkit.errors import UsageError

INDEX = "model.safetensors.index.json"
MAX_MAP_ENTRIES = 16 * 1024 * 1024  # a vocabulary map longer than this is not a vocabulary
MAX_JSON_BYTES = 64 * 1024 * 1024  # config.json and the index are small; refuse anything else
# speculators' EAGLE-3 flags that change the draft's math; SGLang must read each one it sets.
SPECULATORS_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
SGLANG_ARCH = "LlamaForCausalLMEagle3"


@dataclass
class Checkpoint:
    """The files of one draft directory as the doctor reads them."""

    path: Path
    config: dict
    headers: list[Header]
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    convention: str = "sglang"  # or "speculators"

    def tensor_values(self, rename: dict[str, str] | None = None) -> dict[str, TensorValue]:
        rename = rename or {}
        return {rename.get(n, n): TensorValue(t.shape, t.dtype) for n, t in self.tensors.items()}

    def header_of(self, name: str) -> Header:
        info = self.tensors[name]
        return next(h for h in self.headers if h.path.name == info.file)

    def read_ints(self, name: str) -> list[int] | None:
        """The values of a small integer or boolean tensor (d2t, t2d); None if not one."""
        info = self.tensors.get(name)
        if info is None or info.numel > MAX_MAP_ENTRIES:
            return None
        fmt = {"I64": "q", "I32": "i", "I16": "h", "I8": "b", "U8": "B", "BOOL": "?"}.get(
            info.dtype
        )
        if fmt is None:
            return None
        header = self.header_of(name)
        with header.path.open("rb") as fh:
            fh.seek(header.data_start + info.start)
            raw = fh.read(info.end - info.start)
        return [int(v) for v in struct.unpack(f"<{info.numel}{fmt}", raw)]


def load_checkpoint(path: Path) -> Checkpoint:
    """Read ``path``'s config.json and every safetensors header; UsageError on bad input."""
    if not path.is_dir():
        raise UsageError(
            f"--draft {path}: not a directory", hint="pass the draft's checkpoint folder"
        )
    config = read_json(path / "config.json", "the draft's config.json")
    files = sorted(path.glob("*.safetensors"))
    odd = [f.name for f in files if not f.is_file()]
    if odd:  # a FIFO or device would block or never end: read regular files only
        raise UsageError(f"--draft {path}: {odd[0]} is not a regular file")
    if not files:
        other = sorted(p.name for p in path.glob("*.bin")) or ["no weight files"]
        raise UsageError(
            f"--draft {path}: no .safetensors files ({', '.join(other[:3])})",
            hint="the doctor reads safetensors headers only; save the draft with safetensors",
        )
    headers = [read_header(f) for f in files]
    tensors: dict[str, TensorInfo] = {}
    for header in headers:
        for name, info in header.tensors.items():
            if name in tensors:
                raise SafetensorsError(
                    f"tensor {name!r} is in both {tensors[name].file} and {info.file}"
                )
            tensors[name] = info
    _check_index(path, tensors)
    convention = "speculators" if is_speculators(config) else "sglang"
    return Checkpoint(path, config, headers, tensors, convention)


def _check_index(path: Path, tensors: dict[str, TensorInfo]) -> None:
    index = path / INDEX
    if not index.exists():
        return
    doc = read_json(index, INDEX)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise UsageError(f"{index}: no weight_map object")
    for name, file in weight_map.items():
        if name not in tensors or tensors[name].file != file:
            raise UsageError(
                f"{index}: says {name!r} is in {file}, the headers disagree",
                hint="regenerate the index from the shards",
            )


def read_json(path: Path, what: str) -> Any:
    if path.exists() and not path.is_file():
        raise UsageError(f"{what} {path} is not a regular file")
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise UsageError(f"{what} {path} is larger than {MAX_JSON_BYTES >> 20} MiB")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {what} {path}: {exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} {path} is not JSON (line {exc.lineno}: {exc.msg})") from exc
    except RecursionError:
        raise UsageError(f"{what} {path} nests too deeply to be a config") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{what} {path} is not a JSON object")
    return doc


def load_target_config(path: Path) -> dict:
    """The target's config.json (a file, or a folder holding one)."""
    file = path / "config.json" if path.is_dir() else path
    return read_json(file, "the target's config.json")


def is_speculators(config: dict) -> bool:
    return "speculators_model_type" in config or "transformer_layer_config" in config


def sglang_view(config: dict) -> dict:
    """The config SGLang needs for a speculators-format draft (what ``--fix`` writes).

    speculators nests the decoder's LlamaConfig under ``transformer_layer_config`` and keeps
    the aux layer ids at the top level; SGLang reads a flat LlamaConfig with
    ``architectures: [LlamaForCausalLMEagle3]`` and the ids under ``eagle_config``.
    """
    if not is_speculators(config):
        return dict(config)
    layer = config.get("transformer_layer_config") or {}
    layer = dict(layer) if isinstance(layer, dict) else {}  # the checks name what is missing
    out: dict[str, Any] = {k: v for k, v in layer.items() if k != "architectures"}
    out["architectures"] = [SGLANG_ARCH]
    out["model_type"] = layer.get("model_type", "llama")
    for key in ("draft_vocab_size", "target_hidden_size", *SPECULATORS_FLAGS):
        if key in config:
            out[key] = config[key]
    if "tie_word_embeddings" in config:
        out["tie_word_embeddings"] = config["tie_word_embeddings"]
    rope = layer.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" not in out and "rope_theta" in rope:
        out["rope_theta"] = rope[
            "rope_theta"
        ]  # transformers 4.x reads rope_theta, not rope_parameters
        if rope.get("rope_type", "default") != "default":
            out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    eagle = {"use_aux_hidden_state": True}
    if ids:  # as written: the aux check names a value that is not a list of layers
        eagle["eagle_aux_hidden_state_layer_ids"] = list(ids) if isinstance(ids, list) else ids
    out["eagle_config"] = eagle
    dtype = config.get("torch_dtype") or config.get("dtype")
    if dtype:
        out["torch_dtype"] = dtype
    return out


def claimed_rope(config: dict) -> dict:
    """The rope settings a draft's config claims, in either convention."""
    layer = config.get("transformer_layer_config") if is_speculators(config) else config
    layer = layer or {}
    rope = layer.get("rope_parameters") if isinstance(layer.get("rope_parameters"), dict) else {}
    theta = layer.get("rope_theta", rope.get("rope_theta"))
    scaling = layer.get("rope_scaling")
    if scaling is None and rope and rope.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return {"rope_theta": theta, "rope_scaling": scaling}
