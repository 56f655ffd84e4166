"""Patched wheels from a wheel base: repack the pinned upstream wheel with the patched files.

For an upstream that publishes only platform wheels, there is no source to build: the series
is applied to the imported tree (the wheel's own files), and the patched files are written back
into a copy of the pinned wheel.  The copy gets the PEP 440 local version in its file name,
`.dist-info` name and METADATA, `patchkit.json` and the CycloneDX SBOM, a regenerated RECORD,
and keeps the platform tag.  Unchanged members keep their compressed bytes; compiled members
are carried unchanged.  A patch that touches a compiled member, the wheel's metadata or a
file outside the wheel's package directories is refused before anything is written.

The output is byte-reproducible: fixed member order and dates, streams copied or compressed
with fixed settings.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.utils import canonicalize_name

from patchkit.errors import BuildError, PinError
from patchkit.series import Series
from patchkit.targets import WheelPin
from patchkit.upstream.wheel import WheelLayout, check_wheel_file, is_compiled, wheel_layout
from patchkit.wheels.reproducible import (
    RecordEntry,
    record_hash,
    write_record,
    write_zip,
)

VERSION_HEADER_RE = re.compile(rb"^Version: .*$", re.M)


@dataclass(frozen=True)
class TreeChanges:
    """What the series changed in the wheel's files (paths relative to the wheel root)."""

    changed: dict[str, bytes]  # modified or added members -> new bytes
    removed: frozenset[str]


def check_series_paths(series: Series, subdir: str, layout: WheelLayout) -> None:
    """Refuse a series that touches what a repack cannot carry: paths outside the wheel's
    package directories, compiled members or the wheel's metadata."""
    prefix = f"{subdir}/" if subdir else ""
    compiled = {i.filename for i in layout.compiled}
    tops = layout.top_level
    for patch in series.patches:
        for change in patch.files:
            for path in {change.path, change.source} - {None}:
                _check_path(patch.name, path, prefix, tops, compiled, change.binary)


def _check_path(
    patch: str, path: str, prefix: str, tops: set[str], compiled: set[str], binary: bool
) -> None:
    where = "the target's layout" if not prefix else f"{prefix.rstrip('/')}/"
    if not path.startswith(prefix):
        raise BuildError(
            f"{patch} touches {path}, outside {where}: a wheel base carries only the "
            "wheel's own files; refusing to repack",
            hint="move that change out of this line's series (it cannot be shipped in the wheel)",
        )
    member = path[len(prefix) :]
    top = PurePosixPath(member).parts[0]
    if top.endswith((".dist-info", ".data")):
        raise BuildError(
            f"{patch} touches {path}, the wheel's metadata; refusing to repack",
            hint="patchkit writes the metadata itself (version, RECORD, provenance)",
        )
    if top not in tops:
        raise BuildError(
            f"{patch} touches {path}, which is not in the wheel (its package directories are "
            f"{', '.join(sorted(tops))}); refusing to repack",
            hint="packaging files (pyproject.toml, setup.py) are not part of a wheel base: "
            "change the line's pins in its METADATA-level requirements instead",
        )
    if member in compiled or is_compiled(member) or binary:
        raise BuildError(
            f"{patch} touches {path}, a compiled or binary member; refusing to repack "
            "(compiled members are carried unchanged)",
            hint="a change to compiled code needs a source build of that extension",
        )


def tree_changes(
    tree: Path, subdir: str, layout: WheelLayout, source: zipfile.ZipFile
) -> TreeChanges:
    """Compare the patched tree with the wheel's source members."""
    root = tree / subdir if subdir else tree
    members = {i.filename: i for i in layout.sources}
    changed: dict[str, bytes] = {}
    seen: set[str] = set()
    for top in sorted(layout.top_level):
        base = root / top
        if base.is_file():
            paths = [base]
        else:
            paths = sorted(p for p in base.rglob("*") if p.is_file() or p.is_symlink())
        for path in paths:
            if path.is_symlink():
                raise BuildError(f"the patched tree holds a symbolic link {path}; refusing")
            name = path.relative_to(root).as_posix()
            data = path.read_bytes()
            seen.add(name)
            info = members.get(name)
            if info is None:
                if name not in {i.filename for i in layout.compiled}:
                    changed[name] = data
            elif data != source.read(info):
                changed[name] = data
    removed = frozenset(set(members) - seen)
    return TreeChanges(changed, removed)


def check_same_sources(base: zipfile.ZipFile, other: zipfile.ZipFile, label: str) -> None:
    """Refuse a wheel whose source files differ from the base wheel's: the series was
    classified and applied against the base wheel's files only."""
    a = {i.filename: i for i in wheel_layout(base, "base wheel").sources}
    b = {i.filename: i for i in wheel_layout(other, label).sources}
    if set(a) != set(b):
        extra = sorted(set(a) ^ set(b))
        raise PinError(
            f"{label}: its source files differ from the base wheel's ({extra[0]} and "
            f"{len(extra) - 1} more); one series cannot describe both"
        )
    for name, info in a.items():
        if info.CRC != b[name].CRC or base.read(info) != other.read(b[name]):
            raise PinError(f"{label}: {name} differs from the base wheel's; refusing")


def wheel_filename(pin: WheelPin, version: str) -> str:
    """The repacked wheel's file name: new version, the pinned wheel's tags."""
    python_tag, abi_tag, platform = pin.tags
    dist = re.sub(r"[-_.]+", "_", canonicalize_name(pin.distribution))
    return f"{dist}-{version}-{python_tag}-{abi_tag}-{platform}.whl"


def set_metadata_version(metadata: bytes, version: str) -> bytes:
    """METADATA with its `Version:` header (the first, in the header block) set."""
    head, sep, body = metadata.partition(b"\n\n")
    new_head, count = VERSION_HEADER_RE.subn(b"Version: " + version.encode(), head, count=1)
    if count != 1:
        raise BuildError("the base wheel's METADATA has no Version header")
    return new_head + sep + body


def repack(
    source: Path,
    pin: WheelPin,
    changes: TreeChanges,
    *,
    version: str,
    epoch: int,
    out_dir: Path,
    extra_dist_info: dict[str, bytes],
) -> tuple[Path, str]:
    """Write the patched wheel into `out_dir` (atomically); returns its path and the name of
    its `.dist-info` directory.

    `extra_dist_info`: files to add under the new `.dist-info/` (provenance, SBOM).
    """
    check_wheel_file(source, pin)
    dest = out_dir / wheel_filename(pin, version)
    with zipfile.ZipFile(source) as zin:
        layout = wheel_layout(zin, pin.filename)
        old_info = layout.dist_info
        dist = old_info[: -len(".dist-info")].rsplit("-", 1)[0]
        new_info = f"{dist}-{version}.dist-info"
        old_data, new_data = f"{dist}-{pin_version(old_info)}.data", f"{dist}-{version}.data"
        # name in the new wheel -> (original ZipInfo or None, new bytes or None)
        entries: dict[str, tuple[zipfile.ZipInfo | None, bytes | None]] = {}
        for info in (*layout.sources, *layout.compiled):
            if info.filename in changes.removed:
                continue
            entries[info.filename] = (info, changes.changed.get(info.filename))
        for name, data in changes.changed.items():
            entries.setdefault(name, (None, data))
        record_name = f"{new_info}/RECORD"
        for info in layout.metadata:
            top, _, rest = info.filename.partition("/")
            if top == old_info:
                name = f"{new_info}/{rest}"
                if rest in ("RECORD", "RECORD.jws", "RECORD.p7s"):
                    continue  # regenerated; a signature of the old RECORD would not hold
                data = None
                if rest == "METADATA":
                    data = set_metadata_version(zin.read(info), version)
                entries[name] = (info, data)
            else:
                entries[f"{new_data}/{rest}" if top == old_data else info.filename] = (info, None)
        for rel, data in extra_dist_info.items():
            entries[f"{new_info}/{rel}"] = (None, data)
        names = sorted(entries, key=lambda n: (n.startswith(f"{new_info}/"), n))
        record = []
        for name in names:
            info, data = entries[name]
            blob = data if data is not None else zin.read(info)  # type: ignore[arg-type]
            record.append(RecordEntry(name, record_hash(blob), len(blob)))
        record.append(RecordEntry(record_name, "", None))
        entries[record_name] = (None, write_record(record))
        names.append(record_name)
        write_zip(zin, entries, names, dest, epoch)
    return dest, new_info


def pin_version(dist_info: str) -> str:
    return dist_info[: -len(".dist-info")].rsplit("-", 1)[1]
