"""`patchkit fetch`: fill the mirror cache for a target ref (git, the pinned sdist or wheel)."""

from __future__ import annotations

import click

from patchkit import completion
from patchkit.ui import Output, json_option
from patchkit.upstream import acquire
from patchkit.workspace import Workspace


@click.command("fetch")
@click.option(
    "--target",
    "targets",
    shell_complete=completion.target_names,
    multiple=True,
    required=True,
    help="NAME@REF or 'all'.",
)
@click.option("--upstream", help="A clone, bare repository or URL to fetch from first.")
@click.option(
    "--allow-unpinned", is_flag=True, help="Accept a base that no pin names (unverified)."
)
@json_option
def command(targets, upstream, allow_unpinned, as_json) -> int:
    """Resolve and cache the base of each target without touching any work tree."""
    out = Output(json_mode=as_json, verbose=True)
    return _run(out, targets, upstream, allow_unpinned)


def _run(out: Output, targets, upstream, allow_unpinned) -> int:
    as_json = out.json_mode
    ws = Workspace.load()
    docs = []
    for spec in ws.expand(targets):
        with out.reporting():
            base = acquire(
                ws.target(spec.target), spec.ref, upstream=upstream, allow_unpinned=allow_unpinned
            )
        docs.append(
            {
                "target": spec.target,
                "commit": base.commit,
                "source": base.source,
                "stands_for": base.stands_for,
            }
        )
        out.echo(f"{spec.target}: {base.commit[:12]} ({base.stands_for})")
        if base.unverified:
            click.echo(f"WARNING: {base.unverified}", err=True)
    if as_json:
        out.document({"bases": docs})
    return 0
