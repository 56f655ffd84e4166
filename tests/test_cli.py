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


def _complete(words: str, **kwargs) -> list[str]:
    """What the shell would offer for the last word of `words` (click's bash protocol)."""
    env = {"_PATCHKIT_COMPLETE": "bash_complete", "COMP_WORDS": words}
    env["COMP_CWORD"] = str(len(words.split()) - (0 if words.endswith(" ") else 1))
    result = patchkit(env={**env, **kwargs.pop("env", {})}, **kwargs)
    assert result.returncode == 0, result.stderr
    return [line.split(",", 1)[1] for line in result.stdout.splitlines() if line]


def test_completion_offers_the_projects_targets_refs_lines_and_profiles(project):
    assert _complete("patchkit apply --target ") == ["sglang", "flashinfer", "all"]
    assert _complete("patchkit apply --target sglang@v0.5.2") == ["sglang@v0.5.23"]
    assert _complete("patchkit build --target flashinfer --line ") == ["0.6.3", "0.6.15.post1"]
    assert "0.5.17" in _complete("patchkit lint --line 0.5.1")
    assert _complete("patchkit verify --profile cu130-sm90-0.5.2") == ["cu130-sm90-0.5.23"]
    assert _complete("patchkit build --profile cu130-sm120-") == [
        "cu130-sm120-0.5.17",
        "cu130-sm120-0.5.23",
    ]


def test_completion_reads_the_project_named_by_C(project, tmp_path):
    other = tmp_path / "other"
    (other / "patches").mkdir(parents=True)
    (other / "patches" / "targets.toml").write_text(
        (project / "patches" / "targets.toml").read_text().replace("targets.sglang", "targets.sgx")
    )
    offered = _complete(f"patchkit -C {other} rebase --target ", env={"PATCHKIT_PROJECT": ""})
    assert offered[:2] == ["sgx", "flashinfer"]


def test_completion_in_a_broken_project_offers_nothing_and_no_error(project):
    (project / "patches" / "targets.toml").write_text("[targets.sglang\n")
    assert _complete("patchkit apply --target ") == []
    assert _complete("patchkit lint --line ") == []
