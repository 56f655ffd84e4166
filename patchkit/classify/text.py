"""Reading Python source and diffs as lines: normalised, counted, named."""

from __future__ import annotations

import re

DEF_RE = re.compile(r"^\s*(?:async\s+def|def|class)\s+([A-Za-z_]\w*)")
TRIVIAL_LINE = re.compile(r"^[\s()\[\]{}:;,.#\"'`]*$")
NAME_RE = re.compile(r"[A-Za-z_]\w{3,}")
CALL_RE = re.compile(r"([A-Za-z_]\w*)\s*\(")
GENERIC_WORDS = frozenset(("self", "None", "True", "False", "return", "elif", "else", "pass"))
# Words that name no behaviour of their own (builtins, keywords).
_NOT_EFFECTS = GENERIC_WORDS | frozenset(
    ("getattr", "hasattr", "isinstance", "len", "range", "super", "print", "list", "dict",
     "tuple", "set", "str", "int", "bool", "float", "not", "and", "raise", "with", "assert")
)  # fmt: skip


def normalize(line: str) -> str:
    return " ".join(line.split())


def significant(line: str) -> bool:
    """A line that says something (not only brackets, punctuation or a comment)."""
    return not (TRIVIAL_LINE.match(line) or line.strip().startswith("#"))


def identifying(line: str) -> bool:
    """A line that names something (not `if (`, `else:`, `return x`): worth counting."""
    return any(word not in GENERIC_WORDS for word in NAME_RE.findall(line))


def decode(blob: bytes | None) -> str:
    return (blob or b"").decode("utf-8", "replace")


def definitions(blob: bytes | None) -> set[str]:
    return {m.group(1) for m in map(DEF_RE.match, decode(blob).splitlines()) if m}


def line_counts(blob: bytes | None) -> dict[str, int]:
    counts: dict[str, int] = {}
    for raw in decode(blob).splitlines():
        key = normalize(raw)
        counts[key] = counts.get(key, 0) + 1
    return counts


def target_path(pf) -> str:
    """The path a unidiff PatchedFile writes (its `b/` side)."""
    return pf.target_file[2:] if pf.target_file.startswith("b/") else pf.path


def code_lines(lines: list[str]) -> list[str]:
    """The lines of a body that are code: comments, docstrings and string-only lines out."""
    out, in_doc = [], False
    for line in lines:
        text = line.strip()
        quotes = text.count('"""') + text.count("'''")
        if in_doc or text.startswith(('"""', "'''")):
            in_doc = (quotes % 2 == 1) != in_doc
            continue
        if text and not text.startswith("#"):
            out.append(re.sub(r"(['\"]).*?\1", "''", text))
    return out


def effects(lines: list[str]) -> tuple[frozenset[str], frozenset[str]]:
    """(names called, names used) in a body's code: what a definition does, whatever its name."""
    code = code_lines(lines)
    calls = {c for line in code for c in CALL_RE.findall(line) if c not in _NOT_EFFECTS}
    names = {n for line in code for n in NAME_RE.findall(line) if n not in _NOT_EFFECTS}
    return frozenset(calls), frozenset(names)
