"""Offline syntax highlighting for diff lines: one regex tokenizer per language family.

A line of a diff is highlighted on its own (a multi-line string is not tracked across lines);
that keeps it linear and never wrong about what a line contains, only about its colour.
"""

from __future__ import annotations

import re
from html import escape

_PY_KEYWORDS = (
    "False None True and as assert async await break class continue def del elif else except "
    "finally for from global if import in is lambda nonlocal not or pass raise return try while "
    "with yield match case self cls"
)
_C_KEYWORDS = (
    "auto bool break case char const constexpr continue default do double else enum extern float "
    "for goto if inline int long namespace nullptr private protected public register return short "
    "signed sizeof static static_assert struct switch template this typedef typename union "
    "unsigned using virtual void volatile while __global__ __device__ __host__ __shared__ "
    "__forceinline__ __restrict__ true false"
)
_TOML_KEYWORDS = "true false"
_SH_KEYWORDS = "if then else elif fi for do done while case esac function in export local return"

# (comment pattern, keywords, has preprocessor lines)
_LANGUAGES: dict[str, tuple[str, str, bool]] = {
    "python": (r"#.*", _PY_KEYWORDS, False),
    "c": (r"//.*|/\*.*?(?:\*/|$)", _C_KEYWORDS, True),
    "toml": (r"#.*", _TOML_KEYWORDS, False),
    "shell": (r"#.*", _SH_KEYWORDS, False),
}
_EXTENSIONS = {
    ".py": "python",
    ".pyi": "python",
    ".c": "c",
    ".cc": "c",
    ".cpp": "c",
    ".cu": "c",
    ".cuh": "c",
    ".h": "c",
    ".hpp": "c",
    ".toml": "toml",
    ".cfg": "toml",
    ".sh": "shell",
}
_STRING = (
    r"[rbfuRBFU]{0,2}(?:'''.*?(?:'''|$)|\"\"\".*?(?:\"\"\"|$)"
    r"|'(?:\\.|[^'\\])*'?|\"(?:\\.|[^\"\\])*\"?)"
)
_NUMBER = r"\b(?:0[xX][0-9a-fA-F_]+|\d[\d_]*(?:\.\d*)?(?:[eE][+-]?\d+)?)[uUlLfF]*\b"
_TOKENIZERS: dict[str, re.Pattern[str]] = {}


def language_of(path: str) -> str | None:
    """The highlighting language for a file path, or None for plain text."""
    dot = path.rfind(".")
    return _EXTENSIONS.get(path[dot:].lower()) if dot >= 0 else None


def _tokenizer(language: str) -> re.Pattern[str]:
    pattern = _TOKENIZERS.get(language)
    if pattern is None:
        comment, keywords, preprocessor = _LANGUAGES[language]
        words = "|".join(sorted(keywords.split(), key=len, reverse=True))
        parts = [
            f"(?P<com>{comment})",
            f"(?P<str>{_STRING})",
            f"(?P<num>{_NUMBER})",
            rf"(?P<kw>\b(?:{words})\b)",
        ]
        if preprocessor:
            parts.insert(0, r"(?P<pre>^\s*#\s*\w+)")
        if language == "python":
            parts.insert(0, r"(?P<dec>^\s*@[\w.]+)")
            parts.append(r"(?P<fn>(?<=\bdef )\w+|(?<=\bclass )\w+)")
        pattern = re.compile("|".join(parts))
        _TOKENIZERS[language] = pattern
    return pattern


def highlight(code: str, language: str | None) -> str:
    """`code` (one line, without its diff marker) as escaped HTML with token spans."""
    if language is None:
        return escape(code)
    out: list[str] = []
    pos = 0
    for match in _tokenizer(language).finditer(code):
        if match.start() == match.end():
            continue
        out.append(escape(code[pos : match.start()]))
        out.append(f'<span class="tok-{match.lastgroup}">{escape(match.group())}</span>')
        pos = match.end()
    out.append(escape(code[pos:]))
    return "".join(out)
