"""Static CUDA 13 / torch cu130 ABI verification of an environment or a wheelhouse.

``verify()`` is the library entry point the ``patchkit verify`` command drives; it returns a
``VerifyReport`` and never prints.
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from dataclasses import dataclass, field

from patchkit import scratch as scratch_folder
from patchkit.abi import torchsyms
from patchkit.abi.archs import CC
from patchkit.abi.cache import ResultCache, changed, run_key
from patchkit.abi.checks import Context, DriverInfo, Finding, detect_driver, predict, run_checks
from patchkit.abi.profiles import (
    MAX_PROFILE_BYTES,
    Profile,
    ProfileChoice,
    choose_profile,
    load_profile,
)
from patchkit.abi.scan import FileReport, analyze_file, analyze_tree, no_collector
from patchkit.abi.sources import (
    Tree,
    default_site_packages,
    dist_versions,
    read_env,
    read_wheelhouse,
    wheel_stamps,
)
from patchkit.archives import read_regular

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
    cached: bool = False  # the whole result came from the cache (nothing changed)
    choice: ProfileChoice | None = None  # which profile, and why

    @property
    def errors(self) -> int:
        return sum(f.severity == "error" for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == "warning" for f in self.findings)

    @property
    def notes(self) -> int:
        return sum(f.severity == "note" for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if self.errors else 0

    def to_dict(self) -> dict:
        return {
            "profile": self.profile,
            "profile_choice": self.choice.to_dict() if self.choice else None,
            "targets": self.targets,
            "source": self.source,
            "files": self.files,
            "errors": self.errors,
            "warnings": self.warnings,
            "notes": self.notes,
            "seconds": round(self.seconds, 3),
            "findings": [f.to_dict() for f in self.findings],
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

    ``profile`` defaults to ``$PATCHKIT_PROFILE``, else the profile pinning the sglang found
    in the checked files, else cu130-sm120 (profiles.choose_profile; the report's ``choice``
    says which and why). Raises FileNotFoundError for a missing folder, ValueError for a bad
    ``gpus`` entry and profiles.ProfileError for a missing or broken profile.
    """
    started = time.perf_counter()
    environ = dict(os.environ if environ is None else environ)
    wanted = [CC.parse(g) for g in gpus] if gpus else None
    cache = ResultCache(cache_dir, enabled=use_cache)
    # members read through files go to the process's scratch folder, swept after a SIGKILL
    scratch = scratch_folder.new_folder("verify-") if wheelhouse else None
    try:
        run = _plan(env, wheelhouse, profile, wanted, environ, host_checks)
        hit = cache.load("run:" + run.source, 0, run.key, _decode_run)
        if hit is not None:
            return run.report(hit[0], hit[1], started, cached=True)
        reports, findings = _check(run, wheelhouse, scratch, cache, jobs)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return run.report(len(reports), findings, started, reports=reports)


@dataclass
class _Run:
    """What one verify run checks, against what, and the key its result is cached under."""

    env_tree: Tree | None
    prof: Profile
    choice: ProfileChoice
    targets: list[CC]
    driver: DriverInfo | None  # None: no host checks (a wheelhouse)
    environ: dict[str, str]
    source: str
    key: str

    def report(self, files: int, findings, started: float, **extra) -> VerifyReport:
        return VerifyReport(
            profile=self.prof.name,
            targets=[str(t) for t in self.targets],
            source=self.source,
            files=files,
            findings=findings,
            seconds=time.perf_counter() - started,
            choice=self.choice,
            **extra,
        )


def _plan(env, wheelhouse, profile, wanted, environ, host_checks) -> _Run:
    """Read the environment (not the wheels), choose the profile, name the run."""
    env_tree: Tree | None = read_env(env) if env else None
    if env_tree is None and not wheelhouse:
        env_tree = read_env(default_site_packages())
    # A wheel is known by its (path, size, mtime): an unchanged wheelhouse is not opened.
    stamps = wheel_stamps(wheelhouse) if wheelhouse else None
    prof, choice = choose_profile(
        profile,
        environ.get("PATCHKIT_PROFILE") or None,
        dist_versions("sglang", env_tree, stamps),
        wanted,
        torch=dist_versions("torch", env_tree, stamps),
    )
    targets = wanted or list(prof.targets)
    if host_checks is None:
        host_checks = wheelhouse is None
    driver = detect_driver() if host_checks else None
    source = os.path.abspath(wheelhouse if wheelhouse else (env or default_site_packages()))
    key = _run_key(env_tree, stamps, source, prof, choice, targets, environ, driver)
    return _Run(env_tree, prof, choice, targets, driver, environ, source, key)


def _check(
    run: _Run, wheelhouse: str | None, scratch: str | None, cache: ResultCache, jobs
) -> tuple[dict[str, FileReport], list[Finding]]:
    """Read the files (the wheels laid over the environment), run the checks, store the
    result under the run's key."""
    wh = read_wheelhouse(wheelhouse, scratch, cache) if wheelhouse else None
    env_tree = run.env_tree
    tree = env_tree.overlay(wh) if env_tree and wh else (wh or env_tree)
    assert tree is not None
    prof = run.prof
    meanwhile = None
    if prof.torch_symbols and "torch/version.py" not in tree.texts:
        # checks.load_profile_torch will need it: read while the workers read the files
        meanwhile = functools.partial(torchsyms.preload, prof.data_file(prof.torch_symbols))
    writes: list = []  # cache writes still under way while the checks run
    try:
        reports = analyze_tree(tree, cache, jobs=jobs, meanwhile=meanwhile, writes=writes)
        ctx = Context(
            tree=tree,
            reports=reports,
            profile=prof,
            targets=run.targets,
            cache=cache,
            driver=run.driver,
            environ=run.environ,
            choice=run.choice,
        )
        with no_collector():  # no cycles; a full collection over the reports is 0.09 s
            findings = run_checks(ctx)
    finally:
        for thread in writes:
            thread.join()
    value = {"files": len(reports), "findings": [f.to_dict() for f in findings]}
    # the Python sources read for import order are no part of the run's key: checked on reuse
    value["sources"] = list(ctx.loader.imports.read) if ctx.loader and ctx.loader.imports else []
    cache.store("run:" + run.source, 0, run.key, value)
    return reports, findings


def _decode_run(value) -> tuple[int, list[Finding]]:
    files, findings = value["files"], value["findings"]
    if type(files) is not int or not isinstance(findings, list):
        raise TypeError("run")
    for path, size, mtime in value["sources"]:  # a source changed since: the result is stale
        st = os.stat(path)
        if (st.st_size, changed(st)) != (size, mtime):
            raise ValueError(path)
    return files, [Finding.from_dict(d) for d in findings]


# Environment variables some check reads.
_ENV_KEYS = ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "PATH", "FLASHINFER_CUDA_ARCH_LIST")


def _code_stamps() -> list[tuple[str, int, int]]:
    """(name, size, mtime) of this package's code and data, its subpackages' included: the
    checks live in ``checks/``, and a change there must not reuse old findings either."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = []
    for folder in (here, os.path.join(here, "checks")):
        for name in sorted(os.listdir(folder)):
            if name.endswith((".py", ".toml")):
                st = os.stat(os.path.join(folder, name))
                code.append(
                    (os.path.relpath(os.path.join(folder, name), here), st.st_size, changed(st))
                )
    return code


def _run_key(
    env: Tree | None,
    stamps: list | None,
    source: str,
    prof: Profile,
    choice: ProfileChoice,
    targets,
    environ,
    driver,
) -> str:
    """Everything the findings depend on: installed files (path, size, mtime) and metadata,
    each wheel's (path, size, mtime) — what a wheel holds is a function of those, so an
    unchanged wheel is not opened again (sources.read_wheelhouse's listing) — the profile, the
    host."""
    # A wheelhouse is unpacked into a fresh scratch folder each run: its name is no input.
    prof_bytes = []
    for path in (prof.path, prof.data_file(prof.torch_symbols) if prof.torch_symbols else None):
        try:
            st = os.stat(path) if path else None
            prof_bytes.append((path, st.st_size, changed(st)) if st else None)
        except OSError:
            prof_bytes.append(repr(prof))
    try:
        prof_bytes.append(read_regular(prof.path, MAX_PROFILE_BYTES))
    except (OSError, ValueError):
        pass
    # The rules themselves: this package's files (a code change must not reuse old findings).
    code = _code_stamps()
    env_part = None
    if env is not None:
        env_part = [
            env.root,
            sorted((m.relpath, m.size, m.mtime) for m in env.members.values()),
            sorted(env.candidates),
            sorted(env.texts.items()),
            sorted(env.unread),
            sorted((d.name, d.version, d.wheel, tuple(d.requires)) for d in env.dists.values()),
        ]
    return run_key(
        [
            code,
            "wheelhouse" if stamps is not None else "env",
            source,
            env_part,
            stamps,
            prof_bytes,
            prof.severity,
            choice.to_dict(),
            [str(t) for t in targets],
            [(k, environ.get(k)) for k in _ENV_KEYS],
            driver.version if driver else None,
        ]
    )
