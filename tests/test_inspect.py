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


# --- crafted wheels and special files: a clear error, never a hang or exit 70 ---------------

import base64  # noqa: E402
import hashlib  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from helpers import ROOT  # noqa: E402

MODULE = "tiny/__init__.py"


def _hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _tiny_wheel(
    path: Path,
    *,
    metadata: bytes = b"Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n",
    provenance: bytes | None = None,
    module: bytes = b"VALUE = 1\n" * 50,
    compression: int = zipfile.ZIP_STORED,
) -> Path:
    """A small, valid wheel (RECORD lists every member with its hash)."""
    di = "tiny-1.0.dist-info"
    members = {MODULE: module, f"{di}/METADATA": metadata, f"{di}/WHEEL": b"Wheel-Version: 1.0\n"}
    if provenance is not None:
        members[f"{di}/patchkit.json"] = provenance
    record = "".join(f"{n},{_hash(d)},{len(d)}\n" for n, d in members.items())
    record += f"{di}/RECORD,,\n"
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr(f"{di}/RECORD", record)
    return path


def _patch_headers(path: Path, member: str, offset_local: int, offset_central: int, value: int):
    """Overwrite a 2-byte field of `member`'s local and central headers (crafting)."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    for sig, off in ((b"PK\x03\x04", offset_local), (b"PK\x01\x02", offset_central)):
        start = 0
        while (pos := data.find(sig, start)) >= 0:
            name_at = pos + (30 if sig == b"PK\x03\x04" else 46)
            if data[name_at : name_at + len(name)] == name:
                struct.pack_into("<H", data, pos + off, value)
            start = pos + 4
    path.write_bytes(bytes(data))


def _overstated_size(path: Path) -> None:
    """The member's headers claim 100 bytes more than its data holds (zipfile reads the data
    to its end and says nothing)."""
    with zipfile.ZipFile(path) as zf:
        size = zf.getinfo(MODULE).file_size
    _patch_headers(path, MODULE, 22, 24, size + 100)  # the low half of the 4-byte size


def _bad_crc(path: Path) -> None:
    data = bytearray(path.read_bytes())
    pos = data.find(b"VALUE = 1")
    data[pos] ^= 0x20
    path.write_bytes(bytes(data))


def _inspect(wheel: Path, timeout: float = 60):
    return subprocess.run(
        [sys.executable, "-m", "patchkit", "inspect", str(wheel)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _one_clear_line(result) -> bool:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    return (
        result.returncode in (1, 2)
        and 1 <= len(lines) <= 2
        and all(ln.startswith("patchkit: ") for ln in lines)
        and "internal error" not in result.stderr
        and "Traceback" not in result.stderr
    )


def test_tiny_wheel_is_valid(tmp_path):
    result = _inspect(_tiny_wheel(tmp_path / "tiny-1.0-py3-none-any.whl"))
    assert result.returncode == 3, result.stdout + result.stderr  # intact, no provenance
    assert "all match" in result.stdout


CRAFTED = {
    "bad CRC": (lambda p: (_tiny_wheel(p), _bad_crc(p)), "Bad CRC"),
    "size overstated": (
        lambda p: (_tiny_wheel(p), _overstated_size(p)),
        "smaller than its header says",
    ),
    "encrypted member": (
        lambda p: (_tiny_wheel(p), _patch_headers(p, MODULE, 6, 8, 0x1)),
        "is encrypted",
    ),
    "unknown compression": (
        lambda p: (_tiny_wheel(p), _patch_headers(p, MODULE, 8, 10, 99)),
        "unknown compression method 99",
    ),
    "Latin-1 METADATA": (
        lambda p: _tiny_wheel(p, metadata=b"Metadata-Version: 2.1\nName: caf\xe9\nVersion: 1\n"),
        "METADATA is not UTF-8",
    ),
    "huge METADATA": (
        lambda p: _tiny_wheel(
            p,
            metadata=b"Name: tiny\nVersion: 1.0\n"
            + random.Random(1).randbytes(5 << 20).hex().encode(),
            compression=zipfile.ZIP_DEFLATED,
        ),
        "limit",
    ),
    "METADATA without Name": (
        lambda p: _tiny_wheel(p, metadata=b"Metadata-Version: 2.1\n"),
        "lacks Name or Version",
    ),
    "provenance: a list": (lambda p: _tiny_wheel(p, provenance=b"[1, 2]"), "not a JSON object"),
    "provenance: profile a list": (
        lambda p: _tiny_wheel(p, provenance=b'{"profile": [1], "tools": {}}'),
        "'profile' is not an object",
    ),
    "provenance: patches of numbers": (
        lambda p: _tiny_wheel(p, provenance=b'{"series": {"patches": [1, 2]}}'),
        "is not an object",
    ),
    "provenance: epoch a string": (
        lambda p: _tiny_wheel(p, provenance=b'{"source_date_epoch": "soon"}'),
        "not an integer",
    ),
    "provenance: tools of lists": (
        lambda p: _tiny_wheel(p, provenance=b'{"tools": {"git": [1]}}'),
        "'tools' values",
    ),
    "provenance: not UTF-8": (lambda p: _tiny_wheel(p, provenance=b'{"a": "\xff"}'), "UTF-8"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_wheel_gives_a_clear_error(tmp_path, case):
    make, words = CRAFTED[case]
    wheel = tmp_path / "tiny-1.0-py3-none-any.whl"
    make(wheel)
    result = _inspect(wheel)
    assert _one_clear_line(result), result.stdout + result.stderr
    assert words in result.stderr, result.stderr


def test_fifo_as_wheel_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "tiny-1.0-py3-none-any.whl"
    os.mkfifo(fifo)
    result = _inspect(fifo, timeout=30)
    assert _one_clear_line(result) and "is a FIFO" in result.stderr, result.stderr


def test_fifo_in_an_installed_distribution_is_reported(tmp_path):
    """A RECORD entry that is a FIFO is reported as `special`, not read (which would hang)."""
    site = tmp_path / "site"
    wheel = _tiny_wheel(tmp_path / "tiny-1.0-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    (site / MODULE).unlink()
    os.mkfifo(site / MODULE)
    result = subprocess.run(
        [sys.executable, "-m", "patchkit", "inspect", "--installed", "tiny", "--path", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "special" in result.stdout and MODULE in result.stdout
    os.unlink(site / "tiny-1.0.dist-info" / "RECORD")
    os.mkfifo(site / "tiny-1.0.dist-info" / "RECORD")
    result = subprocess.run(
        [sys.executable, "-m", "patchkit", "inspect", "--installed", "tiny", "--path", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert _one_clear_line(result) and "is a FIFO" in result.stderr, result.stderr


def test_installed_console_script_finds_the_distribution_in_the_active_virtualenv(sglang_site):
    """patchkit runs from its own venv (`make install`); the README's `patchkit inspect
    --installed sglang` after `pip install` into the user's activated venv must look there."""
    import os
    import subprocess
    import sys

    from helpers import ROOT

    script = Path(sys.executable).parent / "patchkit"
    if not script.exists():
        pytest.skip(f"no installed patchkit console script beside {sys.executable}")
    venv = sglang_site.parents[2]
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [str(script), "inspect", "--installed", "sglang"]
    active = subprocess.run(
        cmd, env={**env, "VIRTUAL_ENV": str(venv)}, capture_output=True, text=True, cwd=ROOT
    )
    assert active.returncode == 0, active.stderr
    assert f"(installed: {sglang_site})" in active.stdout
    inactive = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert inactive.returncode == 2
    assert "--path SITE_PACKAGES" in inactive.stderr
