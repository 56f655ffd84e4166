"""What the run-time loader has loaded before an object because a Python import loaded it
(patchkit/abi/imports.py, loader.Loader.import_scope), the profile a run picks from the torch
found, and a wheelhouse of pure-Python wheels: the false errors of issue 43, each on real
wheels or on objects gcc builds, beside the real breaks that must stay errors."""

from __future__ import annotations

import os
import shutil
import zipfile

import pytest

from patchkit.abi import verify
from patchkit.abi.profiles import choose_profile
from tests.abi import builders

pytest_plugins = ["tests.abi.fixtures"]

PROFILE = "cu130-sm120-0.5.23"
XGRAMMAR = ("xgrammar==0.2.7", "xgrammar-0.2.7-cp311-cp311-*.whl")
TVM_FFI = ("apache-tvm-ffi==0.1.11", "apache_tvm_ffi-0.1.11-cp311-cp311-*.whl")


def _wheels(*specs) -> list[str]:
    found = [builders.real_wheel(spec, pattern) for spec, pattern in specs]
    if None in found:
        pytest.skip(f"cannot download {specs}")
    return found


def _install(site, wheels) -> str:
    """The wheels unpacked into ``site`` as pip lays them out (dist-info with its RECORD)."""
    os.makedirs(site, exist_ok=True)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
    return str(site)


def _verify_env(site: str, cache_dir: str):
    return verify(env=site, profile=PROFILE, cache_dir=cache_dir, environ={}, host_checks=False)


def _checks(report) -> dict[str, list]:
    return builders.findings_by_check(report)


@pytest.fixture
def xgrammar_site(tmp_path):
    """xgrammar 0.2.7 and apache-tvm-ffi 0.1.11 as pip installs them: xgrammar's bindings
    NEED libtvm_ffi.so and have no RUNPATH; `import xgrammar` imports tvm_ffi first."""
    return _install(tmp_path / "site", _wheels(XGRAMMAR, TVM_FFI))


def test_xgrammar_finds_libtvm_ffi_that_importing_tvm_ffi_loaded(xgrammar_site, cache_dir):
    report = _verify_env(xgrammar_site, cache_dir)
    found = _checks(report)
    assert "needed-missing" not in found and "needed-not-checked" not in found, report.findings
    assert "undefined-symbol-unchecked" not in found
    assert report.errors == 0
    from patchkit.abi.imports import ImportGraph

    graph = ImportGraph(xgrammar_site, report.reports)
    assert list(graph.loads("xgrammar")) == ["tvm_ffi/core.cpython-311-x86_64-linux-gnu.so"]


def test_a_removed_libtvm_ffi_is_still_an_error(xgrammar_site, cache_dir):
    os.unlink(os.path.join(xgrammar_site, "tvm_ffi", "lib", "libtvm_ffi.so"))
    report = _verify_env(xgrammar_site, cache_dir)
    missing = _checks(report)["needed-missing"]
    users = " ".join(f.file + " ".join(f.evidence) for f in missing)
    assert "libtvm_ffi.so" in missing[0].message and "libxgrammar_bindings.so" in users
    assert report.errors >= 1


def test_an_import_verify_cannot_see_is_not_checked_not_missing(xgrammar_site, cache_dir):
    """With no import of tvm_ffi left in xgrammar's package, libtvm_ffi.so (installed, and
    shipped by a distribution xgrammar requires) is "not checked", with the reason; a
    changed source is not answered from the run cache."""
    first = _verify_env(xgrammar_site, cache_dir)
    assert first.errors == 0
    with open(os.path.join(xgrammar_site, "xgrammar", "__init__.py"), "w") as fh:
        fh.write("# nothing imported\n")
    report = _verify_env(xgrammar_site, cache_dir)
    assert not report.cached
    found = _checks(report)
    assert "needed-missing" not in found and report.errors == 0
    (warning,) = found["needed-not-checked"]
    assert warning.severity == "warning"
    assert "tvm_ffi/lib/libtvm_ffi.so" in warning.message
    assert "xgrammar requires apache-tvm-ffi" in warning.message


def test_a_wheelhouse_of_xgrammar_and_tvm_ffi_is_not_checked_not_missing(tmp_path, cache_dir):
    house = tmp_path / "house"
    house.mkdir()
    for wheel in _wheels(XGRAMMAR, TVM_FFI):
        os.symlink(os.path.realpath(wheel), house / os.path.basename(wheel))
    report = verify(wheelhouse=str(house), profile=PROFILE, cache_dir=cache_dir, environ={})
    found = _checks(report)
    assert "needed-missing" not in found and report.errors == 0
    (warning,) = found["needed-not-checked"]
    assert "imports of a wheel's modules are not read" in warning.message


def _plugin_site(tmp_path, init: str) -> str:
    """A package laid out as triton 3.8.0 is: its core, an extension module with a SONAME
    (``triton/_C/libtriton.so``), imported by the package; a plugin that NEEDs it with a
    RUNPATH of the build machine (``/project/build/...``)."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    core = builders.stub_library("libpkcore.so", ("pk_core_entry",))
    plugin = builders.linking(
        "pk-plugin", [core], call="pk_core_entry", runpath="/project/build/pkcore/_C"
    )
    return builders.make_site(
        str(tmp_path),
        None,
        {
            "pkcore/__init__.py": init.encode(),
            "pkcore/runtime.py": b"from pkcore._C.libpkcore import entry\n",
            "pkcore/_C/libpkcore.so": core,
            "pkcore/plugins/libpkplugin.so": plugin,
        },
    )


def test_a_plugin_finds_the_core_its_package_imported(tmp_path, cache_dir):
    site = _plugin_site(tmp_path, "from .runtime import entry\n")
    report = _verify_env(site, cache_dir)
    found = _checks(report)
    assert "needed-missing" not in found and "needed-not-checked" not in found, report.findings
    assert report.errors == 0


def test_a_plugin_whose_core_no_import_loads_is_not_checked(tmp_path, cache_dir):
    site = _plugin_site(tmp_path, "")
    report = _verify_env(site, cache_dir)
    found = _checks(report)
    assert "needed-missing" not in found
    (warning,) = found["needed-not-checked"]
    assert "pkcore ships it itself" in warning.message
    os.unlink(os.path.join(site, "pkcore", "_C", "libpkcore.so"))
    report = _verify_env(site, cache_dir)
    assert [f.check for f in report.findings if f.severity == "error"] == ["needed-missing"]


def test_import_graph_reads_module_level_imports_only(tmp_path):
    """Imports inside functions and under TYPE_CHECKING are not run at import; both branches
    of another `if` and the body of a `try` are; relative imports resolve in the package."""
    from patchkit.abi.imports import ImportGraph

    site = tmp_path / "site"
    files = {
        "pkg/__init__.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    import never_a\n"
            "def f():\n    import never_b\n"
            "try:\n    from . import sub\nexcept ImportError:\n    import never_c\n"
        ),
        "pkg/sub.py": "from ..other import x\nfrom .inner import ext\n",
        "pkg/inner/__init__.py": "",
        "other/__init__.py": "from ._ext import x\n",
    }
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    objects = ["other/_ext.cpython-311-x86_64-linux-gnu.so", "pkg/inner/ext.abi3.so"]
    objects += [f"never_{c}/__init__.so" for c in "abc"] + ["never_a.so", "never_b.so"]
    graph = ImportGraph(str(site), objects)
    # `from ..other` leaves the top-level package: no module, nothing imported
    assert list(graph.loads("pkg")) == ["pkg/inner/ext.abi3.so"]
    assert list(graph.loads("other")) == ["other/_ext.cpython-311-x86_64-linux-gnu.so"]
    assert list(ImportGraph(None, objects).loads("pkg")) == []


@pytest.mark.parametrize(
    "torch, gpu, profile",
    [
        ("2.9.1", None, "cu130-sm120"),
        ("2.11.0", None, "cu130-sm120-0.5.17"),
        ("2.14.1+cu130", None, "cu130-sm120-0.5.23"),
        ("2.14.1", "9.0", "cu130-sm90-0.5.23"),
    ],
)
def test_the_torch_found_names_its_line_profile(torch, gpu, profile):
    from patchkit.abi.archs import CC

    gpus = [CC.parse(gpu)] if gpu else None
    prof, choice = choose_profile(torch=[(torch, "site-packages")], gpus=gpus)
    assert (prof.name, choice.how) == (profile, "torch")
    assert f"torch {torch}" in choice.reason and "no sglang" in choice.reason


def test_sglang_found_wins_over_torch_and_an_unknown_torch_is_the_default():
    prof, choice = choose_profile(sglang=[("0.5.17", "w")], torch=[("2.14.1", "w")])
    assert (prof.name, choice.how) == ("cu130-sm120-0.5.17", "stack")
    prof, choice = choose_profile(torch=[("2.13.0", "w")])
    assert (prof.name, choice.how) == ("cu130-sm120", "default")
    prof, choice = choose_profile(torch=[("2.14.1", "a"), ("2.11.0", "b")])
    assert choice.how == "default"


def test_two_builds_of_one_sglang_release_name_its_profile():
    """dist/ after two `make wheels LINE=0.5.17` with another series: two local labels of
    0.5.17 are one release; two releases are still the default."""
    builds = [("0.5.17+cu130.pk62b4c1a9", "a.whl"), ("0.5.17+cu130.pkd5837208", "b.whl")]
    prof, choice = choose_profile(sglang=builds)
    assert (prof.name, choice.how) == ("cu130-sm120-0.5.17", "stack")
    prof, choice = choose_profile(sglang=[("0.5.17", "a.whl"), ("0.5.23", "b.whl")])
    assert choice.how == "default" and "several sglang versions" in choice.reason


def test_an_environment_with_torch_214_and_no_sglang_gets_the_0523_profile(tmp_path, cache_dir):
    site = tmp_path / "site"
    info = site / "torch-2.14.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.14.1\n\n")
    (info / "RECORD").write_text("")
    report = verify(env=str(site), cache_dir=cache_dir, environ={}, host_checks=False)
    assert report.profile == PROFILE and report.choice.how == "torch"


def test_a_wheelhouse_of_pure_python_wheels_is_no_failure(tmp_path, cache_dir):
    """`make wheels` builds pure-Python wheels for the 0.5.9 line (sglang, flashinfer-python):
    `verify --wheelhouse dist/` checks their metadata and says so, and exits 0."""
    sglang = builders.real_wheel("sglang==0.5.9", "sglang-0.5.9-py3-none-any.whl")
    if sglang is None:
        pytest.skip("cannot download sglang 0.5.9")
    house = tmp_path / "dist"
    house.mkdir()
    os.symlink(os.path.realpath(sglang), house / os.path.basename(sglang))
    report = verify(wheelhouse=str(house), cache_dir=cache_dir, environ={})
    assert report.exit_code == 0 and report.profile == "cu130-sm120", report.findings
    (note,) = _checks(report)["pure-python"]
    assert note.severity == "note" and "--env" in note.hint and str(house) in note.hint
    empty = tmp_path / "empty"
    empty.mkdir()
    report = verify(wheelhouse=str(empty), cache_dir=cache_dir, environ={})
    assert _checks(report)["nothing-checked"]


def _stub_site(tmp_path, objects: dict[str, str]) -> str:
    if shutil.which("gcc") is None or shutil.which("g++") is None:
        pytest.skip("needs gcc and g++")
    return builders.make_site(str(tmp_path), None, objects)


def test_a_build_for_another_cuda_is_left_out_and_the_one_for_this_stack_checked(
    tmp_path, cache_dir
):
    """torch-memory-saver's layout: an untagged build, a _cu12 and a _cu13 one; on CUDA 13
    only the _cu13 build is loaded, and only its faults are errors."""
    broken = builders.linking("needs-pk-gone", [builders.stub_library("libpk_gone.so.1")])
    fine = builders.stub_library("libpk_fine.so")
    site = _stub_site(
        tmp_path,
        {
            "pkv_mode.abi3.so": broken,
            "pkv_mode_cu12.abi3.so": broken,
            "pkv_mode_cu13.abi3.so": fine,
            "pkv/cu12/_ops.so": broken,
            "pkv/cu13/_ops.so": fine,
        },
    )
    report = _verify_env(site, cache_dir)
    found = _checks(report)
    assert report.errors == 0, report.findings
    left_out = {e for f in found["variant-unused"] for e in f.evidence}
    assert left_out == {"pkv_mode.abi3.so", "pkv_mode_cu12.abi3.so", "pkv/cu12/_ops.so"}
    shutil.copy(broken, os.path.join(site, "pkv_mode_cu13.abi3.so"))  # the build in use breaks
    report = _verify_env(site, cache_dir)
    assert [f.file for f in report.findings if f.check == "needed-missing"] == [
        os.path.join(site, "pkv_mode_cu13.abi3.so")
    ]


def test_builds_for_other_torches_only_are_not_checked(tmp_path, cache_dir):
    """torch-c-dlpack-ext 0.1.5's addons for torch 2.4-2.9 on torch 2.14: it loads none."""
    broken = builders.linking("needs-pk-gone", [builders.stub_library("libpk_gone.so.1")])
    site = _stub_site(
        tmp_path, {"pkt/libaddon_torch28-cpu.so": broken, "pkt/libaddon_torch29-cpu.so": broken}
    )
    report = _verify_env(site, cache_dir)
    assert report.errors == 0
    (warning,) = _checks(report)["variant-none"]
    assert warning.severity == "warning" and "torch 2.14.1" in warning.message


def test_objects_the_profile_loads_only_where_they_load_miss_as_a_note(tmp_path, cache_dir):
    """The 0.5.23 profile's [loading] optional: torchcodec's core for each FFmpeg major; a
    library another object misses stays an error."""
    core = builders.linking("needs-pk-avcodec", [builders.stub_library("libpk_avcodec.so.58")])
    site = _stub_site(
        tmp_path,
        {"torchcodec/libtorchcodec_core4.so": core, "torchcodec/libother.so": core},
    )
    report = _verify_env(site, cache_dir)
    (note,) = _checks(report)["needed-optional"]
    assert note.severity == "note" and "libpk_avcodec.so.58" in note.message
    assert [f.file for f in report.findings if f.check == "needed-missing"] == [
        os.path.join(site, "torchcodec", "libother.so")
    ]


def test_torch_names_of_an_object_linking_no_torch_are_not_checked(tmp_path, cache_dir):
    """cuda-core's tensor bridge: torch's shim, no torch library NEEDed (torch._C is reopened
    RTLD_GLOBAL before it loads): a warning; one NEEDing libc10.so only stays an error."""
    site = _stub_site(
        tmp_path,
        {
            "pkg_bridge/_bridge.so": builders.shim_caller_linking_nothing(),
            "pkg_c10/_ext.so": builders.shim_caller_without_libtorch(),
            "pkg_c10/libc10.so": builders.stub_library("libc10.so"),
        },
    )
    report = _verify_env(site, cache_dir)
    found = _checks(report)
    (warning,) = found["undefined-symbol-global"]
    assert warning.file.endswith("_bridge.so") and "aoti_torch_abi_version" in warning.evidence
    assert all(f.file.endswith("pkg_c10/_ext.so") for f in found["undefined-symbol-other"])


def test_every_profile_counts_libmvec_as_the_hosts():
    from patchkit.abi.profiles import available, load_profile

    for name in available(None):
        assert load_profile(name).host_provides("libmvec.so.1"), name
