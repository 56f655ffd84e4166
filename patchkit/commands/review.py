"""`patchkit review`: the upstream-diff review, in the terminal or as one HTML page."""

from __future__ import annotations

from pathlib import Path

import click

from patchkit import completion
from patchkit.errors import UsageError
from patchkit.files import replace_file
from patchkit.lines import check_line_names
from patchkit.review import build_review
from patchkit.review.render import html, terminal
from patchkit.targets import parse_target_spec
from patchkit.ui import Output, json_option
from patchkit.workspace import Workspace


@click.command("review")
@click.option(
    "--target",
    "targets",
    shell_complete=completion.target_names,
    multiple=True,
    help="Review only these targets.",
)
@click.option(
    "--line",
    shell_complete=completion.line_names,
    help="Review this series line of each target (default: default lines).",
)
@click.option(
    "--against",
    "against",
    multiple=True,
    metavar="TARGET@REF",
    help="Add each patch's rebase classification for this newer ref.",
)
@click.option(
    "--since", metavar="REV", help="Compare the series with its version at REV of this repository."
)
@click.option(
    "--html",
    "html_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write one self-contained HTML page here.",
)
@click.option("--no-diff", is_flag=True, help="Terminal: leave out the full combined diff.")
@json_option
@click.option("-v", "--verbose", is_flag=True, help="Show progress even when not on a terminal.")
def command(targets, line, against, since, html_file, no_diff, as_json, verbose) -> int:
    """Patch table, upstream status, combined delta and changes between series versions."""
    out = Output(json_mode=as_json, verbose=verbose)
    ws = Workspace.load()
    refs: dict[str, str] = {}
    for spec in against:
        parsed = parse_target_spec(spec)
        if not parsed.ref:
            raise UsageError(f"--against {spec}: expected TARGET@REF (e.g. sglang@0.5.10)")
        ws.target(parsed.target)
        refs[parsed.target] = parsed.ref
    names = list(targets) or None
    for name in names or []:
        ws.target(name)
    if line is not None:
        check_line_names([ws.target(name) for name in names or ws.targets.targets], [line])
    with out.reporting():
        review = build_review(ws, targets=names, against=refs, since=since, line=line)
    if html_file is not None:
        replace_file(html_file, html.render(review).encode("utf-8"))
    if as_json:
        out.document(review.to_json())
    elif html_file is not None:
        total = sum(len(t.patches) for t in review.targets)
        out.echo(f"wrote {html_file} ({total} patch(es) in {len(review.targets)} target(s))")
    else:
        out.echo(terminal.render(review, full_diff=not no_diff).rstrip("\n"))
    return 1 if any(t.error for t in review.targets) else 0
