"""Reading a diff a team already carries: plain `diff -u`, `git diff`, format-patch, an mbox.

The parser keeps what the import needs (messages, files, hunks, input line numbers) and notes
every defect it meets as a `Problem` naming the input line, the file and the hunk, instead of
stopping at the first one; `render_file` writes one file's diff back in git's form.
"""

from __future__ import annotations

import email.parser
import email.policy
import re
from collections.abc import Callable
from dataclasses import dataclass, field

HUNK_RE = re.compile(r"^@@ -(\d{1,9})(?:,(\d{1,9}))? \+(\d{1,9})(?:,(\d{1,9}))? @@(.*)$")
MBOX_FROM_RE = re.compile(r"^From (?:[0-9a-f]{40} |\S+@\S+ |\S+ +[A-Z][a-z]{2} [A-Z][a-z]{2} )")
GIT_HEADER_RE = re.compile(r"^diff --git (?:a/)?(.+?) (?:b/)?(\S+)$")
PATCH_PREFIX_RE = re.compile(r"^(?:\[[^\]]*PATCH[^\]]*\]\s*)+", re.I)
MARKER_RE = re.compile(r"^(<{7}|>{7})(?: |$)|^={7}$")
EXTENDED = (
    "old mode ",
    "new mode ",
    "deleted file mode ",
    "new file mode ",
    "similarity index ",
    "dissimilarity index ",
    "rename from ",
    "rename to ",
    "copy from ",
    "copy to ",
    "index ",
)


@dataclass
class Problem:
    """One defect of the input, located: line of the input, file and hunk where known."""

    line: int
    path: str | None
    hunk: str | None
    what: str

    def text(self, source: str) -> str:
        where = f"{source}:{self.line}"
        if self.path:
            where += f": {self.path}"
        if self.hunk:
            where += f" {self.hunk}"
        return f"{where}: {self.what}"


@dataclass
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    section: str  # the text after the closing @@ (git's function context)
    lines: list[str]
    line: int  # where the @@ line is in the input

    @property
    def at(self) -> str:
        return f"@@ -{self.old_start},{self.old_len} +{self.new_start},{self.new_len} @@"

    @property
    def added(self) -> int:
        return sum(1 for ln in self.lines if ln.startswith("+"))

    @property
    def removed(self) -> int:
        return sum(1 for ln in self.lines if ln.startswith("-"))


@dataclass
class FileDiff:
    old: str | None  # None: /dev/null (a new file)
    new: str | None  # None: /dev/null (a deleted file)
    line: int
    git: bool = False
    extended: list[str] = field(default_factory=list)
    hunks: list[Hunk] = field(default_factory=list)
    binary: bool = False
    crlf: bool = False

    @property
    def path(self) -> str:
        return self.new or self.old or "?"

    @property
    def whole(self) -> bool:
        """Created, deleted, renamed, copied or mode-changed: the file cannot be split by hunk."""
        return (
            self.old is None
            or self.new is None
            or self.old != self.new
            or any(e.startswith(EXTENDED[:-1]) for e in self.extended)
        )

    @property
    def added(self) -> int:
        return sum(h.added for h in self.hunks)

    @property
    def removed(self) -> int:
        return sum(h.removed for h in self.hunks)


@dataclass
class Message:
    """One mail of an mbox (or the whole input when it is a bare diff)."""

    line: int
    author: str = ""
    date: str = ""
    subject: str = ""
    text: str = ""  # the message body before the diff (trailers included)
    files: list[FileDiff] = field(default_factory=list)


@dataclass
class ParsedInput:
    messages: list[Message]
    problems: list[Problem]
    mbox: bool


def parse_input(text: str) -> ParsedInput:
    """Split `text` into messages and file diffs, collecting every defect met."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    problems: list[Problem] = []
    first = next((ln for ln in lines if ln.strip()), "")
    mbox = bool(MBOX_FROM_RE.match(first))
    starts = [i for i, ln in enumerate(lines) if MBOX_FROM_RE.match(ln)] if mbox else [0]
    messages = []
    for a, b in zip(starts, [*starts[1:], len(lines)], strict=True):
        messages.append(_parse_message(lines, a, b, mbox, problems))
    if text and not text.endswith("\n"):
        _cut_last_line(lines, messages, problems)
    return ParsedInput(messages, problems, mbox)


def _cut_last_line(lines: list[str], messages: list[Message], problems: list[Problem]) -> None:
    """A diff whose last hunk line has no newline and no `\\ No newline at end of file` note
    after it was cut: diff and git end every line, and mark a file's missing last newline
    (git apply calls it a corrupt patch). Refused as truncated input, not guessed at."""
    files = [f for m in messages for f in m.files]
    hunk = files[-1].hunks[-1] if files and files[-1].hunks else None
    if hunk is None or not lines or lines[-1][:1] not in ("+", "-", " "):
        return
    problems.append(
        Problem(
            len(lines),
            files[-1].path,
            hunk.at,
            "the input ends inside this hunk's last line (no newline, no `\\ No newline at "
            "end of file` note): the diff was cut; make it again or complete it",
        )
    )


def _parse_message(lines: list[str], a: int, b: int, mbox: bool, problems: list[Problem]):
    message = Message(line=a + 1)
    i = a
    if mbox:
        i = a + 1
        header = []
        while i < b and lines[i].strip("\r") != "":
            header.append(lines[i])
            i += 1
        parsed = email.parser.HeaderParser(policy=email.policy.default).parsestr(
            "\n".join(header) + "\n"
        )
        message.author = str(parsed.get("From", "") or "")
        message.date = str(parsed.get("Date", "") or "")
        subject = " ".join(str(parsed.get("Subject", "") or "").split())
        message.subject = PATCH_PREFIX_RE.sub("", subject)  # as `git am` strips it
        i += 1
    body_start = i
    start = _first_diff_line(lines, i, b)
    body = lines[body_start:start]
    if "---" in body:
        body = body[: body.index("---")]
    message.text = "\n".join(body).strip("\n")
    _parse_files(lines, start, b, message, problems)
    return message


def _first_diff_line(lines: list[str], i: int, b: int) -> int:
    for j in range(i, b):
        line = lines[j]
        if line.startswith("diff --git "):
            return j
        if line.startswith("--- ") and j + 1 < b and lines[j + 1].startswith("+++ "):
            return j
    return b


def _diff_path(value: str) -> str | None:
    value = value.rstrip("\r").split("\t", 1)[0]
    if value.startswith('"') and value.endswith('"'):
        value = value[1:-1]
    return None if value == "/dev/null" else value


def _parse_files(lines: list[str], i: int, b: int, message: Message, problems: list[Problem]):
    reader = _FilesReader(lines, b, message, problems)
    while i < b:
        line = lines[i].rstrip("\r")
        if line == "-- " and (reader.current is None or reader.current.hunks):
            return  # format-patch's signature ends the diff
        read = next((read for starts, read in _LINE_RULES if starts(reader, i, line)), None)
        i = read(reader, i, line) if read else i + 1


class _FilesReader:
    """Reads the file diffs of one message (lines up to `end`): the file being read, the
    hunk last read, and every defect met. Each reading step takes the line at `i` and returns
    the index of the line after what it read."""

    def __init__(self, lines: list[str], end: int, message: Message, problems: list[Problem]):
        self.lines, self.end, self.message, self.problems = lines, end, message, problems
        self.current: FileDiff | None = None
        self.hunk_at: str | None = None  # the hunk a defect on the following lines is in

    @property
    def path(self) -> str | None:
        return self.current.path if self.current else None

    def in_git_header(self) -> bool:
        """Between a `diff --git` line and the file's first hunk."""
        return self.current is not None and self.current.git and not self.current.hunks

    def before_new_path(self, i: int) -> bool:
        return i + 1 < self.end and self.lines[i + 1].startswith("+++ ")

    def marker(self, i: int, line: str) -> int:
        self.problems.append(_marker(i + 1, self.path, self.hunk_at, line, added=False))
        return i + 1

    def git_header(self, i: int, line: str) -> int:
        match = GIT_HEADER_RE.match(line)
        old, new = (match.group(1), match.group(2)) if match else (None, None)
        self._start_file(FileDiff(old=old, new=new, line=i + 1, git=True))
        return i + 1

    def extended(self, i: int, line: str) -> int:
        assert self.current is not None
        self.current.extended.append(line)
        return i + 1

    def old_and_new_paths(self, i: int, line: str) -> int:
        """A ---/+++ pair: the paths of the file a `diff --git` line began, else a new file."""
        old = _diff_path(line[4:])
        new = _diff_path(self.lines[i + 1][4:])
        current = self.current
        if current is not None and self.in_git_header() and not current.binary:
            current.old = old[2:] if old and old.startswith("a/") else old
            current.new = new[2:] if new and new.startswith("b/") else new
            self.hunk_at = None
        else:
            self._start_file(FileDiff(old=old, new=new, line=i + 1))
        return i + 2

    def binary(self, i: int, line: str) -> int:
        if self.current is not None:
            self.current.binary = True
        self.problems.append(
            Problem(
                i + 1,
                self.path,
                None,
                "binary change: a series carries text patches only; ship the file another "
                "way or leave it out of the diff",
            )
        )
        return i + 1

    def hunk(self, i: int, line: str) -> int:
        """A hunk header and the lines its counts take."""
        match = HUNK_RE.match(line)
        if self.current is None or match is None:
            self.problems.append(
                Problem(i + 1, self.path, None, f"malformed hunk header {line[:40]!r}")
            )
            return i + 1
        hunk = _hunk_of(match, i + 1)
        self.hunk_at = hunk.at
        self.current.hunks.append(hunk)
        if self.lines[i].endswith("\r"):
            _crlf(i + 1, self.current, hunk, self.problems)
        return _consume_hunk(self.lines, i + 1, self.end, self.current, hunk, self.problems)

    def _start_file(self, diff: FileDiff) -> None:
        self.current = diff
        self.message.files.append(diff)
        self.hunk_at = None


# How each line of a message's diff part is read: the first rule whose test takes the line
# reads it; a line no rule takes (text between files, `index` lines of a plain diff) is skipped.
_LINE_RULES: tuple[tuple[Callable[[_FilesReader, int, str], bool], Callable], ...] = (
    (lambda r, i, line: bool(MARKER_RE.match(line)), _FilesReader.marker),
    (lambda r, i, line: line.startswith("diff --git "), _FilesReader.git_header),
    (lambda r, i, line: r.in_git_header() and line.startswith(EXTENDED), _FilesReader.extended),
    (
        lambda r, i, line: line.startswith("--- ") and r.before_new_path(i),
        _FilesReader.old_and_new_paths,
    ),
    (
        lambda r, i, line: line.startswith(("GIT binary patch", "Binary files ")),
        _FilesReader.binary,
    ),
    (lambda r, i, line: line.startswith("@@"), _FilesReader.hunk),
)


def _hunk_of(match: re.Match, number: int) -> Hunk:
    """The hunk a header names (a count left out is 1), its lines still to read."""
    old_len, new_len = match.group(2), match.group(4)
    return Hunk(
        int(match.group(1)),
        int(old_len) if old_len is not None else 1,
        int(match.group(3)),
        int(new_len) if new_len is not None else 1,
        match.group(5),
        [],
        number,
    )


def _crlf(number: int, current: FileDiff, hunk: Hunk, problems: list[Problem]) -> None:
    if current.crlf:
        return
    current.crlf = True
    problems.append(
        Problem(
            number,
            current.path,
            hunk.at,
            "CRLF line ending (the diff was converted to DOS line endings); "
            "convert it back (dos2unix) or make it again",
        )
    )


def _marker(number: int, path: str | None, hunk: str | None, line: str, *, added: bool):
    shown = line[:20]
    if added:
        what = f"adds the conflict marker {shown!r}: a file was committed in mid-merge"
    else:
        what = (
            f"conflict marker {shown!r} inside the diff (the patch file itself was merged "
            "by hand and left unresolved)"
        )
    return Problem(number, path, hunk, what + "; resolve it and make the diff again")


# What each tag of a hunk line takes from the header's (old, new) counts.
_COUNTS = {" ": (1, 1), "": (1, 1), "-": (1, 0), "+": (0, 1)}


def _consume_hunk(
    lines: list[str], i: int, b: int, current: FileDiff, hunk: Hunk, problems: list[Problem]
) -> int:
    """Read the lines the hunk's header counts (and the `\\ No newline` notes after them);
    the index of the line after the hunk."""
    old, new = hunk.old_len, hunk.new_len
    while (old > 0 or new > 0) and i < b:
        line = _hunk_line(lines[i], i + 1, current, hunk, problems)
        tag = line[:1]
        unreadable = _unreadable(line, i + 1, current, hunk)
        if unreadable is not None:
            problems.append(unreadable)
            return i + 1
        if tag == "\\":
            hunk.lines.append(line)
            i += 1
            continue
        if tag not in _COUNTS:
            problems.append(
                Problem(i + 1, current.path, hunk.at, "hunk has fewer lines than its header says")
            )
            return i
        old, new = old - _COUNTS[tag][0], new - _COUNTS[tag][1]
        if tag == "+" and MARKER_RE.match(line[1:].rstrip("\r")):
            problems.append(_marker(i + 1, current.path, hunk.at, line[1:], added=True))
        if old < 0 or new < 0:
            problems.append(
                Problem(i + 1, current.path, hunk.at, "hunk does not match its line counts")
            )
            return i + 1
        hunk.lines.append(line if tag else " ")
        i += 1
    if old > 0 or new > 0:
        problems.append(Problem(i, current.path, hunk.at, "hunk is truncated"))
        return i
    return _after_hunk(lines, i, b, current, hunk, problems)


def _hunk_line(raw: str, number: int, current: FileDiff, hunk: Hunk, problems: list[Problem]):
    """The line without its CR, except a diff line's CR, which is kept and reported (once
    per file)."""
    if raw.endswith("\r") and raw[:1] in " +-":
        _crlf(number, current, hunk, problems)
        return raw
    return raw.rstrip("\r")


def _unreadable(line: str, number: int, current: FileDiff, hunk: Hunk) -> Problem | None:
    """A line that ends the hunk: a conflict marker, or binary content."""
    if MARKER_RE.match(line):
        return _marker(number, current.path, hunk.at, line, added=False)
    if "\0" in line:
        return Problem(
            number,
            current.path,
            hunk.at,
            "NUL byte in a hunk line: binary content; a series carries text patches only",
        )
    return None


def _after_hunk(
    lines: list[str], i: int, b: int, current: FileDiff, hunk: Hunk, problems: list[Problem]
) -> int:
    """Take the `\\ No newline` notes after a complete hunk; a diff line right after it is
    one line more than its header counts."""
    while i < b and lines[i].startswith("\\"):
        hunk.lines.append(lines[i].rstrip("\r"))
        i += 1
    following = lines[i].rstrip("\r") if i < b else ""
    if MARKER_RE.match(following):
        return i  # reported by the caller's loop, naming the marker
    if following[:1] in ("+", "-", " ") and not following.startswith(("--- ", "-- ", "+++ ")):
        problems.append(
            Problem(i + 1, current.path, hunk.at, "hunk has more lines than its header says")
        )
    return i


def render_file(diff: FileDiff, hunks: list[Hunk] | None = None, *, index: bool = True) -> str:
    """One file's diff in git's form (`diff --git`, extended headers, ---/+++ and hunks)."""
    old = diff.old or diff.new
    new = diff.new or diff.old
    out = [f"diff --git a/{old} b/{new}"]
    extended = [e for e in diff.extended if index or not e.startswith("index ")]
    if not diff.git:
        if diff.old is None:
            extended.append("new file mode 100644")
        elif diff.new is None:
            extended.append("deleted file mode 100644")
    out += extended
    chosen = diff.hunks if hunks is None else hunks
    if chosen or diff.old != diff.new or not diff.git:
        if chosen:
            out.append(f"--- {'a/' + diff.old if diff.old else '/dev/null'}")
            out.append(f"+++ {'b/' + diff.new if diff.new else '/dev/null'}")
    for hunk in chosen:
        section = hunk.section
        out.append(hunk.at + section)
        out += hunk.lines
    return "\n".join(out) + "\n"
