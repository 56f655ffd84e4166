"""A realistic monolithic `sglang.patch` made from the real SGLang 0.5.9 tree.

Three concerns (SM120 all-reduce, Kimi-K2.5 EAGLE-3, the speculative threshold) and a dozen
unrelated edits across 27 files, edited at real functions found with `ast`; server_args.py is
touched by two concerns, in two functions. The edited tree is committed in a throw-away clone, so
its tree id is an oracle independent of patchkit.
"""

from __future__ import annotations

import ast
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import git

SRT = "python/sglang/srt"
SERVER_ARGS = f"{SRT}/server_args.py"
NEW_FILE = f"{SRT}/layers/sm120_utils.py"

# concern -> [(path, function or None for module level)]
CONCERNS: dict[str, list[tuple[str, str | None]]] = {
    "sm120-allreduce": [
        (SERVER_ARGS, "ServerArgs._handle_gpu_memory_settings"),
        (f"{SRT}/distributed/device_communicators/all_reduce_utils.py", None),
        (
            f"{SRT}/distributed/device_communicators/torch_symm_mem.py",
            "TorchSymmMemCommunicator.__init__",
        ),
        (
            f"{SRT}/distributed/device_communicators/custom_all_reduce.py",
            "CustomAllreduce.__init__",
        ),
        (f"{SRT}/distributed/device_communicators/pynccl.py", "PyNcclCommunicator.__init__"),
        (f"{SRT}/distributed/parallel_state.py", "GroupCoordinator.all_reduce"),
        (f"{SRT}/layers/communicator.py", None),
        (f"{SRT}/layers/flashinfer_comm_fusion.py", None),
    ],
    "kimi-k25-eagle3": [
        (f"{SRT}/models/kimi_k25.py", "KimiK25ForConditionalGeneration.load_weights"),
        (f"{SRT}/models/deepseek_v2.py", "DeepseekV2Model.forward"),
        (f"{SRT}/models/llama_eagle3.py", "LlamaForCausalLMEagle3.__init__"),
    ],
    "speculative-threshold": [
        (SERVER_ARGS, "ServerArgs._handle_speculative_decoding"),
        (f"{SRT}/speculative/eagle_worker.py", "EAGLEWorker.forward_batch_generation"),
        (f"{SRT}/speculative/eagle_worker_v2.py", "EAGLEWorkerV2.forward_batch_generation"),
        (f"{SRT}/speculative/spec_info.py", None),
    ],
    "misc": [
        (f"{SRT}/managers/scheduler.py", "Scheduler.__init__"),
        (f"{SRT}/managers/tokenizer_manager.py", "TokenizerManager.__init__"),
        (f"{SRT}/managers/io_struct.py", None),
        (f"{SRT}/mem_cache/radix_cache.py", "RadixCache.__init__"),
        (f"{SRT}/mem_cache/memory_pool.py", None),
        (f"{SRT}/layers/moe/fused_moe_triton/layer.py", "FusedMoE.__init__"),
        (f"{SRT}/layers/quantization/fp8.py", None),
        (f"{SRT}/layers/attention/flashinfer_backend.py", "FlashInferAttnBackend.__init__"),
        (f"{SRT}/model_executor/model_runner.py", "ModelRunner.initialize"),
        (f"{SRT}/model_executor/cuda_graph_runner.py", "CudaGraphRunner.__init__"),
        (f"{SRT}/entrypoints/http_server.py", None),
        ("python/pyproject.toml", None),
    ],
}

MAPPING = f"""\
# Which hunks belong to which patch (series order).
[[patch]]
name = "sm120-allreduce"
subject = "SM120 all-reduce: fusion gate and symmetric-memory tables"
description = "The SM120 all-reduce paths of our stack."
paths = ["{SRT}/distributed/*", "{SRT}/layers/communicator.py",
         "{SRT}/layers/flashinfer_comm_fusion.py", "{NEW_FILE}"]
hunks = ["{SERVER_ARGS}::ServerArgs._handle_gpu_memory_settings"]

[[patch]]
name = "kimi-k25-eagle3"
paths = ["{SRT}/models/kimi_k25.py", "{SRT}/models/deepseek_v2.py", "{SRT}/models/llama_eagle3.py"]

[[patch]]
name = "speculative-threshold"
subject = "Speculative decoding: disable above a batch-size threshold"
paths = ["{SRT}/speculative/*"]
hunks = ["{SERVER_ARGS}::ServerArgs._handle_speculative_*"]
"""


@dataclass
class Monolith:
    """The edited tree, its commit, and the monolithic diff against the base."""

    base: str  # the sdist import commit of 0.5.9
    tree: Path  # a work tree with the edits committed
    commit: str
    tree_id: str
    diff: Path
    files: list[str]


def edit_function(path: Path, qualname: str | None, concern: str) -> None:
    """Insert two real lines at the top of a function's body (after its docstring), or append
    a module-level constant when `qualname` is None."""
    text = path.read_text()
    if path.suffix != ".py":
        path.write_text(text + f"# {concern}: pinned for the CUDA 13 stack\n")
        return
    if qualname is None:
        ident = concern.replace("-", "_").upper()
        path.write_text(text + f"\n\n# {concern}: set by our deployment\n{ident}_ENABLED = True\n")
        return
    node = _find(ast.parse(text), qualname)
    body = node.body
    first = body[1] if _is_docstring(body[0]) and len(body) > 1 else body[0]
    lines = text.split("\n")
    indent = " " * first.col_offset
    at = first.lineno - 1
    marker = concern.replace("-", "_")
    lines[at:at] = [f"{indent}# {concern}: see the patch description", f"{indent}_{marker} = True"]
    path.write_text("\n".join(lines))


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _find(tree: ast.AST, qualname: str) -> ast.AST:
    node = tree
    for part in qualname.split("."):
        node = next(
            c
            for c in ast.iter_child_nodes(node)
            if isinstance(c, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and c.name == part
        )
    return node


def build_monolith(mirror: Path, base: str, dest: Path) -> Monolith:
    """Edit the real tree concern by concern, commit it, and write `git diff base` to a file."""
    tree = dest / "tree"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-checkout", str(mirror), str(tree)],
        check=True,
        capture_output=True,
    )
    git(tree, "checkout", "-q", base)
    files = []
    for concern, edits in CONCERNS.items():
        for path, qual in edits:
            edit_function(tree / path, qual, concern)
            files.append(path)
    (tree / NEW_FILE).write_text(
        '"""SM120 (RTX PRO 6000 Blackwell) helpers."""\n\n\n'
        "def is_sm120(major: int, minor: int) -> bool:\n"
        "    return major == 12\n"
    )
    files.append(NEW_FILE)
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "our changes")
    diff = dest / "sglang.patch"
    diff.write_bytes(
        subprocess.run(
            ["git", "diff", base, "HEAD"], cwd=tree, check=True, capture_output=True
        ).stdout
    )
    return Monolith(
        base=base,
        tree=tree,
        commit=git(tree, "rev-parse", "HEAD").strip(),
        tree_id=git(tree, "rev-parse", "HEAD^{tree}").strip(),
        diff=diff,
        files=sorted(set(files)),
    )


@pytest.fixture(scope="session")
def monolith(tmp_path_factory, warm_mirrors, workspace) -> Monolith:
    from patchkit import gitops
    from patchkit.upstream import SDIST_REF, Mirror

    mirror = Mirror(workspace.target("sglang"), warm_mirrors).path
    base = gitops.resolve(gitops.Repo.bare_at(mirror), SDIST_REF.format(version="0.5.9"))
    return build_monolith(mirror, base, tmp_path_factory.mktemp("monolith"))


@pytest.fixture
def mapping_file(tmp_path) -> Path:
    path = tmp_path / "import-map.toml"
    path.write_text(MAPPING)
    return path
