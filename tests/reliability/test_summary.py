"""The table `make test-reliability` prints (tests/reliability/summary.py): cases, outcomes
and kill points per test file, from JUnit XML and the kill tally."""

from __future__ import annotations

import json

from summary import render, tabulate

JUNIT = """<testsuites><testsuite>
<testcase classname="tests.reliability.test_kill" name="test_a"/>
<testcase classname="tests.reliability.test_kill" name="test_b"><failure/></testcase>
<testcase classname="tests.reliability.test_model.TestWorld" name="test_c"><skipped/></testcase>
</testsuite></testsuites>"""


def test_the_table_counts_cases_outcomes_and_kill_points(tmp_path):
    (tmp_path / "all.xml").write_text(JUNIT)
    tally = tmp_path / "tally-all.jsonl"
    tally.write_text(
        "".join(json.dumps(["tests/reliability/test_kill.py", n]) + "\n" for n in (3, 4))
    )
    rows = tabulate([tmp_path / "all.xml"], [tally])
    assert rows["tests/reliability/test_kill.py"] == {
        "cases": 2, "passed": 1, "failed": 1, "skipped": 0, "kill points": 7,
    }  # fmt: skip
    assert rows["tests/reliability/test_model.py"]["skipped"] == 1
    table = render("title", rows).splitlines()
    assert table[-1].split() == ["TOTAL", "3", "1", "1", "1", "7"]
