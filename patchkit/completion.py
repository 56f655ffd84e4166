"""Shell completion of the names a project defines: targets with their pinned refs, lines,
build and verify profiles. Read from the project's files (`patches/targets.toml`,
`build/profiles/`) at completion time; a project that cannot be read completes nothing,
never an error in the user's shell."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click
from click.shell_completion import CompletionItem

from patchkit.errors import PatchkitError


def _project(ctx: click.Context):
    """The project the completed command would run in (`-C DIR` honoured), or None."""
    from patchkit.project import find_project

    start = ctx.find_root().params.get("project_dir")
    with contextlib.suppress(PatchkitError, OSError):
        return find_project(Path(start) if start else None)
    return None


def _targets(ctx: click.Context):
    from patchkit.targets import load_targets

    project = _project(ctx)
    if project is None:
        return None
    with contextlib.suppress(PatchkitError, OSError, ValueError):
        return load_targets(project.targets_file)
    return None


def _items(names, incomplete: str) -> list[CompletionItem]:
    return [CompletionItem(name) for name in dict.fromkeys(names) if name.startswith(incomplete)]


def target_names(ctx: click.Context, param: click.Parameter, incomplete: str):
    """NAME, and NAME@REF for each pinned ref once an `@` is typed; `all` where a verb takes it."""
    targets = _targets(ctx)
    if targets is None:
        return []
    names = list(targets.targets)
    if "@" in incomplete:
        name = incomplete.split("@", 1)[0]
        target = targets.targets.get(name)
        names = [f"{name}@{ref}" for ref in target.refs] if target else []
    elif param.multiple or param.name in {"targets", "spec"}:
        names.append("all")
    return _items(names, incomplete)


def line_names(ctx: click.Context, param: click.Parameter, incomplete: str):
    """The lines of the target named on the command line, else of every target."""
    targets = _targets(ctx)
    if targets is None:
        return []
    given = ctx.params.get("target_name") or ctx.params.get("target") or ctx.params.get("targets")
    wanted = {str(t).split("@", 1)[0] for t in ([given] if isinstance(given, str) else given or ())}
    names = []
    for name, target in targets.targets.items():
        if not wanted - {"all"} or name in wanted:
            names += target.line_names
    return _items(names, incomplete)


def profile_names(ctx: click.Context, param: click.Parameter, incomplete: str):
    """Profiles in the project's `build/profiles/`, then those packaged with patchkit."""
    from patchkit.abi.profiles import PACKAGED_DIR, available

    project = _project(ctx)
    dirs = [str(project.build_dir / "profiles")] if project else []
    return _items(available([*dirs, PACKAGED_DIR]), incomplete)
