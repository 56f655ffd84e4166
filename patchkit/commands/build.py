"""`patchkit build`: patched, versioned, reproducible wheels with provenance and an SBOM."""

from __future__ import annotations

import os
from pathlib import Path

import click

from patchkit import completion
from patchkit.errors import UsageError
from patchkit.files import within
from patchkit.ui import Output, json_option
from patchkit.wheels import DEFAULT_PROFILE, BuildOptions, build_wheels, load_build_profile
from patchkit.wheels.build import BuildReport
from patchkit.workspace import Workspace


def render_build(report: BuildReport) -> str:
    lines = []
    for wheel in report.wheels:
        prov = wheel.provenance
        lines.append(f"{wheel.path}")
        lines.append(
            f"  {prov.distribution} {prov.version}: {prov.upstream_version} "
            f"({prov.base_source} base {prov.base_commit[:12]}) + {prov.series_label}, "
            f"{len(prov.patches)} patch(es)"
        )
        for patch in prov.patches:
            lines.append(f"    {patch.name}")
        lines.append(f"  sha256 {wheel.sha256}  ({wheel.seconds:.1f}s)")
    for skipped in report.skipped:
        lines.append(f"{skipped.target}: no wheel: {skipped.reason}")
    return "\n".join(lines)


@click.command("build")
@click.option(
    "--target",
    "targets",
    shell_complete=completion.target_names,
    multiple=True,
    default=("all",),
    show_default=True,
    help="sglang, flashinfer or all (NAME@REF builds the line pinned to REF).",
)
@click.option(
    "--profile",
    "profile_name",
    shell_complete=completion.profile_names,
    default=DEFAULT_PROFILE,
    show_default=True,
    envvar="PATCHKIT_PROFILE",
    help="Build profile in build/profiles/ (CUDA variant).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Directory for the wheels (default: dist/ in the project).",
)
@click.option(
    "--keep-tree",
    is_flag=True,
    help="Keep the patched tree in work/build/<target>/ after a build that succeeds "
    "(a failed build always keeps it); else only its build.log stays.",
)
@click.option(
    "--no-isolation",
    is_flag=True,
    help="Build in this environment (its build requirements must be installed) "
    "instead of a fresh isolated one.",
)
@click.option(
    "--line",
    shell_complete=completion.line_names,
    help="Build this series line (default: the line whose pin the ref names, else the default).",
)
@click.option(
    "--python-tag",
    "python_tags",
    multiple=True,
    help="Wheel bases: repack only the pinned wheels for this python tag (e.g. cp312).",
)
@click.option(
    "--platform",
    "platforms",
    multiple=True,
    help="Wheel bases: repack only the pinned wheels for this platform tag.",
)
@json_option
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Stream the build backend's output (to stderr, as it comes) and every progress line.",
)
def command(
    targets, profile_name, out, keep_tree, no_isolation, line, python_tags, platforms, as_json,
    verbose,
) -> int:  # fmt: skip
    """Apply the series into a clean tree and build each patched target's wheel(s)."""
    output = Output(json_mode=as_json, verbose=verbose)
    ws = Workspace.load()
    ws.project.refuse_unnamed("build")
    profile = load_build_profile(ws.project.build_dir / "profiles", profile_name)
    out_dir = (out or ws.project.root / "dist").absolute()
    _check_out(out_dir, ws.project.work_dir / "build")
    options = BuildOptions(
        out=out_dir,
        work_root=ws.project.work_dir / "build",
        isolation=not no_isolation,
        keep_tree=keep_tree,
        python_tags=tuple(python_tags),
        platforms=tuple(platforms),
        backend_output=output.backend_line if verbose else None,
    )
    with output.reporting():
        report = build_wheels(ws, ws.expand(targets), profile=profile, options=options, line=line)
    if as_json:
        output.document(report.to_json())
    else:
        output.echo(render_build(report))
    return 0


def _check_out(out: Path, work_root: Path) -> None:
    """Before anything is built: the out folder must be a folder (or not exist yet) and lie
    outside the build scratch, which the next build moves aside and sweeps whole."""
    if within(out, work_root):
        raise UsageError(
            f"--out {out} is inside the build scratch {work_root}, which the next build "
            "removes with everything in it; nothing was built",
            hint="pass a folder outside it (the default is dist/)",
        )
    if os.path.lexists(out) and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder; nothing was built")
