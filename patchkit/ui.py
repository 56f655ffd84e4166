"""The one place that owns output: progress, verbosity and JSON mode.

Progress goes to stderr: on a terminal as one live status line (rich; NO_COLOR and FORCE_COLOR
are honoured), elsewhere (CI logs, pipes) as plain timestamped lines, at most one every
`PLAIN_INTERVAL` seconds unless verbose, so a long step still shows it is alive.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import click

PLAIN_INTERVAL = 5.0
_LIVE: list[Output] = []  # outputs with a live status line, stopped by stop_all() on any exit


def _color_forced() -> bool:
    return bool(os.environ.get("FORCE_COLOR")) and not os.environ.get("NO_COLOR")


@dataclass
class Output:
    """Progress to stderr (live on a terminal, periodic plain lines otherwise); JSON mode
    prints one document on stdout and no progress."""

    json_mode: bool = False
    verbose: bool = False
    _start: float = field(default_factory=time.monotonic)
    _last_plain: float = field(default=0.0)
    _status: Any = field(default=None, repr=False)

    def progress(self, message: str) -> None:
        if self.json_mode:
            return
        elapsed = time.monotonic() - self._start
        if sys.stderr.isatty() and not self.verbose:
            self._live(f"[{elapsed:5.1f}s] {message}")
            return
        if self.verbose or elapsed - self._last_plain >= PLAIN_INTERVAL:
            self._last_plain = elapsed
            click.echo(f"  [{elapsed:5.1f}s] {message}", err=True)

    def _live(self, text: str) -> None:
        if self._status is None:
            from rich.console import Console  # imported only when a terminal shows progress

            console = Console(stderr=True, force_terminal=True if _color_forced() else None)
            self._status = console.status(text, spinner="dots")
            self._status.start()
            _LIVE.append(self)
        else:
            self._status.update(text)

    def done(self) -> None:
        """End the live status line (before the verb prints its result)."""
        if self._status is not None:
            self._status.stop()
            self._status = None
            if self in _LIVE:
                _LIVE.remove(self)

    def echo(self, text: str = "") -> None:
        self.done()
        if not self.json_mode:
            click.echo(text)

    def document(self, data: object) -> None:
        self.done()
        click.echo(json.dumps(data, indent=2, sort_keys=False))


def stop_all() -> None:
    """Stop every live status line (the CLI calls this before printing an error)."""
    for output in list(_LIVE):
        output.done()
