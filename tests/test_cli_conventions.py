"""CLI conventions every verb shares: a fast --help that imports no verb, -C, the documented
environment variables and exit codes."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys

import pytest
from helpers import ROOT, patchkit

from patchkit.cli import ENVIRONMENT, EXIT_CODES, SHORT_HELP, VERBS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def test_help_imports_no_verb_module():
    code = (
        "import sys\n"
        "from patchkit.cli import main\n"
        "rc = main(['--help'])\n"
        "heavy = sorted(m for m in sys.modules if m.startswith(('patchkit.commands', "
        "'patchkit.wheels', 'patchkit.abi', 'patchkit.upstream', 'patchkit.gitops', 'rich')))\n"
        "print('HEAVY', heavy)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "HEAVY []" in r.stdout, r.stdout[-400:]
    for verb in VERBS:
        assert re.search(rf"^\s+{verb}\s", r.stdout, re.M), f"{verb} not listed"


def test_every_verb_has_a_help_line():
    assert set(VERBS) <= set(SHORT_HELP)


def test_help_lists_every_environment_variable_the_code_reads():
    used = set()
    for path in (ROOT / "patchkit").rglob("*.py"):
        used |= set(re.findall(r"(?<![A-Z_])PATCHKIT_[A-Z_]+", path.read_text(encoding="utf-8")))
    listed = {name for name, _ in ENVIRONMENT}
    assert used <= listed, f"not in --help: {sorted(used - listed)}"
    out = patchkit("--help").stdout
    for name in used:
        assert name in out
    for code, _ in EXIT_CODES:
        assert re.search(rf"^\s+{code}\s", out, re.M)


def test_dash_c_runs_in_another_directory(tmp_path):
    here = {"PYTHONPATH": str(ROOT)}  # this checkout's patchkit, whatever is installed
    elsewhere = patchkit("-C", str(ROOT), "lint", cwd=tmp_path, env=here)
    assert elsewhere.returncode == 0, elsewhere.stderr
    missing = patchkit("-C", str(tmp_path / "nope"), "lint", cwd=tmp_path, env=here)
    assert missing.returncode == 2
    assert "nope" in missing.stderr and "Traceback" not in missing.stderr


def test_a_mistyped_verb_is_suggested():
    r = patchkit("aply", "--target", "sglang")
    assert r.returncode == 2
    assert "No such command 'aply'; did you mean 'apply'?" in r.stderr, r.stderr
    far = patchkit("xyzzy")
    assert far.returncode == 2 and "did you mean" not in far.stderr


@pytest.mark.parametrize(
    "argv, code, message, close",
    [
        (["apply", "--target", "sglng"], 2, "unknown target 'sglng'", "sglang"),
        (["lint", "--target", "flashinfr"], 2, "unknown target 'flashinfr'", "flashinfer"),
        (["apply", "--target", "sglang@v0.5.9x"], 1, "cannot resolve sglang@v0.5.9x", "v0.5.9"),
        (["apply", "--target", "sglang", "--line", "0.5.99"], 2, "no line '0.5.99'", "0.5.9"),
        (["rebase", "--target", "sglang@0.5.17", "--line", "0.5.13"], 2, "no line", "0.5.23"),
    ],
)
def test_a_mistyped_target_ref_or_line_is_suggested(project, tmp_path, argv, code, message, close):
    r = patchkit(*argv, env={"PATCHKIT_CACHE": str(tmp_path / "cache")})
    assert r.returncode == code, r.stdout + r.stderr
    first = r.stderr.splitlines()[0]
    assert message in first and first.endswith(f"; did you mean '{close}'?"), first


@pytest.mark.parametrize(
    "argv",
    [
        ["apply", "--target", "sglang", "--line", "0.5.12"],
        ["build", "--target", "sglang", "--line", "0.5.12"],
        ["build", "--target", "all", "--line", "0.5.12"],
        ["rebase", "--target", "sglang@0.5.17", "--line", "0.5.12"],
        ["lint", "--line", "0.5.12"],
        # the retired line's release without --line: the line it would choose is retired
        ["apply", "--target", "sglang@0.5.12"],
        ["build", "--target", "sglang@v0.5.12"],
    ],
)
def test_a_retired_line_is_one_line_naming_its_successor(project, tmp_path, argv):
    r = patchkit(*argv, env={"PATCHKIT_CACHE": str(tmp_path / "cache")}, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("patchkit: error: sglang line 0.5.12 is retired: "), line
    assert "use --line 0.5.17" in line and "git show 9b8af9823d2f:" in line, line
    assert not (tmp_path / "cache").exists(), "refused before anything was fetched"


def test_suggestions_come_from_one_place():
    """Every unknown name (verb, target, ref, line) is matched by errors.did_you_mean."""
    users = [
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "patchkit").rglob("*.py")
        if "get_close_matches" in path.read_text(encoding="utf-8")
    ]
    assert users == ["patchkit/errors.py"], users


def test_json_is_one_shared_option():
    """Every verb takes ui.json_option (eager, recording what click parsed); nothing looks for
    the string `--json` in argv."""
    from patchkit import ui
    from patchkit.cli import LazyGroup

    declared = [
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "patchkit").rglob("*.py")
        if '"--json"' in path.read_text(encoding="utf-8")
    ]
    assert declared == ["patchkit/ui.py"], declared
    group = LazyGroup()
    for verb in sorted(set(VERBS) - {"schema"}):
        command = group.get_command(None, verb)
        for leaf in command.commands.values() if hasattr(command, "commands") else [command]:
            (option,) = [p for p in leaf.params if "--json" in p.opts]
            assert option.is_eager and option.callback is ui._record_json, verb


@pytest.mark.parametrize(
    "argv, as_json",
    [
        # --json as an option's value: the verb's error in words, no JSON nobody asked for
        (["import", "x.diff", "--target", "sglang", "--author", "--json"], False),
        (["-C", "--json", "lint"], False),
        (["import", "x.diff", "--target", "sglang", "--author", "--json", "--bogus"], False),
        # --json as an option on a line click refused before parsing it: still one envelope
        (["import", "x.diff", "--target", "sglang", "--json", "--author"], True),
        (["apply", "--json", "--targt", "sglang"], True),
        (["aply", "--json"], True),
        (["rebase", "--target", "sglang@0.5.9", "--new-line", "--json"], True),
        (["apply", "--fuzz", "9", "--json", "--target", "sglang"], True),
    ],
)
def test_json_mode_is_the_option_not_the_string(project, tmp_path, argv, as_json):
    r = patchkit(*argv, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    if as_json:
        document = json.loads(r.stdout)
        assert (document["ok"], document["exit_code"]) == (False, 2), document
    else:
        assert r.stdout == "" and "Traceback" not in r.stderr, r.stdout


def test_schema_prints_the_packaged_file_the_code_names():
    """`ui.py` named patchkit/schemas/envelope.json, a file that never existed."""
    from patchkit import ui

    shipped = ROOT / "patchkit" / "schemas" / ui.SCHEMA_FILE
    assert patchkit("schema").stdout == shipped.read_text(encoding="utf-8").rstrip("\n") + "\n"
    texts = [p.read_text(encoding="utf-8") for p in (ROOT / "patchkit").rglob("*.py")]
    texts += [p.read_text(encoding="utf-8") for p in (ROOT / "docs").glob("*.md")]
    named = {n for text in texts for n in re.findall(r"patchkit/schemas/([\w.-]+\.json)", text)}
    assert named and all((ROOT / "patchkit" / "schemas" / n).is_file() for n in named), named
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = package_data["tool"]["setuptools"]["package-data"]["patchkit"]
    assert any(fnmatch.fnmatch(f"schemas/{ui.SCHEMA_FILE}", g) for g in globs), globs
