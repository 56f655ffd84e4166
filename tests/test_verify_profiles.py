"""The verify profiles of each SGLang line (`build/profiles/`) and how verify chooses one: the
profile pinning the sglang found, an explicit one winning, a mismatch as an error."""

from __future__ import annotations

import os
import shutil

import pytest
from helpers import result_of

from patchkit.abi import torchsyms, verify
from patchkit.abi.archs import CC
from patchkit.abi.profiles import choose_profile, load_profile
from patchkit.cli import main
from patchkit.compat import tomllib
from tests.abi import builders

REPO = builders.REPO

# line -> (torch, kernel package and version, flashinfer-python)
STACKS = {
    "0.5.9": ("2.9.1+cu130", ("sgl-kernel", "0.3.21"), "0.6.3"),
    "0.5.17": ("2.11.0+cu130", ("sglang-kernel", "0.4.5"), "0.6.15.post1"),
    "0.5.23": ("2.14.1+cu130", ("sglang-kernel", "0.4.10"), "0.7.2"),
}
PROFILES = {
    "cu130-sm120": ("0.5.9", "12.0"),
    "cu130-sm90": ("0.5.9", "9.0"),
    "cu130-sm120-0.5.17": ("0.5.17", "12.0"),
    "cu130-sm90-0.5.17": ("0.5.17", "9.0"),
    "cu130-sm120-0.5.23": ("0.5.23", "12.0"),
    "cu130-sm90-0.5.23": ("0.5.23", "9.0"),
}
WHEEL_0523 = "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_each_line_profile_pins_its_stack(name):
    line, cc = PROFILES[name]
    torch, (kernel, kernel_version), flashinfer = STACKS[line]
    prof = load_profile(name)
    assert prof.name == name and [str(t) for t in prof.targets] == [cc]
    assert prof.torch_version == torch and prof.cuda_major == 13
    assert prof.pins["sglang"] == line and prof.pins[kernel] == kernel_version
    assert prof.pins["flashinfer-python"] == flashinfer
    # the symbol set is the real wheel's of that torch (what load_profile_torch reads)
    doc = torchsyms.load(prof.data_file(prof.torch_symbols))
    assert doc["torch"].split("+")[0] == torch.split("+")[0]
    assert doc["wheel"].startswith(f"torch-{torch.split('+')[0]}-")
    if line != "0.5.9":  # 2.9.1's set comes from PyPI's CUDA 12.8 build (docs/verify.md)
        cuda = doc["libraries"]["torch/lib/libtorch_cuda.so"]["needed"]
        assert {"libcudart.so.13", "libcublas.so.13"} <= set(cuda) and "libcudart.so.12" not in cuda


def test_every_carried_line_has_a_profile_per_gpu():
    """Each sglang line targets.toml carries (not retired) is pinned by an SM120 and an SM90
    profile, so verify can pick one for it."""
    with open(os.path.join(REPO, "patches", "targets.toml"), "rb") as fh:
        lines = tomllib.load(fh)["targets"]["sglang"]["lines"]
    carried = sorted(n for n, spec in lines.items() if "retired" not in spec)
    assert carried == sorted(STACKS)
    for line in carried:
        # without --gpu, the default profile's GPU (SM120); with one, that GPU's profile
        for gpus, cc in ((None, "12.0"), ([CC.parse("9.0")], "9.0")):
            prof, choice = choose_profile(sglang=[(line, "here")], gpus=gpus)
            assert choice.how == "stack" and prof.pins["sglang"] == line
            assert [str(t) for t in prof.targets] == [cc], (line, cc, prof.name)


def _house(tmp_path, wheel=WHEEL_0523, requires=("torch==2.14.1", "sglang-kernel==0.4.10")):
    """A wheelhouse of one made sglang wheel holding one real (gcc-built) shared object."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    house = tmp_path / "house"
    house.mkdir()
    lib = builders.stub_library("libdemo.so", ("demo",))
    members = {"sglang/srt/libdemo.so": open(lib, "rb").read()}
    builders.make_wheel(str(house), wheel, members, requires)
    return house


def test_auto_choice_follows_the_sglang_of_the_wheelhouse(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PATCHKIT_PROFILE", raising=False)
    house = _house(tmp_path)
    assert main(["verify", "--wheelhouse", str(house), "--json"]) == 0
    doc = result_of(capsys.readouterr().out)
    assert doc["profile"] == "cu130-sm120-0.5.23" and doc["targets"] == ["12.0"]
    assert doc["profile_choice"] == {
        "name": "cu130-sm120-0.5.23",
        "how": "stack",
        "reason": f"the profile of sglang 0.5.23 (found in {WHEEL_0523})",
        "sglang": "0.5.23",
        "stack_profile": "cu130-sm120-0.5.23",
    }
    # torch==2.14.1 is the profile's torch: no torch-pin, no mismatch
    assert [f["check"] for f in doc["findings"]] == ["torch-from-profile"]
    # --gpu picks the line's profile for that GPU; the text output says which and why
    assert main(["verify", "--wheelhouse", str(house), "--gpu", "9.0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == (
        f"profile  cu130-sm90-0.5.23: the profile of sglang 0.5.23 (found in {WHEEL_0523})"
    )
    assert "profile cu130-sm90-0.5.23; targets 9.0" in out[-1]


def test_explicit_profile_wins_and_a_mismatch_is_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PATCHKIT_PROFILE", raising=False)
    house = _house(tmp_path)
    assert main(["verify", "--wheelhouse", str(house), "--json", "--profile", "cu130-sm120"]) == 1
    doc = result_of(capsys.readouterr().out)
    assert doc["profile"] == "cu130-sm120"
    assert doc["profile_choice"]["how"] == "option"
    assert doc["profile_choice"]["stack_profile"] == "cu130-sm120-0.5.23"
    errors = {f["check"]: f for f in doc["findings"] if f["severity"] == "error"}
    assert sorted(errors) == ["profile-stack", "torch-pin"]
    mismatch = errors["profile-stack"]
    assert mismatch["file"] == WHEEL_0523 and mismatch["number"] == 0
    assert mismatch["message"] == (
        "sglang 0.5.23 is not the stack of profile cu130-sm120 (sglang 0.5.9, torch "
        "2.9.1+cu130): its torch symbols, pins and kernel rules are another line's"
    )
    assert "--profile cu130-sm120-0.5.23" in mismatch["hint"]
    # $PATCHKIT_PROFILE is explicit too, and says so
    monkeypatch.setenv("PATCHKIT_PROFILE", "cu130-sm90-0.5.17")
    assert main(["verify", "--wheelhouse", str(house)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "profile  cu130-sm90-0.5.17: given by $PATCHKIT_PROFILE"
    assert any(ln.startswith(f"error    {WHEEL_0523}: sglang 0.5.23 is not the") for ln in out)


def test_a_version_no_profile_pins_falls_back_to_the_default(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PATCHKIT_PROFILE", raising=False)
    wheel = "sglang-0.5.99-cp311-cp311-manylinux_2_34_x86_64.whl"
    house = _house(tmp_path, wheel, requires=())
    assert main(["verify", "--wheelhouse", str(house), "--json"]) == 1
    doc = result_of(capsys.readouterr().out)
    assert doc["profile"] == "cu130-sm120" and doc["profile_choice"]["how"] == "default"
    assert doc["profile_choice"]["reason"] == (
        f"the default: no profile pins sglang 0.5.99 (found in {wheel})"
    )
    (mismatch,) = [f for f in doc["findings"] if f["check"] == "profile-stack"]
    assert "no profile pins it" in mismatch["hint"]


def test_installed_sglang_chooses_too(tmp_path):
    """An environment: the dist-info of the sglang installed (a patched, local version)."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    lib = builders.stub_library("libdemo.so", ("demo",))
    site = builders.make_site(str(tmp_path), None, {"demo/libdemo.so": lib})
    info = os.path.join(site, "sglang-0.5.17+cu130.pk1a2b3c.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as fh:
        fh.write("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.17+cu130.pk1a2b3c\n\n")
    report = verify(env=site, cache_dir=str(tmp_path / "c"), host_checks=False, environ={})
    assert report.profile == "cu130-sm120-0.5.17" and report.choice.how == "stack"
    assert report.choice.reason == f"the profile of sglang 0.5.17+cu130.pk1a2b3c (found in {site})"
    assert "profile-stack" not in [f.check for f in report.findings]


def test_real_sglang_0523_wheel_needs_its_profiles_torch(tmp_path):
    """SGLang 0.5.23's own wheel from PyPI: its rust mem_cache extension links torch 2.14.1's
    c10 (``c10::TensorImpl::decref_pyobject``), which the chosen profile's symbol set has and
    torch 2.9.1's lacks."""
    builders.real_wheelhouse(tmp_path / "house", "sglang==0.5.23", "sglang-0.5.23-cp31*.whl")
    house = str(tmp_path / "house")
    auto = verify(wheelhouse=house, cache_dir=str(tmp_path / "c"), environ={})
    assert auto.profile == "cu130-sm120-0.5.23" and auto.errors == 0, [
        f.line() for f in auto.findings
    ]
    old = verify(wheelhouse=house, cache_dir=str(tmp_path / "c"), profile="cu130-sm120")
    errors = {f.check: f for f in old.findings if f.severity == "error"}
    assert {"profile-stack", "torch-pin", "undefined-symbol-profile"} <= set(errors)
    assert "decref_pyobject" in errors["undefined-symbol-profile"].message
