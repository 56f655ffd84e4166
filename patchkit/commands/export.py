"""`patchkit export DIR`: regenerate a target's patch files from the commits of a work tree."""

from __future__ import annotations

from pathlib import Path

import click

from patchkit import completion, gitops
from patchkit.export import SeriesRead, export_worktree
from patchkit.lines import checkout_line
from patchkit.status import detect_target
from patchkit.ui import Output, json_option
from patchkit.workspace import Workspace


@click.command("export")
@click.argument("directory", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--target",
    shell_complete=completion.target_names,
    help="Target name (default: the one DIRECTORY was made for).",
)
@click.option(
    "--line",
    shell_complete=completion.line_names,
    help="Series line (default: the one DIRECTORY's base is pinned for).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    help="Write the series here instead of the line's folder in patches/.",
)
@click.option(
    "--dry-run",
    "--check",
    "dry_run",
    is_flag=True,
    help="Write nothing; exit 1 when the patch files would change (a CI check).",
)
@json_option
def command(directory, target, line, out, dry_run, as_json) -> int:
    """One .patch per commit of DIRECTORY (base..HEAD), in deterministic bytes."""
    output = Output(json_mode=as_json)
    checkout = gitops.Repo.checkout(directory.absolute())
    name = target or detect_target(checkout)
    by = "while the export ran"
    if out is None:
        ws = Workspace.load()
        ws.project.refuse_unnamed("export", when=not dry_run)
        view = checkout_line(checkout, ws.target(name), line)
        out = ws.project.patches_dir / view.current_line.series
        read = SeriesRead.take(out, ws.project, seen=ws.targets_digest, by=by)
    else:
        read = SeriesRead.take(out, by=by)
    report = export_worktree(checkout, name, out, dry_run=dry_run, read=read)
    if as_json:
        output.document(report.to_json())
    else:
        verb = "would write" if dry_run else "wrote"
        output.echo(f"{name}: {len(report.patches)} patch(es) from {directory} -> {out}")
        for patch in report.patches:
            state = f"{verb}" if patch.name in report.written else "unchanged"
            how = "" if patch.named_by == "trailer" else "  (named from the subject)"
            output.echo(f"  {state:>11}  {patch.name}{how}")
        for name_ in report.removed:
            output.echo(f"  {'would remove' if dry_run else 'removed':>11}  {name_}")
        for name_ in report.left:
            output.echo(f"  {'left':>11}  {name_}  (not in the series: not export's to remove)")
        if report.series_changed:
            output.echo(f"  {verb} {out / 'series'}")
        if dry_run and report.changed:
            count = len(report.written) + len(report.removed)
            output.echo(f"{count} patch(es) need update: run `patchkit export {directory}`")
    return 1 if dry_run and report.changed else 0
