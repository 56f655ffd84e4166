"""Edits of targets.toml: move a line's pin, add a line or a release.

Made with tomlkit on the parsed document, so comments, order and quoting (`lines."0.5.9"`)
stay as they were written; the result is validated before it replaces the file.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING

import tomlkit
import tomlkit.items

from patchkit.errors import UsageError
from patchkit.files import leftovers, replace_file
from patchkit.scratch import temporary_folder
from patchkit.targets import load_targets

if TYPE_CHECKING:
    from patchkit.upstream.newbase import NewPin


def check_targets(text: str) -> None:
    """Refuse edited targets.toml text that would not load (before anything is written)."""
    with temporary_folder("targets-") as tmp:
        path = Path(tmp) / "targets.toml"
        path.write_text(text, encoding="utf-8")
        load_targets(path)


def render_targets(
    text: str,
    target: str,
    pin: NewPin | None,
    series_version: str,
    *,
    line: str | None = None,
    new_line: str | None = None,
    new_series: str | None = None,
    version: str | None = None,
) -> str:
    """targets.toml with the series version bumped, the line's pin moved (or a new line
    added) and, for a new release, its [[targets.<name>.releases]] entry added.  Edited with
    tomlkit, so comments, order and quoting stay as they were."""
    doc = tomlkit.parse(text)
    doc["series"]["version"] = series_version
    table = doc["targets"][target]
    pinned = pin.version if pin is not None else version
    if new_line is not None:
        if "lines" not in table:
            raise UsageError(
                f"--new-line: [targets.{target}] declares no lines; declare its line in "
                "targets.toml first (see README: series lines)"
            )
        entry = tomlkit.table()
        entry["pin"] = pinned
        entry["series"] = new_series or f"{target}/{new_line}"
        entry.add(tomlkit.nl())
        table["lines"][new_line] = entry
    elif pin is not None:
        if "lines" in table and line is not None:
            table["lines"][line]["pin"] = pin.version
        else:
            table["pin"] = pin.version
    if pin is not None and pin.new:
        releases = table["releases"]
        if len(releases) and not releases[-1].as_string().endswith("\n\n"):
            releases[-1].add(tomlkit.nl())  # the file's last table: a blank line before the new one
        releases.append(_release_table(pin))
    return tomlkit.dumps(doc)


def _release_table(pin: NewPin) -> tomlkit.items.Table:
    entry = tomlkit.table()
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    source = "git commit"
    if pin.sdist:
        source = "trust on first use of the index's sdist"
    elif pin.wheels:
        source = "trust on first use of the index's wheels"
    entry.add(tomlkit.comment(f"Pinned by `patchkit rebase --write` on {today}: {source}."))
    if (pin.sdist or pin.wheels) and not pin.recorded_commit:
        what = "sdist" if pin.sdist else "wheels"
        entry.add(
            tomlkit.comment(
                f"No upstream commit recorded in the {what}: the sha256 is its only identity."
            )
        )
    entry["version"] = pin.version
    if pin.tag:
        entry["tag"] = pin.tag
    if pin.commit:
        entry["commit"] = pin.commit
    if pin.sdist:
        entry["sdist"] = pin.sdist
    if pin.sdist_sha256:
        entry["sdist_sha256"] = pin.sdist_sha256
    if pin.wheels:
        wheels = tomlkit.array()
        for wheel in pin.wheels:
            item = tomlkit.inline_table()
            item.update({"file": wheel["file"], "sha256": wheel["sha256"]})
            wheels.append(item)
        entry["wheels"] = wheels.multiline(True)
    entry.add(tomlkit.nl())
    return entry


def write_targets(targets_file: Path, text: str) -> None:
    """Replace targets.toml atomically (under the project lock, which the caller holds)."""
    for stale in leftovers(targets_file):  # a killed writer's
        stale.unlink(missing_ok=True)
    replace_file(targets_file, text.encode("utf-8"))
