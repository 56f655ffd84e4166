"""Interrupt `rebase --write` at its git calls (SIGINT, SIGTERM, SIGKILL, through the `git`
wrapper on PATH): patches/ and targets.toml are always the old or the new state, the cache
stays sound, and the same command then finishes."""

from __future__ import annotations

import pytest
from reliability_support import GitFaults, cache_problems, cli, one_or_two_lines, record
from sampling import rotating
from test_kill import _rebase_states, _toy_with_new_release

SECTION = "rebase --write interrupted at git calls (tests/reliability/test_kill_rebase.py)"
SAMPLED = 9  # interrupts `make test` tries (rotating by commit); PATCHKIT_SAMPLE=all: every one


@pytest.mark.long
def test_rebase_write_interrupted_at_git_calls(tmp_path):
    toy = _toy_with_new_release(tmp_path / "toy")
    args, reset, after_kill, final, _ = _rebase_states(toy)
    faults = GitFaults.install(tmp_path / "faults")
    reset()
    faults.arm(0, "KILL")
    assert cli(*args, env={**toy.env, **faults.env()}).returncode == 0
    calls = len(faults.calls())
    tried = finished = 0
    points = [(sig, at) for sig in ("KILL", "TERM", "INT") for at in range(1, calls + 1)]
    for sig, at in rotating(points, SAMPLED, salt=11):
        reset()
        faults.arm(at, sig)
        done = cli(*args, env={**toy.env, **faults.env()})
        tried += 1
        verdict = after_kill()
        assert not verdict, f"call {at} {sig}: {verdict}"
        assert not cache_problems(toy.cache), (at, sig)
        if sig != "KILL" and done.returncode == 130:
            assert one_or_two_lines(done.stderr) and "interrupted" in done.stderr
        again = cli(*args, env=toy.env)
        problems = final()
        assert again.returncode in (0, 3) and not problems, (at, sig, again.stderr, problems)
        finished += 1
    record(
        SECTION,
        f"{tried} interrupts over {calls} git calls (of {len(points)}: each call with SIGKILL/"
        f"SIGTERM/SIGINT): 0 torn states, {finished}/{tried} next runs finished",
    )
