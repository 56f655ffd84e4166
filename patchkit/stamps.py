"""Records of work proven by doing it, keyed on everything its result depends on.

A stamp is one small file under `<cache>/verified/`: a key (a digest of the work's inputs) on
its first line and, where the work has a result, that result after it. A stamp that is
missing, unreadable, truncated or holds another key is a miss and the work is done again; a
stamp is data, never code. Stamps are written whole (a temporary file renamed over the old
one), so a reader sees the last complete record or none.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from patchkit.series import Patch

# A stamp of a 1,000-patch build record is about 90 kB.
MAX_STAMP_BYTES = 16 << 20


def module_files(names: Iterable[str]) -> list[Path]:
    """The source files of `names`, found without importing the ones not imported yet; a
    package's are every module of its folder."""
    out = []
    for name in names:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) if module else None
        if origin is None:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec else None
        if origin is None:
            raise LookupError(f"no source for {name}")
        path = Path(origin)
        out += sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    return out


def series_key(
    kind: str,
    base: str,
    patches: Iterable[Patch],
    code: Iterable[Path],
    git_identity: str,
    *extra: str,
) -> str:
    """A digest over what building `patches` on `base` gives: the base commit (its id names
    its bytes), each patch's name and bytes in order, the source of the code that does the
    work, the Python version, the git program and anything else the caller names."""
    digest = hashlib.sha256(f"{kind}\0{base}\0{git_identity}\0{sys.version}\0".encode())
    for item in extra:
        digest.update(b"extra %d\0" % len(item) + item.encode())
    for source in code:
        data = source.read_bytes()
        digest.update(b"code %d\0" % len(data) + data)
    for patch in patches:
        digest.update(f"patch {patch.name}\0{len(patch.raw)}\0".encode() + patch.raw)
    return digest.hexdigest()


@dataclass(frozen=True)
class Stamp:
    path: Path
    key: str

    def payload(self) -> str | None:
        """What was recorded with this key, or None (no stamp, another key, unreadable)."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_STAMP_BYTES + 1)
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        if len(raw) > MAX_STAMP_BYTES:  # not one patchkit wrote: a miss, not a memory hog
            return None
        key, newline, payload = text.partition("\n")
        if key != self.key or not newline:
            return None
        return payload

    def holds(self) -> bool:
        return self.payload() is not None

    def record(self, payload: str = "") -> bool:
        """Record `payload` under this key, replacing any earlier record of this stamp; False
        when the cache cannot be written (the work stands, the next run does it again)."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(f"{self.key}\n{payload}", encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return False
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise
        return True
