"""`patchkit build`: the real patched sglang wheel, its version, pins, provenance, SBOM and
reproducibility; plus the reproducible-layout and version helpers on small inputs."""

from __future__ import annotations

import hashlib
import json
import re
import runpy
import subprocess
import time
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest
from helpers import ROOT, patchkit, result_of, series_folder
from unidiff import PatchSet

from patchkit.errors import BuildError, ConfigError, UsageError
from patchkit.wheels import load_build_profile, wheel_version
from patchkit.wheels.build import pin_version
from patchkit.wheels.reproducible import check_record, normalize_wheel, read_record
from patchkit.wheels.sbom import validate_sbom
from patchkit.workspace import Workspace

pytest_plugins = ["wheel_fixtures"]
DIST_INFO_RE = re.compile(r"^sglang-(?P<version>[^/]+)\.dist-info/")


@pytest.fixture(scope="module")
def series():
    return Workspace.load().series("sglang")  # the seed line's (the test project's default)


def _read(wheel: Path, suffix: str) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        [name] = [n for n in zf.namelist() if n.endswith(suffix)]
        return zf.read(name)


def _metadata(wheel: Path):
    return HeaderParser().parsestr(_read(wheel, ".dist-info/METADATA").decode())


# --- the real wheel ----------------------------------------------------------------------------


@pytest.mark.slow
def test_wheel_is_versioned_with_the_variant_and_series_hash(sglang_wheel, series):
    expected = f"0.5.9+cu130.pk{series.hash()[:8]}"
    assert sglang_wheel.path.name == f"sglang-{expected}-py3-none-any.whl"
    assert sglang_wheel.path.parent.name == "dist"
    meta = _metadata(sglang_wheel.path)
    assert meta["Name"] == "sglang"
    assert meta["Version"] == expected  # pip discards wheels whose METADATA disagrees
    [entry] = sglang_wheel.report["wheels"]
    assert entry["version"] == expected
    assert entry["series"]["patches"] == series.names
    assert entry["series"]["hash"] == series.hash()
    assert sglang_wheel.report["profile"]["name"] == "cu130-sm120"
    assert sglang_wheel.report["skipped"] == []


@pytest.mark.slow
def test_metadata_carries_the_cu130_pins_from_the_series(sglang_wheel):
    requires = _metadata(sglang_wheel.path).get_all("Requires-Dist")
    cuda = [r for r in requires if r.startswith("cuda-python")]
    assert cuda == ["cuda-python<14,>=13.0"]
    assert "cuda-python==12.9" not in requires
    assert "torch==2.9.1" in requires
    assert "sgl-kernel==0.3.21" in requires
    assert "flashinfer_python==0.6.3" in requires


@pytest.mark.slow
def test_provenance_names_upstream_series_patches_profile_and_tools(
    sglang_wheel, series, workspace
):
    prov = json.loads(_read(sglang_wheel.path, ".dist-info/patchkit.json"))
    release = workspace.target("sglang").pinned
    assert prov["distribution"] == "sglang"
    assert prov["upstream"]["commit"] == release.commit
    assert prov["upstream"]["sdist"] == "sglang==0.5.9"
    assert prov["upstream"]["sdist_sha256"] == release.sdist_sha256
    assert prov["series"]["version"] == workspace.targets.series_version
    assert prov["series"]["hash"] == series.hash()
    assert [(p["name"], p["sha256"]) for p in prov["series"]["patches"]] == [
        (p.name, p.sha256) for p in series.patches
    ]
    assert prov["profile"]["name"] == "cu130-sm120"
    assert prov["profile"]["variant"] == "cu130"
    for tool in ("patchkit", "build", "setuptools", "setuptools-scm", "python"):
        assert prov["tools"].get(tool), tool
    assert prov["source_date_epoch"] > 0


@pytest.mark.slow
def test_sbom_is_valid_cyclonedx_with_pedigree(sglang_wheel, series):
    raw = _read(sglang_wheel.path, ".dist-info/sboms/patchkit.cdx.json")
    assert validate_sbom(raw) is None
    bom = json.loads(raw)
    component = bom["metadata"]["component"]
    assert component["name"] == "sglang"
    assert component["version"] == sglang_wheel.report["wheels"][0]["version"]
    [ancestor] = component["pedigree"]["ancestors"]
    assert (ancestor["name"], ancestor["version"]) == ("sglang", "0.5.9")
    assert ancestor["purl"] == "pkg:pypi/sglang@0.5.9"
    patches = component["pedigree"]["patches"]
    assert len(patches) == len(series.patches)
    assert {p["type"] for p in patches} == {"unofficial"}
    assert {p["diff"]["text"]["content"] for p in patches} == {p.diff for p in series.patches}
    urls = {p["diff"].get("url") for p in patches}
    assert "https://github.com/sgl-project/sglang/pull/22836" in urls  # the backport's Origin


@pytest.mark.slow
def test_wheel_layout_is_normalized(sglang_wheel):
    prov = json.loads(_read(sglang_wheel.path, ".dist-info/patchkit.json"))
    stamp = time.gmtime(prov["source_date_epoch"] // 2 * 2)[:6]  # zip times have 2 s steps
    with zipfile.ZipFile(sglang_wheel.path) as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos]
    assert names[-1].endswith(".dist-info/RECORD")
    body = [n for n in names if not DIST_INFO_RE.match(n)]
    assert body == sorted(body)
    assert {i.date_time for i in infos} == {stamp}
    assert {(i.external_attr >> 16) & 0o777 for i in infos} <= {0o644, 0o755}
    assert check_record(sglang_wheel.path) == []


@pytest.mark.slow
def test_two_builds_from_clean_trees_are_byte_identical(
    sglang_wheel, rebuild_sglang, tmp_path, workspace
):
    # another project directory, cache and work tree: nothing is shared with the first build
    result = rebuild_sglang(tmp_path)
    second = tmp_path / "dist" / sglang_wheel.path.name
    assert second.is_file()
    assert str(second) in result.stdout  # the wheel path and the series it carries
    assert f"sglang series {workspace.targets.series_version}" in result.stdout
    first_sha = sglang_wheel.report["wheels"][0]["sha256"]
    assert hashlib.sha256(second.read_bytes()).hexdigest() == first_sha


@pytest.mark.slow
def test_installed_wheel_has_the_version_and_the_patched_lines(sglang_wheel, sglang_site, series):
    version = sglang_wheel.report["wheels"][0]["version"]
    # sglang/__init__.py takes __version__ from sglang/version.py -> sglang/_version.py
    init = (sglang_site / "sglang" / "__init__.py").read_text()
    assert "from sglang.version import __version__" in init
    assert runpy.run_path(str(sglang_site / "sglang" / "_version.py"))["__version__"] == version
    python = sglang_site.parents[2] / "bin" / "python"
    got = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m;print(m.version('sglang'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert got == version
    checked = 0
    for patch in series.patches:
        for pf in PatchSet(patch.diff):
            path = pf.path.removeprefix("python/")
            if not path.startswith("sglang/"):
                continue  # e.g. python/pyproject.toml is not installed
            installed = (sglang_site / path).read_text()
            for hunk in pf:
                for line in hunk.target_lines():
                    if line.is_added and line.value.strip():
                        assert line.value in installed, f"{patch.name}: {path}: {line.value!r}"
                        checked += 1
    assert checked > 20


@pytest.mark.slow
def test_flashinfer_builds_a_pure_python_wheel_with_its_version_and_patch(
    build_flashinfer, workspace
):
    series = workspace.series("flashinfer")
    version = f"0.6.3+cu130.pk{series.hash()[:8]}"
    wheel = build_flashinfer.path
    assert wheel.name == f"flashinfer_python-{version}-py3-none-any.whl"
    meta = _metadata(wheel)
    assert (meta["Name"], meta["Version"]) == ("flashinfer-python", version)
    build_meta = _read(wheel, "flashinfer/_build_meta.py").decode()
    assert f'__version__ = "{version}"' in build_meta
    assert f'__git_version__ = "{workspace.target("flashinfer").pinned.commit}"' in build_meta
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        comm = zf.read("flashinfer/jit/comm.py").decode()
    assert not any(n.endswith((".so", ".cubin")) for n in names)  # nothing compiled
    assert "flashinfer/data/include/flashinfer/comm/trtllm_allreduce.cuh" in names
    assert "supported_major_versions=[9, 10, 12]" in comm
    prov = json.loads(_read(wheel, ".dist-info/patchkit.json"))
    assert [p["name"] for p in prov["series"]["patches"]] == series.names
    assert validate_sbom(_read(wheel, ".dist-info/sboms/patchkit.cdx.json")) is None
    # the patched tree is gone once the wheel is written; its build log stays
    work = build_flashinfer.project / "work" / "build" / "flashinfer"
    assert sorted(p.name for p in work.iterdir()) == ["build.log"]
    assert [w["tree"] for w in build_flashinfer.report["wheels"]] == [None]


def test_an_empty_series_is_skipped_not_built(project, cache):
    (series_folder(project, "flashinfer") / "series").write_text("# nothing\n")
    result = patchkit("build", "--target", "flashinfer", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    report = result_of(result.stdout)
    assert report["wheels"] == []
    assert report["skipped"][0]["target"] == "flashinfer line 0.6.3"  # the default line


def test_all_on_a_line_builds_the_lines_it_is_built_with(workspace, monkeypatch):
    """`build --target all --line L`: the targets with a line L, and for the others the line
    L names in `with` (sglang 0.5.17 is built with FlashInfer 0.6.15.post1)."""
    from patchkit.wheels.build import lines_to_build

    every = workspace.expand(["all"])

    def chosen(line):
        return [(s.target, t.line) for s, t in lines_to_build(workspace, every, line)]

    assert chosen("0.5.17") == [("sglang", "0.5.17"), ("flashinfer", "0.6.15.post1")]
    assert chosen("0.5.9") == [("sglang", "0.5.9"), ("flashinfer", "0.6.3")]
    assert chosen("0.6.15.post1") == [("flashinfer", "0.6.15.post1")]
    assert chosen(None) == [("sglang", "0.5.9"), ("flashinfer", "0.6.3")]  # the seed default
    # The project's own default, the newest line, which names no FlashInfer line (`make
    # wheels` builds SGLang 0.5.23 alone).
    monkeypatch.delenv("PATCHKIT_PROJECT")
    real = Workspace.load(ROOT)
    assert [(s.target, t.line) for s, t in lines_to_build(real, real.expand(["all"]), None)] == [
        ("sglang", "0.5.23")
    ]
    with pytest.raises(UsageError, match="sglang line 0.5.12 is retired: .*--line 0.5.17"):
        chosen("0.5.12")
    with pytest.raises(UsageError, match="--line 0.5.99: no target has that line"):
        chosen("0.5.99")


def test_all_on_a_line_reports_its_companion_skipped_when_empty(project, tmp_path):
    """Both series of the 0.5.17 build emptied: nothing is fetched or built, and the report
    names the FlashInfer line that `with` chose."""
    for target, line in (("sglang", "0.5.17"), ("flashinfer", "0.6.15.post1")):
        (project / "patches" / target / line / "series").write_text("# nothing\n")
    env = {"PATCHKIT_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "out"
    result = patchkit(
        "build", "--target", "all", "--line", "0.5.17", "--out", str(out), "--json", env=env
    )
    assert result.returncode == 0, result.stderr
    report = result_of(result.stdout)
    assert report["wheels"] == []
    assert [s["target"] for s in report["skipped"]] == [
        "sglang line 0.5.17",
        "flashinfer line 0.6.15.post1",
    ]
    assert not (tmp_path / "cache").exists()


def test_unknown_profile_is_a_usage_error(project):
    result = patchkit("build", "--target", "sglang", "--profile", "nope", cwd=project)
    assert result.returncode == 2
    assert "no build profile 'nope'" in result.stderr
    assert "cu130-sm120" in result.stderr


def test_an_out_folder_the_build_would_sweep_or_a_file_is_refused_first(project, tmp_path):
    """`--out` inside work/build (the scratch the next build moves aside and removes whole)
    would lose what the user keeps there; `--out` naming a file fails only after the build.
    Both are refused before anything is built, and nothing there changes."""
    scratch_out = project / "work" / "build" / "flashinfer" / "dist"
    scratch_out.mkdir(parents=True)
    (scratch_out / "NOTES.txt").write_text("mine\n")
    a_file = tmp_path / "wheels.txt"
    a_file.write_text("mine\n")
    for out, words in ((scratch_out, "inside the build scratch"), (a_file, "not a folder")):
        result = patchkit("build", "--target", "flashinfer", "--out", str(out), cwd=project)
        assert result.returncode == 2, result.stdout + result.stderr
        assert words in result.stderr and "nothing was built" in result.stderr
    assert (scratch_out / "NOTES.txt").read_text() == "mine\n" and a_file.read_text() == "mine\n"


# --- helpers on small inputs -------------------------------------------------------------------


def _toy_wheel(path: Path, order: list[str], stamp: tuple) -> None:
    files = {
        "pkg/__init__.py": b"x = 1\n",
        "pkg/b.py": b"b = 2\n",
        "pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n",
        "pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\n",
        "pkg-1.0.dist-info/RECORD": b"stale\n",
    }
    with zipfile.ZipFile(path, "w") as zf:
        for name in order:
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.external_attr = 0o100664 << 16
            zf.writestr(info, files[name])


def test_normalize_wheel_is_independent_of_order_and_timestamps(tmp_path):
    names = [
        "pkg-1.0.dist-info/RECORD",
        "pkg/b.py",
        "pkg-1.0.dist-info/METADATA",
        "pkg/__init__.py",
        "pkg-1.0.dist-info/WHEEL",
    ]
    _toy_wheel(tmp_path / "a.whl", names, (2020, 1, 1, 0, 0, 0))
    _toy_wheel(tmp_path / "b.whl", list(reversed(names)), (2024, 5, 6, 7, 8, 10))
    extra = {"pkg-1.0.dist-info/patchkit.json": b"{}\n"}
    normalize_wheel(tmp_path / "a.whl", tmp_path / "out-a" / "pkg.whl", 1700000000, extra)
    normalize_wheel(tmp_path / "b.whl", tmp_path / "out-b" / "pkg.whl", 1700000000, extra)
    a, b = (tmp_path / d / "pkg.whl" for d in ("out-a", "out-b"))
    assert a.read_bytes() == b.read_bytes()
    with zipfile.ZipFile(a) as zf:
        assert zf.namelist() == [
            "pkg/__init__.py",
            "pkg/b.py",
            "pkg-1.0.dist-info/METADATA",
            "pkg-1.0.dist-info/WHEEL",
            "pkg-1.0.dist-info/patchkit.json",
            "pkg-1.0.dist-info/RECORD",
        ]
        record = read_record(zf.read("pkg-1.0.dist-info/RECORD").decode())
    assert [r.path for r in record][-1] == "pkg-1.0.dist-info/RECORD"
    assert any(r.path.endswith("patchkit.json") and r.size == 3 for r in record)
    assert check_record(a) == []


def test_wheel_version_is_pep440_with_a_local_label():
    assert (
        wheel_version("0.5.9", "cu130", "57d6fdf6951bc1d9" + "0" * 48) == "0.5.9+cu130.pk57d6fdf6"
    )
    assert wheel_version("0.6.3", "cu130", "abcdef12" * 8) == "0.6.3+cu130.pkabcdef12"


def test_profile_variant_comes_from_build_key_else_torch_label(tmp_path):
    (tmp_path / "explicit.toml").write_text(
        '[build]\nvariant = "cu131"\n[torch]\nversion = "2.9.1+cu130"\n'
    )
    (tmp_path / "torch.toml").write_text('[torch]\nversion = "2.9.1+cu130"\n')
    (tmp_path / "major.toml").write_text("[cuda]\nmajor = 13\n")
    (tmp_path / "none.toml").write_text('name = "x"\n')
    assert load_build_profile(tmp_path, "explicit").variant == "cu131"
    assert load_build_profile(tmp_path, "torch").variant == "cu130"
    assert load_build_profile(tmp_path, "major").variant == "cu130"
    with pytest.raises(ConfigError):
        load_build_profile(tmp_path, "none")
    with pytest.raises(UsageError):
        load_build_profile(tmp_path, "missing")
    for name in ("cu130-sm120", "cu130-sm90"):
        assert load_build_profile(ROOT / "build" / "profiles", name).variant == "cu130"


def test_pin_version_for_setuptools_scm_and_for_a_version_attribute(tmp_path):
    scm = tmp_path / "scm"
    scm.mkdir()
    (scm / "pyproject.toml").write_text(
        '[project]\nname = "Some.Pkg"\ndynamic = ["version"]\n[tool.setuptools_scm]\n'
    )
    env = pin_version(scm, "1.0+cu130.pk00000000", "bbe9c7eeb520b0a67e92d133dfc137a3688dc7f2")
    assert env["SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SOME_PKG"] == "1.0+cu130.pk00000000"
    assert env["SETUPTOOLS_SCM_PRETEND_METADATA_FOR_SOME_PKG"] == '{node="gbbe9c7eeb5"}'

    attr = tmp_path / "attr"
    (attr / "pkg").mkdir(parents=True)
    (attr / "pyproject.toml").write_text(
        '[project]\nname = "pkg"\ndynamic = ["version"]\n'
        '[tool.setuptools.dynamic]\nversion = { attr = "pkg._meta.__version__" }\n'
    )
    meta = attr / "pkg" / "_meta.py"
    meta.write_text('"""m"""\n__version__ = "0.6.3"\n__git_version__ = "d0"\n')
    assert pin_version(attr, "0.6.3+cu130.pk00000000", None) == {}
    assert meta.read_text() == (
        '"""m"""\n__version__ = "0.6.3+cu130.pk00000000"\n__git_version__ = "d0"\n'
    )

    static = tmp_path / "static"
    static.mkdir()
    (static / "pyproject.toml").write_text('[project]\nname = "s"\nversion = "1"\n')
    with pytest.raises(BuildError, match="static"):
        pin_version(static, "1+cu130.pk0", None)
