"""cu130-packaging-pins.patch: the sglang package metadata declares the CUDA 13 stack."""

from __future__ import annotations

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

pytestmark = pytest.mark.payload


def _dependencies(sglang_tree) -> dict[str, Requirement]:
    project = tomllib.loads((sglang_tree / "python" / "pyproject.toml").read_text())["project"]
    requirements = (Requirement(line) for line in project["dependencies"])
    return {req.name.lower().replace("_", "-"): req for req in requirements}


def test_pyproject_declares_cuda13_stack(sglang_tree):
    deps = _dependencies(sglang_tree)

    cuda_python = deps["cuda-python"].specifier
    assert cuda_python.contains(Version("13.0.0")) and cuda_python.contains(Version("13.2"))
    assert not cuda_python.contains(Version("12.9")), "still pins the CUDA 12 bindings"
    assert not cuda_python.contains(Version("14.0"))

    # The cu130 builds of these carry a local label; an == pin without one accepts them.
    assert deps["torch"].specifier.contains(Version("2.9.1+cu130"))
    assert deps["sgl-kernel"].specifier.contains(Version("0.3.21+cu130"))
    assert str(deps["flashinfer-python"].specifier) == "==0.6.3"
