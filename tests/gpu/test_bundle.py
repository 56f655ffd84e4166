"""CPU checks of the GPU tier's bundle builder (gpu/bundle.py), its manifests
(gpu/bundles/*.toml), its installer (gpu/install.sh) and the engine settings of each line.

Real zip wheels are built here; the `slow` tests build the 0.5.17 bundle from the real pinned
wheels (downloaded once into .cache/gpu, about 560 MB) and read 0.5.17's ServerArgs. No GPU.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "gpu"))

import bundle  # noqa: E402
import engines  # noqa: E402
import language  # noqa: E402

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


@pytest.mark.parametrize("line", ["0.5.12", "0.5.17"])
def test_the_manifest_pins_each_wheel_once_by_name_version_and_sha256(line):
    assert line in bundle.lines()
    manifest = bundle.load_manifest(bundle.manifest_path(line))
    assert manifest["bundle"].get("line", line) == line
    pins = bundle.pins(manifest)
    names = [p.name.lower().replace("-", "_") for p in pins]
    assert len(names) == len(set(names))
    for pin in pins:
        assert pin.file.startswith(f"{pin.name}-{pin.version}-") and pin.file.endswith(".whl")
        assert re.fullmatch(r"[0-9a-f]{64}", pin.sha256)
        assert pin.stage >= 1 and all(n >= 1 for n in pin.parts)
        assert not pin.parts or pin.optional, "a split wheel of the default stages"
    assert {p.name for p in pins if p.stage == 1} >= {"sglang", "sglang_kernel"}
    assert all(d["why"] for d in manifest["kernel"]["drop"])
    assert all(d["name"] and d["why"] for d in manifest.get("left_out", []))
    assert bundle.pins(manifest) == bundle.pins(manifest, None)


def test_the_default_line_and_the_retired_lines_stages_stay_as_they_were():
    # The default is the 0.5.17 line (0.5.12 is retired; its bundle still builds the unpatched
    # 0.5.12 wheel for the records made with it).
    assert (
        bundle.MANIFEST
        == bundle.manifest_path("0.5.17")
        == bundle.manifest_path(bundle.DEFAULT_LINE)
    )
    retired = bundle.load_manifest(bundle.manifest_path("0.5.12"))
    assert {p.stage for p in bundle.pins(retired, ())} == {1, 2}
    assert "check_requirements" not in retired["bundle"]


def test_the_project_files_carried_collect_the_gpu_tier(tmp_path):
    """The H200 runs the tier from the bundle's copy of the project (``repo/``): pytest must
    import its conftest (and what that imports) and the tier's modules from that copy alone."""
    bundle._copy_project(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", "gpu", "tests/gpu/test_spec_threshold_gpu.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": ""},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "test_draft_steps_follow_the_policy[eagle3-v2+threshold]" in run.stdout


def test_the_device_calls_in_the_docs_are_steps_of_h200_sh():
    """Each `run:` line of docs/gpu.md names a step gpu/h200.sh has, carrying what exists in
    a bundle (stages, install.sh, repo); the 0.5.17 plan fits the 10-minute call."""
    script = (ROOT / "gpu" / "h200.sh").read_text()
    steps = set(re.findall(r"^(\w+)\)$", script, re.M))
    calls = re.findall(r"run: sh \.gpu-stage/repo/gpu/h200\.sh (\w+)[^\n]*?carry ([^(\n]+)",
                       (ROOT / "docs" / "gpu.md").read_text())  # fmt: skip
    assert {"prep", "tier", "bench", "stage"} <= {step for step, _ in calls} <= steps
    for _, carry in calls:
        for path in (c.strip() for c in carry.split(",")):
            assert re.fullmatch(r"\.gpu-stage/(stage\d|install\.sh|repo)", path), path
    tier = script[script.index("\ntier)") :]
    tier = tier[: tier.index(";;")]
    limit = int(re.search(r"timeout (\d+) python3 gpu/session.py", tier).group(1))
    assert limit + 30 <= 600  # the stage install and the stop of a first tier's servers
    assert int(re.search(r"--budget-s (\d+)", tier).group(1)) < limit
    assert "--bench-concurrency 16,32,64,128" in tier


def test_split_parts_join_to_the_whole_only_in_order(tmp_path):
    whole = tmp_path / "big.whl"
    whole.write_bytes(os.urandom(300_001))
    digest = hashlib.sha256(whole.read_bytes()).hexdigest()
    dests = [tmp_path / "s4", tmp_path / "s5", tmp_path / "s6"]
    for d in dests:
        d.mkdir()
    parts = bundle.split(whole, dests)
    assert [p.parent for p in parts] == dests
    assert [p.name for p in parts] == [f"big.whl.part{i}" for i in (1, 2, 3)]
    assert sum(p.stat().st_size for p in parts) == 300_001
    assert max(p.stat().st_size for p in parts) - min(p.stat().st_size for p in parts) <= 2
    joined = bundle.join(parts, tmp_path / "joined.whl", digest)
    assert joined.read_bytes() == whole.read_bytes()
    with pytest.raises(bundle.BundleError, match="is not the pinned"):
        bundle.join(parts[::-1], tmp_path / "wrong.whl", digest)
    assert not (tmp_path / "wrong.whl").exists()


def _stage(path: Path, files: list[Path], parts_line: str = "") -> Path:
    path.mkdir()
    for f in files:
        shutil.copy2(f, path / f.name)
    sums = "".join(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n" for f in files)
    (path / "SHA256SUMS").write_text(sums)
    if parts_line:
        (path / "PARTS").write_text(parts_line)
    return path


def _demo_wheel(where: Path, name: str, files: dict[str, bytes]) -> Path:
    info = f"{name}-1.0.dist-info"
    return _wheel(where / f"{name}-1.0-py3-none-any.whl", {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/RECORD": b"",
    })  # fmt: skip


def test_install_sh_joins_parts_across_calls_checks_them_and_installs(tmp_path):
    """gpu/install.sh on the host: parts wait in PARTS_DIR until the last one comes."""
    src = tmp_path / "src"
    src.mkdir()
    big = _demo_wheel(src, "demo_big", {"demo_big/__init__.py": b"X = 1\n",
                                        "demo_big/blob.bin": os.urandom(50_000)})  # fmt: skip
    small = _demo_wheel(src, "demo_small", {"demo_small.py": b"Y = 2\n"})
    digest = hashlib.sha256(big.read_bytes()).hexdigest()
    cut = tmp_path / "cut"
    cut.mkdir()
    one, two = bundle.split(big, [cut, cut])
    line = f"{digest}  {big.name}  2\n"
    stage4 = _stage(tmp_path / "stage4", [one], line)
    stage5 = _stage(tmp_path / "stage5", [two, small], line)
    site, spool = tmp_path / "site", tmp_path / "spool"
    env = {**os.environ, "PARTS_DIR": str(spool)}

    def install(stage: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", str(ROOT / "gpu" / "install.sh"), str(stage), str(site)],
                              capture_output=True, text=True, env=env, timeout=120)  # fmt: skip

    first = install(stage4)
    assert first.returncode == 0, first.stderr
    assert "waiting for part(s) 2" in first.stdout and not site.exists()
    second = install(stage5)
    assert second.returncode == 0, second.stderr
    assert (site / "demo_big" / "blob.bin").exists() and (site / "demo_small.py").exists()
    assert "2 wheels" in second.stdout
    # a part that does not join to the pinned whole stops the install
    bad = _stage(tmp_path / "bad", [two], f"{'0' * 64}  {big.name}  2\n")
    third = install(bad)
    assert third.returncode != 0 and "do not give the pinned sha256" in third.stderr


def test_a_requirement_not_brought_on_the_device_or_left_out_is_named(tmp_path):
    meta = b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n" + b"".join(
        f"Requires-Dist: {r}\n".encode()
        for r in ["torch==2.11.0", "tiny_dep", "gone>=1", "mac-only; sys_platform == 'darwin'",
                  "extra-only; extra == 'test'", "missing_one"]
    )  # fmt: skip
    demo = _wheel(tmp_path / "demo-1.0-py3-none-any.whl", {"demo-1.0.dist-info/METADATA": meta})
    dep = _demo_wheel(tmp_path, "tiny_dep", {})
    manifest = {"left_out": [{"name": "Gone", "why": "not imported"}]}
    wheels = {"demo": demo, "tiny_dep": dep}
    assert bundle.unaccounted(manifest, wheels, {"torch"}) == ["missing-one (of demo)"]


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


# The 0.5.17 bundle from the real pinned wheels (cached in .cache/gpu, PATCHKIT_GPU_CACHE).


@pytest.fixture(scope="module")
def bundle_0_5_17(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("gpu") / "stage"
    report = bundle.build(out, bundle.DEFAULT_CACHE, None, "0.5.17", ("cutlass",))
    return out, report


@pytest.mark.slow
def test_the_0_5_17_bundle_builds_in_stages_that_fit_one_call(bundle_0_5_17):
    out, report = bundle_0_5_17
    manifest = bundle.load_manifest(bundle.manifest_path("0.5.17"))
    meta = manifest["bundle"]
    assert report["line"] == "0.5.17" and list(report["stages"]) == ["1", "2", "3", "4", "5"]
    for n in report["stages"]:
        size = report[f"stage{n}_bytes"]
        assert size <= meta["stage_limit_mib"] << 20
        assert size + report["beside_each_stage_bytes"] <= meta["carry_limit_mib"] << 20
        listed = (out / f"stage{n}" / "SHA256SUMS").read_text().split()
        assert sorted(listed[1::2]) == sorted(p.name for p in (out / f"stage{n}").iterdir()
                                              if p.name not in ("SHA256SUMS", "PARTS"))  # fmt: skip
    sglang = report["sglang"]
    if sglang["source"] == "PyPI (unpatched)":  # no patched 0.5.17 wheel in dist/
        assert sglang == {"file": "sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl",
                          "source": "PyPI (unpatched)", "threshold_patch": False}  # fmt: skip
    else:  # `make gpu-bundle` builds the line's patched wheel into dist/ first
        assert sglang["file"].startswith("sglang-0.5.17+cu130.pk") and sglang["threshold_patch"]
    kernel = next(out.glob("stage1/sglang_kernel-0.4.5+sm90-*.whl"))
    with zipfile.ZipFile(kernel) as z:
        names = set(z.namelist())
    assert {"sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/spatial_ops.abi3.so"} <= names
    assert not {n for n in names if "sm100" in n or "flash_ops" in n or "infllm_ops" in n}
    assert check_record(kernel) == []
    assert all(d["files"] == 1 for d in report["kernel_left_out"])
    left = {d["name"] for d in report["left_out"]}
    assert {"nvidia-cutlass-dsl", "llguidance", "tilelang", "flash-attn-4"} <= left
    assert json.loads((out / "bundle.json").read_text()) == report


@pytest.mark.slow
def test_the_cutlass_wheel_travels_in_parts_that_join_to_its_pinned_sha256(bundle_0_5_17, tmp_path):
    out, report = bundle_0_5_17
    pin = next(p for p in bundle.pins(bundle.load_manifest(bundle.manifest_path("0.5.17")))
               if p.parts)  # fmt: skip
    assert pin.name == "nvidia_cutlass_dsl_libs_cu13" and pin.optional == "cutlass"
    [item] = report["parts"]
    assert item["bytes"] > 60 << 20  # the reason it is split: larger than a stage
    parts = [out / f"stage{n}" / f"{pin.file}.part{i}" for i, n in enumerate(pin.parts, 1)]
    bundle.join(parts, tmp_path / pin.file, pin.sha256)
    for n in pin.parts:
        assert (out / f"stage{n}" / "PARTS").read_text() == f"{pin.sha256}  {pin.file}  2\n"


@pytest.mark.slow
def test_every_requirement_of_the_0_5_17_engine_is_accounted_for(bundle_0_5_17):
    """Brought, on the device image (gpu/bundles/device.toml, docs/gpu.md), or left out with
    a reason; the build refuses otherwise, so a build without the list fails."""
    manifest = bundle.load_manifest(bundle.manifest_path("0.5.17"))
    wheels = {p.name: bundle.DEFAULT_CACHE / "wheels" / p.file for p in bundle.pins(manifest)}
    device = bundle.device_packages()
    assert bundle.unaccounted(manifest, wheels, device) == []
    bare = {**manifest, "left_out": []}
    assert "xxhash (of sglang)" in bundle.unaccounted(bare, wheels, device)
    docs = (ROOT / "docs" / "gpu.md").read_text()
    assert all(name in docs for name in sorted(device))


def _server_args_flags(wheel: Path) -> set[str]:
    """The command-line flags of a ServerArgs read from the wheel's server_args.py: one per
    annotated field, plus the deprecated aliases it adds with parser.add_argument."""
    with zipfile.ZipFile(wheel) as z:
        tree = ast.parse(z.read("sglang/srt/server_args.py"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    flags = {"--" + n.target.id.replace("_", "-") for n in cls.body
             if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}  # fmt: skip
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
                and node.args and isinstance(node.args[0], ast.Constant)):  # fmt: skip
            flags.add(node.args[0].value)
    return flags


def _patched_fields(line: str) -> set[str]:
    """The ServerArgs fields the line's patches add, as flags (annotated fields added to
    server_args.py)."""
    flags = set()
    for patch in sorted((ROOT / "patches" / "sglang" / line).glob("*.patch")):
        in_server_args = False
        for text in patch.read_text().splitlines():
            if text.startswith("+++ "):
                in_server_args = text.endswith("/srt/server_args.py")
            elif in_server_args and (m := re.match(r"\+    (\w+): A\[", text)):
                flags.add("--" + m.group(1).replace("_", "-"))
    return flags


def _default_adaptive_config(wheel: Path) -> dict[int, list[int]]:
    with zipfile.ZipFile(wheel) as z:
        tree = ast.parse(z.read("sglang/srt/speculative/adaptive_spec_params.py"))
    node = next(n for n in tree.body if isinstance(n, ast.AnnAssign)
                and getattr(n.target, "id", "") == "DEFAULT_ADAPTIVE_CONFIG")  # fmt: skip
    config = ast.literal_eval(node.value)
    return {int(k): v["candidate_steps"] for k, v in config.items()}


@pytest.mark.slow
@pytest.mark.parametrize("label", engines.LINE_LABELS["0.5.17"])
def test_0_5_17_engine_flags_are_fields_of_its_server_args(label, monkeypatch, tmp_path,
                                                           sglang_wheels):  # fmt: skip
    """Every flag a configuration passes is a field of 0.5.17's ServerArgs or one the
    line's patches add; an adaptive configuration's steps are among its config's candidate
    steps (0.5.17 refuses to start otherwise), upstream's default config as in the wheel."""
    wheel = sglang_wheels["cp312"]
    monkeypatch.setattr(engines, "sglang_version", lambda: (0, 5, 17))
    config = engines.CONFIGS[label]
    args = config.args(tmp_path, "triton")
    flags = _server_args_flags(wheel)
    patched = _patched_fields("0.5.17")
    assert patched == {
        "--speculative-disable-batch-threshold", "--speculative-reenable-batch-threshold",
    }  # fmt: skip
    used = [a for a in args if a.startswith("--")]
    assert [f for f in used if f not in flags | patched] == []
    assert ("--speculative-disable-batch-threshold" in used) == (config.threshold is not None)
    assert "--cuda-graph-max-bs-decode" in used and "--cuda-graph-backend-prefill" in used
    assert "--cuda-graph-max-bs" not in used and "--disable-piecewise-cuda-graph" not in used
    assert "SGLANG_ENABLE_SPEC_V2" not in config.env()  # 0.5.17 warns that it was removed
    assert engines.ADAPTIVE_DEFAULT_CONFIG == _default_adaptive_config(wheel)
    if config.spec:
        steps = int(args[args.index("--speculative-num-steps") + 1])
        assert int(args[args.index("--speculative-num-draft-tokens") + 1]) == steps + 1
        if config.adaptive:
            assert steps in {s for c in config.slot_config().values() for s in c}
    if config.adaptive_config is not None:
        path = Path(args[args.index("--speculative-adaptive-config") + 1])
        assert json.loads(path.read_text()) == {
            "1": {"candidate_steps": [2]}, "12": {"candidate_steps": [0]},
        }  # fmt: skip


def test_servers_load_a_tokenizer_and_run_xgrammar_where_both_are_there(tmp_path, monkeypatch):
    """Without the models' tokenizer or without xgrammar a server skips the tokenizer and runs
    no grammar backend (the ramp then sends no constrained request); with both, xgrammar."""
    config, real = engines.CONFIGS["eagle3-v2+threshold"], importlib.util.find_spec

    def grammar(xgrammar_installed: bool) -> tuple[bool, str]:
        def find_spec(name, *args):
            if name != "xgrammar":
                return real(name, *args)
            return object() if xgrammar_installed else None

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        args = config.args(tmp_path, "triton")
        return "--skip-tokenizer-init" in args, args[args.index("--grammar-backend") + 1]

    assert grammar(True) == grammar(False) == (True, "none")  # the models carry no tokenizer
    language.save_tokenizer(tmp_path / "target")
    assert grammar(False) == (True, "none")
    assert grammar(True) == (False, "xgrammar")


def test_engine_settings_per_line():
    assert engines.line_labels((0, 5, 12)) == engines.LINE_LABELS["0.5.12"]
    assert engines.line_labels((0, 5, 17)) == engines.LINE_LABELS["0.5.17"]
    assert engines.installed_line((0, 5, 23)) == "0.5.17"
    assert all(label in engines.CONFIGS for labels in engines.LINE_LABELS.values()
               for label in labels)  # fmt: skip
    # the batch sizes the threshold configuration switches at: 8 pads to 8, 9 to 12
    assert engines.graph_size_above(8) == 12 and engines.graph_size_above(7) == 8
    skip = engines.CONFIGS["eagle3-v2+adaptive-skip"]
    assert dict(skip.extra_env) == {"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1"}
    assert skip.zero_step_draft("0.5.17") == "skip"
    assert engines.CONFIGS["eagle3-v2+adaptive"].zero_step_draft("0.5.17") == "extend"
    # the threshold writes the draft's K/V alone from 0.5.17; -full runs the draft extend
    threshold, full = (
        engines.CONFIGS["eagle3-v2+threshold"],
        engines.CONFIGS["eagle3-v2+threshold-full"],
    )
    assert threshold.zero_step_draft("0.5.17") == "kv"
    assert threshold.zero_step_draft("0.5.12") == full.zero_step_draft("0.5.17") == "extend"
    assert dict(full.extra_env) == {"SGLANG_SPEC_ZERO_STEP_FULL_DRAFT_EXTEND": "1"}
    assert full.args(Path("/m"), "triton") == threshold.args(Path("/m"), "triton")
    assert engines.CONFIGS["eagle3-v2+adaptive"].adaptive_config is None  # upstream's default
    assert [c.threshold for c in map(engines.CONFIGS.get, engines.LINE_LABELS["0.5.17"])] == [
        None, None, 8, None, None, None, 8, 8,
    ]  # fmt: skip
    # --speculative-num-steps must be a candidate of the adaptive config (0.5.17 refuses to
    # start otherwise): 3 for upstream's default ([0, 1, 3, 7]), 2 for the threshold config
    for label in engines.LINE_LABELS["0.5.17"]:
        config = engines.CONFIGS[label]
        if config.adaptive:
            assert config.steps in {s for c in config.slot_config().values() for s in c}, label
    assert engines.CONFIGS["eagle3-v2+threshold"].hysteresis() == (8, 6)
    assert engines.CONFIGS["eagle3-v2"].steps == engines.CONFIGS["eagle3-v2+threshold"].steps == 2
