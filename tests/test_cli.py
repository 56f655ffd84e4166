"""CLI behaviour users script against: exit codes, one-line errors, --debug tracebacks."""

from __future__ import annotations

from helpers import patchkit


def test_help_lists_every_verb():
    out = patchkit("--help").stdout
    for verb in (
        "apply",
        "status",
        "fetch",
        "build",
        "inspect",
        "verify",
        "rebase",
        "export",
        "lint",
        "review",
    ):
        assert verb in out


def test_usage_error_exit_2():
    result = patchkit("apply", "--target", "nosuch@1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[0].startswith("patchkit: error: unknown target")
    assert "Traceback" not in result.stderr


def test_bad_option_exit_2():
    assert patchkit("apply", "--fuzz", "9", "--target", "sglang").returncode == 2


def test_debug_shows_traceback():
    result = patchkit("--debug", "apply", "--target", "nosuch@1")
    assert "Traceback" in result.stderr


def test_broken_targets_file_is_one_line(project):
    (project / "patches" / "targets.toml").write_text("[series\n")
    result = patchkit("apply", "--target", "sglang")
    assert result.returncode == 2
    assert "not valid TOML" in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2
