"""`patchkit rebase`: carry the series onto a new upstream ref and classify every patch."""

from __future__ import annotations

import click

from patchkit import completion
from patchkit.classify import LABELS, PatchOutcome
from patchkit.errors import NothingToDo, SeriesChangedError, UsageError
from patchkit.export import SeriesRead
from patchkit.lines import line_series
from patchkit.rebase import (
    RebaseReport,
    abort_rebase,
    classify_rebase,
    continue_rebase,
    leave_conflict_tree,
    rebase_dir,
    rebase_stopped,
    replace_untouched,
    stopped_line,
    stopped_read,
    write_rebase,
)
from patchkit.targets import NAME_RE, parse_target_spec
from patchkit.ui import Output, json_option
from patchkit.upstream import Mirror, acquire, resolve_new_base
from patchkit.workspace import Workspace

MARK = {
    "clean": "clean",
    "offset": "offset",
    "merged": "merged",
    "conflict": "CONFLICT",
    "upstreamed": "upstreamed",
    "obsolete": "obsolete",
    "resolved": "resolved",
    "dropped": "dropped",
}


@click.command("rebase")
@click.option(
    "--target",
    "spec",
    shell_complete=completion.target_names,
    help="NAME@REF: a release version, tag or commit of NAME.",
)
@click.option(
    "--line",
    "line",
    shell_complete=completion.line_names,
    help="The line whose series is carried (default: the default line).",
)
@click.option(
    "--write",
    is_flag=True,
    help="Refresh patches/, drop upstreamed patches, move the line's pin, bump the series "
    "version (only when no patch is in conflict).",
)
@click.option(
    "--new-line",
    "new_line",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[NAME]",
    help="With --write: start a new line NAME (default: the new version) from the carried "
    "series instead of moving the line's pin.",
)
@click.option(
    "--conflict-tree",
    is_flag=True,
    help="Leave a scratch work tree stopped at the first conflict (always with --write).",
)
@click.option(
    "--continue",
    "cont",
    is_flag=True,
    help="Resume after resolving the conflicts in the scratch work tree.",
)
@click.option("--abort", is_flag=True, help="Remove the scratch work tree of a stopped rebase.")
@click.option("--upstream", help="A clone, bare repository or URL to fetch git refs from.")
@json_option
@click.option("-v", "--verbose", is_flag=True, help="Show progress even when not on a terminal.")
def command(
    spec, line, write, new_line, conflict_tree, cont, abort, upstream, as_json, verbose
) -> int:
    """Classify each patch on the new base: clean, offset, merged, conflict or upstreamed."""
    out = Output(json_mode=as_json, verbose=verbose)
    return _run(out, spec, line, write, new_line, conflict_tree, cont, abort, upstream)


def _run(out, spec, line, write, new_line, conflict_tree, cont, abort, upstream) -> int:
    as_json = out.json_mode
    if cont and abort:
        raise UsageError("--continue and --abort exclude each other: pass one")
    ws = Workspace.load()
    _refuse_unnamed(ws, write=write, conflict_tree=conflict_tree, cont=cont, abort=abort)
    if new_line is not None and not write:
        raise UsageError("--new-line starts a line in patches/: it needs --write")
    if cont or abort:
        return _resume(out, ws, spec, line, write, new_line, abort)
    if not spec or "@" not in spec:
        raise UsageError("--target NAME@REF is required (e.g. --target sglang@0.5.10)")
    parsed = parse_target_spec(spec)
    target = ws.targets.get(parsed.target, line)
    read = _read(ws, target)
    series = line_series(ws.project, target)
    dest = rebase_dir(ws.project.work_dir, target.name)
    keep_tree = conflict_tree or write
    replaced = False
    if keep_tree and dest.exists():
        replaced = replace_untouched(dest)  # refuses a tree holding someone's work
    with out.reporting():
        old = acquire(target, None)
        new, pin = resolve_new_base(target, parsed.ref, upstream=upstream)
        report = classify_rebase(
            Mirror(target).repo,
            target,
            series,
            old,
            new,
            series_version=ws.targets.series_version,
            ref=parsed.ref,
            pin=pin,
        )
        report.line = target.line
        report.new_line = _new_line_name(new_line, report)
        if report.conflicted and keep_tree:
            leave_conflict_tree(report, Mirror(target).repo, series, dest, write=write, read=read)
    if report.conflicted and keep_tree:
        if replaced:
            report.next_steps.insert(0, f"replaced the untouched conflict work tree in {dest}")
    elif report.conflicted:
        report.next_steps.append(
            "no work tree was left (a preview); pass --conflict-tree to get one stopped at the "
            "first conflict"
        )
        if dest.exists():
            report.next_steps.append(f"an earlier rebase's work tree is still in {dest}")
    elif write:
        _write(ws, target, report, report.new_line, read)
    return _finish(out, report, as_json)


def _new_line_name(new_line: str | None, report: RebaseReport) -> str | None:
    if new_line is None:
        return None
    name = new_line or (report.pin.version if report.pin else report.ref.removeprefix("v"))
    if not NAME_RE.match(name):
        raise UsageError(
            f"--new-line {name!r}: a line name is letters, digits and . _ + - (it names a "
            "folder under patches/)"
        )
    return name


def _resume(out, ws: Workspace, spec, line, write, new_line, abort: bool) -> int:
    """--continue or --abort the rebase stopped in the target's conflict work tree."""
    name = ws.targets.get(parse_target_spec(spec).target).name if spec else _only_one(ws)
    dest = rebase_dir(ws.project.work_dir, name)
    if not rebase_stopped(dest):  # the same outcome for both, with or without --target
        abort_rebase(dest)  # sweeps what a removal killed part-way left beside it
        raise NothingToDo(
            f"no rebase in progress for {name}"
            + (f" ({dest} is not a conflict work tree patchkit left)" if dest.exists() else "")
        )
    if abort:
        abort_rebase(dest)
        out.echo(f"{name}: removed {dest}")
        return 0
    target = _stopped_target(ws, name, dest, line)
    read = stopped_read(dest) or _read(ws, target)
    with out.reporting():
        report, wanted = continue_rebase(dest, target, line_series(ws.project, target))
    if not report.conflicted and (write or wanted):
        try:
            _write(ws, target, report, report.new_line if new_line is None else new_line, read)
        except SeriesChangedError as exc:
            exc.hint = (
                f"the conflict work tree {dest} is kept (the resolution is in its commits); "
                f"`patchkit rebase --target {target.name} --abort` and rebase again from "
                "the series as it is now"
            )
            raise
        abort_rebase(dest)
        report.next_steps = [f"removed the scratch work tree {dest}"]
    return _finish(out, report, out.json_mode)


def _read(ws: Workspace, target) -> SeriesRead:
    """Taken before the line's series is read: --write refuses when it changed since."""
    return SeriesRead.take(
        ws.project.patches_dir / target.current_line.series,
        ws.project,
        seen=ws.targets_digest,
        by="while the rebase carried it",
    )


def _write(
    ws: Workspace, target, report: RebaseReport, new_line: str | None, read: SeriesRead
) -> None:
    write_rebase(
        report,
        ws.project.patches_dir / target.current_line.series,
        ws.project.targets_file,
        target.line,
        new_line=new_line,
        read=read,
    )


def _refuse_unnamed(ws, **flags: bool) -> None:
    """Each option that writes into the project (patches/, targets.toml, work/rebase/) is
    refused in a project the user did not name."""
    for name, given in flags.items():
        option = "--continue" if name == "cont" else "--" + name.replace("_", "-")
        ws.project.refuse_unnamed(f"rebase {option}", when=given)


def _stopped_target(ws, name: str, dest, line):
    """The target at the line the rebase stopped in `dest` carries; a line patches/ no longer
    has (a --continue --write killed after its write, before the tree was removed) is refused
    naming the way on."""
    try:
        return ws.targets.get(name, stopped_line(dest) or line)
    except UsageError as exc:
        raise UsageError(
            f"the rebase stopped in {dest} carries a line patches/ no longer has ({exc.message})",
            hint=f"if a --continue --write finished its write, the tree is left over: "
            f"`patchkit rebase --target {name} --abort` removes it",
        ) from None


def _only_one(ws: Workspace) -> str:
    """The target of the one rebase in progress (--continue and --abort without --target)."""
    names = [n for n in ws.targets.targets if rebase_dir(ws.project.work_dir, n).exists()]
    if not names:
        raise NothingToDo("no rebase in progress")
    if len(names) > 1:
        raise UsageError(f"rebases in progress for {', '.join(names)}: pass --target NAME")
    return names[0]


def _finish(out: Output, report: RebaseReport, as_json: bool) -> int:
    if as_json:
        out.document(report.to_json())
    else:
        out.echo(render_rebase(report))
    return 1 if report.conflicted else 0


def render_rebase(report: RebaseReport) -> str:
    """The words a user reads for one rebase report."""
    lines = _render_bases(report)
    width = max((len(o.name) for o in report.outcomes), default=0)
    for o in report.outcomes:
        lines += _render_outcome(o, width)
    counts = report.counts()
    lines.append(
        "  summary: "
        + ", ".join(
            f"{counts.get(k, 0)} {k}"
            for k in LABELS
            if counts.get(k, 0) or k not in ("obsolete", "resolved", "dropped")
        )
    )
    lines += _render_result(report)
    if report.next_steps:
        lines.append("  next:")
        lines += [f"    {step}" for step in report.next_steps]
    return "\n".join(lines)


def _render_bases(report: RebaseReport) -> list[str]:
    """The old and new bases, and how far the new one is vouched for."""
    old, new = report.old_base, report.new_base
    lines = [
        f"{report.target}: rebase {old.stands_for} ({old.commit[:12]})",
        f"  onto {report.ref}: {new.stands_for} ({new.commit[:12]})",
    ]
    if report.line:
        lines.insert(1, f"  line {report.line}")
    if new.source == "wheel":
        lines.append(f"  wheel: {new.wheel} (sha256 {new.wheel_sha256})")
        if not new.pinned:
            lines.append("  not pinned yet: trust on first use of what the package index serves")
    if new.source == "sdist" and not new.pinned:
        lines.append(f"  sdist sha256: {new.sdist_sha256}")
        lines.append(
            "  upstream commit: "
            + (new.upstream_commit or "none recorded: relying on the sha256, trust on first use")
        )
        lines.append(
            "  not pinned yet: trust on first use of what the package index serves"
            + ("; --write records it in targets.toml" if not report.written else "")
        )
    if not report.history:
        lines.append("  patch-id signal: not available (no git history between the bases)")
    return lines


def _render_outcome(o: PatchOutcome, width: int) -> list[str]:
    """One patch's line, with its evidence, note and parts indented below it."""
    extra = []
    if o.changed and o.label not in ("upstreamed", "obsolete", "dropped"):
        extra.append("refreshed")
    if o.conflicts:
        extra.append("conflicts in " + ", ".join(o.conflicts))
    tail = f"  ({'; '.join(extra)})" if extra else ""
    lines = [f"  {MARK.get(o.label, o.label):>10}  {o.name:<{width}}{tail}"]
    if o.label in ("upstreamed", "obsolete"):
        lines += [f"{'':14}evidence: {s.name}: {s.detail}" for s in o.signals if s.fired]
        silent = [s for s in o.signals if not s.fired]
        if silent:
            lines.append(
                f"{'':14}not fired: "
                + "; ".join(f"{s.name} ({'n/a' if s.fired is None else 'no'})" for s in silent)
            )
    if o.note and o.label != "clean":
        lines.append(f"{'':14}{o.note}")
    lines += [f"{'':14}{p.path}: {p.state} ({p.detail})" for p in o.parts]
    lines += [f"{'':14}{p.words()}" for p in o.probes if not p.passed]
    return lines


def _render_result(report: RebaseReport) -> list[str]:
    """What was written, or why nothing was."""
    if report.written:
        return [
            f"  wrote: {', '.join(report.written)}",
            f"  series version {report.series_version} -> {report.next_series_version}",
            "  suggested commit message (commit patches/ with it):",
            *(f"    {ln}".rstrip() for ln in (report.commit_message or "").splitlines()),
        ]
    if report.conflicted:
        lines = [
            f"  {len(report.conflicted)} patch(es) in conflict: nothing in patches/ was changed"
        ]
        if report.conflict_tree:
            lines.append(
                f"  a scratch work tree stopped at the first conflict: {report.conflict_tree}"
            )
        return lines
    if report.write_requested:
        return ["  nothing to write: the series already sits on this ref unchanged"]
    return [
        f"  dry run: nothing written (--write refreshes patches/, moves the line's pin, "
        f"or with --new-line starts a line; series {report.series_version} -> "
        f"{report.next_series_version})"
    ]
