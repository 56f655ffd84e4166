"""`patchkit lint`: the real series is clean; each rule fires on a series broken on purpose."""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path

import pytest
from helpers import ROOT, patchkit, result_of

from patchkit.lint import RULES, RoundTripStamp, lint_target

SYMM = "sm120-torch-symm-mem-allreduce.patch"
KIMI = "kimi-k25-eagle3-delegation.patch"
TODAY = dt.date(2026, 12, 1)


@pytest.fixture
def series_dir(tmp_path) -> Path:
    """A two-patch copy of the real sglang series (independent files)."""
    dest = tmp_path / "sglang"
    dest.mkdir()
    for name in (SYMM, KIMI):
        shutil.copy(ROOT / "patches" / "sglang" / "0.5.9" / name, dest / name)
    (dest / "series").write_text(f"# two patches\n{SYMM}\n{KIMI}\n")
    return dest


def rules(directory: Path, **kw) -> set[str]:
    report = lint_target("sglang", directory, "python", today=TODAY, **kw)
    return {f.rule for f in report.findings}


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_real_series_lints_clean_with_the_reexport(cache):
    r = patchkit("lint", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = result_of(r.stdout)
    assert report["errors"] == 0 and report["warnings"] == 0
    assert set(report["checked"]) == {
        "sglang/0.5.9",
        "sglang/0.5.17",
        "sglang/0.5.23",
        "flashinfer/0.6.3",
        "flashinfer/0.6.15.post1",
    }


def test_copy_is_clean(series_dir):
    assert rules(series_dir) == set()


def test_series_missing_extra_duplicate_name(series_dir):
    (series_dir / "series").write_text(f"{SYMM}\n{SYMM}\ngone.patch\nnot a name\n")
    assert rules(series_dir) == {
        "series-duplicate",
        "series-missing",
        "series-extra",
        "series-name",
    }


@pytest.mark.parametrize(
    "old,new,rule",
    [
        ("Forwarded: no\n", "", "metadata-missing"),
        ("Last-Update: 2026-12-01\n", "", "metadata-missing"),
        ("Origin: vendor, patchkit\n", "", "metadata-missing"),
        ("Forwarded: no\n", "Forwarded: yes\n", "metadata-malformed"),
        ("Origin: vendor, patchkit\n", "Origin: someone\n", "metadata-malformed"),
        ("Origin: vendor, patchkit\n", "Origin: backport, a PR somewhere\n", "metadata-malformed"),
        ("Last-Update: 2026-12-01\n", "Last-Update: 29/11/2026\n", "metadata-malformed"),
        ("Last-Update: 2026-12-01\n", "Last-Update: 2027-01-01\n", "metadata-malformed"),
        ("Forwarded: no\n", "Forwarded: no\nBug: sglang#1\n", "metadata-malformed"),
    ],
)
def test_metadata_rules(series_dir, old, new, rule):
    edit(series_dir / SYMM, old, new)
    assert rules(series_dir) == {rule}


def test_forwarded_url_and_not_needed_are_accepted(series_dir):
    edit(
        series_dir / SYMM,
        "Forwarded: no\n",
        "Forwarded: https://github.com/sgl-project/sglang/pull/1\n",
    )
    edit(series_dir / KIMI, "Forwarded: no\n", "Forwarded: not-needed\n")
    assert rules(series_dir) == set()


def test_description_missing(series_dir):
    path = series_dir / KIMI
    text = path.read_text()
    start = text.index("\n\n", text.index("Subject:")) + 2
    path.write_text(text[:start] + text[text.index("Origin:") :])
    assert "description-missing" in rules(series_dir)


def test_trailing_whitespace_and_crlf_in_added_lines(series_dir):
    edit(
        series_dir / KIMI,
        "+    def get_embed_and_head(self):\n",
        "+    def get_embed_and_head(self):  \n",
    )
    edit(series_dir / SYMM, "+    12: {\n", "+    12: {\r\n")
    assert rules(series_dir) == {"trailing-whitespace", "crlf"}


@pytest.mark.parametrize("bad", ["../escape.py", "/etc/passwd", ".git/hooks/post-checkout"])
def test_paths_must_stay_inside_the_target(series_dir, bad):
    path = "python/sglang/srt/models/kimi_k25.py"
    text = (series_dir / KIMI).read_text().replace(f"a/{path}", f"a/{bad}".replace("a//", "/"))
    text = text.replace(f"b/{path}", f"b/{bad}".replace("b//", "/"))
    (series_dir / KIMI).write_text(text)
    assert "path-escape" in rules(series_dir)


def test_path_outside_the_sdist_subdir_is_a_warning(series_dir):
    path = "python/sglang/srt/models/kimi_k25.py"
    text = (series_dir / KIMI).read_text().replace(path, "sgl-kernel/x.py")
    (series_dir / KIMI).write_text(text)
    report = lint_target("sglang", series_dir, "python", today=TODAY)
    assert {f.rule for f in report.findings} == {"path-outside-subdir"}
    assert not report.errors


def test_overlapping_hunks_are_reported(series_dir):
    second = series_dir / "again.patch"
    shutil.copy(series_dir / KIMI, second)
    (series_dir / "series").write_text(f"{SYMM}\n{KIMI}\nagain.patch\n")
    report = lint_target("sglang", series_dir, "python", today=TODAY)
    overlap = [f for f in report.findings if f.rule == "overlap"]
    assert overlap and overlap[0].patch == "again.patch" and KIMI in overlap[0].message
    assert RULES["overlap"][0] == "warning"


def test_reexport_mismatch_is_an_error(series_dir):
    exported = {
        SYMM: (series_dir / SYMM).read_bytes(),
        KIMI: (series_dir / KIMI).read_bytes().replace(b"Subject: ", b"Subject: x"),
    }
    found = rules(series_dir, reexport=lambda target: exported)
    assert found == {"reexport"}


def test_reexport_against_the_pinned_upstream(cache, project):
    """A patch without index lines applies, but is not what the canonical export writes."""
    path = project / "patches" / "sglang" / "0.5.9" / SYMM
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(ln for ln in lines if not ln.startswith("index ")))
    r = patchkit("lint", "--target", "sglang")
    assert r.returncode == 1
    assert f"error: sglang/0.5.9/{SYMM}: [reexport]" in r.stdout
    assert patchkit("lint", "--target", "sglang", "--no-reexport").returncode == 0


def test_every_rule_has_a_severity():
    assert {s for s, _ in RULES.values()} == {"error", "warning"}


def logging_git(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An env whose `git` logs each call's subcommand line before running the real git."""
    shim, log = tmp_path / "shim", tmp_path / "git-calls.log"
    shim.mkdir()
    real = shutil.which("git")
    (shim / "git").write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{real}" "$@"\n')
    (shim / "git").chmod(0o755)
    return {"PATH": f"{shim}:{os.environ['PATH']}"}, log


def builds(log: Path) -> int:
    """How many `git apply --cached` the logged runs started (0: no series was built)."""
    calls = log.read_text().splitlines() if log.exists() else []
    log.write_text("")
    return sum(" apply --cached " in f" {c} " for c in calls)


def test_a_proven_round_trip_is_not_built_again(cache, project, tmp_path):
    """The second lint of the same series on the same base reads the stamp (no build, the
    same report); a changed patch is built and checked again, and a failing round trip is
    never recorded, so it fails again; the clean state's stamp still stands afterwards."""
    env, log = logging_git(tmp_path)
    first = patchkit("lint", "--target", "sglang", "--json", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert builds(log) > 0
    again = patchkit("lint", "--target", "sglang", "--json", env=env)
    assert again.returncode == 0 and result_of(again.stdout) == result_of(first.stdout)
    assert builds(log) == 0
    path = project / "patches" / "sglang" / "0.5.9" / SYMM
    clean = path.read_bytes()
    path.write_text("".join(ln for ln in clean.decode().splitlines(True) if "index " not in ln))
    for _ in range(2):
        broken = patchkit("lint", "--target", "sglang", env=env)
        assert broken.returncode == 1 and f"sglang/0.5.9/{SYMM}: [reexport]" in broken.stdout
        assert builds(log) > 0
    path.write_bytes(clean)
    assert patchkit("lint", "--target", "sglang", env=env).returncode == 0
    assert builds(log) == 0


def test_the_round_trip_stamp_names_every_input(tmp_path, series_dir):
    from patchkit.series import load_series

    patches = load_series(series_dir, "sglang").patches
    code = [tmp_path / "module.py"]
    code[0].write_text("x = 1\n")
    stamp = RoundTripStamp.of(tmp_path, "sglang", "a" * 40, patches, code, "git 1")
    keys = {stamp.key}
    keys.add(RoundTripStamp.of(tmp_path, "sglang", "b" * 40, patches, code, "git 1").key)
    keys.add(RoundTripStamp.of(tmp_path, "sglang", "a" * 40, patches[:1], code, "git 1").key)
    keys.add(RoundTripStamp.of(tmp_path, "sglang", "a" * 40, patches, code, "git 2").key)
    code[0].write_text("x = 2\n")
    keys.add(RoundTripStamp.of(tmp_path, "sglang", "a" * 40, patches, code, "git 1").key)
    assert len(keys) == 5
    exact = {p.name: p.raw for p in patches}
    stamp.record(patches, {**exact, patches[0].name: patches[0].raw + b"\n"})
    stamp.record(patches, {**exact, "other.patch": b""})
    assert not stamp.holds() and not stamp.path.exists()
    stamp.record(patches, exact)
    assert stamp.holds()


def test_a_stamp_does_not_hide_a_tampered_mirror(cache, tmp_path):
    """The stamp is read only after `acquire` checked the base's objects: a tampered base is
    reported as an error (the re-export not checked), never passed as proven."""
    import zlib

    from helpers import git, loosen_packs

    assert patchkit("lint", "--target", "sglang").returncode == 0  # writes the stamps
    mirror = cache / "mirrors" / "sglang.git"
    base = git(mirror, "rev-parse", "refs/patchkit/sdist/0.5.9^{commit}").strip()
    blob = git(mirror, "rev-parse", f"{base}:python/README.md").strip()
    path = mirror / "objects" / blob[:2] / blob[2:]
    if not path.exists():  # packed: make the pack's objects loose (the private cache's own)
        loosen_packs(mirror)
    body = zlib.decompress(path.read_bytes()).split(b"\0", 1)[1]
    evil = body.replace(b"SGLang", b"EVILng", 1)
    assert evil != body
    path.unlink()
    path.write_bytes(zlib.compress(b"blob %d\0" % len(evil) + evil))
    r = patchkit("lint", "--target", "sglang")
    assert "[base-damaged]" in r.stdout and "damaged or tampered" in r.stdout, r.stdout
    assert r.returncode == 1, "a damaged base fails lint, not a warning"


def test_an_unknown_line_is_a_usage_error_naming_the_lines():
    """`--line` that no target has checked nothing and passed ("0 patch(es) in 0 line(s)")."""
    r = patchkit("lint", "--line", "0.5.99", "--no-reexport")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == ""
    [line] = r.stderr.splitlines()
    assert line.startswith("patchkit: error: --line 0.5.99: no target has that line (lines: ")
    assert "0.5.9, 0.5.17" in line and line.endswith("; did you mean '0.5.9'?"), line
    # A line of one target only is fine with every target, not with a target lacking it.
    assert patchkit("lint", "--line", "0.5.17", "--no-reexport").returncode == 0
    other = patchkit("lint", "--target", "flashinfer", "--line", "0.5.17", "--no-reexport")
    assert other.returncode == 2 and "(lines: 0.6.3, 0.6.15.post1)" in other.stderr


def test_a_retired_line_is_refused_naming_its_successor():
    """`lint --line 0.5.12` checked nothing once the line was retired: refused instead, in
    one line naming the line that carries it on and the commit holding its series."""
    r = patchkit("lint", "--line", "0.5.12", "--no-reexport")
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("patchkit: error: sglang line 0.5.12 is retired: "), line
    assert "use --line 0.5.17" in line and "git show 9b8af9823d2f:" in line, line


def test_an_unknown_key_of_targets_toml_is_named_with_the_nearest_known_one(tmp_path):
    """A typo of a known key is an error naming it; a key near none is a warning listing the
    table's keys; the real targets.toml has neither."""
    from patchkit.lint import lint_targets_file

    assert lint_targets_file(ROOT / "patches" / "targets.toml").findings == []
    text = (ROOT / "patches" / "targets.toml").read_text()
    edited = text.replace('subdir = "python"', 'subdir = "python"\nbogus_key = 3', 1).replace(
        '[targets.sglang.lines."0.5.17"]\npin', '[targets.sglang.lines."0.5.17"]\npinn', 1
    )
    edited = edited.replace('version = "0.5.23"\ntag', 'version = "0.5.23"\ntga', 1)
    path = tmp_path / "targets.toml"
    path.write_text(edited)
    found = {(f.rule, f.severity, f.message) for f in lint_targets_file(path).findings}
    assert found == {
        (
            "targets-key-unknown",
            "warning",
            "[targets.sglang] has the unknown key 'bogus_key', which is ignored; the table's "
            "keys are git, subdir, commit_id_file, default_line, pin, lines, releases",
        ),
        (
            "targets-key-typo",
            "error",
            "[targets.sglang.lines.\"0.5.17\"] has the unknown key 'pinn', which is ignored; "
            "did you mean 'pin'?",
        ),
        (
            "targets-key-typo",
            "error",
            "[targets.sglang.releases 0.5.23] has the unknown key 'tga', which is ignored; "
            "did you mean 'tag'?",
        ),
    }


def test_lint_reports_an_unknown_key_of_targets_toml(project):
    path = project / "patches" / "targets.toml"
    text = path.read_text()
    path.write_text(text.replace('subdir = "python"', 'subdir = "python"\nbogus_key = 3', 1))
    r = patchkit("lint", "--no-reexport")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning: targets.toml: [targets-key-unknown] [targets.sglang] has the unknown key " in (
        r.stdout
    )
    assert "1 warning(s)" in r.stdout
