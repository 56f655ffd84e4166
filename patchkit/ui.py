"""The one place that owns output: progress, verbosity and JSON mode.

Progress goes to stderr: on a terminal as one live status line (rich; NO_COLOR and FORCE_COLOR
are honoured), elsewhere (CI logs, pipes) as plain timestamped lines, at most one every
`PLAIN_INTERVAL` seconds unless verbose, so a long step still shows it is alive.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import click

from patchkit.errors import PatchkitError

PLAIN_INTERVAL = 5.0
SCHEMA_VERSION = 1
SCHEMA_FILE = "patchkit.schema.json"  # in patchkit/schemas/, printed by `patchkit schema`
JSON_OPTION = "--json"
_RESULT: object = None  # the result a verb handed to Output.document in this process
_JSON: bool | None = None  # the verb's parsed --json (None: no verb's options were parsed)
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

    def backend_line(self, line: str) -> None:
        """One line of a subprocess's output (the build backend under `-v`), indented, on
        stderr: stdout keeps only the result, so `--json` stays one document."""
        self.done()
        click.echo(f"    | {line}", err=True)

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
        """The verb's result; the CLI prints it inside the one `--json` envelope once the exit
        code is known (see `envelope`)."""
        self.done()
        global _RESULT
        _RESULT = data


def _record_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    global _JSON
    _JSON = bool(value)
    return value


def json_option(command):
    """The one `--json` option of every verb. Eager, so its parsed value is recorded before
    any other option is checked: the CLI prints the envelope from it, errors included."""
    return click.option(
        JSON_OPTION,
        "as_json",
        is_flag=True,
        is_eager=True,
        callback=_record_json,
        help="Print one JSON document (the envelope of `patchkit schema`).",
    )(command)


def take_json_option() -> bool | None:
    """The parsed `--json` of the verb that ran (None when click stopped before parsing it)."""
    global _JSON
    asked, _JSON = _JSON, None
    return asked


def stop_all() -> None:
    """Stop every live status line (the CLI calls this before printing an error)."""
    for output in list(_LIVE):
        output.done()


def take_result() -> object:
    """The result recorded by Output.document (None when the verb recorded none)."""
    global _RESULT
    result, _RESULT = _RESULT, None
    return result


def error_object(exc: PatchkitError | Exception, exit_code: int) -> dict:
    """The `error` member of the envelope: kind, message, next step and any structured detail
    the error carries (e.g. every source tried for a base)."""
    kind = re.sub(r"(?<!^)(?=[A-Z])", "-", type(exc).__name__).lower()
    kind = kind.removesuffix("-error") or "error"
    message = getattr(exc, "message", None) or str(exc)
    out = {"kind": kind, "message": message, "next_step": getattr(exc, "hint", None)}
    to_json = getattr(exc, "to_json", None)
    if callable(to_json):  # structured errors name their own kind and carry their detail
        detail = dict(to_json())
        out["kind"] = str(detail.pop("error", out["kind"]))
        detail.pop("message", None)
        detail.pop("next_step", None)
        out["detail"] = detail
    out["exit_code"] = exit_code
    return out


def envelope(command: str | None, exit_code: int, result: object, error: dict | None) -> dict:
    """The one `--json` document of every verb (schema: patchkit/schemas/SCHEMA_FILE)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "ok": error is None and exit_code in (0, 3),
        "exit_code": exit_code,
        "result": result,
        "error": error,
    }


def print_envelope(document: dict) -> None:
    click.echo(json.dumps(document, indent=2, sort_keys=False))
