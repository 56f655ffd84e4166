"""targets.toml parsing and ref resolution."""

from __future__ import annotations

import pytest

from patchkit.errors import ConfigError, UsageError
from patchkit.targets import bump_version, load_targets, parse_target_spec

PIN = "bbe9c7eeb520b0a67e92d133dfc137a3688dc7f2"


def test_real_targets(workspace):
    sglang = workspace.target("sglang")
    assert sglang.pinned.commit == PIN
    assert sglang.subdir == "python"
    assert sglang.release("v0.5.9") is sglang.pinned
    assert sglang.release("0.5.9") is sglang.pinned
    assert workspace.target("flashinfer").pinned.commit.startswith("d0886ce2")
    with pytest.raises(UsageError, match="unknown target 'vllm'"):
        workspace.target("vllm")


@pytest.mark.parametrize(
    "spec, target, ref",
    [("sglang@v0.5.9", "sglang", "v0.5.9"), ("sglang", "sglang", None), ("all", "all", None)],
)
def test_parse_target_spec(spec, target, ref):
    parsed = parse_target_spec(spec)
    assert (parsed.target, parsed.ref) == (target, ref)


@pytest.mark.parametrize("spec", ["@v1", "sglang@", ""])
def test_bad_target_spec(spec):
    with pytest.raises(UsageError):
        parse_target_spec(spec)


@pytest.mark.parametrize(
    "text, words",
    [
        ("[series]\nversion='x'\n", "not a version"),
        ("[series\n", "not valid TOML"),
        ("[series]\nversion='1.0.0'\n[targets.a]\ngit='u'\npin='1'\n", "has no [[releases]]"),
        (
            "[series]\nversion='1.0.0'\n[targets.a]\ngit='u'\npin='1'\n[[targets.a.releases]]\n"
            "version='1'\ncommit='xyz'\n",
            "bad commit",
        ),
        ("[series]\nversion='1.0.0'\n[targets.a]\ngit='u'\nsubdir='../x'\npin='1'\n", "inside"),
    ],
)
def test_bad_targets_file(tmp_path, text, words):
    path = tmp_path / "targets.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words.replace("[", r"\[")):
        load_targets(path)


def test_bump_version():
    assert bump_version("0.1.0") == "0.2.0"
    assert bump_version("0.1.0", "patch") == "0.1.1"
    assert bump_version("1.2.3", "major") == "2.0.0"
