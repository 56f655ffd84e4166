"""The GPU tier's training keeps the best evaluated state when it ends on its budget
(gpu/train_models.py ``BestState``), run on the CPU with a real module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]


def _train_models():
    sys.path.insert(0, str(ROOT / "gpu"))
    try:
        spec = importlib.util.spec_from_file_location(
            "train_models", ROOT / "gpu" / "train_models.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "gpu"))
    return module


def test_budget_stop_restores_the_best_evaluated_state():
    best_state = _train_models().BestState
    model = nn.Linear(2, 2)
    best = best_state(model)
    history = []
    for score, value in [((0.90, 1.0), 1.0), ((0.9997, 7.5), 2.0), ((0.987, 2.6), 3.0)]:
        with torch.no_grad():
            model.weight.fill_(value)
        history.append(value)
        best.offer(score, {"accuracy": score[0], "value": value})
    stats = best.restore("budget")
    assert stats == {"accuracy": 0.9997, "value": 2.0, "stopped": "budget"}
    assert torch.equal(model.weight, torch.full((2, 2), 2.0))
    # the kept state is a copy: training on after an offer does not change it
    with torch.no_grad():
        model.weight.fill_(9.0)
    best.restore("budget")
    assert torch.equal(model.weight, torch.full((2, 2), 2.0))
