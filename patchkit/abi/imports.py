"""What ``import <package>`` loads, read from the package's Python sources without running them.

A library can be loaded at run time although no search path of the object that needs it leads
there: a Python import loaded it first, and ld.so matches a NEEDED name against the SONAMEs
already loaded. ``import xgrammar`` imports ``tvm_ffi`` (``xgrammar/load_binding.py``), whose
``from .core import ...`` loads ``tvm_ffi/core*.so`` and with it ``libtvm_ffi.so``, before
xgrammar loads ``libxgrammar_bindings.so``, which NEEDs ``libtvm_ffi.so`` and has no RUNPATH.
``import triton`` loads ``triton/_C/libtriton.so`` (``from triton._C.libtriton import ...``)
before a plugin that NEEDs ``libtriton.so`` with a RUNPATH of the build machine is loaded.

The sources are parsed (``ast``), never executed. What runs at import is each module's body:
its imports, also those inside ``if``/``try``/``with`` blocks and class bodies (both branches
of an ``if``, except an ``if TYPE_CHECKING:`` block); imports inside functions are not
followed. An imported name resolves as Python's path finder would inside the checked tree: a
package (``a/b/__init__.py``), a module (``a/b.py``) or an extension module
(``a/b.cpython-311-x86_64-linux-gnu.so``, ``a/b.abi3.so``, ``a/b.so``); ``from a import b``
imports ``a.b`` when that is a module. ``torch`` is not followed: ``import torch`` is
modelled by the loader itself.
"""

from __future__ import annotations

import ast
import os
import posixpath
import re
from collections.abc import Iterable, Iterator

from patchkit.abi.cache import changed
from patchkit.archives import read_regular

# An extension module's file name: its module name, then the interpreter tag (or none).
EXTENSION = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\.cpython-[^.]+|\.abi3)?\.so$")

# Packages whose import the loader models itself.
NOT_FOLLOWED = frozenset({"torch"})

MAX_SOURCE_BYTES = 4 << 20
# Modules read at most per run: an import of a large framework is cut off there (what was
# found before still loads; what lies beyond is not seen).
MAX_MODULES = 3000
MAX_DEPTH = 100


class ImportGraph:
    """The extension modules each top-level package's import loads, in load order."""

    def __init__(self, root: str | None, objects: Iterable[str]) -> None:
        self.root = root  # an installed site-packages; None: the sources cannot be read
        self.extensions: dict[str, str] = {}  # module name -> tree path of its object
        for rel in objects:
            m = EXTENSION.match(posixpath.basename(rel))
            if m:
                folder = posixpath.dirname(rel)
                module = (folder.replace("/", ".") + "." if folder else "") + m.group("name")
                self.extensions.setdefault(module, rel)
        self.read: list[tuple[str, int, int]] = []  # (path, size, mtime) of each source read
        self.cut_off = False  # MAX_MODULES or MAX_DEPTH was reached
        self._walks: dict[str, tuple[list[str], Iterator[str]]] = {}
        self._sources: dict[str, tuple[str, bool] | None] = {}

    @property
    def readable(self) -> bool:
        return self.root is not None

    def loads(self, package: str) -> Iterator[str]:
        """Tree paths of the extension modules ``import package`` loads, in order, read as
        they are asked for (none when the sources cannot be read): a caller that has what it
        looks for stops, and the rest of the sources are never read."""
        if package not in self._walks:
            walk = self._import(package, set(), 0) if self.root is not None else iter(())
            self._walks[package] = ([], walk)
        found, walk = self._walks[package]
        i = 0
        while True:
            if i < len(found):
                yield found[i]
                i += 1
                continue
            try:
                nxt = next(walk, None)
            except RecursionError:  # a chain of imports deeper than the interpreter's stack
                self.cut_off, nxt = True, None
                self._walks[package] = (found, iter(()))
            if nxt is None:
                return
            found.append(nxt)

    def _import(self, module: str, seen: set[str], depth: int) -> Iterator[str]:
        parts = module.split(".")
        for i in range(1, len(parts)):  # a submodule's packages are imported first
            yield from self._import(".".join(parts[:i]), seen, depth)
        if module in seen or parts[0] in NOT_FOLLOWED:
            return
        if len(seen) >= MAX_MODULES or depth >= MAX_DEPTH:
            self.cut_off = True
            return
        seen.add(module)
        ext = self.extensions.get(module)
        if ext is not None:
            yield ext
            return
        source = self._source(module)
        if source is None:
            return
        text, is_package = source
        for name, names in _module_imports(text, module, is_package):
            yield from self._import(name, seen, depth + 1)
            for sub in names:
                if self._is_module(f"{name}.{sub}"):
                    yield from self._import(f"{name}.{sub}", seen, depth + 1)

    def _is_module(self, module: str) -> bool:
        return module in self.extensions or self._source(module) is not None

    def _source(self, module: str) -> tuple[str, bool] | None:
        """The text of ``module``'s source and whether it is a package, or None."""
        if module in self._sources:
            return self._sources[module]
        found = None
        base = module.replace(".", "/")
        for rel, is_package in ((f"{base}/__init__.py", True), (f"{base}.py", False)):
            path = os.path.join(self.root or "", rel)
            try:
                st = os.stat(path)
                data = read_regular(path, MAX_SOURCE_BYTES)
            except (OSError, ValueError):
                continue
            self.read.append((path, st.st_size, changed(st)))
            found = (data.decode("utf-8", "replace"), is_package)
            break
        self._sources[module] = found
        return found


def _module_imports(text: str, module: str, is_package: bool) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for each import the module's body runs, in
    order; a source that does not parse imports nothing verify can see."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    package = module if is_package else module.rpartition(".")[0]
    out: list[tuple[str, list[str]]] = []
    for node in _body_statements(tree.body):
        if isinstance(node, ast.Import):
            out.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            if base:
                out.append((base, [a.name for a in node.names if a.name != "*"]))
    return out


def _absolute(name: str | None, level: int, package: str) -> str | None:
    """The absolute module name of ``from <level dots><name> import ...`` in ``package``."""
    if level == 0:
        return name
    parts = package.split(".") if package else []
    if level > len(parts):  # beyond the top-level package: an ImportError at run time
        return None
    base = parts[: len(parts) - (level - 1)]
    return ".".join(base + ([name] if name else [])) or None


def _body_statements(body: list[ast.stmt]):
    """The statements a module's body runs at import, nested blocks included, in order."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _body_statements(node.body)
            yield from _body_statements(node.orelse)
        elif isinstance(node, (ast.Try, ast.TryStar)):
            # the handlers run only when the body failed: its imports are the ones that count
            yield from _body_statements(node.body)
            yield from _body_statements(node.orelse)
            yield from _body_statements(node.finalbody)
        elif isinstance(node, (ast.With, ast.ClassDef, ast.For, ast.While)):
            yield from _body_statements(node.body)
        else:
            yield node


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )
