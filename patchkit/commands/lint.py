"""`patchkit lint`: series hygiene, metadata, whitespace, paths, overlaps and the re-export."""

from __future__ import annotations

import click

from patchkit import completion, gitops
from patchkit.lines import check_line_names, line_series
from patchkit.lint import LintReport, RoundTripStamp, lint_target, lint_targets_file
from patchkit.project import cache_root
from patchkit.stamps import module_files
from patchkit.targets import Target
from patchkit.ui import Output, json_option
from patchkit.upstream import Mirror, acquire
from patchkit.workspace import Workspace

# The modules whose code decides what building and exporting a series gives (found without
# importing them: a lint whose round trip is proven needs neither apply nor export): this
# command's, the build's, the export's, git's verbs and the patch parser (with unidiff's).
ROUND_TRIP_MODULES = (
    "patchkit.commands.lint",
    "patchkit.apply",
    "patchkit.export",
    "patchkit.gitops",
    "patchkit.series",
    "unidiff.patch",
)


@click.command("lint")
@click.option(
    "--target",
    "targets",
    shell_complete=completion.target_names,
    multiple=True,
    help="Lint only these targets (default: all).",
)
@click.option(
    "--line",
    "line_names",
    shell_complete=completion.line_names,
    multiple=True,
    help="Lint only these lines (default: all).",
)
@click.option(
    "--no-reexport",
    is_flag=True,
    help="Skip the apply + export round trip (needs the pinned upstreams).",
)
@json_option
@click.option("-v", "--verbose", is_flag=True, help="Show progress even when not on a terminal.")
def command(targets, line_names, no_reexport, as_json, verbose) -> int:
    """Check the series of every line of every target; exit 1 on any error."""
    out = Output(json_mode=as_json, verbose=verbose)
    ws = Workspace.load()
    names = list(targets) or list(ws.targets.targets)
    check_line_names([ws.target(name) for name in names], line_names)

    def reexporter(target: Target):
        def reexport(_label: str) -> dict[str, bytes]:
            base = acquire(target, None)
            mirror = Mirror(target).repo
            patches = line_series(ws.project, target)
            stamp = RoundTripStamp.of(
                cache_root() / "verified",
                target.name,
                base.commit,
                patches.patches,
                module_files(ROUND_TRIP_MODULES),
                gitops.program_identity(),
            )
            if stamp.holds():  # this exact round trip was proven before: its bytes are these
                return {p.name: p.raw for p in patches.patches}
            from patchkit.apply import ApplyOptions, build_series
            from patchkit.export import export_commits

            tip, _ = build_series(mirror, base.commit, patches, ApplyOptions())
            exported = {p.name: p.raw for p in export_commits(mirror, base.commit, tip)}
            stamp.record(patches.patches, exported)
            return exported

        return reexport

    report = LintReport()
    if ws.targets.path is not None:
        report.findings += lint_targets_file(ws.targets.path).findings
    with out.reporting():
        for name in names:
            whole = ws.target(name)
            for line in whole.line_names:
                if line_names and line not in line_names:
                    continue
                target = whole.on_line(line)
                label = target.current_line.series  # the folder under patches/, e.g. sglang/0.5.9
                out.progress(f"linting {label}")
                one = lint_target(
                    label,
                    ws.project.patches_dir / label,
                    target.subdir,
                    reexport=None if no_reexport else reexporter(target),
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
            f"lint: {total} patch(es) in {len(report.checked)} line(s): "
            f"{len(report.errors)} error(s), {len(report.warnings)} warning(s)"
        )
    return 1 if report.errors else 0
