"""A small, closed interpreter for the parts of SGLang's model code the doctor reads.

The doctor must know what SGLang's real model code will do with a checkpoint without importing
torch or SGLang: it parses the line's model sources with ``ast`` and walks the ``__init__`` of
the draft model (which parameters exist, with which shapes, for this config) and its
``load_weights`` (which checkpoint name lands in which parameter, which is consumed, which is
silently skipped).  Only a fixed set of node types is understood; anything else is reported
as a :class:`DerivationError` naming the file and line, so a change upstream surfaces as a
clear error rather than a silently wrong expectation.  Nothing from the tree is executed:
values are plain Python data (:mod:`patchkit.doctor.values`), unknown calls give
:data:`Opaque` values.  Statements are run by ``_exec`` and expressions evaluated by ``_eval``,
each through a table of handlers by node type.
"""

from __future__ import annotations

import ast
import copy
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from patchkit.doctor.values import (
    BoundMethod,
    ClassInfo,
    Config,
    DerivationError,
    External,
    Function,
    LeafClass,
    Loader,
    ModelRaise,
    ModuleObj,
    Opaque,
    ParamRef,
    ParamSpec,
    SourceModule,
    SuperProxy,
    SuppliedTensor,
    TensorValue,
    Undecidable,
    UnknownLayer,
    WeightStream,
)

__all__ = [  # the values are re-exported: callers import them with the interpreter
    "BoundMethod", "ClassInfo", "Config", "DerivationError", "External", "Function",
    "Interpreter", "LeafClass", "Loader", "ModelRaise", "ModuleObj", "Opaque", "ParamRef",
    "ParamSpec", "SourceModule", "SuperProxy", "SuppliedTensor", "TensorValue",
    "Undecidable", "UnknownLayer", "WeightStream",
]  # fmt: skip

MAX_DEPTH = 40


class _Signal(Exception):
    pass


class _Return(_Signal):
    def __init__(self, value: Any):
        self.value = value


class _Break(_Signal):
    pass


class _Continue(_Signal):
    pass


_BINOPS: dict[type, Callable] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}  # fmt: skip
_CMPOPS: dict[type, Callable] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}  # fmt: skip
_SAFE_METHODS = {
    str: {"replace", "startswith", "endswith", "split", "rsplit", "lower", "upper", "strip",
          "format", "join", "removeprefix", "removesuffix", "count", "find"},
    dict: {"get", "items", "keys", "values", "pop", "setdefault", "update", "copy"},
    list: {"append", "extend", "index", "pop", "insert", "copy", "count"},
    tuple: {"index", "count"},
}  # fmt: skip
_SAFE_BUILTINS = {
    "len": len, "range": range, "int": int, "float": float, "str": str, "bool": bool,
    "min": min, "max": max, "list": list, "tuple": tuple, "dict": dict, "enumerate": enumerate,
    "zip": zip, "sum": sum, "any": any, "all": all, "abs": abs, "sorted": sorted, "set": set,
    "reversed": reversed,
}  # fmt: skip


class Interpreter:
    """Walks functions of a :class:`SourceTree` on plain values.

    ``externals`` maps dotted names of things outside the interpreted sources to Python
    callables (``add_prefix``, the tensor-parallel world size of 1 a checkpoint is seen in).
    SGLang's primitive layers come from the tree's resolver as :class:`LeafClass` values.
    ``on_self_set`` is told of attribute assignments on the object a method runs on.
    """

    def __init__(self, tree, externals: dict[str, Callable]):
        self.tree = tree
        self.externals = externals
        self.depth = 0
        self.loads: list[tuple[str, Any]] = []  # (param name, shard) of the key in progress
        self.self_sets: list[str] = []
        self.tracked_self: Any = None
        self.ropes: list[dict] = []

    # ---- entry points -------------------------------------------------------------------
    def construct(self, cls: ClassInfo, args: list, kwargs: dict) -> ModuleObj:
        return self._instantiate(cls, args, kwargs)

    def call_method(self, obj: ModuleObj, name: str, args: list, kwargs: dict) -> Any:
        func = obj.cls.method(name) if isinstance(obj.cls, ClassInfo) else None
        if func is None:
            raise DerivationError(f"{obj.cls.dotted} has no method {name}()")
        return self._call_function(func, [obj, *args], kwargs)

    # ---- calls ---------------------------------------------------------------------------
    def _instantiate(self, cls: ClassInfo, args: list, kwargs: dict) -> ModuleObj:
        obj = ModuleObj(cls)
        init = cls.method("__init__")
        if init is not None:
            self._call_function(init, [obj, *args], kwargs)
        return obj

    def _call_function(self, func: Function, args: list, kwargs: dict) -> Any:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise DerivationError(f"{func.module.path}: calls nest deeper than {MAX_DEPTH}")
        try:
            env = self._bind(func, args, kwargs)
            env["__class__"] = func.owner
            try:
                self._exec_block(func.node.body, env, func)
            except _Return as ret:
                return ret.value
            return None
        finally:
            self.depth -= 1

    def _bind(self, func: Function, args: list, kwargs: dict) -> dict:
        spec = func.node.args
        names = [a.arg for a in spec.posonlyargs + spec.args]
        defaults = spec.defaults
        env: dict[str, Any] = {}
        first_default = len(names) - len(defaults)
        for i, name in enumerate(names):
            if i < len(args):
                env[name] = args[i]
            elif name in kwargs:
                env[name] = kwargs.pop(name)
            elif i >= first_default:
                env[name] = self._eval(defaults[i - first_default], {}, func)
            else:
                raise DerivationError(
                    f"{func.module.path}:{func.node.lineno}: {func.node.name}() called "
                    f"without {name!r}"
                )
        if spec.vararg:
            env[spec.vararg.arg] = tuple(args[len(names) :])
        for arg, default in zip(spec.kwonlyargs, spec.kw_defaults, strict=False):
            if arg.arg in kwargs:
                env[arg.arg] = kwargs.pop(arg.arg)
            elif default is not None:
                env[arg.arg] = self._eval(default, {}, func)
            else:
                env[arg.arg] = Opaque
        if spec.kwarg:
            env[spec.kwarg.arg] = dict(kwargs)
        return env

    def _call(self, fn: Any, args: list, kwargs: dict, node: ast.AST, func: Function) -> Any:
        if isinstance(fn, ClassInfo):
            return self._instantiate(fn, args, kwargs)
        if isinstance(fn, LeafClass):
            return self._leaf(fn, args, kwargs, node, func)
        if isinstance(fn, UnknownLayer):
            raise DerivationError(
                f"{self._where(node, func)}: the model builds {fn.dotted}, a layer "
                "patchkit/doctor/layers.toml does not describe; add its parameters there"
            )
        if isinstance(fn, BoundMethod):
            return self._call_function(fn.func, [fn.self_obj, *args], kwargs)
        if isinstance(fn, Function):
            return self._call_function(fn, args, kwargs)
        if isinstance(fn, Loader):
            param = args[0] if args else fn.param
            if isinstance(param, ParamRef):
                shard = (
                    args[2]
                    if len(args) > 2
                    else kwargs.get("shard_id", kwargs.get("loaded_shard_id"))
                )
                self.loads.append((param.name, shard))
            return None
        if isinstance(fn, External):
            impl = self.externals.get(fn.dotted)
            if impl is not None:
                return impl(self, *args, **kwargs)
            return Opaque
        if fn is Opaque:
            return Opaque
        if callable(fn) and getattr(fn, "__self__", None) is not None:
            return fn(*args, **kwargs)  # a whitelisted method of a plain value
        if fn in _SAFE_BUILTINS.values():
            if any(a is Opaque for a in args):
                return Opaque
            return fn(*args, **kwargs)
        raise DerivationError(f"{self._where(node, func)}: cannot call {fn!r}")

    def _leaf(self, leaf: LeafClass, args: list, kwargs: dict, node, func) -> ModuleObj:
        bound: dict[str, Any] = {}
        for i, entry in enumerate(leaf.signature):
            name, _, default = entry.partition("=")
            if i < len(args):
                bound[name] = args[i]
            elif name in kwargs:
                bound[name] = kwargs[name]
            elif default:
                bound[name] = ast.literal_eval(default)
            else:
                raise DerivationError(
                    f"{self._where(node, func)}: {leaf.dotted} constructed without {name!r}"
                )
        obj = ModuleObj(leaf)
        for pname, rule in leaf.params.items():
            when = rule.get("when")
            if when and not self._truth(self._eval_text(when, bound), node, func):
                continue
            shards = None
            if "shards" in rule:
                shards = {
                    _shard_key(k): tuple(self._eval_text(e, bound) for e in dims)
                    for k, dims in rule["shards"].items()
                }
            if "shards_from" in rule:  # one shard per element of a list argument
                sizes = self._eval_text(rule["shards_from"], bound)
                rest = tuple(self._eval_text(e, bound) for e in rule["shard_dims"])
                shards = (
                    {i: (size, *rest) for i, size in enumerate(sizes)}
                    if isinstance(sizes, list)
                    else None
                )
            shape = tuple(self._eval_text(e, bound) for e in rule["shape"])
            obj.params[pname] = ParamSpec(leaf.dotted, shape, shards)
        return obj

    def _eval_text(self, text: str, env: dict) -> Any:
        return self._eval(ast.parse(text, mode="eval").body, env, None)

    # ---- statements ----------------------------------------------------------------------
    def _exec_block(self, body: list[ast.stmt], env: dict, func: Function) -> None:
        for stmt in body:
            self._exec(stmt, env, func)

    def _exec(self, stmt: ast.stmt, env: dict, func: Function) -> None:
        handler = _by_type(self._STATEMENTS, stmt)
        if handler is None:
            raise DerivationError(
                f"{self._where(stmt, func)}: cannot read a {type(stmt).__name__} statement"
            )
        handler(self, stmt, env, func)

    def _exec_expr(self, stmt: ast.Expr, env: dict, func: Function) -> None:
        self._eval(stmt.value, env, func)

    def _exec_assign(self, stmt: ast.Assign, env: dict, func: Function) -> None:
        value = self._eval(stmt.value, env, func)
        for target in stmt.targets:
            self._assign(target, value, env, func)

    def _exec_annassign(self, stmt: ast.AnnAssign, env: dict, func: Function) -> None:
        if stmt.value is not None:
            self._assign(stmt.target, self._eval(stmt.value, env, func), env, func)

    def _exec_augassign(self, stmt: ast.AugAssign, env: dict, func: Function) -> None:
        current = self._eval(_as_load(stmt.target), env, func)
        value = self._binop(stmt.op, current, self._eval(stmt.value, env, func))
        self._assign(stmt.target, value, env, func)

    def _exec_if(self, stmt: ast.If, env: dict, func: Function) -> None:
        try:
            chosen = self._truth(self._eval(stmt.test, env, func), stmt, func)
        except Undecidable:
            if _touches_state(stmt):
                raise DerivationError(
                    f"{self._where(stmt, func)}: branch on an unknown value "
                    f"({ast.unparse(stmt.test)[:80]}) decides the model's structure"
                ) from None
            return
        self._exec_block(stmt.body if chosen else stmt.orelse, env, func)

    def _exec_return(self, stmt: ast.Return, env: dict, func: Function) -> None:
        raise _Return(self._eval(stmt.value, env, func) if stmt.value else None)

    def _exec_raise(self, stmt: ast.Raise, env: dict, func: Function) -> None:
        raise ModelRaise(self._raise_text(stmt, env, func), self._where(stmt, func))

    def _exec_continue(self, stmt: ast.Continue, env: dict, func: Function) -> None:
        raise _Continue()

    def _exec_break(self, stmt: ast.Break, env: dict, func: Function) -> None:
        raise _Break()

    def _exec_delete(self, stmt: ast.Delete, env: dict, func: Function) -> None:
        for target in stmt.targets:
            self._delete(target, env, func)

    def _exec_body(self, stmt: ast.With | ast.Try, env: dict, func: Function) -> None:
        """``with`` and ``try``: the body runs; handlers and context managers are not read."""
        self._exec_block(stmt.body, env, func)

    def _exec_import(self, stmt: ast.Import | ast.ImportFrom, env: dict, func: Function) -> None:
        for alias in stmt.names:
            base = stmt.module if isinstance(stmt, ast.ImportFrom) else None
            dotted = f"{base}.{alias.name}" if base else alias.name
            env[alias.asname or alias.name.split(".")[0]] = External(dotted)

    def _exec_nothing(self, stmt: ast.stmt, env: dict, func: Function) -> None:
        """``pass``, ``assert``, ``global``, ``nonlocal``: nothing the derivation follows."""

    def _exec_def(self, stmt: ast.FunctionDef, env: dict, func: Function) -> None:
        env[stmt.name] = Function(stmt, func.module, func.owner)

    def _for(self, stmt: ast.For, env: dict, func: Function) -> None:
        iterable = self._eval(stmt.iter, env, func)
        if iterable is Opaque:
            raise DerivationError(f"{self._where(stmt, func)}: loop over an unknown value")
        broke = False
        for item in iterable:
            if isinstance(iterable, WeightStream):
                iterable.begin(self, item)
            self._assign(stmt.target, item, env, func)
            try:
                self._exec_block(stmt.body, env, func)
            except _Continue:
                if isinstance(iterable, WeightStream):
                    iterable.continued = True
                continue
            except _Break:
                broke = True
                break
            finally:
                if isinstance(iterable, WeightStream):
                    iterable.end(self)
        if not broke:
            self._exec_block(stmt.orelse, env, func)

    def _raise_text(self, stmt: ast.Raise, env: dict, func: Function) -> str:
        exc = stmt.exc
        if isinstance(exc, ast.Call) and exc.args:
            try:
                value = self._eval(exc.args[0], env, func)
                if isinstance(value, str):
                    return value
            except (DerivationError, Undecidable):
                pass
        return ast.unparse(exc) if exc is not None else "re-raise"

    def _assign(self, target: ast.expr, value: Any, env: dict, func: Function) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            if value is Opaque:
                values = [Opaque] * len(target.elts)
            else:
                values = list(value)
            if len(values) != len(target.elts):
                raise DerivationError(f"{self._where(target, func)}: unpacking mismatch")
            for elt, val in zip(target.elts, values, strict=False):
                self._assign(elt, val, env, func)
        elif isinstance(target, ast.Attribute):
            obj = self._eval(target.value, env, func)
            self._setattr(obj, target.attr, value)
        elif isinstance(target, ast.Subscript):
            obj = self._eval(target.value, env, func)
            key = self._eval(target.slice, env, func)
            if isinstance(obj, (dict, list)) and key is not Opaque:
                obj[key] = value
            elif isinstance(obj, Config) and isinstance(key, str):
                obj.set(key, value)
        elif isinstance(target, ast.Starred):
            raise DerivationError(f"{self._where(target, func)}: cannot read starred assignment")

    def _setattr(self, obj: Any, name: str, value: Any) -> None:
        if isinstance(obj, ModuleObj):
            if obj is self.tracked_self:
                self.self_sets.append(name)
            obj.attrs.pop(name, None)
            if isinstance(value, ModuleObj):
                obj.params.pop(name, None)
                obj.children[name] = value
            elif isinstance(value, ParamSpec):
                obj.children.pop(name, None)
                obj.params[name] = value
            elif isinstance(value, SuppliedTensor):
                obj.params[name] = ParamSpec(value.what, value.shape, None, supplied_by=value.what)
            else:
                obj.children.pop(name, None)
                obj.params.pop(name, None)
                obj.attrs[name] = value
        elif isinstance(obj, Config):
            obj.set(name, value)

    def _delete(self, target: ast.expr, env: dict, func: Function) -> None:
        if isinstance(target, ast.Attribute):
            obj = self._eval(target.value, env, func)
            if isinstance(obj, ModuleObj):
                for store in (obj.params, obj.children, obj.attrs):
                    store.pop(target.attr, None)

    # ---- expressions ---------------------------------------------------------------------
    def _eval(self, node: ast.expr, env: dict, func: Function | None) -> Any:
        handler = _by_type(self._EXPRESSIONS, node)
        if handler is None:
            raise DerivationError(f"{self._where(node, func)}: cannot read a {type(node).__name__}")
        return handler(self, node, env, func)

    def _eval_constant(self, node: ast.Constant, env: dict, func: Function | None) -> Any:
        return node.value

    def _eval_name(self, node: ast.Name, env: dict, func: Function | None) -> Any:
        return self._lookup(node.id, env, func, node)

    def _eval_attribute(self, node: ast.Attribute, env: dict, func: Function | None) -> Any:
        return self._getattr(self._eval(node.value, env, func), node.attr, node, func)

    def _eval_subscript(self, node: ast.Subscript, env: dict, func: Function | None) -> Any:
        obj = self._eval(node.value, env, func)
        key = self._eval(node.slice, env, func)
        if obj is Opaque or key is Opaque:
            return Opaque
        if isinstance(obj, Config):
            return obj.get(key)
        try:
            return obj[key]
        except (KeyError, IndexError, TypeError) as exc:
            raise DerivationError(f"{self._where(node, func)}: {exc!r}") from None

    def _eval_slice(self, node: ast.Slice, env: dict, func: Function | None) -> Any:
        parts = [
            self._eval(p, env, func) if p else None for p in (node.lower, node.upper, node.step)
        ]
        return slice(*parts)

    def _eval_binop(self, node: ast.BinOp, env: dict, func: Function | None) -> Any:
        return self._binop(
            node.op, self._eval(node.left, env, func), self._eval(node.right, env, func)
        )

    def _eval_unaryop(self, node: ast.UnaryOp, env: dict, func: Function | None) -> Any:
        value = self._eval(node.operand, env, func)
        if isinstance(node.op, ast.Not):
            try:
                return not self._truth(value, node, func)
            except Undecidable:
                return Opaque
        if value is Opaque:
            return Opaque
        return {ast.USub: operator.neg, ast.UAdd: operator.pos}[type(node.op)](value)

    def _eval_ifexp(self, node: ast.IfExp, env: dict, func: Function | None) -> Any:
        try:
            chosen = self._truth(self._eval(node.test, env, func), node, func)
        except Undecidable:
            return Opaque
        return self._eval(node.body if chosen else node.orelse, env, func)

    def _eval_sequence(self, node: ast.expr, env: dict, func: Function | None) -> Any:
        items = [self._eval(e, env, func) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items

    def _eval_dict(self, node: ast.Dict, env: dict, func: Function | None) -> Any:
        return {
            self._eval(k, env, func): self._eval(v, env, func)
            for k, v in zip(node.keys, node.values, strict=False)
        }

    def _eval_joinedstr(self, node: ast.JoinedStr, env: dict, func: Function | None) -> Any:
        parts = []
        for value in node.values:
            part = (
                self._eval(value.value, env, func)
                if isinstance(value, ast.FormattedValue)
                else value.value
            )
            if part is Opaque:
                return Opaque
            parts.append(str(part))
        return "".join(parts)

    def _eval_lambda(self, node: ast.Lambda, env: dict, func: Function | None) -> Any:
        return Opaque

    def _lookup(self, name: str, env: dict, func: Function | None, node: ast.AST) -> Any:
        if name in env:
            return env[name]
        if func is not None:
            ns = self.tree.namespace(func.module)
            if name in ns:
                return self.tree.resolve(ns[name])
        if name in _SAFE_BUILTINS:
            return _SAFE_BUILTINS[name]
        if name in (
            "getattr",
            "hasattr",
            "setattr",
            "isinstance",
            "super",
            "print",
            "type",
            "issubclass",
            "callable",
            "id",
        ):
            return External(f"builtins.{name}")
        if name in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[name]
        raise DerivationError(f"{self._where(node, func)}: unknown name {name!r}")

    def _getattr(self, obj: Any, name: str, node: ast.AST, func: Function | None) -> Any:
        if obj is Opaque:
            return Opaque
        handler = _by_type(self._ATTRIBUTES, obj)
        if handler is not None:
            return handler(self, obj, name, node, func)
        methods = next((m for t, m in _SAFE_METHODS.items() if isinstance(obj, t)), set())
        if name in methods:
            return getattr(obj, name)
        return Opaque

    def _attr_of_external(self, obj: External, name: str, node, func) -> Any:
        dotted = f"{obj.dotted}.{name}"
        return self.tree.resolve(External(dotted))

    def _attr_of_config(self, obj: Config, name: str, node, func) -> Any:
        try:
            return obj.get(name)
        except AttributeError:
            # transformers' configs raise AttributeError too: the real model fails here
            raise ModelRaise(f"the {obj._name} has no {name!r}", self._where(node, func)) from None

    def _attr_of_module(self, obj: ModuleObj, name: str, node, func) -> Any:
        for store in (obj.children, obj.params, obj.attrs):
            if name in store:
                value = store[name]
                return ParamRef(name, value) if isinstance(value, ParamSpec) else value
        cls = obj.cls if isinstance(obj.cls, ClassInfo) else None
        method = cls.method(name) if cls is not None else None
        if method is not None:
            return BoundMethod(method, obj)
        if name == "named_parameters":
            return _NamedParameters(obj)
        return self._class_attr(cls, name) if cls is not None else Opaque

    def _class_attr(self, cls: ClassInfo, name: str) -> Any:
        """A class-level assignment of ``name`` in ``cls`` or a base it inherits from."""
        for owner in cls.mro():
            for stmt in owner.node.body:
                if isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in stmt.targets
                ):
                    return self._eval(
                        stmt.value, {}, Function(ast.FunctionDef(), owner.module, owner)
                    )
        return Opaque  # attributes set by nn.Module or SGLang base classes we do not read

    def _attr_of_super(self, obj: SuperProxy, name: str, node, func) -> Any:
        for cls in obj.cls.mro()[1:]:
            method = cls.method(name)
            if method is not None and method.owner is not obj.cls:
                return BoundMethod(method, obj.obj)
        return _Noop()

    def _attr_of_tensor(self, obj: TensorValue, name: str, node, func) -> Any:
        if name == "shape":
            return obj.shape
        if name == "dtype":
            return obj.dtype
        return Opaque

    def _attr_of_param(self, obj: ParamRef, name: str, node, func) -> Any:
        if name == "weight_loader":
            return Loader(obj)
        if name == "shape":
            return obj.spec.shape
        return Opaque

    def _attr_of_class(self, obj: ClassInfo, name: str, node, func) -> Any:
        method = obj.method(name)
        if method is not None:
            return method
        return Opaque

    def _eval_call(self, node: ast.Call, env: dict, func: Function | None) -> Any:
        fn = self._eval(node.func, env, func)
        args: list[Any] = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                value = self._eval(a.value, env, func)
                args.extend([Opaque] if value is Opaque else list(value))
            else:
                args.append(self._eval(a, env, func))
        kwargs: dict[str, Any] = {}
        for kw in node.keywords:
            value = self._eval(kw.value, env, func)
            if kw.arg is None:
                if isinstance(value, dict):
                    kwargs.update(value)
            else:
                kwargs[kw.arg] = value
        if isinstance(fn, External) and fn.dotted.startswith("builtins."):
            return self._builtin(fn.dotted[9:], args, kwargs, env, func, node)
        if isinstance(fn, _Noop):
            return None
        if isinstance(fn, _NamedParameters):
            return [(name, ParamRef(name, spec)) for name, spec in fn.obj.named_parameters()]
        return self._call(fn, args, kwargs, node, func)

    def _builtin(self, name: str, args: list, kwargs: dict, env: dict, func, node) -> Any:
        if name == "super":
            owner = env.get("__class__")
            self_obj = env.get("self")
            if len(args) == 2:
                owner, self_obj = args
            if not isinstance(owner, ClassInfo):
                return _Noop()
            return SuperProxy(owner, self_obj)
        if name in ("getattr", "hasattr"):
            obj, attr = args[0], args[1]
            found = self._probe(obj, attr)
            if name == "hasattr":
                return Opaque if found is _Unknown else found is not _Missing
            if found is _Missing:
                if len(args) > 2:
                    return args[2]
                raise DerivationError(f"{self._where(node, func)}: getattr of missing {attr!r}")
            if found is _Unknown:
                if isinstance(obj, ParamRef) and attr == "weight_loader":
                    return Loader(obj)
                return args[2] if len(args) > 2 and isinstance(obj, ParamRef) else Opaque
            return found
        if name == "setattr":
            self._setattr(args[0], args[1], args[2])
            return None
        return Opaque

    def _probe(self, obj: Any, attr: Any) -> Any:
        if not isinstance(attr, str) or obj is Opaque:
            return _Unknown
        if isinstance(obj, Config):
            return obj.get(attr) if obj.has(attr) else _Missing
        if isinstance(obj, ModuleObj):
            for store in (obj.children, obj.params, obj.attrs):
                if attr in store:
                    return store[attr]
            if isinstance(obj.cls, ClassInfo) and obj.cls.method(attr) is not None:
                return BoundMethod(obj.cls.method(attr), obj)
            return _Unknown
        if isinstance(obj, ParamRef):
            return _Unknown
        if isinstance(obj, dict):
            return _Unknown
        return _Unknown

    def _listcomp(self, node: ast.ListComp, env: dict, func) -> Any:
        if len(node.generators) != 1:
            raise DerivationError(f"{self._where(node, func)}: nested comprehension")
        gen = node.generators[0]
        iterable = self._eval(gen.iter, env, func)
        if iterable is Opaque:
            return Opaque
        out = []
        local = dict(env)
        for item in iterable:
            self._assign(gen.target, item, local, func)
            if all(self._truth(self._eval(c, local, func), c, func) for c in gen.ifs):
                out.append(self._eval(node.elt, local, func))
        return out

    def _binop(self, op: ast.operator, left: Any, right: Any) -> Any:
        if left is Opaque or right is Opaque or type(op) not in _BINOPS:
            return Opaque
        if isinstance(left, (TensorValue, ParamRef)) or isinstance(right, (TensorValue, ParamRef)):
            return Opaque
        try:
            return _BINOPS[type(op)](left, right)
        except (TypeError, ZeroDivisionError):
            return Opaque

    def _boolop(self, node: ast.BoolOp, env: dict, func) -> Any:
        is_and = isinstance(node.op, ast.And)
        value: Any = None
        for expr in node.values:
            value = self._eval(expr, env, func)
            try:
                truth = self._truth(value, node, func)
            except Undecidable:
                return Opaque
            if truth != is_and:
                return value
        return value

    def _compare(self, node: ast.Compare, env: dict, func) -> Any:
        left = self._eval(node.left, env, func)
        for op, comp in zip(node.ops, node.comparators, strict=False):
            right = self._eval(comp, env, func)
            if left is Opaque or right is Opaque:
                if isinstance(op, (ast.Is, ast.IsNot)) and (left is None or right is None):
                    return Opaque
                return Opaque
            try:
                ok = _CMPOPS[type(op)](left, right)
            except TypeError:
                return Opaque
            if not ok:
                return False
            left = right
        return True

    def _truth(self, value: Any, node, func) -> bool:
        if value is Opaque:
            raise Undecidable()
        if isinstance(value, (ModuleObj, ParamRef, TensorValue, External, Function, BoundMethod)):
            return True
        return bool(value)

    @staticmethod
    def _where(node: ast.AST, func: Function | None) -> str:
        path = func.module.path if func is not None else "<rule>"
        return f"{path}:{getattr(node, 'lineno', '?')}"

    # ---- dispatch tables (here, below every handler they name) ---------------------------
    _STATEMENTS: dict[type, Callable] = {
        ast.Expr: _exec_expr, ast.Assign: _exec_assign, ast.AnnAssign: _exec_annassign,
        ast.AugAssign: _exec_augassign, ast.If: _exec_if, ast.For: _for,
        ast.Return: _exec_return, ast.Raise: _exec_raise, ast.Continue: _exec_continue,
        ast.Break: _exec_break, ast.Delete: _exec_delete, ast.With: _exec_body,
        ast.Try: _exec_body, ast.Import: _exec_import, ast.ImportFrom: _exec_import,
        ast.Pass: _exec_nothing, ast.Assert: _exec_nothing, ast.Global: _exec_nothing,
        ast.Nonlocal: _exec_nothing, ast.FunctionDef: _exec_def,
    }  # fmt: skip
    _EXPRESSIONS: dict[type, Callable] = {
        ast.Constant: _eval_constant, ast.Name: _eval_name, ast.Attribute: _eval_attribute,
        ast.Subscript: _eval_subscript, ast.Slice: _eval_slice, ast.BinOp: _eval_binop,
        ast.UnaryOp: _eval_unaryop, ast.BoolOp: _boolop, ast.Compare: _compare,
        ast.IfExp: _eval_ifexp, ast.Call: _eval_call, ast.List: _eval_sequence,
        ast.Tuple: _eval_sequence, ast.Set: _eval_sequence, ast.Dict: _eval_dict,
        ast.ListComp: _listcomp, ast.JoinedStr: _eval_joinedstr, ast.Lambda: _eval_lambda,
    }  # fmt: skip
    _ATTRIBUTES: dict[type, Callable] = {
        External: _attr_of_external, Config: _attr_of_config, ModuleObj: _attr_of_module,
        SuperProxy: _attr_of_super, TensorValue: _attr_of_tensor, ParamRef: _attr_of_param,
        ClassInfo: _attr_of_class,
    }  # fmt: skip


class _Noop:
    pass


@dataclass
class _NamedParameters:
    obj: ModuleObj


class _Sentinel:
    def __init__(self, name: str):
        self.name = name


_Missing = _Sentinel("missing")
_Unknown = _Sentinel("unknown")


def _by_type(table: dict[type, Callable], obj: Any) -> Callable | None:
    """The entry for ``obj``'s class or its nearest base in ``table`` (as isinstance finds it)."""
    for kind in type(obj).__mro__:
        if kind in table:
            return table[kind]
    return None


def _shard_key(text: str) -> Any:
    return int(text) if text.isdigit() else text


def _as_load(target: ast.expr) -> ast.expr:
    clone = copy.deepcopy(target)
    for node in ast.walk(clone):
        if hasattr(node, "ctx"):
            node.ctx = ast.Load()
    return clone


def _touches_state(stmt: ast.If) -> bool:
    """True when a branch may change the model's structure: it builds something (a call in
    an assignment), deletes, raises or returns.  Plain value assignments (a window size
    copied onto an attention layer) do not decide which parameters exist."""
    for node in ast.walk(stmt):
        if isinstance(node, (ast.Raise, ast.Return, ast.Delete)):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            if any(isinstance(sub, ast.Call) for sub in ast.walk(node.value)):
                return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            root = node.value.func
            while isinstance(root, (ast.Attribute, ast.Call)):
                root = root.value if isinstance(root, ast.Attribute) else root.func
            if isinstance(root, ast.Name) and root.id in ("self", "super", "setattr"):
                return True  # a call on the model itself (add_module, a builder method)
    return False
