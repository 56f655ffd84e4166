"""`patchkit schema`: print the JSON Schema of the `--json` envelope every verb prints."""

from __future__ import annotations

from importlib import resources

import click


@click.command("schema")
def command() -> int:
    """Print the JSON Schema of every verb's --json document."""
    text = resources.files("patchkit.schemas").joinpath("patchkit.schema.json").read_text()
    click.echo(text.rstrip("\n"))
    return 0
