"""`patchkit outlook`: what each release after a line's pin does to each of its patches."""

from __future__ import annotations

import os
from pathlib import Path

import click

from patchkit import completion
from patchkit.ui import Output, json_option


@click.command("outlook")
@click.option(
    "--target",
    "target_name",
    shell_complete=completion.target_names,
    help="The target (default: every target).",
)
@click.option(
    "--line",
    "line",
    shell_complete=completion.line_names,
    help="The line (default: every line of the target).",
)
@click.option("--since", help="Only releases after this version (default: the line's pin).")
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False),
    help="Also write the outlook as one self-contained HTML page.",
)
@click.option(
    "--markdown",
    is_flag=True,
    help="Print the table as Markdown, stamped (docs/series.md holds the SGLang lines' tables).",
)
@json_option
@click.option("-v", "--verbose", is_flag=True, help="Show progress even when not on a terminal.")
def command(target_name, line, since, html_file, markdown, as_json, verbose) -> int:
    """Classify every patch of each line on every release after its pin; exit 1 when the newest
    release needs work on a patch."""
    from patchkit.lines import line_series
    from patchkit.outlook import OutlookReport, index_source, line_outlook
    from patchkit.project import cache_root
    from patchkit.upstream.index import listings_kept
    from patchkit.workspace import Workspace

    out = Output(json_mode=as_json, verbose=verbose)
    ws = Workspace.load()
    names = [ws.targets.get(target_name).name] if target_name else list(ws.targets.targets)
    cache = cache_root()
    source = index_source(cache)
    report = OutlookReport()
    with out.reporting(), listings_kept():  # the index's page read once for every release
        for name in names:
            whole = ws.targets.get(name)
            for line_name in [line] if line else whole.line_names:
                target = ws.targets.get(name, line_name)
                series = line_series(ws.project, target)
                report.lines.append(line_outlook(target, series, source, cache, since=since))
    if html_file:
        from patchkit.files import replace_file
        from patchkit.review.render.outlook import render_page

        replace_file(Path(os.path.abspath(html_file)), render_page(report).encode("utf-8"))
    out.document(report.to_json())
    out.echo(render_markdown(report) if markdown else render_outlook(report))
    if html_file:
        out.echo(f"wrote {html_file}")
    return 1 if report.needs_work else 0


def render_outlook(report) -> str:
    """The terminal table: releases as columns, patches as rows, then what needs work."""
    from patchkit.outlook import CODES, LEGEND, PROVISIONAL

    lines = []
    for line in report.lines:
        lines += _line_table(line)[:-1] + _unusable_rows(line) + [""]
    legend = ", ".join(f"{code} {state}" for state, code in CODES.items())
    lines.append(f"legend: {legend}; ? {PROVISIONAL}; ! a probe of what the patch guarantees fails")
    for state, words in LEGEND.items():
        lines.append(f"  {CODES[state]} {state}: {words}")
    return "\n".join(lines)


MARKDOWN_END = "<!-- end patchkit outlook -->"


def markdown_head(line) -> str:
    """The comment that opens a line's Markdown table: the command that writes it and what it
    was made from (the classifier and the series, `outlook_stamp`; the releases)."""
    span = f"{line.releases[0].version}..{line.newest}" if line.releases else "none"
    return (
        f"<!-- patchkit outlook --target {line.target} --line {line.line} --markdown"
        f" | stamp {line.stamp}, releases {span} -->"
    )


def render_markdown(report) -> str:
    """Each line as a Markdown table (releases as columns, one letter a state), between a
    stamped opening comment and MARKDOWN_END, so a document can hold it and a test can
    compare it."""
    from patchkit.outlook import CODES, PROVISIONAL

    legend = ", ".join(f"`{code}` {state}" for state, code in CODES.items())
    out = []
    for line in report.lines:
        out.append(markdown_head(line))
        if not line.releases:
            out += ["", f"No release after {line.pin} on the package index.", "", MARKDOWN_END]
            continue
        versions = [r.version for r in line.releases]
        out.append("")
        out.append("| patch | " + " | ".join(versions) + " | retire at |")
        out.append("|---|" + "---|" * len(versions) + "---|")
        for patch in line.patches:
            cells = [patch.cells[v] for v in versions]
            codes = [c.code for c in cells]
            name = patch.name.removesuffix(".patch")
            out.append(f"| `{name}` | " + " | ".join(codes) + f" | {patch.retire_at or '-'} |")
        out += ["", f"{legend}; `?` {PROVISIONAL}; "
                "`!` a probe of what the patch guarantees fails.", ""]  # fmt: skip
        out.append(MARKDOWN_END)
    return "\n".join(out)


def _line_table(line) -> list[str]:
    head = f"{line.target} line {line.line} (pin {line.pin})"
    if not line.releases:
        return [f"{head}: no release after the pin on the package index", ""]
    versions = [r.version for r in line.releases]
    prefix = os.path.commonprefix(versions)
    prefix = prefix[: prefix.rfind(".") + 1]
    short = [v[len(prefix) :] for v in versions]
    width = max((len(p.name.removesuffix(".patch")) for p in line.patches), default=0)
    cols = [max(len(s), 2) for s in short]
    rows = [
        f"{head}: {len(versions)} release(s), {versions[0]} to {versions[-1]}"
        + (f" (columns: {prefix}*)" if prefix else ""),
        f"  {'':<{width}}  " + " ".join(s.rjust(c) for s, c in zip(short, cols, strict=True))
        + "  retire at",
    ]  # fmt: skip
    for patch in line.patches:
        cells = []
        for version, col in zip(versions, cols, strict=True):
            cell = patch.cells[version]
            cells.append(cell.code.rjust(col))
        rows.append(
            f"  {patch.name.removesuffix('.patch'):<{width}}  {' '.join(cells)}  "
            f"{patch.retire_at or '-'}"
        )
    rows += _newest_notes(line)
    rows.append("")
    return rows


def _unusable_rows(line) -> list[str]:
    """One row per release whose base could not be had, saying why."""
    return [f"  {version}: unusable: {why}" for version, why in line.unusable.items()]


def _newest_notes(line) -> list[str]:
    newest = line.newest
    out = [f"  on {newest}:"]
    for patch in line.patches:
        cell = patch.cells[newest]
        if cell.state in ("clean", "offset") and not cell.probe_failed:
            continue
        out.append(f"    {cell.state:>17}  {patch.name}")
        if cell.conflicts:
            out.append(f"{'':23}conflicts in {', '.join(cell.conflicts)}")
        out += [f"{'':23}{p['path']}: {p['state']} ({p['detail']})" for p in cell.parts]
        out += [f"{'':23}evidence: {e}" for e in cell.evidence[:3]]
        if cell.note:
            out.append(f"{'':23}{cell.note}")
    work = line.needs_work
    out.append(
        f"  needs work on {newest}: {', '.join(work)}"
        if work
        else f"  {newest} takes the series as it is (nothing in conflict)"
    )
    if line.retire_at:
        out.append(f"  every patch of the line could be retired at {line.retire_at}")
    return out
