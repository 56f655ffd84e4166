"""A file's part that does not apply, hunk by hunk: is each hunk's effect already in the
release?

A hunk is read where its code lives now: the definition around it in the old base
(`Class.method`), found in the release by that name when it still holds most of the hunk's
code context, else as the definition of the file holding most of it (a body moved into a
helper), else by that name, else as a definition upstream added elsewhere in the tree.
There, a hunk is upstream when

- `same-lines`: each block of lines it adds follows the line it follows in the patch (blank
  lines and comments aside) and no line it removes is left;
- `same-change`: each statement it adds that calls something has an upstream counterpart
  right after the same line: the same target assigned from a call of the same name or of a
  name ending the same (`x = tensor_model_parallel_all_reduce(x)` and upstream's
  `x = attention_tensor_model_parallel_all_reduce(x)`), unconditionally or in both branches
  of an `if`/`else` (a counterpart under one condition only is another change), and each
  assignment it adds from other values without a call (`new_seq_lens = batch.seq_lens + 1`;
  not an initial `rows = 0`) stands in upstream's definition as it is: a change whose calls
  upstream makes but whose own state it does not keep is another change;
- `delegated`: it only inserts code under a condition (`if i in self.layers_to_capture:`)
  and upstream no longer tests that condition as a statement there but passes it to a call
  (`capture_output=aux.capture if i in self.layers_to_capture else None`): the code the
  hunk guards moved into the callee.

Each verdict quotes the lines it rests on.  What this cannot see: an effect reached by code
of another shape (another call, a check made elsewhere), and whether a callee that took over
the guarded code does what the hunk adds (a `delegated` verdict says so: read it).
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from functools import cached_property

from patchkit.classify.delta import Delta
from patchkit.classify.text import (
    DEF_RE,
    GENERIC_WORDS,
    NAME_RE,
    identifying,
    normalize,
    significant,
)

# A definition is the hunk's home when it holds at least this share of the hunk's identifying
# context lines.
HOME_SHARE = 0.5
# Lines searched after an anchor for what the hunk adds.
WINDOW = 12
_CALL_RE = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
_ASSIGN_RE = re.compile(r"^([\w.\[\], ]+?)\s*=(?!=)")
_GUARD_RE = re.compile(r"^(?:el)?if\s+(.+):$")
_IMPORT_RE = re.compile(r"^(from\s|import\s|[\w.]+,?$|\)$)")
_NOT_EFFECTS = frozenset(("getattr", "hasattr", "isinstance", "len", "super", "print", "get"))
_DEFINES = ("def ", "class ", "async ", "@")
_LITERALS = frozenset(("None", "True", "False"))


@dataclass
class HunkVerdict:
    """One hunk of a file's part: `upstream` (how: `same-lines`, `same-change`,
    `delegated`) or `needed`, with the evidence quoted."""

    header: str  # "@@ -306,15 +306,21 @@"
    state: str  # "upstream" | "needed"
    how: str
    evidence: str

    def to_json(self) -> dict:
        return {"hunk": self.header, "state": self.state, "how": self.how,
                "evidence": self.evidence}  # fmt: skip


@dataclass
class _Definition:
    name: str  # qualified: Class.method
    first: int  # 1-based line of the `def`
    raw: list[str]  # its lines as written

    @cached_property
    def body(self) -> list[str]:
        """Its lines, normalised."""
        return [normalize(x) for x in self.raw]

    @cached_property
    def lines(self) -> frozenset[str]:
        return frozenset(self.body)


def hunk_verdicts(pf, path: str, old_text: str, new_text: str, delta: Delta) -> list[HunkVerdict]:
    """One verdict per hunk of the PatchedFile `pf`, whose file `path` reads `new_text` in
    the release and read `old_text` in the old base."""
    old_defs, new_defs = _definitions(old_text), _definitions(new_text)
    out = []
    for hunk in pf:
        header = (
            f"@@ -{hunk.source_start},{hunk.source_length} "
            f"+{hunk.target_start},{hunk.target_length} @@"
        )
        old = _enclosing(old_defs, hunk.source_start, hunk.source_length)
        home = _home(old, hunk, path, new_defs, delta) if old else _module(path, new_text)
        out.append(_verdict(hunk, header, old, home))
    return _imports_follow(pf, out)


def _imports_follow(pf, verdicts: list[HunkVerdict]) -> list[HunkVerdict]:
    """A hunk that only adds imports serves the file's other hunks: upstream when they all
    are."""
    imports = [_only_imports(h) for h in pf]
    others = [v for v, only in zip(verdicts, imports, strict=True) if not only]
    if not others or any(v.state != "upstream" for v in others):
        return verdicts
    words = "adds only imports, for the file's other hunks"
    return [
        HunkVerdict(v.header, "upstream", "imports", words) if only else v
        for v, only in zip(verdicts, imports, strict=True)
    ]


def _only_imports(hunk) -> bool:
    changed = [normalize(ln.value) for ln in hunk if (ln.is_added or ln.is_removed)]
    code = [x for x in changed if significant(x)]
    return bool(code) and all(_IMPORT_RE.match(x) for x in code)


def _verdict(hunk, header: str, old: _Definition | None, home) -> HunkVerdict:
    if home is None:
        return HunkVerdict(header, "needed", "", "the code it changes was not found")
    where, definition = home
    if old is not None and definition.name not in (old.name, "the module"):
        where += f" (was {old.name})"
    for check in (_same_lines, _same_change, _delegated):
        found = check(hunk, definition)
        if found:
            how, words = found
            return HunkVerdict(header, "upstream", how, f"{words}, in {where}")
    return HunkVerdict(header, "needed", "", f"its change is not in {where}")


def _blocks(hunk) -> list[tuple[str | None, list[str]]]:
    """Each run of lines the hunk adds (code: significant lines outside docstrings,
    normalised), with the identifying line it follows in the patched file (None at the
    hunk's start)."""
    out: list[tuple[str | None, list[str]]] = []
    anchor, run = None, None
    code = _Code()
    for ln in hunk:
        if ln.is_added:
            if run is None:
                run = []
                out.append((anchor, run))
            if code.holds(ln.value) and significant(ln.value):
                run.append(normalize(ln.value))
            continue
        run = None
        if ln.is_context and identifying(ln.value):
            anchor = normalize(ln.value)
    return [(a, r) for a, r in out if r]


def _removed(hunk) -> list[str]:
    added = {normalize(ln.value) for ln in hunk if ln.is_added}
    code = _Code()
    return [
        normalize(ln.value)
        for ln in hunk
        if ln.is_removed
        and code.holds(ln.value)
        and identifying(ln.value)
        and normalize(ln.value) not in added
    ]


class _Code:
    """Reads lines in order and tells code from docstrings (which upstream rewords)."""

    def __init__(self) -> None:
        self.in_doc = False

    def holds(self, line: str) -> bool:
        text = line.strip()
        quotes = text.count('"""') + text.count("'''")
        if self.in_doc or text.startswith(('"""', "'''")):
            self.in_doc = (quotes % 2 == 1) != self.in_doc
            return False
        return True


def _after(raw: list[str], anchor: str) -> list[list[tuple[int, str]]]:
    """For each place `anchor` stands in `raw`: the significant lines after it (index,
    stripped), comments and blank lines left out, at most WINDOW."""
    out = []
    for i, line in enumerate(raw):
        if normalize(line) != anchor:
            continue
        following = []
        for j in range(i + 1, min(len(raw), i + 1 + WINDOW)):
            text = raw[j].strip()
            if text and not text.startswith("#"):
                following.append((j, text))
        out.append(following)
    return out


def _same_lines(hunk, home: _Definition):
    blocks = _blocks(hunk)
    if not blocks or any(r in home.lines for r in _removed(hunk)):
        return None
    quoted = []
    for anchor, lines in blocks:
        wanted = [x for x in lines if identifying(x) and not _IMPORT_RE.match(x)]
        if not wanted:
            continue
        if anchor is None or not any(
            [normalize(t) for _, t in after[: len(lines)]] == lines
            for after in _after(home.raw, anchor)
        ):
            return None
        quoted.append(f"`{wanted[0]}`")
    if not quoted:
        return None
    return "same-lines", f"the lines it adds stand where it adds them ({'; '.join(quoted)})"


def _same_change(hunk, home: _Definition):
    if any(r in home.lines for r in _removed(hunk)):
        return None
    matches = []
    for anchor, lines in _blocks(hunk):
        guards: set[str] = set()  # the names the block's own conditions test
        for line in lines:
            if _GUARD_RE.match(line) or line == "else:":
                guards |= _names(line)
                continue
            if _IMPORT_RE.match(line) or line.startswith(_DEFINES):
                continue
            if not _calls(line):
                if _keeps_state(line) and line not in home.lines:
                    return None  # state of its own that upstream does not keep
                continue
            if anchor is None:
                return None
            twin = next(
                (
                    t
                    for region in _regions(home.raw, anchor)
                    if (t := _counterpart(region, line, guards))
                ),
                None,
            )
            if twin is None:
                return None
            matches.append(f"`{line}` as upstream's {twin}")
    if not matches:
        return None
    return "same-change", "the same change: " + "; ".join(matches)


def _regions(raw: list[str], anchor: str) -> list[list[tuple[int, str]]]:
    """For each place `anchor` stands in `raw`: the statements that follow it at the level of
    the first one and deeper (indent, stripped; comments and blank lines out)."""
    out = []
    for i, line in enumerate(raw):
        if normalize(line) != anchor:
            continue
        region: list[tuple[int, str]] = []
        for j in range(i + 1, min(len(raw), i + 1 + 2 * WINDOW)):
            text = raw[j].strip()
            if not text or text.startswith("#"):
                continue
            indent = len(raw[j]) - len(raw[j].lstrip())
            if region and indent < region[0][0]:
                break
            region.append((indent, text))
        out.append(region)
    return out


def _counterpart(region: list[tuple[int, str]], line: str, guards: set[str]) -> str | None:
    """Upstream's statement doing what `line` does after the anchor: at the region's level
    (or in the body of a loop or `with` there), or in a branch of an `if` there: every branch
    of an `if`/`else`, or one whose condition tests a name the patch's own conditions test
    (one other condition is another change)."""
    if not region:
        return None
    level = region[0][0]
    chain: list[tuple[str, list[str]]] = []  # the branches of the `if` being read
    body: int | None = -1  # the indent of the loop or `with` body being read (-1: none)
    for indent, text in region:
        if indent == level:
            if _same_effect(line, text):
                return f"`{text}`"
            if text.startswith(("elif ", "else:")) and chain:
                chain.append((text, []))
                continue
            found = _in_chain(chain, line, guards)
            if found:
                return found
            chain = [(text, [])] if _GUARD_RE.match(text) else []
            body = None if not chain and text.endswith(":") else -1
        elif chain:
            chain[-1][1].append(text)
        elif body is None or body == indent:
            body = indent
            if _same_effect(line, text):
                return f"`{text}`"
    return _in_chain(chain, line, guards)


def _in_chain(chain: list[tuple[str, list[str]]], line: str, guards: set[str]) -> str | None:
    hits = [(head, next((t for t in body if _same_effect(line, t)), None)) for head, body in chain]
    done = [f"`{head} {t}`" for head, t in hits if t]
    if not done:
        return None
    exhaustive = chain[-1][0] == "else:" and len(done) == len(chain)
    alike = any(t and _names(head) & guards for head, t in hits)
    return " and ".join(done) if exhaustive or alike else None


def _keeps_state(line: str) -> bool:
    """An assignment from other values (names), not from literals alone."""
    match = _ASSIGN_RE.match(line)
    return bool(match) and bool(_names(line[match.end() :]) - _LITERALS)


def _names(line: str) -> set[str]:
    return {w for w in NAME_RE.findall(line) if w not in GENERIC_WORDS}


def _delegated(hunk, home: _Definition):
    if _removed(hunk):
        return None
    lines = list(hunk)
    first = next((i for i, ln in enumerate(lines) if ln.is_added), None)
    if first is None:
        return None
    guard = next((normalize(ln.value) for ln in reversed(lines[:first]) if ln.value.strip()), "")
    match = _GUARD_RE.match(guard)
    if match is None or not identifying(match.group(1)):
        return None
    condition = match.group(1)
    if f"if {condition}:" in home.lines or f"elif {condition}:" in home.lines:
        return None  # still a statement there: the hunk's place is still there
    # A membership test (`i + 1 in self.layers`) is passed on when the same collection is.
    tested = condition.rsplit(" in ", 1)[1] if " in " in condition else None
    pattern = re.compile(
        r"\bif "
        + (r"[\w.+\- ]+ in " + re.escape(tested) if tested else re.escape(condition))
        + r"(?!\w)"
    )
    body = home.body
    for i, line in enumerate(body):
        if pattern.search(line) and not line.endswith(":"):
            handed = " ".join(body[max(0, i - 1) : i + 1])
            if "=" in handed or "(" in handed:
                return (
                    "delegated",
                    f"`{guard}` is no longer a statement: upstream passes it to a call "
                    f"(`{handed}`), so the code this hunk guards moved into the callee "
                    "(read it)",
                )
    return None


def _calls(line: str) -> list[str]:
    """The names a line calls (the last part of a dotted one), builtins left out."""
    names = [c.rsplit(".", 1)[-1] for c in _CALL_RE.findall(line)]
    return [n for n in names if n not in _NOT_EFFECTS and not keyword.iskeyword(n)]


def _same_effect(ours: str, theirs: str) -> bool:
    """The same target assigned (or none) from a call of the same name, or of one whose last
    two words are the same (`..._all_reduce`)."""
    if _GUARD_RE.match(theirs):
        return False
    mine, other = _calls(ours), _calls(theirs)
    if not mine or not other:
        return False
    ta, tb = _ASSIGN_RE.match(ours), _ASSIGN_RE.match(theirs)
    if (ta.group(1).strip() if ta else None) != (tb.group(1).strip() if tb else None):
        return False
    return any(a == b or (_tail(a) is not None and _tail(a) == _tail(b))
               for a in mine for b in other)  # fmt: skip


def _tail(name: str) -> tuple[str, ...] | None:
    words = [w for w in name.split("_") if w]
    return tuple(words[-2:]) if len(words) >= 2 else None


def _definitions(text: str) -> list[_Definition]:
    """Every definition of a file, nested ones too, with its qualified name."""
    lines = text.splitlines()
    out: list[_Definition] = []
    stack: list[tuple[int, str]] = []  # (indent, name) of the definitions around a line
    for i, line in enumerate(lines):
        match = DEF_RE.match(line)
        if not match:
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        name = ".".join([n for _, n in stack] + [match.group(1)])
        stack.append((indent, match.group(1)))
        end = i + 1
        while end < len(lines):
            nxt = lines[end]
            deeper = len(nxt) - len(nxt.lstrip()) > indent
            if nxt.strip() and not deeper and not nxt.lstrip().startswith((")", "]")):
                break
            end += 1
        out.append(_Definition(name, i + 1, lines[i:end]))
    return out


def _enclosing(defs: list[_Definition], start: int, length: int) -> _Definition | None:
    """The innermost definition around old lines start..start+length."""
    inside = [d for d in defs if d.first <= start and d.first + len(d.raw) >= start + length - 1]
    return max(inside, key=lambda d: d.first, default=None)


def _module(path: str, text: str):
    """A hunk outside any definition is read against the whole file."""
    return (path, _Definition("the module", 0, text.splitlines())) if text else None


def _home(old: _Definition, hunk, path: str, new_defs: list[_Definition], delta: Delta):
    """(where, definition) of the hunk's code in the release (see the module's docstring)."""
    wanted = {normalize(ln.value) for ln in hunk if ln.is_context and identifying(ln.value)}
    need = max(1.0, HOME_SHARE * len(wanted))

    def score(d: _Definition) -> int:
        return len(wanted & d.lines)

    namesake = next((d for d in new_defs if d.name == old.name), None)
    if namesake is not None and score(namesake) >= need:
        return f"{path}::{namesake.name}", namesake
    # the most context in the smallest body (a class holds its methods' lines too)
    best = max(new_defs, key=lambda d: (score(d), -len(d.raw)), default=None)
    if best is not None and score(best) >= need:
        return f"{path}::{best.name}", best
    if namesake is not None:
        return f"{path}::{namesake.name}", namesake
    # A body holding a wanted line holds that line's longest word: counted first, in its text.
    words = [max(line.split(), key=len) for line in wanted]
    for added in delta.added:
        text = added.text
        if sum(w in text for w in words) < need or added.path == path:
            continue
        if len(wanted & added.lines) >= need:
            return f"{added.path}::{added.name}", _Definition(added.name, 0, list(added.body))
    return None
