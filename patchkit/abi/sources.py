"""What is verified: an installed site-packages folder, or a folder of wheels read via zipfile.

Both become a ``Tree``: the shared objects (by path relative to site-packages, as they are or
would be installed), a few text files the checks read (``torch/version.py``,
``sgl_kernel/load_utils.py``), and the distributions with their metadata. Wheels are never
installed: members are checked (no absolute paths, no ``..``, no symlinks, no duplicates, no
decompression bombs) and only shared objects are extracted, into a scratch folder the caller owns.
"""

from __future__ import annotations

import glob
import os
import re
import stat
import struct
import sysconfig
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from patchkit.abi.cache import changed
from patchkit.abi.kinds import classify
from patchkit.abi.members import (
    HEAD_BYTES,
    Entry,
    Member,
    central_directory,
    member_head,
    read_member,
)
from patchkit.archives import (
    MAX_METADATA_BYTES,
    MAX_RECORD_BYTES,
    SpecialFileError,
    archive_problem,
    claim_problem,
    file_kind,
    open_regular,
    read_regular,
)

# Text files the checks read, relative to site-packages.
TEXT_FILES = ("torch/version.py", "sgl_kernel/load_utils.py", "sgl_kernel/__init__.py")


SKIP_DIRS = {"__pycache__", "include", "share", "tests", "test"}


# Files that are source or data by their name are not opened; every other file's first bytes
# decide whether it is an ELF object or device code (kinds.classify).
TEXT_SUFFIXES = frozenset(
    (
        ".py .pyc .pyi .pyx .pxd .pxi .h .hpp .hh .cuh .cu .c .cc .cpp .cxx .inl .inc .txt .md "
        ".rst .json .yaml .yml .toml .cfg .ini .typed .html .css .js .csv .cmake .f90 .f .png "
        ".jpg .svg .lock .pem .proto .jinja .j2 .mat .wav .npz .npy .sav .arff .xsd .pth"
    ).split()
)


# METADATA and the checks' text files are read whole from a wheel, so no bigger than this
# (a crafted one claiming GiBs is refused before it is inflated); an installed METADATA is
# read up to its first blank line, and never past this many bytes.
MAX_TEXT_BYTES = MAX_METADATA_BYTES


# Shorter files carry no magic that kinds.classify knows; a truncated ELF from 4 bytes on is
# read, and named as malformed.
MIN_CODE_BYTES = 4


@dataclass
class Dist:
    """An installed (or wheel-borne) distribution: name, version and the bits of metadata used."""

    name: str  # canonical (sgl-kernel)
    version: str
    requires: list[str] = field(default_factory=list)
    owns: Callable[[str], bool] = lambda prefix: False
    wheel: str | None = None
    filename_version: str | None = None
    filename_name: str | None = None  # the project its file name says (canonical)
    files: Callable[[], list[str]] = lambda: []  # the paths it installs (RECORD / members)


@dataclass
class Tree:
    """Everything the checks look at, however it was obtained."""

    kind: str  # "env" | "wheelhouse"
    root: str
    members: dict[str, Member] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    dists: dict[str, Dist] = field(default_factory=dict)
    invalid: list[tuple[str, str]] = field(default_factory=list)
    dirs: set[str] = field(default_factory=set)  # relative dirs holding shared objects
    # every file whose bytes were (or would be) looked at: (relpath, size, mtime)
    candidates: list[tuple[str, int, int]] = field(default_factory=list)
    has_env: bool = False  # a wheelhouse laid over an installed environment
    wheels: dict[str, Wheel] = field(default_factory=dict)  # by path
    # installed files the checks would read but could not: (path, why)
    unread: list[tuple[str, str]] = field(default_factory=list)

    def has(self, relpath: str) -> bool:
        return relpath in self.members

    def owner(self, relpath: str) -> Dist | None:
        """The distribution that installs ``relpath`` (RECORD, or the wheel it came from)."""
        index = self.__dict__.get("_owners")
        if index is None:
            index = {}
            for dist in self.dists.values():
                for name in dist.files():
                    if name in self.members:
                        index.setdefault(name, dist)
            self.__dict__["_owners"] = index
        return index.get(relpath)

    def overlay(self, other: Tree) -> Tree:
        """``other``'s files and dists on top of this tree's (a wheelhouse over an environment)."""
        merged = Tree(kind=other.kind, root=other.root)
        merged.members = {**self.members, **other.members}
        merged.texts = {**self.texts, **other.texts}
        merged.dists = {**self.dists, **other.dists}
        merged.invalid = self.invalid + other.invalid
        merged.dirs = self.dirs | other.dirs
        merged.candidates = self.candidates + other.candidates
        merged.has_env = self.kind == "env" or self.has_env or other.has_env
        merged.wheels = {**self.wheels, **other.wheels}
        merged.unread = self.unread + other.unread
        return merged


def default_site_packages() -> str:
    """The running interpreter's purelib folder."""
    return sysconfig.get_paths()["purelib"]


def resolve_env(path: str) -> str:
    """A site-packages folder from what a user names: the folder itself, a virtual environment
    (``.venv``, which has ``pyvenv.cfg``), or its interpreter (``.venv/bin/python``)."""
    path = os.path.abspath(path)
    if os.path.isfile(path) and os.path.basename(os.path.dirname(path)) == "bin":
        path = os.path.dirname(os.path.dirname(path))
    if os.path.isfile(os.path.join(path, "pyvenv.cfg")):
        found = sorted(glob.glob(os.path.join(path, "lib", "python3*", "site-packages")))
        if len(found) == 1:
            return found[0]
        if not found:
            raise FileNotFoundError(os.path.join(path, "lib", "python3*", "site-packages"))
        from patchkit.errors import VerifyInputError

        raise VerifyInputError(
            f"{path} holds several site-packages ({', '.join(found)})",
            "pass the site-packages folder to check",
        )
    return path


_HEADER = re.compile(r"^(Name|Version|Requires-Dist):[ \t]*(.*?)\s*$", re.M)


def _parse_metadata(text: str) -> tuple[str, str, list[str]]:
    """Name, Version and Requires-Dist from a METADATA file's header block (no email parser)."""
    head = text.split("\n\n", 1)[0]
    name = version = ""
    requires: list[str] = []
    for key, value in _HEADER.findall(head):
        if key == "Name" and not name:
            name = value
        elif key == "Version" and not version:
            version = value
        elif key == "Requires-Dist":
            requires.append(value)
    return name, version, requires


def read_env(site: str) -> Tree:
    """Walk a site-packages folder: shared objects, dist-info metadata, the checks' text files."""
    site = os.path.abspath(site)
    if not os.path.isdir(site):
        raise FileNotFoundError(site)
    tree = Tree(kind="env", root=site)
    stack = [("", site)]
    found: list[tuple[str, str, str, os.stat_result, str]] = []  # classified after the walk
    while stack:
        rel, folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            relpath = f"{rel}{name}"
            if entry.is_dir(follow_symlinks=False):
                if name.endswith(".dist-info"):
                    _read_dist_info(tree, entry.path)
                elif name not in SKIP_DIRS and not name.startswith("."):
                    stack.append((relpath + "/", entry.path))
            elif _maybe_code(name):
                try:  # a link loop or an unreadable entry is no file to check, as a dangling link
                    if not entry.is_file():
                        continue
                    st = entry.stat()
                except OSError:
                    continue
                if st.st_size < MIN_CODE_BYTES:
                    continue
                tree.candidates.append((relpath, st.st_size, changed(st)))
                key = os.path.realpath(entry.path) if entry.is_symlink() else entry.path
                found.append((relpath, entry.path, key, st, rel))
    kinds = _kinds_of_files([(path, relpath) for relpath, path, _, _, _ in found])
    for (relpath, path, key, st, rel), kind in zip(found, kinds, strict=True):
        if kind is None:
            continue
        tree.members[relpath] = Member(
            relpath=relpath,
            path=path,
            size=st.st_size,
            mtime=changed(st),
            origin=path,
            cache_key=key,
            kind=kind,
        )
        tree.dirs.add(rel.rstrip("/"))
    _read_texts(tree, site)
    return tree


def _read_texts(tree: Tree, site: str) -> None:
    """The checks' text files of an installed environment, read as a wheel's are: regular
    files of at most MAX_TEXT_BYTES (a FIFO would block the reader, a link to /dev/zero
    never end); one that cannot be read so is named in ``tree.unread``."""
    for relpath in TEXT_FILES:
        path = os.path.join(site, relpath)
        try:
            tree.texts[relpath] = read_regular(path, MAX_TEXT_BYTES).decode("utf-8", "replace")
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            tree.unread.append((path, _why_unread(exc)))


def _why_unread(exc: Exception) -> str:
    """One line saying why an installed file was not read."""
    if isinstance(exc, ValueError):
        return f"larger than {MAX_TEXT_BYTES} bytes"
    if isinstance(exc, SpecialFileError):  # "PATH is a FIFO, not a regular file"
        return str(exc).rsplit(" is ", 1)[-1]
    return exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)


def metadata_head(path: str, limit: int = MAX_TEXT_BYTES, step: int = 1 << 16) -> str:
    """The header block of an installed METADATA file (up to its first blank line), read in
    ``step``-byte pieces and never more than ``limit`` bytes; a header cut at ``limit`` loses
    its last, partial line (``torch==2.9`` of ``torch==2.9.1`` is no requirement). A FIFO or a
    device is refused (archives.open_regular), not waited on."""
    pieces: list[bytes] = []
    size = 0
    with open_regular(path) as fh:
        while size < limit:
            piece = fh.read(min(step, limit - size))
            if not piece:
                break
            pieces.append(piece)
            size += len(piece)
            if b"\n\n" in b"".join(pieces[-2:]):
                break
    data = b"".join(pieces)
    if size >= limit and b"\n\n" not in data:
        data = data[: data.rfind(b"\n") + 1]
    return data.decode("utf-8", "replace")


class _Record:
    """A dist-info RECORD, read on first use."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._paths: list[str] | None = None

    def files(self) -> list[str]:
        if self._paths is None:
            try:  # a FIFO or device is refused by _read_dist_info before this is asked
                text = read_regular(self.path, MAX_RECORD_BYTES).decode("utf-8", "replace")
                self._paths = [line.split(",", 1)[0] for line in text.splitlines()]
            except (OSError, ValueError):
                self._paths = []
        return self._paths

    def owns(self, prefix: str) -> bool:
        return any(p.startswith(prefix) for p in self.files())


def _maybe_code(name: str) -> bool:
    dot = name.rfind(".")
    if dot <= 0:
        return name not in ("RECORD", "METADATA", "WHEEL", "INSTALLER", "LICENSE", "REQUESTED")
    return name[dot:].lower() not in TEXT_SUFFIXES


def _ask_section_table(fd: int, head: bytes) -> None:
    """Start reading an ELF object's section table (its place is in the header just read):
    the worker that parses the object, moments later, would otherwise wait for it."""
    try:
        (shoff,) = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
        if shnum and shentsize == 64:
            os.posix_fadvise(fd, shoff, shnum * 64, os.POSIX_FADV_WILLNEED)
    except (OSError, struct.error, AttributeError, OverflowError):
        pass


def _kinds_of_files(files: list[tuple[str, str]], group: int = 256) -> list[str | None]:
    """``kinds.classify`` of each (path, relpath)'s first bytes. The heads of a group of files
    are requested together (POSIX_FADV_WILLNEED) before any is read: on a cold disk that is
    one wait for the group, not one per file (1,034 files of an installed torch: 0.13 s to
    classify one by one, 0.05 s warm)."""
    out: list[str | None] = []
    for i in range(0, len(files), group):
        fds: list[int | None] = []
        try:
            for path, _ in files[i : i + group]:
                try:
                    # O_NONBLOCK: a FIFO swapped in since the walk fails its pread, not waits
                    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                except OSError:
                    fds.append(None)
                    continue
                fds.append(fd)
                try:
                    os.posix_fadvise(fd, 0, HEAD_BYTES, os.POSIX_FADV_WILLNEED)
                except (OSError, AttributeError):  # only slower
                    pass
            for fd, (_, relpath) in zip(fds, files[i : i + group], strict=True):
                try:
                    head = os.pread(fd, HEAD_BYTES, 0) if fd is not None else None
                except OSError:
                    head = None
                kind = classify(head, relpath) if head is not None else None
                out.append(kind)
                if kind in ("elf", "cubin"):
                    _ask_section_table(fd, head)
        finally:
            for fd in fds:
                if fd is not None:
                    os.close(fd)
    return out


def _read_dist_info(tree: Tree, folder: str) -> None:
    metadata = os.path.join(folder, "METADATA")
    try:
        name, version, requires = _parse_metadata(metadata_head(metadata))
    except FileNotFoundError:
        return
    except OSError as exc:  # unreadable, or a FIFO or device (never waited on)
        tree.unread.append((metadata, _why_unread(exc)))
        return
    record = _Record(os.path.join(folder, "RECORD"))
    problem = _special(record.path)
    if problem:  # RECORD says which files the dist owns: read lazily, it must not block then
        tree.unread.append((record.path, problem))
        record._paths = []
    dist = Dist(canonicalize_name(name), version, requires, record.owns, files=record.files)
    tree.dists[dist.name] = dist


_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<ver>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


@dataclass
class Wheel:
    """One wheel of a wheelhouse as listed: its identity, metadata and the checks' text files."""

    path: str
    name: str  # file name
    stamp: tuple  # (realpath, size, mtime_ns): the wheel's identity for every cache entry
    invalid: str | None = None
    metadata: tuple[str, str, list[str]] | None = None
    texts: dict[str, str] = field(default_factory=dict)
    names: str = ""  # every member name, "\0"-joined (Dist.files)
    listed: bool = False  # read from the listing cache (members classified already)


def read_wheelhouse(folder: str, scratch: str, cache=None) -> Tree:
    """List every ``.whl`` in ``folder``; no member is extracted.

    A wheel whose (path, size, mtime) has a listing in ``cache`` (a ResultCache) is not
    opened: its members, metadata and text files come from that listing. Otherwise its central
    directory is parsed and its candidate members (files not named as source or data) are left
    unclassified (``kind == ""``): whoever reads a member reads its head first
    (scan.analyze_tree in the workers, or ``classify_pending``)."""
    folder = os.path.abspath(folder)
    if not os.path.isdir(folder):
        raise FileNotFoundError(folder)
    tree = Tree(kind="wheelhouse", root=scratch)
    for wheel in sorted(os.listdir(folder)):
        if wheel.endswith(".whl"):
            _read_wheel(tree, os.path.join(folder, wheel), scratch, cache)
    return tree


def wheel_stamps(folder: str) -> list[tuple[str, tuple | None]]:
    """(file name, (realpath, size, mtime_ns)) of every ``.whl`` in ``folder``, by name."""
    folder = os.path.abspath(folder)
    if not os.path.isdir(folder):
        raise FileNotFoundError(folder)
    out = []
    for wheel in sorted(os.listdir(folder)):
        if wheel.endswith(".whl"):
            try:
                out.append((wheel, _stamp(os.path.join(folder, wheel))))
            except OSError:
                out.append((wheel, None))
    return out


def dist_versions(
    name: str, env: Tree | None, stamps: list[tuple[str, tuple | None]] | None
) -> list[tuple[str, str]]:
    """(version, where) of each version of distribution ``name`` among the checked files, read
    without opening a wheel: the wheels' file names (a wheelhouse lies over the environment),
    else the environment's dist-info."""
    want = canonicalize_name(name)
    found: dict[str, str] = {}
    for wheel, _ in stamps or []:
        m = _WHEEL_NAME.match(wheel)
        if m and canonicalize_name(m.group("name")) == want:
            found.setdefault(m.group("ver"), wheel)
    if found:
        return sorted(found.items())
    dist = env.dists.get(want) if env is not None else None
    return [(dist.version, env.root)] if dist and env else []


def _special(path: str) -> str | None:
    """Why an installed file (followed if a link) is no regular file to read, or None (also
    when it is absent)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else f"{file_kind(mode)}, not a regular file"


def _not_a_file(path: str) -> str | None:
    """Why `path` (followed if a link) is no archive to open, or None for a regular file."""
    mode = os.stat(path).st_mode
    if stat.S_ISREG(mode):
        return None
    kind = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFDIR: "a folder"}
    what = kind.get(stat.S_IFMT(mode), "not a regular file")
    return f"invalid archive: {what}, not a regular file"


def _stamp(path: str) -> tuple:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_size, changed(st))


def _read_wheel(tree: Tree, path: str, scratch: str, cache=None) -> None:
    name = os.path.basename(path)
    try:
        stamp = _stamp(path)
        special = _not_a_file(path)
    except OSError as exc:
        special = f"invalid archive: {exc}"
    if special:  # a FIFO would block the reader, a device never end
        tree.wheels[path] = Wheel(path, name, (path, -1, -1), invalid=special)
        tree.invalid.append((name, special))
        return
    if cache is not None:
        listed = _load_listing(cache, path, name, stamp, scratch)
        if listed is not None:
            wheel, members = listed
            _add_wheel(tree, wheel, members)
            return
    wheel = Wheel(path, name, stamp)
    members = _list_wheel(wheel, scratch)
    _add_wheel(tree, wheel, members)


def _add_wheel(tree: Tree, wheel: Wheel, members: list[Member]) -> None:
    tree.wheels[wheel.path] = wheel
    tree.texts.update(wheel.texts)
    if wheel.invalid and wheel.metadata is None and not members:
        tree.invalid.append((wheel.name, wheel.invalid))
        return
    for m in members:
        tree.members[m.relpath] = m
        if m.kind:
            tree.dirs.add(os.path.dirname(m.relpath))
    if wheel.invalid:  # no METADATA: the members are still read
        tree.invalid.append((wheel.name, wheel.invalid))
        return
    tree.dists[_dist(wheel).name] = _dist(wheel)


def _dist(wheel: Wheel) -> Dist:
    assert wheel.metadata is not None
    dname, version, requires = wheel.metadata
    m = _WHEEL_NAME.match(wheel.name)
    names = wheel.names

    def files(names: str = names) -> list[str]:
        return sorted(names.split("\0")) if names else []

    return Dist(
        canonicalize_name(dname),
        version,
        list(requires),
        owns=lambda prefix, files=files: any(n.startswith(prefix) for n in files()),
        wheel=wheel.name,
        filename_version=m.group("ver") if m else None,
        filename_name=canonicalize_name(m.group("name")) if m else None,
        files=files,
    )


def _list_wheel(wheel: Wheel, scratch: str) -> list[Member]:
    """Parse the central directory; read METADATA and the checks' text files; return the
    candidate members, unclassified. A problem with the archive sets ``wheel.invalid``."""
    path = wheel.path
    try:
        entries = central_directory(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
        wheel.invalid = f"invalid archive: {exc}"
        return []
    problem = _archive_problem(entries)
    if problem:
        wheel.invalid = f"invalid archive: {problem}"
        return []
    wheel.names = "\0".join(e.filename for e in entries)
    if not any(e.filename.endswith(".dist-info/RECORD") for e in entries):
        wheel.invalid = "invalid archive: no *.dist-info/RECORD (not a wheel pip would install)"
        return []
    real = wheel.stamp[0]
    mtime = wheel.stamp[2]
    members: list[Member] = []
    metadata = None
    for e in entries:
        name = e.filename
        if name.endswith(".dist-info/METADATA") and name.count("/") == 1:
            metadata = _small(wheel, e, scratch)
        elif name in TEXT_FILES:
            text = _small(wheel, e, scratch)
            if text is not None:
                wheel.texts[name] = text
        elif (
            e.file_size >= MIN_CODE_BYTES
            and not name.endswith("/")
            and _maybe_code(name.rsplit("/", 1)[-1])
        ):
            members.append(
                Member(
                    relpath=name,
                    path=None,
                    size=e.file_size,
                    mtime=mtime ^ e.CRC,
                    origin=f"{wheel.name}!{name}",
                    cache_key=f"{real}!{name}",
                    wheel=path,
                    zinfo=e,
                    scratch=scratch,
                    kind="",
                )
            )
        if wheel.invalid:
            return []
    if metadata is None:
        wheel.invalid = "invalid archive: no *.dist-info/METADATA"
    else:
        wheel.metadata = _parse_metadata(metadata)
    return members


def _small(wheel: Wheel, e: Entry, scratch: str) -> str | None:
    """A text member (METADATA, version.py), read whole; a damaged one, or one claiming more
    than MAX_TEXT_BYTES, makes the wheel invalid (read_member never inflates past the claim)."""
    problem = claim_problem(e, MAX_TEXT_BYTES)
    if problem:
        wheel.invalid = f"invalid archive: {problem}"
        return None
    member = Member(e.filename, None, e.file_size, 0, "", "", wheel=wheel.path, zinfo=e)
    try:
        return bytes(read_member(member)).decode("utf-8", "replace")
    except Exception as exc:  # zipfile/zlib errors on a corrupt member
        wheel.invalid = f"invalid archive: {e.filename}: {exc}"
        return None


def _archive_problem(entries: list[Entry]) -> str | None:
    """archives.archive_problem, with the common case (nothing wrong) decided over all entries
    at once; anything suspicious is handed to it for the exact first problem."""
    from patchkit.archives import KNOWN_COMPRESSION, MAX_MEMBER_BYTES, MAX_WHEEL_BYTES, is_bomb

    names = [e.filename for e in entries]
    suspicious = (
        ".." in "\0".join(names)
        or any(n.startswith(("/", "\\")) or n[1:2] == ":" for n in names)
        or len(set(names)) != len(names)
        or any((e.external_attr >> 28) == 0xA for e in entries)  # S_IFLNK
        or any(e.flag_bits & 0x1 for e in entries)
        or any(e.compress_type not in KNOWN_COMPRESSION for e in entries)
        or any(
            e.file_size > MAX_MEMBER_BYTES or is_bomb(e.file_size, e.compress_size) for e in entries
        )
        or sum(e.file_size for e in entries) > MAX_WHEEL_BYTES
    )
    return archive_problem(entries) if suspicious else None


_LISTING = 2  # bump when the listing's fields, or what listing a wheel refuses, change


def _load_listing(cache, path: str, name: str, stamp: tuple, scratch: str):
    """(Wheel, members) from the cache's listing of this wheel (same path, size, mtime)."""

    def decode(d):
        if d["v"] != _LISTING:
            raise ValueError("listing version")
        wheel = Wheel(path, name, stamp, listed=True)
        if d["invalid"] is not None:
            wheel.invalid = str(d["invalid"])
        if d["metadata"] is not None:
            dname, version, requires = d["metadata"]
            if not all(isinstance(x, str) for x in (dname, version, *requires)):
                raise TypeError("metadata")
            wheel.metadata = (dname, version, list(requires))
        texts = d["texts"]
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in texts.items()):
            raise TypeError("texts")
        wheel.texts = dict(texts)
        if not isinstance(d["names"], str):
            raise TypeError("names")
        wheel.names = d["names"]
        members = []
        for rel, kind, offset, csize, usize, crc, method, flags in d["members"]:
            if kind not in ("elf", "cubin", "fatbin", "ptx") or not isinstance(rel, str):
                raise ValueError("member")
            ints = (offset, csize, usize, crc, method, flags)
            if not all(type(i) is int for i in ints):
                raise TypeError("member fields")
            raw = rel.encode("utf-8" if flags & 0x800 else "cp437")
            entry = Entry(rel, raw, offset, csize, usize, crc, method, flags, 0)
            members.append(
                Member(
                    relpath=rel,
                    path=None,
                    size=usize,
                    mtime=stamp[2] ^ crc,
                    origin=f"{name}!{rel}",
                    cache_key=f"{stamp[0]}!{rel}",
                    wheel=path,
                    zinfo=entry,
                    scratch=scratch,
                    kind=kind,
                )
            )
        return wheel, members

    return cache.load("listing:" + stamp[0], stamp[1], stamp[2], decode)


def store_listing(cache, wheel: Wheel, members: list[Member]) -> None:
    """Record what listing ``wheel`` found (its members classified), for the next run."""
    if wheel.listed or wheel.stamp[1] < 0 or any(not m.kind for m in members):
        return
    value = {
        "v": _LISTING,
        "invalid": wheel.invalid,
        "metadata": list(wheel.metadata) if wheel.metadata else None,
        "texts": wheel.texts,
        "names": wheel.names,
        "members": [
            [m.relpath, m.kind, *(m.zinfo[2:8] if m.zinfo else ())]
            for m in members
            if m.zinfo is not None
        ],
    }
    cache.store("listing:" + wheel.stamp[0], wheel.stamp[1], wheel.stamp[2], value)


def drop_wheel(tree: Tree, wheel: Wheel, reason: str) -> None:
    """A wheel found invalid while its members were read: it contributes nothing but the error."""
    wheel.invalid = reason
    for rel in [r for r, m in tree.members.items() if m.wheel == wheel.path]:
        del tree.members[rel]
    for key in wheel.texts:
        tree.texts.pop(key, None)
    wheel.texts = {}
    wheel.metadata = None
    for dname in [d for d, dist in tree.dists.items() if dist.wheel == wheel.name]:
        del tree.dists[dname]
    tree.invalid.append((wheel.name, reason))


def classify_pending(tree: Tree) -> None:
    """Classify the members ``read_wheelhouse`` left unclassified, here and now, by their heads
    (what scan.analyze_tree does in its workers as it reads them): non-code members are dropped,
    a member whose head cannot be read makes its wheel invalid."""
    for rel, member in list(tree.members.items()):
        if member.kind or rel not in tree.members:
            continue
        try:
            kind = classify(member_head(member), rel)
        except Exception as exc:  # zipfile/zlib errors on a corrupt member
            drop_wheel(tree, tree.wheels[member.wheel], f"invalid archive: {rel}: {exc}")
            continue
        if kind is None:
            del tree.members[rel]
        else:
            member.kind = kind
            tree.dirs.add(os.path.dirname(rel))
