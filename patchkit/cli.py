"""Command-line entry point: wires the verbs; each verb lives in patchkit/commands/<verb>.py."""

from __future__ import annotations

import gc
import importlib
import os
import signal
import sys

import click

from patchkit import NOTHING_LEFT, __version__, scratch
from patchkit.errors import NothingToDo, PatchkitError, did_you_mean, os_error_hint

# verb -> module under patchkit.commands exposing `command`; imported only when used.
VERBS = {
    "apply": "apply",
    "status": "status",
    "fetch": "fetch",
    "build": "build",
    "inspect": "inspect",
    "verify": "verify",
    "rebase": "rebase",
    "outlook": "outlook",
    "export": "export",
    "lint": "lint",
    "review": "review",
    "import": "import_",
    "doctor": "doctor",
    "cache": "cache",
    "schema": "schema",
}

# One line per verb for `patchkit --help`, so listing the verbs imports none of them.
SHORT_HELP = {
    "apply": "Apply the series of each --target onto its base, one commit per patch.",
    "status": "Show what a checkout carries versus the series.",
    "fetch": "Resolve and cache the base of each target without touching any work tree.",
    "build": "Build each patched target's wheel (versioned, reproducible, with provenance).",
    "inspect": "Show what a wheel or an installed distribution carries.",
    "verify": "Statically verify CUDA / torch ABI compatibility of an environment or wheelhouse.",
    "rebase": "Classify each patch on a new base; carry the series there.",
    "outlook": "Classify each patch on every upstream release after its line's pin.",
    "export": "Write one .patch per commit of a checkout, in deterministic bytes.",
    "lint": "Check the series of every target.",
    "review": "The upstream-diff review: patch table, upstream status, combined delta.",
    "import": "Turn a monolithic diff or an overlay directory into a per-concern series.",
    "doctor": "Check inputs before a long run (e.g. an EAGLE-3 draft checkpoint).",
    "cache": "Show what the cache holds; --prune removes old objects nothing refers to.",
    "schema": "Print the JSON Schema of every verb's --json document.",
}

ENVIRONMENT = (
    ("PATCHKIT_PROJECT", "the project root (default: nearest parent with patches/targets.toml)"),
    ("PATCHKIT_CACHE", "mirrors and downloads (default: $XDG_CACHE_HOME/patchkit or ~/.cache)"),
    ("PATCHKIT_INDEX_URL", "the package index (default: pip's, from pip.conf; else PyPI)"),
    ("PATCHKIT_NET_TIMEOUT", "seconds one network read may wait (default 60)"),
    ("PATCHKIT_NET_DEADLINE", "seconds one download may take (default 1800; a page: 120)"),
    ("PATCHKIT_NET_BUDGET", "seconds all of a run's downloads may take (default 3600)"),
    ("PATCHKIT_NET_RETRIES", "times a request is sent again after a 429/5xx or a drop (default 3)"),
    ("PATCHKIT_GIT_TIMEOUT", "seconds one git child may run before it is stopped (default 3600)"),
    ("PATCHKIT_OFFLINE_GIT", "1: never fetch from git remotes (bases come from the index)"),
    ("PATCHKIT_OUTLOOK_JOBS", "releases outlook classifies at once (default: one per core, <= 4)"),
    ("PATCHKIT_INDEX_TTL", "seconds outlook keeps the index's release list (default 300; 0: ask)"),
    (
        "PATCHKIT_UNREACHABLE_TTL",
        "seconds a git host that could not be reached is skipped (default 600; 0: ask)",
    ),
    (
        "PATCHKIT_PROFILE",
        "the build / verify profile (default: cu130-sm120; verify: that of the sglang checked)",
    ),
    ("PATCHKIT_DEBUG", "1: show tracebacks (as --debug)"),
    ("NO_COLOR / FORCE_COLOR", "turn colour off / on whatever the terminal"),
    ("VIRTUAL_ENV", "inspect --installed looks in this virtualenv first"),
)

# The same meaning in every verb.
EXIT_CODES = (
    (0, "success"),
    (1, "failed: the operation ran and did not succeed (conflict, lint or check errors)"),
    (2, "usage or configuration error, or a base that cannot be obtained"),
    (3, "nothing to do: the requested state already holds"),
    (70, "internal error (a bug: run again with --debug and report it)"),
    (130, "interrupted (SIGINT / SIGTERM); the message says what was left"),
)


def _epilog() -> str:
    env = "\n".join(f"  {name:<24}{text}" for name, text in ENVIRONMENT)
    codes = "\n".join(f"  {code:<4}{text}" for code, text in EXIT_CODES)
    return (
        f"\b\nEnvironment:\n{env}\n\n\b\nExit codes:\n{codes}\n\n"
        "\b\nShell completion (bash; zsh and fish likewise):\n"
        '  eval "$(_PATCHKIT_COMPLETE=bash_source patchkit)"'
    )


class LazyGroup(click.Group):
    """A group whose sub-commands are imported on first use, keeping `patchkit --help` fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, mod in VERBS.items() if _module_exists(mod))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            text = SHORT_HELP.get(name)
            if text is None:  # a verb without a listed line: ask the verb itself
                command = self.get_command(ctx, name)
                text = command.get_short_help_str(80) if command else ""
            rows.append((name, text))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        # click suggests from `self.commands`, which a lazy group leaves empty.
        name = args[0]
        if not name.startswith("-") and self.get_command(ctx, name) is None:
            hint = did_you_mean(name, self.list_commands(ctx))
            if hint and not ctx.resilient_parsing:
                raise click.UsageError(f"No such command {name!r}{hint}", ctx)
        return super().resolve_command(ctx, args)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = VERBS.get(name)
        if module is None or not _module_exists(module):
            return None
        return importlib.import_module(f"patchkit.commands.{module}").command


def _module_exists(module: str) -> bool:
    here = os.path.join(os.path.dirname(__file__), "commands", f"{module}.py")
    return os.path.exists(here)


@click.group(
    cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=_epilog()
)
@click.version_option(__version__, prog_name="patchkit")
@click.option("--debug", is_flag=True, envvar="PATCHKIT_DEBUG", help="Show tracebacks on errors.")
@click.option(
    "-C",
    "--project",
    "project_dir",
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Run as if started in DIR (as git -C).",
)
@click.pass_context
def group(ctx: click.Context, debug: bool, project_dir: str | None) -> None:
    """Carry a versioned patch series against pinned upstreams (SGLang, FlashInfer)."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    if project_dir is not None:
        try:
            os.chdir(project_dir)
        except OSError as exc:
            raise click.UsageError(f"-C {project_dir}: {exc.strerror}") from None


_INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


def _on_interrupt(signum, frame):  # noqa: ARG001 - signal handler signature
    """The first SIGINT or SIGTERM raises KeyboardInterrupt; from then on both are ignored,
    by patchkit and by the gits its clean-up starts (SIG_IGN is inherited), so a second
    Ctrl-C cannot cut short the clean-up of the first (it gave a traceback and left scratch
    folders). SIGKILL still ends the run; the next one recovers from that."""
    _ignore_interrupts()
    if scratch.defer_interrupt():
        return  # raised as the section that holds it ends (`scratch.signals_held`)
    raise KeyboardInterrupt


def _ignore_interrupts() -> None:
    for signum in _INTERRUPTS:
        signal.signal(signum, signal.SIG_IGN)


def _take_interrupts() -> dict[int, object]:
    """Route SIGTERM, and SIGINT unless it was ignored from the start (a background job), to
    `_on_interrupt`; the handlers they had."""
    previous = {signum: signal.getsignal(signum) for signum in _INTERRUPTS}
    for signum in _INTERRUPTS:
        if signum == signal.SIGTERM or previous[signum] != signal.SIG_IGN:
            signal.signal(signum, _on_interrupt)
    return previous


def main(argv: list[str] | None = None, *, exiting: bool = False) -> int:
    """Run the CLI; map PatchkitError to its exit code and one or two lines on stderr. Under
    `--json` every outcome, errors included, is one envelope document on stdout. The caller's
    signal handlers are given back, except to a process that exits after the run (`exiting`,
    the console script): it stays deaf through its exit clean-up, so a Ctrl-C that lands as a
    run ends neither cuts the clean-up short nor turns the run's exit code into a kill."""
    previous = {signum: signal.getsignal(signum) for signum in _INTERRUPTS}
    try:
        return _main(argv)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_IGN if exiting else handler)


def _main(argv: list[str] | None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    debug = "--debug" in args or bool(os.environ.get("PATCHKIT_DEBUG"))
    if "patchkit.ui" in sys.modules:  # an earlier run's --json in this process is not ours
        sys.modules["patchkit.ui"].take_json_option()
    rc, error = _run_verb(argv, debug)
    if not _asked_for_help(args) and _json_mode(args):
        from patchkit import ui

        ui.print_envelope(ui.envelope(_verb_of(args), rc, ui.take_result(), error))
    return rc


def _json_mode(args: list[str]) -> bool:
    """The verb's parsed --json; when click stopped before parsing it (a usage error), whether
    --json stands there as an option (not as an option's value, as in `--author --json`)."""
    ui = sys.modules.get("patchkit.ui")
    parsed = ui.take_json_option() if ui else None
    return parsed if parsed is not None else _json_token(args)


def _json_token(args: list[str]) -> bool:
    """Whether `--json` is an option token of `args`, read with the options the group and the
    verb declare: a value-taking option's value is skipped, whatever it looks like."""
    from patchkit.ui import JSON_OPTION

    command: click.Command | None = group
    ctx = click.Context(group)
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":
            return False
        if token == JSON_OPTION:
            return True
        if not token.startswith("-") or token == "-":
            if isinstance(command, click.Group):
                command = command.get_command(ctx, token)  # a verb (None: an unknown one)
            continue
        if command is None or "=" in token:
            continue
        long = token.startswith("--")
        option = _option(command, token) if long else None
        for n, char in enumerate("" if long else token[1:], start=2):
            short = _option(command, f"-{char}")  # a cluster, as click reads it: -vC DIR
            if _takes_value(short):
                option = short if n == len(token) else None  # else -CDIR: value attached
                break
        if _takes_value(option):
            optional = getattr(option, "_flag_needs_value", False)  # e.g. --new-line [NAME]
            if not (optional and (i >= len(args) or args[i].startswith("-"))):
                i += option.nargs
    return False


def _option(command: click.Command, name: str) -> click.Option | None:
    return next(
        (
            p
            for p in command.params
            if isinstance(p, click.Option) and name in (*p.opts, *p.secondary_opts)
        ),
        None,
    )


def _takes_value(option: click.Option | None) -> bool:
    return option is not None and not option.is_flag and not option.count


def _run_verb(argv: list[str] | None, debug: bool) -> tuple[int, dict | None]:
    """(exit code, the envelope's error object or None). The interrupts are patchkit's from
    inside the block that answers them to the verb's end; then ignored, so that the answer,
    the envelope and the exit are not cut short."""
    try:
        _take_interrupts()
        rv = _dispatch(argv)
        _ignore_interrupts()
    except (Exception, KeyboardInterrupt) as exc:
        _ignore_interrupts()
        for kinds, answer in _ANSWERS:
            if isinstance(exc, kinds):
                if debug and answer in _DEBUG_RERAISES:
                    raise
                return answer(exc)
        raise
    return (rv if isinstance(rv, int) else 0), None


def _tell(message: str, hint: str | None) -> None:
    click.echo(f"patchkit: {message}", err=True)
    if hint:
        click.echo(f"patchkit: next: {_one_line(hint)}", err=True)


def _nothing_to_do(exc: NothingToDo) -> tuple[int, dict | None]:
    _tell(_one_line(exc.message), exc.hint)  # not an error: the requested state already holds
    return exc.exit_code, None


def _refused(exc: PatchkitError) -> tuple[int, dict | None]:
    from patchkit.ui import error_object

    _tell(f"error: {_one_line(exc.message)}", exc.hint)
    return exc.exit_code, error_object(exc, exc.exit_code)


def _click_exit(exc: click.exceptions.Exit) -> tuple[int, dict | None]:
    return exc.exit_code, None


def _usage(exc: click.ClickException) -> tuple[int, dict | None]:
    from patchkit.ui import error_object

    exc.show()
    return exc.exit_code, error_object(exc, exc.exit_code) | {"kind": "usage"}


def _interrupted(exc: BaseException) -> tuple[int, dict | None]:
    from patchkit.ui import error_object

    # click wraps the KeyboardInterrupt in Abort; the core's Interrupted says what it left.
    cause = exc.__cause__ if isinstance(exc, click.exceptions.Abort) else exc
    left = getattr(cause, "left", None) or NOTHING_LEFT
    click.echo(f"patchkit: interrupted; {left}", err=True)
    return 130, error_object(exc, 130) | {"kind": "interrupted", "message": left}


def _os_error(exc: OSError) -> tuple[int, dict | None]:
    from patchkit.ui import error_object

    where = f": {exc.filename}" if exc.filename else ""
    _tell(f"error: {exc.strerror or exc}{where}", os_error_hint(exc))
    return 1, error_object(exc, 1) | {"kind": "os", "message": f"{exc.strerror or exc}{where}"}


def _internal(exc: Exception) -> tuple[int, dict | None]:
    from patchkit.ui import error_object

    faults = sys.modules.get("patchkit.gitops.faults")  # loaded by whatever ran git
    if faults is not None and isinstance(exc, faults.GitError):
        return _git_failed(exc)

    # a bug, not a user error: still no traceback without --debug
    cause = _first_line(str(exc)) or "no message"
    _tell(f"error: internal error ({type(exc).__name__}: {cause})",
          "run again with --debug for the traceback and report it")  # fmt: skip
    return 70, error_object(exc, 70) | {"kind": "internal", "message": cause}


def _git_failed(exc) -> tuple[int, dict | None]:
    """A git failure no caller expected (git's own words, not patchkit's): one line naming
    the git command and what git said, exit 1."""
    from patchkit.ui import error_object

    args = [str(a) for a in exc.args_]
    shown = " ".join(args[:6]) + (" ..." if len(args) > 6 else "")
    said = _first_line(exc.stderr.strip()) or f"exit {exc.status}"
    message = f"git {shown} failed (exit {exc.status}): {said[:300]}"
    _tell(f"error: {message}", "check the repository named and the git on PATH (git --version)")
    return 1, error_object(exc, 1) | {"kind": "git", "message": message}


# What each failure of a verb answers, the first that matches (order matters: NothingToDo is a
# PatchkitError, Exit and Abort are not ClickExceptions); --debug re-raises those in the set.
_ANSWERS = (
    (NothingToDo, _nothing_to_do),
    (PatchkitError, _refused),
    (click.exceptions.Exit, _click_exit),
    (click.ClickException, _usage),
    ((click.exceptions.Abort, KeyboardInterrupt), _interrupted),
    (OSError, _os_error),
    (Exception, _internal),
)
_DEBUG_RERAISES = {_refused, _os_error, _internal}


def _verb_of(args: list[str]) -> str | None:
    """The verb of a command line (after the group's own options)."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("-C", "--project"):
            skip = True
        elif not arg.startswith("-"):
            return arg if arg in VERBS else None
    return None


def _asked_for_help(args: list[str]) -> bool:
    return any(a in ("-h", "--help", "--version") for a in args)


def _dispatch(argv: list[str] | None):
    try:
        return group.main(args=argv, prog_name="patchkit", standalone_mode=False)
    finally:
        if "patchkit.ui" in sys.modules:
            sys.modules["patchkit.ui"].stop_all()


def _one_line(text: str) -> str:
    """Errors are one line each, whatever the message carries (git's stderr, nested causes)."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:300]


def run() -> None:
    code = main(exiting=True)
    # What the run made is freed with the process: the collector's passes over every object
    # at interpreter shutdown (18 ms of a warm `apply`, docs/perf.md) are skipped.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
