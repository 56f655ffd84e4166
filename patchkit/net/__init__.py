"""The one door to the network (pip's `network/` package): every request patchkit makes goes
through a `Session` (`session.py`), which keeps credentials per origin (`auth.py`), refuses
schemes a remote index must not use, and bounds each transfer in size and time.

urllib3 is imported on the first request, never by a run that downloads nothing.
"""

from __future__ import annotations

from patchkit.net.auth import Credentials, origin_of, split_credentials
from patchkit.net.session import Limits, Session, Transfer

__all__ = ["Credentials", "Limits", "Session", "Transfer", "origin_of", "split_credentials"]
