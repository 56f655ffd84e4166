"""The GPU probe's profiling trigger (gpu/probe/sitecustomize.py), run on the CPU: a request
file ``N MINBS`` times N target forwards of batch size >= MINBS, profiles N more, traces
``TRACE_STEPS`` more with torch.profiler, writes one report and removes the request; smaller
batches are not counted."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load_probe(tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHKIT_GPU_PROBE", str(tmp_path))
    spec = importlib.util.spec_from_file_location(
        "probe_sitecustomize", ROOT / "gpu" / "probe" / "sitecustomize.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.meta_path.remove(next(f for f in sys.meta_path if type(f).__name__ == "_Finder"))
    return module


def test_a_process_without_models_leaves_the_request_to_the_scheduler(tmp_path, monkeypatch):
    """Every process of a server imports the probe; the first to see the request used to
    take it, and the HTTP process never runs a forward."""
    _load_probe(tmp_path, monkeypatch)
    (tmp_path / "profile").write_text("5 100\n")
    time.sleep(0.6)
    assert (tmp_path / "profile").exists()


def test_profile_request_times_then_profiles_counted_forwards(tmp_path, monkeypatch):
    probe = _load_probe(tmp_path, monkeypatch)
    probe._state["runs_models"] = True  # as after ModelRunner's module is wrapped
    (tmp_path / "profile").write_text("5 100\n")
    deadline = time.time() + 5
    while (tmp_path / "profile").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert not (tmp_path / "profile").exists()
    for bs in [128, 4, 127, 128, 128, 128]:  # 4 is below MINBS: not counted
        probe._profile_step(bs)
    assert probe._profile["phase"] == "profiling"
    assert probe._profile["bs"] == [128, 127, 128, 128, 128]
    for _ in range(4):
        probe._profile_step(120)
    assert not list(tmp_path.glob("*.prof.txt"))
    probe._profile_step(120)
    assert probe._profile["phase"] == "tracing"
    import torch

    for _ in range(probe.TRACE_STEPS):
        assert not list(tmp_path.glob("*.prof.txt"))
        torch.ones(4).add_(1)
        probe._profile_step(120)
    (report,) = tmp_path.glob("*.prof.txt")
    text = report.read_text()
    assert text.startswith("target forwards timed without the profiler: 4, batch sizes 127-128")
    assert "_profile_step" in text
    assert f"GPU under torch.profiler, {probe.TRACE_STEPS} target forwards: " in text
    assert "aten::add_" in text  # the traced table (CPU ops here; kernels on a GPU)
    assert probe._profile["phase"] == "idle"


def test_a_failing_trace_leaves_the_forward_alone(tmp_path, monkeypatch):
    """torch.profiler failing to start (no CUPTI, say) ends the request with a report that
    says so; the forward the probe wraps is not broken."""
    import torch.profiler

    probe = _load_probe(tmp_path, monkeypatch)

    def refuse(*args, **kwargs):
        raise RuntimeError("CUPTI unavailable")

    monkeypatch.setattr(torch.profiler, "profile", refuse)
    probe._profile.update(phase="timing", left=1, n=1, stamps=[], bs=[])
    probe._profile_step(128)  # the last timed forward: cProfile starts
    probe._profile_step(128)  # cProfile ends: the trace fails to start
    (report,) = tmp_path.glob("*.prof.txt")
    assert "no GPU trace: RuntimeError('CUPTI unavailable')" in report.read_text()
    assert probe._profile["phase"] == "idle"
