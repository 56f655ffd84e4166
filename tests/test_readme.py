"""What the README says that the repository itself decides: checked, so that a change to the
series or to the planted mistakes cannot leave it stale."""

from __future__ import annotations

import re
import sys

from helpers import ROOT, series_folder

from patchkit.series import load_series

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

README = (ROOT / "README.md").read_text()


def test_the_sample_wheels_are_those_the_series_builds_now():
    """The sample `make wheels` output names each wheel by the hash of its line's series as
    it is: a patch changed since leaves the sample's version and hash stale."""
    shown = re.findall(
        r"\+cu130\.pk([0-9a-f]{8}): \S+ \(wheel base [0-9a-f]+\) \+ (\S+) line (\S+) series "
        r"\S+ \(([0-9a-f]{12})\)",
        README,
    )
    assert shown, "no sample `make wheels` output in README.md"
    for short, target, line, long in shown:
        digest = load_series(series_folder(ROOT, target, line), target).hash()
        assert (short, long) == (digest[:8], digest[:12]), (
            f"README.md shows the {target} {line} series as pk{short} ({long}); it is "
            f"pk{digest[:8]} now: run `make wheels` and paste its output"
        )


def test_the_planted_mistakes_are_counted_as_tests_mutation_holds_them():
    (counts,) = re.findall(r"\(tests/mutation/: ([^)]*)\)", README)
    said = {line: int(n) for n, line in re.findall(r"(\d+) on (\d+\.\d+\.\d+)", counts)}
    held = {}
    for path in sorted((ROOT / "tests" / "mutation").glob("*.toml")):
        data = tomllib.loads(path.read_text())
        held[data["line"]] = len(data["mutation"])
    assert said == held, f"README.md counts {said}; tests/mutation holds {held}"
