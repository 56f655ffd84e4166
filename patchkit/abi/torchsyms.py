"""The torch a profile pins, as data: its libraries' SONAMEs, NEEDED lists and exported symbols.

A wheelhouse of one kernel wheel has no torch to check its undefined torch symbols against; the
profile names a symbol-set file (``[torch] symbols``) made from the real torch wheel by

    python -m patchkit.abi.torchsyms TORCH.whl build/profiles/torch-X.Y.Z.symbols.json.gz

which reads only ``torch/lib/*.so*`` (inflated one at a time into a scratch folder) and records
the wheel's name and sha256. Loading it yields stand-in FileReports for those libraries, marked
as coming from the profile, that the loader resolves like installed ones.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import posixpath
import re
import sys
import zipfile
import zlib

from patchkit.abi.cache import changed
from patchkit.abi.elf import ElfInfo, read_elf
from patchkit.archives import read_regular
from patchkit.scratch import temporary_folder

FORMAT = 1
LIB = re.compile(r"^torch/lib/[^/]+\.so(\.\d+)*$")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def build(wheel: str) -> dict:
    """The symbol-set document of a torch wheel."""
    libs: dict[str, dict] = {}
    version = None
    with zipfile.ZipFile(wheel) as zf, temporary_folder("torchsyms-") as tmp:
        for info in zf.infolist():
            if info.filename == "torch/version.py":
                text = zf.read(info).decode("utf-8", "replace")
                m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
                version = m.group(1) if m else None
            if not LIB.match(info.filename):
                continue
            path = zf.extract(info, tmp)
            try:
                elf = read_elf(path)  # an mmap of the scratch copy
            finally:
                os.unlink(path)
            libs[info.filename] = {
                "soname": elf.soname,
                "needed": elf.needed,
                "verdef": elf.verdef,
                "cxx11_abi": elf.cxx11_abi,
                "defined": sorted(elf.defined),
            }
    return {
        "format": FORMAT,
        "torch": version,
        "wheel": os.path.basename(wheel),
        "sha256": _sha256(wheel),
        "libraries": libs,
    }


# A symbol set is read from a regular file of at most MAX_SET_BYTES, inflated to at most
# MAX_JSON_BYTES (torch 2.9.1's: 0.8 MB and 6 MB); a profile may name any file.
MAX_SET_BYTES = 64 << 20
MAX_JSON_BYTES = 512 << 20


def _gunzip(raw: bytes) -> bytes:
    """One gzip member inflated, never past MAX_JSON_BYTES, with verify's inflate backend
    (zlib-ng: 3x faster on this file)."""
    from patchkit.abi.members import inflate_backend

    inflate = inflate_backend().decompressobj(31)
    try:
        out = inflate.decompress(raw, MAX_JSON_BYTES + 1)
    except Exception as exc:  # zlib's, zlib-ng's or ISA-L's error: not gzip, or damaged
        raise ValueError(f"not gzip, or damaged ({exc})") from None
    if len(out) > MAX_JSON_BYTES:
        raise ValueError(f"inflates past {MAX_JSON_BYTES} bytes")
    if not inflate.eof or inflate.unused_data:
        raise ValueError("not one whole gzip member")
    return out


_LOADED: dict[tuple, dict] = {}


def load(path: str) -> dict:
    """Read and check a symbol-set file; raises ValueError on anything malformed. A file
    read before in this process (same path, size, mtime) is not read again; the document
    returned is shared, never to be changed."""
    try:
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_size, changed(st))
    except OSError:
        key = None
    if key in _LOADED:
        return _LOADED[key]
    doc = _read(path)
    if key is not None:
        _LOADED.clear()
        _LOADED[key] = doc
    return doc


def preload(path: str) -> None:
    """``load`` ahead of need; an unreadable file is left for ``load`` to report."""
    try:
        load(path)
    except ValueError:
        pass


def _read(path: str) -> dict:
    try:
        doc = json.loads(_gunzip(read_regular(path, MAX_SET_BYTES)))
    except (OSError, EOFError, ValueError, zlib.error) as exc:
        raise ValueError(f"cannot read torch symbol set {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path} is not a torch symbol set (format {FORMAT})")
    libs = doc.get("libraries")
    if not isinstance(libs, dict) or not libs:
        raise ValueError(f"{path} lists no libraries")
    for rel, lib in libs.items():
        ok = (
            isinstance(rel, str)
            and LIB.match(rel)
            and isinstance(lib, dict)
            and (lib.get("soname") is None or isinstance(lib.get("soname"), str))
            and all(
                isinstance(lib.get(k), list) and all(isinstance(x, str) for x in lib[k])
                for k in ("needed", "verdef", "defined")
            )
            and lib.get("cxx11_abi") in (None, 0, 1)
        )
        if not ok:
            raise ValueError(f"{path}: entry {rel!r} is malformed")
    return doc


def elf_infos(doc: dict, label: str) -> dict[str, ElfInfo]:
    """relpath -> ElfInfo for each library of the set; NEEDED kept only within torch."""
    libs = doc["libraries"]
    names = {posixpath.basename(r) for r in libs} | {
        lib["soname"] for lib in libs.values() if lib["soname"]
    }
    out = {}
    for rel, lib in libs.items():
        out[rel] = ElfInfo(
            path=f"{label}:{rel}",
            machine="62",
            soname=lib["soname"],
            needed=[n for n in lib["needed"] if n in names],
            rpath=[],
            runpath=["$ORIGIN"],
            defined=frozenset(lib["defined"]),
            undefined=(),
            verdef=list(lib["verdef"]),
            cxx11_abi=lib["cxx11_abi"],
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write the symbol set of a torch wheel.")
    ap.add_argument("wheel")
    ap.add_argument("out")
    args = ap.parse_args(argv)
    doc = build(args.wheel)
    tmp = args.out + ".tmp"
    with gzip.GzipFile(tmp, "wb", mtime=0) as fh:
        fh.write(json.dumps(doc, separators=(",", ":"), sort_keys=True).encode())
    os.replace(tmp, args.out)
    total = sum(len(lib["defined"]) for lib in doc["libraries"].values())
    print(
        f"{args.out}: torch {doc['torch']}, {len(doc['libraries'])} libraries, {total} symbols, "
        f"from {doc['wheel']} (sha256 {doc['sha256'][:16]}...)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
