"""An emulation of ld.so for extensions imported after ``import torch``, on the target host.

Search order for a DT_NEEDED name (glibc): a SONAME already loaded; DT_RPATH of the object and
of the objects that loaded it (only if the object has no DT_RUNPATH); ``LD_LIBRARY_PATH``;
DT_RUNPATH; ``/etc/ld.so.cache``; the default directories. Only the checked tree is searched:
what the target host provides (driver libraries, the C/C++ runtime) is what the profile's
``[host] libraries`` declares, never what the verifying machine happens to have installed, so
a result does not change with the machine verify runs on. ``import torch`` has already loaded
``torch/_C``'s closure (RTLD_LOCAL) and ``libtorch_global_deps.so``'s (RTLD_GLOBAL), so an
extension finds libc10/libtorch/libcudart by SONAME even without an RPATH, but binds
libtorch_python symbols only if it NEEDs libtorch_python.so itself. An object whose closure
misses a library is resolved again with what its package's Python import loads before it
(``imports.ImportGraph``: ``import xgrammar`` loads ``libtvm_ffi.so`` through ``tvm_ffi``).
"""

from __future__ import annotations

import os
import posixpath
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from patchkit.abi.imports import ImportGraph
from patchkit.abi.scan import FileReport
from patchkit.archives import read_regular

LD_SO_CACHE = "/etc/ld.so.cache"
CACHE_MAGIC = b"glibc-ld.so.cache1.1"
# Driver libraries come with the NVIDIA driver, not with any wheel (without a profile's list).
EXEMPT = ("libcuda.so.1", "libnvidia-ml.so.1", "libcuda.so")
FLAG_X86_64_LIBC6 = 0x0303


def read_ld_cache(path: str = LD_SO_CACHE) -> dict[str, str]:
    """soname -> path of the x86-64 libraries listed in ld.so.cache (empty if unreadable)."""
    try:
        data = read_regular(path, 64 << 20)  # about 100 kB on a usual host
    except (OSError, ValueError):
        return {}
    start = data.find(CACHE_MAGIC)
    if start < 0 or start + 48 > len(data):
        return {}
    (nlibs,) = struct.unpack_from("<I", data, start + 20)
    out: dict[str, str] = {}
    for i in range(nlibs):
        off = start + 48 + i * 24
        if off + 24 > len(data):
            break
        flags, key, value, _os, _hw = struct.unpack_from("<iIIIQ", data, off)
        if flags & 0xFFFF != FLAG_X86_64_LIBC6:
            continue
        name = _cstr(data, key)
        if name and name not in out:
            out[name] = _cstr(data, value)
    return out


def _cstr(data: bytes, off: int) -> str:
    end = data.find(b"\0", off)
    return data[off:end].decode("utf-8", "replace") if 0 <= off < len(data) and end > 0 else ""


@dataclass
class Loaded:
    """A resolved library: its report and where it was found (tree relpath or host path)."""

    key: str  # tree relpath
    report: FileReport


@dataclass
class Closure:
    """The breadth-first NEEDED closure of one object."""

    objects: list[Loaded] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)  # (name, needed by)
    exempt: set[str] = field(default_factory=set)  # provided by the target host
    # (name, needed by, dist): shipped by a wheel of the stack that is not in this wheelhouse
    elsewhere: list[tuple[str, str, str]] = field(default_factory=list)
    # soname -> the extension module whose import loaded it before this object
    imported: dict[str, str] = field(default_factory=dict)


class Loader:
    """Resolve NEEDED names inside a Tree (by relative path) and against the profile's host."""

    def __init__(
        self,
        reports: dict[str, FileReport],
        host_provides: Callable[[str], bool] = lambda name: name in EXEMPT,
        ld_library_path: list[str] | None = None,
        tree_root: str | None = None,
        elsewhere: Callable[[str], str | None] = lambda name: None,
        imports: ImportGraph | None = None,
    ) -> None:
        self.reports = reports
        self.host_provides = host_provides
        self.ld_library_path = ld_library_path or []  # tree-relative directories
        self.tree_root = tree_root
        self.elsewhere = elsewhere  # soname -> the stack's dist that ships it, not in the tree
        self.by_dir: dict[str, dict[str, str]] = {}
        for rel in reports:
            self.by_dir.setdefault(posixpath.dirname(rel), {})[posixpath.basename(rel)] = rel
        self.preloaded: dict[str, Loaded] = {}
        self.global_scope: list[Loaded] = []
        self.imports = imports  # what a package's Python import loads (None: not modelled)
        # package -> (what its import has loaded so far, extension module -> what it added)
        self._import_scopes: dict[str, tuple[dict[str, Loaded], dict[str, dict]]] = {}

    def _in_tree(self, directory: str, name: str) -> Loaded | None:
        rel = self.by_dir.get(directory, {}).get(name)
        return Loaded(rel, self.reports[rel]) if rel is not None else None

    @staticmethod
    def _expand(entry: str, origin: str) -> str:
        """An RPATH entry with $ORIGIN made tree-relative (``TREE:<dir>``)."""
        if "$ORIGIN" not in entry and "${ORIGIN}" not in entry:
            return entry
        rel = posixpath.normpath(
            entry.replace("${ORIGIN}", "$ORIGIN").replace("$ORIGIN", origin or ".")
        )
        return "TREE:" + ("" if rel == "." else rel)

    def _search_dir(self, directory: str, name: str, origin: str) -> Loaded | None:
        """``directory`` from an RPATH/RUNPATH entry: $ORIGIN-relative or absolute, in the tree."""
        if directory.startswith("TREE:"):
            rel = directory[5:]
            if rel == ".." or rel.startswith("../"):
                return None  # leaves the checked tree: a host path, not searched
            return self._in_tree(rel, name)
        if "$ORIGIN" in directory or "${ORIGIN}" in directory:
            rel = directory.replace("${ORIGIN}", "$ORIGIN").replace("$ORIGIN", origin or ".")
            rel = posixpath.normpath(rel)
            if rel == ".":
                rel = ""
            if rel == ".." or rel.startswith("../"):
                return None  # leaves the checked tree: a host path, not searched
            return self._in_tree(rel, name)
        return self._absolute(os.path.join(directory, name))

    def _absolute(self, path: str) -> Loaded | None:
        """An absolute path is searched only where it lies inside the checked tree."""
        if not self.tree_root:
            return None
        path = os.path.normpath(path)
        if not path.startswith(self.tree_root + os.sep):
            return None
        rel = os.path.relpath(path, self.tree_root).replace(os.sep, "/")
        return self._in_tree(posixpath.dirname(rel), posixpath.basename(rel))

    def find(
        self,
        name: str,
        requester: str,
        rpaths: list[str],
        runpath: list[str],
        loaded: dict[str, Loaded],
    ) -> Loaded | None:
        """Resolve one DT_NEEDED ``name`` needed by tree path ``requester``."""
        if name in loaded:
            return loaded[name]
        origin = posixpath.dirname(requester)
        if "/" in name:
            return self._absolute(name)
        if not runpath:
            for entry in rpaths:
                hit = self._search_dir(entry, name, origin)
                if hit:
                    return hit
        for entry in self.ld_library_path:
            hit = self._in_tree(entry, name)
            if hit:
                return hit
        for entry in runpath:
            hit = self._search_dir(entry, name, origin)
            if hit:
                return hit
        return None

    def closure(
        self, key: str, report: FileReport, loaded: dict[str, Loaded] | None = None
    ) -> Closure:
        """Breadth-first NEEDED closure, names first matched against ``loaded`` SONAMEs
        (default: what ``import torch`` loaded; where that misses a library, also what the
        object's package's import loaded before it)."""
        if loaded is not None:
            return self._closure(key, report, dict(loaded))
        out = self._closure(key, report, dict(self.preloaded))
        if not out.missing or self.imports is None:
            return out
        wanted = {name for name, _ in out.missing}
        scope = self.import_scope(key, wanted)
        if not wanted & scope.keys():
            return out
        loaded = {name: hit for name, (hit, _) in scope.items()}
        loaded.update(self.preloaded)
        out = self._closure(key, report, loaded)
        out.imported = {name: by for name, (_, by) in scope.items() if name not in self.preloaded}
        return out

    def import_scope(self, key: str, wanted: set[str]) -> dict[str, tuple[Loaded, str]]:
        """soname -> (library, extension module that loaded it): what the import of the
        package holding ``key`` loads before ``key`` itself (all of it, when ``key`` is no
        module that import reaches: a library the package loads itself, or a plugin), read
        only until every name of ``wanted`` is loaded."""
        if self.imports is None:
            return {}
        package = key.split("/", 1)[0]
        loaded, scope = self._import_scopes.setdefault(package, (dict(self.preloaded), {}))
        out: dict[str, tuple[Loaded, str]] = {}
        for module in self.imports.loads(package):
            if module == key or wanted <= out.keys():
                break
            if module not in scope:
                scope[module] = self._module_loads(module, loaded)
            for name, hit in scope[module].items():
                out.setdefault(name, (hit, module))
        return out

    def _module_loads(self, module: str, loaded: dict[str, Loaded]) -> dict[str, Loaded]:
        """soname -> library of what loading extension module ``module`` adds to ``loaded``
        (which it updates)."""
        report = self.reports.get(module)
        added: dict[str, Loaded] = {}
        if report is None or report.elf is None:
            return added
        for obj in self._closure(module, report, dict(loaded)).objects:
            for name in {
                obj.report.elf.soname if obj.report.elf else None,
                posixpath.basename(obj.key),
            } - {None}:
                if name not in loaded:
                    loaded[name] = added[name] = obj
        return added

    def _closure(self, key: str, report: FileReport, loaded: dict[str, Loaded]) -> Closure:
        out = Closure()
        start = Loaded(key, report)
        out.objects.append(start)
        seen = {key}
        # Each queue item carries the RPATHs of the objects that loaded it (used without RUNPATH).
        queue = [(start, [])]
        while queue:
            obj, inherited = queue.pop(0)
            elf = obj.report.elf
            if elf is None:
                continue
            # $ORIGIN means the directory of the object whose RPATH it is, also when inherited.
            here = posixpath.dirname(obj.key)
            own = [self._expand(entry, here) for entry in elf.rpath]
            rpaths = own + inherited if not elf.runpath else own
            for name in elf.needed:
                if self.host_provides(name):
                    out.exempt.add(name)
                    continue
                hit = self.find(name, obj.key, rpaths, elf.runpath, loaded)
                if hit is None:
                    dist = self.elsewhere(name)
                    if dist:
                        out.elsewhere.append((name, obj.report.origin, dist))
                    else:
                        out.missing.append((name, obj.report.origin))
                    continue
                loaded[name] = hit
                if hit.report.elf and hit.report.elf.soname:
                    loaded.setdefault(hit.report.elf.soname, hit)
                if hit.key not in seen:
                    seen.add(hit.key)
                    out.objects.append(hit)
                    queue.append((hit, rpaths if not elf.runpath else []))
        return out

    def add_preloaded(self, cl: Closure) -> None:
        """Record a closure dlopened RTLD_LOCAL: its SONAMEs count as loaded, its symbols do not."""
        for obj in cl.objects:
            for name in {
                obj.report.elf.soname if obj.report.elf else None,
                posixpath.basename(obj.key),
            } - {None}:
                self.preloaded.setdefault(name, obj)

    def preload(self, keys_local: list[str], keys_global: list[str]) -> list[Closure]:
        """``import torch``: load torch/_C (local) and libtorch_global_deps (global)."""
        closures = []
        for key, is_global in [(k, False) for k in keys_local] + [(k, True) for k in keys_global]:
            report = self.reports.get(key)
            if report is None or report.elf is None:
                continue
            cl = self.closure(key, report, self.preloaded)
            closures.append(cl)
            for obj in cl.objects:
                for name in {
                    obj.report.elf.soname if obj.report.elf else None,
                    posixpath.basename(obj.key),
                } - {None}:
                    self.preloaded.setdefault(name, obj)
                if is_global:
                    self.global_scope.append(obj)
        return closures
