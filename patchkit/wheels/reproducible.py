"""Byte-reproducible wheels: rewrite a built wheel with a fixed layout and a fresh RECORD.

Entries are sorted (package files first, then `.dist-info/`, RECORD last), every timestamp is
SOURCE_DATE_EPOCH, modes are 0644 or 0755 (only the executable bit survives) and RECORD is
regenerated, so the bytes depend only on the files' contents and names.
"""

from __future__ import annotations

import base64
import csv
import glob
import hashlib
import io
import os
import struct
import time
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from patchkit.locks import locked_temp_file, sweep_dead_temp_files

ZIP_EPOCH_MIN = 315532800  # 1980-01-01, the earliest date a zip entry can hold
COMPRESS_LEVEL = 6


@dataclass(frozen=True)
class RecordEntry:
    """One RECORD row: path, `sha256=<urlsafe b64>` (or empty) and size (or None)."""

    path: str
    hash: str
    size: int | None


def record_hash(data: bytes) -> str:
    """The RECORD form of a sha256 digest."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def read_record(text: str) -> list[RecordEntry]:
    """Parse a RECORD file."""
    rows = []
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        path, digest, size = (row + ["", ""])[:3]
        rows.append(RecordEntry(path, digest, int(size) if size else None))
    return rows


def write_record(entries: Iterable[RecordEntry]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for entry in entries:
        writer.writerow([entry.path, entry.hash, "" if entry.size is None else entry.size])
    return out.getvalue().encode("utf-8")


def dist_info_dir(names: Iterable[str]) -> str:
    """The one top-level `*.dist-info` directory of a wheel."""
    found = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    if len(found) != 1:
        raise ValueError(f"expected one .dist-info directory, found {sorted(found) or 'none'}")
    return found.pop()


def _order(dist_info: str, name: str) -> tuple[int, str]:
    if name == f"{dist_info}/RECORD":
        return (2, name)
    return (1 if name.startswith(dist_info + "/") else 0, name)


def _zip_time(epoch: int) -> tuple[int, int, int, int, int, int]:
    return time.gmtime(max(epoch, ZIP_EPOCH_MIN))[:6]


def normalize_wheel(
    source: Path, dest: Path, epoch: int, extra: dict[str, bytes] | None = None
) -> None:
    """Write `dest`: `source`'s files plus `extra` (paths inside the wheel), reproducibly.

    `extra` keys are relative to the wheel root (e.g. `<name>.dist-info/patchkit.json`);
    RECORD is recomputed over everything.  The backend's compressed streams are copied as
    they are (same input, same tools: same bytes); only new entries are compressed here.
    `dest` appears atomically.
    """
    extra = dict(extra or {})
    with zipfile.ZipFile(source) as zin:
        infos = {i.filename: i for i in zin.infolist() if not i.is_dir()}
        dist_info = dist_info_dir(infos)
        record_name = f"{dist_info}/RECORD"
        infos.pop(record_name, None)
        for name in extra:
            infos.pop(name, None)
        contents = {name: zin.read(info) for name, info in infos.items()}
        contents.update(extra)
        names = sorted(contents, key=lambda n: _order(dist_info, n))
        record = [RecordEntry(n, record_hash(contents[n]), len(contents[n])) for n in names]
        record.append(RecordEntry(record_name, "", None))
        contents[record_name] = write_record(record)
        names.append(record_name)

        entries = {n: (infos.get(n), None if n in infos else contents[n]) for n in names}
        write_zip(zin, entries, names, dest, epoch)


def write_zip(
    zin: zipfile.ZipFile,
    entries: dict[str, tuple[zipfile.ZipInfo | None, bytes | None]],
    names: list[str],
    dest: Path,
    epoch: int,
) -> None:
    """Write `dest` atomically with `names` in that order: each entry is (the member of
    `zin` it comes from, or None; new bytes, or None to keep that member's), dated `epoch`,
    modes 644/755; a kept member's compressed stream is copied as it is."""
    stamp = _zip_time(epoch)
    dest.parent.mkdir(parents=True, exist_ok=True)
    sweep_dead_temp_files(dest.parent, f".{glob.escape(dest.name)}.*.tmp")
    fd, tmp = locked_temp_file(dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        with os.fdopen(os.dup(fd), "w+b") as fh, zipfile.ZipFile(fh, "w") as zout:
            for name in names:
                old, data = entries[name]
                executable = bool(old is not None and (old.external_attr >> 16) & 0o111)
                info = zipfile.ZipInfo(name, date_time=stamp)
                info.create_system = 3  # unix, so the mode bits below are honoured
                info.external_attr = (0o100755 if executable else 0o100644) << 16
                if data is None and old is not None and old.flag_bits & 0x1 == 0:
                    _copy_compressed(zin, old, zout, info)
                else:
                    blob = data if data is not None else zin.read(old)  # type: ignore[arg-type]
                    info.compress_type = zipfile.ZIP_DEFLATED
                    zout.writestr(info, blob, compresslevel=COMPRESS_LEVEL)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        os.close(fd)


LOCAL_HEADER = struct.Struct("<4s5H3L2H")


def _copy_compressed(
    zin: zipfile.ZipFile, old: zipfile.ZipInfo, zout: zipfile.ZipFile, info: zipfile.ZipInfo
) -> None:
    """Append `old`'s compressed stream to `zout` under `info` without recompressing it."""
    assert zin.fp is not None and zout.fp is not None
    zin.fp.seek(old.header_offset)
    header = LOCAL_HEADER.unpack(zin.fp.read(LOCAL_HEADER.size))
    zin.fp.seek(header[-2] + header[-1], os.SEEK_CUR)  # file name and extra field
    raw = zin.fp.read(old.compress_size)
    info.compress_type = old.compress_type
    info.CRC = old.CRC
    info.compress_size = old.compress_size
    info.file_size = old.file_size
    info.header_offset = zout.fp.tell()
    zout.fp.write(info.FileHeader(zip64=False))
    zout.fp.write(raw)
    zout.filelist.append(info)
    zout.NameToInfo[info.filename] = info
    zout.start_dir = zout.fp.tell()


def check_record(wheel: Path) -> list[tuple[str, str]]:
    """(path, problem) for each file of `wheel` that does not match its RECORD.

    Problems: `changed` (hash differs), `added` (not in RECORD), `missing` (in RECORD only),
    `unhashed` (listed without a hash, which only RECORD itself may be).
    """
    problems = []
    with zipfile.ZipFile(wheel) as zf:
        names = [i.filename for i in zf.infolist() if not i.is_dir()]
        record_name = f"{dist_info_dir(names)}/RECORD"
        record = {e.path: e for e in read_record(zf.read(record_name).decode("utf-8"))}
        for name in names:
            entry = record.get(name)
            if name == record_name:
                continue
            if entry is None:
                problems.append((name, "added"))
            elif not entry.hash:
                problems.append((name, "unhashed"))
            elif entry.hash != record_hash(zf.read(name)):
                problems.append((name, "changed"))
        problems.extend((path, "missing") for path in record if path not in names)
    return sorted(problems)
