"""Command-line entry point: wires the verbs; each verb lives in patchkit/commands/<verb>.py."""

from __future__ import annotations

import importlib
import os
import signal
import sys

import click

from patchkit import __version__
from patchkit.errors import PatchkitError

# verb -> module under patchkit.commands exposing `command`; imported only when used.
VERBS = {
    "apply": "apply",
    "status": "status",
    "fetch": "fetch",
    "build": "build",
    "inspect": "inspect",
    "verify": "verify",
    "rebase": "rebase",
    "export": "export",
    "lint": "lint",
    "review": "review",
}


class LazyGroup(click.Group):
    """A group whose sub-commands are imported on first use, keeping `patchkit --help` fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, mod in VERBS.items() if _module_exists(mod))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = VERBS.get(name)
        if module is None or not _module_exists(module):
            return None
        return importlib.import_module(f"patchkit.commands.{module}").command


def _module_exists(module: str) -> bool:
    here = os.path.join(os.path.dirname(__file__), "commands", f"{module}.py")
    return os.path.exists(here)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="patchkit")
@click.option("--debug", is_flag=True, envvar="PATCHKIT_DEBUG", help="Show tracebacks on errors.")
@click.pass_context
def group(ctx: click.Context, debug: bool) -> None:
    """Carry a versioned patch series against pinned upstreams (SGLang, FlashInfer)."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _on_sigterm(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map PatchkitError to its exit code and one or two lines on stderr."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    debug = "--debug" in (argv if argv is not None else sys.argv[1:]) or bool(
        os.environ.get("PATCHKIT_DEBUG")
    )
    try:
        rv = group.main(args=argv, prog_name="patchkit", standalone_mode=False)
    except PatchkitError as exc:
        if debug:
            raise
        click.echo(f"patchkit: error: {_one_line(exc.message)}", err=True)
        if exc.hint:
            click.echo(f"patchkit: next: {_one_line(exc.hint)}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        # click wraps the KeyboardInterrupt in Abort; the core's Interrupted says what it left.
        cause = exc.__cause__ if isinstance(exc, click.exceptions.Abort) else exc
        left = getattr(cause, "left", None) or "nothing was left half-done"
        click.echo(f"patchkit: interrupted; {left}", err=True)
        return 130
    except OSError as exc:
        if debug:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        click.echo(f"patchkit: error: {exc.strerror or exc}{where}", err=True)
        return 1
    except Exception as exc:  # a bug, not a user error: still no traceback without --debug
        if debug:
            raise
        cause = _first_line(str(exc)) or "no message"
        click.echo(f"patchkit: error: internal error ({type(exc).__name__}: {cause})", err=True)
        click.echo(
            "patchkit: next: run again with --debug for the traceback and report it", err=True
        )
        return 70
    return rv if isinstance(rv, int) else 0


def _one_line(text: str) -> str:
    """Errors are one line each, whatever the message carries (git's stderr, nested causes)."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:300]


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
