"""Read and rewrite safetensors headers without loading a tensor.

A safetensors file is an 8-byte little-endian header length, that many bytes of JSON
(``name -> {dtype, shape, data_offsets}`` plus an optional ``__metadata__`` of strings), then
the tensor bytes.  Only the header is read; a rename rewrites the header and copies the data
region byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from patchkit.errors import UsageError

# The reference implementation refuses headers over 100 MB; so does this reader.
MAX_HEADER_BYTES = 100 * 1024 * 1024
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
COPY_CHUNK = 16 * 1024 * 1024


class SafetensorsError(UsageError):
    """A file is not a well-formed safetensors file."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its header describes it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # offsets relative to the data region
    end: int
    file: str

    @property
    def numel(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n


@dataclass
class Header:
    """The parsed header of one safetensors file."""

    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)
    data_start: int = 0
    size: int = 0


def read_header(path: Path) -> Header:
    """Parse and validate the header of ``path``; raise SafetensorsError on any defect."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise SafetensorsError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise SafetensorsError(
                    f"{path}: not a safetensors file (header length {length} does not fit "
                    f"the {size}-byte file)"
                )
            raw = fh.read(length)
    except OSError as exc:
        raise SafetensorsError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsError(f"{path}: header is not JSON ({exc})") from exc
    except RecursionError:
        raise SafetensorsError(f"{path}: header nests too deeply to be a tensor table") from None
    if not isinstance(doc, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    metadata = doc.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise SafetensorsError(f"{path}: __metadata__ must map strings to strings")
    data_len = size - 8 - length
    tensors = {name: _tensor(path, name, entry, data_len) for name, entry in doc.items()}
    _check_layout(path, tensors, data_len)
    return Header(path, tensors, metadata, 8 + length, size)


def _tensor(path: Path, name: str, entry: object, data_len: int) -> TensorInfo:
    if not isinstance(entry, dict):
        raise SafetensorsError(f"{path}: entry {name!r} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise SafetensorsError(f"{path}: tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise SafetensorsError(f"{path}: tensor {name!r} has a malformed shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_len
    ):
        raise SafetensorsError(f"{path}: tensor {name!r} has data offsets outside the file")
    info = TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1], path.name)
    if info.end - info.start != info.numel * DTYPE_BYTES[dtype]:
        raise SafetensorsError(
            f"{path}: tensor {name!r} holds {info.end - info.start} bytes, its shape "
            f"{list(shape)} of {dtype} needs {info.numel * DTYPE_BYTES[dtype]}"
        )
    return info


def _check_layout(path: Path, tensors: dict[str, TensorInfo], data_len: int) -> None:
    spans = sorted((t.start, t.end, t.name) for t in tensors.values())
    for (_, end, name), (start, _, other) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise SafetensorsError(f"{path}: tensors {name!r} and {other!r} overlap")


def encode_header(tensors: list[tuple[str, TensorInfo, int]], metadata: dict[str, str]) -> bytes:
    """The header bytes (length prefix included) for ``(new_name, info, new_start)`` entries.

    Padded with spaces to a multiple of 8, as the reference writer does.
    """
    doc: dict[str, object] = {}
    if metadata:
        doc["__metadata__"] = metadata
    for name, info, start in tensors:
        doc[name] = {
            "dtype": info.dtype,
            "shape": list(info.shape),
            "data_offsets": [start, start + info.end - info.start],
        }
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_renamed(header: Header, rename: dict[str, str], dest: Path) -> dict[str, str]:
    """Write ``dest``: ``header``'s file with tensors renamed by ``rename`` (others kept).

    The data bytes are copied unchanged, in their original order; returns the sha256 of each
    tensor's bytes by new name.  ``dest`` appears only complete (written aside, then renamed).
    """
    ordered = sorted(header.tensors.values(), key=lambda t: t.start)
    names = [rename.get(t.name, t.name) for t in ordered]
    if len(set(names)) != len(names):
        raise SafetensorsError(f"{header.path}: the renaming maps two tensors to one name")
    entries, cursor = [], 0
    for name, info in zip(names, ordered, strict=False):
        entries.append((name, info, cursor))
        cursor += info.end - info.start
    digests: dict[str, str] = {}
    tmp = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    try:
        with header.path.open("rb") as src, tmp.open("wb") as out:
            out.write(encode_header(entries, header.metadata))
            for name, info in zip(names, ordered, strict=False):
                src.seek(header.data_start + info.start)
                digest = hashlib.sha256()
                left = info.end - info.start
                while left:
                    chunk = src.read(min(COPY_CHUNK, left))
                    if not chunk:
                        raise SafetensorsError(f"{header.path}: file ended inside {info.name!r}")
                    digest.update(chunk)
                    out.write(chunk)
                    left -= len(chunk)
                digests[name] = digest.hexdigest()
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return digests


def tensor_sha256(header: Header, info: TensorInfo) -> str:
    """sha256 of one tensor's bytes, read in chunks."""
    digest = hashlib.sha256()
    with header.path.open("rb") as fh:
        fh.seek(header.data_start + info.start)
        left = info.end - info.start
        while left:
            chunk = fh.read(min(COPY_CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()
