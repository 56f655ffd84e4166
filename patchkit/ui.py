"""The one place that owns output: progress lines, verbosity and JSON mode."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field

import click


@dataclass
class Output:
    """Progress goes to stderr on a terminal (or when verbose); JSON mode prints one document."""

    json_mode: bool = False
    verbose: bool = False
    _start: float = field(default_factory=time.monotonic)

    def progress(self, message: str) -> None:
        if self.json_mode:
            return
        if self.verbose or sys.stderr.isatty():
            click.echo(f"  [{time.monotonic() - self._start:5.1f}s] {message}", err=True)

    def echo(self, text: str = "") -> None:
        if not self.json_mode:
            click.echo(text)

    def document(self, data: object) -> None:
        click.echo(json.dumps(data, indent=2, sort_keys=False))
