"""`carry_pool.CarryPool`: carries in worker processes, their outcomes by key and their
progress shown by the parent as it arrives; one job carries in the process itself."""

from __future__ import annotations

import contextvars
import os
import types

import pytest

from patchkit import carry_pool, ui
from patchkit.classify import Carry, NewBase, PatchOutcome
from patchkit.gitops import Repo

EMPTY = types.SimpleNamespace(patches=[])  # a series of no patch (the fake carries nothing)


def _fake_carry(mirror, series, old, new):
    ui.progress(f"carrying onto {new.version}")
    return Carry([PatchOutcome(f"{new.version} in {os.getpid()}", "clean")], new.commit)


@pytest.mark.parametrize("jobs", [1, 2])
def test_outcomes_by_key_and_progress_forwarded(jobs, monkeypatch, tmp_path):
    monkeypatch.setattr(carry_pool, "carry_series", _fake_carry)  # workers are forked after

    def run() -> tuple[list[str], list[str]]:
        shown: list[str] = []
        ui.forward_progress(shown.append)
        mirror = Repo.bare_at(tmp_path)
        with carry_pool.CarryPool(jobs) as pool:
            for version in ("1.1", "1.2", "1.3"):
                pool.submit(version, mirror, EMPTY, "a" * 40, NewBase("b" * 40, version), version)
            names = [pool.outcomes(v)[0].name for v in ("1.1", "1.2", "1.3")]
        return names, shown

    names, shown = contextvars.copy_context().run(run)
    assert [n.split(" in ")[0] for n in names] == ["1.1", "1.2", "1.3"]
    in_parent = {n.split(" in ")[1] == str(os.getpid()) for n in names}
    assert in_parent == ({True} if jobs == 1 else {False})
    for version in ("1.1", "1.2", "1.3"):
        if jobs == 1:  # here, in order
            assert f"{version}: carrying 0 patch(es)" in shown
            assert f"carrying onto {version}" in shown
        else:  # in a worker, its progress named by the release
            assert f"{version}: carrying 0 patch(es) (in a worker)" in shown
            assert f"{version}: carrying onto {version}" in shown


def test_an_interrupt_as_the_pool_starts_is_raised_once_it_has_started(monkeypatch, tmp_path):
    """Ctrl-C the moment before the pool's manager thread starts (its workers just forked):
    the run's KeyboardInterrupt, raised once the thread runs, and the pool shut down with
    its workers gone. (shutdown then waited on a thread never started: RuntimeError, or a
    run that never ended.)"""
    import signal
    import threading

    from patchkit import cli

    monkeypatch.setattr(carry_pool, "carry_series", _fake_carry)
    start = threading.Thread.start

    workers = []

    def interrupted(self):
        if type(self).__name__ == "_ExecutorManagerThread":
            workers.extend(self.processes.values())  # forked by now
            os.kill(os.getpid(), signal.SIGINT)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", interrupted)
    previous = cli._take_interrupts()
    try:
        with pytest.raises(KeyboardInterrupt), carry_pool.CarryPool(2) as pool:
            pool.submit("1.1", Repo.bare_at(tmp_path), EMPTY, "a" * 40, NewBase("b" * 40, "1.1"),
                        "1.1")  # fmt: skip
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert len(workers) == 2 and not any(p.is_alive() for p in workers)
