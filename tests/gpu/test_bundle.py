"""CPU checks of the GPU tier's bundle builder (gpu/bundle.py) and its manifest (gpu/bundle.toml).

Real zip wheels are built here; no download, no GPU.
"""

from __future__ import annotations

import hashlib
import re
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "gpu"))

import bundle  # noqa: E402

from patchkit.wheels.reproducible import check_record  # noqa: E402


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


KERNEL = {
    "name": "sglang_kernel",
    "version": "0.4.2.post2",
    "local": "sm90",
    "drop": [
        {"pattern": "sgl_kernel/flash_ops.abi3.so", "why": "fa3"},
        {"pattern": "sgl_kernel/sm100/*", "why": "sm100"},
    ],
}
INFO = "sglang_kernel-0.4.2.post2.dist-info"
METADATA = b"Metadata-Version: 2.1\nName: sglang-kernel\nVersion: 0.4.2.post2\n"


def _kernel_wheel(tmp_path: Path) -> Path:
    return _wheel(
        tmp_path / "sglang_kernel-0.4.2.post2-cp310-abi3-manylinux2014_x86_64.whl",
        {
            "sgl_kernel/__init__.py": b"x = 1\n",
            "sgl_kernel/sm90/common_ops.abi3.so": b"\x7fELF sm90",
            "sgl_kernel/sm100/common_ops.abi3.so": b"\x7fELF sm100",
            "sgl_kernel/flash_ops.abi3.so": b"\x7fELF fa3" * 100,
            f"{INFO}/METADATA": METADATA,
            f"{INFO}/WHEEL": b"Wheel-Version: 1.0\n",
            f"{INFO}/RECORD": b"stale\n",
        },
    )


def test_reduced_kernel_keeps_sm90_drops_the_rest_with_a_valid_record(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    wheel, dropped = bundle.reduce_kernel(_kernel_wheel(tmp_path), out, KERNEL)
    assert wheel.name == "sglang_kernel-0.4.2.post2+sm90-cp310-abi3-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read("sglang_kernel-0.4.2.post2+sm90.dist-info/METADATA").decode()
    assert "sgl_kernel/sm90/common_ops.abi3.so" in names
    assert not {n for n in names if "sm100" in n or "flash_ops" in n}
    assert not {n for n in names if n.startswith(INFO)}
    assert "\nVersion: 0.4.2.post2+sm90\n" in metadata
    assert check_record(wheel) == []
    assert [(d["pattern"], d["files"]) for d in dropped] == [
        ("sgl_kernel/flash_ops.abi3.so", 1),
        ("sgl_kernel/sm100/*", 1),
    ]


def test_a_drop_pattern_that_matches_nothing_is_an_error(tmp_path):
    kernel = {**KERNEL, "drop": [*KERNEL["drop"], {"pattern": "lib/*", "why": "gone"}]}
    with pytest.raises(bundle.BundleError, match=r"lib/\*"):
        bundle.reduce_kernel(_kernel_wheel(tmp_path), tmp_path, kernel)


def test_a_cached_wheel_with_another_hash_is_refused(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    path = _wheel(wheels / "demo-1.0-py3-none-any.whl", {"demo.py": b""})
    good = hashlib.sha256(path.read_bytes()).hexdigest()
    pin = bundle.Pin("demo", "1.0", path.name, good, 2)
    assert bundle.fetch(pin, tmp_path, [], "3.12") == path
    bad = bundle.Pin("demo", "1.0", path.name, "0" * 64, 2)
    with pytest.raises(bundle.BundleError, match="is not the pinned"):
        bundle.fetch(bad, tmp_path, [], "3.12")


def test_threshold_patch_is_detected_in_the_sglang_wheel(tmp_path):
    patched = _wheel(
        tmp_path / "a.whl",
        {"sglang/srt/server_args.py": b"speculative_disable_batch_threshold: int = None\n"},
    )
    plain = _wheel(tmp_path / "b.whl", {"sglang/srt/server_args.py": b"x = 1\n"})
    assert bundle.carries_threshold_patch(patched)
    assert not bundle.carries_threshold_patch(plain)


def test_the_manifest_pins_each_wheel_once_by_name_version_and_sha256():
    manifest = bundle.load_manifest()
    pins = bundle.pins(manifest)
    names = [p.name.lower().replace("-", "_") for p in pins]
    assert len(names) == len(set(names))
    for pin in pins:
        assert pin.file.startswith(f"{pin.name}-{pin.version}-") and pin.file.endswith(".whl")
        assert re.fullmatch(r"[0-9a-f]{64}", pin.sha256)
        assert pin.stage in (1, 2)
    assert {p.name for p in pins if p.stage == 1} >= {"sglang", "sglang_kernel"}
    assert all(d["why"] for d in manifest["kernel"]["drop"])


PURE = ["--implementation", "py", "--abi", "none", "--platform", "any"]


@pytest.mark.parametrize(
    "file, expected",
    [
        ("wcwidth-0.9.4-py3-none-any.whl", PURE),
        ("pyzmq-27.3.0-cp312-abi3-manylinux_2_28_x86_64.whl",
         ["--implementation", "cp", "--abi", "abi3", "--platform", "P"]),
        ("orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
         ["--implementation", "cp", "--abi", "cp312", "--platform", "P"]),
    ],
)  # fmt: skip
def test_download_options_select_the_pinned_file_among_a_releases_wheels(file, expected):
    """wcwidth 0.9.4 has a pure and an abi3 wheel: without the pinned file's own tags pip
    picked the compiled one and the pinned file never arrived."""
    assert bundle._tag_options(file, ["P"]) == expected
