"""Checks 8-11, symbols: the undefined names no library in scope defines, the C++11 ABI flag,
symbol versions (glibc, libstdc++) and one CUDA runtime per process."""

from __future__ import annotations

import bisect
import os
import posixpath
import re
import shutil
import subprocess
from collections import defaultdict
from typing import NamedTuple

from patchkit.abi.checks.context import (
    MAX_SYMBOLS_PER_FILE,
    ONE_RUNTIME,
    TORCH_PREFIXES,
    TORCH_SHIM_PREFIXES,
    TORCH_SONAMES,
    Context,
    owner_label,
)
from patchkit.abi.elf import name_set
from patchkit.abi.loader import Closure, Loaded
from patchkit.abi.scan import FileReport

# torch's C++ names, and the C functions of its stable interface: both decided against the
# exports of the torch checked (or the profile's).
TORCH_BUCKETS = ("torch-abi", "torch-shim")


def _bucket(name: str) -> str:
    if name.startswith(TORCH_PREFIXES):
        return "torch-abi"
    if name.startswith(TORCH_SHIM_PREFIXES):
        return "torch-shim"
    if name.startswith(("cu", "nvrtc", "nvJitLink")):
        return "cuda-lib"
    if name.startswith(("Py", "_Py")):
        return "python-abi"
    if name.startswith(
        (
            "_ZNSt",
            "_ZNKSt",
            "_ZSt",
            "_ZTISt",
            "_ZTVSt",
            "_ZNSs",
            "_ZNKSs",
            "__cxa",
            "_ZTVN10__cxxabiv",
        )
    ):
        return "libstdc++"
    return "other"


class _Unresolved(NamedTuple):
    """One strong undefined name of an extension that no library of its scope defines."""

    rel: str
    origin: str
    name: str
    bucket: str
    total: int  # the object's unresolved names, all buckets


def check_symbols(ctx: Context, extensions: dict[str, FileReport]) -> None:
    """Undefined symbols: torch's grouped per package (an ABI-flag mismatch is check 9's, see
    _split_abi_flag), other buckets per file; an object whose NEEDED closure misses a library
    has its torch names checked against every torch library present and the rest named as
    not checked (_emit_unchecked)."""
    pending, unchecked = _find_unresolved(ctx, extensions)
    names = demangle([p.name for p in pending if p.bucket != "torch-shim"])
    torch_items = [p for p in pending if p.bucket == "torch-abi"]
    api = _split_abi_flag(ctx, torch_items, extensions)
    shim = [p for p in pending if p.bucket == "torch-shim"]
    # a name torch exports (C++ or shim) from a library outside the object's scope: not an
    # older torch, a NEEDED missing (libtorch_cpu.so, libtorch_cuda.so)
    exported = _torch_exports(ctx) if shim or api else frozenset()
    others = [p for p in pending if p.bucket not in TORCH_BUCKETS]
    _emit_outside(ctx, others, [p for p in api + shim if p.name in exported], names)
    _emit_torch(ctx, [p for p in api if p.name not in exported], extensions, names)
    _emit_torch(ctx, [p for p in shim if p.name not in exported], extensions, names, shim=True)
    _emit_unchecked(ctx, unchecked, extensions)


def _find_unresolved(
    ctx: Context, extensions: dict[str, FileReport]
) -> tuple[list[_Unresolved], list[tuple[str, str, list[str], int]]]:
    """The names to report, and per object whose closure misses a library (rel, origin, the
    missing libraries, how many names were left unchecked)."""
    global_sets = [name_set(o.report.elf.defined) for o in ctx.loader.global_scope if o.report.elf]
    pending: list[_Unresolved] = []
    unchecked: list[tuple[str, str, list[str], int]] = []
    for rel, rep in extensions.items():
        cl = ctx.closures.get(rel)
        if rep.elf is None or cl is None:
            continue
        unresolved = _unresolved(rep, cl, global_sets)
        if cl.missing:
            found, skipped = _decidable(ctx, rep.elf, cl, unresolved)
            if skipped:
                unchecked.append((rel, rep.origin, sorted({n for n, _ in cl.missing}), skipped))
        else:
            found = _undecided_left_alone(ctx, rep.elf, cl, unresolved)
        pending += [_Unresolved(rel, rep.origin, n, b, len(found)) for n, b in found]
    return pending, unchecked


def _undecided_left_alone(
    ctx: Context, elf, cl: Closure, unresolved: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """Of an object whose closure is complete, the unresolved names no unread library may
    define (_left_alone)."""
    unread = _unread(cl)
    torch_known = ctx.torch.present or bool(ctx.profile_torch)
    return [
        (n, b)
        for n, b in unresolved
        if not _left_alone(elf.symbol_library(n), b, cl, unread, torch_known)
    ]


def _unresolved(rep: FileReport, cl: Closure, global_sets: list) -> list[tuple[str, str]]:
    """(name, bucket) of the object's strong undefined names that neither the global scope nor
    its own NEEDED closure (dlopen order) defines."""
    own = [name_set(o.report.elf.defined) for o in cl.objects[1:] if o.report.elf]
    # Found set by set in C (a set intersection walks the smaller side), not name by name
    # through every library of the scope.
    unresolved = set(rep.elf.undefined)
    for defined in global_sets + own:
        if not unresolved:
            break
        unresolved -= unresolved.intersection(defined)
    return [(name, _bucket(name)) for name in rep.elf.undefined if name in unresolved]


def _unread(cl: Closure) -> set[str]:
    """The libraries of the closure not read here: the host's, those of wheels not present."""
    return cl.exempt | {name for name, _, _ in cl.elsewhere}


def _left_alone(lib: str | None, bucket: str, cl: Closure, unread: set, torch_known: bool) -> bool:
    """Whether an unresolved name is left to a library this check does not read."""
    if lib is not None and lib in unread:
        return True  # bound by version to a host library or one from another wheel
    if bucket == "python-abi":
        return True  # the interpreter defines these
    if bucket == "cuda-lib" and ({"libcuda.so.1", "libcuda.so"} & cl.exempt or cl.elsewhere):
        return True  # libcuda.so.1 comes with the driver; others from wheels not here
    if bucket in TORCH_BUCKETS and not torch_known:
        return True  # torch-missing already says these cannot be checked
    # an unversioned name a host library may define: not decidable here
    return bucket in ("libstdc++", "other") and lib is None and bool(unread)


def _decidable(
    ctx: Context, elf, cl: Closure, unresolved: list[tuple[str, str]]
) -> tuple[list[tuple[str, str]], int]:
    """ld.so stops at a missing library (check 7 says so), and that library, or what it
    would load, might define any name. Torch's names are still decided, against every torch
    library present (a name none of them defines is not torch's either way), unless what is
    missing is a torch library; the others are counted as not checked."""
    unread = _unread(cl)
    torch_known = ctx.torch.present or bool(ctx.profile_torch)
    torch_lib_missing = any(_is_torch_library(ctx, name) for name, _ in cl.missing)
    exports = _torch_exports(ctx) if torch_known and not torch_lib_missing else None
    keep, skipped = [], 0
    for name, bucket in unresolved:
        lib = elf.symbol_library(name)
        if bucket == "python-abi" or (lib is not None and lib in unread):
            continue
        if bucket in TORCH_BUCKETS and not torch_known:
            continue  # torch-missing says so
        if bucket in TORCH_BUCKETS and exports is not None:
            if name not in exports:
                keep.append((name, bucket))
            continue
        skipped += 1
    return keep, skipped


def _is_torch_library(ctx: Context, name: str) -> bool:
    return (
        name in TORCH_SONAMES
        or name.startswith("libtorch")
        or ctx.profile.provider(name) == "torch"
    )


def _torch_libraries(ctx: Context) -> list:
    """The ElfInfo of every torch library: the checked torch's, else the profile's stand-ins."""
    reports = {**ctx.reports, **ctx.profile_torch}
    return [
        rep.elf
        for rel, rep in sorted(reports.items())
        if rep.elf and (rel.startswith("torch/lib/") or rep.elf.soname in TORCH_SONAMES)
    ]


def _torch_exports(ctx: Context) -> frozenset[str]:
    names = ctx.__dict__.get("_torch_exports")
    if names is None:
        names = frozenset().union(*(name_set(elf.defined) for elf in _torch_libraries(ctx)))
        ctx.__dict__["_torch_exports"] = names
    return names


def _emit_outside(
    ctx: Context, others: list[_Unresolved], outside: list[_Unresolved], names: dict[str, str]
) -> None:
    """Other buckets' names, and torch's names from outside the object's scope: not checked
    where the object links no torch library at all (_links_no_torch), else errors."""
    unlinked = _links_no_torch(ctx, outside)
    _emit_other(ctx, others + [p for p in outside if p.rel not in unlinked], names)
    _emit_global_only(ctx, [p for p in outside if p.rel in unlinked], names)


def _links_no_torch(ctx: Context, items: list[_Unresolved]) -> set[str]:
    """The objects among ``items`` whose NEEDED closure holds no torch library: built to bind
    torch's names from the global scope, where a package puts torch's libraries (reopening
    ``torch._C`` with RTLD_GLOBAL) before loading them."""
    out = set()
    for rel in {p.rel for p in items}:
        cl = ctx.closures.get(rel)
        if cl and not any(
            o.key.startswith("torch/") or (o.report.elf and o.report.elf.soname in TORCH_SONAMES)
            for o in cl.objects
        ):
            out.add(rel)
    return out


def _emit_global_only(ctx: Context, items: list[_Unresolved], names: dict[str, str]) -> None:
    """One warning per object: torch exports its names, and it links no torch library."""
    by_file: dict[str, list[str]] = defaultdict(list)
    for item in items:
        by_file[item.origin].append(item.name)
    for origin, found in sorted(by_file.items()):
        ctx.emit(
            "undefined-symbol-global",
            origin,
            evidence=tuple(names.get(n, n) for n in found),
            n=len(found),
            example=names.get(found[0], found[0]),
        )


def _emit_other(ctx: Context, items: list[_Unresolved], names: dict[str, str]) -> None:
    """Names of other buckets: one finding per name, five per file at most."""
    per_file: dict[str, int] = defaultdict(int)
    for item in items:
        per_file[item.origin] += 1
        if per_file[item.origin] > MAX_SYMBOLS_PER_FILE:
            continue
        demangled = names.get(item.name, item.name)
        if per_file[item.origin] == MAX_SYMBOLS_PER_FILE and item.total > MAX_SYMBOLS_PER_FILE:
            demangled += f"; and {item.total - MAX_SYMBOLS_PER_FILE} more undefined symbols"
        ctx.emit(
            "undefined-symbol-other",
            item.origin,
            mangled=item.name,
            demangled=demangled,
            bucket=item.bucket,
        )


def _emit_torch(
    ctx: Context,
    items: list[_Unresolved],
    extensions: dict[str, FileReport],
    names: dict,
    shim: bool = False,
) -> None:
    """Torch names no mangling of which torch exports: one finding per package (a build
    against another torch's API), the names as evidence; with ``shim``, functions of torch's
    stable C interface that torch does not export (a build against a newer torch's stable
    ABI)."""
    if shim:
        check = "undefined-symbol-shim"
    else:
        check = "undefined-symbol" if ctx.torch.present else "undefined-symbol-profile"
    by_owner: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for item in items:
        by_owner[owner_label(ctx, item.rel, extensions[item.rel])].append((item.origin, item.name))
    for label, found in sorted(by_owner.items()):
        files = sorted({o for o, _ in found})
        symbols = sorted({n for _, n in found})
        first = symbols[0]
        more = f"; {len(symbols)} torch symbols undefined in {len(files)} object(s)"
        ctx.emit(
            check,
            files[0] if len(files) == 1 else label,
            evidence=tuple(f"{o}: {_shown(n, names)}" for o, n in sorted(found)),
            mangled=first,
            demangled=names.get(first, first),
            more=more if len(found) > 1 else "",
            torch_ver=ctx.torch.version or ctx.profile.torch_version,
            source=ctx.profile_torch_source or "",
            where=_torch_named(ctx),
        )


def _shown(name: str, names: dict[str, str]) -> str:
    """A name, and what it demangles to where that differs (not a C function's)."""
    plain = names.get(name, name)
    return name if plain == name else f"{name} ({plain})"


def _torch_named(ctx: Context) -> str:
    """The torch the names were looked up in, as a finding names it."""
    if ctx.torch.present:
        return f"torch {ctx.torch.version}"
    return f"the profile's torch {ctx.profile.torch_version} ({ctx.profile_torch_source or ''})"


def _emit_unchecked(
    ctx: Context, unchecked: list[tuple[str, str, list[str], int]], extensions: dict
) -> None:
    """One note per package: the undefined names of objects whose NEEDED closure misses a
    library, left unchecked because that library might define them."""
    by_owner: dict[str, list[tuple[str, list[str], int]]] = defaultdict(list)
    for rel, origin, libs, count in unchecked:
        by_owner[owner_label(ctx, rel, extensions[rel])].append((origin, libs, count))
    for label, items in sorted(by_owner.items()):
        libs = sorted({lib for _, names, _ in items for lib in names})
        ctx.emit(
            "undefined-symbol-unchecked",
            items[0][0] if len(items) == 1 else label,
            evidence=tuple(
                f"{o}: {n} undefined symbol(s) not checked, {', '.join(ls)} missing"
                for o, ls, n in sorted(items)
            ),
            n=sum(n for _, _, n in items),
            libs=", ".join(libs),
        )


# Mangled pieces whose spelling depends on _GLIBCXX_USE_CXX11_ABI: the C++11 ABI's
# std::__cxx11 types and [abi:cxx11] tags; the old ABI's std::string (Ss), std::list and the
# string streams. A name holding none of them is mangled the same under both, and two
# manglings of one name are alike up to the first such piece (a name is mangled left to right).
_ABI_DEPENDENT = re.compile(
    r"N?St7__cxx11|B5cxx11|cxx11|Ss|St4list|St12basic_string|St15basic_stringbuf"
    r"|St18basic_stringstream|St19basic_[io]stringstream"
)


# The most other-ABI candidates demangled for one name (names sharing its mangled prefix).
MAX_TWIN_CANDIDATES = 256


_STRING = "std::basic_string<char, std::char_traits<char>, std::allocator<char> >"


def _abi_neutral(demangled: str) -> str:
    """A demangled name as both ABIs would spell it."""
    text = demangled.replace("[abi:cxx11]", "").replace("std::__cxx11::", "std::")
    return text.replace(_STRING, "std::string")


def _split_abi_flag(
    ctx: Context, items: list[_Unresolved], extensions: dict[str, FileReport]
) -> list[_Unresolved]:
    """Keep in ``ctx.abi_twins`` (per object) the undefined torch names that torch exports
    with the other _GLIBCXX_USE_CXX11_ABI mangling: the same name once demangled and rid of
    the ABI's spelling, the one holding ``cxx11`` where the other does not, the object built
    with another ABI than torch's (as far as either is known). Return the others: names no
    torch library exports in any mangling, an API change."""
    mangled = {i.name for i in items if i.name.startswith("_Z")}  # not THP's C names
    twins = _abi_twins(ctx, sorted(n for n in mangled if _ABI_DEPENDENT.search(n)))
    y = ctx.torch.cxx11_abi
    api = []
    for item in items:
        twin = twins.get(item.name)
        x = extensions[item.rel].elf.cxx11_abi
        if twin is None or (x is not None and x == y):
            api.append(item)
        else:
            ctx.abi_twins.setdefault(item.rel, []).append((item.name, twin))
    return api


def _abi_twins(ctx: Context, wanted: list[str]) -> dict[str, str]:
    """name -> an exported torch name it equals but for the ABI's spelling (c++filt)."""
    if not wanted:
        return {}
    exports = sorted(_torch_exports(ctx))
    candidates: dict[str, list[str]] = {}
    for name in wanted:
        prefix = name[: _ABI_DEPENDENT.search(name).start()]  # spelt alike by both ABIs
        start = bisect.bisect_left(exports, prefix)
        near = exports[start : start + MAX_TWIN_CANDIDATES]
        is_new = "cxx11" in name
        candidates[name] = [e for e in near if e.startswith(prefix) and ("cxx11" in e) != is_new]
    shown = demangle(sorted(set(wanted) | {c for cs in candidates.values() for c in cs}))
    out = {}
    for name, cands in candidates.items():
        key = _abi_neutral(shown[name]) if name in shown else None
        twin = next((c for c in cands if c in shown and _abi_neutral(shown[c]) == key), None)
        if twin is not None:
            out[name] = twin
    return out


def demangle(names: list[str]) -> dict[str, str]:
    """Demangle C++ names with c++filt when it is installed (one process for all)."""
    if not names:
        return {}
    tool = shutil.which("c++filt")
    if tool is None:
        return {}
    try:
        out = subprocess.run(
            [tool], input="\n".join(names), capture_output=True, text=True, timeout=30, check=False
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(zip(names, out, strict=True)) if len(out) == len(names) else {}


def check_cxx11(ctx: Context, extensions: dict[str, FileReport]) -> None:
    """An object built with the other _GLIBCXX_USE_CXX11_ABI than torch: by the undefined
    torch names torch exports with the other mangling (_split_abi_flag), else by the std::string
    spellings in its dynamic string table; the names as evidence."""
    for rel, rep in extensions.items():
        twins = ctx.abi_twins.get(rel, [])
        if twins:  # torch's mangling of the first name says which ABI torch uses
            y = 1 if "cxx11" in twins[0][1] else 0
            x = 1 - y
        elif not _other_abi(ctx, rep):
            continue
        else:
            x, y = rep.elf.cxx11_abi, ctx.torch.cxx11_abi
        shown = demangle([n for pair in twins for n in pair])
        ctx.emit(
            "cxx11-abi",
            rep.origin,
            evidence=tuple(
                f"{n}: undefined ({shown.get(n, n)}); torch exports {t}" for n, t in sorted(twins)
            ),
            x=x,
            y=y,
            example=shown.get(twins[0][0], twins[0][0]) if twins else "std::string overloads",
        )


def _other_abi(ctx: Context, rep: FileReport) -> bool:
    """A torch-linked object whose std::string spellings say another ABI than libc10's."""
    x, y = (rep.elf.cxx11_abi if rep.elf else None), ctx.torch.cxx11_abi
    if x is None or y is None or x == y:
        return False
    return any(n in TORCH_SONAMES for n in rep.elf.needed)


_VERSION = re.compile(r"^([A-Z]+)_(\d+(?:\.\d+)*)$")


def _vtuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def check_symbol_versions(ctx: Context) -> None:
    """Versioned references: against the verdefs of the library the loader picks in the tree,
    or, for the target host's libraries, against the versions the profile says it provides."""
    seen: set[tuple[str, str, str]] = set()  # (library, version, object): one finding each
    for cl in ctx.closures.values():
        _check_closure_versions(ctx, cl, seen)
    # Every object, loaded by an extension or not: what it needs from the host's runtime.
    host = {k: _vtuple(v) for k, v in ctx.profile.host_versions.items()}
    if host:
        for _rel, rep in sorted(ctx.reports.items()):
            if rep.elf is not None:
                _check_host_versions(ctx, rep, host, seen)
    _check_glibc_tags(ctx)


def _check_closure_versions(ctx: Context, cl: Closure, seen: set) -> None:
    """Each object of a closure: the versions it needs from a library of the closure that
    defines versions, against those definitions."""
    by_soname = {}
    for obj in cl.objects:
        if obj.report.elf and obj.report.elf.soname:
            by_soname[obj.report.elf.soname] = obj
    for obj in cl.objects:
        elf = obj.report.elf
        if elf is None:
            continue
        for lib, versions in elf.verneed.items():
            target = by_soname.get(lib)
            if target is None or target.report.elf is None or not target.report.elf.verdef:
                continue
            provided = set(target.report.elf.verdef)
            for v in versions:
                if v not in provided and (lib, v, elf.path) not in seen:
                    seen.add((lib, v, elf.path))
                    ctx.emit("symbol-version", elf.path, lib=lib, v=v, so=elf.path)


def _check_host_versions(ctx: Context, rep: FileReport, host: dict, seen: set) -> None:
    """One object's needs from the host's runtime libraries (those no checked file provides)
    against the newest version of each family the profile's host has."""
    elf = rep.elf
    for lib, versions in sorted(elf.verneed.items()):
        if not ctx.profile.host_provides(lib) or lib in _tree_sonames(ctx):
            continue
        for v in versions:
            m = _VERSION.match(v)
            if not m or m.group(1) not in host or (lib, v, elf.path) in seen:
                continue
            if _vtuple(m.group(2)) > host[m.group(1)]:
                seen.add((lib, v, elf.path))
                sym = elf.example(lib, v)
                ctx.emit(
                    "host-version",
                    rep.origin,
                    lib=lib,
                    v=v,
                    so=os.path.basename(rep.relpath),
                    sym=f" ({sym})" if sym else "",
                    family=m.group(1),
                    have=ctx.profile.host_versions[m.group(1)],
                )


def _tree_sonames(ctx: Context) -> set[str]:
    names = ctx.__dict__.get("_tree_sonames")
    if names is None:
        names = {rep.elf.soname for rep in ctx.reports.values() if rep.elf and rep.elf.soname}
        ctx.__dict__["_tree_sonames"] = names
    return names


def _check_glibc_tags(ctx: Context) -> None:
    """A wheel's manylinux tag against the newest GLIBC_ version any of its objects needs,
    from any library (libc, libm, libpthread, ld-linux ...)."""
    for dist in ctx.tree.dists.values():
        if not dist.wheel:
            continue
        tags = [tuple(map(int, m)) for m in re.findall(r"manylinux_(\d+)_(\d+)", dist.wheel)]
        if "manylinux2014" in dist.wheel:
            tags.append((2, 17))
        if "manylinux2010" in dist.wheel:
            tags.append((2, 12))
        if "manylinux1" in dist.wheel:
            tags.append((2, 5))
        if not tags:
            continue
        tag = max(tags)
        need: tuple[int, ...] = (0, 0)
        evidence: list[str] = []
        for rep in ctx.reports.values():
            if not (rep.elf and rep.origin.startswith(dist.wheel + "!")):
                continue
            for lib, versions in rep.elf.verneed.items():
                for v in versions:
                    m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", v)
                    if not m:
                        continue
                    have = (int(m.group(1)), int(m.group(2)))
                    if have > tag:
                        sym = rep.elf.example(lib, v)
                        evidence.append(
                            f"{rep.relpath}: {v} from {lib}" + (f" ({sym})" if sym else "")
                        )
                    need = max(need, have)
        if need > tag:
            ctx.emit(
                "wheel-glibc-tag",
                dist.wheel,
                evidence=tuple(sorted(set(evidence))),
                tag=f"manylinux_{tag[0]}_{tag[1]}",
                x=f"{need[0]}.{need[1]}",
            )


def check_one_runtime(ctx: Context) -> None:
    preload = [o for o in (ctx.loader.preloaded.values() if ctx.loader else [])]
    for cl in ctx.closures.values():
        families: dict[str, dict[str, Loaded]] = defaultdict(dict)
        for obj in list(cl.objects) + preload:
            name = (obj.report.elf.soname if obj.report.elf else None) or posixpath.basename(
                obj.key
            )
            m = ONE_RUNTIME.match(name)
            if m:
                families[m.group(1)][name] = obj
        for names in families.values():
            if len(names) > 1:
                (a, oa), (b, ob) = sorted(names.items())[:2]
                ctx.emit(
                    "one-runtime",
                    cl.objects[0].report.origin,
                    a=a,
                    b=b,
                    so_a=oa.report.origin,
                    so_b=ob.report.origin,
                )
                break
