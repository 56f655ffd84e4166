"""Building patched wheels: apply the series into a clean tree, build it with the PyPA `build`
frontend, then make the wheel reproducible and add its provenance and SBOM.

The core returns `BuildReport`s and never prints; progress goes through `ui.progress`.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import warnings
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from email.parser import BytesHeaderParser
from pathlib import Path

import build.env as pypa_env
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

import build as pypa_build
from patchkit import __version__, gitops, scratch, ui
from patchkit.apply import ApplyReport, apply_series
from patchkit.compat import tomllib
from patchkit.errors import BuildError, ConfigError, Interrupted, PinError, UsageError
from patchkit.lines import check_line_names, line_series, pick_line
from patchkit.locks import locked
from patchkit.series import Series
from patchkit.targets import RefSpec, Release, Target, WheelPin
from patchkit.upstream import Base, Mirror, acquire, download_wheel, file_sha256
from patchkit.upstream.wheel import wheel_layout
from patchkit.wheels.profile import BuildProfile
from patchkit.wheels.provenance import PROVENANCE_FILE, Provenance, make_provenance
from patchkit.wheels.repack import check_same_sources, check_series_paths, repack, tree_changes
from patchkit.wheels.reproducible import dist_info_dir, normalize_wheel
from patchkit.wheels.sbom import SBOM_DIR, SBOM_FILE, make_sbom

BackendOutput = Callable[[str], None]
BACKEND_TAIL_LINES = 3  # lines of the backend's output a failure's one-line error quotes
ATTR_VERSION_RE = re.compile(r"""^__version__\s*=\s*['"][^'"]*['"][ \t]*$""", re.M)


def wheel_version(upstream_version: str, variant: str, series_hash: str) -> str:
    """`0.5.9` + `cu130` + series hash -> `0.5.9+cu130.pk<8 hex>` (a PEP 440 local label)."""
    version = f"{upstream_version}+{variant}.pk{series_hash[:8]}"
    return str(Version(version))


@dataclass
class WheelBuild:
    """One built wheel."""

    target: str
    path: Path
    sha256: str
    provenance: Provenance
    seconds: float
    tree: Path | None  # None: removed after the build (--keep-tree keeps it)
    log: Path
    provenance_path: str  # inside the wheel
    sbom_path: str

    @property
    def version(self) -> str:
        return self.provenance.version

    def to_json(self) -> dict:
        prov = self.provenance
        return {
            "target": self.target,
            "wheel": str(self.path),
            "sha256": self.sha256,
            "distribution": prov.distribution,
            "version": prov.version,
            "series": {
                "version": prov.series_version,
                "hash": prov.series_hash,
                "patches": [p.name for p in prov.patches],
            },
            "upstream": {
                "version": prov.upstream_version,
                "commit": prov.upstream_commit,
                "base_commit": prov.base_commit,
                "source": prov.base_source,
            },
            "source_date_epoch": prov.source_date_epoch,
            "provenance": self.provenance_path,
            "sbom": self.sbom_path,
            "tree": str(self.tree) if self.tree is not None else None,
            "log": str(self.log),
            "seconds": round(self.seconds, 2),
        }


@dataclass
class SkippedTarget:
    target: str
    reason: str

    def to_json(self) -> dict:
        return {"target": self.target, "reason": self.reason}


@dataclass
class BuildReport:
    """The outcome of `patchkit build`."""

    profile: BuildProfile
    isolation: bool
    wheels: list[WheelBuild] = field(default_factory=list)
    skipped: list[SkippedTarget] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "profile": self.profile.to_json(),
            "isolation": self.isolation,
            "wheels": [w.to_json() for w in self.wheels],
            "skipped": [s.to_json() for s in self.skipped],
        }


@dataclass(frozen=True)
class BuildOptions:
    out: Path
    work_root: Path
    isolation: bool = True
    # Wheel bases: which pinned wheels to repack (empty: every pinned wheel of the release).
    python_tags: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()
    # Each line of the build backend's output as it comes (`-v`); None: only the build log.
    backend_output: BackendOutput | None = None
    # Keep the patched tree (work/build/<target>/tree) after a build that succeeded; else
    # only its build.log stays (a failed build keeps its tree to look into).
    keep_tree: bool = False


# --- the version a backend gives the wheel -----------------------------------------------------


def _pyproject(project_dir: Path) -> dict:
    path = project_dir / "pyproject.toml"
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BuildError(f"{path}: not found; cannot build a wheel from {project_dir}") from None
    except tomllib.TOMLDecodeError as exc:
        raise BuildError(f"{path}: not valid TOML after applying the series: {exc}") from None


def pin_version(project_dir: Path, version: str, upstream_commit: str | None) -> dict[str, str]:
    """Make the project's build backend produce exactly `version`; returns environment to set.

    setuptools-scm projects get SETUPTOOLS_SCM_PRETEND_VERSION_FOR_<NAME> (and the upstream
    commit as pretend metadata); projects whose version is a module attribute get that
    module's `__version__` line rewritten.
    """
    data = _pyproject(project_dir)
    project = data.get("project", {})
    name = project.get("name")
    if not name:
        raise BuildError(f"{project_dir}/pyproject.toml has no [project] name")
    tool = data.get("tool", {})
    requires = " ".join(data.get("build-system", {}).get("requires", []))
    if "version" in project:
        raise BuildError(
            f"{name}: its version is static ({project['version']}); patchkit cannot "
            "give it the local label"
        )
    if "setuptools_scm" in tool or "setuptools-scm" in tool or "setuptools-scm" in requires:
        key = re.sub(r"[-_.]+", "_", name).upper()
        env = {f"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_{key}": version}
        if upstream_commit:
            env[f"SETUPTOOLS_SCM_PRETEND_METADATA_FOR_{key}"] = (
                f'{{node="g{upstream_commit[:10]}"}}'
            )
        return env
    attr = tool.get("setuptools", {}).get("dynamic", {}).get("version", {}).get("attr")
    if attr:
        module, _, variable = attr.rpartition(".")
        if variable != "__version__":
            raise BuildError(f"{name}: version attribute {attr} is not a __version__")
        path = project_dir / Path(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        line = f'__version__ = "{version}"'
        if ATTR_VERSION_RE.search(text):
            text = ATTR_VERSION_RE.sub(line, text, count=1)
        else:
            text = f"{text}{line}\n"
        path.write_text(text, encoding="utf-8")
        return {}
    raise BuildError(
        f"{name}: cannot tell how its build backend sets the version "
        "(neither setuptools-scm nor a [tool.setuptools.dynamic] version attr)"
    )


# --- running the PyPA build frontend ---------------------------------------------------------


def _runner(log: Path, extra_env: Mapping[str, str], echo: BackendOutput | None = None):
    """A pyproject-hooks runner: the backend's stdout and stderr, merged, go line by line to
    the build log and, as they arrive, to `echo` (as pypa/build's `-v` does)."""

    def run(
        cmd: Sequence[str], cwd: str | None = None, extra_environ: Mapping[str, str] | None = None
    ) -> None:
        env = {**os.environ, **(extra_environ or {}), **extra_env}
        with log.open("ab") as fh:
            fh.write(f"$ {' '.join(cmd)}\n".encode())
            fh.flush()
            if echo is None:
                subprocess.run(
                    cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, check=True
                )
                return
            env["PYTHONUNBUFFERED"] = "1"  # a backend's print reaches the pipe as it is made
            with subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            ) as proc:
                assert proc.stdout is not None
                try:
                    for raw in proc.stdout:
                        fh.write(raw)
                        fh.flush()
                        echo(raw.decode(errors="replace").rstrip("\r\n"))
                except BaseException:  # interrupted: stop the backend, as subprocess.run does
                    proc.kill()
                    raise
            if proc.returncode:
                raise subprocess.CalledProcessError(proc.returncode, list(cmd))

    return run


TOOL_VERSIONS_SCRIPT = """
import importlib.metadata as m, json, sys
out = {"python": "%d.%d.%d" % sys.version_info[:3]}
for name in sys.argv[1:]:
    try:
        out[name] = m.version(name)
    except m.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


def _tool_versions(python: str, requirements: Sequence[str]) -> dict[str, str]:
    names = set()
    for text in requirements:
        try:
            names.add(canonicalize_name(Requirement(text).name))
        except InvalidRequirement:
            continue
    result = subprocess.run(
        [python, "-c", TOOL_VERSIONS_SCRIPT, *sorted(names)],
        capture_output=True,
        text=True,
        check=True,
    )
    versions = json.loads(result.stdout)
    versions["build"] = pypa_build.__version__
    versions["patchkit"] = __version__
    return versions


def _last_lines(log: Path, count: int = BACKEND_TAIL_LINES) -> str:
    """The last `count` lines of the backend's output in the log, joined with ' | ' (banners,
    separators and the logged commands left out)."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    kept = [ln for ln in lines if not ln.startswith(("!!", "****", "$ "))]
    return " | ".join(line[:200] for line in kept[-count:])


class IsolatedEnvironment:
    """A PyPA isolated build environment made in the background, with the build requirements
    the base declares already installed, so it is ready when the series has been applied."""

    def __init__(self, requires: Sequence[str]) -> None:
        self.requires = list(requires)
        self._env: pypa_env.DefaultIsolatedEnv | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._make, name="isolated-env", daemon=True)
        self._thread.start()

    def _make(self) -> None:
        try:
            env = pypa_env.DefaultIsolatedEnv()
            self._env = env.__enter__()
            self._env.install(self.requires)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            self._error = exc

    def ready(self) -> pypa_env.DefaultIsolatedEnv:
        self._thread.join()
        if self._error is not None:
            raise _install_error(self.requires, self._error)
        assert self._env is not None
        return self._env

    def close(self) -> None:
        self._thread.join()
        if self._env is not None:
            self._env.__exit__(None, None, None)


def _install_error(requires: Sequence[str], exc: BaseException) -> BuildError:
    detail = ""
    if isinstance(exc, subprocess.CalledProcessError):
        output = exc.stderr or exc.stdout or b""
        text = output.decode(errors="replace") if isinstance(output, bytes) else output
        lines = [ln for ln in text.splitlines() if ln.strip()]
        detail = f": {lines[-1].strip()}" if lines else ""
    else:
        detail = f": {exc}"
    return BuildError(
        f"cannot install the build requirements ({', '.join(requires)}) into an "
        f"isolated environment{detail}",
        hint="check that pip reaches the package index, or install them here and "
        "pass --no-isolation",
    )


def run_backend(
    project_dir: Path,
    outdir: Path,
    *,
    env: Mapping[str, str],
    log: Path,
    isolated: IsolatedEnvironment | None,
    echo: BackendOutput | None = None,
) -> tuple[Path, dict[str, str]]:
    """Build the wheel of `project_dir` with the PyPA frontend; returns it and tool versions.

    `isolated` is the environment to build in; None builds in this interpreter's environment.
    The backend's output goes to `log` and, line by line as it comes, to `echo`; a failure's
    error quotes its last lines.
    """
    runner = _runner(log, env, echo)
    outdir.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if isolated is not None:
                wheel, tools = _build_isolated(project_dir, outdir, runner, isolated)
            else:
                wheel, tools = _build_here(project_dir, outdir, runner)
    except (
        pypa_build.BuildException,
        pypa_build.BuildBackendException,
        subprocess.CalledProcessError,
    ) as exc:
        cause = _last_lines(log) or str(exc).splitlines()[0]
        raise BuildError(
            f"the build backend failed for {project_dir}: {cause}", hint=f"the full log is {log}"
        ) from None
    if caught:
        with log.open("a", encoding="utf-8") as fh:
            for warning in caught:
                fh.write(f"warning: {warning.message}\n")
    return wheel, tools


def _build_isolated(
    project_dir: Path, outdir: Path, runner, isolated: IsolatedEnvironment
) -> tuple[Path, dict[str, str]]:
    venv = isolated.ready()
    builder = pypa_build.ProjectBuilder.from_isolated_env(venv, project_dir, runner=runner)
    requires = list(builder.build_system_requires)
    if sorted(requires) != sorted(isolated.requires):  # the series changed them
        try:
            venv.install(requires)
        except subprocess.CalledProcessError as exc:
            raise _install_error(requires, exc) from None
    extra = list(builder.get_requires_for_build("wheel"))
    try:
        venv.install(extra)
    except subprocess.CalledProcessError as exc:
        raise _install_error(extra, exc) from None
    wheel = builder.build("wheel", outdir)
    return Path(wheel), _tool_versions(venv.python_executable, requires + extra)


def _build_here(project_dir: Path, outdir: Path, runner) -> tuple[Path, dict[str, str]]:
    builder = pypa_build.ProjectBuilder(
        project_dir, python_executable=sys.executable, runner=runner
    )
    missing = builder.check_dependencies("wheel")
    if missing:
        names = sorted({chain[0] for chain in missing})
        raise BuildError(
            f"--no-isolation: this environment lacks the build requirements {', '.join(names)}",
            hint="install them, or build without --no-isolation",
        )
    requires = list(builder.build_system_requires)
    wheel = builder.build("wheel", outdir)
    return Path(wheel), _tool_versions(sys.executable, requires)


def base_build_requires(mirror: gitops.Repo, base: Base, subdir: str) -> list[str]:
    """`[build-system] requires` of the base's pyproject.toml (what an isolated env needs)."""
    path = f"{subdir}/pyproject.toml" if subdir else "pyproject.toml"
    raw = gitops.show_file(mirror, base.commit, path)
    if raw is None:
        return []
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return []
    requires = data.get("build-system", {}).get("requires", [])
    return [str(r) for r in requires] if isinstance(requires, list) else []


# --- one target --------------------------------------------------------------------------------


def _check_submodules(tree: Path, target: Target, base: Base) -> None:
    """Refuse a tree whose submodules under the build directory are empty (a git base holds
    only their pointers)."""
    gitmodules = tree / ".gitmodules"
    if not gitmodules.is_file():
        return
    for path in re.findall(r"^\s*path\s*=\s*(\S+)\s*$", gitmodules.read_text(), re.M):
        if target.subdir and not path.startswith(f"{target.subdir}/"):
            continue  # outside the directory the wheel is built from
        where = tree / path
        if not where.is_dir() or not any(where.iterdir()):
            raise BuildError(
                f"{target.name}: the {base.source} base {base.commit[:12]} lacks the submodule "
                f"{path}; its wheel would miss those files",
                hint="build from the pinned sdist (a mirror without this git commit: "
                "a fresh PATCHKIT_CACHE)",
            )


def _move_aside(work: Path, part: str = "") -> None:
    """Rename the previous build of this target (or one `part` of it) out of the way
    (instant; swept later)."""
    path = work / part if part else work
    if path.exists():
        trash = f".trash-{work.name}-{os.getpid()}-{time.monotonic_ns()}{part and '-' + part}"
        os.replace(path, work.with_name(trash))


def _drop_tree(work: Path, options: BuildOptions) -> threading.Thread | None:
    """After a build that succeeded, its tree goes (a patched sglang checkout is 120 MB;
    build.log stays): moved aside at once and removed in the background (joined before the
    build returns). None when --keep-tree keeps it."""
    if options.keep_tree:
        return None
    for part in ("tree", "tree.git"):
        _move_aside(work, part)
    return _sweep(work)


def _apply_into(
    tree: Path, mirror: Mirror, base: Base, series: Series, series_version: str
) -> ApplyReport:
    """The series applied into `tree`, a new directory (apply's build record in the cache)."""
    return apply_series(
        mirror.repo,
        base,
        series,
        tree,
        series_version=series_version,
        verified=mirror.root / "verified",
    )


def _sweep(work: Path) -> threading.Thread:
    """Delete earlier builds moved aside (and `.trash-*` an interrupted build left) in the
    background: deleting a few thousand files can take seconds."""
    trash = sorted(work.parent.glob(f".trash-{glob.escape(work.name)}-*"))

    def sweep() -> None:
        for path in trash:
            shutil.rmtree(path, ignore_errors=True)

    thread = threading.Thread(target=sweep, name=f"sweep-{work.name}", daemon=True)
    thread.start()
    return thread


@contextmanager
def _say_what_was_left(out: Path, work: Path, written: list[Path]) -> Iterator[None]:
    """On an interrupt, say which wheels were written whole (a wheel appears by rename, so
    there is no half one) and that the build tree is scratch the next build replaces."""
    try:
        yield
    except KeyboardInterrupt:
        names = ", ".join(p.name for p in written)
        wheels = (
            f"{len(written)} wheel(s) were written whole to {out} ({names})"
            if written
            else f"no wheel was written to {out}"
        )
        raise Interrupted(
            f"{wheels}; the build tree {work} is incomplete scratch that the next build "
            "replaces; run the same command again"
        ) from None


def _wheel_metadata(wheel: Path) -> tuple[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        dist_info = dist_info_dir(zf.namelist())
        headers = BytesHeaderParser().parsebytes(zf.read(f"{dist_info}/METADATA"))
    return headers["Name"], headers["Version"]


def build_target(
    target: Target,
    series: Series,
    base: Base,
    *,
    series_version: str,
    profile: BuildProfile,
    options: BuildOptions,
    cache: Path | None = None,
) -> WheelBuild:
    """Apply `series` onto `base` in a clean tree and build the patched, versioned wheel."""
    started = time.monotonic()
    release_version = base.release.version if base.release else None
    if release_version is None:
        raise BuildError(
            f"{target.name}: the base {base.commit[:12]} is not a pinned release; "
            "a wheel needs the upstream version"
        )
    version = wheel_version(release_version, profile.variant, series.hash())
    work = options.work_root / target.name
    written: list[Path] = []
    with (
        locked(
            options.work_root / f".{target.name}.lock", f"the build tree {work}", notify=ui.progress
        ),
        _say_what_was_left(options.out, work, written),
        ExitStack() as stack,
    ):
        _move_aside(work)
        work.mkdir(parents=True)
        tree = work / "tree"
        mirror = Mirror(target, cache) if cache else Mirror(target)
        children = stack.enter_context(scratch.children_contained())  # pip, the backend
        isolated = (
            IsolatedEnvironment(base_build_requires(mirror.repo, base, target.subdir))
            if options.isolation
            else None
        )
        try:
            report = _apply_into(tree, mirror, base, series, series_version)
            sweeper = _sweep(work)  # after the checkout, which it would slow down
            epoch = gitops.commit_date(mirror.repo, base.commit)
            _check_submodules(tree, target, base)
            # Build as from an sdist: backends that ask git for versions or file lists would
            # see the patch commits, not upstream.  (Moved aside: the next build sweeps it.)
            os.replace(tree / ".git", work / "tree.git")
            project_dir = tree / target.subdir if target.subdir else tree
            env = {
                "SOURCE_DATE_EPOCH": str(epoch),
                "PYTHONHASHSEED": "0",
                **pin_version(project_dir, version, base.upstream_commit),
            }
            log = work / "build.log"
            ui.progress(
                f"building the {target.name} {version} wheel "
                f"({'isolated environment' if isolated else 'this environment'})"
            )
            raw, tools = run_backend(
                project_dir,
                work / "raw",
                env=env,
                log=log,
                isolated=isolated,
                echo=options.backend_output,
            )
        except BaseException:
            children.stop()  # an interrupt: pip and the backend go now, not once finished
            raise
        finally:
            if isolated is not None:
                isolated.close()
            stack.close()
        name, got = _wheel_metadata(raw)
        _, file_version, _, _ = parse_wheel_filename(raw.name)
        if Version(got) != Version(version) or file_version != Version(version):
            raise BuildError(
                f"{target.name}: the backend built version {got} (file {raw.name}), not {version}",
                hint=f"the full log is {log}",
            )
        prov = make_provenance(
            distribution=name,
            version=version,
            base=base,
            upstream_git=target.git,
            series=series,
            series_version=series_version,
            result_commit=report.result or "",
            profile=profile.to_json(),
            tools=tools,
            source_date_epoch=epoch,
        )
        sbom = make_sbom(prov, series)
        ui.progress(f"writing {raw.name} (reproducible layout, provenance, SBOM)")
        with zipfile.ZipFile(raw) as zf:
            dist_info = dist_info_dir(zf.namelist())
        dest = options.out / raw.name
        prov_path = f"{dist_info}/{PROVENANCE_FILE}"
        sbom_path = f"{dist_info}/{SBOM_DIR}/{SBOM_FILE}"
        normalize_wheel(raw, dest, epoch, {prov_path: prov.dumps(), sbom_path: sbom})
        written.append(dest)
        shutil.rmtree(work / "raw", ignore_errors=True)
        dropped = _drop_tree(work, options)
        sweeper.join()
        if dropped is not None:
            dropped.join()
    return WheelBuild(
        target.name,
        dest,
        file_sha256(dest),
        prov,
        time.monotonic() - started,
        None if dropped else tree,
        log,
        prov_path,
        sbom_path,
    )


def build_wheels(
    workspace,
    specs: Sequence[RefSpec],
    *,
    profile: BuildProfile,
    options: BuildOptions,
    cache: Path | None = None,
    line: str | None = None,
) -> BuildReport:
    """Build the patched wheel(s) of every target in `specs` (empty series are skipped).

    Each spec builds one line: `--line`, else the line whose pin is the spec's ref, else the
    default line.  A line on an sdist or git base is built by the PyPA frontend; a line on a
    wheel base by repacking its pinned wheels.
    """
    report = BuildReport(profile=profile, isolation=options.isolation)
    for spec, target in lines_to_build(workspace, specs, line):
        series = line_series(workspace.project, target)
        label = f"{spec.target} line {target.line}" if len(target.lines) > 1 else spec.target
        if not series.patches:
            report.skipped.append(
                SkippedTarget(
                    label, "its series is empty; upstream's own wheel is the one to install"
                )
            )
            continue
        release = target.release(spec.ref) if spec.ref else target.pinned
        # A pinned sdist is the build's preferred base: hash-checked, the same on every
        # machine, and it carries the submodules and generated files a git checkout lacks;
        # a release with pinned wheels only is its own base.
        offline = True if release and (release.sdist or release.wheels) else None
        try:
            base = acquire(target, spec.ref, cache=cache, offline_git=offline)
        except PinError as exc:
            if exc.hint and "--allow-unpinned" in exc.hint:
                raise PinError(
                    exc.message,
                    hint="wheels are built only from pinned bases: pin "
                    f"it with `patchkit rebase --target {target.name}@{spec.ref} "
                    "--write`",
                ) from None
            raise
        if not base.pinned:
            raise ConfigError(f"{target.name}@{spec.ref}: not a pinned base")
        common = dict(
            series_version=workspace.targets.series_version,
            profile=profile,
            options=options,
            cache=cache,
        )
        if base.source == "wheel":
            report.wheels.extend(repack_target(target, series, base, **common))
        else:
            report.wheels.append(build_target(target, series, base, **common))
    if line is not None and not report.wheels and not report.skipped:
        raise UsageError(f"no target has a line '{line}'")
    return report


def lines_to_build(
    workspace, specs: Sequence[RefSpec], line: str | None
) -> list[tuple[RefSpec, Target]]:
    """Each spec with the line it builds: `--line` (or the line pinned to its ref, else the
    default line); with several targets (`--target all --line L`), the targets that have a
    line L and, for the others, the line L is built with (`with` in targets.toml). Several
    targets without `--line` build the default line of the one whose lines name the others
    (`make wheels`: SGLang's newest line, with the FlashInfer line it names, if any)."""
    if line is None and len(specs) > 1:
        line = _leading_default_line(workspace, specs)
    if line is not None and len(specs) > 1:
        check_line_names([workspace.target(spec.target) for spec in specs], [line])
    chosen = []
    for spec in specs:
        whole = workspace.target(spec.target)
        own_line = line
        if line is not None and line not in whole.line_names and len(specs) > 1:
            own_line = _companion_line(workspace, specs, spec.target, line)
            if own_line is None:
                continue
        chosen.append((spec, pick_line(whole, spec.ref, own_line)))
    return chosen


def _leading_default_line(workspace, specs: Sequence[RefSpec]) -> str | None:
    """The default line of the one target of `specs` whose lines are built with another's
    (None: no target, or several, lead; each then builds its own default line)."""
    if any(spec.ref for spec in specs):
        return None
    leads = [
        whole
        for whole in (workspace.target(spec.target) for spec in specs)
        if any(line.companions for line in whole.lines)
    ]
    return leads[0].default_line if len(leads) == 1 else None


def _companion_line(workspace, specs: Sequence[RefSpec], name: str, line: str) -> str | None:
    """The line of target `name` that another target's line `line` is built with."""
    for spec in specs:
        other = workspace.target(spec.target)
        if spec.target != name and line in other.line_names:
            found = other.companion(line, name)
            if found is not None:
                return found
    return None


def select_wheels(release: Release, options: BuildOptions) -> list[WheelPin]:
    """The release's pinned wheels that --python-tag / --platform choose (all by default)."""
    chosen = [
        w
        for w in release.wheels
        if (not options.python_tags or w.python_tag in options.python_tags)
        and (not options.platforms or w.platform_tag in options.platforms)
    ]
    if not chosen:
        pinned = ", ".join(f"{w.python_tag}/{w.platform_tag}" for w in release.wheels)
        raise UsageError(
            f"no pinned {release.version} wheel matches --python-tag/--platform (pinned: {pinned})"
        )
    return chosen


def repack_target(
    target: Target,
    series: Series,
    base: Base,
    *,
    series_version: str,
    profile: BuildProfile,
    options: BuildOptions,
    cache: Path | None = None,
) -> list[WheelBuild]:
    """Apply `series` onto a wheel base and repack each chosen pinned wheel with the result."""
    started = time.monotonic()
    release = base.release
    assert release is not None and release.base_wheel is not None
    pins = select_wheels(release, options)
    version = wheel_version(release.version, profile.variant, series.hash())
    mirror = Mirror(target, cache) if cache else Mirror(target)
    base_wheel = download_wheel(release.base_wheel, mirror.root)
    work = options.work_root / f"{target.name}-{target.line}"
    builds: list[WheelBuild] = []
    written: list[Path] = []
    with (
        locked(
            options.work_root / f".{target.name}.lock", f"the build tree {work}", notify=ui.progress
        ),
        _say_what_was_left(options.out, work, written),
        zipfile.ZipFile(base_wheel) as zbase,
    ):
        layout = wheel_layout(zbase, release.base_wheel.filename)
        check_series_paths(series, target.subdir, layout)
        _move_aside(work)
        work.mkdir(parents=True)
        tree = work / "tree"
        applied = _apply_into(tree, mirror, base, series, series_version)
        sweeper = _sweep(work)
        changes = tree_changes(tree, target.subdir, layout, zbase)
        dropped = _drop_tree(work, options)  # the changes are read: the tree is done
        epoch = gitops.commit_date(mirror.repo, base.commit)
        name = BytesHeaderParser().parsebytes(zbase.read(f"{layout.dist_info}/METADATA"))["Name"]
        log = work / "build.log"
        for pin in pins:
            one = time.monotonic()
            path = download_wheel(pin, mirror.root)
            if pin != release.base_wheel:
                with zipfile.ZipFile(path) as zother:
                    check_same_sources(zbase, zother, pin.filename)
            ui.progress(f"repacking {pin.filename} as {name} {version}")
            prov = make_provenance(
                distribution=name,
                version=version,
                base=dataclasses.replace(base, wheel=pin.filename, wheel_sha256=pin.sha256),
                upstream_git=target.git,
                series=series,
                series_version=series_version,
                result_commit=applied.result or "",
                profile=profile.to_json(),
                tools={"patchkit": __version__, "repack": "patchkit.wheels.repack"},
                source_date_epoch=epoch,
                line=target.line,
            )
            sbom = make_sbom(prov, series)
            dest, dist_info = repack(
                path,
                pin,
                changes,
                version=version,
                epoch=epoch,
                out_dir=options.out,
                extra_dist_info={PROVENANCE_FILE: prov.dumps(), f"{SBOM_DIR}/{SBOM_FILE}": sbom},
            )
            written.append(dest)
            with log.open("a", encoding="utf-8") as fh:
                fh.write(
                    f"repacked {pin.filename} -> {dest.name}: {len(changes.changed)} file(s) "
                    f"changed, {len(changes.removed)} removed\n"
                )
            builds.append(
                WheelBuild(
                    target.name,
                    dest,
                    file_sha256(dest),
                    prov,
                    time.monotonic() - (one if builds else started),
                    None if dropped else tree,
                    log,
                    f"{dist_info}/{PROVENANCE_FILE}",
                    f"{dist_info}/{SBOM_DIR}/{SBOM_FILE}",
                )
            )
        sweeper.join()
        if dropped is not None:
            dropped.join()
    return builds
