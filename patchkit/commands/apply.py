"""`patchkit apply`: check out a pinned base and apply the series, atomically."""

from __future__ import annotations

from pathlib import Path

import click

from patchkit import completion
from patchkit.apply import ApplyOptions, ApplyReport, apply_series
from patchkit.errors import ApplyError, NothingToDo, UsageError
from patchkit.files import within
from patchkit.lines import line_series, pick_line
from patchkit.project import cache_root
from patchkit.report import render_apply
from patchkit.ui import Output, json_option
from patchkit.upstream import Mirror, acquire
from patchkit.workspace import Workspace


@click.command("apply")
@click.option(
    "--target",
    "targets",
    shell_complete=completion.target_names,
    multiple=True,
    required=True,
    help="NAME@REF (a sha, tag or release version), NAME for its pin, or 'all'.",
)
@click.option(
    "--into",
    type=click.Path(path_type=Path),
    help="Directory to check out into (default: work/<target>; with several targets, "
    "DIR/<target>).",
)
@click.option(
    "--line",
    shell_complete=completion.line_names,
    help="The series line to apply (default: the line whose pin REF names, else the default).",
)
@click.option("--upstream", help="A clone, bare repository or URL to fetch the base from first.")
@click.option(
    "--fuzz",
    type=click.IntRange(0, 2),
    default=0,
    show_default=True,
    help="Allow hunks to apply with this many context lines ignored (reported loudly).",
)
@click.option("--3way", "threeway", is_flag=True, help="Fall back to a 3-way merge on the blobs.")
@click.option(
    "--allow-unpinned", is_flag=True, help="Accept a base that no pin names (unverified)."
)
@json_option
@click.option("-v", "--verbose", is_flag=True, help="Show progress even when not on a terminal.")
def command(targets, into, line, upstream, fuzz, threeway, allow_unpinned, as_json, verbose) -> int:
    """Apply the series of each --target onto its base, as one commit per patch."""
    out = Output(json_mode=as_json, verbose=verbose)
    return _run(out, targets, into, line, upstream, fuzz, threeway, allow_unpinned)


def _run(out, targets, into, line, upstream, fuzz, threeway, allow_unpinned) -> int:
    as_json = out.json_mode
    ws = Workspace.load()
    ws.project.refuse_unnamed("apply without --into", when=into is None)  # into work/
    specs = ws.expand(targets)
    if len(specs) > 1 and upstream:
        raise UsageError("--upstream names one repository; use it with a single --target")
    reports: list[ApplyReport] = []
    for spec in specs:
        target = pick_line(ws.target(spec.target), spec.ref, line)
        series = line_series(ws.project, target)
        if into is None:
            dest = ws.project.work_dir / spec.target
        else:
            dest = into / spec.target if len(specs) > 1 else into
        _refuse_inside_cache(dest)
        _refuse_the_project(dest, ws.project.root)
        with out.reporting():
            base = acquire(target, spec.ref, upstream=upstream, allow_unpinned=allow_unpinned)
            try:
                report = apply_series(
                    Mirror(target).repo,
                    base,
                    series,
                    dest.absolute(),
                    series_version=ws.targets.series_version,
                    options=ApplyOptions(fuzz=fuzz, threeway=threeway),
                    verified=cache_root() / "verified",
                )
            except (ApplyError, NothingToDo) as exc:
                report = getattr(exc, "report", None)
                if report is None or (
                    isinstance(exc, ApplyError)
                    and not as_json
                    and len(specs) == 1
                    and not report.patches
                ):
                    raise
                if isinstance(exc, ApplyError):
                    report.next_step = exc.hint
        reports.append(report)
        if not as_json:
            out.echo(render_apply(report))
            if report.status == "failed" and report.next_step:
                out.echo(f"  next: {report.next_step}")
        if report.status == "failed":
            break
    if as_json:
        out.document({"reports": [r.to_json() for r in reports]})
    statuses = {r.status for r in reports}
    if "failed" in statuses:
        return 1
    if statuses == {"nothing-to-do"}:
        return 3
    return 0


def _refuse_the_project(dest: Path, root: Path) -> None:
    """The project's own checkout (or a folder holding it) checked out at the series would
    take `patches/` out of its work tree: refused."""
    if within(root, dest):
        raise UsageError(
            f"{dest} holds this project ({root}, its patches/): checking the series out "
            "there would replace the project's own files; nothing was written",
            hint="pass another directory (the default is work/<target> in the project)",
        )


def _refuse_inside_cache(dest: Path) -> None:
    """The cache is patchkit's to sweep and rewrite: a checkout there would be lost."""
    cache = cache_root()
    if within(dest, cache):
        raise UsageError(
            f"{dest} is inside patchkit's cache ({cache}), which patchkit sweeps and rewrites; "
            "nothing was written",
            hint="pass a directory outside it",
        )
