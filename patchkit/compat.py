"""What differs between the Python versions patchkit supports (3.10+), in one place."""

from __future__ import annotations

import sys
from typing import IO, Any

if sys.version_info >= (3, 11):
    import tomllib as _toml
else:  # pragma: no cover - Python 3.10
    import tomli as _toml


class TOMLNestingError(_toml.TOMLDecodeError):
    """Arrays or tables nested deeper than the parser's recursion: a TOMLDecodeError like any
    other malformed TOML, so every reader's error names the file in one line."""

    def __init__(self) -> None:
        ValueError.__init__(self, "arrays or tables nested too deeply to read")


def _loads(text: str, **kwargs: Any) -> dict[str, Any]:
    try:
        return _toml.loads(text, **kwargs)
    except RecursionError:  # the parser recurses once per nesting level
        raise TOMLNestingError() from None


def _load(fh: IO[bytes], **kwargs: Any) -> dict[str, Any]:
    return _loads(fh.read().decode(), **kwargs)


class tomllib:  # noqa: N801 - stands for the module
    """tomllib's interface, with a nesting too deep for the parser a TOMLDecodeError."""

    TOMLDecodeError = _toml.TOMLDecodeError
    loads = staticmethod(_loads)
    load = staticmethod(_load)


__all__ = ["tomllib"]
