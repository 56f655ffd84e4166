"""What kind of code a file is, from its first bytes: the one rule both the sources (which
files are code) and the scan (how each is read) follow."""

from __future__ import annotations

import struct

from patchkit.abi.fatbin import EM_CUDA

KINDS = ("elf", "cubin", "fatbin", "ptx")


def classify(head: bytes, name: str) -> str | None:
    """``elf``, ``cubin``, ``fatbin``, ``ptx`` or None, from a file's first bytes (and a
    ``.ptx`` name for PTX, which is plain text)."""
    if head[:4] == b"\x7fELF":
        if len(head) >= 20 and struct.unpack_from("<H", head, 0x12)[0] == EM_CUDA:
            return "cubin"
        return "elf"
    if head[:4] == b"\x50\xed\x55\xba":
        return "fatbin"
    if name.endswith(".ptx") and (b".version" in head or b"//" in head[:2]):
        return "ptx"
    return None
