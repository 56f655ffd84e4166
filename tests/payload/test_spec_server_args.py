"""SGLang 0.5.9: ``--speculative-disable-batch-threshold`` parsing and every validation rule.

The arguments go through the real ``ServerArgs.add_cli_args`` parser and the real
``ServerArgs._handle_speculative_decoding``; only ``__post_init__`` (GPU probing) is skipped.
The target is a tiny Llama config written to a temporary directory (no weights are read).
"""

from __future__ import annotations

import logging

import pytest
from spec_fixtures import (
    EAGLE3_TOPK1,
    THRESHOLD_FLAG,
    parse_server_args,
    spec_tree,
    write_model_dir,
)
from spec_server_args_rules import (  # noqa: F401  (collected here: the rules both lines share)
    test_no_warning_below_explicit_max_running_requests,
    test_reenable_defaults_to_three_quarters,
    test_reenable_must_lie_in_range,
    test_reenable_needs_threshold,
    test_threshold_must_be_positive,
    test_threshold_without_speculation_refused,
    test_topk_must_be_one,
    test_unset_threshold_changes_nothing,
    test_warns_about_implicit_cap_of_48,
    test_warns_when_threshold_reaches_max_running_requests,
    warning_messages,
)

pytestmark = [pytest.mark.payload, pytest.mark.sglang_lines("0.5.9")]


@pytest.fixture(scope="module")
def tree(request):
    """The 0.5.9 tree (patchkit's apply of the series, or ``PATCHKIT_SPEC_TREE``)."""
    return spec_tree(request, "0.5.9")


@pytest.fixture
def model_dir(tmp_path):
    return write_model_dir(tmp_path)


@pytest.fixture
def resolve(tree, model_dir, monkeypatch):
    """Parse a command line and run the speculative-decoding handling of ServerArgs."""
    monkeypatch.delenv("SGLANG_ENABLE_SPEC_V2", raising=False)

    def _resolve(*argv: str, spec_v2: bool = False):
        if spec_v2:
            monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "1")
        args = parse_server_args(model_dir, argv)
        args._handle_speculative_decoding()
        return args

    return _resolve


def test_cli_parses_thresholds(resolve):
    args = resolve(
        *EAGLE3_TOPK1,
        THRESHOLD_FLAG, "32",
        "--speculative-reenable-batch-threshold", "20",
        "--max-running-requests", "128",
    )  # fmt: skip
    assert args.speculative_disable_batch_threshold == 32
    assert args.speculative_reenable_batch_threshold == 20


def test_algorithm_must_be_eagle(resolve):
    with pytest.raises(ValueError, match=r"only the EAGLE and EAGLE3.*STANDALONE"):
        resolve(
            "--speculative-algorithm", "STANDALONE",
            "--speculative-num-steps", "2",
            "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "3",
            THRESHOLD_FLAG, "8",
        )  # fmt: skip


def test_eagle_and_eagle3_accepted(resolve):
    for algorithm in ("EAGLE", "EAGLE3"):
        argv = list(EAGLE3_TOPK1)
        argv[1] = algorithm
        args = resolve(*argv, THRESHOLD_FLAG, "8", "--max-running-requests", "64")
        assert args.speculative_disable_batch_threshold == 8


def test_spec_v2_topk_one_accepted(resolve):
    args = resolve(*EAGLE3_TOPK1, THRESHOLD_FLAG, "8", "--max-running-requests", "64", spec_v2=True)
    assert args.disable_overlap_schedule is False
    assert args.speculative_disable_batch_threshold == 8


def test_pd_disaggregated_decode_refused(resolve, tree):
    from sglang.srt.server_args import ServerArgs

    args = resolve(*EAGLE3_TOPK1, THRESHOLD_FLAG, "8", "--max-running-requests", "64")
    args.disaggregation_mode = "decode"
    with pytest.raises(ValueError, match=r"PD-disaggregated decode"):
        ServerArgs._handle_speculative_disable_batch_threshold(args)
    args.disaggregation_mode = "prefill"
    ServerArgs._handle_speculative_disable_batch_threshold(args)


def test_memory_for_steps_without_drafts_reserved_before_the_kv_pool(resolve, model_dir):
    """With mem_fraction_static chosen automatically, the threshold reserves the second
    backend and the DECODE graphs (512 MB + 2 MB per graph batch size up to
    cuda_graph_max_bs) out of the static fraction the KV pool is sized from."""
    from sglang.srt.server_args import ServerArgs

    gpu_mem = 80 * 1024
    fractions = []
    for extra in ([], [THRESHOLD_FLAG, "32"]):
        args = parse_server_args(model_dir, [*EAGLE3_TOPK1, "--cuda-graph-max-bs", "128", *extra])
        ServerArgs._handle_gpu_memory_settings(args, gpu_mem)
        fractions.append(args.mem_fraction_static)
    plain, with_threshold = fractions
    assert with_threshold == pytest.approx(plain - (512 + 128 * 2) / gpu_mem, abs=1.5e-3)


@pytest.mark.parametrize(
    ("flag", "field", "words"),
    [
        ("--enable-dp-attention", "enable_dp_attention", "--enable-dp-attention"),
        (None, "enable_multi_layer_eagle", "multi-layer EAGLE"),
        ("--enable-two-batch-overlap", "enable_two_batch_overlap", "--enable-two-batch-overlap"),
        ("--enable-pdmux", "enable_pdmux", "--enable-pdmux"),
    ],
)
def test_incompatible_modes_refused(resolve, flag, field, words, tree):
    from sglang.srt.server_args import ServerArgs

    argv = [*EAGLE3_TOPK1, THRESHOLD_FLAG, "8"]
    if flag is None:
        # Multi-layer EAGLE is switched on by the model adjustments, not by a flag.
        args = resolve(*argv, "--max-running-requests", "64")
        args.enable_multi_layer_eagle = True
        with pytest.raises(ValueError, match=f"cannot be combined with {words}"):
            ServerArgs._handle_speculative_disable_batch_threshold(args)
        return
    with pytest.raises(ValueError, match=f"cannot be combined with {words}"):
        resolve(*argv, flag)


def test_warns_about_implicit_cap_below_48_too(resolve, caplog):
    caplog.set_level(logging.WARNING)
    resolve(*EAGLE3_TOPK1, THRESHOLD_FLAG, "8")
    messages = [m for m in warning_messages(caplog) if "capped at 48" in m]
    assert messages and "never be exceeded" not in messages[0]
