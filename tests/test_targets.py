"""targets.toml parsing and ref resolution."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import ROOT

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


def test_real_lines(workspace):
    sglang = workspace.target("sglang")
    assert sglang.line_names == ["0.5.9", "0.5.17", "0.5.23"]
    assert (sglang.line, sglang.pin, sglang.default_line) == ("0.5.9", "0.5.9", "0.5.9")  # seed
    real = load_targets(ROOT / "patches" / "targets.toml").get("sglang")  # the project's own
    assert (real.line, real.pin, real.default_line) == ("0.5.23", "0.5.23", "0.5.23")
    new = sglang.on_line("0.5.17")
    assert (new.line, new.pin, new.current_line.series) == ("0.5.17", "0.5.17", "sglang/0.5.17")
    assert new.pinned.sdist is None and new.pinned.commit is None
    assert {w.python_tag for w in new.pinned.wheels} == {"cp311", "cp312"}
    assert all(w.platform_tag == "manylinux_2_34_x86_64" for w in new.pinned.wheels)
    assert workspace.series("sglang").names  # the default line's series
    assert workspace.project.series_dir("sglang", "0.5.17").name == "0.5.17"
    assert sglang.companion("0.5.17", "flashinfer") == "0.6.15.post1"
    assert sglang.companion("0.5.9", "flashinfer") == "0.6.3"
    with pytest.raises(UsageError, match="no line '0.6'.*lines: 0.5.9, 0.5.17"):
        sglang.on_line("0.6")


def test_pick_line_by_ref(workspace):
    from patchkit.lines import pick_line

    sglang = workspace.target("sglang")
    assert pick_line(sglang, "v0.5.17", None).line == "0.5.17"
    assert pick_line(sglang, "0.5.9", None).line == "0.5.9"
    assert pick_line(sglang, PIN[:10], None).line == "0.5.9"
    assert pick_line(sglang, None, None).line == "0.5.9"
    assert pick_line(sglang, None, "0.5.17").line == "0.5.17"
    with pytest.raises(UsageError, match="line 0.5.9 is pinned to 0.5.9"):
        pick_line(sglang, "0.5.17", "0.5.9")
    assert pick_line(sglang, "deadbeef" * 5, None).line == "0.5.9"  # unpinned: default line
    moved = dataclasses.replace(sglang, lines=sglang.lines[:1])  # no line pinned to 0.5.17
    with pytest.raises(UsageError, match=r"release 0.5.17, which no line.*lines: 0.5.9 \(pin"):
        pick_line(moved, "0.5.17", None)


def test_the_retired_line_names_its_successor_and_commit(workspace):
    """The 0.5.12 line is retired for 0.5.17: asking for it by name, or for its release
    without --line, is one line naming the line to use and the commit holding its series."""
    from patchkit.lines import check_line_names, pick_line

    sglang = workspace.target("sglang")
    (old,) = sglang.retired
    assert (old.name, old.pin, old.successor) == ("0.5.12", "0.5.12", "0.5.17")
    assert "0.5.12" not in sglang.line_names
    assert sglang.release("0.5.12").wheels  # the release stays pinned
    short = old.last_commit[:12]
    for refuse in (
        lambda: sglang.on_line("0.5.12"),
        lambda: pick_line(sglang, "0.5.12", None),
        lambda: pick_line(sglang, "v0.5.12", None),
        lambda: pick_line(sglang, None, "0.5.12"),
        lambda: check_line_names([sglang, workspace.target("flashinfer")], ["0.5.12"]),
    ):
        with pytest.raises(UsageError) as info:
            refuse()
        message = info.value.message
        assert "\n" not in message and info.value.hint is None
        assert message.startswith("sglang line 0.5.12 is retired: ")
        assert "use --line 0.5.17" in message and f"git show {short}:" in message


HEAD = "[series]\nversion='1.0.0'\n"
REL = "[[targets.a.releases]]\nversion='1'\ncommit='" + "a" * 40 + "'\n"
LINE_X = "[targets.a]\ngit='u'\n[targets.a.lines.x]\npin='1'\n"
RETIRED = "[targets.a.lines.y]\npin='1'\nretired='{successor}'\nwhy='w'\nlast_commit='{commit}'\n"
# target b: line 1 carried, line 3 retired for it; no line 2
TARGET_B = (
    "[targets.b]\ngit='u'\n[targets.b.lines.'1']\npin='1'\n"
    "[targets.b.lines.'3']\npin='1'\nretired='1'\nwhy='w'\nlast_commit='" + "b" * 40 + "'\n"
    "[[targets.b.releases]]\nversion='1'\ncommit='" + "b" * 40 + "'\n"
)


@pytest.mark.parametrize(
    "text, words",
    [
        ("targets = 3\n" + HEAD, "'targets' must be a table"),
        (HEAD + "[targets]\na = 1\n", "targets.a must be a table"),
        (HEAD + '[targets."../.."]\ngit="u"\npin="1"\n', "target name '../..'"),
        (HEAD + "[targets.a]\ngit=1\npin='1'\n" + REL, "git must be a string"),
        (HEAD + "[targets.a]\ngit='u'\npin='1'\n" + REL + REL, "release 1 is listed twice"),
        (HEAD + "[targets.a]\ngit='u'\npin='1'\nreleases=3\n", "releases must be"),
        (
            HEAD + "[targets.a]\ngit='u'\n[targets.a.lines.'x/..']\npin='1'\n" + REL,
            "line name 'x/..'",
        ),
        (
            HEAD + "[targets.a]\ngit='u'\n[targets.a.lines.x]\npin='1'\nseries='../b'\n" + REL,
            "must stay inside patches/",
        ),
        (
            HEAD + "[targets.a]\ngit='u'\ndefault_line='y'\n[targets.a.lines.x]\npin='1'\n" + REL,
            "default_line 'y' is not one of its lines",
        ),
        (
            HEAD + "[targets.a]\ngit='u'\n[targets.a.lines.x]\npin='2'\n" + REL,
            "line x of a: pin 2 has no",
        ),
        (
            HEAD + "[targets.a]\ngit='u'\npin='1'\n[[targets.a.releases]]\nversion='1'\n"
            "wheels=[{file='a-1-py3-none-any.whl', sha256='x'}]\n",
            "bad sha256",
        ),
        (HEAD + "[targets.a]\ngit='--upload-pack=touch x'\npin='1'\n" + REL, "not a repository"),
        (HEAD + "[targets.a]\ngit='ext::sh -c x'\npin='1'\n" + REL, "not a repository"),
        (HEAD + "[targets.a]\ngit='u'\npin='1'\n" + REL + "tag='-v1'\n", "not a plain git tag"),
        (HEAD + "[targets.a]\ngit='u'\npin='1'\n" + REL + "tag='a..b'\n", "not a plain git tag"),
        (
            HEAD + "[targets.a]\ngit='u'\npin='1'\n[[targets.a.releases]]\nversion='1'\n"
            f"wheels=[{{file='a-2-py3-none-any.whl', sha256='{'0' * 64}'}}]\n",
            "is version 2, not 1",
        ),
        (
            HEAD + "[targets.a]\ngit='u'\npin='1'\n[[targets.a.releases]]\nversion='1'\n"
            f"wheels=[{{file='../a-1-py3-none-any.whl', sha256='{'0' * 64}'}}]\n",
            "bare file name",
        ),
        # `$` would match before a final newline: each value must end where its pattern does
        (HEAD + '[targets."a\\n"]\ngit="u"\npin="1"\n', "target name"),
        (HEAD + "[targets.a]\ngit='u'\npin='1'\n" + REL + 'tag="v1\\n"\n', "not a plain git tag"),
        (
            HEAD + "[targets.a]\ngit='u'\npin='1'\n[[targets.a.releases]]\nversion='1'\n"
            f'commit="{"a" * 40}\\n"\n',
            "commit",
        ),
        (
            HEAD + "[targets.a]\ngit='u'\npin='1'\n" + REL + 'sdist="a==1\\n"\n',
            "sdist",
        ),
        # a retired line names a carried successor and the full commit holding its series
        (
            HEAD + LINE_X + RETIRED.format(successor="z", commit="a" * 40) + REL,
            "retired names 'z', not a carried line of a",
        ),
        (
            HEAD + LINE_X + RETIRED.format(successor="y", commit="a" * 40) + REL,
            "retired names 'y', not a carried line of a",
        ),
        (
            HEAD + LINE_X + RETIRED.format(successor="x", commit="a" * 12) + REL,
            "last_commit must be a full commit id",
        ),
        (
            HEAD
            + LINE_X
            + RETIRED.format(successor="x", commit="a" * 40).replace("why='w'\n", "")
            + REL,
            "lacks 'why'",
        ),
        (
            HEAD + "[targets.a]\ngit='u'\n" + RETIRED.format(successor="x", commit="a" * 40) + REL,
            "[targets.a] has no line that is not retired",
        ),
        # `with` names a carried line of an existing target
        (HEAD + LINE_X + "with={b='1'}\n" + REL, "with names b line '1', which is not a carried"),
        (
            HEAD + LINE_X + "with={b='2'}\n" + REL + TARGET_B,
            "with names b line '2', which is not a carried",
        ),
        (
            HEAD + LINE_X + "with={b='3'}\n" + REL + TARGET_B,
            "with names b line '3', which is not a carried",
        ),
        (HEAD + LINE_X + "with={b=1}\n" + REL, "with must map targets to line names"),
    ],
)
def test_bad_targets_are_one_line_errors(tmp_path, text, words):
    path = tmp_path / "targets.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace(".", r"\.")) as info:
        load_targets(path)
    assert "\n" not in info.value.message


def test_quoted_line_names_and_wheel_only_release(tmp_path):
    path = tmp_path / "targets.toml"
    path.write_text(
        HEAD
        + "[targets.a]\ngit='u'\ndefault_line='1.0'\n"
        + "[targets.a.lines.\"1.0\"]\npin='1.0'\n[targets.a.lines.'2.0']\npin='2.0'\n"
        + "[[targets.a.releases]]\nversion='1.0'\ncommit='"
        + "a" * 40
        + "'\n[[targets.a.releases]]\nversion='2.0'\n"
        + f"wheels=[{{file='a-2.0-cp312-cp312-linux_x86_64.whl', sha256='{'1' * 64}'}}]\n"
    )
    a = load_targets(path).get("a")
    assert a.line_names == ["1.0", "2.0"]
    assert a.on_line("2.0").current_line.series == "a/2.0"
    assert a.on_line("2.0").pinned.base_wheel.python_tag == "cp312"


def test_retired_lines_and_companions_load(tmp_path):
    path = tmp_path / "targets.toml"
    path.write_text(
        HEAD
        + LINE_X
        + "with={b='1'}\n"
        + RETIRED.format(successor="x", commit="c" * 40)
        + REL
        + TARGET_B
    )
    targets = load_targets(path)
    a = targets.get("a")
    assert a.line_names == ["x"] and a.companion("x", "b") == "1"
    assert [(r.name, r.successor, r.last_commit) for r in a.retired] == [("y", "x", "c" * 40)]
    with pytest.raises(UsageError, match=r"a line y is retired: w; use --line x .*git show c{12}:"):
        a.on_line("y")
    assert targets.get("b").line_names == ["1"]
