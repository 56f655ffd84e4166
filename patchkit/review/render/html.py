"""The review as one self-contained HTML page: inline CSS, one inline script allowed by its hash
(expand / collapse all), nothing fetched from the network."""

from __future__ import annotations

import base64
import hashlib
from html import escape
from importlib import resources
from string import Template

from patchkit.review.model import PatchRow, RangeEntry, Review, TargetReview
from patchkit.review.render.diffview import diff_table

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
    """A unified diff with line numbers and highlighting (kept as the public name)."""
    return diff_table(diff)


def _path_html(path: str) -> str:
    """A path that breaks only after a slash, never mid-word."""
    return "/<wbr>".join(escape(part) for part in path.split("/"))


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
            '<td class="files">' + "<br>".join(_path_html(f.path) for f in p.files) + "</td>",
            f'<td class="num"><span class="plus">+{p.added}</span> '
            f'<span class="minus">−{p.removed}</span></td>',
            f'<td class="num">{len(p.tests)}</td>',
        ]
        if t.against:
            cells.append(f'<td class="rebase">{_rebase_notes(p)}</td>')
        rows.append(
            f'<tr class="patch-row" data-target="{escape(t.name)}" '
            f'data-patch="{escape(p.name)}">' + "".join(cells) + "</tr>"
        )
    return (
        '<div class="table-wrap"><table class="summary"><thead><tr>'
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></div>"
    )


def _rebase_notes(p: PatchRow) -> str:
    """Label, provisional flag, rebase note, conflict reasons and fired signals of one patch."""
    if not p.classification:
        return "–"
    parts = [_badge("label", p.classification)]
    if p.provisional:
        parts.append(
            ' <span class="badge provisional" title="classified while an earlier patch was '
            'left out">provisional</span>'
        )
    if p.note:
        parts.append(f'<p class="rebase-note">{escape(p.note)}</p>')
    if p.conflicts:
        parts.append(
            '<p class="conflicts">conflicts in '
            + ", ".join(f"<code>{_path_html(c)}</code>" for c in p.conflicts)
            + "</p>"
        )
    evidence = "".join(
        f"<li>{escape(e)}</li>" for e in p.evidence if not e.startswith("conflicts in ")
    )
    if evidence:
        parts.append(f'<ul class="evidence">{evidence}</ul>')
    return "".join(parts)


def _counts(t: TargetReview) -> str:
    """Series-wide counts of one target: patches, files, lines, upstream status, rebase labels."""
    files = {f.path for p in t.patches for f in p.files}
    added = sum(p.added for p in t.patches)
    removed = sum(p.removed for p in t.patches)
    status: dict[str, int] = {}
    labels: dict[str, int] = {}
    for p in t.patches:
        status[p.status] = status.get(p.status, 0) + 1
        if p.classification:
            labels[p.classification] = labels.get(p.classification, 0) + 1
    chips = [
        f'<span class="count"><b>{len(t.patches)}</b> patch(es)</span>',
        f'<span class="count"><b>{len(files)}</b> file(s)</span>',
        f'<span class="count"><b class="plus">+{added}</b> <b class="minus">−{removed}</b></span>',
    ]
    chips += [
        _badge("status", k, f"{n} {STATUS_WORDS.get(k, k)}") for k, n in sorted(status.items())
    ]
    chips += [_badge("label", k, f"{n} {k}") for k, n in sorted(labels.items())]
    return f'<div class="counts" data-target="{escape(t.name)}">' + " ".join(chips) + "</div>"


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
                f"<code>{_path_html(f.path)}</code> "
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
                _rebase_notes(p),
            )
        )
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in meta)
    return (
        f'<section class="patch" id="{_anchor("patch", t.name, p.name)}">'
        f"<header><h3>{escape(p.name)}</h3><p>{escape(p.purpose)}</p></header>"
        f'<div class="body"><dl class="meta">{dl}</dl>'
        f'<pre class="description">{escape(p.description)}</pre>'
        f'<details class="patch-diff"><summary>Diff ({len(p.files)} file(s), '
        f"+{p.added} −{p.removed})</summary>{diff_html(p.diff)}</details></div></section>"
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
    parts.append(_counts(t))
    parts.append(_summary_table(t))
    parts += [_patch_section(t, p) for p in t.patches]
    if t.diffstat or t.delta:
        parts.append(
            f'<details class="delta"><summary>Combined delta of the patched {escape(t.name)} tree '
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
            f'<details class="range-entry"><summary>{head}</summary>'
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
    script = _asset("page.js")
    return Template(_asset("page.html")).substitute(
        title=escape(title),
        css=_asset("style.css"),
        script=script,
        script_hash=_csp_hash(script),
        lede=escape(lede),
        toc="".join(toc),
        body="\n".join(body),
    )


def _csp_hash(script: str) -> str:
    """The CSP source expression that allows exactly this inline script and no other."""
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"
