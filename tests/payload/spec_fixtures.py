"""Fixtures of the speculation tests: the line's SGLang tree and a default ``ServerArgs``.

Two lines: 0.5.9 (torch 2.9 venv; its tree is the payload conftest's ``sglang_tree``, made by
patchkit's own apply) and 0.5.17 (torch 2.11 venv; a wheel base, since 0.5.11+ ship no sdist,
unpacked to the repository layout with ``patches/sglang/0.5.17/series`` applied at zero fuzz).
``PATCHKIT_SPEC_TREE`` names a ready tree instead (the mutation check's planted copies).
What stands in for the GPU parts is in ``standins/spec_runtime.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import json
import os
import socket
import sys
from pathlib import Path

import pytest

SPEC_TREE_ENV = "PATCHKIT_SPEC_TREE"
PATCHES = Path(__file__).resolve().parents[2] / "patches"
STANDINS = Path(__file__).resolve().parent / "standins"


def _put_first_on_path(directory: Path) -> None:
    path = str(directory)
    if path in sys.path:
        sys.path.remove(path)
    sys.path.insert(0, path)


LINE_TORCH = {"0.5.17": "2.11.", "0.5.23": "2.14.", "0.5.9": "2.9."}


def running_line() -> str:
    """The SGLang line the running torch belongs to (each line has its own venv)."""
    try:
        import torch
    except ImportError:
        return "0.5.9"
    for line, prefix in LINE_TORCH.items():
        if torch.__version__.startswith(prefix):
            return line
    return "0.5.9"


def line_tree() -> Path:
    """The tree ``PATCHKIT_SPEC_TREE`` names (the mutation check's planted copies)."""
    return Path(os.environ[SPEC_TREE_ENV])


def use_line_tree(line: str) -> Path | None:
    """Put the line's tree first on ``sys.path`` (with the stand-ins); skip unless the
    running torch is the line's. The 0.5.9 tree comes from the payload conftest's
    ``sglang_tree`` (patchkit's apply of the series) unless ``PATCHKIT_SPEC_TREE`` names one."""
    torch = pytest.importorskip("torch")
    if not torch.__version__.startswith(LINE_TORCH[line]):
        pytest.skip(f"the {line} line runs under torch {LINE_TORCH[line]}x")
    _put_first_on_path(STANDINS)
    if not os.environ.get(SPEC_TREE_ENV):
        return None  # the payload conftest's tree (patchkit's own apply of the line) is in use
    loaded = sys.modules.get("sglang")
    root = line_tree()
    if loaded is not None and not str(loaded.__file__).startswith(str(root)):
        pytest.skip(f"another sglang tree is already imported: {loaded.__file__}")
    _put_first_on_path(root / "python")
    return root


def spec_tree(request, line: str) -> Path | None:
    """The line's tree for a test (see ``use_line_tree``): the payload conftest's
    ``sglang_tree`` of the line under test, unless ``PATCHKIT_SPEC_TREE`` names a tree."""
    if not os.environ.get(SPEC_TREE_ENV):
        under_test = os.environ.get("PATCHKIT_PAYLOAD_LINE") or "0.5.9"  # conftest's LINE_ENV
        if under_test != line:
            pytest.skip(f"the payload tier runs line {under_test}, not {line}")
        request.getfixturevalue("sglang_tree")
    return use_line_tree(line)


def bare_server_args(cls, values: dict):
    """A real ``ServerArgs`` holding ``values`` over its defaults, unresolved.

    Up to 0.5.22 ``ServerArgs`` is a dataclass whose ``__post_init__`` resolves everything
    (it probes GPUs and model files): it is skipped.  From 0.5.23 it is a msgspec Struct whose
    construction resolves nothing (``resolve_once`` does, later): it is constructed.
    """
    if hasattr(cls, "__struct_fields__"):
        return cls(**{k: v for k, v in values.items() if k in cls.__struct_fields__})
    args = object.__new__(cls)
    for field in dataclasses.fields(cls):
        if field.name in values:
            value = values[field.name]
        elif field.default is not dataclasses.MISSING:
            value = field.default
        else:
            value = field.default_factory()
        setattr(args, field.name, value)
    return args


def default_server_args(server_args_module, model_dir: Path | None = None):
    """A real default ``ServerArgs`` (unresolved: ``bare_server_args``), installed as SGLang's
    global server args.  From 0.5.23 publishing resolves the arguments, which reads the model's
    config: pass a tiny model folder (``write_model_dir``) there; earlier lines take a name."""
    values = {"model_path": str(model_dir or "patchkit/payload-test-model")}
    if hasattr(server_args_module.ServerArgs, "__struct_fields__"):
        values["device"] = "cpu"  # the resolution that publishing runs probes the device
    args = bare_server_args(server_args_module.ServerArgs, values)
    server_args_module.set_global_server_args_for_scheduler(args)
    return args


# The speculation server-argument tests of both lines: a tiny Llama target (a config only, no
# weights are read) and an EAGLE-3 chain command line.
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "torch_dtype": "bfloat16",
}
EAGLE3_TOPK1 = [
    "--speculative-algorithm", "EAGLE3",
    "--speculative-num-steps", "2",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "3",
]  # fmt: skip
THRESHOLD_FLAG = "--speculative-disable-batch-threshold"


def write_model_dir(directory: Path) -> Path:
    """A model folder holding only ``LLAMA_CONFIG``."""
    (directory / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    return directory


def parse_server_args(model_dir: Path, argv: list[str]):
    """``ServerArgs`` from a command line through the real ``add_cli_args`` parser, without
    ``__post_init__`` (it probes GPUs and model files); the target and draft are
    ``model_dir``."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    cli = ["--model-path", str(model_dir), "--speculative-draft-model-path", str(model_dir)]
    namespace = parser.parse_args([*cli, *argv])
    args = bare_server_args(ServerArgs, vars(namespace))
    # Filled in by __post_init__ handlers that run before the speculative one.
    args.page_size = args.page_size or 1
    return args


@contextlib.contextmanager
def real_eagle3(model_dir: Path):
    """The tree's real ``LlamaForCausalLMEagle3`` class, constructible on the CPU in a
    one-rank gloo group (made once per process and kept), with the rotary embedding on its
    CPU path while in use."""
    from sglang.srt import server_args as server_args_module
    from sglang.srt.distributed import parallel_state

    default_server_args(server_args_module, write_model_dir(model_dir))
    # One one-rank world per process, kept to its end: another module's fixture of the same
    # worker may have made it, and 0.5.9's destroy_model_parallel leaves the attention group.
    if not parallel_state.model_parallel_is_initialized():
        _one_rank_groups(parallel_state)
    saved = []  # the rotary embedding picks a CUDA kernel off CPU; it holds no parameters
    for name in ("sglang.srt.layers.rotary_embedding.base", "sglang.srt.layers.rotary_embedding"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "_is_cpu"):
            saved.append((module, module._is_cpu))
            module._is_cpu = True
            break
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    try:
        yield LlamaForCausalLMEagle3
    finally:
        for module, value in saved:
            module._is_cpu = value


def _one_rank_groups(parallel_state) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    parallel_state.init_distributed_environment(
        world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
        local_rank=0, backend="gloo",
    )  # fmt: skip
    if (
        "tensor_model_parallel_size"
        in inspect.signature(parallel_state.initialize_model_parallel).parameters
    ):
        parallel_state.initialize_model_parallel(1, 1)
        return
    # 0.5.23 on: the widths come from the published server args; this rank is 0
    parallel_state.initialize_model_parallel(backend="gloo")
    from sglang.srt import runtime_context

    ranks = [f for f in runtime_context._parallel_fields() if f.endswith("_rank")]
    runtime_context.get_parallel().override_permanently(**dict.fromkeys(ranks, 0))
