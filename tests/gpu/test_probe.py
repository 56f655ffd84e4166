"""The GPU probe's profiling trigger (gpu/probe/sitecustomize.py), run on the CPU: a request
file ``N MINBS`` times N target forwards of batch size >= MINBS, profiles N more, traces
``TRACE_STEPS`` more with torch.profiler, writes one report and removes the request; smaller
batches are not counted."""

from __future__ import annotations

import ast
import importlib.util
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

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


# -- what the probe records around a decode step, on fakes shaped as 0.5.17's classes ----------


class _Mode:
    def __init__(self, name):
        self.name = name


class _ForwardBatch:
    def __init__(self, mode, bs, draft_token_num=None):
        self.forward_mode, self.batch_size = _Mode(mode), bs
        self.spec_info = (
            None if draft_token_num is None else SimpleNamespace(draft_token_num=draft_token_num)
        )


def _fake_modules():
    """Classes with 0.5.17's names and signatures; each method returns a marker."""

    class ModelRunner:
        def __init__(self, draft):
            self.is_draft_worker = draft

        def forward(self, forward_batch, **kwargs):
            return SimpleNamespace(can_run_graph=forward_batch.batch_size <= 128)

    class EagleDraftWorker:
        speculative_num_steps = 2

        def draft(self, batch):
            return "verify-input"

        def _draft_extend_for_decode(self, batch, batch_result):
            return "extended"

    class SchedulerBatchResultProcessor:
        def _resolve_spec_v2_tokens(self, result, batch):
            return "tokens"

    class SchedulerMetricsReporter:
        def update_spec_metrics(self, bs, num_correct_drafts, num_block_accept_tokens=0,
                                num_cap_tokens=0):  # fmt: skip
            return "booked"

    return {
        "sglang.srt.model_executor.model_runner": SimpleNamespace(ModelRunner=ModelRunner),
        "sglang.srt.speculative.eagle_worker_v2": SimpleNamespace(
            EagleDraftWorker=EagleDraftWorker
        ),
        "sglang.srt.managers.scheduler_components.batch_result_processor": SimpleNamespace(
            SchedulerBatchResultProcessor=SchedulerBatchResultProcessor
        ),
        "sglang.srt.managers.scheduler_components.metrics_reporter": SimpleNamespace(
            SchedulerMetricsReporter=SchedulerMetricsReporter
        ),
    }


def test_a_zero_step_and_a_speculative_step_are_recorded_as_0_5_17_runs_them(tmp_path, monkeypatch):
    """Upstream's zero-step state: a TARGET_VERIFY of one token, no draft call, a draft
    extend, booked with 0 accepted drafts; a speculative step: a draft call, a verify of 3
    tokens, a draft extend. The wrappers pass arguments and results through."""
    sys.path.insert(0, str(ROOT / "gpu"))
    import engines
    import steps

    probe = _load_probe(tmp_path, monkeypatch)
    recorded = []  # the records, kept from the flusher thread
    monkeypatch.setattr(probe, "_record", recorded.append)
    fakes = _fake_modules()
    for name, module in fakes.items():
        probe._WRAPPERS[name](module)
    target = fakes["sglang.srt.model_executor.model_runner"].ModelRunner(False)
    drafter = fakes["sglang.srt.speculative.eagle_worker_v2"].EagleDraftWorker()
    results = fakes["sglang.srt.managers.scheduler_components.batch_result_processor"]
    metrics = fakes["sglang.srt.managers.scheduler_components.metrics_reporter"]
    processor = results.SchedulerBatchResultProcessor()
    reporter = metrics.SchedulerMetricsReporter()
    batch = SimpleNamespace(seq_lens=[7] * 12)
    # a zero-step step of 12 requests, then a speculative one of 4 (its result resolved late)
    assert target.forward(_ForwardBatch("TARGET_VERIFY", 12, 1)).can_run_graph
    assert drafter._draft_extend_for_decode(batch, None) == "extended"
    assert processor._resolve_spec_v2_tokens(SimpleNamespace(speculative_num_draft_tokens=1),
                                             batch) == "tokens"  # fmt: skip
    assert reporter.update_spec_metrics(12, 0, num_cap_tokens=0) == "booked"
    small = SimpleNamespace(seq_lens=[7] * 4)
    assert drafter.draft(small) == "verify-input"
    target.forward(_ForwardBatch("TARGET_VERIFY", 4, 3))
    drafter._draft_extend_for_decode(small, None)
    reporter.update_spec_metrics(4, 6)  # no resolve seen: the draft tokens are unknown
    fakes["sglang.srt.model_executor.model_runner"].ModelRunner(True).forward(
        _ForwardBatch("DRAFT_EXTEND_V2", 4)
    )
    lines = "".join(recorded).splitlines()
    assert lines == [
        "F 0 TARGET_VERIFY 12 1 1", "E 12", "S 12 0 1",
        "D 4 2", "F 0 TARGET_VERIFY 4 1 3", "E 4", "S 4 6 0", "F 1 DRAFT_EXTEND_V2 4 1 0",
    ]  # fmt: skip
    events = [engines.parse_probe_line(line) for line in lines]
    assert steps.decode_steps(events) == [
        steps.Step("TARGET_VERIFY", 12, True, 0, 0, 1),
        steps.Step("TARGET_VERIFY", 4, True, 2, 1, 1),
    ]
    assert steps.bookings(events) == [(12, 0, 1), (4, 6, None)]


# -- the hooks exist in the real wheels, with the fields and the call order the probe reads ----

HOOKS = {
    "0.5.17": [
        ("model_executor/model_runner.py", "ModelRunner", "forward"),
        ("speculative/eagle_worker_v2.py", "EagleDraftWorker", "draft"),
        ("speculative/eagle_worker_v2.py", "EagleDraftWorker", "_draft_extend_for_decode"),
        ("managers/scheduler_components/batch_result_processor.py",
         "SchedulerBatchResultProcessor", "_resolve_spec_v2_tokens"),
        ("managers/scheduler_components/metrics_reporter.py", "SchedulerMetricsReporter",
         "update_spec_metrics"),
    ],
    "0.5.12": [
        ("model_executor/model_runner.py", "ModelRunner", "forward"),
        ("speculative/eagle_worker_v2.py", "EagleDraftWorker", "draft"),
        ("speculative/eagle_worker_v2.py", "EagleDraftWorker", "_draft_extend_for_decode"),
        ("managers/scheduler_output_processor_mixin.py", "SchedulerOutputProcessorMixin",
         "_resolve_spec_overlap_tokens"),
        ("observability/scheduler_metrics_mixin.py", "SchedulerMetricsMixin",
         "update_spec_metrics"),
    ],
}  # fmt: skip


# what the wrappers read of each first argument (a batch's seq_lens, a result's draft tokens)
FIRST_ARGS = ("forward_batch", "batch", "model_worker_batch", "result", "bs")


def _source(wheel: Path, module: str) -> str:
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        return z.read(f"sglang/srt/{module}").decode()


def _methods(source: str, cls: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}


@pytest.mark.slow
@pytest.mark.parametrize("line", sorted(HOOKS))
def test_the_probe_hooks_are_in_the_lines_wheel(line, request):
    """Each wrapped class and method is in the wheel, in a module the probe names; the
    wrapped methods take the arguments the wrappers read first."""
    wheels = request.getfixturevalue("sglang_wheels" if line == "0.5.17" else "sglang_0512_wheels")
    probe = (ROOT / "gpu" / "probe" / "sitecustomize.py").read_text()
    for module, cls, method in HOOKS[line]:
        assert "sglang.srt." + module[:-3].replace("/", ".") in probe
        assert f'"{cls}"' in probe or f".{cls}" in probe
        args = [a.arg for a in _methods(_source(wheels["cp312"], module), cls)[method].args.args]
        assert args[0] == "self" and args[1] in FIRST_ARGS, (module, method, args)
    draft = _methods(_source(wheels["cp312"], "speculative/eagle_worker_v2.py"), "EagleDraftWorker")
    assert "speculative_num_steps" in ast.unparse(draft["__init__"])


@pytest.mark.slow
def test_0_5_17_books_a_decode_step_right_after_resolving_it(sglang_wheels):
    """The stride the probe puts on a booking is that of the step booked: the scheduler
    resolves a decode result (``_normalize_decode_outputs`` -> ``_resolve_spec_v2_tokens``)
    and books it into the metrics in the same call, in that order, for every decode batch of
    a speculative server (a zero-step one too); verify inputs carry ``draft_token_num`` and
    results ``speculative_num_draft_tokens``."""
    wheel = sglang_wheels["cp312"]
    source = _source(wheel, "managers/scheduler_components/batch_result_processor.py")
    methods = _methods(source, "SchedulerBatchResultProcessor")
    decode = ast.unparse(methods["process_batch_result_decode"])
    assert decode.index("_normalize_decode_outputs(") < decode.index("update_spec_metrics(")
    assert "if not batch.spec_algorithm.is_none():" in decode  # every step, whatever its drafts
    assert "_resolve_spec_v2_tokens(result, batch)" in ast.unparse(
        methods["_normalize_decode_outputs"]
    )
    assert "draft_token_num: int" in _source(wheel, "speculative/eagle_info.py")
    assert "speculative_num_draft_tokens: Optional[int]" in _source(wheel, "managers/utils.py")
    worker = _methods(_source(wheel, "speculative/eagle_worker_v2.py"), "EAGLEWorkerV2")
    trivial = ast.unparse(worker["_build_trivial_verify_input"])
    assert "draft_token_num=1" in trivial and "spec_steps=0" in trivial
