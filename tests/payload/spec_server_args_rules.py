"""The rules of ``--speculative-disable-batch-threshold`` that both SGLang lines share, as
tests: each line's module (``test_spec_server_args.py``, ``test_spec_server_args_0512.py``)
imports them and provides the ``tree`` and ``resolve`` fixtures of its line."""

from __future__ import annotations

import logging

import pytest
from spec_fixtures import EAGLE3_TOPK1, THRESHOLD_FLAG


def test_reenable_defaults_to_three_quarters(resolve):
    args = resolve(*EAGLE3_TOPK1, THRESHOLD_FLAG, "32", "--max-running-requests", "128")
    assert args.speculative_reenable_batch_threshold == 24
    args = resolve(*EAGLE3_TOPK1, THRESHOLD_FLAG, "1", "--max-running-requests", "128")
    assert args.speculative_reenable_batch_threshold == 1


def test_unset_threshold_changes_nothing(resolve):
    args = resolve(*EAGLE3_TOPK1, "--max-running-requests", "128")
    assert args.speculative_disable_batch_threshold is None
    assert args.speculative_reenable_batch_threshold is None


@pytest.mark.parametrize("value", ["0", "-4"])
def test_threshold_must_be_positive(resolve, value):
    with pytest.raises(ValueError, match=r"disable-batch-threshold must be >= 1"):
        resolve(*EAGLE3_TOPK1, THRESHOLD_FLAG, value)


def test_threshold_without_speculation_refused(resolve):
    with pytest.raises(ValueError, match=r"only the EAGLE and EAGLE3.*None"):
        resolve(THRESHOLD_FLAG, "8")


@pytest.mark.parametrize("spec_v2", [True, False])
def test_topk_must_be_one(resolve, spec_v2):
    # Llama auto-selects (steps, topk, draft tokens) = (5, 4, 8) when none is given.
    with pytest.raises(ValueError, match=r"requires --speculative-eagle-topk 1, got 4"):
        resolve("--speculative-algorithm", "EAGLE3", THRESHOLD_FLAG, "8", spec_v2=spec_v2)


@pytest.mark.parametrize("value", ["0", "9"])
def test_reenable_must_lie_in_range(resolve, value):
    with pytest.raises(ValueError, match=r"reenable-batch-threshold must be between 1 and"):
        resolve(*EAGLE3_TOPK1, THRESHOLD_FLAG, "8", "--speculative-reenable-batch-threshold", value)


def test_reenable_needs_threshold(resolve):
    with pytest.raises(ValueError, match=r"reenable-batch-threshold requires"):
        resolve(*EAGLE3_TOPK1, "--speculative-reenable-batch-threshold", "4")


def warning_messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_warns_when_threshold_reaches_max_running_requests(resolve, caplog):
    caplog.set_level(logging.WARNING)
    resolve(*EAGLE3_TOPK1, THRESHOLD_FLAG, "64", "--max-running-requests", "64")
    assert any(
        "disable-batch-threshold 64 >= --max-running-requests 64" in m
        for m in warning_messages(caplog)
    )


def test_no_warning_below_explicit_max_running_requests(resolve, caplog):
    caplog.set_level(logging.WARNING)
    resolve(*EAGLE3_TOPK1, THRESHOLD_FLAG, "32", "--max-running-requests", "128")
    assert not any("threshold" in m for m in warning_messages(caplog))


def test_warns_about_implicit_cap_of_48(resolve, caplog):
    caplog.set_level(logging.WARNING)
    args = resolve(*EAGLE3_TOPK1, THRESHOLD_FLAG, "64")
    assert args.max_running_requests == 48
    messages = [m for m in warning_messages(caplog) if "capped at 48" in m]
    assert messages and "threshold 64 can never be exceeded" in messages[0]
    assert "--max-running-requests" in messages[0]
