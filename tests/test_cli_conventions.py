"""CLI conventions every verb shares: a fast --help that imports no verb, -C, the documented
environment variables and exit codes."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import ROOT, patchkit

from patchkit.cli import ENVIRONMENT, EXIT_CODES, SHORT_HELP, VERBS


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
        (["rebase", "--target", "sglang@0.5.12", "--line", "0.5.13"], 2, "no line", "0.5.12"),
    ],
)
def test_a_mistyped_target_ref_or_line_is_suggested(project, tmp_path, argv, code, message, close):
    r = patchkit(*argv, env={"PATCHKIT_CACHE": str(tmp_path / "cache")})
    assert r.returncode == code, r.stdout + r.stderr
    first = r.stderr.splitlines()[0]
    assert message in first and first.endswith(f"; did you mean '{close}'?"), first


def test_suggestions_come_from_one_place():
    """Every unknown name (verb, target, ref, line) is matched by errors.did_you_mean."""
    users = [
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "patchkit").rglob("*.py")
        if "get_close_matches" in path.read_text(encoding="utf-8")
    ]
    assert users == ["patchkit/errors.py"], users
