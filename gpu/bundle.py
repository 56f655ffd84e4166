"""Build the GPU tier's bundle for the lent H200 from ``gpu/bundle.toml`` (``make gpu-bundle``).

    python gpu/bundle.py [--out .gpu-stage] [--cache .cache/gpu] [--sglang-wheel WHEEL]

Downloads the pinned wheels into the cache (once; ``pip download --no-deps``), checks every
sha256 against the manifest, reduces sglang-kernel to what an SM90 triton-backend engine loads
(a wheel of its own with a fresh RECORD), and writes

    OUT/stage1/            the large wheels (the first call to the H200)
    OUT/stage2/            the rest of the wheels
    OUT/repo/              the project files the session runs (gpu/, tests/gpu/, bench/)
    OUT/bundle.json        what is in each stage: files, sha256, sizes, what was left out
    OUT/install.sh         checks the hashes and installs a stage there

The sglang wheel is the one given with ``--sglang-wheel`` (the patched 0.5.12 line built by
``patchkit build``), else the newest ``dist/sglang-0.5.12+*-cp312-*.whl``, else the unpatched
PyPI wheel of the manifest; ``bundle.json`` says which and whether it carries the threshold
patch. Errors are one line on stderr and exit status 1; nothing is left half-written in OUT.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # an installed patchkit wins; ./build is data, not pypa build

from patchkit.wheels.reproducible import RecordEntry, record_hash, write_record  # noqa: E402

MANIFEST = ROOT / "gpu" / "bundle.toml"
DEFAULT_CACHE = Path(os.environ.get("PATCHKIT_GPU_CACHE", ROOT / ".cache" / "gpu"))
PROJECT_FILES = [
    "gpu",
    "tests/gpu/test_spec_threshold_gpu.py",
    "tests/conftest.py",
    "tests/helpers.py",
    "bench/spec_threshold.py",
    "pyproject.toml",
]
PATCH_MARK = b"speculative_disable_batch_threshold"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)


class BundleError(Exception):
    """A one-line reason the bundle cannot be built."""


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    file: str
    sha256: str
    stage: int


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_manifest(path: Path = MANIFEST) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise BundleError(f"{path}: {error}") from None


def pins(manifest: dict) -> list[Pin]:
    keys = ("name", "version", "file", "sha256", "stage")
    out = [Pin(*(w[k] for k in keys)) for w in manifest["wheel"]]
    out.append(Pin(*(manifest["kernel"][k] for k in keys)))
    return out


def _tag_options(file: str, platforms: list[str]) -> list[str]:
    """pip options that select exactly the pinned file among a release's wheels: its own
    implementation, ABI and (for a pure wheel) platform, so that a release with both a pure
    and a compiled wheel (wcwidth 0.9.4) yields the one pinned."""
    python_tag, abi, platform = file[: -len(".whl")].split("-")[-3:]
    implementation = "py" if python_tag.startswith("py") else "cp"
    options = ["--implementation", implementation, "--abi", abi]
    for tag in ["any"] if platform == "any" else platforms:
        options += ["--platform", tag]
    return options


def fetch(pin: Pin, cache: Path, platforms: list[str], python: str) -> Path:
    """The pinned wheel from the cache, downloaded once; its sha256 checked every time."""
    path = cache / "wheels" / pin.file
    if not path.exists():
        cache.joinpath("wheels").mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
               "--only-binary=:all:", "--python-version", python,
               "-d", str(cache / "wheels"), f"{pin.name}=={pin.version}"]  # fmt: skip
        cmd += _tag_options(pin.file, platforms)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not path.exists():
            errors = [
                line for line in proc.stderr.splitlines()
                if line.strip() and not line.startswith("WARNING")
            ]  # fmt: skip
            stem = f"{pin.name.replace('-', '_')}-{pin.version}-*"
            got = sorted(p.name for p in cache.joinpath("wheels").glob(stem))
            why = errors[-1] if errors else f"pip chose {', '.join(got) or 'nothing'}"
            raise BundleError(f"cannot download {pin.file}: {why}")
    digest = sha256_of(path)
    if digest != pin.sha256:
        raise BundleError(f"{path}: sha256 {digest} is not the pinned {pin.sha256}")
    return path


def reduce_kernel(source: Path, dest_dir: Path, kernel: dict) -> tuple[Path, list[dict]]:
    """sglang-kernel without the parts ``kernel.drop`` names; returns the wheel and the drops."""
    version = f"{kernel['version']}+{kernel['local']}"
    old_info = f"{kernel['name']}-{kernel['version']}.dist-info"
    new_info = f"{kernel['name']}-{version}.dist-info"
    dest = dest_dir / source.name.replace(kernel["version"], version, 1)
    dropped = {d["pattern"]: {"pattern": d["pattern"], "why": d["why"], "files": 0, "bytes": 0}
               for d in kernel["drop"]}  # fmt: skip
    records = []
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in sorted(zin.infolist(), key=lambda i: i.filename):
            name = info.filename
            if name.endswith("/") or name == f"{old_info}/RECORD":
                continue
            hit = next((p for p in dropped if fnmatch.fnmatch(name, p)), None)
            if hit:
                dropped[hit]["files"] += 1
                dropped[hit]["bytes"] += info.file_size
                continue
            data = zin.read(info)
            if name.startswith(old_info + "/"):
                name = new_info + name[len(old_info) :]
                if name.endswith("/METADATA"):
                    data = data.replace(
                        f"\nVersion: {kernel['version']}\n".encode(),
                        f"\nVersion: {version}\n".encode(),
                        1,
                    )
            entry = zipfile.ZipInfo(name, ZIP_TIME)
            entry.external_attr = info.external_attr
            entry.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(entry, data, compresslevel=9)
            records.append(RecordEntry(name, record_hash(data), len(data)))
        records.append(RecordEntry(f"{new_info}/RECORD", "", None))
        entry = zipfile.ZipInfo(f"{new_info}/RECORD", ZIP_TIME)
        entry.external_attr = 0o644 << 16
        zout.writestr(entry, write_record(records), compresslevel=9)
    missing = [d["pattern"] for d in dropped.values() if not d["files"]]
    if missing:
        raise BundleError(f"{source.name}: the manifest drops {missing}, which match nothing")
    return dest, list(dropped.values())


def find_sglang_wheel(given: Path | None) -> tuple[Path | None, str]:
    if given is not None:
        if not given.is_file():
            raise BundleError(f"--sglang-wheel {given}: no such file")
        return given, "given"
    built = sorted((ROOT / "dist").glob("sglang-0.5.12+*-cp312-*.whl"), key=os.path.getmtime)
    if built:
        return built[-1], "dist/ (patchkit build)"
    return None, "PyPI (unpatched)"


def carries_threshold_patch(wheel: Path) -> bool:
    with zipfile.ZipFile(wheel) as z:
        try:
            return PATCH_MARK in z.read("sglang/srt/server_args.py")
        except KeyError:
            return False


def _copy_project(dest: Path) -> None:
    for rel in PROJECT_FILES:
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def build(out: Path, cache: Path, sglang_wheel: Path | None) -> dict:
    manifest = load_manifest()
    meta = manifest["bundle"]
    limit = int(meta["stage_limit_mib"]) << 20
    work = Path(tempfile.mkdtemp(prefix=".gpu-bundle-", dir=out.parent))
    try:
        stages = {1: work / "stage1", 2: work / "stage2"}
        for d in stages.values():
            d.mkdir()
        report = {"stages": {"1": [], "2": []}, "left_out": []}
        wheel, source = find_sglang_wheel(sglang_wheel)
        for pin in pins(manifest):
            path = fetch(pin, cache, meta["download_platforms"], meta["python"])
            if pin.name == manifest["kernel"]["name"]:
                path, report["left_out"] = reduce_kernel(
                    path, stages[pin.stage], manifest["kernel"]
                )
                origin = f"reduced from {pin.file} (sha256 {pin.sha256})"
            elif pin.name == "sglang" and wheel is not None:
                path = shutil.copy2(wheel, stages[pin.stage] / wheel.name)
                origin = f"{source}: {wheel}"
            else:
                path = shutil.copy2(path, stages[pin.stage] / pin.file)
                origin = "PyPI, pinned sha256"
            path = Path(path)
            entry = {"file": path.name, "sha256": sha256_of(path), "bytes": path.stat().st_size}
            entry["origin"] = origin
            report["stages"][str(pin.stage)].append(entry)
        sglang = next(p for p in stages[1].iterdir() if p.name.startswith("sglang-"))
        report["sglang"] = {
            "file": sglang.name,
            "source": source,
            "threshold_patch": carries_threshold_patch(sglang),
        }
        _copy_project(work / "repo")
        for n, entries in report["stages"].items():
            total = sum(e["bytes"] for e in entries)
            report[f"stage{n}_bytes"] = total
            if total > limit:
                raise BundleError(f"stage {n} is {total >> 20} MiB, over {limit >> 20} MiB")
            (stages[int(n)] / "SHA256SUMS").write_text(
                "".join(f"{e['sha256']}  {e['file']}\n" for e in entries)
            )
        shutil.copy2(ROOT / "gpu" / "install.sh", work / "install.sh")
        (work / "bundle.json").write_text(json.dumps(report, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
        return report
    finally:
        if work.exists():
            shutil.rmtree(work)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu-stage")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--sglang-wheel", type=Path)
    args = parser.parse_args(argv)
    try:
        report = build(args.out.resolve(), args.cache, args.sglang_wheel)
    except BundleError as error:
        print(f"gpu-bundle: {error}", file=sys.stderr)
        return 1
    s = report["sglang"]
    patched = "with" if s["threshold_patch"] else "WITHOUT"
    print(
        f"gpu-bundle: {args.out}: stage 1 {report['stage1_bytes'] / 2**20:.1f} MiB, "
        f"stage 2 {report['stage2_bytes'] / 2**20:.1f} MiB; {s['file']} from {s['source']}, "
        f"{patched} the threshold patch"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
