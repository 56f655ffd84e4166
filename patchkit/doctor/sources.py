"""Where the doctor reads SGLang's model code from: the chosen line's (patched) tree.

A line is a series folder of targets.toml against one pinned release.  Its base is acquired
as `patchkit apply` acquires it (the sha256-checked sdist for 0.5.9, the pinned wheel for
0.5.12, imported into the mirror, or the pinned git commit) and the line's series is applied
in the mirror as commits, never in a work tree; files are read from the resulting commit.  A
release no line is pinned to is read from its wheel on the package index (downloaded with pip,
cached) and reported as unpatched.  ``--sglang-source`` points at any tree or wheel instead
(e.g. one made by `make wheels`).

Every file read is kept under ``$PATCHKIT_CACHE/doctor/sources/<key>/`` so later runs need
neither git nor the network.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from patchkit import ui
from patchkit.errors import FetchError, UsageError
from patchkit.project import cache_root

PACKAGE = "sglang"
MODELS_DIR = "sglang/srt/models/"


@dataclass
class ModelSource:
    """Read access to one SGLang tree's Python files (package-relative: ``sglang/srt/...``)."""

    label: str  # what the report says the code came from
    patched: bool | None  # None: a tree or wheel given by the user, as it is
    key: str
    _reader: object = None
    _cache: Path | None = None
    provenance: dict = field(default_factory=dict)
    _lister: object = None

    def model_files(self) -> list[str]:
        """Package-relative paths of ``sglang/srt/models/*.py``."""
        listing = self._cache / "models.json" if self._cache else None
        if listing is not None and listing.is_file():
            return json.loads(listing.read_text())
        names = sorted(
            p
            for p in self._lister()
            if p.startswith(MODELS_DIR) and p.endswith(".py") and "/" not in p[len(MODELS_DIR) :]
        )
        if listing is not None:
            tmp = listing.with_name(f".models.json.{os.getpid()}")
            tmp.write_text(json.dumps(names))
            os.replace(tmp, listing)
        return names

    def read(self, relpath: str) -> str | None:
        """The text of ``relpath`` (``sglang/srt/models/llama.py``), or None if absent."""
        rel = PurePosixPath(relpath)
        if rel.is_absolute() or ".." in rel.parts:
            raise UsageError(f"refusing to read {relpath!r} outside the tree")
        cached = self._cache / "files" / rel if self._cache else None
        if cached is not None and cached.is_file():
            return cached.read_text(encoding="utf-8")
        if cached is not None and (cached.parent / f".{rel.name}.absent").exists():
            return None
        data = self._reader(str(rel)) if self._reader else None
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            if data is None:
                (cached.parent / f".{rel.name}.absent").touch()
            else:
                tmp = cached.with_name(f".{cached.name}.{os.getpid()}")
                tmp.write_bytes(data)
                os.replace(tmp, cached)
        return None if data is None else data.decode("utf-8")


def _cache_dir(key: str, provenance: dict, cache: Path | None = None) -> Path:
    root = (cache or cache_root()) / "doctor" / "sources" / key
    root.mkdir(parents=True, exist_ok=True)
    manifest = root / "source.json"
    if not manifest.exists():
        tmp = manifest.with_name(f".source.json.{os.getpid()}")
        tmp.write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, manifest)
    return root


def from_path(path: Path) -> ModelSource:
    """A tree (a directory holding ``sglang/`` or ``python/sglang/``) or a wheel file."""
    path = path.expanduser()
    if path.is_file() and path.suffix == ".whl":
        return from_wheel(path, patched=None, label=f"wheel {path.name} (as given)")
    for root in (path, path / "python"):
        if (root / PACKAGE / "srt" / "models").is_dir():
            base = root.resolve()

            def read_dir(rel: str, base: Path = base) -> bytes | None:
                target = (base / rel).resolve()
                if not target.is_relative_to(base) or not target.is_file():
                    return None
                return target.read_bytes()

            def list_dir(base: Path = base) -> list[str]:
                return [p.relative_to(base).as_posix() for p in (base / MODELS_DIR).glob("*.py")]

            return ModelSource(
                f"tree {path} (as given)", None, "", read_dir, None, {"tree": str(base)}, list_dir
            )
    raise UsageError(
        f"--sglang-source {path}: neither an SGLang wheel nor a tree with sglang/srt/models/",
        hint="pass an unpacked SGLang tree, a repository checkout or a .whl file",
    )


def installed_sglang() -> ModelSource | None:
    """The SGLang installed in this interpreter (e.g. from `make wheels`), found without
    importing it (importing sglang imports torch)."""
    import importlib.metadata
    import importlib.util

    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))).parent
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    source = from_path(root)
    source.label = f"installed sglang {version} at {root / PACKAGE}"
    return source


def from_wheel(
    wheel: Path, *, patched: bool | None, label: str | None = None, cache: Path | None = None
) -> ModelSource:
    """Read the wheel's members directly (no extraction)."""
    digest = _sha256(wheel)
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise UsageError(f"{wheel}: not a readable wheel ({exc})") from exc
    names = set(zf.namelist())

    def read_member(rel: str) -> bytes | None:
        return zf.read(rel) if rel in names else None

    provenance = {"wheel": wheel.name, "sha256": digest, "patched": patched}
    return ModelSource(
        label or f"wheel {wheel.name}",
        patched,
        f"wheel-{digest[:16]}",
        read_member,
        _cache_dir(f"wheel-{digest[:16]}", provenance, cache),
        provenance,
        lambda: sorted(names),
    )


def for_line(
    line: str | None,
    *,
    project: Path | None = None,
    cache: Path | None = None,
) -> ModelSource:
    """The model source of SGLang ``line``: a line name or a release a line is pinned to
    (default: the target's default line), with that line's series applied; a release no
    line carries is read, unpatched, from its wheel on the package index."""
    from patchkit.errors import PatchkitError
    from patchkit.workspace import Workspace

    try:
        ws = Workspace.load(project)
        target = ws.target(PACKAGE)
    except PatchkitError:  # outside a project checkout: only index wheels are possible
        ws, target = None, None
    if target is None and line is None:
        installed = installed_sglang()
        if installed is not None:
            return installed
        raise UsageError(
            "no --line given, no patchkit project here and no SGLang installed to check against",
            hint="pass --line VERSION or --sglang-source PATH",
        )
    view = _line_view(target, line) if target is not None else None
    if view is not None:
        return _pinned_line(ws, view, cache or cache_root())
    return _wheel_line(line, cache or cache_root())


def _line_view(target, line: str | None):
    """``target`` seen through the line ``line`` names (a line, or the release it is pinned
    to), or None when no line carries it; a retired line, or its release, is refused."""
    if line is None or line in target.line_names:
        return target.on_line(line)
    release = target.release(line)
    for old in target.retired:
        if line == old.name or (release is not None and release.version == old.pin):
            target.on_line(old.name)  # refuses, naming the line that carries it on
    chosen = target.line_for_release(release) if release is not None else None
    return target.on_line(chosen.name) if chosen is not None else None


def _pinned_line(ws, target, cache_dir: Path) -> ModelSource:
    from patchkit import gitops
    from patchkit.apply import ApplyOptions, build_series
    from patchkit.lines import line_series
    from patchkit.upstream import Mirror

    release = target.pinned
    series = line_series(ws.project, target)
    wheel = release.base_wheel if not release.sdist else None
    pin_id = release.sdist_sha256 or (wheel.sha256 if wheel else None) or release.commit
    pin_id = pin_id or release.version
    digest = hashlib.sha256(f"{pin_id}|{series.hash()}".encode()).hexdigest()[:16]
    key = f"{target.name}-{release.version}-{digest}"
    if wheel is not None:
        base_source, base_name = "wheel", f"wheel {wheel.filename}"
    elif release.sdist:
        base_source, base_name = "sdist", f"sdist {release.sdist}"
    else:
        base_source, base_name = "git", f"commit {release.commit}"
    label = (
        f"sglang {release.version} + series patches/{target.current_line.series} "
        f"({len(series.patches)} patches) on its {base_name}"
    )
    provenance = {
        "line": target.line,
        "release": release.version,
        "base": pin_id,
        "base_source": base_source,
        "series": f"patches/{target.current_line.series}",
        "series_hash": series.hash(),
        "patches": [p.name for p in series.patches],
    }
    cache = _cache_dir(key, provenance, cache_dir)
    state: dict[str, object] = {}

    def tip() -> str:
        if "tip" not in state:
            from patchkit.upstream import acquire

            ui.progress(
                f"acquiring {target.name} {release.version} and applying line {target.line}"
            )
            base = acquire(target, None, cache=cache_dir)
            commit, _ = build_series(
                Mirror(target, cache_dir).repo, base.commit, series, ApplyOptions()
            )
            state["tip"] = commit
        return str(state["tip"])

    prefix = f"{target.subdir}/" if target.subdir else ""

    def read_git(rel: str) -> bytes | None:
        return gitops.show_file(Mirror(target, cache_dir).repo, tip(), prefix + rel)

    def list_git() -> list[str]:
        paths = gitops.tree_paths(Mirror(target, cache_dir).repo, tip())
        return [p[len(prefix) :] for p in paths if p.startswith(prefix)]

    return ModelSource(label, bool(series.patches), key, read_git, cache, provenance, list_git)


def _wheel_line(version: str, cache_dir: Path) -> ModelSource:
    wheels = cache_dir / "doctor" / "wheels"
    found = sorted(wheels.glob(f"{PACKAGE}-{version}-*.whl")) if wheels.is_dir() else []
    if not found:
        ui.progress(f"downloading the sglang {version} wheel from the package index")
        wheels.mkdir(parents=True, exist_ok=True)
        # Any platform's wheel carries the same Python sources; ask for one pip can name.
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64",
            "--dest", str(wheels), f"{PACKAGE}=={version}",
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(wheels.glob(f"{PACKAGE}-{version}-*.whl"))
        if proc.returncode != 0 or not found:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise FetchError(
                f"cannot obtain the sglang {version} wheel: {tail[0]}",
                hint=f"download it yourself and pass --sglang-source sglang-{version}-...whl",
            )
    return from_wheel(
        found[0],
        patched=False,
        label=f"sglang {version} wheel {found[0].name} (unpatched: no line is pinned to it)",
        cache=cache_dir,
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
