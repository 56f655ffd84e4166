"""`patchkit lint`: series hygiene, metadata, whitespace, paths, overlaps and the re-export."""

from __future__ import annotations

import click

from patchkit.apply import ApplyOptions, build_series
from patchkit.export import export_commits
from patchkit.lint import LintReport, lint_target
from patchkit.ui import Output
from patchkit.upstream import Mirror, acquire
from patchkit.workspace import Workspace


@click.command("lint")
@click.option("--target", "targets", multiple=True, help="Lint only these targets (default: all).")
@click.option(
    "--no-reexport",
    is_flag=True,
    help="Skip the apply + export round trip (needs the pinned upstreams).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("-v", "--verbose", is_flag=True, help="Show progress even when not on a terminal.")
def command(targets, no_reexport, as_json, verbose) -> int:
    """Check the series of every target; exit 1 on any error."""
    out = Output(json_mode=as_json, verbose=verbose)
    ws = Workspace.load()
    names = list(targets) or list(ws.targets.targets)

    def reexport(name: str) -> dict[str, bytes]:
        target = ws.target(name)
        base = acquire(target, None, progress=out.progress)
        mirror = Mirror(target).path
        tip, _ = build_series(mirror, base.commit, ws.series(name), ApplyOptions(), bare=True)
        return {p.name: p.raw for p in export_commits(mirror, base.commit, tip, bare=True)}

    report = LintReport()
    for name in names:
        target = ws.target(name)
        out.progress(f"linting {name}")
        one = lint_target(
            name,
            ws.project.series_dir(name),
            target.subdir,
            reexport=None if no_reexport else reexport,
        )
        report.findings += one.findings
        report.checked.update(one.checked)
    if as_json:
        out.document(report.to_json())
    else:
        for f in report.findings:
            where = f"{f.target}/{f.patch}" if f.patch else f.target
            out.echo(f"{f.severity}: {where}: [{f.rule}] {f.message}")
        total = sum(len(v) for v in report.checked.values())
        out.echo(
            f"lint: {total} patch(es) in {len(report.checked)} target(s): "
            f"{len(report.errors)} error(s), {len(report.warnings)} warning(s)"
        )
    return 1 if report.errors else 0
