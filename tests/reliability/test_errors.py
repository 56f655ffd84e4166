"""User-facing failures: one or two lines with the cause and the next step; a traceback only
with --debug."""

from __future__ import annotations

import make_corpus
from reliability_support import cli, one_or_two_lines, record


def test_traceback_only_with_debug(toy):
    hostile = make_corpus.patch_cases()["p03-dotdot-header"][1]
    toy.write_series({"toy-01.patch": toy.patches["toy-01.patch"], "hostile.patch": hostile})
    args = ("apply", "--target", "toy", "--into", str(toy.root / "wt"))
    plain = cli(*args, env=toy.env)
    debug = cli("--debug", *args, env=toy.env)
    assert plain.returncode == 1 and one_or_two_lines(plain.stderr), plain.stderr
    assert "hostile.patch" in plain.stderr and "Traceback" not in plain.stderr
    assert "Traceback" in debug.stderr and "PatchFormatError" in debug.stderr
    record(
        "clear errors (tests/reliability/test_errors.py)",
        "hostile patch: one line without --debug, a traceback with --debug",
    )


def test_lock_timeout_and_internal_errors_are_one_or_two_lines(tmp_path):
    from patchkit.cli import _one_line

    assert _one_line("first\n  second\n\nthird") == "first second third"
    done = cli("apply", "--target", "nosuch", env={"PATCHKIT_PROJECT": str(tmp_path)})
    assert done.returncode != 0 and one_or_two_lines(done.stderr), done.stderr
