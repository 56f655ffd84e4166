"""Where the code a patch changes went when its file is gone and git saw no rename: a function
upstream moved into another module, under the same name or another.

A hunk that removes lines inside a function (its `@@ ... @@ def name(...)` header) is looked
for among the definitions upstream added between the bases (`Delta.added`, every definition of
a file new in the release included): one whose body holds every line the hunk removes (the
code the patch changes, e.g. a gate's condition) and most of its code context (comments
left out: upstream rewords them).  The best match is
where the part goes now; the function's old and new names are both reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from patchkit.classify.delta import AddedDefinition, Delta
from patchkit.classify.text import DEF_RE, identifying, normalize, significant

# A moved function keeps most of the lines around the change (the rest of its body).
CONTEXT_SHARE = 0.5


@dataclass
class Moved:
    """The new home of a gone file's changed code."""

    path: str
    name: str  # the definition there
    was: str  # the function the hunk changed in the old file
    removed: int  # lines the hunk removes, all found there
    context: tuple[int, int]  # (found, of) identifying context lines

    def names(self) -> str:
        return f"{self.was}, now {self.name}" if self.name != self.was else self.name

    def words(self) -> str:
        return (
            f"the code it changes moved to {self.path} ({self.names()}: holds the "
            f"{self.removed} line(s) it changes and {self.context[0]}/{self.context[1]} of its "
            "context)"
        )


def moved_code(pf, delta: Delta, gone: str) -> Moved | None:
    """Where the functions a gone file's hunks change now live (None: no hunk that changes a
    function was found elsewhere).  `pf` is the file's unidiff PatchedFile."""
    best: Moved | None = None
    for hunk in pf:
        header = DEF_RE.match((hunk.section_header or "").strip())
        removed = {normalize(ln.value) for ln in hunk if ln.is_removed and identifying(ln.value)}
        if header is None or not removed:
            continue
        context = {
            normalize(ln.value)
            for ln in hunk
            if ln.is_context and identifying(ln.value) and significant(ln.value)
        }
        found = _home(removed, context, header.group(1), delta, gone)
        if found is None:
            return None  # one changed function with no home: the file is not simply moved
        best = best or found
    return best


def _home(removed: set[str], context: set[str], was: str, delta: Delta, gone: str) -> Moved | None:
    first = next(iter(removed))
    # each word of `first` is in the text of a body whose normalised text holds it
    longest, *words = sorted(first.split(), key=len, reverse=True)
    best: tuple[tuple[int, bool], AddedDefinition] | None = None
    for candidate in delta.added:
        text = candidate.text
        if longest not in text or not all(w in text for w in words) or candidate.path == gone:
            continue
        if first not in candidate.normalized:
            continue
        body = {normalize(ln) for ln in candidate.body}
        if not removed <= body:
            continue
        score = (len(context & body), candidate.name == was)
        if best is None or score > best[0]:
            best = (score, candidate)
    if best is None or (context and best[0][0] < CONTEXT_SHARE * len(context)):
        return None
    (found, _), where = best
    return Moved(where.path, where.name, was, len(removed), (found, len(context)))
