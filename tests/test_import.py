"""`patchkit import`: a real monolithic diff of SGLang 0.5.9 (27 files, three concerns and a
dozen unrelated edits) becomes a per-concern series whose application equals the diff's tree;
overlays, mboxes, the existing series and every kind of bad input."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, SEED_LINE, git, patchkit, result_of, series_folder, snapshot
from import_fixtures import NEW_FILE, SERVER_ARGS, mapping_file, monolith  # noqa: F401
from rebase_fixtures import cache_0510, sglang_0510  # noqa: F401
from series_fixtures import write_series

from patchkit import gitops
from patchkit.import_ import split
from patchkit.import_.propose import ImportOptions, ImportSource, propose_import, write_proposal
from patchkit.import_.split import load_mapping
from patchkit.lint import lint_target
from patchkit.series import load_series
from patchkit.upstream import Mirror, acquire
from patchkit.workspace import Workspace

TODAY = dt.date(2026, 11, 30)


def _propose(source, *, mapping=None, existing=None, threeway=False, by_area=False):
    ws = Workspace.load()
    target = ws.target("sglang")
    base = acquire(target, None)
    options = ImportOptions(
        mapping=load_mapping(mapping) if mapping else None,
        threeway=threeway,
        by_area=by_area,
        today=TODAY,
    )
    return propose_import(
        Mirror(target).repo, base, source, subdir="python", existing=existing, options=options
    )


def _tree_of_series(directory, base_ref="0.5.9"):
    """Apply a written series from scratch with patchkit's apply core; its tree id."""
    from patchkit.apply import build_series

    ws = Workspace.load()
    target = ws.target("sglang")
    base = acquire(target, base_ref)
    series = load_series(directory, "sglang")
    tip, _ = build_series(Mirror(target).repo, base.commit, series)
    return gitops.tree_of(Mirror(target).repo, tip), series


def test_monolithic_diff_by_area_dry_run_writes_nothing(cache, project, monolith):  # noqa: F811
    before = snapshot(project)
    r = patchkit("import", str(monolith.diff), "--target", "sglang", "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert snapshot(project) == before
    lines = r.stdout.splitlines()
    assert re.match(r"\s+patch\s+files\s+\+\s+-$", lines[1])
    rows = {m.group(1): (int(m.group(2)), int(m.group(3)), int(m.group(4))) for m in (
        re.match(r"\s+(\S+\.patch)\s+(\d+)\s+(\d+)\s+(\d+)$", ln) for ln in lines
    ) if m}  # fmt: skip
    # one patch per area: package directories and top-level modules, each with a readable slug
    assert rows["srt-distributed-device-communicators-changes.patch"][0] == 4
    assert rows["srt-distributed-changes.patch"][0] == 1
    assert rows["srt-layers-moe-changes.patch"][0] == 1
    assert rows["srt-layers-changes.patch"][0] == 3  # communicator, fusion and the new file
    assert rows["srt-server-args-changes.patch"] == (1, 4, 0)  # both concerns: one area
    assert rows["packaging-changes.patch"] == (1, 1, 0)
    assert sum(v[0] for v in rows.values()) == len(monolith.files) == 27
    assert "the same as sglang.patch applied to the base" in r.stdout
    assert "nothing written (--dry-run)" in r.stdout
    doc = result_of(patchkit("import", str(monolith.diff), "--target", "sglang", "--json").stdout)
    assert doc["status"] == "proposed" and doc["proof"]["equal"] is True
    assert doc["proof"]["expected_tree"] == monolith.tree_id
    assert {p["name"]: p["added"] for p in doc["patches"]}["packaging-changes.patch"] == 1


def test_mapping_splits_a_file_by_function(cache, monolith, mapping_file, tmp_path):  # noqa: F811
    source = ImportSource.from_file(monolith.diff)
    report = _propose(source, mapping=mapping_file)
    assert report.status == "proposed", report.problems or report.difference
    assert report.expected_tree == report.proved_tree == monolith.tree_id  # git's own oracle
    names = [p.name for p in report.patches]
    assert names[:3] == [
        "sm120-allreduce.patch",
        "kimi-k25-eagle3.patch",
        "speculative-threshold.patch",
    ]
    by_name = {p.name: p for p in report.patches}
    assert SERVER_ARGS in by_name["sm120-allreduce.patch"].files
    assert SERVER_ARGS in by_name["speculative-threshold.patch"].files
    assert NEW_FILE in by_name["sm120-allreduce.patch"].files
    sm120 = by_name["sm120-allreduce.patch"].raw.decode()
    spec = by_name["speculative-threshold.patch"].raw.decode()
    assert "_sm120_allreduce = True" in sm120 and "_speculative_threshold" not in sm120
    assert "_speculative_threshold = True" in spec and "_sm120_allreduce" not in spec
    # the later concern's hunk sits where the earlier concern's lines moved it
    mono = re.findall(r"^@@ -(\d+),\d+ \+(\d+),", _file_part(monolith.diff.read_text()), re.M)
    assert len(mono) == 2 and int(mono[1][1]) == int(mono[1][0]) + 2
    assert re.findall(r"^@@ -(\d+),", _file_part(spec), re.M) == [mono[1][1]]
    # the exact series format: format-patch bytes with DEP-3 trailers naming the source
    assert sm120.startswith("From 0000000000000000000000000000000000000000 Mon Sep 17")
    assert f"(sha256 {source.sha256})" in sm120
    assert "Forwarded: no\nLast-Update: 2026-11-30\nPatchkit-Tests: TODO\n" in sm120
    assert "index " in sm120 and re.search(r"^index [0-9a-f]{40}\.\.[0-9a-f]{40}", sm120, re.M)
    # written: applies from scratch to the same tree; lints clean but for Patchkit-Tests
    out = tmp_path / "series-out"
    write_proposal(report, out=out, series_dir=None)
    tree, series = _tree_of_series(out)
    assert tree == monolith.tree_id
    assert series.names == names
    lint = lint_target("sglang", out, "python", today=TODAY)
    assert {f.rule for f in lint.findings} == {"metadata-malformed"}
    assert all("Patchkit-Tests: 'TODO'" in f.message for f in lint.findings)
    assert len(lint.findings) == len(names)


def _file_part(text: str, path: str = SERVER_ARGS) -> str:
    start = text.index(f"diff --git a/{path} ")
    end = text.find("\ndiff --git ", start + 1)
    return text[start : end if end > 0 else len(text)]


def test_proof_catches_a_wrong_split(cache, monolith, mapping_file, monkeypatch, tmp_path):  # noqa: F811
    """A split that loses a hunk (the mistake that matters) is refused, with the difference."""
    real = split.concern_diffs

    def lossy(concerns):
        cut = re.compile(
            r"^diff --git a/python/sglang/srt/models/kimi_k25\.py .*?(?=^diff |\Z)", re.M | re.S
        )
        return [cut.sub("", d) for d in real(concerns)]

    import patchkit.import_.propose as propose

    monkeypatch.setattr(propose, "concern_diffs", lossy)
    report = _propose(ImportSource.from_file(monolith.diff), mapping=mapping_file)
    assert report.status == "mismatch"
    assert report.proved_tree != report.expected_tree
    assert "python/sglang/srt/models/kimi_k25.py" in report.difference
    out = tmp_path / "never"
    with pytest.raises(Exception, match="not proved"):
        write_proposal(report, out=out, series_dir=None)
    assert not out.exists()


def test_round_trip_import_apply_export_import(cache, project, monolith, mapping_file, tmp_path):  # noqa: F811
    write_series(project, "sglang", {})
    r = patchkit(
        "import", str(monolith.diff), "--target", "sglang", "--mapping", str(mapping_file),
        "--into-series",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    series_dir = series_folder(project, "sglang")
    first = snapshot(series_dir)
    tree = tmp_path / "work"
    r = patchkit("apply", "--target", "sglang", "--into", str(tree))
    assert r.returncode == 0, r.stdout + r.stderr
    assert git(tree, "rev-parse", "HEAD^{tree}").strip() == monolith.tree_id
    r = patchkit("export", str(tree), "--check")
    assert r.returncode == 0, r.stdout  # apply + export reproduces every byte
    mbox = tmp_path / "series.mbox"
    mbox.write_bytes(
        subprocess.run(
            ["git", "format-patch", "--stdout", "refs/patchkit/sglang/base..HEAD"],
            cwd=tree,
            check=True,
            capture_output=True,
        ).stdout
    )
    again = tmp_path / "again"
    r = patchkit("import", str(mbox), "--target", "sglang", "--out", str(again))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "by messages" in r.stdout
    second = snapshot(again)
    assert second.pop("series") == first.pop("series").replace(b"# test series\n", b"")
    assert second == first  # the same series, byte for byte


def test_overlay_directory_with_backups(cache, monolith, tmp_path):  # noqa: F811
    overlay = tmp_path / "overlay"
    for path in monolith.files:
        rel = path.removeprefix("python/")
        dest = overlay / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes((monolith.tree / path).read_bytes())
        original = gitops.show_file(gitops.Repo.checkout(monolith.tree), monolith.base, path)
        if original is not None:
            (overlay / (rel + ".bak")).write_bytes(original)
    out = tmp_path / "out"
    r = patchkit("import", "--overlay", str(overlay), "--target", "sglang", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"note: skipped 26 backup/cache file\(s\): .*\.bak", r.stdout)
    assert f"1 file(s) are new: {NEW_FILE}" in r.stdout
    tree, series = _tree_of_series(out)
    assert tree == monolith.tree_id
    assert "Origin: vendor, imported from overlay (sha256 " in series.patches[0].raw.decode()
    assert not any(".bak" in f.path for p in series.patches for f in p.files)


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_an_overlay_holding_a_link_is_refused(cache, monolith, tmp_path, kind):  # noqa: F811
    """A link in an overlay is refused whether it leads to a file or a folder (os.walk lists a
    link to a folder and never enters it: its files would be left out without a word)."""
    overlay = tmp_path / "overlay"
    rel = monolith.files[0].removeprefix("python/")
    (overlay / rel).parent.mkdir(parents=True)
    (overlay / rel).write_bytes((monolith.tree / monolith.files[0]).read_bytes())
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "sub" / "x.py").write_text("x = 1\n")
    link = (overlay / rel).parent / "linked"
    link.symlink_to(elsewhere / "sub" / "x.py" if kind == "file" else elsewhere / "sub")
    out = tmp_path / "out"
    r = patchkit("import", "--overlay", str(overlay), "--target", "sglang", "--out", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{link}: " in r.stderr and "plain files only" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2 and not out.exists()


def test_mbox_of_several_messages_keeps_one_patch_per_message(cache, monolith, tmp_path):  # noqa: F811
    repo = tmp_path / "history"
    subprocess.run(
        ["git", "clone", "-q", "--no-checkout", str(monolith.tree), str(repo)], check=True
    )
    git(repo, "checkout", "-q", monolith.base)
    for subject, paths in (
        ("Speed up the scheduler", ["python/sglang/srt/managers/scheduler.py"]),
        ("Kimi-K2.5 EAGLE-3 hooks", ["python/sglang/srt/models/kimi_k25.py", SERVER_ARGS]),
    ):
        for path in paths:
            (repo / path).write_bytes((monolith.tree / path).read_bytes())
        git(repo, "commit", "-qam", f"{subject}\n\nWhy we carry it.")
    mbox = tmp_path / "team.mbox"
    mbox.write_bytes(
        subprocess.run(
            ["git", "format-patch", "--stdout", f"{monolith.base}..HEAD"],
            cwd=repo, check=True, capture_output=True,
        ).stdout
    )  # fmt: skip
    report = _propose(ImportSource.from_file(mbox))
    assert report.status == "proposed", report.problems
    assert report.mode == "messages"
    assert [p.name for p in report.patches] == [
        "speed-up-the-scheduler.patch",
        "kimi-k2-5-eagle-3-hooks.patch",
    ]
    text = report.patches[1].raw.decode()
    assert "From: t <t@example.invalid>" in text
    assert "Why we carry it.\n\nOrigin: vendor, imported from team.mbox" in text
    assert report.proved_tree == git(repo, "rev-parse", "HEAD^{tree}").strip()
    by_area = _propose(ImportSource.from_file(mbox), by_area=True)
    assert by_area.mode == "areas" and len(by_area.patches) == 3


# --- bad input ------------------------------------------------------------------------------


def _first_hunk_of(text: str, path: str) -> str:
    return re.search(r"^(@@ -\d+,\d+ \+\d+,\d+ @@)", _file_part(text, path), re.M).group(1)


KIMI = "python/sglang/srt/models/kimi_k25.py"


def _bad(monolith, kind: str) -> tuple[str, str]:  # noqa: F811
    """(input text, the words its one-line message must hold)."""
    text = monolith.diff.read_text()
    hunk = _first_hunk_of(text, KIMI)
    part = _file_part(text, KIMI)
    if kind == "other-base":
        context = next(ln for ln in part.splitlines() if ln.startswith(" ") and ln.strip())
        return text.replace(part, part.replace(context, context + "  # edited", 1)), (
            f"{KIMI} {hunk}: does not apply at zero fuzz to sglang 0.5.9"
        )
    header_line = re.search(r"^@@ .*$", part, re.M).group(0)
    if kind == "conflict-marker":
        broken = part.replace(header_line, header_line + "\n<<<<<<< ours", 1)
        return text.replace(part, broken), f"{KIMI} {hunk}: conflict marker '<<<<<<< ours'"
    if kind == "added-marker":
        broken = re.sub(r"^\+(\s+_kimi)", r"+>>>>>>> theirs\n+\1", part, count=1, flags=re.M)
        grown = re.sub(
            r"^(@@ -\d+,\d+ \+\d+,)(\d+)",
            lambda m: f"{m[1]}{int(m[2]) + 1}",
            broken,
            count=1,
            flags=re.M,
        )
        hunk = re.search(r"^@@ -\d+,\d+ \+\d+,\d+ @@", grown, re.M).group(0)
        return text.replace(
            part, grown
        ), f"{KIMI} {hunk}: adds the conflict marker '>>>>>>> theirs'"
    if kind == "nul":
        hunks = part.split("\n@@", 1)[1]
        line = next(ln for ln in hunks.splitlines() if ln.startswith("+") and ln.strip("+ "))
        return text.replace(part, part.replace(line, line + "\0", 1)), (
            f"{KIMI} {hunk}: NUL byte in a hunk line"
        )
    if kind == "crlf":
        return text.replace(part, part.replace("\n", "\r\n")), f"{KIMI} {hunk}: CRLF line ending"
    if kind == "binary":
        return text + (
            "diff --git a/python/sglang/logo.png b/python/sglang/logo.png\n"
            "new file mode 100644\nindex 0000000..1111111\nGIT binary patch\nliteral 4\n"
            "LcmZQzWMT#Y01f~L\n\nliteral 0\nHcmV?d00001\n\n"
        ), "python/sglang/logo.png: binary change"
    if kind == "outside-target":
        return text + (
            "diff --git a/docker/Dockerfile b/docker/Dockerfile\n--- a/docker/Dockerfile\n"
            "+++ b/docker/Dockerfile\n@@ -1,1 +1,1 @@\n-FROM a\n+FROM b\n"
        ), "docker/Dockerfile @@ -1,1 +1,1 @@: outside the sglang target"
    if kind == "cut-last-line":  # no newline after the last + line, no `\ No newline` note
        return text.rstrip("\n"), "the diff was cut"
    if kind == "climbing-path":
        return text + (
            "--- a/python/../../etc/motd\n+++ b/python/../../etc/motd\n@@ -1,1 +1,1 @@\n-a\n+b\n"
        ), "climbs out of the tree"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    [
        "other-base",
        "conflict-marker",
        "added-marker",
        "crlf",
        "nul",
        "binary",
        "outside-target",
        "climbing-path",
        "cut-last-line",
    ],
)
def test_bad_input_is_named_and_nothing_written(cache, project, monolith, tmp_path, kind):  # noqa: F811
    text, words = _bad(monolith, kind)
    bad = tmp_path / "bad.patch"
    bad.write_bytes(text.encode())
    before = snapshot(project)
    out = tmp_path / "out"
    r = patchkit("import", str(bad), "--target", "sglang", "--out", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    errors = [ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("error:")]
    if kind == "other-base":  # then the release hunt: the other line's pin does not fit either
        assert errors[1:] == [
            "error: bad.patch: the other pinned releases "
            "(sglang 0.5.12, sglang 0.5.17, sglang 0.5.23) do not fit"
        ]
        errors = errors[:1]
    assert len(errors) == 1 and words in errors[0], (words, r.stdout)  # one line, to the point
    assert all(e.startswith("error: bad.patch") for e in errors)
    assert "refused: nothing was written" in r.stdout
    assert "Traceback" not in r.stderr
    assert not out.exists() and snapshot(project) == before


def test_conflict_markers_are_not_misreported_as_a_line_count(cache, monolith, tmp_path):  # noqa: F811
    text, _ = _bad(monolith, "conflict-marker")
    report = _propose(ImportSource(name := "x.patch", "0" * 64, text=text))
    assert report.status == "refused", name
    assert not any("more lines than its header" in p for p in report.problems)


def test_diff_against_another_pinned_release_says_which(cache_0510, project, monolith, tmp_path):  # noqa: F811
    """A diff made against 0.5.10 does not apply to the 0.5.9 pin: the message names the
    pinned releases it fits (0.5.10 pinned by sdist sha256 in this scratch project); importing
    onto 0.5.10 needs a line pinned to it."""
    from rebase_fixtures import SGLANG_0510_SHA256

    targets = project / "patches" / "targets.toml"
    targets.write_text(
        targets.read_text().replace(
            "[targets.flashinfer]",
            '[[targets.sglang.releases]]\nversion = "0.5.10"\nsdist = "sglang==0.5.10"\n'
            f'sdist_sha256 = "{SGLANG_0510_SHA256}"\n\n[targets.flashinfer]',
        )
    )
    from patchkit.upstream import SDIST_REF

    mirror = cache_0510 / "mirrors" / "sglang.git"
    new = gitops.resolve(gitops.Repo.bare_at(mirror), SDIST_REF.format(version="0.5.10"))
    work = tmp_path / "w"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(mirror), str(work)], check=True)
    git(work, "checkout", "-q", new)
    from import_fixtures import edit_function

    edit_function(work / "python/sglang/srt/server_args.py", "ServerArgs.__post_init__", "x")
    diff = tmp_path / "for-0510.patch"
    diff.write_text(git(work, "diff"))
    no_line = patchkit("import", str(diff), "--target", "sglang@0.5.10", "--dry-run")
    targets.write_text(
        targets.read_text().replace(
            "[[targets.sglang.releases]]",
            '[targets.sglang.lines."0.5.10"]\npin = "0.5.10"\nseries = "sglang/0.5.10"\n\n'
            "[[targets.sglang.releases]]",
            1,
        )
    )
    (project / "patches" / "sglang" / "0.5.10").mkdir()
    (project / "patches" / "sglang" / "0.5.10" / "series").write_text("")
    fits = patchkit("import", str(diff), "--target", "sglang@0.5.10", "--dry-run")
    r = patchkit("import", str(diff), "--target", "sglang", "--dry-run")

    assert no_line.returncode == 2 and "--new-line" in no_line.stderr  # no line carries 0.5.10
    assert fits.returncode == 0, fits.stdout + fits.stderr
    assert r.returncode == 1
    assert "does not apply at zero fuzz to sglang 0.5.9" in r.stdout
    # the change touches nothing 0.5.10 and 0.5.12 differ in: both fit, each named
    # its index lines name 0.5.10's blob: that release is named, with the command for its line
    assert "made against sglang 0.5.10" in r.stdout and "not sglang 0.5.9" in r.stdout
    assert "line 0.5.10 is pinned to 0.5.10: patchkit import for-0510.patch --target " in r.stdout


def test_into_series_on_top_of_the_real_series_needs_3way(cache, project, monolith, tmp_path):  # noqa: F811
    """A diff made against the plain base that touches lines the existing series changed:
    refused at zero fuzz (file and hunk named), merged with --3way, appended, and the whole
    series then applies and lints clean but for the new patches' Patchkit-Tests."""
    work = tmp_path / "w"
    subprocess.run(
        ["git", "clone", "-q", "--no-checkout", str(monolith.tree), str(work)], check=True
    )
    git(work, "checkout", "-q", monolith.base)
    kimi = work / KIMI
    loaded = "            self.language_model.load_weights(language_weights)\n"
    kimi.write_text(kimi.read_text().replace(loaded, loaded + "            self._loaded = True\n"))
    io_struct = work / "python/sglang/srt/managers/io_struct.py"
    io_struct.write_text(io_struct.read_text() + "\n# carried with the series\n")
    diff = tmp_path / "ontop.patch"
    diff.write_text(git(work, "diff"))
    series_dir = series_folder(project, "sglang")
    before = snapshot(series_dir)
    r = patchkit("import", str(diff), "--target", "sglang", "--into-series")
    assert r.returncode == 1
    assert re.search(
        rf"error: ontop.patch: {KIMI} @@ -\d+,\d+ \+\d+,\d+ @@: does not apply", r.stdout
    )
    assert "it overlaps the existing series: retry with --3way" in r.stdout
    assert "pinned" not in r.stdout  # it does apply to its release: no release hunt
    assert snapshot(series_dir) == before
    r = patchkit("import", str(diff), "--target", "sglang", "--into-series", "--3way")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"overlap: {KIMI} " in r.stdout and "kimi-k25-eagle3-delegation.patch" in r.stdout
    assert "applied to the base and the existing series" in r.stdout
    old_names = load_series(series_folder(ROOT, "sglang", SEED_LINE), "sglang").names
    assert load_series(series_dir, "sglang").names == [
        *old_names,
        "srt-managers-changes.patch",
        "srt-models-changes.patch",
    ]
    assert all(snapshot(series_dir)[n] == before[n] for n in old_names)  # nothing rewritten
    assert re.search(rf"overlap: {KIMI} lines \d+-\d+ in srt-models-changes.patch meet", r.stdout)
    out = tmp_path / "applied"
    r = patchkit("apply", "--target", "sglang", "--into", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    text = (out / KIMI).read_text()
    assert "self._loaded = True" in text and "def get_embed_and_head" in text
    lint = patchkit("lint", "--target", "sglang")
    errors = [ln for ln in lint.stdout.splitlines() if ln.startswith("error:")]
    assert len(errors) == 2 and all("Patchkit-Tests: 'TODO'" in e for e in errors), lint.stdout


def test_into_series_refuses_a_series_changed_since_its_proof(
    cache,  # noqa: F811
    project,
    monolith,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,
):
    """The proof of `--into-series` is made on the series as read; a change to that series
    before the write (a concurrent `export` or `rebase --write`) is found under the series
    folder's lock and refused, so the series never gains patches proved on another one."""
    from patchkit import cli, export
    from patchkit.commands import import_ as command

    work = tmp_path / "w"
    subprocess.run(
        ["git", "clone", "-q", "--no-checkout", str(monolith.tree), str(work)], check=True
    )
    git(work, "checkout", "-q", monolith.base)
    io_struct = work / "python/sglang/srt/managers/io_struct.py"
    io_struct.write_text(io_struct.read_text() + "\n# carried with the series\n")
    diff = tmp_path / "more.patch"
    diff.write_text(git(work, "diff"))
    series_dir = series_folder(project, "sglang")
    proved = command.propose_import

    def then_the_series_changes(*args, **kwargs):  # as a concurrent export would, in between
        report = proved(*args, **kwargs)
        series = load_series(series_dir, "sglang")
        kept = [export.ExportedPatch(p.name, p.raw) for p in series.patches[:-1]]
        export.write_series(series_dir, "sglang", kept)
        return report

    monkeypatch.setattr(command, "propose_import", then_the_series_changes)
    rc = cli.main(["import", str(diff), "--target", "sglang", "--into-series"])
    err = capsys.readouterr().err
    assert rc == 1 and "changed while the import was proved; nothing was written" in err, err
    changed = snapshot(series_dir)
    assert not any(name.startswith("srt-managers") for name in changed)
    monkeypatch.setattr(command, "propose_import", proved)
    assert cli.main(["import", str(diff), "--target", "sglang", "--into-series"]) == 0
    assert load_series(series_dir, "sglang").names[-1] == "srt-managers-changes.patch"


def test_plain_diff_made_in_site_packages(cache, monolith, tmp_path):  # noqa: F811
    """`diff -ruN old/ new/` of two site-packages copies (no git, package-relative paths, a new
    file): placed under python/, the new file created, the tree equal to git's."""
    changed = [SERVER_ARGS, KIMI, NEW_FILE]
    for side, source in (("old", None), ("new", monolith.tree)):
        for path in changed:
            data = (
                (source / path).read_bytes()
                if source
                else gitops.show_file(gitops.Repo.checkout(monolith.tree), monolith.base, path)
            )
            if data is None:
                continue
            dest = tmp_path / side / path.removeprefix("python/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
    result = subprocess.run(
        ["diff", "-ruN", "old", "new"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 1 and result.stdout.startswith("diff -ruN old/")
    diff = tmp_path / "site.diff"
    diff.write_text(result.stdout)
    report = _propose(ImportSource.from_file(diff))
    assert report.status == "proposed", report.problems
    assert any("placed under python/" in n for n in report.notes)
    files = sorted(f for p in report.patches for f in p.files)
    assert files == sorted(changed)
    expected = subprocess.run(
        ["git", "diff", "--full-index", monolith.base, "HEAD", "--", *changed],
        cwd=monolith.tree, capture_output=True, check=True,
    ).stdout  # fmt: skip
    proved = gitops.diff_trees(Mirror(Workspace.load().target("sglang")).repo, monolith.base,
                               report.proved_tree)  # fmt: skip
    assert proved.encode() == expected


def test_refuses_to_write_over_files(cache, monolith, tmp_path):  # noqa: F811
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    r = patchkit("import", str(monolith.diff), "--target", "sglang", "--out", str(out))
    assert r.returncode == 2
    assert "is not an empty directory; nothing was written" in r.stderr
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    empty = tmp_path / "empty.diff"
    empty.write_text("just words\n")
    r = patchkit("import", str(empty), "--target", "sglang", "--dry-run")
    assert r.returncode == 2 and "contains no diff" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2 and "Traceback" not in r.stderr


def test_dockerfile_sed_edits_via_a_diff_of_the_sdist(cache, sglang_sdist, tmp_path):
    """The recipe of docs/migrating.md: the Dockerfile's `sed -i` run on a copy of the pinned
    sdist, `diff -ruN`, import; it overlaps the series' SM120 fusion patch, which is said."""
    subprocess.run(["tar", "xzf", str(sglang_sdist), "-C", str(tmp_path)], check=True)
    (tmp_path / "sglang-0.5.9").rename(tmp_path / "old")
    subprocess.run(["cp", "-a", "old", "new"], cwd=tmp_path, check=True)
    site = "/usr/local/lib/python3.12/dist-packages"
    (tmp_path / "Dockerfile").write_text(
        "FROM lmsysorg/sglang:v0.5.9-cu130\n"
        "RUN sed -i 's/(_is_sm90_supported or _is_sm100_supported)/"
        "(_is_sm90_supported or _is_sm100_supported or _is_sm120_supported)/' \\\n"
        f"      {site}/sglang/srt/layers/communicator.py\n"
    )
    script = (
        f"grep -A1 'sed -i' Dockerfile | tr -d '\\\\\\n' | sed 's#RUN ##; s#{site}/#new/#g' "
        "> seds.sh && bash seds.sh && diff -ruN old new > docker-sed.diff; test $? = 1"
    )
    subprocess.run(["bash", "-c", script], cwd=tmp_path, check=True)
    r = patchkit("import", str(tmp_path / "docker-sed.diff"), "--target", "sglang", "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"srt-layers-changes\.patch\s+1\s+1\s+1$", r.stdout, re.M)
    assert "placed under python/" in r.stdout
    assert "changed by sm120-flashinfer-allreduce-fusion.patch" in r.stdout


def test_mapping_file_errors_are_one_line(tmp_path):
    from patchkit.errors import UsageError

    cases = {
        "[[patch]\n": "not valid TOML",
        '[[patch]]\nname = "a"\npaths = ["x"]\ncolour = 1\n': "unknown key(s) colour",
        '[[patch]]\nname = "a/b"\npaths = ["x"]\n': "is not a patch name",
        '[[patch]]\nname = "a"\nhunks = ["x.py:f"]\n': "is not PATH_GLOB::FUNCTION_GLOB",
        '[[patch]]\nname = "a"\n': "give paths or hunks",
        '[[patch]]\nname = "a"\npaths = ["x"]\n[[patch]]\nname = "a"\npaths = ["y"]\n': "twice",
    }
    for text, words in cases.items():
        path = tmp_path / "m.toml"
        path.write_text(text)
        with pytest.raises(UsageError, match=re.escape(words)):
            load_mapping(path)


def test_reimport_onto_a_series_that_carries_it(cache, project, monolith, tmp_path):  # noqa: F811
    write_series(project, "sglang", {})
    args = ("import", str(monolith.diff), "--target", "sglang", "--into-series")
    assert patchkit(*args).returncode == 0
    before = snapshot(project / "patches" / "sglang")
    r = patchkit(*args)
    assert r.returncode == 1
    assert "the existing series already carries every change of it" in r.stdout
    assert snapshot(project / "patches" / "sglang") == before


NON_ASCII = (
    ("Jürgen Müller", "Délégation EAGLE-3 pour Kimi"),
    # long enough that format-patch folds the encoded words over several header lines
    ("Zoë Ødegård", "Réglage des entrées et sorties: état partagé, sémaphores et délais révisés"),
)


def test_non_ascii_authors_and_subjects_round_trip(cache, project, monolith, tmp_path):  # noqa: F811
    """import -> apply -> export -> lint keeps a non-ASCII author and subject, byte for byte
    (the series carries them as RFC 2047 words, which apply decodes)."""
    repo = tmp_path / "h"
    subprocess.run(
        ["git", "clone", "-q", "--no-checkout", str(monolith.tree), str(repo)], check=True
    )
    git(repo, "checkout", "-q", monolith.base)
    edited = ("python/sglang/srt/managers/io_struct.py", SERVER_ARGS)  # one file each
    for path, (who, subject) in zip(edited, NON_ASCII, strict=True):
        (repo / path).write_text((repo / path).read_text() + "# tuned\n")
        git(repo, "commit", "-qam", subject, env={"GIT_AUTHOR_NAME": who})
    mbox = tmp_path / "team.mbox"
    mbox.write_bytes(
        subprocess.run(
            ["git", "format-patch", "--stdout", f"{monolith.base}..HEAD"],
            cwd=repo, check=True, capture_output=True,
        ).stdout
    )  # fmt: skip
    write_series(project, "sglang", {})

    r = patchkit("import", str(mbox), "--target", "sglang", "--into-series")
    assert r.returncode == 0, r.stdout + r.stderr
    series_dir = series_folder(project, "sglang")
    written = snapshot(series_dir)
    patches = load_series(series_dir, "sglang").patches
    assert [(p.author.split(" <")[0], p.subject) for p in patches] == list(NON_ASCII)
    raw = b"".join(p.raw for p in patches)
    assert raw.isascii() and b"=?UTF-8?q?" in raw  # encoded words, as format-patch writes
    tree = tmp_path / "work"
    r = patchkit("apply", "--target", "sglang", "--into", str(tree))
    assert r.returncode == 0, r.stdout + r.stderr
    log = git(tree, "log", "--format=%an|%s", "refs/patchkit/sglang/base..HEAD")
    assert log.splitlines()[::-1] == [f"{who}|{subject}" for who, subject in NON_ASCII]
    r = patchkit("export", str(tree), "--check")
    assert r.returncode == 0, r.stdout + r.stderr  # apply + export reproduces every byte
    assert snapshot(series_dir) == written
    lint = lint_target("sglang", series_dir, "python", today=dt.date.today())  # as the CLI
    assert {f.rule for f in lint.findings} == {"metadata-malformed"}
    assert all("Patchkit-Tests: 'TODO'" in f.message for f in lint.findings), lint.findings


def test_a_plain_diff_in_a_series_names_its_import(cache, project, monolith, tmp_path):  # noqa: F811
    """The next step the series error prints is a command that works, as printed."""
    write_series(project, "sglang", {"team-changes.patch": monolith.diff.read_bytes()})
    series_dir = series_folder(project, "sglang")

    refused = patchkit("apply", "--target", "sglang", "--into", str(tmp_path / "w1"))
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "team-changes.patch: not a git format-patch file" in refused.stderr
    step = re.search(
        r"patchkit: next: take it out of (\S+), then .*?`patchkit (.*)`", refused.stderr
    )
    assert step, refused.stderr
    assert Path(step.group(1)) == series_dir / "series"
    (series_dir / "series").write_text("# test series\n")
    followed = patchkit(*step.group(2).split())
    assert followed.returncode == 0, followed.stdout + followed.stderr
    applied = patchkit("apply", "--target", "sglang", "--into", str(tmp_path / "w2"))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert git(tmp_path / "w2", "rev-parse", "HEAD^{tree}").strip() == monolith.tree_id


def test_a_mapping_subject_may_be_non_ascii_but_one_line(cache, monolith, tmp_path):  # noqa: F811
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    entry = '[[patch]]\nname = "all"\npaths = ["**"]\nsubject = {subject}\n'
    good.write_text(entry.format(subject='"Délégation et réglages"'))
    bad.write_text(entry.format(subject='"two\\nlines"'))

    report = _propose(ImportSource.from_file(monolith.diff), mapping=good)
    assert report.status == "proposed", report.problems or report.difference
    assert [p.subject for p in report.patches] == ["Délégation et réglages"]
    with pytest.raises(Exception, match="is not one line of text"):
        load_mapping(bad)


def test_a_non_ascii_author_of_new_patches(cache, monolith, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    who = "Zoë Ødegård <zoe@example.invalid>"
    args = ("import", str(monolith.diff), "--target", "sglang", "--author")
    r = patchkit(*args, who, "--out", str(out))
    wrong = ("Zoë <zoë@example.invalid>", "Zoë", "x <x@example.invalid>\nFrom: y")
    bad = [patchkit(*args, author, "--dry-run") for author in wrong]

    assert r.returncode == 0, r.stdout + r.stderr  # proved: apply + export give the same bytes
    assert {p.author for p in load_series(out, "sglang").patches} == {who}
    assert all(b.returncode == 2 and "the address in ASCII" in b.stderr for b in bad)


# ---- a line on a wheel base ------------------------------------------------------------------
@pytest.mark.slow
def test_import_onto_the_0_5_17_line_and_its_wheel_base(sglang_wheels, cache, project, tmp_path):
    """A plain `diff -u` against files of the 0.5.17 wheel: refused on the default line (which
    names the release it fits), imported into the 0.5.17 line with `--target sglang@0.5.17`
    or `--line 0.5.17`, and that line then applies onto its wheel base with the change."""
    import zipfile

    rel = "sglang/srt/models/llama_eagle3.py"
    with zipfile.ZipFile(sglang_wheels["cp311"]) as zf:
        original = zf.read(rel).decode()
    old = "        return self.hot_token_id\n"
    assert original.count(old) == 1
    edited_line = "        # the draft's vocabulary map\n"
    edited = original.replace(old, edited_line + old)
    for side, text in (("a", original), ("b", edited)):
        (tmp_path / side / rel).parent.mkdir(parents=True)
        (tmp_path / side / rel).write_text(text)
    diff = tmp_path / "eagle3.diff"
    proc = subprocess.run(["diff", "-u", f"a/{rel}", f"b/{rel}"], cwd=tmp_path,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1 and proc.stdout.startswith(f"--- a/{rel}")
    diff.write_text(proc.stdout)
    line_dir, default_dir = (
        series_folder(project, "sglang", "0.5.17"),
        series_folder(project, "sglang"),
    )
    before = snapshot(default_dir)
    carried = load_series(line_dir, "sglang").names  # the line's own patches, kept in front

    on_default = patchkit("import", str(diff), "--target", "sglang", "--dry-run")
    by_line = patchkit("import", str(diff), "--target", "sglang", "--line", "0.5.17", "--dry-run")
    mismatch = patchkit("import", str(diff), "--target", "sglang@0.5.9", "--line", "0.5.17")
    r = patchkit("import", str(diff), "--target", "sglang@0.5.17", "--into-series")

    assert on_default.returncode == 1
    fits = "applies cleanly to the pinned releases sglang 0.5.17, sglang 0.5.23"
    assert fits in on_default.stdout
    assert by_line.returncode == 0, by_line.stdout + by_line.stderr
    assert "onto sglang 0.5.17" in by_line.stdout
    assert mismatch.returncode == 2 and "line 0.5.17 is pinned to 0.5.17" in mismatch.stderr
    assert r.returncode == 0, r.stdout + r.stderr
    assert snapshot(default_dir) == before  # the 0.5.9 line is untouched
    series = load_series(line_dir, "sglang")
    assert series.names[: len(carried)] == carried
    added = series.patches[len(carried) :]
    assert [f.path for p in added for f in p.files] == [f"python/{rel}"]
    tree = tmp_path / "work"
    applied = patchkit("apply", "--target", "sglang@0.5.17", "--into", str(tree))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    # the line's own patches change the file too: the edit lands on their result (the tree's
    # commit before the imported patches)
    patched = git(tree, "show", f"HEAD~{len(added)}:python/{rel}")
    assert patched.count(old) == 1
    assert (tree / "python" / rel).read_text() == patched.replace(old, edited_line + old)
    assert patchkit("export", str(tree), "--check").returncode == 0


def test_an_overlap_on_a_new_file_names_the_file_not_line_0(tmp_path):
    """Both the series and the import create the same file: said as that, not "lines 0-0"."""
    from patchkit.import_.propose import find_overlaps
    from patchkit.series import Series, SeriesEntry, parse_patch

    raw = (
        b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        b"From: A <a@example.com>\nDate: Mon, 1 Jan 2024 00:00:00 +0000\n"
        b"Subject: [PATCH] Add a helper\n\nAdd a helper module.\n---\n"
        b"diff --git a/python/sglang/helper.py b/python/sglang/helper.py\nnew file mode 100644\n"
        b"--- /dev/null\n+++ b/python/sglang/helper.py\n@@ -0,0 +1,2 @@\n+a = 1\n+b = 2\n"
        b"-- \n2.39.5\n\n"
    )
    existing = Series(
        "sglang",
        tmp_path,
        [SeriesEntry("add-helper.patch", 1)],
        [parse_patch("add-helper.patch", raw)],
    )
    found = find_overlaps(existing, [("mine.patch", "python/sglang/helper.py", 0, 0)], on_top=False)
    assert [o.text() for o in found] == [
        "python/sglang/helper.py is created by mine.patch and by add-helper.patch"
    ]
    on_line = find_overlaps(
        existing, [("mine.patch", "python/sglang/helper.py", 2, 1)], on_top=True
    )
    assert [o.text() for o in on_line] == [
        "python/sglang/helper.py lines 2-2 in mine.patch meet lines 1-2 changed by add-helper.patch"
    ]


# ---- which release a diff was made against -------------------------------------------------
@pytest.fixture(scope="session")
def sglang_0512post1(shared_cache, warm_mirrors, sglang_0512_wheels, workspace) -> str:
    """SGLang 0.5.12.post1 imported from its real wheel (an unpinned release, trusted on first
    use as outlook imports it) into the warm mirror: its commit."""
    from patchkit.upstream import resolve_new_base

    target = workspace.targets.get("sglang", "0.5.9")
    resolve_new_base(target, "0.5.12", cache=shared_cache)  # the release it is told from
    return resolve_new_base(target, "0.5.12.post1", cache=shared_cache)[0].commit


GATE_FILE = "python/sglang/srt/layers/communicator.py"  # differs between 0.5.12 and .post1


@pytest.mark.slow
@pytest.mark.parametrize("in_mirror", [True, False], ids=["imported", "from-the-index"])
def test_a_diff_made_against_a_post_release_is_named_by_its_index_lines(
    sglang_0512post1, cache, project, tmp_path, in_mirror
):
    """The motivating case: a git diff made against 0.5.12.post1 applies to 0.5.12 (its hunk is
    where the two agree), but its index lines name the post-release's blob: the import onto the
    0.5.12 line is refused, naming 0.5.12.post1, the file that differs and the commands that
    start a line there; the same edit made against 0.5.12 is imported, saying so. A mirror that
    never imported 0.5.12.post1 gets it from the index's releases after the base."""
    from import_fixtures import edit_function

    targets = project / "patches" / "targets.toml"
    text = targets.read_text()
    retired = text[text.index('[targets.sglang.lines."0.5.12"]') :]
    retired = retired[: retired.index("\n\n")]
    targets.write_text(
        text.replace(
            retired, '[targets.sglang.lines."0.5.12"]\npin = "0.5.12"\nseries = "sglang/0.5.12"'
        )
    )
    (project / "patches" / "sglang" / "0.5.12").mkdir()
    (project / "patches" / "sglang" / "0.5.12" / "series").write_text("")
    mirror = cache / "mirrors" / "sglang.git"
    diffs = {}
    for name, ref in (("post1", sglang_0512post1), ("plain", "refs/patchkit/wheel/0.5.12")):
        work = tmp_path / name
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(mirror), str(work)], check=True)
        git(work, "checkout", "-q", gitops.resolve(gitops.Repo.bare_at(mirror), ref))
        edit_function(work / GATE_FILE, "apply_aiter_all_reduce_fusion", "aiter-gate")
        diffs[name] = tmp_path / f"{name}.patch"
        diffs[name].write_text(git(work, "diff"))

    post1_ref = "refs/patchkit/wheel/0.5.12.post1"
    if not in_mirror:
        git(mirror, "update-ref", "-d", post1_ref)
    post1 = patchkit("import", str(diffs["post1"]), "--target", "sglang@0.5.12", "--dry-run")
    assert gitops.resolve(gitops.Repo.bare_at(mirror), post1_ref) == sglang_0512post1
    plain = patchkit("import", str(diffs["plain"]), "--target", "sglang@0.5.12", "--dry-run")

    assert post1.returncode == 1, post1.stdout + post1.stderr
    assert "made against sglang 0.5.12.post1" in post1.stdout
    assert f"in sglang 0.5.12 1 of 1 file(s) differ: {GATE_FILE}" in post1.stdout
    assert (
        "patchkit rebase --target sglang@0.5.12.post1 --line 0.5.12 --write --new-line "
        "0.5.12.post1 && patchkit import post1.patch --target sglang@0.5.12.post1"
    ) in post1.stdout
    assert "refused: nothing was written" in post1.stdout
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "made against sglang 0.5.12: its index lines name sglang 0.5.12's blobs" in plain.stdout
