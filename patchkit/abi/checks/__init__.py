"""The verify checks: functions from a Context to Finding records, one module per family
(`distributions`, `loading`, `symbols`, `running`, `jit`), run in order by `run_checks`.
Nothing here prints.

Severities, messages and next steps come from ``checks.toml`` (overridable per profile); the
functions only decide whether a rule is broken and fill in the fields.
"""

from __future__ import annotations

import fnmatch
import os

from patchkit.abi.checks.context import (
    Context,
    DriverInfo,
    Finding,
    _top,
    detect_driver,
    extension_reports,
    read_torch,
)
from patchkit.abi.checks.distributions import (
    check_cuda_wheels,
    check_profile_stack,
    check_sgl_kernel,
    check_torch_dist,
    check_torch_pins,
    check_torch_variant,
    check_wheel_filenames,
)
from patchkit.abi.checks.jit import check_cuda_python, check_flashinfer, check_jit_toolchain
from patchkit.abi.checks.loading import (
    build_loader,
    check_cuda_major,
    check_needed,
    load_profile_torch,
)
from patchkit.abi.checks.running import (
    check_coverage,
    check_device_files,
    check_device_toolkit,
    check_driver,
    check_loader_hardcode,
    check_torch_archs,
    predict,
)
from patchkit.abi.checks.symbols import (
    check_cxx11,
    check_one_runtime,
    check_symbol_versions,
    check_symbols,
)
from patchkit.abi.checks.variants import select_variants

# What callers take from here: the context, its findings, the driver, the predictions.
__all__ = ["Context", "DriverInfo", "Finding", "detect_driver", "predict", "run_checks"]


def check_malformed(ctx: Context) -> None:
    for wheel, reason in ctx.tree.invalid:
        ctx.emit("invalid-archive", wheel, reason=reason)
    for path, reason in ctx.tree.unread:
        ctx.emit("unreadable-file", path, reason=reason)
    for rel, rep in sorted(ctx.reports.items()):
        if rep.error:
            if rep.error.startswith("invalid archive"):
                ctx.emit("invalid-archive", rep.origin, reason=rep.error)
            elif (
                "wrong magic" not in rep.error
                or rep.kind != "elf"
                or _top(rel) == "torch"
                or any(fnmatch.fnmatch(_top(rel), p) for p in ctx.profile.extension_packages)
            ):
                ctx.emit("malformed-elf", rep.origin, reason=rep.error)
        elif rep.fatbin_error:
            ctx.emit("malformed-fatbin", rep.origin, reason=rep.fatbin_error)


def check_nothing(ctx: Context) -> None:
    """No object to check is an error, except for a wheelhouse of pure-Python wheels (what
    `make wheels` builds for a line): their metadata is checked, and that is said."""
    if ctx.reports:
        return
    wheels = sorted(os.path.basename(d.wheel) for d in ctx.tree.dists.values() if d.wheel)
    if ctx.tree.kind == "wheelhouse" and not ctx.tree.has_env and wheels and not ctx.tree.invalid:
        folder = os.path.dirname(min(ctx.tree.wheels)) if ctx.tree.wheels else ctx.tree.root
        ctx.emit("pure-python", folder, evidence=tuple(wheels), n=len(wheels), folder=folder)
    else:
        ctx.emit(
            "nothing-checked",
            ctx.tree.root if ctx.tree.kind == "env" else "wheelhouse",
            n=len(ctx.tree.dists),
        )


def run_checks(ctx: Context) -> list[Finding]:
    """Run every check over ``ctx`` and return the findings, errors first."""
    read_torch(ctx)
    load_profile_torch(ctx)
    check_nothing(ctx)
    select_variants(ctx)
    check_malformed(ctx)
    check_profile_stack(ctx)
    check_torch_variant(ctx)
    check_torch_dist(ctx)
    check_torch_pins(ctx)
    check_cuda_wheels(ctx)
    check_sgl_kernel(ctx)
    check_wheel_filenames(ctx)
    extensions = extension_reports(ctx)
    check_cuda_major(ctx, extensions)
    build_loader(ctx)
    check_needed(ctx, extensions)
    check_symbols(ctx, extensions)
    check_cxx11(ctx, extensions)
    check_symbol_versions(ctx)
    check_one_runtime(ctx)
    check_loader_hardcode(ctx)
    check_driver(ctx)
    check_coverage(ctx)
    check_device_files(ctx)
    check_device_toolkit(ctx, extensions)
    check_torch_archs(ctx)
    check_flashinfer(ctx)
    check_jit_toolchain(ctx)
    check_cuda_python(ctx)
    order = {"error": 0, "warning": 1, "note": 2}
    return sorted(ctx.findings, key=lambda f: (order.get(f.severity, 3), f.number, f.file))
