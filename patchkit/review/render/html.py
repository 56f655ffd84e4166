"""The review as one self-contained HTML page (inline CSS, no scripts, no network fetches)."""

from __future__ import annotations

from html import escape
from importlib import resources
from string import Template

from patchkit.review.model import PatchRow, RangeEntry, Review, TargetReview

STATUS_WORDS = {
    "applied-upstream": "applied upstream",
    "forwarded": "forwarded",
    "backport": "backport",
    "not-needed": "not needed",
    "not-forwarded": "not forwarded",
    "unknown": "unknown",
}


def _asset(name: str) -> str:
    return resources.files("patchkit.review").joinpath(name).read_text(encoding="utf-8")


def _anchor(*parts: str) -> str:
    return "-".join("".join(c if c.isalnum() else "-" for c in p) for p in parts)


def _link(url: str) -> str:
    return f'<a href="{escape(url)}" rel="noreferrer noopener">{escape(url)}</a>'


def diff_html(diff: str) -> str:
    """A unified diff as a <pre> with one classed line each."""
    out = []
    for line in diff.rstrip("\n").split("\n"):
        if line.startswith("diff --git"):
            cls = "file"
        elif line.startswith(
            (
                "index ",
                "--- ",
                "+++ ",
                "new file",
                "deleted file",
                "similarity",
                "rename ",
                "old mode",
                "new mode",
                "\\ No newline",
            )
        ):
            cls = "meta"
        elif line.startswith("@@"):
            cls = "hunk"
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        else:
            cls = "ctx"
        out.append(f'<span class="{cls}">{escape(line)}</span>')
    return '<pre class="diff">' + "".join(out) + "</pre>"


def _badge(kind: str, value: str, text: str | None = None) -> str:
    return f'<span class="badge {kind}-{escape(value)}">{escape(text or value)}</span>'


def _summary_table(t: TargetReview) -> str:
    head = ["#", "Patch", "Purpose", "Upstream", "Files", "+/−", "Tests"]
    if t.against:
        head.append(f"Rebase onto {escape(t.against)}")
    rows = []
    for i, p in enumerate(t.patches, 1):
        anchor = _anchor("patch", t.name, p.name)
        links = "".join(f'<br><span class="link">{_link(u)}</span>' for u in p.links)
        cells = [
            f'<td class="num">{i}</td>',
            f'<td><a href="#{anchor}"><code>{escape(p.name)}</code></a></td>',
            f'<td class="purpose">{escape(p.purpose)}</td>',
            f"<td>{_badge('status', p.status, STATUS_WORDS.get(p.status))}{links}</td>",
            '<td class="files">' + "<br>".join(escape(f.path) for f in p.files) + "</td>",
            f'<td class="num"><span class="plus">+{p.added}</span> '
            f'<span class="minus">−{p.removed}</span></td>',
            f'<td class="num">{len(p.tests)}</td>',
        ]
        if t.against:
            evidence = "".join(f"<li>{escape(e)}</li>" for e in p.evidence)
            cells.append(
                "<td>"
                + (_badge("label", p.classification) if p.classification else "–")
                + (f'<ul class="evidence">{evidence}</ul>' if evidence else "")
                + "</td>"
            )
        rows.append(
            f'<tr class="patch-row" data-target="{escape(t.name)}" '
            f'data-patch="{escape(p.name)}">' + "".join(cells) + "</tr>"
        )
    return (
        '<table class="summary"><thead><tr>'
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _patch_section(t: TargetReview, p: PatchRow) -> str:
    meta = [
        (
            "Upstream",
            _badge("status", p.status, STATUS_WORDS.get(p.status)) + " " + escape(p.status_text),
        ),
        ("Origin", escape(p.origin or "—")),
        (
            "Forwarded",
            _link(p.forwarded)
            if (p.forwarded or "").startswith("http")
            else escape(p.forwarded or "—"),
        ),
        ("Applied-Upstream", escape(p.applied_upstream or "—")),
        ("Last-Update", escape(p.last_update or "—")),
        (
            "Files",
            "<br>".join(
                f"<code>{escape(f.path)}</code> "
                f'<span class="plus">+{f.added}</span> '
                f'<span class="minus">−{f.removed}</span>'
                for f in p.files
            ),
        ),
        ("Tests", "<br>".join(f"<code>{escape(x)}</code>" for x in p.tests) or "—"),
    ]
    if p.classification:
        meta.append(
            (
                f"Rebase onto {escape(t.against or '')}",
                _badge("label", p.classification) + "".join(f"<br>{escape(e)}" for e in p.evidence),
            )
        )
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in meta)
    return (
        f'<section class="patch" id="{_anchor("patch", t.name, p.name)}">'
        f"<header><h3>{escape(p.name)}</h3><p>{escape(p.purpose)}</p></header>"
        f'<div class="body"><dl class="meta">{dl}</dl>'
        f'<pre class="description">{escape(p.description)}</pre>'
        f"<details open><summary>Diff ({len(p.files)} file(s), +{p.added} −{p.removed})"
        f"</summary>{diff_html(p.diff)}</details></div></section>"
    )


def _target_section(t: TargetReview) -> str:
    parts = [
        f'<section class="target" id="{_anchor("target", t.name)}">',
        f"<h2>{escape(t.name)}</h2>",
        f'<p class="base">{len(t.patches)} patch(es) on {escape(t.base)}'
        + (f" (<code>{escape(t.base_commit[:12])}</code>)" if t.base_commit else "")
        + (
            f"; rebase classification against {escape(t.against)}: {escape(t.against_base or '')}"
            if t.against
            else ""
        )
        + "</p>",
    ]
    if t.error:
        parts.append(f'<p class="error">{escape(t.error)}</p>')
    parts.append(_summary_table(t))
    parts += [_patch_section(t, p) for p in t.patches]
    if t.diffstat or t.delta:
        parts.append(
            f"<details><summary>Combined delta of the patched {escape(t.name)} tree "
            f"against its base</summary>"
            f'<pre class="stat">{escape(t.diffstat)}</pre>'
            f"{diff_html(t.delta) if t.delta else ''}</details>"
        )
    parts.append("</section>")
    return "".join(parts)


def _range_entry(e: RangeEntry) -> str:
    note = f' <span class="note">{escape(e.note)}</span>' if e.note else ""
    head = f"{_badge('state', e.state)} <code>{escape(e.target)}/{escape(e.name)}</code>{note}"
    if e.interdiff:
        return (
            f'<details class="range-entry" open><summary>{head}</summary>'
            f"{diff_html(e.interdiff)}</details>"
        )
    return f'<div class="range-entry">{head}</div>'


def render(review: Review) -> str:
    """The whole page."""
    title = f"patchkit review: series {review.series_version}"
    total = sum(len(t.patches) for t in review.targets)
    toc = [
        f'<a href="#{_anchor("target", t.name)}">{escape(t.name)} ({len(t.patches)})</a>'
        for t in review.targets
    ]
    body = [_target_section(t) for t in review.targets]
    c = review.comparison
    if c is not None:
        toc.append('<a href="#range-diff">changes since ' + escape(c.since) + "</a>")
        counts = ", ".join(f"{n} {k}" for k, n in sorted(c.counts().items())) or "no patches"
        body.append(
            '<section id="range-diff"><h2>Changes since '
            f"<code>{escape(c.since)}</code></h2>"
            f'<p class="base">series {escape(c.since_version or "?")} '
            f"(<code>{escape(c.since_commit[:12])}</code>) → {escape(c.version)}: "
            f"{escape(counts)}</p>" + "".join(_range_entry(e) for e in c.entries) + "</section>"
        )
    lede = (
        f"{total} patch(es) in {len(review.targets)} target(s): the upstream-diff review "
        "for maintainers and upstream reviewers."
    )
    return Template(_asset("page.html")).substitute(
        title=escape(title),
        css=_asset("style.css"),
        lede=escape(lede),
        toc="".join(toc),
        body="\n".join(body),
    )
