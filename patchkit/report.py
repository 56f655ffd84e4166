"""Turning report objects into the words a user reads."""

from __future__ import annotations

from patchkit.apply import ApplyReport
from patchkit.status import StatusReport

# The words of --json, upper-cased where a state needs attention.
STATUS_MARK = {
    "applied": "applied",
    "present": "present",
    "fuzzed": "FUZZED",
    "merged": "MERGED",
    "already-applied": "already-applied",
    "failed": "FAILED",
    "missing": "MISSING",
    "modified": "MODIFIED",
}


def render_apply(report: ApplyReport) -> str:
    lines = [
        f"{report.target}: base {report.base.commit[:12]} ({report.base.stands_for})",
        f"  series {report.series_version} ({report.series_hash[:12]}), "
        f"{report.series_size or len(report.patches)} patch(es) -> {report.into}",
    ]
    for result in report.patches:
        mark = STATUS_MARK.get(result.status, result.status)
        commit = f" {result.commit[:12]}" if result.commit else ""
        lines.append(f"  {mark:>8}  {result.name}{commit}")
        for hunk in result.fuzzed:
            lines.append(f"            FUZZED {hunk.path} {hunk.header}: {hunk.note}")
        if result.failure:
            f = result.failure
            lines.append(f"            {f.path} {f.header}: {f.note}")
        elif result.status == "already-applied":
            lines.append(f"            {result.message}")
    if report.status == "applied":
        lines.append(
            f"  applied: {report.into} is at {report.result[:12]} (branch patchkit/{report.target})"
        )
    elif report.status == "nothing-to-do":
        lines.append(f"  nothing to do: {report.into} already carries this series")
    else:
        lines.append(f"  failed: {report.error}")
        lines.append(f"  {report.into} was left exactly as it was")
    if not report.base.pinned:
        lines.append(f"  WARNING: {report.base.unverified}")
    return "\n".join(lines)


def render_status(report: StatusReport) -> str:
    lines = [
        f"{report.target} in {report.directory}",
        f"  base     {report.base} = {report.stands_for}",
        f"  series   {report.series_version} ({report.series_hash[:12]})",
        f"  HEAD     {report.head or '-'}"
        + ("  (= series result)" if report.head == report.expected else ""),
    ]
    if report.error:
        lines.append(f"  error    {report.error}")
    for state in report.patches:
        mark = STATUS_MARK.get(state.state, state.state)
        extra = f"  ({', '.join(state.changed_files)})" if state.changed_files else ""
        lines.append(f"  {mark:>8}  {state.name}{extra}")
    for commit in report.extra_commits:
        lines.append(f"     extra  {commit[:12]} (not from the series)")
    return "\n".join(lines)
