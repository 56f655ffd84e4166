"""Where a patchkit project lives: its root, patches/, build/ and the cache."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from patchkit.errors import ConfigError


@dataclass(frozen=True)
class Project:
    """A checkout of the patch series: `patches/targets.toml` marks its root."""

    root: Path
    # Found neither from $PATCHKIT_PROJECT nor from the current folder: the checkout an editable
    # install was made from.  Verbs read it (with a note); none writes into it.
    installed: bool = field(default=False, compare=False)

    def refuse_unnamed(self, what: str, *, when: bool = True) -> None:
        """Refuse `what` (a verb writing into this project; `when`: it writes this time) in a
        project the user did not name: one found only as the checkout patchkit was installed
        from."""
        if self.installed and when:
            raise ConfigError(
                f"{what} would write into {self.root}, the checkout patchkit was installed from: "
                f"no project (patches/targets.toml) in {Path.cwd()} or above; nothing was written",
                hint=f"run it inside the project you mean, or name this one: "
                f"PATCHKIT_PROJECT={self.root}",
            )

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def targets_file(self) -> Path:
        return self.patches_dir / "targets.toml"

    @property
    def build_dir(self) -> Path:
        return self.root / "build"

    @property
    def work_dir(self) -> Path:
        """Default, git-ignored place for work trees made by `apply` and `build`."""
        return self.root / "work"

    @property
    def lock_path(self) -> Path:
        """Held while patchkit edits patches/ (targets.toml, a line's series)."""
        return self.work_dir / ".patches.lock"

    def series_dir(self, target: str, line: str | None = None) -> Path:
        """The series folder of `target`'s line `line` (None: its default line)."""
        from patchkit.targets import load_targets

        view = load_targets(self.targets_file).get(target, line)
        return self.patches_dir / view.current_line.series


_NOTED: set[Path] = set()


def find_project(start: Path | None = None) -> Project:
    """The project root: $PATCHKIT_PROJECT, else the nearest parent with patches/targets.toml,
    else (said in one line on stderr) the checkout patchkit was installed from."""
    env = os.environ.get("PATCHKIT_PROJECT")
    if env:
        root = Path(env).resolve()
        if not (root / "patches" / "targets.toml").is_file():
            raise ConfigError(f"PATCHKIT_PROJECT={env} has no patches/targets.toml")
        return Project(root)
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "patches" / "targets.toml").is_file():
            return Project(candidate)
    packaged = Path(__file__).resolve().parent.parent
    if (packaged / "patches" / "targets.toml").is_file():
        if packaged not in _NOTED:  # once per run: the project is one the user did not name
            _NOTED.add(packaged)
            sys.stderr.write(
                f"patchkit: note: no project in {here} or above; using {packaged}, the "
                "checkout patchkit was installed from (PATCHKIT_PROJECT names another)\n"
            )
            sys.stderr.flush()
        return Project(packaged, installed=True)
    raise ConfigError(
        "no patches/targets.toml here or above",
        hint="run inside a patchkit checkout or set PATCHKIT_PROJECT",
    )


def cache_root() -> Path:
    """The cache for mirrors and downloads: $PATCHKIT_CACHE, else ~/.cache/patchkit."""
    env = os.environ.get("PATCHKIT_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "patchkit").resolve()
