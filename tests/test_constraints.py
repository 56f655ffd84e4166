"""The install constraints of each SGLang line pin the torch family as one, and the 0.5.17
line's agree with what the real sglang 0.5.17 wheel requires."""

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


@pytest.mark.parametrize("name", ["cu130.txt", "cu130-0.5.17.txt"])
def test_torch_family_pinned_as_one_cu130_build(name):
    pins = _constraints(name)
    missing = [p for p in TORCH_FAMILY if p not in pins]
    assert not missing, f"{name} leaves {missing} unpinned"
    for package in TORCH_FAMILY:
        assert _pinned(pins[package]).local == "cu130", f"{name}: {pins[package]}"
    # torchvision's minor follows torch's: 2.9 <-> 0.24, 2.11 <-> 0.26.
    torch, vision = _pinned(pins["torch"]), _pinned(pins["torchvision"])
    assert vision.minor == torch.minor + 15, f"{name}: torchvision {vision} for torch {torch}"
    assert _pinned(pins["torchaudio"]).public == torch.public


@pytest.mark.slow
def test_0_5_17_constraints_agree_with_the_real_wheel(sglang_wheels):
    with zipfile.ZipFile(sglang_wheels["cp311"]) as zf:
        meta = zf.read("sglang-0.5.17.dist-info/METADATA").decode()
    requires = [
        Requirement(line.split(":", 1)[1].strip())
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    wheel = {r.name.lower().replace("_", "-"): r for r in requires if r.marker is None}
    pins = _constraints("cu130-0.5.17.txt")
    for name, constraint in pins.items():
        assert not constraint.extras, f"{constraint}: pip refuses extras in constraints"
        if name not in wheel:
            continue
        built = _pinned(constraint) if "==" in str(constraint.specifier) else None
        if built is not None:
            assert wheel[name].specifier.contains(built, prereleases=True), (
                f"sglang 0.5.17 requires {wheel[name]}; the constraints pin {constraint}"
            )
    # every exact pin of the CUDA stack the wheel makes is in the constraints, at that version
    for name in ("torch", "torchaudio", "sglang-kernel", "flashinfer-python", "nvidia-cutlass-dsl"):
        assert name in pins, f"sglang 0.5.17 pins {wheel[name]}; the constraints leave it out"
    assert str(wheel["torchvision"].specifier) == "", "0.5.17 now pins torchvision itself"
    assert wheel["cuda-python"].specifier.contains(Version("13.0"))
    assert not pins["cuda-python"].specifier.contains(Version("14.0"))
