"""`patchkit status`: base, series version and each patch's state in a work tree."""

from __future__ import annotations

from pathlib import Path

import click

from patchkit import completion, gitops
from patchkit.lines import checkout_line, line_series
from patchkit.report import render_status
from patchkit.status import detect_target, status
from patchkit.ui import Output, json_option
from patchkit.workspace import Workspace


@click.command("status")
@click.argument("directory", required=False, type=click.Path(path_type=Path))
@click.option(
    "--target",
    shell_complete=completion.target_names,
    help="Target name (default: the one the directory was made for).",
)
@click.option(
    "--line",
    shell_complete=completion.line_names,
    help="Series line (default: the one the directory's base is pinned for).",
)
@json_option
def command(directory, target, line, as_json) -> int:
    """Show what DIRECTORY (default: work/<target>) carries versus the series."""
    ws = Workspace.load()
    out = Output(json_mode=as_json)
    if directory is None:
        names = [target] if target else list(ws.targets.targets)
        dirs = [ws.project.work_dir / n for n in names if (ws.project.work_dir / n).exists()]
        if not dirs:
            raise click.UsageError("no work tree found; pass DIRECTORY")
    else:
        dirs = [directory]
    reports = []
    lines = []
    for d in dirs:
        checkout = gitops.Repo.checkout(d.absolute())
        name = target or detect_target(checkout)
        view = checkout_line(checkout, ws.target(name), line)
        lines.append(view.line)
        reports.append(
            status(checkout, view, line_series(ws.project, view), ws.targets.series_version)
        )
    if as_json:
        out.document(
            {"status": [{**r.to_json(), "line": ln} for r, ln in zip(reports, lines, strict=True)]}
        )
    else:
        out.echo("\n".join(render_status(r) for r in reports))
    return 0 if all(r.clean for r in reports) else 1
