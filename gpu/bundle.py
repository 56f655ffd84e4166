"""Build the GPU tier's bundle of one SGLang line for the lent H200 (``make gpu-bundle``).

    python gpu/bundle.py [--line 0.5.17] [--out .gpu-stage] [--cache .cache/gpu]
                         [--sglang-wheel WHEEL] [--optional GROUP]

The line's manifest is ``gpu/bundles/LINE.toml`` (the device image: ``gpu/bundles/device.toml``).
Downloads the pinned wheels into the cache (once; ``pip download --no-deps``), checks every
sha256 against the manifest, reduces sglang-kernel to what an SM90 triton-backend engine loads
(a wheel of its own with a fresh RECORD), splits a wheel larger than a stage into parts, and
writes

    OUT/stageN/            the wheels (and parts) of stage N, one call to the H200 each
    OUT/repo/              the project files the session runs (gpu/, tests/gpu/, bench/)
    OUT/bundle.json        what is in each stage: files, sha256, sizes, what was left out
    OUT/install.sh         checks the hashes, joins parts, installs a stage there

Wheels of an optional group (``optional = "cutlass"``) go in only with ``--optional GROUP``.
A manifest with ``check_requirements`` must account for every requirement of sglang and of
each wheel it brings: brought, on the device, or left out with a reason.

The sglang wheel is the one given with ``--sglang-wheel`` (a patched wheel of the line built
by ``patchkit build``), else the newest ``dist/sglang-LINE+*-cp312-*.whl``, else the unpatched
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

BUNDLES = ROOT / "gpu" / "bundles"
DEFAULT_LINE = "0.5.17"
MANIFEST = BUNDLES / f"{DEFAULT_LINE}.toml"
DEVICE = BUNDLES / "device.toml"
DEFAULT_CACHE = Path(os.environ.get("PATCHKIT_GPU_CACHE", ROOT / ".cache" / "gpu"))
PROJECT_FILES = [
    "gpu",
    "tests/gpu/test_spec_threshold_gpu.py",
    "tests/conftest.py",
    "tests/helpers.py",
    "tests/timing.py",  # tests/conftest.py imports its hooks
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
    stage: int  # the first part's stage for a split wheel
    parts: tuple[int, ...] = ()  # the stage of each part when the wheel travels split
    optional: str = ""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest_path(line: str) -> Path:
    return BUNDLES / f"{line}.toml"


def lines() -> list[str]:
    """The lines that have a bundle manifest."""
    return sorted(p.stem for p in BUNDLES.glob("*.toml") if p.stem != DEVICE.stem)


def load_manifest(path: Path = MANIFEST) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise BundleError(f"{path}: {error}") from None


def _pin(entry: dict) -> Pin:
    parts = tuple(entry.get("parts", ()))
    stage = entry["stage"] if "stage" in entry else parts[0]
    keys = ("name", "version", "file", "sha256")
    return Pin(*(entry[k] for k in keys), stage, parts, entry.get("optional", ""))


def pins(manifest: dict, optional: tuple[str, ...] | None = None) -> list[Pin]:
    """The manifest's pins; with ``optional`` given, only those of no group or of a named one."""
    out = [_pin(w) for w in manifest["wheel"]]
    out.append(_pin(manifest["kernel"]))
    if optional is not None:
        out = [p for p in out if not p.optional or p.optional in optional]
    return out


def normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def device_packages(path: Path = DEVICE) -> set[str]:
    device = load_manifest(path)["device"]
    return {normalize(n) for n in device["seen"] + device["inferred"]}


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's unconditional requirements on Linux x86_64 / CPython 3.12 (no extras)."""
    from packaging.requirements import Requirement

    env = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "python_version": "3.12", "python_full_version": "3.12.3",
           "implementation_name": "cpython", "os_name": "posix", "extra": ""}  # fmt: skip
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    out = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(env):
                out.append(normalize(req.name))
    return out


def unaccounted(manifest: dict, wheels: dict[str, Path], device: set[str]) -> list[str]:
    """Requirements of the bundle's wheels that are neither brought, on the device, nor left
    out with a reason: ``REQ (of WHEEL)`` each."""
    brought = {normalize(name) for name in wheels}
    known = brought | device | {normalize(d["name"]) for d in manifest.get("left_out", [])}
    missing = []
    for name, path in sorted(wheels.items()):
        for req in wheel_requirements(path):
            if req not in known:
                missing.append(f"{req} (of {name})")
    return sorted(set(missing))


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


def find_sglang_wheel(given: Path | None, line: str = DEFAULT_LINE) -> tuple[Path | None, str]:
    if given is not None:
        if not given.is_file():
            raise BundleError(f"--sglang-wheel {given}: no such file")
        return given, "given"
    built = sorted((ROOT / "dist").glob(f"sglang-{line}+*-cp312-*.whl"), key=os.path.getmtime)
    if built:
        return built[-1], "dist/ (patchkit build)"
    return None, "PyPI (unpatched)"


def split(path: Path, dests: list[Path]) -> list[Path]:
    """``path`` cut into ``len(dests)`` parts of (nearly) equal size, part i written into
    ``dests[i]`` as ``NAME.part<i+1>``."""
    size = path.stat().st_size
    chunk = -(-size // len(dests))
    out = []
    with open(path, "rb") as f:
        for i, dest in enumerate(dests, 1):
            part = dest / f"{path.name}.part{i}"
            with open(part, "wb") as w:
                left = chunk
                while left > 0:
                    block = f.read(min(left, 1 << 20))
                    if not block:
                        break
                    w.write(block)
                    left -= len(block)
            out.append(part)
    return out


def join(parts: list[Path], dest: Path, sha256: str) -> Path:
    """The parts concatenated in order into ``dest``, checked against the whole's sha256
    (what gpu/install.sh does on the GPU host, for the tests)."""
    with open(dest, "wb") as w:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, w, 1 << 20)
    digest = sha256_of(dest)
    if digest != sha256:
        dest.unlink()
        raise BundleError(f"{dest.name}: joined sha256 {digest} is not the pinned {sha256}")
    return dest


def tracked_bytes() -> int:
    """Bytes of the checkout's tracked files: they travel with every call beside a stage."""
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if proc.returncode != 0:
        return 0
    total = 0
    for rel in filter(None, proc.stdout.split(b"\0")):
        path = ROOT / os.fsdecode(rel)
        if path.is_file():
            total += path.stat().st_size
    return total


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


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


def _place(pin, path: Path, stages: dict, manifest: dict, report: dict, wheel, source) -> Path:
    """Put one pinned wheel into its stage (the kernel reduced, the line's sglang wheel in
    place of PyPI's, a wheel larger than a stage split into parts) and record it; the file
    whose requirements count (the fetched one, or the sglang wheel that replaced it)."""
    if pin.name == manifest["kernel"]["name"]:
        placed, report["kernel_left_out"] = reduce_kernel(
            path, stages[pin.stage], manifest["kernel"]
        )
        origin = f"reduced from {pin.file} (sha256 {pin.sha256})"
    elif pin.name == "sglang" and wheel is not None:
        placed = shutil.copy2(wheel, stages[pin.stage] / wheel.name)
        origin, path = f"{source}: {wheel}", wheel
    elif pin.parts:
        parts = split(path, [stages[n] for n in pin.parts])
        report["parts"].append({"file": pin.file, "sha256": pin.sha256,
                                "bytes": path.stat().st_size,
                                "parts": [p.name for p in parts]})  # fmt: skip
        for n, part in zip(pin.parts, parts, strict=True):
            report["stages"][str(n)].append({
                "file": part.name, "sha256": sha256_of(part), "bytes": part.stat().st_size,
                "origin": f"part of {pin.file} (sha256 {pin.sha256})",
            })  # fmt: skip
        return path
    else:
        placed = shutil.copy2(path, stages[pin.stage] / pin.file)
        origin = "PyPI, pinned sha256"
    placed = Path(placed)
    report["stages"][str(pin.stage)].append(
        {"file": placed.name, "sha256": sha256_of(placed), "bytes": placed.stat().st_size,
         "origin": origin}
    )  # fmt: skip
    return path


def _write_stage_sums(report: dict, stages: dict, limit: int, carry_limit: int) -> None:
    """Each stage's size against what a stage and one call may hold, and its SHA256SUMS."""
    beside = report["beside_each_stage_bytes"]
    for n, entries in report["stages"].items():
        total = sum(e["bytes"] for e in entries)
        report[f"stage{n}_bytes"] = total
        if total > limit:
            raise BundleError(f"stage {n} is {total >> 20} MiB, over {limit >> 20} MiB")
        if total + beside > carry_limit:
            raise BundleError(
                f"stage {n} with the project's files is {(total + beside) >> 20} MiB, "
                f"over the {carry_limit >> 20} MiB one call carries"
            )
        (stages[int(n)] / "SHA256SUMS").write_text(
            "".join(f"{e['sha256']}  {e['file']}\n" for e in entries)
        )


def build(
    out: Path,
    cache: Path,
    sglang_wheel: Path | None,
    line: str = DEFAULT_LINE,
    optional: tuple[str, ...] = (),
) -> dict:
    manifest = load_manifest(manifest_path(line))
    meta = manifest["bundle"]
    limit = int(meta["stage_limit_mib"]) << 20
    carry_limit = int(meta.get("carry_limit_mib", 64)) << 20
    groups = {p.optional for p in pins(manifest) if p.optional}
    unknown = sorted(set(optional) - groups)
    if unknown:
        raise BundleError(f"line {line} has no optional group {unknown} (it has {sorted(groups)})")
    selected = pins(manifest, optional)
    stage_numbers = sorted({n for p in selected for n in (p.parts or (p.stage,))})
    work = Path(tempfile.mkdtemp(prefix=".gpu-bundle-", dir=out.parent))
    try:
        stages = {n: work / f"stage{n}" for n in stage_numbers}
        for d in stages.values():
            d.mkdir()
        report = {
            "line": line,
            "stages": {str(n): [] for n in stage_numbers},
            "kernel_left_out": [],
            "left_out": [
                {"name": d["name"], "why": d["why"]} for d in manifest.get("left_out", [])
            ],
            "optional": {g: g in optional for g in sorted(groups)},
            "parts": [],
        }
        report["left_out"] += [
            {"name": p.name, "why": f"optional group {p.optional!r}: --optional {p.optional}"}
            for p in pins(manifest) if p.optional and p.optional not in optional
        ]  # fmt: skip
        wheel, source = find_sglang_wheel(sglang_wheel, line)
        fetched: dict[str, Path] = {}
        for pin in selected:
            path = fetch(pin, cache, meta["download_platforms"], meta["python"])
            fetched[pin.name] = _place(pin, path, stages, manifest, report, wheel, source)
        if meta.get("check_requirements"):
            missing = unaccounted(manifest, fetched, device_packages())
            if missing:
                raise BundleError(
                    f"line {line}: requirements neither brought, on the device, nor left out: "
                    + ", ".join(missing)
                )
        sglang = next(
            p for d in stages.values() for p in d.iterdir() if p.name.startswith("sglang-")
        )
        report["sglang"] = {
            "file": sglang.name,
            "source": source,
            "threshold_patch": carries_threshold_patch(sglang),
        }
        _copy_project(work / "repo")
        shutil.copy2(ROOT / "gpu" / "install.sh", work / "install.sh")
        beside = tree_bytes(work / "repo") + (work / "install.sh").stat().st_size
        beside += tracked_bytes()
        report["beside_each_stage_bytes"] = beside
        _write_stage_sums(report, stages, limit, carry_limit)
        for item in report["parts"]:
            for n in {n for p in pins(manifest) if p.file == item["file"] for n in p.parts}:
                with open(stages[n] / "PARTS", "a") as f:
                    f.write(f"{item['sha256']}  {item['file']}  {len(item['parts'])}\n")
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
    parser.add_argument("--line", default=DEFAULT_LINE, help=f"one of {', '.join(lines())}")
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu-stage")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--sglang-wheel", type=Path)
    parser.add_argument("--optional", action="append", default=[], help="an optional group")
    args = parser.parse_args(argv)
    if args.line not in lines():
        print(f"gpu-bundle: no bundle for line {args.line} (gpu/bundles/: {', '.join(lines())})",
              file=sys.stderr)  # fmt: skip
        return 1
    try:
        report = build(
            args.out.resolve(), args.cache, args.sglang_wheel, args.line, tuple(args.optional)
        )
    except BundleError as error:
        print(f"gpu-bundle: {error}", file=sys.stderr)
        return 1
    s = report["sglang"]
    patched = "with" if s["threshold_patch"] else "WITHOUT"
    sizes = ", ".join(
        f"stage {n} {report[f'stage{n}_bytes'] / 2**20:.1f} MiB" for n in report["stages"]
    )
    print(
        f"gpu-bundle: {args.out} (line {args.line}): {sizes} (+ "
        f"{report['beside_each_stage_bytes'] / 2**20:.1f} MiB of project files each call); "
        f"{s['file']} from {s['source']}, {patched} the threshold patch"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
