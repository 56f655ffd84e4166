"""`patchkit verify`: will this stack import and run on these GPUs? Answered from files alone."""

from __future__ import annotations

import click

from patchkit import completion
from patchkit.errors import VerifyInputError
from patchkit.ui import Output, json_option

MAX_EVIDENCE = 8
# `--env` given without a path (or neither --env nor --wheelhouse): this interpreter's
# site-packages. A NUL never reaches a program through its arguments, so no path is this.
THIS_INTERPRETER = "\0"


@click.command("verify")
@click.option(
    "--env",
    "env",
    is_flag=False,
    flag_value=THIS_INTERPRETER,
    default=None,
    metavar="[PATH]",
    help="Verify a site-packages folder, a virtual environment or its python "
    "(default: this interpreter's).",
)
@click.option(
    "--wheelhouse",
    type=str,
    default=None,
    metavar="DIR",
    help="Verify a folder of .whl files without installing them.",
)
@click.option(
    "--profile",
    shell_complete=completion.profile_names,
    default=None,
    metavar="NAME",
    help="Profile name (the project's build/profiles/, then patchkit's own) or a path to one; "
    "default $PATCHKIT_PROFILE, else the profile pinning the sglang found, else cu130-sm120.",
)
@click.option(
    "--gpu",
    "gpus",
    multiple=True,
    metavar="CC",
    help="Target compute capability (12.0, 12, sm_120 or 120); repeatable; replaces the profile's.",
)
@json_option
@click.option("--no-cache", is_flag=True, help="Ignore and do not write the per-file cache.")
def command(env, wheelhouse, profile, gpus, as_json, no_cache) -> int:
    """Statically verify CUDA 13 / torch ABI compatibility of an environment or a wheelhouse.

    Exit status: 0 no errors, 1 errors found, 2 bad input.
    """
    for option, value in (("--env", env), ("--wheelhouse", wheelhouse)):
        if value == "":  # an unset variable's expansion: never this interpreter by accident
            raise VerifyInputError(f"{option}: empty path", f"pass {option} PATH")
    if env is None and wheelhouse is None:
        env = THIS_INTERPRETER
    report = _verify(env, wheelhouse, profile, gpus, no_cache)
    if as_json:
        Output(json_mode=True).document(report.to_dict())
    else:
        click.echo(render_verify(report))
    return report.exit_code


def _verify(env, wheelhouse, profile, gpus, no_cache):
    """The verify report, or the bad input as one VerifyInputError (exit 2)."""
    from patchkit.abi import verify
    from patchkit.abi.profiles import ProfileError
    from patchkit.abi.sources import default_site_packages, resolve_env

    try:
        if env == THIS_INTERPRETER:
            env = default_site_packages()
        env_path = resolve_env(env) if env is not None else None
        return verify(
            env=env_path,
            wheelhouse=wheelhouse,
            profile=profile,
            gpus=list(gpus) or None,
            use_cache=not no_cache,
        )
    except ProfileError as exc:
        raise VerifyInputError(
            str(exc), "pass one of the available names, or a path to a profile .toml"
        ) from None
    except FileNotFoundError as exc:
        raise VerifyInputError(
            f"no such folder: {exc.filename or exc}",
            "pass an existing site-packages folder or wheelhouse",
        ) from None
    except NotADirectoryError as exc:
        raise VerifyInputError(f"not a folder: {exc.filename or exc}") from None
    except ValueError as exc:
        raise VerifyInputError(str(exc), "use a compute capability such as 9.0 or 12.0") from None
    except OSError as exc:
        raise VerifyInputError(f"cannot read {exc.filename or ''}: {exc.strerror or exc}") from None


def render_verify(report) -> str:
    """The text output: one line per finding with up to MAX_EVIDENCE lines of its evidence,
    the profile and why, and the summary line."""
    lines = []
    for finding in report.findings:
        lines.append(finding.line())
        lines += [f"           {line}" for line in finding.evidence[:MAX_EVIDENCE]]
        if len(finding.evidence) > MAX_EVIDENCE:
            lines.append(f"           ... {len(finding.evidence) - MAX_EVIDENCE} more (--json)")
    if report.choice:
        lines.append(f"profile  {report.profile}: {report.choice.reason}")
    notes = f", {report.notes} note(s)" if report.notes else ""
    lines.append(
        f"{report.errors} error(s), {report.warnings} warning(s){notes} in {report.files} "
        f"objects ({report.source}; profile {report.profile}; targets "
        f"{', '.join(report.targets) or 'none'}; {report.seconds:.2f} s)"
    )
    return "\n".join(lines)
