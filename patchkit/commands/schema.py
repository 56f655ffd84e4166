"""`patchkit schema`: print the JSON Schema of the `--json` envelope every verb prints."""

from __future__ import annotations

from importlib import resources

import click

from patchkit.ui import SCHEMA_FILE


@click.command("schema")
def command() -> int:
    """Print the JSON Schema of every verb's --json document."""
    text = resources.files("patchkit.schemas").joinpath(SCHEMA_FILE).read_text()
    click.echo(text.rstrip("\n"))
    return 0
