"""Checks 6-7, loading: the CUDA major each library needs, the profile's torch stand-ins, and
the loader's closure (every needed library found, and where)."""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
from collections import defaultdict

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from patchkit.abi.checks.context import (
    CUDA_RUNTIME,
    TORCH_PRELOADS,
    Context,
    _top,
    owner_label,
)
from patchkit.abi.checks.distributions import TARGET_MARKERS
from patchkit.abi.imports import ImportGraph
from patchkit.abi.loader import EXEMPT, Closure, Loader
from patchkit.abi.scan import FileReport


def check_cuda_major(ctx: Context, extensions: dict[str, FileReport]) -> None:
    """One finding per distribution built for another CUDA major, its files as evidence."""
    t = ctx.torch.major or ctx.profile.cuda_major
    builds: dict[str, list[tuple[str, str, list[str]]]] = defaultdict(list)
    for rel, rep in extensions.items():
        if rep.elf is None:
            continue
        wrong = [n for n in rep.elf.needed if (m := CUDA_RUNTIME.match(n)) and int(m.group(2)) != t]
        if wrong:
            builds[owner_label(ctx, rel, rep)].append((rel, rep.origin, wrong))
    for label, files in sorted(builds.items()):
        sonames = sorted({n for _, _, names in files for n in names})
        majors = sorted({CUDA_RUNTIME.match(n).group(2) for n in sonames})
        m = "/".join(majors)
        if len(files) == 1 and "!" not in label and label == _top(files[0][0]):
            label = files[0][1]
        ctx.grouped.update(rel for rel, _, _ in files)
        ctx.emit(
            "cuda-major",
            label,
            evidence=tuple(f"{origin}: needs {', '.join(names)}" for _, origin, names in files),
            n=len(files),
            soname=sonames[0],
            sonames=", ".join(sonames),
            m=m,
            t=t,
        )


def load_profile_torch(ctx: Context) -> None:
    """Stand-ins for the profile's torch libraries, when torch is not among the checked files."""
    if ctx.torch.present or not ctx.profile.torch_symbols:
        return
    from patchkit.abi import torchsyms

    path = ctx.profile.data_file(ctx.profile.torch_symbols)
    try:
        doc = torchsyms.load(path)
    except ValueError as exc:
        ctx.emit("torch-symbols-unreadable", ctx.profile.name, reason=str(exc))
        return
    label = f"profile torch {doc.get('torch')}"
    for rel, elf in torchsyms.elf_infos(doc, label).items():
        ctx.profile_torch[rel] = FileReport(relpath=rel, origin=elf.path, elf=elf)
    ctx.profile_torch_source = f"{doc.get('wheel')}, sha256 {str(doc.get('sha256'))[:12]}…"
    c10 = ctx.profile_torch.get("torch/lib/libc10.so")
    if c10 and c10.elf:
        ctx.torch.cxx11_abi = c10.elf.cxx11_abi


def _elsewhere(ctx: Context):
    """soname -> the dist of the stack that ships it, when that dist is not being checked."""
    partial = ctx.tree.kind == "wheelhouse" and not ctx.tree.has_env

    def where(name: str) -> str | None:
        dist = ctx.profile.provider(name)
        if dist is None or not partial:
            return None
        if dist in ctx.tree.dists:
            return None  # it is here, so the library should have been found: an error
        if dist == "torch" and ctx.profile_torch:
            return None
        return dist

    return where


def build_loader(ctx: Context) -> Loader:
    """The loader of the checked files with `import torch` replayed: torch/_C's closure
    (RTLD_LOCAL), libtorch_global_deps.so's (RTLD_GLOBAL), then what torch preloads."""
    reports = {**ctx.reports, **ctx.profile_torch}
    prof = ctx.profile

    def host_provides(name: str) -> bool:
        return prof.host_provides(name) if prof.host_libraries else name in EXEMPT

    loader = Loader(
        reports,
        host_provides,
        _library_path(ctx),
        tree_root=ctx.tree.root,
        elsewhere=_elsewhere(ctx),
        # an installed environment's sources are read; a wheel's are not (nor over an env)
        imports=ImportGraph(ctx.tree.root if ctx.tree.kind == "env" else None, reports),
    )
    local = [rel for rel in reports if re.fullmatch(r"torch/_C\..*so", rel)]
    if not local and "torch/lib/libtorch_python.so" in ctx.profile_torch:
        local = ["torch/lib/libtorch_python.so"]  # what torch/_C loads
    global_ = [rel for rel in ("torch/lib/libtorch_global_deps.so",) if rel in reports]
    for cl in loader.preload(local[:1], global_):
        if cl.objects[0].key not in ctx.profile_torch:
            ctx.closures[cl.objects[0].key] = cl
    if any(name.startswith("libcudart.so") for name in loader.preloaded):
        _preload_cuda_libraries(ctx, loader)
    ctx.loader = loader
    return loader


def _library_path(ctx: Context) -> list[str]:
    """The LD_LIBRARY_PATH entries inside the checked tree, relative to its root."""
    root = ctx.tree.root
    out = []
    for entry in ctx.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if entry and os.path.abspath(entry).startswith(root + os.sep):
            out.append(os.path.relpath(os.path.abspath(entry), root).replace(os.sep, "/"))
    return out


def _preload_cuda_libraries(ctx: Context, loader: Loader) -> None:
    """torch/__init__.py preloads nvrtc and nvJitLink from the nvidia wheels (pytorch
    #138460, #145580), so extensions find them by SONAME."""
    major = ctx.torch.major or ctx.profile.cuda_major
    for folder, pattern in TORCH_PRELOADS:
        rels = [
            r
            for d in (f"nvidia/{folder}/lib", f"nvidia/cu{major}/lib")
            for r in sorted(ctx.reports)
            if posixpath.dirname(r) == d and fnmatch.fnmatch(posixpath.basename(r), pattern)
        ]
        if rels:
            cl = loader.closure(rels[0], ctx.reports[rels[0]], loader.preloaded)
            loader.add_preloaded(cl)


def check_needed(ctx: Context, extensions: dict[str, FileReport]) -> None:
    loader = ctx.loader
    seen: set = set()
    elsewhere: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    missing: dict[tuple[str, str], list[str]] = defaultdict(list)
    for cl in list(ctx.closures.values()):
        _report_missing(ctx, cl, seen, elsewhere, missing)
    for rel, rep in extensions.items():
        if rep.elf is None:
            continue
        cl = loader.closure(rel, rep)
        ctx.closures[rel] = cl
        _report_missing(ctx, cl, seen, elsewhere, missing)
    _emit_missing(ctx, missing)
    for dist, names in sorted(elsewhere.items()):
        users = sorted({u for us in names.values() for u in us})
        ctx.emit(
            "needed-elsewhere",
            users[0] if len(users) == 1 else _many(users),
            evidence=tuple(
                f"{u}: needs {', '.join(sorted(n for n in names if u in names[n]))}" for u in users
            ),
            names=", ".join(sorted(names)),
            dist=dist,
        )


def _many(origins: list[str]) -> str:
    """A name for a group of files: their wheel, if they share one."""
    wheels = {o.split("!", 1)[0] for o in origins if "!" in o}
    if len(wheels) == 1 and all("!" in o for o in origins):
        return f"{wheels.pop()} ({len(origins)} objects)"
    return f"{len(origins)} objects"


def _report_missing(ctx: Context, cl: Closure, seen: set, elsewhere, missing) -> None:
    t = ctx.torch.major or ctx.profile.cuda_major
    for name, needed_by in cl.missing:
        if (name, needed_by) in seen:
            continue
        seen.add((name, needed_by))
        m = CUDA_RUNTIME.match(name)
        obj = next((o for o in cl.objects if o.report.origin == needed_by), None)
        if m and int(m.group(2)) != t and obj is not None and obj.key in ctx.grouped:
            continue  # part of the CUDA-build finding (check 6)
        label = owner_label(ctx, obj.key, obj.report) if obj else needed_by
        missing[(label, name)].append((needed_by, obj.key if obj else None))
    for name, needed_by, dist in cl.elsewhere:
        elsewhere[dist][name].add(needed_by)


def _emit_missing(ctx: Context, missing: dict[tuple[str, str], list]) -> None:
    optional: dict[str, list[tuple[str, str]]] = defaultdict(list)  # label -> (name, user)
    for (label, name), every in sorted(missing.items()):
        users = [u for u in every if not _optional_load(ctx, u[1])]
        for origin, key in every:
            if (origin, key) not in users:
                optional[owner_label(ctx, key, ctx.reports[key])].append((name, origin))
        if not users:
            continue
        origins = [u for u, _ in users]
        if _not_checked(ctx, label, name, users):
            continue
        if len(users) == 1:
            ctx.emit("needed-missing", origins[0], name=name, so=os.path.basename(origins[0]))
            continue
        ctx.emit(
            "needed-missing",
            label,
            evidence=tuple(f"{u}: needs {name}" for u in origins),
            name=name,
            so=f"{len(users)} objects",
        )
    for label, found in sorted(optional.items()):
        names = sorted({name for name, _ in found})
        users = sorted({u for _, u in found})
        ctx.emit(
            "needed-optional",
            users[0] if len(users) == 1 else label,
            evidence=tuple(
                f"{u}: needs {', '.join(sorted(n for n, v in found if v == u))}" for u in users
            ),
            names=", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else ""),
            so=os.path.basename(users[0]) if len(users) == 1 else f"{len(users)} objects",
        )


def _optional_load(ctx: Context, key: str | None) -> bool:
    """Whether the profile names the object as loaded only where it loads (`[loading]
    optional`): a library it misses is a note, as its package goes on without it."""
    if not key or key not in ctx.reports:
        return False
    return any(fnmatch.fnmatch(key, g) for g in ctx.profile.optional_loads)


def _not_checked(ctx: Context, label: str, name: str, users: list) -> bool:
    """A library on none of the objects' search paths that the checked files ship, in the
    objects' own package or in one it requires: loaded at run time if a Python import loaded
    it first, which verify could not see (a wheel's imports are not read; a library the
    package loads with ctypes). Said as not checked, not as missing."""
    shipped = [
        rel
        for rel, rep in sorted(ctx.reports.items())
        if rep.elf and name in (rep.elf.soname, posixpath.basename(rel))
    ]
    keys = [key for _, key in users if key]
    why = next((w for lib in shipped for key in keys if (w := _related(ctx, key, lib))), None)
    if why is None:
        return False
    graph = ctx.loader.imports if ctx.loader else None
    package = keys[0].split("/", 1)[0]
    if graph is None or not graph.readable:
        seen = "the imports of a wheel's modules are not read"
    elif graph.cut_off:
        seen = f"the imports of {package} were read only in part (too many modules)"
    else:
        seen = f"the imports of {package} that verify reads do not load it"
    origins = [u for u, _ in users]
    ctx.emit(
        "needed-not-checked",
        origins[0] if len(users) == 1 else label,
        evidence=tuple(f"{u}: needs {name}" for u in origins) + (f"shipped as {shipped[0]}",),
        name=name,
        so=os.path.basename(origins[0]) if len(users) == 1 else f"{len(users)} objects",
        where=shipped[0],
        why=why,
        seen=seen,
        package=package,
    )
    return True


def _related(ctx: Context, key: str, lib: str) -> str | None:
    """Why the package holding ``key`` may have loaded ``lib`` first: it ships it, or it
    requires (Requires-Dist, directly or through others) the distribution that does."""
    if key.split("/", 1)[0] == lib.split("/", 1)[0]:
        return f"{key.split('/', 1)[0]} ships it itself"
    mine, theirs = ctx.tree.owner(key), ctx.tree.owner(lib)
    if mine is None or theirs is None:
        return None
    if mine.name == theirs.name:
        return f"{mine.name} ships it itself"
    if theirs.name in _requirements(ctx, mine.name):
        return f"{mine.name} requires {theirs.name}"
    return None


def _requirements(ctx: Context, dist: str) -> set[str]:
    """The distributions of the checked files that ``dist`` requires, directly or not
    (markers evaluated for the target host; a requirement of an extra counts, as the
    distribution it names is installed)."""
    found: set[str] = set()
    queue = [dist]
    while queue:
        current = ctx.tree.dists.get(queue.pop())
        for text in current.requires if current else ():
            try:
                req = Requirement(text)
                # an extra's requirement counts where it is installed (something asked for it)
                extras = [""] + re.findall(r"extra\s*==\s*['\"]([^'\"]+)", str(req.marker))
                if req.marker is not None and not any(
                    req.marker.evaluate({"extra": e, **TARGET_MARKERS}) for e in extras
                ):
                    continue
            except Exception:  # InvalidRequirement, or a marker that cannot be evaluated
                continue
            name = canonicalize_name(req.name)
            if name in ctx.tree.dists and name not in found:
                found.add(name)
                queue.append(name)
    return found
