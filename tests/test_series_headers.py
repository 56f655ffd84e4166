"""The From: and Date: readings of `series` agree with the email package's on every header.

`series.parse_author` and `series.parse_date` read the form `git format-patch` writes
themselves and hand anything else to `email.utils`; the commit ids `apply` makes depend on
both readings, so each is compared with the email package's over headers of every shape.
"""

from __future__ import annotations

import email.utils
import itertools
from pathlib import Path

import pytest

from patchkit.series import parse_author, parse_date, parse_patch
from patchkit.targets import wheel_filename_version

ROOT = Path(__file__).resolve().parent.parent

NAMES = [
    "A U Thor",
    "Zoë Ångström",
    "O'Neil",
    "Jean-Luc",
    "x",
    "_",
    "123",
    "J. Doe",
    "Doe, John",
    '"Quoted Name"',
    "a  b",
    " lead",
    "trail ",
    "(comment) X",
    "Ünï cödé ñ",
    "",
    "tab\tname",
    "semi;colon",
    "日本 語",
]
ADDRESSES = [
    "a@example.org",
    "first.last+tag@x.y.z",
    "a..b@x",
    ".a@x",
    "a@x.",
    "a-b@x-y",
    "ü@example.org",
    "no-at-sign",
    "a@b@c",
    "@x",
    "a@",
    "under_score@x",
]


def _authors():
    for name, addr in itertools.product(NAMES, ADDRESSES):
        yield f"{name} <{addr}>"
        yield f"{name}<{addr}>"
    yield from ["a@example.org", "<a@example.org>", "Name", "Name <>", "Name <a@x> extra"]
    for patch in sorted(ROOT.glob("patches/*/*/*.patch")):
        for line in patch.read_text(encoding="utf-8").splitlines():
            if line.startswith("From: "):
                yield line[6:]
                break


def test_author_reading_agrees_with_the_email_package():
    values = sorted(set(_authors()))
    wrong = [v for v in values if parse_author(v) != email.utils.parseaddr(v)]
    assert not wrong and len(values) > 400


def _dates():
    days = ["Mon", "Tue", "Sun"]
    for day, date, clock, zone in itertools.product(
        days,
        [
            "1 Dec 2026",
            "01 Dec 2026",
            "29 Feb 2024",
            "29 Feb 2023",
            "31 Apr 2026",
            "0 Jan 2026",
            "15 Jun 1970",
            "1 Jan 9999",
            "7 Jul 0001",
        ],
        ["00:00:00", "23:59:59", "24:00:00", "12:60:00", "12:00:60", "1:02:03"],
        ["+0000", "-0000", "+0100", "-0130", "+1400", "-1200", "+9959", "+2500", "UT", "GMT"],
    ):
        yield f"{day}, {date} {clock} {zone}"
    yield from [
        "1 Dec 2026 10:00:00 +0000",
        "Tue,  1 Dec 2026 10:00:00 +0000",
        "garbage",
        "",
        "Tue, 1 Dec 2026 10:00 +0000",
        "Xyz, 1 Dec 2026 10:00:00 +0000",
        "Tue, 1 Dec 2026 10:00:00 +0000 (UTC)",
        "Tue, 1 dec 2026 10:00:00 +0000",
    ]
    for patch in sorted(ROOT.glob("patches/*/*/*.patch")):
        for line in patch.read_text(encoding="utf-8").splitlines():
            if line.startswith("Date: "):
                yield line[6:]
                break


def _email_date(value):
    try:
        return email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def test_date_reading_agrees_with_the_email_package():
    values = sorted(set(_dates()))
    # the same instant and the same zone (or the same lack of one): repr names both
    wrong = [v for v in values if repr(parse_date(v)) != repr(_email_date(v))]
    assert not wrong and len(values) > 1000
    assert sum(parse_date(v) is not None for v in values) > 300


def test_a_patch_with_an_unusual_author_still_parses(tmp_path):
    raw = (
        b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        b'From: "Doe, J." <j@example.org>\nDate: Tue, 1 Dec 2026 10:00:00 -0000\n'
        b"Subject: [PATCH] x\n\nbody\n---\n"
        b"diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n"
    )
    patch = parse_patch("0001-x.patch", raw)
    assert parse_author(patch.author) == ("Doe, J.", "j@example.org")
    assert parse_date(patch.date) == _email_date("Tue, 1 Dec 2026 10:00:00 -0000")


WHEELS = [
    "sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl",
    "a-1.0-1b-py3-none-any.whl",
    "a__b-1.0-py3-none-any.whl",
    "a-1.0.whl",
    "a-x.y.z-py3-none-any.whl",
    "a-1.0-b-py3-none-any.whl",
    "ä-1.0-py3-none-any.whl",
    "a-1.0-py3-none-any.tar",
    "a-1.0-py3-none-any.whl.whl",
    "a-1!2.0.post1-py3-none-any.whl",
    "a-v1.0-py3-none-any.whl",
    "A.B_c-01.0-py3-none-any.whl",
    "-1.0-py3-none-any.whl",
    "a-1.0--py3-none-any.whl",
    "a-1.0-1-2-py3-none-any.whl",
]


@pytest.mark.parametrize("filename", WHEELS)
def test_wheel_file_names_read_as_packaging_reads_them(filename):
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        theirs = parse_wheel_filename(filename)[1]
    except InvalidWheelFilename:
        with pytest.raises(ValueError):
            wheel_filename_version(filename)
        return
    assert wheel_filename_version(filename) == theirs
