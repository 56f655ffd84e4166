"""`patchkit rebase`: the real v0.5.9 series onto the real sglang 0.5.10 sdist, and synthetic
git upstreams for `upstreamed` (patch-id and friends) and `conflict` + `--continue`."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import patchkit, result_of, snapshot
from rebase_fixtures import (  # noqa: F401 - fixtures
    AUX_POST,
    SGLANG_0510_SHA256,
    SYMM_MEM,
    cache_0510,
    git_project,
    git_upstream,
    resolve_conflict_with_patch_side,
    set_series,
    sglang_0510,
)

from patchkit.targets import bump_version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# What upstream changed between the 0.5.9 and 0.5.10 sdists in the files each patch touches
# (checked by unpacking both sdists and diffing), and the label that follows from it.
EXPECTED_0510 = {
    # communicator.py's fusion gate is unchanged (still SM90/SM100 only: the patch's gate hunk
    # applies), but 0.5.10 moved RMSNorm.forward_with_allreduce_fusion's body into a new
    # module-level _forward_with_allreduce_fusion() (AITER route added); its flashinfer
    # fallback still skips the all-reduce and still adds post_residual_addition twice, so
    # the fix is still needed and the 3-way merge of layernorm.py conflicts.
    "sm120-flashinfer-allreduce-fusion.patch": "conflict",
    # all_reduce_utils.py and torch_symm_mem.py are byte-identical in 0.5.10.
    "sm120-torch-symm-mem-allreduce.patch": "clean",
    # 0.5.10 added set_eagle3_layers_to_capture(), get_embed_and_head() and
    # set_embed_and_head() to KimiK25ForConditionalGeneration itself (hasattr checks and its
    # own error text): an equivalent implementation, not the same text, so only the
    # definitions-present signal fires (text, reverse-apply and 3-way all differ).
    "kimi-k25-eagle3-delegation.patch": "upstreamed",
    # deepseek_v2.py was reworked (the a2a gather next to the capture point now calls
    # get_attention_tp_group().all_gather), so the hunk's context moved; the 3-way merge on
    # the recorded blobs is clean, and 0.5.10 still captures hidden_states + residual before
    # any reduce (tensor_model_parallel_all_reduce is still imported): still needed.
    "eagle3-aux-capture-post-allreduce.patch": "merged",
    # model_runner.py / cuda_graph_runner.py changed around the hunks; 0.5.10 still has the
    # argument-less set_eagle3_layers_to_capture() calls and no init_aux_hidden_state_capture()
    # (that lands upstream in 0.5.12): 3-way merge without conflict.
    "eagle3-aux-capture-before-cuda-graphs.patch": "merged",
    # pyproject.toml: upstream rewrote the line next to the cuda-python pin (decord2 gained a
    # platform marker) and moved to sglang-kernel 0.4.1 / flashinfer 0.6.7.post2; the pin
    # change is adjacent to upstream's edit, so the merge conflicts (and the patch's message
    # about sgl-kernel 0.3.21 needs a human anyway).
    "cu130-packaging-pins.patch": "conflict",
    # server_args.py changed a lot; the second design's argument patch also edits the memory
    # sizing (room for the DECODE graphs before the KV pool) and the refusals, and a 3-way
    # merge of those hunks with 0.5.10's rework conflicts; 0.5.10 has no
    # speculative_disable_batch_threshold.
    "speculative-disable-batch-threshold-arg.patch": "conflict",
    # 0.5.10 moved managers/scheduler_metrics_mixin.py to observability/: with an sdist base
    # there is no rename history, so the patch cannot be carried (3-way impossible).
    "speculative-dynamic-disable.patch": "conflict",
}


@pytest.fixture
def classified(cache_0510, workspace):  # noqa: F811
    return _classify_onto_0510(workspace)


def _classify_onto_0510(workspace):
    from patchkit.rebase import classify_rebase, resolve_new_base
    from patchkit.upstream import Mirror, acquire

    target = workspace.target("sglang")
    series = workspace.series("sglang")
    old = acquire(target, None)
    new, pin = resolve_new_base(target, "0.5.10")
    return classify_rebase(
        Mirror(target).repo,
        target,
        series,
        old,
        new,
        series_version=workspace.targets.series_version,
        ref="0.5.10",
        pin=pin,
    )


@pytest.mark.slow
def test_real_series_onto_0_5_10_every_patch_classified(classified, workspace):
    names = workspace.series("sglang").names
    unknown = [n for n in names if n not in EXPECTED_0510]
    assert not unknown, (
        f"patches without an expected 0.5.10 label: {unknown}; check by hand "
        "what 0.5.10 changed in their files and add them to EXPECTED_0510"
    )
    got = {o.name: o.label for o in classified.outcomes}
    assert got == {n: EXPECTED_0510[n] for n in names}


@pytest.mark.slow
def test_a_second_preview_reads_the_recorded_carry(classified, workspace, monkeypatch):
    """The same series between the same bases: read from its record, not carried again; a
    record naming a commit the mirror lost (pruned) is not used."""
    import patchkit.rebase as rebase
    from patchkit import gitops
    from patchkit.carry_record import read_carry
    from patchkit.stamps import Stamp
    from patchkit.upstream import Mirror

    carried = []
    real = rebase.carry_series
    monkeypatch.setattr(rebase, "carry_series", lambda *a, **k: carried.append(1) or real(*a, **k))
    assert _classify_onto_0510(workspace).to_json() == classified.to_json()
    assert carried == []
    mirror = Mirror(workspace.target("sglang")).repo
    (record,) = (mirror.path.parent.parent / "verified").glob("carry-sglang-*")
    text = record.read_text()
    stamp = Stamp(record, text.partition("\n")[0])
    assert read_carry(stamp, mirror) is not None
    record.write_text(text.replace(classified.tip, "0" * 40))
    assert read_carry(stamp, mirror) is None
    assert gitops.read_commits(mirror, [classified.tip])[classified.tip] == classified.tip


@pytest.mark.slow
def test_real_0_5_10_evidence(classified):
    by = {o.name: o for o in classified.outcomes}
    assert classified.history is False  # sdist bases: no upstream range for patch-id
    kimi = by["kimi-k25-eagle3-delegation.patch"]
    signals = {s.name: s.fired for s in kimi.signals}
    assert signals == {
        "patch-id": None,
        "reverse-apply": False,
        "reverse-apply-reduced-context": False,
        "empty-after-3way": False,
        "added-lines-present": False,
        "definitions-present": True,
        "applied-upstream-trailer": True,  # its own trailer: Applied-Upstream: 0.5.10
    }
    assert "equivalent" in kimi.note
    assert by["sm120-torch-symm-mem-allreduce.patch"].changed is False  # files untouched
    merged = by["eagle3-aux-capture-post-allreduce.patch"]
    assert (
        merged.changed
        and merged.refreshed
        and b"_sglang_needs_allreduce_fusion" in merged.refreshed
    )
    assert by["sm120-flashinfer-allreduce-fusion.patch"].conflicts == [
        "python/sglang/srt/layers/layernorm.py"
    ]
    assert by["cu130-packaging-pins.patch"].conflicts == ["python/pyproject.toml"]
    if "speculative-dynamic-disable.patch" in by:
        assert (
            "observability/scheduler_metrics_mixin.py"
            in by["speculative-dynamic-disable.patch"].note
        )


@pytest.mark.slow
def test_cli_dry_run_prints_tofu_and_leaves_patches_alone(project, cache_0510):  # noqa: F811
    before = snapshot(project / "patches")
    r = patchkit("rebase", "--target", "sglang@0.5.10")
    assert r.returncode == 1, r.stderr  # patches in conflict
    assert SGLANG_0510_SHA256 in r.stdout
    assert "upstream commit: none recorded: relying on the sha256, trust on first use" in r.stdout
    assert "evidence: definitions-present" in r.stdout
    assert snapshot(project / "patches") == before
    tree = project / "work" / "rebase" / "sglang"
    assert not tree.exists() and "pass --conflict-tree" in r.stdout  # a preview leaves nothing
    r = patchkit("rebase", "--target", "sglang@0.5.10", "--conflict-tree")
    assert r.returncode == 1, r.stderr
    text = (tree / "python/sglang/srt/layers/layernorm.py").read_text()
    assert "<<<<<<< " in text and ">>>>>>> " in text
    assert f"cd {tree}" in r.stdout and "--continue" in r.stdout
    # A preview is never blocked by the stopped rebase; an untouched tree is replaced.
    assert patchkit("rebase", "--target", "sglang@0.5.10").returncode == 1
    again = patchkit("rebase", "--target", "sglang@0.5.10", "--conflict-tree")
    assert again.returncode == 1 and "replaced the untouched conflict work tree" in again.stdout
    # One the user has worked in is refused, and left as it is.
    (tree / "python/sglang/srt/layers/layernorm.py").write_text(text.replace("<<<<<<< ", "", 1))
    mine = snapshot(tree)
    again = patchkit("rebase", "--target", "sglang@0.5.10", "--conflict-tree")
    assert again.returncode == 2 and "in progress" in again.stderr
    assert "changed since it stopped" in again.stderr and snapshot(tree) == mine
    assert patchkit("rebase", "--abort").returncode == 0
    assert not tree.exists()


@pytest.mark.slow
def test_write_is_refused_while_a_patch_conflicts(project, cache_0510):  # noqa: F811
    before = snapshot(project / "patches")
    r = patchkit("rebase", "--target", "sglang@0.5.10", "--write", "--json")
    assert r.returncode == 1
    report = result_of(r.stdout)
    assert report["status"] == "conflict" and report["written"] == []
    assert snapshot(project / "patches") == before


@pytest.mark.slow
def test_write_refreshes_drops_and_moves_the_pin(project, cache_0510, tmp_path):  # noqa: F811
    keep = [
        "sm120-torch-symm-mem-allreduce.patch",
        "kimi-k25-eagle3-delegation.patch",
        "eagle3-aux-capture-post-allreduce.patch",
        "eagle3-aux-capture-before-cuda-graphs.patch",
    ]
    set_series(project, "sglang", keep)
    toml_before = (project / "patches/targets.toml").read_text()
    symm_before = (project / "patches/sglang/0.5.9" / keep[0]).read_bytes()
    r = patchkit("rebase", "--target", "sglang@0.5.10", "--write")
    assert r.returncode == 0, r.stdout + r.stderr
    series = (project / "patches/sglang/0.5.9/series").read_text().split()
    assert "kimi-k25-eagle3-delegation.patch" not in series
    assert not (project / "patches/sglang/0.5.9/kimi-k25-eagle3-delegation.patch").exists()
    assert (project / "patches/sglang/0.5.9" / keep[0]).read_bytes() == symm_before  # clean: same
    assert "Applied-Upstream: sglang 0.5.10 (kimi-k25-eagle3-delegation.patch)" in r.stdout
    toml_text = (project / "patches/targets.toml").read_text()
    data = tomllib.loads(toml_text)
    version_before = tomllib.loads(toml_before)["series"]["version"]
    assert data["series"]["version"] == bump_version(version_before)
    assert data["targets"]["sglang"]["lines"]["0.5.9"]["pin"] == "0.5.10"
    release = data["targets"]["sglang"]["releases"][-1]
    assert release["sdist"] == "sglang==0.5.10"
    assert release["sdist_sha256"] == SGLANG_0510_SHA256
    for line in toml_before.splitlines():  # comments and other entries kept
        if line.startswith("#"):
            assert line in toml_text
    assert "trust on first use" in toml_text
    # The refreshed series applies to the new pin and round-trips.
    out = tmp_path / "tree"
    r = patchkit("apply", "--target", "sglang", "--into", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    r = patchkit("lint", "--target", "sglang")
    assert r.returncode == 0, r.stdout + r.stderr


def test_git_upstream_patch_id_and_reverse_apply(git_project, git_upstream):  # noqa: F811
    r = patchkit("rebase", "--target", "sglang@v0.5.9.2", "--json")
    assert r.returncode == 0, r.stderr
    report = result_of(r.stdout)
    assert report["history"] is True
    by = {p["name"]: p for p in report["patches"]}
    assert by[SYMM_MEM]["label"] == "upstreamed"
    fired = {s["name"] for s in by[SYMM_MEM]["signals"] if s["fired"]}
    assert {"patch-id", "reverse-apply", "empty-after-3way", "added-lines-present"} <= fired
    assert by[AUX_POST]["label"] == "clean"


def test_git_upstream_offset_and_change_merged_after_a_nearby_edit(git_project):  # noqa: F811
    r = patchkit("rebase", "--target", "sglang@v0.5.9.4", "--json")
    assert r.returncode == 0, r.stderr
    by = {p["name"]: p for p in result_of(r.stdout)["patches"]}
    assert by[AUX_POST]["label"] == "offset" and by[AUX_POST]["changed"]
    symm = {s["name"]: s["fired"] for s in by[SYMM_MEM]["signals"]}
    assert by[SYMM_MEM]["label"] == "upstreamed"
    # patch-id and the full-context reverse check miss it; -C1 and the added lines see it
    assert symm["patch-id"] is False and symm["reverse-apply"] is False
    assert symm["reverse-apply-reduced-context"] and symm["added-lines-present"]


def test_git_upstream_conflict_then_continue_write(git_project, git_upstream):  # noqa: F811
    r = patchkit("rebase", "--target", "sglang@v0.5.9.3", "--write")
    assert r.returncode == 1, r.stderr
    assert "CONFLICT  " + AUX_POST in r.stdout
    assert (git_project / "patches/sglang/0.5.9" / SYMM_MEM).exists()  # nothing written yet
    tree = git_project / "work/rebase/sglang"
    assert resolve_conflict_with_patch_side(tree) == ["python/sglang/srt/models/deepseek_v2.py"]
    r = patchkit("rebase", "--continue")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resolved" in r.stdout and "Applied-Upstream: sglang 0.5.9.3" in r.stdout
    series = (git_project / "patches/sglang/0.5.9/series").read_text().split()
    assert series[-1:] == [AUX_POST] and SYMM_MEM not in series
    refreshed = (git_project / "patches/sglang/0.5.9" / AUX_POST).read_text()
    assert "i >= self.first_k_dense_replace" in refreshed
    data = tomllib.loads((git_project / "patches/targets.toml").read_text())
    assert data["targets"]["sglang"]["lines"]["0.5.9"]["pin"] == "0.5.9.3"
    assert data["targets"]["sglang"]["releases"][-1]["commit"] == git_upstream["v0.5.9.3"]
    assert data["targets"]["sglang"]["releases"][-1]["tag"] == "v0.5.9.3"
    assert not tree.exists()


@pytest.mark.parametrize("verb", ["--continue", "--abort"])
@pytest.mark.parametrize("named", [False, True])
def test_continue_or_abort_without_a_rebase_is_nothing_to_do(project, verb, named):
    """Both exit alike: 3, one line saying no rebase is in progress, `ok: true` under --json
    (--continue was a usage error, --abort's envelope said `ok: false`)."""
    target = ["--target", "sglang"] if named else []
    r = patchkit("rebase", verb, *target)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert r.stderr.splitlines() == [
        "patchkit: no rebase in progress" + (" for sglang" if named else "")
    ]
    doc = json.loads(patchkit("rebase", verb, *target, "--json").stdout)
    assert (doc["exit_code"], doc["ok"], doc["error"]) == (3, True, None), doc
    # A folder there that patchkit did not leave is no rebase either, for both.
    (project / "work" / "rebase" / "sglang").mkdir(parents=True)
    r = patchkit("rebase", verb, *target)
    assert r.returncode == 3 and "is not a conflict work tree patchkit left" in r.stderr


def test_continue_and_abort_together_are_a_usage_error(project):
    r = patchkit("rebase", "--continue", "--abort")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.splitlines() == [
        "patchkit: error: --continue and --abort exclude each other: pass one"
    ]


def test_render_targets_keeps_comments_and_validates():
    from dataclasses import replace as dataclasses_replace

    from patchkit.rebase import NewPin, render_targets

    text = (
        '# top comment\n[series]\nversion = "1.4.2"  # bumped by rebase\n\n'
        '[targets.x]\ngit = "g"\npin = "1.0"\n\n[[targets.x.releases]]\nversion = "1.0"\n'
        f'commit = "{"a" * 40}"\n\n[targets.y]\ngit = "h"\npin = "2"\n\n'
        f'[[targets.y.releases]]\nversion = "2"\ncommit = "{"b" * 40}"\n'
    )
    pin = NewPin("1.1", "c" * 40, "v1.1", "x==1.1", "d" * 64, None, True, "tofu")
    out = render_targets(text, "x", pin, "1.5.0")
    data = tomllib.loads(out)
    assert "# top comment" in out
    assert data["series"]["version"] == "1.5.0"
    assert data["targets"]["x"]["pin"] == "1.1"
    assert [r["version"] for r in data["targets"]["x"]["releases"]] == ["1.0", "1.1"]
    assert data["targets"]["y"]["pin"] == "2"
    assert out.index('version = "1.1"') < out.index("[targets.y]")
    # A release added after the file's last table is set off by a blank line, as the others.
    out = render_targets(text, "y", dataclasses_replace(pin, version="2.1"), "1.5.0")
    assert f'commit = "{"b" * 40}"\n\n[[targets.y.releases]]' in out


@pytest.mark.slow
def test_apply_allow_unpinned_takes_the_release_rebase_takes(project, cache_0510):  # noqa: F811
    """One source chain: the unpinned 0.5.10 sdist that rebase classifies is a base for
    `fetch`/`apply --allow-unpinned` too, and refused without it."""
    r = patchkit("fetch", "--target", "sglang@0.5.10", "--allow-unpinned", "--json")
    assert r.returncode == 0, r.stderr
    (base,) = result_of(r.stdout)["bases"]
    assert base["source"] == "sdist" and "sglang==0.5.10" in base["stands_for"]
    assert "not pinned" in r.stderr
    r = patchkit("fetch", "--target", "sglang@0.5.10")
    assert r.returncode == 1 and "not a pinned release" in r.stderr
