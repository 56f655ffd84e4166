"""The one place that owns output: progress, verbosity and JSON mode.

The core reports progress with `progress(message)`: it goes to the `Output` the running verb
installed around its core call (`with out.reporting(): ...`, a context variable, as
pypa/build's `_ctx`), and nowhere when none is installed (a library call, a test).

Progress goes to stderr: on a terminal as one live status line whose clock keeps running
(rich; NO_COLOR and FORCE_COLOR are honoured), elsewhere (CI logs, pipes) as plain
timestamped lines, as pip prints them: the first message at once, then at most one line every
`PLAIN_INTERVAL` seconds unless verbose, a keep-alive line (`still ...`) when nothing was
printed for `PLAIN_INTERVAL` seconds, so a long silent step still shows it is alive, and a
last line (`done`) when the core call ends; after a failure the error is the last line. JSON
mode prints no progress.
"""

from __future__ import annotations

import contextvars
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import click

from patchkit.errors import PatchkitError
from patchkit.scratch import signals_held

PLAIN_INTERVAL = 5.0  # seconds between plain lines, and of silence before a keep-alive line
SCHEMA_VERSION = 1
SCHEMA_FILE = "patchkit.schema.json"  # in patchkit/schemas/, printed by `patchkit schema`
JSON_OPTION = "--json"
_RESULT: object = None  # the result a verb handed to Output.document in this process
_JSON: bool | None = None  # the verb's parsed --json (None: no verb's options were parsed)
_LIVE: list[Output] = []  # outputs showing progress, stopped by stop_all() on any exit
# The Output of the verb running in this context (None: progress goes nowhere).
_SINK: contextvars.ContextVar[Output | None] = contextvars.ContextVar(
    "patchkit_output", default=None
)


def progress(message: str) -> None:
    """Report progress to the Output the running verb installed; nothing when none is."""
    out = _SINK.get()
    if out is not None:
        out.progress(message)


class _Forward:
    """A progress sink that hands each message to a function (a worker process's progress,
    sent to the process that shows it)."""

    def __init__(self, send) -> None:
        self.progress = send


def forward_progress(send) -> None:
    """From now on in this context, `progress(message)` calls `send(message)`."""
    _SINK.set(_Forward(send))  # type: ignore[arg-type]


def _color_forced() -> bool:
    return bool(os.environ.get("FORCE_COLOR")) and not os.environ.get("NO_COLOR")


class _Clock:
    """The live status line's text, rendered afresh at every refresh: the seconds shown keep
    running while the core reports nothing new."""

    def __init__(self, start: float, message: str) -> None:
        self.start, self.message = start, message

    def __rich__(self) -> Any:
        from rich.text import Text  # never markup: a message may hold brackets

        return Text(f"[{time.monotonic() - self.start:5.1f}s] {self.message}")


@dataclass
class Output:
    """Progress to stderr (live on a terminal, periodic plain lines otherwise); JSON mode
    prints one document on stdout and no progress."""

    json_mode: bool = False
    verbose: bool = False
    _start: float = field(default_factory=time.monotonic)
    _last_plain: float | None = field(default=None)  # when the last plain line was printed
    _status: Any = field(default=None, repr=False)
    _clock: _Clock | None = field(default=None, repr=False)
    _message: str | None = field(default=None, repr=False)  # the latest message reported
    _printed: str | None = field(default=None, repr=False)  # the message of the last line
    _lock: Any = field(default_factory=threading.Lock, repr=False)
    _ticker: Any = field(default=None, repr=False)  # the keep-alive thread and its stop event

    @contextmanager
    def reporting(self) -> Iterator[Output]:
        """Around a verb's core call: `progress()` reports here, a keep-alive line keeps a
        silent step visible off a terminal, and a last line says the call ended (none when it
        failed: the error is the last line)."""
        token = _SINK.set(self)
        try:
            if not self.json_mode and not self._on_terminal():
                self._start_ticker()
            yield self
        except BaseException:
            self.done()
            raise
        finally:
            _SINK.reset(token)
        self._finish()

    def _on_terminal(self) -> bool:
        return sys.stderr.isatty() and not self.verbose

    def progress(self, message: str) -> None:
        if self.json_mode:
            return
        if self._on_terminal():
            self._live(message)
            return
        with self._lock:
            self._message = message
            now = time.monotonic() - self._start
            if self.verbose or self._last_plain is None or now - self._last_plain >= PLAIN_INTERVAL:
                self._plain(now, message)

    def _plain(self, now: float, text: str, message: str | None = None) -> None:
        """One plain line (the caller holds the lock)."""
        self._last_plain, self._printed = now, message or text
        click.echo(f"  [{now:5.1f}s] {text}", err=True)

    def _keep_alive(self) -> None:
        """A line when none was printed for PLAIN_INTERVAL: the latest message if it was not
        shown, else `still` and the message."""
        with self._lock:
            now = time.monotonic() - self._start
            if self._last_plain is not None and now - self._last_plain < PLAIN_INTERVAL:
                return
            if self._message is None:
                self._plain(now, "working")
            elif self._message != self._printed:
                self._plain(now, self._message)
            else:
                self._plain(now, f"still {self._message}", self._message)

    def _start_ticker(self) -> None:
        if self._ticker is not None:
            return
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(PLAIN_INTERVAL / 10):
                self._keep_alive()

        thread = threading.Thread(target=tick, name="patchkit-keep-alive", daemon=True)
        with signals_held():  # started and recorded to be stopped, or neither
            thread.start()
            self._ticker = (thread, stop)
            _LIVE.append(self)

    def _stop_ticker(self) -> None:
        if self._ticker is not None:
            thread, stop = self._ticker
            stop.set()
            if thread is not threading.current_thread():
                thread.join()
            self._ticker = None

    def _finish(self) -> None:
        """Stop the keep-alive; off a terminal, a last line when any line was printed."""
        printed = self._ticker is not None and self._last_plain is not None
        self.done()
        if printed and not self.json_mode:
            with self._lock:
                self._plain(time.monotonic() - self._start, "done")

    def backend_line(self, line: str) -> None:
        """One line of a subprocess's output (the build backend under `-v`), indented, on
        stderr: stdout keeps only the result, so `--json` stays one document."""
        self._end_live()
        with self._lock:
            click.echo(f"    | {line}", err=True)

    def _live(self, message: str) -> None:
        if self._status is None:
            from rich.console import Console  # imported only when a terminal shows progress

            console = Console(stderr=True, force_terminal=True if _color_forced() else None)
            self._clock = _Clock(self._start, message)
            self._status = console.status(self._clock, spinner="dots")
            self._status.start()
            if self not in _LIVE:
                _LIVE.append(self)
        else:
            self._clock.message = message
            self._status.update(self._clock)

    def _end_live(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def done(self) -> None:
        """End the live status line and the keep-alive (before the verb prints its result)."""
        self._end_live()
        self._stop_ticker()
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
