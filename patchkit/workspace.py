"""A loaded project: targets.toml plus the series of each target."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from patchkit.archives import special_file_problem
from patchkit.errors import ConfigError
from patchkit.project import Project, find_project
from patchkit.series import Series, load_series
from patchkit.targets import RefSpec, Target, Targets, load_targets, parse_target_spec


@dataclass
class Workspace:
    project: Project
    targets: Targets

    @classmethod
    def load(cls, start: Path | None = None) -> Workspace:
        project = find_project(start)
        return cls(project, load_targets(project.targets_file))

    def target(self, name: str) -> Target:
        return self.targets.get(name)

    def series(self, name: str) -> Series:
        self.targets.get(name)
        directory = self.project.series_dir(name)
        refuse_special_files(directory)
        return load_series(directory, name)

    def expand(self, specs: tuple[str, ...] | list[str]) -> list[RefSpec]:
        """`all` (optionally `all@<ref>` is refused) -> one RefSpec per target, in file order."""
        out: list[RefSpec] = []
        for spec in specs:
            parsed = parse_target_spec(spec)
            if parsed.target == "all":
                out.extend(RefSpec(name, None) for name in self.targets.targets)
            else:
                self.targets.get(parsed.target)
                out.append(parsed)
        return out


def refuse_special_files(directory: Path) -> None:
    """A FIFO or device in a series directory would block (or feed) the reader: refuse it."""
    if not directory.is_dir():
        return
    for entry in sorted(directory.iterdir()):
        problem = special_file_problem(entry) if not entry.is_dir() else None
        if problem:
            raise ConfigError(
                f"{problem}; a series directory holds regular files only; nothing was read",
                hint=f"replace {entry.name} with the file it stands for",
            )
