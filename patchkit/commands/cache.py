"""`patchkit cache`: what the cache holds; `--prune` removes old objects nothing refers to."""

from __future__ import annotations

import click

from patchkit.cache import DEFAULT_DAYS, survey
from patchkit.project import cache_root
from patchkit.ui import Output, json_option


@click.command("cache")
@click.option(
    "--prune",
    is_flag=True,
    help="Remove the mirrors' loose objects that no ref reaches (series builds write them).",
)
@click.option(
    "--older-than",
    "days",
    type=float,
    default=DEFAULT_DAYS,
    show_default=True,
    metavar="DAYS",
    help="Only objects older than this many days (at least one hour).",
)
@json_option
def command(prune, days, as_json) -> int:
    """Show the cache's mirrors and downloads; with --prune, remove what nothing refers to."""
    out = Output(json_mode=as_json)
    report = survey(cache_root(), older_than_days=days, prune=prune)
    downloads = _mb(report.download_bytes)
    out.echo(f"cache {report.root}: {len(report.mirrors)} mirror(s), downloads {downloads}")
    for m in report.mirrors:
        out.echo(
            f"  {m.name}: {m.packs} pack(s) {_mb(m.pack_bytes)}, {m.loose:,} loose object(s) "
            f"{_mb(m.loose_bytes)}, {m.unreferenced:,} of them unreferenced, "
            f"{m.prunable:,} older than {days:g} days ({_mb(m.prunable_bytes)})"
        )
        if prune:
            out.echo(f"    pruned {m.pruned:,} object(s), {_mb(m.pruned_bytes)}")
    if not prune and any(m.prunable for m in report.mirrors):
        out.echo("run `patchkit cache --prune` to remove them")
    out.document(report.to_json())
    return 0


def _mb(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size} B"
