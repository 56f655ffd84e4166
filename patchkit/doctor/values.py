"""The values the doctor's interpreter (:mod:`patchkit.doctor.interp`) computes with.

Plain stand-ins for what SGLang's model code handles at runtime: modules and their parameters
(:class:`ModuleObj`, :class:`ParamSpec`), configs (:class:`Config`), checkpoint tensors seen
by shape only (:class:`TensorValue`), the parsed sources' classes and functions, and what a
walk records: the parameters each checkpoint name loads (:class:`WeightStream`), the tensors
the target supplies (:class:`SuppliedTensor`), a refusal (:class:`ModelRaise`).  Nothing here
runs code from the tree.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from patchkit.errors import PatchkitError

if TYPE_CHECKING:
    from patchkit.doctor.interp import Interpreter


class DerivationError(PatchkitError):
    """The line's model code could not be read as far as the check needs."""

    exit_code = 2


class _Opaque:
    """A value the interpreter cannot know (a tensor, a GPU query, a server argument)."""

    _instance: _Opaque | None = None

    def __new__(cls) -> _Opaque:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unknown>"


Opaque = _Opaque()


class Undecidable(Exception):
    """A branch depends on a value the interpreter cannot know."""


@dataclass(eq=False)
class ParamSpec:
    """One parameter: its full (unsharded) shape and, for fused layers, its shards."""

    layer: str
    shape: tuple
    shards: dict[Any, tuple] | None = None
    supplied_by: str | None = None  # e.g. "target": replaced at runtime by the target's tensor


@dataclass(eq=False)
class ModuleObj:
    """An instance of an nn.Module subclass as far as its structure goes."""

    cls: ClassInfo | LeafClass
    children: dict[str, ModuleObj] = field(default_factory=dict)
    params: dict[str, ParamSpec] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)

    def named_parameters(self, prefix: str = "") -> list[tuple[str, ParamSpec]]:
        """torch's order: pre-order over modules, each module's own parameters first; a
        parameter reachable twice (tied weights) is listed once, under its first name."""
        seen: set[int] = set()
        out: list[tuple[str, ParamSpec]] = []

        def walk(mod: ModuleObj, pre: str, stack: set[int]) -> None:
            if id(mod) in stack:
                return
            for name, spec in mod.params.items():
                if id(spec) not in seen:
                    seen.add(id(spec))
                    out.append((pre + name, spec))
            for name, child in mod.children.items():
                walk(child, f"{pre}{name}.", stack | {id(mod)})

        walk(self, prefix, set())
        return out


@dataclass(frozen=True)
class TensorValue:
    """A checkpoint tensor seen by load_weights: its shape and dtype, never its data."""

    shape: tuple
    dtype: str


@dataclass(frozen=True)
class ParamRef:
    name: str
    spec: ParamSpec


@dataclass(frozen=True)
class Loader:
    """``getattr(param, "weight_loader", default_weight_loader)``."""

    param: ParamRef | None


@dataclass(frozen=True)
class External:
    """A name imported from outside the interpreted sources (torch.nn.Linear, add_prefix)."""

    dotted: str


@dataclass
class Function:
    node: ast.FunctionDef
    module: SourceModule
    owner: ClassInfo | None = None


@dataclass
class BoundMethod:
    func: Function
    self_obj: Any


@dataclass
class ClassInfo:
    name: str
    node: ast.ClassDef
    module: SourceModule
    bases: list[Any]

    @property
    def dotted(self) -> str:
        return f"{self.module.name}.{self.name}"

    def mro(self) -> list[ClassInfo]:
        out = [self]
        for base in self.bases:
            if isinstance(base, ClassInfo):
                out += [c for c in base.mro() if c not in out]
        return out

    def method(self, name: str) -> Function | None:
        for cls in self.mro():
            for stmt in cls.node.body:
                if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
                    return Function(stmt, cls.module, cls)
        return None

    def reads_attribute(self, attr: str) -> bool:
        """True when a class in the MRO mentions ``attr`` (``x.attr`` or ``getattr(x, "attr")``)."""
        for cls in self.mro():
            for node in ast.walk(cls.node):
                if isinstance(node, ast.Attribute) and node.attr == attr:
                    return True
                if isinstance(node, ast.Constant) and node.value == attr:
                    return True
        return False


@dataclass
class LeafClass:
    """A layer whose parameters come from layers.toml (SGLang's linear, norm, embedding...)."""

    dotted: str
    signature: list[str]  # parameter names in order; "name=default" gives a default
    params: dict[str, dict]  # param name -> {"shape": [...], "when": expr, "shards": {...}}


@dataclass(frozen=True)
class UnknownLayer:
    """A layer class from outside the model files that layers.toml does not describe."""

    dotted: str


@dataclass
class SuperProxy:
    cls: ClassInfo
    obj: Any


class Config:
    """A HuggingFace-style config: attributes over a dict, with the config class's defaults."""

    def __init__(self, values: dict, defaults: dict | None = None, name: str = "config"):
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_defaults", dict(defaults or {}))
        object.__setattr__(self, "_name", name)

    def get(self, name: str) -> Any:
        if name in self._values:
            value = self._values[name]
        elif name in self._defaults:
            value = copy.deepcopy(self._defaults[name])
        else:
            raise AttributeError(name)
        if isinstance(value, dict) and name.endswith("_config") and name != "eagle_config":
            value = Config(value, name=f"{self._name}.{name}")
            self._values[name] = value
        return value

    def has(self, name: str) -> bool:
        return name in self._values or name in self._defaults

    def set(self, name: str, value: Any) -> None:
        self._values[name] = value

    def copy(self) -> Config:
        return Config(copy.deepcopy(self._values), self._defaults, self._name)


class ModelRaise(Exception):
    """The interpreted code raised: the real model would refuse this config."""

    def __init__(self, message: str, where: str):
        super().__init__(message)
        self.message = message
        self.where = where


@dataclass
class SourceModule:
    """One parsed source file of the tree and its top-level names."""

    name: str
    path: Path
    tree: ast.Module
    namespace: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SuppliedTensor:
    """A tensor SGLang puts in place of a draft parameter at runtime (the target's embedding)."""

    what: str
    shape: tuple = ()


class WeightStream:
    """The ``weights`` iterable handed to load_weights: one entry per checkpoint tensor.

    The interpreter tells it when each entry starts and ends, so that what the body did with
    the entry (parameters loaded, attributes set) is recorded against that name.
    """

    def __init__(self, entries: list[tuple[str, TensorValue]]):
        self.entries = entries
        self.outcomes: dict[str, dict] = {}

    def __iter__(self):
        return iter(self.entries)

    def begin(self, interp: Interpreter, item: tuple[str, TensorValue]) -> None:
        self._current = item[0]
        self.continued = False
        interp.loads = []
        interp.self_sets = []

    def end(self, interp: Interpreter) -> None:
        self.outcomes[self._current] = {
            "loads": list(interp.loads),
            "consumed_as": list(interp.self_sets),
            "skipped_by_rule": self.continued,  # the code chose to skip it (`continue`)
        }
