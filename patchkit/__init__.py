"""patchkit: versioned patch series against pinned upstreams, for GPU inference stacks."""

import os as _os
import signal as _signal
import sys as _sys

__version__ = "0.1.0"
NOTHING_LEFT = "nothing was left half-done"  # what an interrupt that left no work says


def _interrupted_while_starting(signum, frame):  # noqa: ARG001 - signal handler signature
    """Ctrl-C or SIGTERM while the program starts, before `cli.main` takes them (the imports
    of patchkit and click): one line and 130, as for any interrupt, not the interpreter's
    traceback (or for SIGTERM a kill without a word)."""
    _os.write(2, f"patchkit: interrupted; {NOTHING_LEFT}\n".encode())
    _os._exit(130)


def _take_interrupts_while_starting() -> None:
    """Only where patchkit is the program (its console script, `python -m patchkit`), never
    where it is imported; SIGINT ignored from the start (a background job) stays so."""
    orig = getattr(_sys, "orig_argv", [])
    if _os.path.basename(_sys.argv[0]) != "patchkit" and orig[1:3] != ["-m", "patchkit"]:
        return
    for signum, default in (
        (_signal.SIGINT, _signal.default_int_handler),
        (_signal.SIGTERM, _signal.SIG_DFL),
    ):
        if _signal.getsignal(signum) is default:
            _signal.signal(signum, _interrupted_while_starting)


_take_interrupts_while_starting()
