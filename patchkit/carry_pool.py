"""Carrying one series onto several bases at once: one worker process per core, each
carrying onto one base at a time, their progress shown by this process as it arrives.

`outlook` hands it each release as soon as its base is obtained, so the next release's
download and import overlap the classification of the ones before. With one job (one core,
or `PATCHKIT_OUTLOOK_JOBS=1`) every carry runs here, in order, as before.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import multiprocessing.util
import os
import queue as queues
import signal
from pathlib import Path

from patchkit import gitops, scratch, ui
from patchkit.classify import NewBase, PatchOutcome, carry_series
from patchkit.series import Series

MAX_JOBS = 4
_QUEUE = None  # in a worker: where its progress goes


def default_jobs() -> int:
    """$PATCHKIT_OUTLOOK_JOBS, else one per core (at most MAX_JOBS: each holds a delta of
    two releases, hundreds of MB)."""
    try:
        wanted = int(os.environ.get("PATCHKIT_OUTLOOK_JOBS", "0"))
    except ValueError:
        wanted = 0
    return max(1, wanted or min(os.cpu_count() or 1, MAX_JOBS))


class CarryPool:
    """Carries submitted by key; `outcomes(key)` waits for one, showing progress meanwhile."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self._done: dict[str, list[PatchOutcome]] = {}
        self._futures: dict[str, concurrent.futures.Future] = {}
        self._pool = None
        self._queue = None

    def __enter__(self) -> CarryPool:
        if self.jobs > 1:
            context = multiprocessing.get_context("fork")  # the modules already imported
            self._queue = context.SimpleQueue()
            self._pool = concurrent.futures.ProcessPoolExecutor(
                self.jobs, mp_context=context, initializer=_start, initargs=(self._queue,)
            )
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._show()

    def submit(
        self, key: str, mirror: gitops.Repo, series: Series, old: str, new: NewBase, label: str
    ) -> None:
        """Carry `series` from `old` onto `new` (in a worker when there are several)."""
        if self._pool is None:
            ui.progress(f"{label}: carrying {len(series.patches)} patch(es)")
            self._done[key] = carry_series(mirror, series, old, new).outcomes
            return
        ui.progress(f"{label}: carrying {len(series.patches)} patch(es) (in a worker)")
        # the first submit forks the workers, then starts the pool's manager thread: an
        # interrupt between the two would leave shutdown waiting on a thread never started
        with scratch.signals_held():
            self._futures[key] = self._pool.submit(
                _carry, str(mirror.path), series, old, new, label
            )

    def outcomes(self, key: str) -> list[PatchOutcome]:
        if key in self._done:
            return self._done.pop(key)
        future = self._futures.pop(key)
        while not future.done():
            self._show()
            concurrent.futures.wait([future], timeout=0.2)
        self._show()
        return future.result()

    def _show(self) -> None:
        """The workers' progress so far, as this process's."""
        while self._queue is not None:
            try:
                if self._queue.empty():
                    return
                ui.progress(self._queue.get())
            except (OSError, EOFError, queues.Empty):
                return


def _start(queue) -> None:
    """A worker's start: its progress to `queue`; its scratch folder removed when it ends."""
    global _QUEUE
    _QUEUE = queue
    # Ctrl-C reaches the whole process group: the parent alone answers it (it lets the
    # carries under way finish and drops the rest); one raised inside the queue's protocol
    # here could leave the parent waiting on a lock for ever
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pid = os.getpid()
    multiprocessing.util.Finalize(None, scratch._remove, args=(pid,), exitpriority=10)


def _carry(mirror: str, series: Series, old: str, new: NewBase, label: str):
    ui.forward_progress(lambda message: _QUEUE.put(f"{label}: {message}"))
    return carry_series(gitops.Repo.bare_at(Path(mirror)), series, old, new).outcomes
