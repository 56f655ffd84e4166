"""cu130-packaging-pins.patch: the sglang package metadata declares the CUDA 13 stack."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

# 0.5.12 declares the CUDA 13 stack itself: carried on the 0.5.9 line only.
pytestmark = [pytest.mark.payload, pytest.mark.sglang_lines("0.5.9")]

TORCH_FAMILY = ("torch", "torchvision", "torchaudio")
CU130_INDEX = "https://download.pytorch.org/whl/cu130"
CONSTRAINTS = "build/constraints/cu130.txt"
REPO = Path(__file__).resolve().parents[2]


def _pyproject(sglang_tree) -> dict:
    return tomllib.loads((sglang_tree / "python" / "pyproject.toml").read_text())


def _requirements(lines) -> dict[str, Requirement]:
    requirements = (Requirement(line) for line in lines)
    return {req.name.lower().replace("_", "-"): req for req in requirements}


def _constraints(repo) -> dict[str, Requirement]:
    lines = (raw.split("#", 1)[0].strip() for raw in (repo / CONSTRAINTS).read_text().splitlines())
    return _requirements(line for line in lines if line)


def _pinned(req: Requirement) -> Version:
    (spec,) = req.specifier
    assert spec.operator == "==", f"{req} is not an exact pin"
    return Version(spec.version)


def test_pyproject_declares_cuda13_stack(sglang_tree):
    project = _pyproject(sglang_tree)
    deps = _requirements(project["project"]["dependencies"])

    cuda_python = deps["cuda-python"].specifier
    assert cuda_python.contains(Version("13.0.0")) and cuda_python.contains(Version("13.2"))
    assert not cuda_python.contains(Version("12.9")), "still pins the CUDA 12 bindings"
    assert not cuda_python.contains(Version("14.0"))

    # The cu130 builds of these carry a local label; an == pin without one accepts them.
    assert deps["sgl-kernel"].specifier.contains(Version("0.3.21+cu130"))
    assert str(deps["flashinfer-python"].specifier) == "==0.6.3"

    # The whole torch family is pinned, each to the release built for torch 2.9.1, taken from
    # the cu130 index by uv, and constrained to the same cu130 builds for pip.
    constraints = _constraints(REPO)
    indexes = {index["name"]: index["url"] for index in project["tool"]["uv"]["index"]}
    sources = project["tool"]["uv"]["sources"]
    for name in TORCH_FAMILY:
        assert name in deps, f"{name} is not a dependency"
        pin = _pinned(deps[name])
        assert not pin.local, f"{deps[name]} must stay without a local label"
        built = _pinned(constraints[name])
        assert built.public == pin.public and built.local == "cu130", (
            f"{CONSTRAINTS} has {constraints[name]}, the package pins {deps[name]}"
        )
        assert deps[name].specifier.contains(built), f"{deps[name]} refuses {built}"
        entries = sources.get(name)
        assert entries, f"uv has no source for {name}"
        assert {indexes[entry["index"]] for entry in entries} == {CU130_INDEX}, (
            f"uv takes {name} from {entries}"
        )
    assert _pinned(deps["torch"]) == Version("2.9.1")
    assert _pinned(deps["torchvision"]) == Version("0.24.1"), "torchvision built for torch 2.9.1"
    assert _pinned(deps["torchaudio"]) == Version("2.9.1")
