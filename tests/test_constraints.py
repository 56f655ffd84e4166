"""The install constraints of each SGLang line pin the torch family as one, and the wheel-base
lines' agree with what their real sglang wheels require."""

from __future__ import annotations

import zipfile

import pytest
from helpers import ROOT
from packaging.requirements import Requirement
from packaging.version import Version

CONSTRAINTS = ROOT / "build" / "constraints"
TORCH_FAMILY = ("torch", "torchvision", "torchaudio")


def _constraints(name: str) -> dict[str, Requirement]:
    lines = (raw.split("#", 1)[0].strip() for raw in (CONSTRAINTS / name).read_text().splitlines())
    reqs = (Requirement(line) for line in lines if line)
    return {req.name.lower().replace("_", "-"): req for req in reqs}


def _pinned(req: Requirement) -> Version:
    (spec,) = req.specifier
    assert spec.operator == "==", f"{req} is not an exact pin"
    return Version(spec.version)


@pytest.mark.parametrize("name", ["cu130.txt", "cu130-0.5.17.txt", "cu130-0.5.23.txt"])
def test_torch_family_pinned_as_one_cu130_build(name):
    pins = _constraints(name)
    missing = [p for p in TORCH_FAMILY if p not in pins]
    assert not missing, f"{name} leaves {missing} unpinned"
    for package in TORCH_FAMILY:
        assert _pinned(pins[package]).local == "cu130", f"{name}: {pins[package]}"
    # torchvision's minor follows torch's: 2.9 <-> 0.24, 2.11 <-> 0.26.
    torch, vision = _pinned(pins["torch"]), _pinned(pins["torchvision"])
    assert vision.minor == torch.minor + 15, f"{name}: torchvision {vision} for torch {torch}"
    audio = _pinned(pins["torchaudio"]).public
    # 0.5.23 keeps torchaudio 2.11.0 under torch 2.14.1 (its extensions use the stable C shim)
    assert audio == torch.public or (name, str(audio)) == ("cu130-0.5.23.txt", "2.11.0")


@pytest.fixture(scope="session")
def line_wheels(request):
    """The pinned cp311 wheel of a wheel-base line."""
    fixture = {"0.5.17": "sglang_wheels", "0.5.23": "sglang_0523_wheels"}[request.param]
    return request.param, request.getfixturevalue(fixture)["cp311"]


@pytest.mark.slow
@pytest.mark.parametrize("line_wheels", ["0.5.17", "0.5.23"], indirect=True)
def test_line_constraints_agree_with_the_real_wheel(line_wheels):
    line, wheel_file = line_wheels
    with zipfile.ZipFile(wheel_file) as zf:
        meta = zf.read(f"sglang-{line}.dist-info/METADATA").decode()
    requires = [
        Requirement(line.split(":", 1)[1].strip())
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    wheel = {r.name.lower().replace("_", "-"): r for r in requires if r.marker is None}
    pins = _constraints(f"cu130-{line}.txt")
    for name, constraint in pins.items():
        assert not constraint.extras, f"{constraint}: pip refuses extras in constraints"
        if name not in wheel:
            continue
        built = _pinned(constraint) if "==" in str(constraint.specifier) else None
        if built is not None:
            assert wheel[name].specifier.contains(built, prereleases=True), (
                f"sglang {line} requires {wheel[name]}; the constraints pin {constraint}"
            )
    # every exact pin of the CUDA stack the wheel makes is in the constraints, at that version
    for name in ("torch", "torchaudio", "sglang-kernel", "flashinfer-python", "nvidia-cutlass-dsl"):
        assert name in pins, f"sglang {line} pins {wheel[name]}; the constraints leave it out"
    assert str(wheel["torchvision"].specifier) == "", f"{line} now pins torchvision itself"
    assert wheel["cuda-python"].specifier.contains(Version("13.0"))
    assert not pins["cuda-python"].specifier.contains(Version("14.0"))
