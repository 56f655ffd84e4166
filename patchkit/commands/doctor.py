"""`patchkit doctor draft`: check an EAGLE-3 draft checkpoint before a target loads."""

from __future__ import annotations

import textwrap
from pathlib import Path

import click

from patchkit import completion
from patchkit.doctor import sources
from patchkit.doctor.draft import DraftReport, check_draft
from patchkit.doctor.fix import write_fixed
from patchkit.errors import UsageError
from patchkit.ui import Output, json_option

MARK = {"pass": "ok", "fail": "FAIL", "warn": "warn", "skip": "skip"}


@click.group("doctor")
def command() -> None:
    """Check inputs of the patched stack before they cost a model load."""


@command.command("draft")
@click.option(
    "--draft",
    "draft",
    required=True,
    type=click.Path(path_type=Path),
    help="The draft checkpoint folder (config.json + *.safetensors).",
)
@click.option(
    "--target-config",
    "target",
    required=True,
    type=click.Path(path_type=Path),
    help="The target's config.json, or the folder holding it.",
)
@click.option(
    "--line",
    shell_complete=completion.line_names,
    default=None,
    help="The SGLang line to check against, its series applied (default: the default line).",
)
@click.option(
    "--sglang-source",
    type=click.Path(path_type=Path),
    default=None,
    help="Read the model code from this SGLang tree or wheel instead of the line's.",
)
@click.option(
    "--fix",
    "fix_out",
    type=click.Path(path_type=Path),
    default=None,
    help="Write a renamed copy that SGLang loads to this new folder.",
)
@json_option
@click.option("-v", "--verbose", is_flag=True, help="Show progress even when not on a terminal.")
def draft_command(draft, target, line, sglang_source, fix_out, as_json, verbose) -> int:
    """Check a draft against what the line's SGLang will do with it; exit 1 on problems."""
    out = Output(json_mode=as_json, verbose=verbose)
    if line and sglang_source:
        raise UsageError("pass --line or --sglang-source, not both")
    if not target.exists():
        raise UsageError(f"--target-config {target}: no such file or folder")
    with out.reporting():
        source = sources.from_path(sglang_source) if sglang_source else sources.for_line(line)
        report = check_draft(draft, target, source)
        fixed_report, fix = None, None
        if fix_out is not None:
            if not report.rename and report.fixed_config is None:
                out.progress("nothing --fix can repair by renaming; no copy written")
            else:
                fix = write_fixed(report, draft, fix_out)
                fixed_report = check_draft(fix.out, target, source)
    if as_json:
        doc = report.to_json()
        if fix is not None:
            doc["fix"] = fix.to_json()
            doc["fixed"] = fixed_report.to_json()
        out.document(doc)
    else:
        out.echo(render(report))
        if fix is not None:
            out.echo("")
            out.echo(
                f"wrote {fix.out}: {len(fix.renamed)} tensor(s) renamed, config "
                f"{'rewritten' if fix.config_rewritten else 'copied'}, tensor bytes unchanged"
            )
            out.echo(f"record: {fix.out / 'patchkit-doctor-fix.json'} (mapping, sha256s)")
            out.echo("")
            out.echo(render(fixed_report))
    final = fixed_report if fixed_report is not None else report
    return 0 if final.ok else 1


def render(report: DraftReport) -> str:
    """The report as a table: one row per check, the fix under each failing row."""
    lines = [
        f"draft   {report.draft} ({report.convention} layout, checked as {report.architecture})",
        f"target  {report.target}",
        f"sglang  {report.source}",
        "",
        f"{'':4}  {'check':<14}  detail",
    ]
    for check in report.checks:
        wrapped = textwrap.wrap(check.detail, 96) or [""]
        lines.append(f"{MARK[check.status]:<4}  {check.id:<14}  {wrapped[0]}")
        lines += [f"{'':22}{more}" for more in wrapped[1:]]
        if check.fix and check.status in ("fail", "warn"):
            fix_lines = textwrap.wrap(check.fix, 91)
            lines.append(f"{'':22}fix: {fix_lines[0]}")
            lines += [f"{'':27}{more}" for more in fix_lines[1:]]
    n = len(report.problems)
    lines.append("")
    lines.append("doctor: no problems" if not n else f"doctor: {n} problem(s)")
    return "\n".join(lines)
