"""Stand-in for ``sgl_kernel`` (SGLang's CUDA kernel wheel) in the CPU payload tests.

The real ``sgl_kernel`` loads a CUDA extension at import and fails without a CUDA driver, yet
many SGLang modules import it (and submodules such as ``sgl_kernel.kvcacheio``) at module level.
This stand-in only lets those imports succeed: every attribute, of the package or of any
``sgl_kernel.*`` submodule created on the fly, is a ``MagicMock``.  No code under test runs
through it: the payload tests exercise pure-Python paths and check numbers computed by torch,
so a kernel reached by mistake shows up as a wrong result, not a pass.

``tests/payload/conftest.py`` puts this directory on ``sys.path`` for payload tests only; the GPU
tier (``tests/gpu``) uses the real wheel.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from unittest.mock import MagicMock

__version__ = "0.3.21"
IS_PATCHKIT_STANDIN = True


class _StandinModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Creates any ``sgl_kernel.<sub>`` module on first import."""

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandinModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        return None


if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SubmoduleFinder())

# Module-level attribute access on the package itself (``from sgl_kernel import x``).
sys.modules[__name__].__class__ = _StandinModule
