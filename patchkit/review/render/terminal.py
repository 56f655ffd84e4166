"""The review as plain text for a terminal."""

from __future__ import annotations

from patchkit.review.model import PatchRow, Review, TargetReview


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*headers).rstrip(), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*row).rstrip() for row in rows]
    return out


def render_target(t: TargetReview, *, full_diff: bool = True) -> list[str]:
    lines = [
        f"{t.name}: {len(t.patches)} patch(es) on {t.base}"
        + (f" ({t.base_commit[:12]})" if t.base_commit else "")
    ]
    if t.error:
        lines.append(f"  error: {t.error}")
    lines += ["  " + ln for ln in _patch_table(t)]
    if t.against:
        lines.append(f"  rebase classification against {t.against}: {t.against_base}")
    for p in t.patches:
        lines += _patch_details(p, t.against)
    if t.diffstat:
        lines.append("")
        lines.append(f"  combined delta against {t.base}:")
        lines += ["    " + ln for ln in t.diffstat.rstrip("\n").splitlines()]
    if full_diff and t.delta:
        lines.append("")
        lines += t.delta.rstrip("\n").splitlines()
    return lines


def _patch_table(t: TargetReview) -> list[str]:
    """One row per patch; a column of its rebase classification when there is one."""
    headers = ["patch", "upstream", "files", "+/-", "tests"]
    if t.against:
        headers.append(f"rebase@{t.against}")
    rows = []
    for p in t.patches:
        row = [
            p.name,
            p.status_text,
            str(len(p.files)),
            f"+{p.added}/-{p.removed}",
            str(len(p.tests)),
        ]
        if t.against:
            row.append(p.classification or "-")
        rows.append(row)
    return _table(headers, rows)


def _patch_details(p: PatchRow, against: str | None) -> list[str]:
    """A patch's purpose, upstream status, files, tests and rebase classification."""
    links = [u for u in p.links if u not in p.status_text]
    lines = [
        "",
        f"  {p.name}",
        f"    {p.purpose}",
        f"    upstream: {p.status_text}" + (f" ({', '.join(links)})" if links else ""),
    ]
    lines += [f"    {f.path} (+{f.added}/-{f.removed})" for f in p.files]
    if p.tests:
        lines.append(f"    tests: {' '.join(p.tests)}")
    if p.classification:
        flag = " (provisional: an earlier patch was left out)" if p.provisional else ""
        lines.append(f"    rebase@{against}: {p.classification}{flag}")
        if p.note:
            lines.append(f"      note: {p.note}")
        lines += [f"      {e}" for e in p.evidence]
    return lines


def render(review: Review, *, full_diff: bool = True) -> str:
    lines = [f"patchkit review: series {review.series_version}"]
    for t in review.targets:
        lines.append("")
        lines += render_target(t, full_diff=full_diff)
    c = review.comparison
    if c is not None:
        lines.append("")
        lines.append(
            f"series changes since {c.since} ({c.since_commit[:12]}, series "
            f"{c.since_version or '?'} -> {c.version}): "
            + ", ".join(f"{n} {k}" for k, n in sorted(c.counts().items()))
        )
        for e in c.entries:
            note = f"  ({e.note})" if e.note else ""
            lines.append(f"  {e.state:>9}  {e.target}/{e.name}{note}")
            if e.interdiff:
                lines += ["      " + ln for ln in e.interdiff.splitlines()]
    return "\n".join(lines) + "\n"
