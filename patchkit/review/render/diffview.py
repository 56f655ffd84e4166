"""A unified diff as an HTML table: old and new line numbers, highlighted code, one row a line."""

from __future__ import annotations

import re
from html import escape

from patchkit.review.render.highlight import highlight, language_of

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@(.*)$")


def _row(cls: str, old: str, new: str, code: str) -> str:
    return (
        f'<tr class="{cls}"><td class="ln" data-ln="{old}"></td>'
        f'<td class="ln" data-ln="{new}"></td><td class="code">{code}</td></tr>'
    )


def _file_path(line: str) -> str:
    """`diff --git a/x b/x` -> x (the b side; paths with spaces keep their spaces)."""
    rest = line[len("diff --git ") :]
    half = rest.find(" b/")
    return rest[half + 3 :] if half >= 0 else rest


def diff_table(diff: str) -> str:
    """The diff as a <table class="diff">; line numbers are CSS-generated (not copied with code)."""
    rows: list[str] = []
    old = new = 0
    language: str | None = None
    in_hunk = False
    for line in diff.rstrip("\n").split("\n"):
        if line.startswith("diff --git"):
            path = _file_path(line)
            language = language_of(path)
            in_hunk = False
            rows.append(f'<tr class="file"><td colspan="3"><code>{escape(path)}</code></td></tr>')
            continue
        match = _HUNK.match(line)
        if match:
            old, new = int(match.group(1)), int(match.group(2))
            in_hunk = True
            rows.append(_row("hunk", "", "", escape(line)))
            continue
        if not in_hunk or line.startswith("\\"):
            if line:
                rows.append(_row("meta", "", "", escape(line)))
            continue
        marker, code = line[:1], line[1:]
        body = f'<span class="mark">{escape(marker or " ")}</span>' + highlight(code, language)
        if marker == "+":
            rows.append(_row("add", "", str(new), body))
            new += 1
        elif marker == "-":
            rows.append(_row("del", str(old), "", body))
            old += 1
        else:
            rows.append(_row("ctx", str(old), str(new), body))
            old += 1
            new += 1
    return '<div class="diff-wrap"><table class="diff">' + "".join(rows) + "</table></div>"
