"""The patch series: the `series` order file and the mbox patch files with DEP-3 trailers."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from patchkit.archives import special_file_problem
from patchkit.errors import ConfigError, PatchFormatError
from patchkit.files import within

TRAILER_RE = re.compile(r"^([A-Za-z][A-Za-z0-9-]*): ?(.*)$")
PLAIN_DIFF_HINT = "turn it into a series with `patchkit import {file} --target T`"
# In a series the file must leave it first: import reads the series it adds to.
LISTED_DIFF_HINT = (
    "take it out of {series}, then turn it into a series with "
    "`patchkit import {file} --target {target} --into-series`"
)
PATCH_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.patch\Z")
PATCH_FILE_TRAILER = "Patchkit-Patch"


@dataclass(frozen=True)
class FileChange:
    """One file a patch touches, with its added / removed line counts."""

    path: str
    source: str | None
    added: int
    removed: int
    hunks: tuple[tuple[int, int, int, int], ...]  # (src_start, src_len, tgt_start, tgt_len)
    binary: bool = False


@dataclass(frozen=True)
class Patch:
    """One `git format-patch` file of the series."""

    name: str
    raw: bytes
    author: str
    date: str
    subject: str
    body: str
    trailers: tuple[tuple[str, str], ...]
    diff: str
    files: tuple[FileChange, ...]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()

    def trailer(self, key: str) -> str | None:
        for k, v in self.trailers:
            if k.lower() == key.lower():
                return v
        return None

    @property
    def tests(self) -> list[str]:
        return (self.trailer("Patchkit-Tests") or "").split()

    @property
    def message(self) -> str:
        """The commit message this patch becomes (subject, body with its trailers)."""
        return f"{self.subject}\n\n{self.body}".rstrip() + "\n"

    @property
    def added(self) -> int:
        return sum(f.added for f in self.files)

    @property
    def removed(self) -> int:
        return sum(f.removed for f in self.files)


@dataclass(frozen=True)
class SeriesEntry:
    name: str
    line: int


@dataclass
class Series:
    """The ordered patches of one target."""

    target: str
    directory: Path
    entries: list[SeriesEntry] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def hash(self) -> str:
        """Content hash over the order and every patch's bytes (stable across machines)."""
        h = hashlib.sha256()
        h.update(f"target={self.target}\n".encode())
        for patch in self.patches:
            h.update(f"{patch.name}\0{patch.sha256}\n".encode())
        return h.hexdigest()

    def by_name(self, name: str) -> Patch | None:
        for patch in self.patches:
            if patch.name == name:
                return patch
        return None


def read_series_file(path: Path) -> list[SeriesEntry]:
    """Parse a `series` file: one patch name per line, `#` comments and blank lines ignored."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return []
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8") from None
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        if not PATCH_NAME_RE.match(name) or "/" in name:
            raise ConfigError(f"{path}:{number}: '{name}' is not a patch file name (NAME.patch)")
        entries.append(SeriesEntry(name, number))
    return entries


def load_series(directory: Path, target: str) -> Series:
    """Load and validate the series of one target; every error names the file."""
    refuse_special_files(directory)
    entries = read_series_file(directory / "series")
    seen: dict[str, int] = {}
    for entry in entries:
        if entry.name in seen:
            raise ConfigError(
                f"{directory / 'series'}:{entry.line}: '{entry.name}' is listed twice "
                f"(first on line {seen[entry.name]})"
            )
        seen[entry.name] = entry.line
    patches = []
    for entry in entries:
        path = directory / entry.name
        if path.is_symlink() or not path.is_file():
            raise ConfigError(
                f"{directory / 'series'}:{entry.line}: names {entry.name}, which is not a file "
                f"in {directory}"
            )
        try:
            patches.append(parse_patch(entry.name, path.read_bytes()))
        except PatchFormatError as exc:
            if exc.hint == PLAIN_DIFF_HINT.format(file=entry.name):
                exc.hint = LISTED_DIFF_HINT.format(
                    series=directory / "series", file=path, target=target
                )
            raise
    return Series(target=target, directory=directory, entries=entries, patches=patches)


def parse_patch(name: str, raw: bytes) -> Patch:
    """Parse one format-patch mbox file and check it is a safe, well-formed patch."""
    if not raw.strip():
        raise PatchFormatError(f"{name}: empty patch")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchFormatError(f"{name}: not UTF-8 (byte {exc.start})") from None
    if "\r\n" in text:
        raise PatchFormatError(f"{name}: has CRLF line endings (damaged in transit?)")
    header, message, diff = _split_mbox(name, text)
    author = decode_header(name, "From", header.get("from", ""))
    date = header.get("date", "")
    subject = decode_header(name, "Subject", header.get("subject", "")).strip()
    if not subject:
        raise PatchFormatError(f"{name}: no Subject header")
    if not author or parse_author(author)[1] == "":
        raise PatchFormatError(f"{name}: no valid From: header")
    if date and parse_date(date) is None:
        raise PatchFormatError(f"{name}: Date header '{date}' is not a date")
    files = _diff_files(name, diff)
    trailers = parse_trailers(message)
    return Patch(
        name=name,
        raw=raw,
        author=author,
        date=date,
        subject=subject,
        body=message.strip("\n") + "\n" if message.strip() else "",
        trailers=tuple(trailers),
        diff=diff,
        files=tuple(files),
    )


# What `git format-patch` writes: "A U Thor <a@example.org>" and "Tue, 1 Dec 2026 10:00:00
# +0100". Headers of that form are read here; any other goes to the email package (whose
# import, about 10 ms, a run of ordinary patches then does not pay), and both readings agree
# on every header the fast one takes (tests/test_series_headers.py compares them).
_PLAIN_AUTHOR_RE = re.compile(r"^(\w[\w'-]*(?: [\w'-]+)*) <([\w.+-]+@[\w.-]+)>$")
_MONTHS = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()
_PLAIN_DATE_RE = re.compile(
    r"^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), ([0-9]{1,2}) (" + "|".join(_MONTHS) + r") ([1-9][0-9]{3}) "
    r"([0-9]{2}):([0-9]{2}):([0-9]{2}) ([+-])([0-9]{2})([0-9]{2})$"
)


def parse_author(value: str) -> tuple[str, str]:
    """(name, address) of a From: header, as `email.utils.parseaddr` reads it."""
    match = _PLAIN_AUTHOR_RE.match(value)
    if match:
        return match.group(1), match.group(2)
    import email.utils

    return email.utils.parseaddr(value)


def parse_date(value: str) -> dt.datetime | None:
    """A Date: header as `email.utils.parsedate_to_datetime` reads it; None if not a date."""
    match = _PLAIN_DATE_RE.match(value)
    if match and value[-5:] != "-0000":  # -0000: "zone unknown", a naive time to the email package
        day, month, year, hour, minute, second, sign, zh, zm = match.groups()
        offset = dt.timedelta(hours=int(zh), minutes=int(zm))
        try:
            return dt.datetime(
                int(year),
                _MONTHS.index(month) + 1,
                int(day),
                int(hour),
                int(minute),
                int(second),
                tzinfo=dt.timezone(-offset if sign == "-" else offset),
            )
        except ValueError:
            return None
    import email.utils

    try:
        return email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def decode_header(name: str, key: str, value: str) -> str:
    """A header as text: folded lines joined and RFC 2047 words (what `git format-patch
    --encode-email-headers` writes for non-ASCII names and subjects) decoded by the email
    package, so the commit `apply` makes carries the real name and subject again."""
    unfolded = _unfold(value)
    if "=?" not in unfolded:
        return unfolded
    import email.errors
    import email.header

    try:
        return str(email.header.make_header(email.header.decode_header(unfolded)))
    except (email.errors.HeaderParseError, LookupError, UnicodeDecodeError, ValueError):
        raise PatchFormatError(f"{name}: {key} header has undecodable encoded words") from None


def _unfold(value: str) -> str:
    return re.sub(r"\n[ \t]+", " ", value)


def _split_mbox(name: str, text: str) -> tuple[dict[str, str], str, str]:
    lines = text.split("\n")
    if not lines[0].startswith("From "):
        # a plain diff has no message to keep: `patchkit import` writes one per concern
        plain = re.search(r"^(diff --git |--- \S.*\n\+\+\+ )", text, re.M)
        raise PatchFormatError(
            f"{name}: not a git format-patch file (no 'From <sha>' line)",
            hint=PLAIN_DIFF_HINT.format(file=name) if plain else None,
        )
    header: dict[str, str] = {}
    i = 1
    last = None
    while i < len(lines) and lines[i] != "":
        line = lines[i]
        if line[:1] in (" ", "\t") and last:
            header[last] += "\n" + line
        else:
            key, sep, value = line.partition(":")
            if not sep:
                raise PatchFormatError(f"{name}:{i + 1}: malformed header line")
            last = key.strip().lower()
            header[last] = value.strip()
        i += 1
    rest = "\n".join(lines[i + 1 :])
    match = re.search(r"^diff --git ", rest, re.M)
    if match is None:
        raise PatchFormatError(f"{name}: contains no diff")
    message = rest[: match.start()]
    message = re.sub(r"\n?---\n*\Z", "\n", message)
    diff = rest[match.start() :]
    return header, message, diff


def parse_trailers(message: str) -> list[tuple[str, str]]:
    """Trailers = `Key: value` lines of the message's last paragraph."""
    paragraphs = [p for p in re.split(r"\n\s*\n", message.strip()) if p.strip()]
    if not paragraphs:
        return []
    out = []
    for line in paragraphs[-1].splitlines():
        m = TRAILER_RE.match(line.strip())
        if m is None:
            return []
        out.append((m.group(1), m.group(2).strip()))
    return out


def safe_repo_path(name: str, path: str) -> str:
    """Refuse a diff path that could escape the target tree."""
    if not path or "\0" in path or "\\" in path:
        raise PatchFormatError(f"{name}: bad path {path!r}")
    if path.startswith("/"):
        raise PatchFormatError(f"{name}: absolute path {path} (patches must stay inside the tree)")
    parts = PurePosixPath(path).parts
    if ".." in parts:
        raise PatchFormatError(f"{name}: path {path} climbs out of the tree ('..')")
    if any(part.lower() == ".git" for part in parts):
        raise PatchFormatError(f"{name}: path {path} writes into a .git directory")
    if len(path.encode()) > MAX_PATH_BYTES or any(
        len(part.encode()) > MAX_NAME_BYTES for part in parts
    ):
        raise PatchFormatError(f"{name}: path {path[:60]}... is longer than a file system allows")
    return path


_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def unquote_path(path: str) -> str:
    """A path as git writes it in a diff, read back: git puts a name holding a byte outside
    printable ASCII, a quote or a backslash (core.quotePath) in double quotes with C escapes
    (`"b/pkg/\\303\\274n.txt"`); any other path is as it is. A quoted name that is not UTF-8
    or has a bad escape is returned unchanged (then refused as a bad path)."""
    if len(path) < 2 or path[0] != '"' or path[-1] != '"':
        return path
    out = bytearray()
    body, i = path[1:-1], 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out += char.encode("utf-8")
            i += 1
            continue
        octal = body[i + 1 : i + 4]
        if len(octal) == 3 and all(c in "01234567" for c in octal):
            out.append(int(octal, 8) & 0xFF)
            i += 4
        elif body[i + 1 : i + 2] in _C_ESCAPES:
            out.append(_C_ESCAPES[body[i + 1]])
            i += 2
        else:
            return path
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        return path


def git_header_paths(header: str) -> list[str]:
    """The two paths of a `diff --git` line's rest (`a/x b/x`, either quoted), unquoted."""
    quoted = re.findall(r'"(?:[^"\\]|\\.)*"|\S+', header)
    if any(p.startswith('"') for p in quoted):
        return [unquote_path(p) for p in quoted]
    half = len(header) // 2  # unquoted names may hold spaces: `a/<n> b/<n>`, the same name
    if header[half : half + 1] == " " and header[:half][2:] == header[half + 1 :][2:]:
        return [header[:half], header[half + 1 :]]
    return header.split(" ")


def diff_line_paths(line: str) -> list[str]:
    """The paths one line of a diff names (`diff --git`, `---`/`+++`, rename and copy lines),
    unquoted and without their `a/`/`b/`; [] for any other line and for /dev/null."""
    if line.startswith("diff --git "):
        parts = git_header_paths(line[len("diff --git ") :])
        return [p[2:] for p in parts if p.startswith(("a/", "b/"))]
    if line.startswith(("--- ", "+++ ")):
        value = unquote_path(line[4:].split("\t")[0])
        if value == "/dev/null":
            return []
        return [value[2:] if value.startswith(("a/", "b/")) else value]
    if line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
        return [unquote_path(line.split(" ", 2)[2])]
    return []


def _strip_prefix(path: str | None) -> str | None:
    if path is None or path == "/dev/null":
        return None
    path = unquote_path(path)
    for prefix in ("a/", "b/"):
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path


HUNK_RE = re.compile(r"^@@ -(\d{1,9})(?:,(\d{1,9}))? \+(\d{1,9})(?:,(\d{1,9}))? @@")
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255


def _check_hunks(name: str, diff: str) -> None:
    """Every hunk has a well-formed header, follows its file's ---/+++ lines and holds exactly
    the number of old and new lines its header promises (truncation, miscounts, stray lines)."""
    lines = diff.split("\n")
    i, headers_seen = 0, False
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            headers_seen = False
        elif line.startswith("+++ ") and i > 0 and lines[i - 1].startswith("--- "):
            headers_seen = True
        elif line == "-- ":
            return  # format-patch's signature: the diff ended
        elif line.startswith("@@"):
            match = HUNK_RE.match(line)
            if match is None:
                raise PatchFormatError(f"{name}: malformed diff: bad hunk header {line[:40]!r}")
            if not headers_seen:
                raise _bad_hunk(name, line, "comes before its ---/+++ lines")
            old = int(match.group(2)) if match.group(2) is not None else 1
            new = int(match.group(4)) if match.group(4) is not None else 1
            i = _consume_hunk(name, lines, i + 1, old, new, line)
            continue
        i += 1


def _consume_hunk(name: str, lines: list[str], i: int, old: int, new: int, header: str) -> int:
    while old > 0 or new > 0:
        if i >= len(lines):
            raise _bad_hunk(name, header, "is truncated")
        line = lines[i]
        if line.startswith("\\"):
            i += 1
            continue
        tag = line[:1]
        if tag in (" ", ""):
            old, new = old - 1, new - 1
        elif tag == "-":
            old -= 1
        elif tag == "+":
            new -= 1
        else:
            raise _bad_hunk(name, header, "has fewer lines than its header says")
        if old < 0 or new < 0:
            raise _bad_hunk(name, header, "does not match its line counts")
        i += 1
    while i < len(lines) and lines[i].startswith("\\"):
        i += 1
    following = lines[i] if i < len(lines) else ""
    if following and not following.startswith(("@@", "diff --git ", "-- ")):
        raise _bad_hunk(name, header, "has more lines than its header says")
    return i


def _bad_hunk(name: str, header: str, why: str) -> PatchFormatError:
    return PatchFormatError(f"{name}: malformed diff: hunk {header[:40]!r} {why}")


EXTENDED_PATH_RE = re.compile(r"^(?:rename|copy) (?:from|to) (.+)$", re.M)


def _diff_files(name: str, diff: str) -> list[FileChange]:
    for header in re.findall(r"^diff --git (.+)$", diff, re.M):
        for part in git_header_paths(header):
            if part.startswith(("a/", "b/")):
                safe_repo_path(name, part[2:])
    for path in EXTENDED_PATH_RE.findall(diff):
        safe_repo_path(name, unquote_path(path))
    if re.search(r"^(GIT binary patch|Binary files .* differ)$", diff, re.M):
        raise PatchFormatError(f"{name}: binary patches are not allowed")
    for mode in re.findall(r"^new (?:file )?mode (\d+)$", diff, re.M):
        if mode == "120000":
            raise PatchFormatError(f"{name}: creates a symlink; patches may not create symlinks")
    _check_hunks(name, diff)
    try:
        patchset = PatchSet(diff)
    except UnidiffParseError as exc:
        raise PatchFormatError(f"{name}: malformed diff: {exc}") from None
    if not len(patchset) and "diff --git" in diff:
        # Pure renames / mode changes carry no hunks; unidiff keeps none of them.
        return []
    files = []
    for pf in patchset:
        path = _strip_prefix(pf.target_file) or _strip_prefix(pf.source_file)
        if path is None:
            raise PatchFormatError(f"{name}: a diff has neither source nor target path")
        safe_repo_path(name, path)
        source = _strip_prefix(pf.source_file)
        if source:
            safe_repo_path(name, source)
        hunks = tuple(
            (h.source_start, h.source_length, h.target_start, h.target_length) for h in pf
        )
        files.append(
            FileChange(
                path=path,
                source=source,
                added=pf.added,
                removed=pf.removed,
                hunks=hunks,
                binary=pf.is_binary_file,
            )
        )
    return files


def hunk_header_at(patch: Patch, path: str, line: int) -> str | None:
    """The `@@` header of the hunk of `path` whose old range starts at or covers `line`."""
    for change in patch.files:
        if change.path != path and change.source != path:
            continue
        best = None
        for src_start, src_len, tgt_start, tgt_len in change.hunks:
            if src_start <= line <= src_start + max(src_len, 1):
                best = (src_start, src_len, tgt_start, tgt_len)
                break
        if best is None and change.hunks:
            best = change.hunks[0]
        if best:
            return f"@@ -{best[0]},{best[1]} +{best[2]},{best[3]} @@"
    return None


def touched_paths(patch: Patch) -> list[str]:
    """Every path the patch reads or writes, renames and copies included (sorted, unique)."""
    paths = {unquote_path(p) for p in EXTENDED_PATH_RE.findall(patch.diff)}
    for header in re.findall(r"^diff --git (.+)$", patch.diff, re.M):
        paths.update(_strip_prefix(p) or p for p in git_header_paths(header))
    for change in patch.files:
        paths.add(change.path)
        if change.source:
            paths.add(change.source)
    return sorted(paths)


def refuse_special_files(directory: Path) -> None:
    """A FIFO or device in a series directory would block (or feed) the reader, a symbolic
    link leading out of the project would read (and name in errors) a file that is not the
    project's: refuse either before anything is read."""
    if not directory.is_dir():
        return
    project = _project_of(directory)
    for entry in sorted(directory.iterdir()):
        problem = _link_problem(entry, project)
        if problem is None and not entry.is_dir():
            problem = special_file_problem(entry)
        if problem:
            raise ConfigError(
                f"{problem}; a series directory holds regular files only; nothing was read",
                hint=f"replace {entry.name} with the file it stands for",
            )


def _project_of(directory: Path) -> Path:
    """The project a series folder belongs to: the folder holding the `patches/` folder
    whose targets.toml is at or above `directory`."""
    for folder in (directory, *directory.parents):
        if (folder / "targets.toml").is_file():
            return folder.parent
    return directory


def _link_problem(entry: Path, project: Path) -> str | None:
    """Why a symbolic link in a series folder may not be read: it leads out of the project
    (never followed there: its target is named, not its bytes)."""
    if not entry.is_symlink() or within(entry, project):
        return None
    return f"{entry} is a symbolic link to {os.path.realpath(entry)}, outside the project {project}"
