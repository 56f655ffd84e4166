"""`patchkit inspect`: what a wheel or an installed distribution carries, and is it intact."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from patchkit.errors import UsageError
from patchkit.ui import Output, json_option
from patchkit.wheels.inspection import Inspection, inspect_installed, inspect_wheel


def render_inspection(report: Inspection) -> str:
    lines = [f"{report.distribution} {report.version} ({report.kind}: {report.location})"]
    prov = report.provenance
    if prov is None:
        lines.append("  no patchkit provenance: this distribution was not built by patchkit")
    else:
        upstream = prov.upstream_commit or "unknown"
        lines.append(
            f"  upstream  {prov.upstream_version} (commit {upstream}, "
            f"{prov.base_source} base {prov.base_commit[:12]})"
        )
        if prov.sdist:
            lines.append(f"  sdist     {prov.sdist} sha256 {prov.sdist_sha256}")
        lines.append(f"  series    {prov.series_label}, {len(prov.patches)} patch(es)")
        for patch in prov.patches:
            lines.append(f"    {patch.name}  {patch.sha256[:12]}  {patch.subject}")
        lines.append(
            f"  profile   {prov.profile.get('name', '?')} "
            f"(variant {prov.profile.get('variant', '?')})"
        )
        tools = ", ".join(f"{k} {v}" for k, v in sorted(prov.tools.items()))
        lines.append(f"  built by  {tools}")
    for sbom in report.sboms:
        lines.append(f"  SBOM      {sbom}")
    if report.problems:
        lines.append(f"  MODIFIED: {len(report.problems)} of the files differ from RECORD:")
        for problem in report.problems:
            lines.append(f"    {problem.problem:>8}  {problem.path}")
    else:
        lines.append(f"  files     {report.checked} checked against RECORD: all match")
    return "\n".join(lines)


def _default_paths() -> list[str] | None:
    """The active virtualenv's site-packages, then this interpreter's sys.path (patchkit
    often runs from its own venv, not the one sglang was installed into); None without one."""
    venv = os.environ.get("VIRTUAL_ENV")
    found = sorted(str(p) for p in Path(venv).glob("lib/python*/site-packages")) if venv else []
    return [*found, *sys.path] if found else None


@click.command("inspect")
@click.argument("wheel", required=False, type=click.Path(path_type=Path))
@click.option(
    "--installed",
    "dist",
    metavar="DIST",
    help="An installed distribution to check (e.g. sglang) instead of a wheel file.",
)
@click.option(
    "--path",
    "paths",
    multiple=True,
    type=click.Path(path_type=Path),
    help="site-packages directory to look in for --installed (repeatable; default: "
    "the active virtualenv's, then this interpreter's sys.path).",
)
@json_option
def command(wheel, dist, paths, as_json) -> int:
    """Show what WHEEL or an --installed distribution carries: upstream, series, patches.

    Exit 1 when files differ from RECORD (each is named), 3 when there is no patchkit
    provenance.
    """
    if (wheel is None) == (dist is None):
        raise UsageError("pass a WHEEL file or --installed DIST (one of them)")
    if paths and dist is None:
        raise UsageError("--path only applies with --installed")
    output = Output(json_mode=as_json)
    if wheel is not None:
        report = inspect_wheel(wheel)
    else:
        report = inspect_installed(dist, [str(p) for p in paths] if paths else _default_paths())
    if as_json:
        output.document(report.to_json())
    else:
        output.echo(render_inspection(report))
    return report.exit_code
