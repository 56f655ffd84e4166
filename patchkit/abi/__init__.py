"""Static CUDA 13 / torch cu130 ABI verification of an environment or a wheelhouse.

``verify()`` is the library entry point the ``patchkit verify`` command drives; it returns a
``VerifyReport`` and never prints.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from patchkit.abi.archs import CC
from patchkit.abi.cache import ResultCache
from patchkit.abi.checks import Context, Finding, detect_driver, predict, run_checks
from patchkit.abi.profiles import Profile, load_profile
from patchkit.abi.scan import FileReport, analyze_file, analyze_tree
from patchkit.abi.sources import Tree, default_site_packages, read_env, read_wheelhouse

__all__ = ["CC", "Finding", "VerifyReport", "analyze_file", "predict", "verify", "load_profile"]


@dataclass
class VerifyReport:
    """The outcome of one verify run."""

    profile: str
    targets: list[str]
    source: str
    files: int
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    reports: dict[str, FileReport] = field(default_factory=dict, repr=False)

    @property
    def errors(self) -> int:
        return sum(f.severity == "error" for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == "warning" for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if self.errors else 0

    def to_dict(self) -> dict:
        return {
            "profile": self.profile, "targets": self.targets, "source": self.source,
            "files": self.files, "errors": self.errors, "warnings": self.warnings,
            "seconds": round(self.seconds, 3), "findings": [f.to_dict() for f in self.findings],
        }


def verify(
    env: str | None = None,
    wheelhouse: str | None = None,
    profile: str | Profile | None = None,
    gpus: list[str] | None = None,
    cache_dir: str | None = None,
    use_cache: bool = True,
    environ: dict[str, str] | None = None,
    host_checks: bool | None = None,
    jobs: int | None = None,
) -> VerifyReport:
    """Verify a site-packages folder (``env``), a folder of wheels, or wheels over an env.

    Raises FileNotFoundError for a missing folder, ValueError for a bad ``gpus`` entry and
    profiles.ProfileError for a missing or broken profile.
    """
    started = time.perf_counter()
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    targets = [CC.parse(g) for g in gpus] if gpus else list(prof.targets)
    environ = dict(os.environ if environ is None else environ)
    cache = ResultCache(cache_dir, enabled=use_cache)
    scratch = tempfile.mkdtemp(prefix="patchkit-verify-") if wheelhouse else None
    try:
        tree: Tree | None = read_env(env) if env else None
        if wheelhouse:
            wh = read_wheelhouse(wheelhouse, scratch)
            tree = tree.overlay(wh) if tree else wh
        if tree is None:
            tree = read_env(default_site_packages())
        reports = analyze_tree(tree, cache, jobs=jobs)
        if host_checks is None:
            host_checks = wheelhouse is None
        ctx = Context(
            tree=tree, reports=reports, profile=prof, targets=targets, cache=cache,
            driver=detect_driver() if host_checks else None, environ=environ,
        )
        findings = run_checks(ctx)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    source = wheelhouse if wheelhouse else (env or default_site_packages())
    return VerifyReport(
        profile=prof.name, targets=[str(t) for t in targets], source=os.path.abspath(source),
        files=len(reports), findings=findings, seconds=time.perf_counter() - started,
        reports=reports,
    )
