"""What the line's SGLang will do with a draft checkpoint, read from its model code.

Two derivations, both by walking the real source with :mod:`patchkit.doctor.interp`:

* :func:`derive_draft` builds the draft class named by the draft's config (e.g.
  ``LlamaForCausalLMEagle3`` in ``models/llama_eagle3.py``) for that config, lists its
  parameters and shapes, runs its ``load_weights`` over the checkpoint's names (renames,
  fused shards, skipped ``t2d``, consumed ``d2t``, names silently dropped) and applies what the
  EAGLE worker does after loading (the target's embedding, and lm_head where the draft has
  none) by walking the model's own ``set_embed`` / ``set_embed_and_head``.
* :func:`derive_capture` walks the target class's ``set_eagle3_layers_to_capture`` (following
  a delegation such as Kimi-K2.5's to its language model) for the draft's layer ids, giving
  the layers the target really captures and the config of the model that captures them.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import PurePosixPath
from typing import Any

from patchkit.compat import tomllib
from patchkit.doctor.interp import (
    ClassInfo,
    Config,
    DerivationError,
    External,
    Function,
    Interpreter,
    LeafClass,
    ModelRaise,
    ModuleObj,
    Opaque,
    ParamSpec,
    SourceModule,
    SuppliedTensor,
    TensorValue,
    UnknownLayer,
    WeightStream,
)
from patchkit.doctor.sources import ModelSource

# transformers' LlamaConfig defaults for what a draft's config.json may leave out (SGLang
# loads EAGLE-3 drafts through AutoConfig, model_type "llama").
LLAMA_DEFAULTS = {
    "model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
    "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
    "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
    "pad_token_id": None, "tie_word_embeddings": False, "rope_theta": 10000.0,
    "rope_scaling": None, "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1,
}  # fmt: skip
CAPTURE_METHOD = "set_eagle3_layers_to_capture"


def _tp_world_size(_interp: Interpreter, *args: Any, **kwargs: Any) -> int:
    return 1  # a checkpoint holds unsharded tensors: read it as one rank would hold them


class _OneRank(Config):
    """SGLang's parallel context (``get_parallel()``, from 0.5.17 on) as one rank sees it:
    every group of size 1 at rank 0; what else it holds (groups, flags) is unknown."""

    def get(self, name: str) -> Any:
        if name.endswith("_size"):
            return 1
        if name.endswith("_rank"):
            return 0
        return Opaque


def _parallel_context(_interp: Interpreter, *args: Any, **kwargs: Any) -> Config:
    return _OneRank({}, name="parallel context")


def _add_prefix(_interp: Interpreter, name: str, prefix: str) -> Any:
    if not isinstance(name, str) or not isinstance(prefix, str):
        return Opaque
    return name if not prefix else f"{prefix}.{name}"


def _deepcopy(_interp: Interpreter, value: Any, *rest: Any) -> Any:
    if isinstance(value, Config):
        return value.copy()
    return Opaque


def _module_list(_interp: Interpreter, items: Any = (), *rest: Any) -> ModuleObj:
    obj = ModuleObj(LeafClass("torch.nn.ModuleList", [], {}))
    if items is Opaque:
        raise DerivationError("nn.ModuleList over an unknown list")
    for i, item in enumerate(items):
        if isinstance(item, ModuleObj):
            obj.children[str(i)] = item
    return obj


def _default_loader(interp: Interpreter, param: Any, weight: Any, *rest: Any) -> None:
    from patchkit.doctor.interp import ParamRef

    if isinstance(param, ParamRef):
        interp.loads.append((param.name, None))


def _get_rope(interp: Interpreter, *args: Any, **kwargs: Any) -> Any:
    """Record what the model hands SGLang's rope factory (head size, base, scaling)."""
    names = ("head_size", "rotary_dim", "max_position", "base", "is_neox_style", "rope_scaling")
    call = dict(zip(names, args, strict=False))
    call.update(kwargs)
    interp.ropes.append(call)
    return Opaque


EXTERNALS = {
    "sglang.srt.layers.rotary_embedding.get_rope": _get_rope,
    "sglang.srt.utils.add_prefix": _add_prefix,
    "sglang.srt.utils.common.add_prefix": _add_prefix,
    "sglang.srt.distributed.get_tensor_model_parallel_world_size": _tp_world_size,
    "sglang.srt.distributed.get_tensor_model_parallel_rank": lambda *_a, **_k: 0,
    "sglang.srt.runtime_context.get_parallel": _parallel_context,
    "sglang.srt.model_loader.weight_utils.default_weight_loader": _default_loader,
    "copy.deepcopy": _deepcopy,
    "torch.nn.ModuleList": _module_list,
}


def load_leaves() -> dict[str, dict]:
    """The primitive-layer descriptions of ``layers.toml``."""
    text = resources.files("patchkit.doctor").joinpath("layers.toml").read_text()
    return tomllib.loads(text)["leaves"]


class SourceTree:
    """The parsed modules of one :class:`ModelSource`, with import resolution."""

    def __init__(self, source: ModelSource):
        self.source = source
        self._modules: dict[str, SourceModule | None] = {}
        self._namespaces: dict[str, dict] = {}
        self._leaf_docs = load_leaves()
        self._leaves: dict[str, LeafClass] = {}

    # -- modules -------------------------------------------------------------------------
    def module(self, dotted: str) -> SourceModule | None:
        if dotted in self._modules:
            return self._modules[dotted]
        found = None
        base = dotted.replace(".", "/")
        for rel in (f"{base}.py", f"{base}/__init__.py"):
            text = self.source.read(rel)
            if text is not None:
                try:
                    tree = ast.parse(text, filename=rel)
                except SyntaxError as exc:
                    raise DerivationError(
                        f"{rel}: cannot parse ({exc.msg}, line {exc.lineno})"
                    ) from None
                found = SourceModule(dotted, PurePosixPath(rel), tree)
                break
        self._modules[dotted] = found
        return found

    def namespace(self, mod: SourceModule) -> dict:
        if mod.name not in self._namespaces:
            ns: dict[str, Any] = {}
            self._namespaces[mod.name] = ns
            self._fill(mod, mod.tree.body, ns)
        return self._namespaces[mod.name]

    def _fill(self, mod: SourceModule, body: list[ast.stmt], ns: dict) -> None:
        for stmt in body:
            if isinstance(stmt, ast.ImportFrom):
                base = stmt.module or ""
                if stmt.level:
                    parts = mod.name.split(".")[: -stmt.level]
                    base = ".".join(parts + ([base] if base else []))
                for alias in stmt.names:
                    ns[alias.asname or alias.name] = External(f"{base}.{alias.name}")
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:
                        ns[alias.asname] = External(alias.name)
                    else:
                        ns[alias.name.split(".")[0]] = External(alias.name.split(".")[0])
            elif isinstance(stmt, ast.ClassDef):
                bases = [self._base(mod, b, ns) for b in stmt.bases]
                ns[stmt.name] = ClassInfo(stmt.name, stmt, mod, bases)
            elif isinstance(stmt, ast.FunctionDef):
                ns[stmt.name] = Function(stmt, mod)
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        ns[target.id] = _literal(stmt.value)
            elif isinstance(stmt, (ast.If, ast.Try)):
                self._fill(mod, stmt.body, ns)

    def _base(self, mod: SourceModule, node: ast.expr, ns: dict) -> Any:
        if isinstance(node, ast.Name) and node.id in ns:
            return self.resolve(ns[node.id])
        if isinstance(node, ast.Attribute):
            dotted = ast.unparse(node)
            head = dotted.split(".")[0]
            if head in ns and isinstance(ns[head], External):
                return self.resolve(External(ns[head].dotted + dotted[len(head) :]))
        return Opaque

    # -- names ---------------------------------------------------------------------------
    def resolve(self, value: Any) -> Any:
        """An imported name, followed into the tree where it is defined there."""
        if not isinstance(value, External):
            return value
        dotted = value.dotted
        if dotted in self._leaf_docs:
            return self.leaf(dotted)
        if dotted in EXTERNALS or not dotted.startswith("sglang."):
            return value
        mod_name, _, name = dotted.rpartition(".")
        mod = self.module(mod_name)
        if mod is None:
            return value
        target = self.namespace(mod).get(name)
        if target is None:
            return value
        if not mod_name.startswith("sglang.srt.models"):
            # Outside the model files only layer classes matter; helpers stay unknown values.
            if isinstance(target, ClassInfo):
                return UnknownLayer(dotted)
            return self.resolve(target) if isinstance(target, External) else value
        return self.resolve(target)

    def leaf(self, dotted: str) -> LeafClass:
        if dotted not in self._leaves:
            doc = self._leaf_docs[dotted]
            signature = doc.get("signature") or self._signature(dotted)
            self._leaves[dotted] = LeafClass(dotted, signature, doc.get("params", {}))
        return self._leaves[dotted]

    def _signature(self, dotted: str) -> list[str]:
        """The constructor's parameter names (``name=default``) of an SGLang layer class."""
        mod_name, _, name = dotted.rpartition(".")
        mod = self.module(mod_name)
        cls = self.namespace(mod).get(name) if mod else None
        if not isinstance(cls, ClassInfo):
            return []  # no constructor to read: the layer takes no arguments we look at
        init = cls.method("__init__")
        if init is None:
            return []
        spec = init.node.args
        positional = spec.posonlyargs + spec.args
        first_default = len(positional) - len(spec.defaults)
        out = []
        for i, arg in enumerate(positional[1:], start=1):
            default = spec.defaults[i - first_default] if i >= first_default else None
            out.append(_sig_entry(arg.arg, default))
        for arg, default in zip(spec.kwonlyargs, spec.kw_defaults, strict=False):
            out.append(_sig_entry(arg.arg, default))
        return out

    def find_class(self, name: str) -> ClassInfo | None:
        """The model class SGLang's registry maps architecture ``name`` to."""
        files = self.source.model_files()
        key = name.lower()
        # Files whose name parts appear in the architecture go first (only an ordering).
        files.sort(key=lambda p: -sum(part in key for part in PurePosixPath(p).stem.split("_")))
        pattern = re.compile(rf"^class {re.escape(name)}\b", re.M)
        for rel in files:
            text = self.source.read(rel)
            if text is None or not pattern.search(text) or "EntryClass" not in text:
                continue
            mod = self.module(rel[:-3].replace("/", "."))
            ns = self.namespace(mod)
            if name in _entry_classes(mod) and isinstance(ns.get(name), ClassInfo):
                return ns[name]
        return None


def _sig_entry(name: str, default: ast.expr | None) -> str:
    if default is None:
        return name
    try:
        value = ast.literal_eval(default)
    except ValueError:
        return f"{name}=None"  # a default we cannot evaluate: treated as absent
    return f"{name}={value!r}"


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, RecursionError):
        return Opaque


def _entry_classes(mod: SourceModule) -> list[str]:
    for stmt in mod.tree.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "EntryClass" for t in stmt.targets
        ):
            value = stmt.value
            elts = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            return [e.id for e in elts if isinstance(e, ast.Name)]
    return []


# ---- the draft ---------------------------------------------------------------------------
@dataclass
class KeyOutcome:
    """What load_weights does with one checkpoint name."""

    key: str
    loads: list[tuple[str, Any]] = field(default_factory=list)  # (parameter, shard id)
    consumed_as: list[str] = field(default_factory=list)  # model attributes it sets
    skipped_by_rule: bool = False  # load_weights skips it on purpose (e.g. t2d)

    @property
    def skipped(self) -> bool:
        """Dropped without a word: neither loaded, consumed nor skipped by a rule."""
        return not self.loads and not self.consumed_as and not self.skipped_by_rule


@dataclass
class DraftExpectation:
    """The draft model as the line's code builds it for one config, and its loading."""

    architecture: str
    module: str
    params: dict[str, ParamSpec]
    outcomes: dict[str, KeyOutcome]
    supplied: dict[str, str]  # parameter -> what replaces it at runtime
    refused: str | None = None
    refused_where: str | None = None
    model_attrs: dict[str, Any] = field(default_factory=dict)
    cls: ClassInfo | None = None
    ropes: list[dict] = field(default_factory=list)  # get_rope() calls while building

    def loaded_params(self) -> dict[str, set]:
        out: dict[str, set] = {}
        for outcome in self.outcomes.values():
            for param, shard in outcome.loads:
                out.setdefault(param, set()).add(shard)
        return out

    def unfilled(self) -> list[str]:
        """Parameters that keep their initial values: neither loaded nor supplied."""
        loaded = self.loaded_params()
        missing = []
        for name, spec in self.params.items():
            if name in self.supplied:
                continue
            got = loaded.get(name)
            if got is None:
                missing.append(name)
            elif spec.shards and None not in got and not set(spec.shards) <= got:
                missing.append(name)
        return missing

    def reads_config(self, attr: str) -> bool:
        """Whether the draft's model code reads ``attr`` from anywhere in its class chain."""
        if self.cls is None:
            return False
        return self.cls.reads_attribute(attr) or any(
            c.reads_attribute(attr) for c in _module_classes(self.cls.module)
        )


def _module_classes(mod: SourceModule) -> list[ClassInfo]:
    return [ClassInfo(s.name, s, mod, []) for s in mod.tree.body if isinstance(s, ast.ClassDef)]


def draft_config(values: dict) -> Config:
    """The draft's config as AutoConfig gives it to SGLang (LlamaConfig defaults filled in)."""
    values = dict(values)
    values.setdefault("num_key_value_heads", values.get("num_attention_heads", 32))
    if values.get("head_dim") is None:
        values.pop("head_dim", None)
        heads = values.get("num_attention_heads", 32)
        values["head_dim"] = values.get("hidden_size", 4096) // heads if heads else None
    return Config(values, LLAMA_DEFAULTS, name="draft config")


def derive_draft(
    tree: SourceTree, config: dict, tensors: dict[str, TensorValue]
) -> DraftExpectation:
    """Build the draft for ``config`` and run its load_weights over ``tensors``' names."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    if not isinstance(arch, str):
        raise DerivationError("the draft's config.json names no architecture")
    cls = tree.find_class(arch)
    if cls is None:
        return DraftExpectation(
            arch, "", {}, {}, {}, refused=f"no model class {arch} in this SGLang tree"
        )
    if not cls.reads_attribute("hot_token_id"):  # EAGLE-3 drafts map d2t to hot_token_id
        return DraftExpectation(
            arch, cls.module.name, {}, {}, {},
            refused=f"{arch} ({cls.module.name}) is not an EAGLE-3 draft model: it keeps no "
            "draft-to-target vocabulary map (hot_token_id)",
        )  # fmt: skip
    interp = Interpreter(tree, EXTERNALS)
    cfg = draft_config(config)
    try:
        model = interp.construct(cls, [cfg], {"quant_config": None, "prefix": ""})
    except ModelRaise as exc:
        return DraftExpectation(arch, cls.module.name, {}, {}, {}, exc.message, exc.where, cls=cls)
    params = dict(model.named_parameters())
    ropes = list(interp.ropes)
    stream = WeightStream(sorted(tensors.items()))
    interp.tracked_self = model
    try:
        interp.call_method(model, "load_weights", [stream], {})
    except ModelRaise as exc:
        return DraftExpectation(
            arch, cls.module.name, params, {}, {}, exc.message, exc.where, cls=cls
        )
    interp.tracked_self = None
    outcomes = {
        key: KeyOutcome(key, got["loads"], got["consumed_as"], got["skipped_by_rule"])
        for key, got in stream.outcomes.items()
    }
    supplied = _after_loading(interp, model, params)
    return DraftExpectation(
        arch, cls.module.name, params, outcomes, supplied,
        model_attrs=dict(model.attrs), cls=cls, ropes=ropes,
    )  # fmt: skip


def _after_loading(interp: Interpreter, model: ModuleObj, params: dict) -> dict[str, str]:
    """What the EAGLE worker puts into the draft after loading (eagle_worker.py): the target's
    embedding and lm_head when the draft loads its head from the target, else the embedding."""
    if model.attrs.get("load_lm_head_from_target") is True:
        call = (
            "set_embed_and_head",
            [SuppliedTensor("target embedding"), SuppliedTensor("target lm_head")],
        )
    else:
        call = ("set_embed", [SuppliedTensor("target embedding")])
    interp.call_method(model, call[0], call[1], {})
    after = dict(model.named_parameters())
    return {
        name: after[name].supplied_by
        for name in params
        if name in after and after[name].supplied_by
    }


# ---- the target --------------------------------------------------------------------------
@dataclass
class CaptureResult:
    """The layers the target captures for EAGLE-3 and the config of the model capturing them."""

    architecture: str
    chain: list[str]  # classes the capture call went through
    layers: list | None  # capture positions (input of layer i), None when nothing is set
    config: Config | None
    error: str | None = None


def target_config(values: dict) -> Config:
    return Config(values, {}, name="target config")


def derive_capture(tree: SourceTree, config: dict, layer_ids: list[int] | None) -> CaptureResult:
    """Walk the target's ``set_eagle3_layers_to_capture(layer_ids)`` as the runner calls it."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs and isinstance(archs[0], str) else None
    if arch is None:
        return CaptureResult("?", [], None, None, "the target config names no architecture")
    cls = tree.find_class(arch)
    if cls is None:
        return CaptureResult(arch, [], None, None, f"no model class {arch} in this SGLang tree")
    interp = Interpreter(tree, EXTERNALS)
    root = _shallow(interp, cls, target_config(config), 0)
    if cls.method(CAPTURE_METHOD) is None:
        return CaptureResult(
            arch, [cls.name], None, None,
            f"{arch} has no {CAPTURE_METHOD}() in this tree: SGLang stops at startup "
            "(AttributeError) when EAGLE-3 asks the target for aux hidden states",
        )  # fmt: skip
    try:
        interp.call_method(root, CAPTURE_METHOD, [list(layer_ids) if layer_ids else None], {})
    except ModelRaise as exc:
        return CaptureResult(arch, [cls.name], None, None, f"{exc.message} ({exc.where})")
    found = _capturing(root, [])
    if found is None:
        return CaptureResult(arch, [cls.name], None, None, "no layers_to_capture was set")
    chain, holder = found
    layers = holder.children["model"].attrs.get("layers_to_capture")
    return CaptureResult(arch, chain, layers, holder.attrs.get("config"))


def _shallow(interp: Interpreter, cls: ClassInfo, config: Config, depth: int) -> ModuleObj:
    """A target model object with only what the capture call touches: its config, its inner
    ``model`` and, for a wrapper, the sub-model it forwards to (built with its sub-config)."""
    obj = ModuleObj(cls)
    obj.attrs["config"] = config
    obj.attrs["pp_group"] = Config({"is_last_rank": True, "is_first_rank": True}, name="pp_group")
    obj.children["model"] = ModuleObj(LeafClass(f"{cls.name}.model", [], {}))
    init = cls.method("__init__")
    if init is None or depth > 3:
        return obj
    first = init.node.args.args[1].arg if len(init.node.args.args) > 1 else "config"
    env = {first: config, "config": config}
    for stmt in ast.walk(init.node):
        if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)):
            continue
        target = stmt.targets[0]
        if not (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
        ):
            continue
        try:
            callee = interp._eval(stmt.value.func, env, init)
        except DerivationError:
            continue
        if not isinstance(callee, ClassInfo) or callee.method(CAPTURE_METHOD) is None:
            continue
        arg = (
            stmt.value.args[0]
            if stmt.value.args
            else next((k.value for k in stmt.value.keywords if k.arg == "config"), None)
        )
        try:
            sub = interp._eval(arg, env, init) if arg is not None else config
        except DerivationError:
            continue
        if isinstance(sub, Config):
            obj.children[target.attr] = _shallow(interp, callee, sub, depth + 1)
    return obj


def _capturing(obj: ModuleObj, chain: list[str]) -> tuple[list[str], ModuleObj] | None:
    chain = [*chain, obj.cls.name if isinstance(obj.cls, ClassInfo) else obj.cls.dotted]
    model = obj.children.get("model")
    if model is not None and "layers_to_capture" in model.attrs:
        return chain, obj
    for name, child in obj.children.items():
        if name != "model" and isinstance(child.cls, ClassInfo):
            found = _capturing(child, chain)
            if found:
                return found
    return None


@dataclass
class GraphOrder:
    """Whether the model runner sets the draft's aux layers before it captures CUDA graphs."""

    before: bool | None  # None: the runner's code does not show either call
    detail: str


RUNNER = "sglang/srt/model_executor/model_runner.py"
SCHEDULER = "sglang/srt/managers/scheduler.py"


def graph_order(tree: SourceTree) -> GraphOrder:
    """Read ``ModelRunner.initialize``: the first call that hands the draft's ids to
    ``set_eagle3_layers_to_capture`` (directly, through a method of the runner or a helper
    function) against the first ``init_device_graphs()``.  Graphs captured first keep the
    target's default layers.  From 0.5.17 the scheduler runs the runner's phases in turn
    (``init_attention_backends()``, then ``init_cuda_graphs()``): their calls are compared."""
    mod = tree.module(RUNNER[:-3].replace("/", "."))
    cls = tree.namespace(mod).get("ModelRunner") if mod else None
    init = cls.method("initialize") if isinstance(cls, ClassInfo) else None
    if init is None:
        return GraphOrder(None, "model_runner.py has no ModelRunner.initialize")
    sets = _setter_test(tree, mod)
    setter, graphs = None, None
    for node in ast.walk(init.node):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name = node.func.attr
        if name == "init_device_graphs":
            graphs = min(graphs or node.lineno, node.lineno)
        elif sets(node) or _reaches(cls, name, 3, sets):
            setter = min(setter or node.lineno, node.lineno)
    if setter is not None and graphs is not None:
        where = f"model_runner.py: layers set at line {setter}, graphs captured at line {graphs}"
        return GraphOrder(setter < graphs, where)
    phased = _phase_order(tree, cls, sets)
    if phased is not None:
        return phased
    return GraphOrder(None, "ModelRunner.initialize shows no aux-layer setting or no graphs")


def _phase_order(tree: SourceTree, cls: ClassInfo, sets) -> GraphOrder | None:
    """The scheduler's calls of the runner's start-up phases (directly or through a method of
    its own, as 0.5.17's ``init_all_attention_backends()``): the first that sets the
    configured layers against the first ``init_cuda_graphs()``, in one scheduler method."""
    mod = tree.module(SCHEDULER[:-3].replace("/", "."))
    if mod is None:
        return None
    methods = {
        f.name: f
        for c in ast.walk(mod.tree)
        if isinstance(c, ast.ClassDef)
        for f in c.body
        if isinstance(f, ast.FunctionDef)
    }

    def kinds(func: ast.FunctionDef, depth: int) -> dict[str, int]:
        first: dict[str, int] = {}
        for node in ast.walk(func):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            name, found = node.func.attr, set()
            if name == "init_cuda_graphs":
                found.add("graphs")
            elif name != "initialize" and _reaches(cls, name, 3, sets):
                found.add("set")
            elif depth and name in methods and methods[name] is not func:
                found |= set(kinds(methods[name], depth - 1))
            for kind in found:
                first[kind] = min(first.get(kind, node.lineno), node.lineno)
        return first

    for func in methods.values():
        first = kinds(func, 1)
        if "set" in first and "graphs" in first:
            where = (
                f"scheduler.py {func.name}: the runner's layers set at line {first['set']}, "
                f"graphs captured at line {first['graphs']}"
            )
            return GraphOrder(first["set"] < first["graphs"], where)
    return None


def _setter_test(tree: SourceTree, mod: SourceModule):
    """A test of one call: does it hand the draft's ids to ``set_eagle3_layers_to_capture``,
    itself or through a function of another module (0.5.17's
    ``configure_aux_hidden_state_capture(..., eagle_aux_hidden_state_layer_ids=...)``)."""
    namespace = tree.namespace(mod)

    def sets(node: ast.Call) -> bool:
        if _sets_configured(node):
            return True
        if not isinstance(node.func, ast.Name) or not _hands_ids(node):
            return False
        helper = namespace.get(node.func.id)
        if isinstance(helper, External):  # followed by hand: resolve() leaves helpers unknown
            where, _, name = helper.dotted.rpartition(".")
            found = tree.module(where) if where.startswith("sglang.") else None
            helper = tree.namespace(found).get(name) if found else None
        return isinstance(helper, Function) and any(
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == CAPTURE_METHOD
            for n in ast.walk(helper.node)
        )

    return sets


def _hands_ids(node: ast.Call) -> bool:
    return any("eagle_aux_hidden_state_layer_ids" in ast.unparse(a) for a in node.args) or any(
        "eagle_aux_hidden_state_layer_ids" in ast.unparse(k.value) for k in node.keywords
    )


def _sets_configured(node: ast.Call) -> bool:
    """``...set_eagle3_layers_to_capture(<the draft's ids>)``; a call without them (a dummy
    run's) sets the defaults and does not count."""
    if not isinstance(node.func, ast.Attribute) or node.func.attr != CAPTURE_METHOD:
        return False
    return _hands_ids(node)


def _reaches(cls: ClassInfo, method: str, depth: int, sets=_sets_configured) -> bool:
    func = cls.method(method)
    if func is None or depth == 0:
        return False
    for node in ast.walk(func.node):
        if isinstance(node, ast.Call):
            if sets(node):
                return True
            if (
                isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "self"
                and node.func.attr != method
                and _reaches(cls, node.func.attr, depth - 1, sets)
            ):
                return True
    return False


# Where the model runner reads the draft's eagle_config: its own module up to 0.5.12, a
# component module it imports from 0.5.17 on.
AUX_IDS_READERS = (
    "sglang/srt/model_executor/model_runner.py",
    "sglang/srt/model_executor/model_runner_components/spec_aux_hidden_state.py",
)


def aux_ids_rule(tree: SourceTree) -> str:
    """Where the model runner takes the draft's aux layer ids from (checked in its source)."""
    for path in AUX_IDS_READERS:
        text = tree.source.read(path) or ""
        if "eagle_config" in text and "eagle_aux_hidden_state_layer_ids" in text:
            return "eagle_config.eagle_aux_hidden_state_layer_ids"
    raise DerivationError(
        "model_runner.py no longer reads eagle_config['eagle_aux_hidden_state_layer_ids']; "
        "the doctor cannot tell which aux layers this line passes to the target"
    )
