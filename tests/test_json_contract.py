"""One `--json` contract: every verb prints one envelope document (schema version, command,
ok, exit code, result, error), errors included, valid against `patchkit schema`."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import patchkit
from jsonschema import Draft202012Validator

from patchkit.cli import VERBS

SCHEMA = json.loads(patchkit("schema").stdout)
VALIDATOR = Draft202012Validator(SCHEMA)


def envelope(proc, command: str) -> dict:
    """The one document on stdout, validated; its command and exit code match the process."""
    document = json.loads(proc.stdout)  # exactly one JSON value, nothing else on stdout
    errors = sorted(VALIDATOR.iter_errors(document), key=lambda e: e.path)
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
    assert document["command"] == command
    assert document["exit_code"] == proc.returncode
    return document


def test_schema_is_a_valid_json_schema():
    Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize(
    "command, argv",
    [
        ("lint", ["lint", "--no-reexport"]),
        ("review", ["review", "--no-diff", "--target", "flashinfer"]),
        ("fetch", ["fetch", "--target", "flashinfer"]),
        ("rebase", ["rebase", "--target", "flashinfer@0.6.3"]),
        ("inspect", ["inspect", "--installed", "click"]),
        ("verify", ["verify", "--env", sys.prefix]),
        ("cache", ["cache"]),
    ],
)
def test_successful_runs_print_one_valid_envelope(cache, command, argv):
    r = patchkit(*argv, "--json")
    doc = envelope(r, command)
    assert doc["error"] is None and doc["result"] is not None
    assert doc["ok"] == (r.returncode in (0, 3))


def test_apply_status_export_of_one_checkout(tmp_path, cache):
    into = tmp_path / "fi"
    doc = envelope(
        patchkit("apply", "--target", "flashinfer", "--into", str(into), "--json"), "apply"
    )
    assert doc["ok"] and doc["result"]["reports"][0]["status"] == "applied"
    again = envelope(
        patchkit("apply", "--target", "flashinfer", "--into", str(into), "--json"), "apply"
    )
    assert again["exit_code"] == 3 and again["ok"]
    assert envelope(patchkit("status", str(into), "--json"), "status")["ok"]
    exported = envelope(patchkit("export", str(into), "--dry-run", "--json"), "export")
    assert exported["exit_code"] == 0


def test_nothing_to_do_is_ok_without_an_error(project):
    """Exit 3 is not a failure: `ok` true, `error` null (`rebase --abort` said `ok: false`)."""
    for flag in ("--abort", "--continue"):
        r = patchkit("rebase", flag, "--json")
        doc = envelope(r, "rebase")
        assert (doc["exit_code"], doc["ok"], doc["error"]) == (3, True, None), doc
        assert r.stderr == "patchkit: no rebase in progress\n"


@pytest.mark.parametrize("verb", sorted(set(VERBS) - {"schema"}))
def test_errors_are_envelopes_too(cache, tmp_path, verb):
    """A failure the user caused: exit 2 (or 1), stdout one error envelope, stderr one line."""
    argv = {
        "apply": ["apply", "--target", "nope"],
        "status": ["status", str(tmp_path / "missing")],
        "fetch": ["fetch", "--target", "nope"],
        "build": ["build", "--target", "nope"],
        "inspect": ["inspect", str(tmp_path / "missing.whl")],
        "verify": ["verify", "--env", str(tmp_path / "missing")],
        "rebase": ["rebase", "--target", "nope@1"],
        "outlook": ["outlook", "--target", "nope"],
        "export": ["export", str(tmp_path / "missing")],
        "lint": ["lint", "--target", "nope"],
        "review": ["review", "--target", "nope"],
        "import": ["import", str(tmp_path / "missing.diff"), "--target", "sglang"],
        "cache": ["cache", "--older-than", "0"],
        "doctor": [
            "doctor",
            "draft",
            "--draft",
            str(tmp_path / "d"),
            "--target-config",
            str(tmp_path / "t"),
        ],
    }[verb]
    r = patchkit(*argv, "--json")
    assert r.returncode in (1, 2), r.stdout + r.stderr
    doc = envelope(r, verb)
    assert doc["ok"] is False and doc["error"]["message"]
    assert "Traceback" not in r.stderr
