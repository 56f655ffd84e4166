"""Test probe for the GPU tier: records what a real SGLang server does, changes nothing.

Active only when ``PATCHKIT_GPU_PROBE`` names a directory (the GPU tier puts this folder first
on the server's ``PYTHONPATH``). Once SGLang's modules are imported it wraps, without changing
arguments or results:

- ``ModelRunner.forward``: one line ``F <draft 0|1> <forward mode> <batch size> <graph 0|1>
  <tokens>`` per model forward (graph: the forward replayed a CUDA graph, ``can_run_graph``;
  tokens: per request, the verify tree's ``draft_token_num`` for TARGET_VERIFY, 1 for
  DECODE, 0 otherwise). On 0.5.17 a step without drafts is a TARGET_VERIFY of 1 token;
- the v2 draft worker's ``EagleDraftWorker.draft``: ``D <batch size> <steps>`` (drafting, in
  CUDA graphs or not, which ``ModelRunner.forward`` does not see when replayed) and
  ``_draft_extend_for_decode``: ``E <batch size>`` (the draft extend after a decode verify),
  ``write_draft_kv_for_decode`` (0.5.17's threshold): ``K <batch size>`` (the draft's K/V of a
  step without drafts written alone);
- ``update_spec_metrics`` (0.5.9 / 0.5.12: ``SchedulerMetricsMixin``, 0.5.17:
  ``SchedulerMetricsReporter``): ``S <batch size> <accepted drafts> <draft tokens>``, the
  scheduler's booking of a decode step into the acceptance metrics; draft tokens: those of the
  booked step per request, read from the result the scheduler resolved just before
  (``_resolve_spec_v2_tokens``, 0.5.12: ``_resolve_spec_overlap_tokens``), 0 when unseen.

Lines go to ``<dir>/<pid>.rec``, written every 0.2 s by a daemon thread; while
``<dir>/off`` exists nothing is recorded (the benchmark runs with the probe off).

Profiling (``gpu/session.py --profile``): when ``<dir>/profile`` appears, holding ``N MINBS``,
the wall time between target forwards of batch size >= MINBS is measured over N of them
without the profiler, then the scheduler's thread runs N more such forwards under
``cProfile``, then ``TRACE_STEPS`` more (20) under ``torch.profiler`` with CUDA activity: the
GPU time and kernel count per step and the kernels by device time. All of it goes to
``<dir>/<pid>.prof.txt`` (statistics by own and by cumulative time, then the GPU table). The
request file is removed once taken.
"""

import cProfile
import importlib.abc
import importlib.machinery
import io
import os
import pstats
import sys
import threading
import time

_DIR = os.environ.get("PATCHKIT_GPU_PROBE")
_lines = []
_lock = threading.Lock()
_state = {"on": True, "profile": 0, "min_bs": 1, "runs_models": False, "stride": 0}
_profile = {"phase": "idle", "left": 0, "n": 0, "stamps": [], "bs": [], "prof": None}
TRACE_STEPS = 20


def _record(line):
    if _state["on"]:
        with _lock:
            _lines.append(line)


def _flusher():
    path = os.path.join(_DIR, f"{os.getpid()}.rec")
    while True:
        time.sleep(0.2)
        _state["on"] = not os.path.exists(os.path.join(_DIR, "off"))
        request = os.path.join(_DIR, "profile")
        # only a process that runs models takes the request (the server's HTTP and
        # detokenizer processes import this module too)
        if _state["runs_models"] and os.path.exists(request):
            try:
                with open(request) as f:
                    n, min_bs = (int(x) for x in f.read().split())
                _state["profile"], _state["min_bs"] = n, min_bs
            except (OSError, ValueError):
                pass
            finally:
                os.remove(request)
        with _lock:
            chunk = "".join(_lines)
            _lines.clear()
        if chunk:
            with open(path, "a") as f:
                f.write(chunk)


def _wrap_model_runner(module):
    cls = module.ModelRunner
    original = cls.forward
    _state["runs_models"] = True

    def forward(self, forward_batch, *args, **kwargs):
        if not self.is_draft_worker:
            _profile_step(forward_batch.batch_size)
        out = original(self, forward_batch, *args, **kwargs)
        _record(
            f"F {int(bool(self.is_draft_worker))} {forward_batch.forward_mode.name} "
            f"{forward_batch.batch_size} {int(bool(getattr(out, 'can_run_graph', False)))} "
            f"{_tokens_per_request(forward_batch)}\n"
        )
        return out

    cls.forward = forward


def _tokens_per_request(forward_batch):
    """Tokens per request of a decode-class forward, from host-side fields only (no GPU
    sync): the verify tree's width for TARGET_VERIFY, 1 for DECODE; 0 for the rest."""
    mode = forward_batch.forward_mode.name
    if mode == "TARGET_VERIFY":
        return int(getattr(forward_batch.spec_info, "draft_token_num", 0) or 0)
    return 1 if mode == "DECODE" else 0


def _batch_size(batch):
    seq_lens = getattr(batch, "seq_lens", None)
    return 0 if seq_lens is None else len(seq_lens)


def _wrap_draft_worker(module):
    cls = getattr(module, "EagleDraftWorker", None)
    if cls is None:
        return
    draft, extend = cls.draft, cls._draft_extend_for_decode

    def draft_(self, batch, *args, **kwargs):
        _record(f"D {_batch_size(batch)} {int(self.speculative_num_steps)}\n")
        return draft(self, batch, *args, **kwargs)

    def draft_extend_for_decode(self, batch, *args, **kwargs):
        _record(f"E {_batch_size(batch)}\n")
        return extend(self, batch, *args, **kwargs)

    cls.draft, cls._draft_extend_for_decode = draft_, draft_extend_for_decode
    kv = getattr(cls, "write_draft_kv_for_decode", None)
    if kv is not None:

        def write_draft_kv_for_decode(self, batch, *args, **kwargs):
            _record(f"K {_batch_size(batch)}\n")
            return kv(self, batch, *args, **kwargs)

        cls.write_draft_kv_for_decode = write_draft_kv_for_decode


def _wrap_result_processor(module):
    """Remember the draft tokens of the decode result being resolved; the scheduler books
    it into the acceptance metrics right after, in the same thread."""
    for cls_name, name in (
        ("SchedulerBatchResultProcessor", "_resolve_spec_v2_tokens"),  # 0.5.17
        ("SchedulerOutputProcessorMixin", "_resolve_spec_overlap_tokens"),  # 0.5.12
    ):
        cls = getattr(module, cls_name, None)
        if cls is not None and hasattr(cls, name):
            _wrap_resolve(cls, name)


def _wrap_resolve(cls, name):
    original = getattr(cls, name)

    def resolve(self, result, *args, **kwargs):
        _state["stride"] = int(getattr(result, "speculative_num_draft_tokens", 0) or 0)
        return original(self, result, *args, **kwargs)

    setattr(cls, name, resolve)


def _profile_step(batch_size):
    """Called at every target forward, in the scheduler's thread: N forwards timed without
    the profiler, then N under cProfile, then the report."""
    phase = _profile["phase"]
    if batch_size < _state["min_bs"]:
        return
    if phase == "idle":
        if not _state["profile"]:
            return
        _profile.update(phase="timing", left=_state["profile"], n=_state["profile"])
        _profile.update(stamps=[], bs=[])
        _state["profile"] = 0
        phase = "timing"
    _profile["left"] -= 1
    if phase == "timing":
        _profile["stamps"].append(time.perf_counter())
        _profile["bs"].append(batch_size)
        if _profile["left"] == 0:
            _profile.update(phase="profiling", left=_profile["n"], prof=cProfile.Profile())
            _profile["prof"].enable()
    elif phase == "profiling" and _profile["left"] == 0:
        _profile["prof"].disable()
        _profile["report"] = _cprofile_report(_profile["prof"])
        try:
            import torch.profiler

            trace = torch.profiler.profile(
                activities=[
                    torch.profiler.ProfilerActivity.CPU,
                    torch.profiler.ProfilerActivity.CUDA,
                ]
            )
            trace.__enter__()
        except Exception as error:  # the probe must not break the server's forward
            _finish(_profile["report"] + f"\n\nno GPU trace: {error!r}\n")
            return
        _profile.update(phase="tracing", left=TRACE_STEPS, prof=trace)
    elif phase == "tracing" and _profile["left"] == 0:
        try:
            _profile["prof"].__exit__(None, None, None)
            trace = _trace_report(_profile["prof"], TRACE_STEPS)
        except Exception as error:
            trace = f"\n\nno GPU trace: {error!r}\n"
        _finish(_profile["report"] + trace)


def _finish(report):
    with open(os.path.join(_DIR, f"{os.getpid()}.prof.txt"), "w") as f:
        f.write(report)
    _profile.update(phase="idle", prof=None, report="")


def _cprofile_report(prof):
    stamps, sizes = _profile["stamps"], _profile["bs"]
    gaps = sorted(b - a for a, b in zip(stamps, stamps[1:], strict=False))
    out = io.StringIO()
    if gaps:
        median, p10, p90 = (1e3 * gaps[len(gaps) * k // 10] for k in (5, 1, 9))
        out.write(
            f"target forwards timed without the profiler: {len(gaps)}, batch sizes "
            f"{min(sizes)}-{max(sizes)}, median {median:.3f} ms, "
            f"p10 {p10:.3f} ms, p90 {p90:.3f} ms\n\n"
        )
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(45)
    stats.sort_stats("cumulative").print_stats(70)
    return out.getvalue()


def _trace_report(trace, steps):
    """GPU time per step: every kernel and copy the process ran while traced (those
    inside CUDA graphs included, as the graph's kernels), summed, per step. Ranges that
    annotate the GPU timeline (SGLang's ``step[...]``) are not work and are left out."""
    events = [
        e
        for e in trace.events()
        if e.device_type.name == "CUDA" and not getattr(e, "is_user_annotation", False)
    ]
    busy_us = sum(e.device_time for e in events)
    out = io.StringIO()
    out.write(
        f"\n\nGPU under torch.profiler, {steps} target forwards: "
        f"{busy_us / steps / 1e3:.3f} ms of kernels and copies per step, "
        f"{len(events) / steps:.1f} of them per step\n\n"
    )
    out.write(trace.key_averages().table(sort_by="self_device_time_total", row_limit=45))
    return out.getvalue()


def _wrap_metrics(module):
    cls = getattr(module, "SchedulerMetricsMixin", None) or module.SchedulerMetricsReporter
    original = cls.update_spec_metrics

    def update_spec_metrics(self, bs, num_correct_drafts, *args, **kwargs):
        stride, _state["stride"] = _state["stride"], 0
        _record(f"S {int(bs)} {int(num_correct_drafts)} {stride}\n")
        return original(self, bs, num_correct_drafts, *args, **kwargs)

    cls.update_spec_metrics = update_spec_metrics


_WRAPPERS = {
    "sglang.srt.model_executor.model_runner": _wrap_model_runner,
    "sglang.srt.managers.scheduler_components.metrics_reporter": _wrap_metrics,  # 0.5.17
    "sglang.srt.observability.scheduler_metrics_mixin": _wrap_metrics,  # 0.5.12
    "sglang.srt.managers.scheduler_metrics_mixin": _wrap_metrics,  # 0.5.9
    "sglang.srt.managers.scheduler_components.batch_result_processor": _wrap_result_processor,
    "sglang.srt.managers.scheduler_output_processor_mixin": _wrap_result_processor,  # 0.5.12
    "sglang.srt.speculative.eagle_worker_v2": _wrap_draft_worker,
}


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, wrap):
        self._loader, self._wrap = loader, wrap

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._wrap(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        wrap = _WRAPPERS.get(fullname)
        if wrap is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, wrap)
        return spec


if _DIR and os.path.isdir(_DIR):
    sys.meta_path.insert(0, _Finder())
    threading.Thread(target=_flusher, name="patchkit-gpu-probe", daemon=True).start()
