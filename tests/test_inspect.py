"""`patchkit inspect`: a wheel's and an installed distribution's provenance, and files changed
after install."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from helpers import patchkit, result_of

from patchkit.wheels.reproducible import record_hash

pytest_plugins = ["wheel_fixtures"]
SERVER_ARGS = "sglang/srt/server_args.py"


@pytest.mark.slow
def test_inspect_installed_reports_the_series_and_exits_0(sglang_site, sglang_wheel, workspace):
    result = patchkit("inspect", "--installed", "sglang", "--path", str(sglang_site))
    assert result.returncode == 0, result.stdout + result.stderr
    version = sglang_wheel.report["wheels"][0]["version"]
    assert f"sglang {version} (installed: {sglang_site})" in result.stdout
    assert f"sglang series {workspace.targets.series_version}" in result.stdout
    for name in sglang_wheel.report["wheels"][0]["series"]["patches"]:
        assert name in result.stdout
    assert "all match" in result.stdout
    assert "sboms/patchkit.cdx.json" in result.stdout


@pytest.mark.slow
def test_inspect_installed_json(sglang_site, sglang_wheel):
    result = patchkit("inspect", "--installed", "sglang", "--path", str(sglang_site), "--json")
    assert result.returncode == 0
    doc = result_of(result.stdout)
    assert doc["status"] == "ok"
    assert doc["problems"] == []
    assert doc["files_checked"] > 1000
    assert doc["provenance"]["series"]["hash"] == sglang_wheel.report["wheels"][0]["series"]["hash"]


@pytest.mark.slow
def test_an_edited_installed_file_exits_1_and_is_named(sglang_site):
    path = sglang_site / SERVER_ARGS
    original = path.read_bytes()
    added = sglang_site / "sglang" / "overlay_fix.py"
    try:
        path.write_bytes(original.replace(b"import argparse", b"import argparse  # sed", 1))
        result = patchkit("inspect", "--installed", "sglang", "--path", str(sglang_site))
        assert result.returncode == 1
        assert f"changed  {SERVER_ARGS}" in result.stdout
        assert "MODIFIED: 1 of the files" in result.stdout

        added.write_text("x = 1\n")
        doc = result_of(
            patchkit(
                "inspect", "--installed", "sglang", "--path", str(sglang_site), "--json"
            ).stdout
        )
        assert doc["status"] == "modified"
        assert {(p["path"], p["problem"]) for p in doc["problems"]} == {
            (SERVER_ARGS, "changed"),
            ("sglang/overlay_fix.py", "added"),
        }
    finally:
        path.write_bytes(original)
        added.unlink(missing_ok=True)
    assert patchkit("inspect", "--installed", "sglang", "--path", str(sglang_site)).returncode == 0


@pytest.mark.slow
def test_inspect_wheel_and_a_tampered_wheel(sglang_wheel, tmp_path, workspace):
    result = patchkit("inspect", str(sglang_wheel.path))
    assert result.returncode == 0, result.stderr
    assert f"sglang series {workspace.targets.series_version}" in result.stdout
    assert "upstream  0.5.9 (commit bbe9c7eeb520b0a67e92d133dfc137a3688dc7f2" in result.stdout

    tampered = tmp_path / sglang_wheel.path.name
    with zipfile.ZipFile(sglang_wheel.path) as zin, zipfile.ZipFile(tampered, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == SERVER_ARGS:
                data += b"# edited\n"
            zout.writestr(info, data)
    result = patchkit("inspect", str(tampered))
    assert result.returncode == 1
    assert f"changed  {SERVER_ARGS}" in result.stdout


def _plain_dist(site: Path) -> None:
    """An installed distribution that patchkit did not build (no patchkit.json)."""
    (site / "plain").mkdir(parents=True)
    body = b"VALUE = 1\n"
    (site / "plain" / "__init__.py").write_bytes(body)
    meta = site / "plain-1.0.dist-info"
    meta.mkdir()
    metadata = b"Metadata-Version: 2.1\nName: plain\nVersion: 1.0\n"
    (meta / "METADATA").write_bytes(metadata)
    (meta / "RECORD").write_text(
        f"plain/__init__.py,{record_hash(body)},{len(body)}\n"
        f"plain-1.0.dist-info/METADATA,{record_hash(metadata)},"
        f"{len(metadata)}\nplain-1.0.dist-info/RECORD,,\n"
    )


def test_a_distribution_without_provenance_exits_3(tmp_path):
    _plain_dist(tmp_path)
    result = patchkit("inspect", "--installed", "plain", "--path", str(tmp_path))
    assert result.returncode == 3, result.stderr
    assert "no patchkit provenance" in result.stdout

    wheel = tmp_path / "plain-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for rel in (
            "plain/__init__.py",
            "plain-1.0.dist-info/METADATA",
            "plain-1.0.dist-info/RECORD",
        ):
            zf.write(tmp_path / rel, rel)
    assert patchkit("inspect", str(wheel)).returncode == 3


def test_usage_errors(tmp_path):
    assert patchkit("inspect").returncode == 2
    assert patchkit("inspect", "x.whl", "--installed", "sglang").returncode == 2
    missing = patchkit("inspect", "--installed", "not-there", "--path", str(tmp_path))
    assert missing.returncode == 2
    assert "no installed distribution 'not-there'" in missing.stderr
    assert patchkit("inspect", str(tmp_path / "nope.whl")).returncode == 2
