"""`patchkit doctor draft`: real safetensors checkpoints against the real SGLang model code.

The model code is each line's base as patchkit acquires it, with that line's series applied
(in a private cache): the pinned SGLang 0.5.9 sdist and the pinned 0.5.17 wheel.  Tests of
what the 0.5.17 code does also read the real wheel as published.  Each broken draft must be
reported with its fix.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("safetensors")
pytest.importorskip("numpy")

import numpy as np  # noqa: E402
from doctor_fixtures import (  # noqa: E402
    AUX_IDS,
    HIDDEN,
    TARGET_LAYERS,
    VOCAB,
    sglang_config,
    sglang_draft,
    speculators_draft,
    speculators_record,
    target_config,
    vocab_maps,
)
from helpers import ROOT, patchkit, private_cache, result_of, series_folder  # noqa: E402

from patchkit.doctor import sources  # noqa: E402
from patchkit.doctor.draft import check_draft  # noqa: E402
from patchkit.doctor.expected import SourceTree, derive_draft  # noqa: E402
from patchkit.doctor.interp import TensorValue  # noqa: E402


@pytest.fixture(scope="session")
def doctor_cache(tmp_path_factory, warm_mirrors) -> Path:
    """A private PATCHKIT_CACHE with the pinned mirrors, shared by this module's tests."""
    return private_cache(warm_mirrors, tmp_path_factory.mktemp("doctor") / "cache")


@pytest.fixture(scope="session")
def line059(doctor_cache):
    """SGLang 0.5.9 + the series, as `doctor draft` acquires it by default."""
    return sources.for_line(None, project=ROOT, cache=doctor_cache)


@pytest.fixture(scope="session")
def wheel0517(sglang_wheels) -> Path:
    """The real sglang 0.5.17 wheel from the package index (cached)."""
    return sglang_wheels["cp311"]


@pytest.fixture(scope="session")
def line0517(wheel0517, doctor_cache):
    return sources.from_wheel(wheel0517, patched=False, cache=doctor_cache)


@pytest.fixture
def target(tmp_path) -> Path:
    return target_config(tmp_path / "target")


def by_id(report) -> dict:
    return {c.id: c for c in report.checks}


def failing(report) -> set[str]:
    return {c.id for c in report.problems}


# ---- the good draft ------------------------------------------------------------------------
def test_sglang_layout_draft_passes(tmp_path, target, line059):
    report = check_draft(sglang_draft(tmp_path / "draft"), target, line059)

    assert report.ok, [(c.id, c.detail) for c in report.problems]
    checks = by_id(report)
    assert "11 parameters filled" in checks["keys.expected"].detail
    assert "(t2d skipped by load_weights' own rule)" in checks["keys.leftover"].detail
    assert "target embedding" in checks["keys.expected"].detail
    assert "captures the input of layers [2, 4, 6] of 8" in checks["aux.layers"].detail
    assert "KimiK25ForConditionalGeneration -> DeepseekV3ForCausalLM" in checks["aux.layers"].detail
    assert checks["aux.width"].detail == f"{3 * HIDDEN} = 3 x {HIDDEN}"
    assert report.source.startswith("sglang 0.5.9 + series patches/sglang/0.5.9 (8 patches)")
    assert report.source.endswith("on its sdist sglang==0.5.9")


def test_cli_clean_draft_exit_0_and_json(tmp_path, target, doctor_cache):
    draft = sglang_draft(tmp_path / "draft")
    env = {"PATCHKIT_CACHE": str(doctor_cache)}

    text = patchkit(
        "doctor", "draft", "--draft", str(draft), "--target-config", str(target), env=env
    )
    doc = patchkit(
        "doctor",
        "draft",
        "--draft",
        str(draft),
        "--target-config",
        str(target.parent),
        "--json",
        env=env,
    )

    assert text.returncode == 0, text.stderr
    assert "doctor: no problems" in text.stdout
    assert doc.returncode == 0, doc.stderr
    parsed = result_of(doc.stdout)
    assert parsed["ok"] is True and parsed["problems"] == 0
    assert parsed["capture"]["captured"] == [2, 4, 6]
    assert {c["id"] for c in parsed["checks"]} >= {"keys.expected", "aux.width", "vocab", "rope"}


# ---- speculators layout and --fix ------------------------------------------------------------
def test_speculators_draft_names_the_mapping(tmp_path, target, line059):
    report = check_draft(speculators_draft(tmp_path / "spec"), target, line059)

    assert report.convention == "speculators"
    assert failing(report) == {"config", "keys.expected", "keys.leftover"}
    keys = by_id(report)["keys.expected"]
    assert "7 of 11 parameters keep their initial values" in keys.detail
    assert "layers.0.* -> midlayer.* (10 tensors)" in keys.fix
    assert report.rename["layers.0.self_attn.q_proj.weight"] == "midlayer.self_attn.q_proj.weight"
    assert "t2d" not in report.rename and "fc.weight" not in report.rename


def test_fix_writes_renamed_copy_byte_for_byte(tmp_path, target, doctor_cache):
    from safetensors.numpy import load_file

    draft = speculators_draft(tmp_path / "spec")
    out = tmp_path / "fixed"
    before = (draft / "model.safetensors").read_bytes()

    proc = patchkit(
        "doctor",
        "draft",
        "--draft",
        str(draft),
        "--target-config",
        str(target),
        "--fix",
        str(out),
        env={"PATCHKIT_CACHE": str(doctor_cache)},
    )

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "doctor: 3 problem(s)" in proc.stdout and proc.stdout.rstrip().endswith(
        "doctor: no problems"
    )
    assert (draft / "model.safetensors").read_bytes() == before  # the source is untouched
    original, fixed = (
        load_file(str(draft / "model.safetensors")),
        load_file(str(out / "model.safetensors")),
    )
    manifest = json.loads((out / "patchkit-doctor-fix.json").read_text())
    assert len(fixed) == len(original)
    for new, entry in manifest["tensors"].items():
        assert fixed[new].tobytes() == original[entry["from"]].tobytes()
        assert fixed[new].dtype == original[entry["from"]].dtype
    assert manifest["renamed"]["layers.0.mlp.up_proj.weight"] == "midlayer.mlp.up_proj.weight"
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == AUX_IDS
    assert config["rope_theta"] == 50000.0
    assert "config.py" in manifest["not_copied"] and not (out / "config.py").exists()


def test_fix_refuses_a_non_empty_out(tmp_path, target, doctor_cache):
    draft = speculators_draft(tmp_path / "spec")
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")

    proc = patchkit(
        "doctor",
        "draft",
        "--draft",
        str(draft),
        "--target-config",
        str(target),
        "--fix",
        str(out),
        env={"PATCHKIT_CACHE": str(doctor_cache)},
    )

    assert proc.returncode == 2
    assert "already exists and is not empty; nothing was written" in proc.stderr
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".taken")]


@pytest.mark.parametrize("points_to", ["empty folder", "nothing"])
def test_fix_refuses_an_out_that_is_a_link(tmp_path, target, doctor_cache, points_to):
    draft = speculators_draft(tmp_path / "spec")
    elsewhere = tmp_path / "elsewhere"
    if points_to == "empty folder":
        elsewhere.mkdir()
    out = tmp_path / "linked"
    out.symlink_to(elsewhere)

    proc = patchkit(
        "doctor", "draft", "--draft", str(draft), "--target-config", str(target),
        "--fix", str(out), env={"PATCHKIT_CACHE": str(doctor_cache)},
    )  # fmt: skip

    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("patchkit: ") and "is a link; nothing was written" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert out.is_symlink() and os.readlink(out) == str(elsewhere)
    assert not elsewhere.exists() or not any(elsewhere.iterdir())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".linked")]


# ---- broken drafts -----------------------------------------------------------------------------
def test_wrong_aux_width(tmp_path, target, line059):
    report = check_draft(sglang_draft(tmp_path / "draft", n_aux=2), target, line059)

    width = by_id(report)["aux.width"]
    assert width.status == "fail"
    assert (
        f"takes {2 * HIDDEN} inputs; the target feeds 3 x {HIDDEN} = {3 * HIDDEN}" in width.detail
    )
    assert "configure 2 aux layer ids" in width.fix
    assert "shapes" in failing(report)  # SGLang builds fc for 3 aux states and would refuse it


@pytest.mark.parametrize(
    ("n_aux", "target_hidden", "causes"),
    [
        (6, HIDDEN, [f"configure 6 aux layer ids the draft was trained on in eagle_config "
                     f"(6 x {HIDDEN} = {6 * HIDDEN})",
                     f"trained on a target of hidden size {2 * HIDDEN} (3 x {2 * HIDDEN} = "
                     f"{6 * HIDDEN})"]),
        (3, 96, ["trained on a target of hidden size 96 (3 x 96 = 288)"]),
        (2, HIDDEN, ["configure 2 aux layer ids"]),
    ],
    ids=["layers-or-target", "another-target", "layers"],
)  # fmt: skip
def test_the_aux_width_fix_names_each_cause_the_sizes_allow(
    tmp_path, target, line059, n_aux, target_hidden, causes
):
    draft = sglang_draft(tmp_path / "draft", n_aux=n_aux, target_hidden=target_hidden)

    width = by_id(check_draft(draft, target, line059))["aux.width"]

    assert width.status == "fail"
    for cause in causes:
        assert cause in width.fix, width.fix
    assert ("the sizes fit two causes" in width.fix) == (len(causes) == 2)
    assert "retrain the draft on aux states of width" not in width.fix


def test_aux_width_of_a_different_target_hidden(tmp_path, line059):
    target = target_config(tmp_path / "target", hidden=2 * HIDDEN)
    report = check_draft(sglang_draft(tmp_path / "draft"), target, line059)

    assert {"aux.width", "hidden"} <= failing(report)
    assert f"set target_hidden_size {2 * HIDDEN}" in by_id(report)["hidden"].fix


@pytest.mark.parametrize(
    ("ids", "message", "fix"),
    [
        ([1, 3, 7], "ids [7] capture nothing", "use ids in 0..6"),
        ([1, 3, 40], "ids [40] capture nothing", "use ids in 0..6"),
        ([1, 3, 3], "the target captures 2 unique layers, not 3", "list each aux layer once"),
    ],
)
def test_bad_layer_ids(tmp_path, target, line059, ids, message, fix):
    draft = sglang_draft(
        tmp_path / "draft", config=sglang_config(aux_ids=ids, torch_dtype="float16")
    )
    report = check_draft(draft, target, line059)

    layers = by_id(report)["aux.layers"]
    assert layers.status == "fail"
    assert message in layers.detail and fix in layers.fix
    assert "aux.width" in failing(report)  # fewer captured layers than fc was trained on


def test_default_layer_ids_come_from_the_target_code(tmp_path, line059):
    target = target_config(tmp_path / "target", layers=12)
    draft = sglang_draft(
        tmp_path / "draft", config=sglang_config(aux_ids=None, torch_dtype="float16")
    )
    report = check_draft(draft, target, line059)

    assert report.ok, [(c.id, c.detail) for c in report.problems]
    assert report.capture["captured"] == [2, 12 // 2, 12 - 3]  # set_eagle3_layers_to_capture's rule
    assert "none configured: the target's default" in by_id(report)["aux.layers"].detail


def test_top_level_ids_are_ignored_by_sglang(tmp_path, target, line059):
    config = sglang_config(
        aux_ids=None, torch_dtype="float16", eagle_aux_hidden_state_layer_ids=[0, 1, 2]
    )
    report = check_draft(sglang_draft(tmp_path / "draft", config=config), target, line059)

    check = by_id(report)["aux.config"]
    assert check.status == "fail"
    assert '"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}' in check.fix


def test_missing_d2t(tmp_path, target, line059):
    report = check_draft(sglang_draft(tmp_path / "draft", d2t=False), target, line059)

    vocab = by_id(report)["vocab"]
    assert failing(report) == {"vocab"}
    assert "draft_vocab_size 128 < target 256 and no d2t" in vocab.detail
    assert "add the d2t tensor" in vocab.fix


def test_vocab_mismatch(tmp_path, line059):
    target = target_config(tmp_path / "target", vocab=2 * VOCAB)
    report = check_draft(sglang_draft(tmp_path / "draft"), target, line059)

    vocab = by_id(report)["vocab"]
    assert vocab.status == "fail"
    assert f"draft vocab_size {VOCAB} != target vocab_size {2 * VOCAB}" in vocab.detail
    assert f"set vocab_size {2 * VOCAB}" in vocab.fix


def _disagreeing_t2d_draft(folder: Path) -> Path:
    from doctor_fixtures import sglang_tensors, write_draft

    tensors = sglang_tensors(dtype=np.float16)
    d2t, t2d = vocab_maps()
    t2d[1] = True
    t2d[0] = False
    tensors["t2d"] = t2d
    return write_draft(folder, sglang_config(torch_dtype="float16"), tensors)


def test_a_t2d_the_line_never_reads_is_a_warning(tmp_path, target, doctor_cache):
    """A good draft whose t2d disagrees with d2t: SGLang's load_weights skips t2d, so the
    server is unaffected; a warning that says so, exit 0."""
    draft = _disagreeing_t2d_draft(tmp_path / "draft")
    env = {"PATCHKIT_CACHE": str(doctor_cache)}

    done = patchkit("doctor", "draft", "--draft", str(draft), "--target-config", str(target),
                    "--json", env=env)  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    checks = {c["id"]: c for c in result_of(done.stdout)["checks"]}
    t2d = checks["vocab.t2d"]
    assert t2d["status"] == "warn"
    assert "t2d and d2t disagree on which target tokens are drafted" in t2d["detail"]
    assert "load_weights never reads t2d, so SGLang is unaffected" in t2d["detail"]
    assert "rebuild t2d from d2t" in t2d["fix"]
    assert checks["vocab"]["status"] == "pass"


def test_a_t2d_the_line_reads_must_agree(tmp_path, target, line059):
    """The same draft against model code that keeps t2d: the disagreement is a failure."""
    tree = _copy_tree(line059, tmp_path / "tree")
    eagle3 = tree / "sglang/srt/models/llama_eagle3.py"
    skip = 'if "t2d" in name:\n                continue'
    assert skip in eagle3.read_text()
    keep = (
        'if "t2d" in name:\n                self.t2d_map = loaded_weight\n                continue'
    )
    eagle3.write_text(eagle3.read_text().replace(skip, keep))
    draft = _disagreeing_t2d_draft(tmp_path / "draft")

    reads = by_id(check_draft(draft, target, sources.from_path(tree)))["vocab.t2d"]
    ignores = by_id(check_draft(draft, target, line059))["vocab.t2d"]

    assert (
        reads.status == "fail" and "disagree" in reads.detail and "never reads" not in reads.detail
    )
    assert ignores.status == "warn"


def test_every_vocabulary_problem_is_named(tmp_path, target, line059):
    """A vocab_size mismatch, a d2t entry out of range, two draft tokens on one target token
    and a t2d that disagrees, all at once: each is named with its fix."""
    from doctor_fixtures import sglang_tensors, write_draft

    tensors = sglang_tensors(dtype=np.float16)
    d2t, t2d = vocab_maps()  # draft token i -> target token 2i
    d2t[0] = 10**6  # outside the target vocabulary
    d2t[3] = 4 - 3  # draft token 3 -> target token 4, as draft token 2
    t2d[0] = False
    t2d[1] = True
    tensors["d2t"], tensors["t2d"] = d2t, t2d
    draft = write_draft(
        tmp_path / "draft", sglang_config(torch_dtype="float16", vocab=300), tensors
    )

    checks = by_id(check_draft(draft, target, line059))

    vocab = checks["vocab"]
    assert vocab.status == "fail"
    for problem, fix in [
        (f"draft vocab_size 300 != target vocab_size {VOCAB}", f"set vocab_size {VOCAB}"),
        ("d2t[i]+i leaves the target vocabulary (1 entries, e.g. 1000000)", "target_id - draft_id"),
        ("d2t maps two draft tokens to one target token", "rebuild d2t from the draft vocabulary"),
    ]:
        assert problem in vocab.detail and fix in vocab.fix, (problem, vocab.detail)
    assert "disagree" in checks["vocab.t2d"].detail and checks["vocab.t2d"].status == "warn"


def test_norm_before_residual_claim_is_checked_against_the_code(tmp_path, target, line059):
    config = sglang_config(torch_dtype="float16", norm_before_residual=True)
    report = check_draft(sglang_draft(tmp_path / "draft", config=config), target, line059)

    flags = by_id(report)["flags"]
    assert flags.status == "fail" and "norm_before_residual=true" in flags.detail


def test_tied_config_with_own_head(tmp_path, target, line059):
    config = sglang_config(torch_dtype="float16", tie_word_embeddings=True, draft_vocab_size=VOCAB)
    report = check_draft(
        sglang_draft(tmp_path / "draft", config=config, draft_vocab=VOCAB), target, line059
    )

    assert by_id(report)["tying"].status == "fail"
    assert "lm_head.weight" in by_id(report)["keys.leftover"].detail  # SGLang skips it silently


def test_config_the_model_code_cannot_read(tmp_path, target, line059):
    """A tied draft without draft_vocab_size: 0.5.9's __init__ reads it and fails."""
    config = sglang_config(torch_dtype="float16", tie_word_embeddings=True, draft_vocab_size=None)
    report = check_draft(
        sglang_draft(tmp_path / "draft", config=config, draft_vocab=VOCAB), target, line059
    )

    model = by_id(report)["model"]
    assert model.status == "fail"
    assert "has no 'draft_vocab_size'" in model.detail and "llama_eagle3.py" in model.detail
    assert 'add "draft_vocab_size"' in model.fix


def test_rope_parameters_only_lose_theta_on_0_5_9(tmp_path, target, line059):
    config = sglang_config(
        torch_dtype="float16",
        rope_theta=None,
        rope_parameters={"rope_theta": 50000.0, "rope_type": "default"},
    )
    report = check_draft(sglang_draft(tmp_path / "draft", config=config), target, line059)

    rope = by_id(report)["rope"]
    assert rope.status == "fail"
    assert "builds rope with base 10000" in rope.detail and '"rope_theta": 50000.0' in rope.fix


def test_unpatched_tree_cannot_capture_for_kimi(tmp_path, target, sglang_sdist):
    from patchkit.upstream import safe_extract_sdist

    tree = safe_extract_sdist(sglang_sdist, tmp_path / "base")
    report = check_draft(sglang_draft(tmp_path / "draft"), target, sources.from_path(tree))

    capture = by_id(report)["aux.capture"]
    assert capture.status == "fail"
    assert "KimiK25ForConditionalGeneration has no set_eagle3_layers_to_capture()" in capture.detail


# ---- the 0.5.17 line ----------------------------------------------------------------------
@pytest.mark.slow
def test_0_5_17_loads_layers_0_names(tmp_path, target, line0517):
    report = check_draft(speculators_draft(tmp_path / "spec"), target, line0517)

    assert failing(report) == {"config"}  # the names load as they are on 0.5.17
    assert report.rename == {}
    assert "sglang.srt.models.llama_eagle3" in by_id(report)["model"].detail


@pytest.mark.slow
def test_0_5_17_rope_parameters_are_read(tmp_path, target, line0517):
    config = sglang_config(
        torch_dtype="float16",
        rope_theta=None,
        rope_parameters={"rope_theta": 50000.0, "rope_type": "default"},
    )
    report = check_draft(sglang_draft(tmp_path / "draft", config=config), target, line0517)

    assert by_id(report)["rope"].status == "pass"


@pytest.mark.slow
def test_0_5_17_midlayer_names_still_load(tmp_path, target, line0517):
    """0.5.17 reads the draft's eagle_config in a component module of the runner and sets
    the layers in a start-up phase the scheduler runs before the one capturing graphs."""
    report = check_draft(sglang_draft(tmp_path / "draft"), target, line0517)

    assert report.ok, [(c.id, c.detail) for c in report.problems]
    assert by_id(report)["aux.layers"].detail.startswith(
        "eagle_config.eagle_aux_hidden_state_layer_ids = "
    )
    graphs = by_id(report)["aux.graphs"]
    assert graphs.status == "pass", graphs.detail
    assert graphs.detail.startswith("scheduler.py init_model_worker: the runner's layers set")


@pytest.mark.slow
def test_0_5_23_builds_its_mlp_with_kernel_dispatchers(tmp_path, target, sglang_0523_wheels,
                                                      doctor_cache):  # fmt: skip
    """0.5.23's LlamaMLP holds DualGemm and DenseSiluAndMulQuant, plain objects without
    parameters (layers.toml lists them): the draft is checked, not refused as unreadable."""
    line0523 = sources.from_wheel(sglang_0523_wheels["cp311"], patched=False, cache=doctor_cache)

    report = check_draft(sglang_draft(tmp_path / "draft"), target, line0523)

    assert report.ok, [(c.id, c.detail) for c in report.problems]
    assert "11 parameters filled" in by_id(report)["keys.expected"].detail


def _line_patches(line: str) -> list[str]:
    from patchkit.series import load_series

    return [p.name for p in load_series(series_folder(ROOT, "sglang", line), "sglang").patches]


@pytest.mark.slow
def test_the_0_5_17_line_is_its_wheel_base_with_its_series(tmp_path, target, doctor_cache):
    """`--line 0.5.17` reads patchkit's own import of the pinned wheel with the line's series
    applied (whatever patches/sglang/0.5.17/series holds), not the index wheel as published."""
    import zipfile

    from patchkit.workspace import Workspace

    pin = Workspace.load(ROOT).targets.get("sglang", "0.5.17").pinned.base_wheel
    source = sources.for_line("0.5.17", project=ROOT, cache=doctor_cache)
    by_tag = sources.for_line("v0.5.17", project=ROOT, cache=doctor_cache)
    report = check_draft(sglang_draft(tmp_path / "draft"), target, source)

    patches = _line_patches("0.5.17")
    assert source.provenance["base_source"] == "wheel"
    assert source.provenance["base"] == pin.sha256
    assert source.provenance["patches"] == patches
    assert source.patched is bool(patches)
    assert source.label == (
        f"sglang 0.5.17 + series patches/sglang/0.5.17 ({len(patches)} patches) "
        f"on its wheel {pin.filename}"
    )
    assert by_tag.key == source.key
    assert report.ok, [(c.id, c.detail) for c in report.problems]
    assert report.source == source.label
    with zipfile.ZipFile(doctor_cache / "wheels" / pin.filename) as zf:
        published = sorted(
            n
            for n in zf.namelist()
            if n.startswith(sources.MODELS_DIR)
            and n.endswith(".py")
            and "/" not in n[len(sources.MODELS_DIR) :]
        )
        if not patches:  # the base itself: byte for byte the wheel's sources
            llama = "sglang/srt/models/llama_eagle3.py"
            assert source.read(llama) == zf.read(llama).decode()
    assert source.model_files() == published


def test_the_default_line_and_an_explicit_0_5_9_are_one_source(doctor_cache, line059):
    explicit = sources.for_line("0.5.9", project=ROOT, cache=doctor_cache)

    assert explicit.key == line059.key
    assert line059.provenance["base_source"] == "sdist"
    assert line059.provenance["patches"] == _line_patches("0.5.9")
    assert line059.patched is True


def test_a_release_no_line_carries_is_the_unpatched_index_wheel(tmp_path, sglang_wheels):
    """Only a release no line is pinned to falls back to the index wheel (named unpatched)."""
    from patchkit.errors import UsageError
    from patchkit.workspace import Workspace

    target = Workspace.load(ROOT).target("sglang")

    assert sources._line_view(target, "0.5.17").line == "0.5.17"
    for retired in ("0.5.12", "v0.5.12"):  # the retired line, by name or by its release
        with pytest.raises(UsageError, match="sglang line 0.5.12 is retired: .*--line 0.5.17"):
            sources._line_view(target, retired)
    assert sources._line_view(target, None).line == target.default_line
    assert sources._line_view(target, "0.5.10") is None
    wheels = tmp_path / "c" / "doctor" / "wheels"
    wheels.mkdir(parents=True)
    # A stand-in for the 0.5.10 index download (a real wheel under that name): only which
    # source is chosen, and its label, are under test here.
    os.link(sglang_wheels["cp311"], wheels / "sglang-0.5.10-py3-none-any.whl")
    loose = sources._wheel_line("0.5.10", tmp_path / "c")
    assert loose.patched is False and "(unpatched: no line is pinned to it)" in loose.label


@pytest.mark.slow
def test_the_doctor_follows_the_0_5_17_series(tmp_path, target, doctor_cache, line0517):
    """A patch in the 0.5.17 line's series changes what the doctor reports for that line (here
    the target's default aux layers), through the CLI; a series that does not apply onto the
    wheel base is a one-line error."""
    from series_fixtures import make_patch, tree_from_mirror

    from patchkit.upstream import Mirror, acquire
    from patchkit.workspace import Workspace

    scratch = tmp_path / "project"
    scratch.mkdir()
    shutil.copytree(ROOT / "patches", scratch / "patches")
    view = Workspace.load(scratch).targets.get("sglang", "0.5.17")
    base = acquire(view, None, cache=doctor_cache)
    tree = tree_from_mirror(Mirror(view, doctor_cache).path, base.commit, tmp_path / "tree")
    raw = make_patch(
        tree,
        "python/sglang/srt/models/deepseek_v2.py",
        "self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]",
        "self.model.layers_to_capture = [1, num_layers // 2, num_layers - 2]",
        "deepseek_v2: capture the first layer by default",
    )
    folder = series_folder(scratch, "sglang", "0.5.17")
    (folder / "default-aux-layers.patch").write_bytes(raw)
    with (folder / "series").open("a") as fh:
        fh.write("default-aux-layers.patch\n")
    layers = 12
    draft = sglang_draft(
        tmp_path / "draft", config=sglang_config(aux_ids=None, torch_dtype="float16")
    )
    target = target_config(tmp_path / "target", layers=layers)
    env = {"PATCHKIT_CACHE": str(doctor_cache), "PATCHKIT_PROJECT": str(scratch)}
    args = ("doctor", "draft", "--draft", str(draft), "--target-config", str(target), "--json")

    patched = patchkit(*args, "--line", "0.5.17", env=env)
    (folder / "default-aux-layers.patch").write_bytes(raw.replace(b"num_layers - 3]", b"nl - 3]"))
    broken = patchkit(*args, "--line", "0.5.17", env=env)

    doc = result_of(patched.stdout)
    assert patched.returncode == 0, [c["detail"] for c in doc["checks"] if c["status"] == "fail"]
    assert doc["capture"]["captured"] == [1, layers // 2, layers - 2]
    assert doc["sglang"]["patched"] is True
    assert "patches/sglang/0.5.17" in doc["sglang"]["source"]
    published = check_draft(draft, target, line0517)  # the wheel as published: upstream's rule
    assert published.capture["captured"] == [2, layers // 2, layers - 3]
    assert broken.returncode != 0 and "Traceback" not in broken.stderr
    assert "default-aux-layers.patch" in broken.stderr
    assert len(broken.stderr.strip().splitlines()) <= 2


# ---- derivation, input errors -------------------------------------------------------------
def test_derivation_follows_the_draft_config(line059):
    """Parameters come from the model code for this config: fc width from target_hidden_size,
    no lm_head when tied, a refusal for two layers (0.5.9 supports one)."""
    tree = SourceTree(line059)
    base = sglang_config()
    tensors = {"fc.weight": TensorValue((HIDDEN, 3 * 96), "F16")}

    wide = derive_draft(tree, {**base, "target_hidden_size": 96}, tensors)
    tied = derive_draft(tree, {**base, "tie_word_embeddings": True}, tensors)
    two = derive_draft(tree, {**base, "num_hidden_layers": 2}, tensors)

    assert wide.params["model.fc.weight"].shape == (HIDDEN, 3 * 96)
    assert "lm_head.weight" not in tied.params
    assert two.refused == "EAGLE3 currently only supports 1 layer"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:4], "not a safetensors file (shorter than 8 bytes)"),
        (lambda b: (10**9).to_bytes(8, "little") + b[8:], "does not fit"),
        (lambda b: len(b"{nope").to_bytes(8, "little") + b"{nope", "header is not JSON"),
        (lambda b: b[:-16], "data offsets outside the file"),
    ],
)
def test_damaged_safetensors_is_a_one_line_error(tmp_path, target, doctor_cache, damage, message):
    draft = sglang_draft(tmp_path / "draft")
    path = draft / "model.safetensors"
    path.write_bytes(damage(path.read_bytes()))

    proc = patchkit(
        "doctor",
        "draft",
        "--draft",
        str(draft),
        "--target-config",
        str(target),
        env={"PATCHKIT_CACHE": str(doctor_cache)},
    )

    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2


def test_usage_errors(tmp_path, target, doctor_cache):
    env = {"PATCHKIT_CACHE": str(doctor_cache)}
    missing = patchkit("doctor", "draft", "--target-config", str(target), env=env)
    no_dir = patchkit(
        "doctor",
        "draft",
        "--draft",
        str(tmp_path / "nope"),
        "--target-config",
        str(target),
        env=env,
    )
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text("{}")
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"x")
    no_st = patchkit(
        "doctor", "draft", "--draft", str(tmp_path / "bin"), "--target-config", str(target), env=env
    )

    assert missing.returncode == 2 and "--draft" in missing.stderr
    assert no_dir.returncode == 2 and "not a directory" in no_dir.stderr
    assert no_st.returncode == 2 and "no .safetensors files (pytorch_model.bin)" in no_st.stderr


def test_speculators_record_is_the_real_package_output():
    """The recorded layout names the package and version that wrote it."""
    record = speculators_record()
    assert record["speculators_version"] == record["config"]["speculators_version"]
    assert record["config"]["architectures"] == ["Eagle3DraftModel"]
    assert "layers.0.self_attn.q_proj.weight" in record["tensors"]
    assert TARGET_LAYERS > max(record["config"]["eagle_aux_hidden_state_layer_ids"]) + 1


def test_the_doctor_imports_no_torch(tmp_path, target, doctor_cache):
    draft = speculators_draft(tmp_path / "spec")
    code = (
        "import sys, os\n"
        "from pathlib import Path\n"
        "from patchkit.doctor import sources\n"
        "from patchkit.doctor.draft import check_draft\n"
        f"src = sources.for_line(None, project=Path({str(ROOT)!r}),"
        f" cache=Path({str(doctor_cache)!r}))\n"
        f"report = check_draft(Path({str(draft)!r}), Path({str(target)!r}), src)\n"
        "assert not report.ok\n"
        "heavy = {'torch', 'numpy', 'safetensors', 'sglang', 'transformers'}\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & heavy)\n"
        "print(loaded)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_draft_written_by_the_real_speculators_package(tmp_path, target, doctor_cache):
    """Fresh from speculators' own save_pretrained (it needs transformers >= 5, so it runs in
    an interpreter of its own: PATCHKIT_SPECULATORS_PYTHON, with PATCHKIT_SPECULATORS_PATH
    added to its path), the draft is diagnosed and --fix makes it pass."""
    import os

    python = os.environ.get("PATCHKIT_SPECULATORS_PYTHON")
    if not python:
        pytest.skip("set PATCHKIT_SPECULATORS_PYTHON to an interpreter with speculators installed")
    script = ROOT / "tests" / "fixtures" / "doctor" / "make_speculators_draft.py"
    env = {**os.environ, "PYTHONPATH": os.environ.get("PATCHKIT_SPECULATORS_PATH", "")}
    made = subprocess.run(
        [python, str(script), str(tmp_path / "spec"), "--summary", str(tmp_path / "summary.json")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tensors"] == speculators_record()["tensors"]  # the recorded layout holds

    proc = patchkit(
        "doctor",
        "draft",
        "--draft",
        str(tmp_path / "spec"),
        "--target-config",
        str(target),
        "--fix",
        str(tmp_path / "fixed"),
        "--json",
        env={"PATCHKIT_CACHE": str(doctor_cache)},
    )

    doc = result_of(proc.stdout)
    assert {c["id"] for c in doc["checks"] if c["status"] == "fail"} >= {"config", "keys.expected"}
    assert doc["fixed"]["ok"] is True and proc.returncode == 0


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": ["1", "3", "5"]}}, "aux.config"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": 5}}, "aux.config"),
        ({"eagle_config": [1, 3, 5]}, "aux.config"),
        ({"num_key_value_heads": 0}, "heads"),
        ({"architectures": ["LlamaForCausalLM"]}, "model"),
        ({"hidden_act": "gelu"}, "model"),
        ({"draft_vocab_size": "x"}, "vocab"),
    ],
    ids=[
        "ids-strings",
        "ids-int",
        "eagle-config-list",
        "kv-zero",
        "not-eagle3",
        "gelu",
        "vocab-str",
    ],
)
def test_hostile_configs_are_findings_not_crashes(tmp_path, target, line059, extra, check):
    config = {**sglang_config(torch_dtype="float16"), **extra}
    report = check_draft(sglang_draft(tmp_path / "draft", config=config), target, line059)

    assert check in failing(report)
    assert all(c.fix for c in report.problems)


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"transformer_layer_config": "abc"}, "model"),
        ({"eagle_aux_hidden_state_layer_ids": 5}, "aux.config"),
    ],
    ids=["layer-config-str", "ids-int"],
)
def test_hostile_speculators_configs_are_findings_not_crashes(
    tmp_path, target, line059, extra, check
):
    draft = speculators_draft(tmp_path / "spec")
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, **extra}))
    report = check_draft(draft, target, line059)

    assert check in failing(report), failing(report)
    assert all(c.fix for c in report.problems)


def test_a_deeply_nested_json_is_a_one_line_error(tmp_path, target, doctor_cache):
    """json.loads recurses: a config or header nested 200,000 deep is a RecursionError, which
    is a one-line error like any other unreadable input, not an internal error."""
    deep = "[" * 200_000 + "]" * 200_000
    env = {"PATCHKIT_CACHE": str(doctor_cache)}
    draft = sglang_draft(tmp_path / "draft")
    nested = tmp_path / "nested.json"
    nested.write_text(deep)
    header = deep.encode()
    bad_header = sglang_draft(tmp_path / "bad-header")
    (bad_header / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    for args, words in (
        (["--draft", str(draft), "--target-config", str(nested)], "nests too deeply"),
        (["--draft", str(bad_header), "--target-config", str(target)], "nests too deeply"),
    ):
        proc = patchkit("doctor", "draft", *args, env=env)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert words in proc.stderr and "internal error" not in proc.stderr, proc.stderr


def test_fix_into_a_folder_inside_the_draft(tmp_path, target, line059):
    from patchkit.doctor.fix import write_fixed

    draft = speculators_draft(tmp_path / "spec")
    fix = write_fixed(check_draft(draft, target, line059), draft, draft / "fixed")

    assert sorted(p.name for p in fix.out.iterdir()) == [
        "config.json", "model.safetensors", "patchkit-doctor-fix.json",
    ]  # fmt: skip
    assert check_draft(fix.out, target, line059).ok


def _copy_tree(source, dest: Path) -> Path:
    """The files the doctor reads, copied out of a line's source into a plain tree."""
    from patchkit.doctor.expected import load_leaves

    wanted = set(source.model_files()) | {"sglang/srt/model_executor/model_runner.py"}
    wanted |= {dotted.rsplit(".", 1)[0].replace(".", "/") + ".py" for dotted in load_leaves()}
    for rel in sorted(wanted):
        text = source.read(rel)
        if text is not None:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_text(text)
    return dest


def test_expectations_follow_the_code_not_a_list(tmp_path, target, line059):
    """Change the model code and the doctor's expectations move with it: the decoder layer
    renamed, the default capture rule changed, the rule that skips t2d gone."""
    tree = _copy_tree(line059, tmp_path / "tree")
    eagle3 = tree / "sglang/srt/models/llama_eagle3.py"
    text = eagle3.read_text().replace("self.midlayer", "self.block")
    text = text.replace('if "t2d" in name:', 'if "t2d-gone" in name:')
    eagle3.write_text(text)
    deepseek = tree / "sglang/srt/models/deepseek_v2.py"
    rule = "[2, num_layers // 2, num_layers - 3]"
    assert rule in deepseek.read_text()
    deepseek.write_text(deepseek.read_text().replace(rule, "[1, num_layers - 2, num_layers - 1]"))
    config = sglang_config(aux_ids=None, torch_dtype="float16")

    report = check_draft(
        sglang_draft(tmp_path / "draft", config=config), target, sources.from_path(tree)
    )

    checks = by_id(report)
    assert "model.block.self_attn.qkv_proj.weight" in checks["keys.expected"].detail
    leftover = checks["keys.leftover"].detail
    assert "skips 11 tensor(s)" in leftover and leftover.endswith("and 7 more")  # midlayer.*, t2d
    assert "t2d" in [k for k, o in derive_draft(
        SourceTree(sources.from_path(tree)), config, {"t2d": TensorValue((VOCAB,), "BOOL")}
    ).outcomes.items() if o.skipped]  # fmt: skip
    assert report.capture["captured"] == [1, TARGET_LAYERS - 2, TARGET_LAYERS - 1]


def test_a_missing_shard_of_a_fused_parameter(tmp_path, target, line059):
    from doctor_fixtures import sglang_tensors, write_draft

    tensors = sglang_tensors(dtype=np.float16)
    del tensors["midlayer.self_attn.k_proj.weight"]
    draft = write_draft(tmp_path / "draft", sglang_config(torch_dtype="float16"), tensors)

    keys = by_id(check_draft(draft, target, line059))["keys.expected"]
    assert keys.status == "fail"
    assert "1 of 11 parameters" in keys.detail and "qkv_proj.weight" in keys.detail


def test_embedding_comes_from_the_target_unless_hidden_sizes_differ(tmp_path, line059):
    from doctor_fixtures import sglang_tensors, write_draft

    tensors = sglang_tensors(dtype=np.float16)
    del tensors["embed_tokens.weight"]
    same = write_draft(tmp_path / "same", sglang_config(torch_dtype="float16"), tensors)
    wide_target = target_config(tmp_path / "wide", hidden=2 * HIDDEN)
    wide = write_draft(
        tmp_path / "wide-draft",
        sglang_config(torch_dtype="float16", target_hidden_size=2 * HIDDEN),
        sglang_tensors(dtype=np.float16, target_hidden=2 * HIDDEN),
    )
    del_embed = {k: v for k, v in sglang_tensors(dtype=np.float16, target_hidden=2 * HIDDEN).items()
                 if k != "embed_tokens.weight"}  # fmt: skip
    wide_no_embed = write_draft(
        tmp_path / "wide-no-embed",
        sglang_config(torch_dtype="float16", target_hidden_size=2 * HIDDEN),
        del_embed,
    )

    assert check_draft(same, target_config(tmp_path / "t"), line059).ok
    assert check_draft(wide, wide_target, line059).ok
    keys = by_id(check_draft(wide_no_embed, wide_target, line059))["keys.expected"]
    assert keys.status == "fail" and "model.embed_tokens.weight" in keys.detail


@pytest.mark.parametrize(
    ("d2t", "message"),
    [
        (vocab_maps(vocab=4 * VOCAB)[0], "d2t[i]+i leaves the target vocabulary"),
        (np.zeros(128, dtype=np.int64) - np.arange(128) % 2, "maps two draft tokens to one"),
        (np.zeros(64, dtype=np.int64), "d2t has 64 entries, draft_vocab_size is 128"),
        (np.zeros(128, dtype=np.float32), "d2t is F32, not an integer tensor"),
    ],
    ids=["out-of-range", "not-one-to-one", "short", "float"],
)
def test_bad_d2t(tmp_path, target, line059, d2t, message):
    from doctor_fixtures import sglang_tensors, write_draft

    tensors = sglang_tensors(dtype=np.float16)
    tensors["d2t"] = d2t
    tensors.pop("t2d")
    draft = write_draft(tmp_path / "draft", sglang_config(torch_dtype="float16"), tensors)

    vocab = by_id(check_draft(draft, target, line059))["vocab"]
    assert vocab.status == "fail" and message in vocab.detail and vocab.fix


def test_outside_a_project_the_installed_sglang_is_read(tmp_path, line059):
    """Found without importing it: a site folder holding the sglang package and its metadata."""
    site = _copy_tree(line059, tmp_path / "site")
    (site / "sglang" / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    info = site / "sglang-0.5.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.9\n")
    code = (
        "from patchkit.doctor.sources import installed_sglang\n"
        "s = installed_sglang()\n"
        "assert 'class LlamaForCausalLMEagle3' in s.read('sglang/srt/models/llama_eagle3.py')\n"
        "print(s.label)\n"
    )
    env = {"PYTHONPATH": f"{site}:{ROOT}"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"installed sglang 0.5.9 at {site / 'sglang'}")


@pytest.mark.long
@pytest.mark.slow
def test_0_5_17_derivation_is_the_real_models(tmp_path, wheel0517, line0517):
    """The real 0.5.17 model, in an interpreter with that line's torch 2.11 and transformers 5
    (PATCHKIT_P0517_PYTHON), holds the parameters the doctor derives, and its load_weights
    fills every one from the speculators names."""
    import os
    import zipfile

    from doctor_fixtures import speculators_draft

    from patchkit.doctor.checkpoint import load_checkpoint, sglang_view

    python = os.environ.get("PATCHKIT_P0517_PYTHON")
    if not python:
        pytest.skip("set PATCHKIT_P0517_PYTHON to an interpreter with SGLang 0.5.17's stack")
    tree = tmp_path / "tree"
    with zipfile.ZipFile(wheel0517) as zf:
        zf.extractall(tree, [n for n in zf.namelist() if n.startswith("sglang/")])
    cases = {
        "plain": {}, "target-hidden": {"target_hidden_size": 96},
        "tied": {"tie_word_embeddings": True, "draft_vocab_size": VOCAB},
        "bias": {"attention_bias": True}, "fc-norm": {"fc_norm": True},
        "two-layers": {"num_hidden_layers": 2},
        "two-aux": {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5]}},
    }  # fmt: skip
    configs = {name: {**sglang_config(), **extra} for name, extra in cases.items()}
    (tmp_path / "cases.json").write_text(json.dumps(configs))
    draft = speculators_draft(tmp_path / "spec")
    view = sglang_view(load_checkpoint(draft).config)
    (draft / "config.json").write_text(json.dumps(view))  # SGLang's layout, speculators' names
    script = ROOT / "tests" / "fixtures" / "doctor" / "real_model_params.py"
    standins = ROOT / "tests" / "payload" / "standins"
    proc = subprocess.run(
        [python, str(script), str(tree), str(standins), str(tmp_path / "cases.json"), str(draft)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    real = json.loads(proc.stdout.strip().splitlines()[-1])

    source_tree = SourceTree(line0517)
    for name, config in configs.items():
        derived = derive_draft(source_tree, config, {})
        assert {n: list(s.shape) for n, s in derived.params.items()} == real["cases"][name], name
    doctor = derive_draft(source_tree, view, load_checkpoint(draft).tensor_values())
    assert real["untrained"] == [] == doctor.unfilled()


def test_kimi_size_draft(tmp_path, line059):
    """Full Kimi-K2.5 sizes (61 layers, hidden 7168, 163840 tokens; fc 3 x 7168 = 21504)."""
    from doctor_fixtures import kimi_size_draft, kimi_target

    draft = kimi_size_draft(tmp_path / "draft")
    report = check_draft(draft, kimi_target(tmp_path / "kimi"), line059)
    narrow = check_draft(draft, kimi_target(tmp_path / "other", hidden_size=4096), line059)

    assert report.ok, [(c.id, c.detail) for c in report.problems]
    assert report.capture["captured"] == [2, 30, 58]
    assert by_id(report)["aux.width"].detail == "21504 = 3 x 7168"
    assert "fc.weight takes 21504 inputs; the target feeds 3 x 4096 = 12288" in (
        by_id(narrow)["aux.width"].detail
    )


def test_a_draft_rope_shorter_than_the_target_context_is_a_warning(tmp_path, line059):
    from doctor_fixtures import kimi_target

    draft = sglang_draft(tmp_path / "draft")  # max_position_embeddings 512
    report = check_draft(draft, kimi_target(tmp_path / "kimi", hidden_size=HIDDEN, vocab_size=VOCAB,
                                            num_hidden_layers=TARGET_LAYERS), line059)  # fmt: skip

    rope = by_id(report)["rope.target"]
    assert rope.status == "warn" and report.ok
    assert "covers 512 positions, the target 262144" in rope.detail


def test_sharded_draft_with_index(tmp_path, target, line059):
    """Two shards and model.safetensors.index.json: read together, renamed together."""
    from safetensors.numpy import load_file, save_file

    from patchkit.doctor.fix import write_fixed

    draft = speculators_draft(tmp_path / "spec")
    tensors = load_file(str(draft / "model.safetensors"))
    (draft / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for file, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(draft / file))
    index = {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}
    (draft / "model.safetensors.index.json").write_text(json.dumps(index))

    report = check_draft(draft, target, line059)
    fix = write_fixed(report, draft, tmp_path / "fixed")

    assert {"keys.expected", "keys.leftover"} <= failing(report)
    fixed_index = json.loads((fix.out / "model.safetensors.index.json").read_text())
    assert fixed_index["weight_map"]["midlayer.self_attn.q_proj.weight"] in shards
    assert check_draft(fix.out, target, line059).ok
    (draft / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {**index["weight_map"], "fc.weight": "elsewhere.safetensors"}})
    )
    from patchkit.errors import UsageError

    with pytest.raises(UsageError, match="the headers disagree"):
        check_draft(draft, target, line059)


def test_special_files_are_refused_not_read(tmp_path, target, doctor_cache):
    """A FIFO named like a shard or a config would block a reader forever."""
    import os

    env = {"PATCHKIT_CACHE": str(doctor_cache)}
    shard = sglang_draft(tmp_path / "fifo-shard")
    os.mkfifo(shard / "model-extra.safetensors")
    config = sglang_draft(tmp_path / "fifo-config")
    (config / "config.json").unlink()
    os.mkfifo(config / "config.json")

    a = patchkit("doctor", "draft", "--draft", str(shard), "--target-config", str(target), env=env)
    b = patchkit("doctor", "draft", "--draft", str(config), "--target-config", str(target), env=env)

    assert a.returncode == 2 and "model-extra.safetensors is not a regular file" in a.stderr
    assert b.returncode == 2 and "config.json" in b.stderr and "not a regular file" in b.stderr


def test_unpatched_graph_order_keeps_the_default_layers(tmp_path, sglang_sdist, line059):
    """On the unpatched tree the runner captures CUDA graphs before it sets the draft's layers."""
    from patchkit.upstream import safe_extract_sdist

    base = sources.from_path(safe_extract_sdist(sglang_sdist, tmp_path / "base"))
    plain = target_config(tmp_path / "target", kimi=False)
    draft = sglang_draft(tmp_path / "draft")  # ids [1, 3, 5] -> [2, 4, 6]; defaults [2, 4, 5]
    same = sglang_draft(
        tmp_path / "same", config=sglang_config(aux_ids=[1, 3, 4], torch_dtype="float16")
    )

    graphs = by_id(check_draft(draft, plain, base))["aux.graphs"]
    assert graphs.status == "fail"
    assert "capture the default layers [2, 4, 5], prefill the configured [2, 4, 6]" in graphs.detail
    assert by_id(check_draft(same, plain, base))["aux.graphs"].status == "pass"
    assert by_id(check_draft(draft, plain, line059))["aux.graphs"].status == "pass"
