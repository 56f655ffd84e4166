"""The table `make test-reliability` ends with: per test file of tests/reliability, the cases
run, passed, failed and skipped (from pytest's JUnit XML) and the kill and interrupt points
tried (from the tally `reliability_support.tally_kill` appends to).

    python tests/reliability/summary.py FOLDER   # FOLDER/*.xml and FOLDER/tally*.jsonl
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

COLUMNS = ("cases", "passed", "failed", "skipped", "kill points")


def _file_of(case: ET.Element) -> str:
    """tests/reliability/<file>.py of a JUnit test case (its classname is the dotted module,
    then any test class)."""
    parts = (case.get("classname") or "?").split(".")
    module = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
    return "/".join(parts[: module + 1]) + ".py"


def _outcome(case: ET.Element) -> str:
    if case.find("failure") is not None or case.find("error") is not None:
        return "failed"
    return "skipped" if case.find("skipped") is not None else "passed"


def tabulate(xml_files: list[Path], tally_files: list[Path]) -> dict[str, dict[str, int]]:
    rows: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(COLUMNS, 0))
    for path in xml_files:
        for case in ET.parse(path).getroot().iter("testcase"):
            row = rows[_file_of(case)]
            row["cases"] += 1
            row[_outcome(case)] += 1
    for path in tally_files:
        for line in path.read_text(encoding="utf-8").splitlines():
            test, count = json.loads(line)
            rows[test]["kill points"] += count
    return dict(rows)


def render(title: str, rows: dict[str, dict[str, int]]) -> str:
    total = {c: sum(r[c] for r in rows.values()) for c in COLUMNS}
    width = max([len("TOTAL"), *map(len, rows)])

    def row(name: str, values: dict[str, int]) -> str:
        return f"{name:<{width}}  " + "  ".join(f"{values[c]:>11}" for c in COLUMNS)

    head = f"{'test file':<{width}}  " + "  ".join(f"{c:>11}" for c in COLUMNS)
    rule = "-" * len(head)
    body = [row(name, rows[name]) for name in sorted(rows)]
    return "\n".join([title, head, rule, *body, rule, row("TOTAL", total)])


def main(folder: str) -> int:
    root = Path(folder)
    runs = [
        ("reliability tests (every point, the randomized model search)", "all"),
        ("test_kill.py, repeated", "kill"),
    ]
    for title, stem in runs:
        xml = sorted(root.glob(f"{stem}*.xml"))
        if xml:
            title = f"{title}: {len(xml)} run(s)"
            print(render(title, tabulate(xml, sorted(root.glob(f"tally-{stem}*.jsonl")))))
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "work/reliability"))
