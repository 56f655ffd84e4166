"""A loaded project: targets.toml plus the series of each target."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from patchkit.files import digest
from patchkit.project import Project, find_project
from patchkit.series import Series, load_series
from patchkit.targets import RefSpec, Target, Targets, load_targets, parse_target_spec


@dataclass
class Workspace:
    project: Project
    targets: Targets
    # targets.toml as it was when `targets` was parsed from it (taken just before): a writer
    # of patches/ proves under its lock that the file still holds it (export.SeriesRead).
    targets_digest: str | None = None

    @classmethod
    def load(cls, start: Path | None = None) -> Workspace:
        project = find_project(start)
        seen = digest(project.targets_file)
        return cls(project, load_targets(project.targets_file), seen)

    def target(self, name: str) -> Target:
        return self.targets.get(name)

    def series(self, name: str) -> Series:
        self.targets.get(name)
        return load_series(self.project.series_dir(name), name)

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
