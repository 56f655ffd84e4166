"""GPU tier of EAGLE-3 and ``--speculative-disable-batch-threshold``: real SGLang servers.

Needs an NVIDIA GPU and a line's stack (on the lent H200: ``make gpu-bundle`` and
``gpu/session.py``, docs/gpu.md); skips cleanly otherwise. One server per configuration of the
installed sglang's line, CUDA graphs on (``gpu/engines.py`` LINE_LABELS; a configuration of
another line is skipped with its reason). 0.5.12: baseline, EAGLE-3 spec v1 and v2, both with
``--speculative-disable-batch-threshold 8`` (re-enabled at <= 6). 0.5.17: baseline, EAGLE-3
(v2), the threshold (carried by upstream's adaptive runtime states), upstream's
``--speculative-adaptive`` with and without the zero-step draft extend, and the threshold as
an adaptive config. The models are the tiny trained ones of ``gpu/train_models.py`` (a
DeepseekV3 MLA + MoE target and an EAGLE-3 draft on its aux layers), so greedy decoding has
large margins and the draft is accepted.

Each server gets the same concurrency ramp, 1 -> 8 -> 48 -> 96 -> 160 -> 8 -> 1 closed-loop
workers of two requests each with staggered lengths, so a phase of 48 or more crosses the
threshold up and back down, and the phase of 160 runs batches above --cuda-graph-max-bs (128:
eager steps). The requests are of four kinds (``KIND_CYCLE``): greedy, greedy with the logprob
of each output token, sampled with a seed, and greedy under a regular expression
(``language.GRAMMAR_REGEX``, where the servers run the xgrammar backend). Checked per
configuration: no crash and no hang (timeouts); greedy outputs equal the baseline's token for
token (constrained ones up to the first token their grammar forces off the language) and their
logprobs the baseline's; sampled requests give their
length of tokens of the vocabulary; constrained ones only tokens their grammar allows; the KV
pool is back to its initial size after every phase; every target decode-class step is
CUDA-graph replayed, also after speculation resumes; each step's draft steps are what the
configuration's policy decides for its batch size (``gpu/steps.py``: the threshold's
hysteresis, an adaptive config's slots), with the draft work that kind of step runs; the
acceptance metrics book what the line books (0.5.12: speculative steps only; 0.5.17: steps
without drafts too, with no accepted drafts); one INFO line per switch.

Environment: ``PATCHKIT_GPU_MODELS`` (trained models; else trained here), ``PATCHKIT_GPU_LOGS``
(server logs and probe records; else a temporary folder), ``PATCHKIT_GPU_SERVERS``
(``label=url,...`` of servers already started by ``gpu/session.py``; else started here),
``PATCHKIT_GPU_ATTENTION_BACKEND`` (default ``triton``), ``PATCHKIT_GPU_SERVER_TIMEOUT``.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "gpu"))

import engines  # noqa: E402
import steps as decode  # noqa: E402
from language import ChainLanguage, grammar_allows  # noqa: E402

pytestmark = pytest.mark.gpu

RAMP = (1, 8, 48, 96, engines.MAX_RUNNING, 8, 1)
REQUESTS_PER_WORKER = 2
# request kinds by (worker + request) index: greedy half the time (the acceptance checks)
KIND_CYCLE = ("greedy", "logprob", "greedy", "sampled", "greedy", "grammar")
# |logprob - baseline's| of an output token: bf16 logits, another attention kernel
LOGPROB_TOLERANCE = 0.1
PHASE_TIMEOUT = 150.0  # per phase; each request also times out at REQUEST_TIMEOUT
REQUEST_TIMEOUT = 120.0
# every line's configurations; those not on the installed line are skipped (`ramps`)
ALL_LABELS = list(dict.fromkeys(la for labels in engines.LINE_LABELS.values() for la in labels))
SPEC_LABELS = [la for la in ALL_LABELS if engines.CONFIGS[la].spec]
# configurations that run steps without drafts: our flag, upstream's adaptive modes
POLICY_LABELS = [
    la for la in SPEC_LABELS
    if engines.CONFIGS[la].hysteresis() or engines.CONFIGS[la].slot_config()
]  # fmt: skip
# our flag: the configurations a sglang without the patch cannot start
THRESHOLD_LABELS = [la for la in SPEC_LABELS if engines.CONFIGS[la].threshold is not None]
V2_LABELS = [la for la in SPEC_LABELS if engines.CONFIGS[la].spec_v2]


def _gpu_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return "GPU" in out.stdout


def _stack_problem() -> str | None:
    for module in ("sglang", "sgl_kernel", "torch", "transformers"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    return None


def _has_threshold_flag() -> bool:
    probe = (
        "import dataclasses, sys; from sglang.srt.server_args import ServerArgs; "
        "names = {f.name for f in dataclasses.fields(ServerArgs)}; "
        "sys.exit(0 if 'speculative_disable_batch_threshold' in names else 3)"
    )
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def logs(tmp_path_factory) -> Path:
    path = os.environ.get("PATCHKIT_GPU_LOGS")
    return Path(path) if path else tmp_path_factory.mktemp("gpu-logs")


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Path:
    if not _gpu_present():
        pytest.skip("needs an NVIDIA GPU (nvidia-smi)")
    why = _stack_problem()
    if why:
        pytest.skip(why)
    given = os.environ.get("PATCHKIT_GPU_MODELS")
    out = Path(given) if given else tmp_path_factory.mktemp("models")
    if not (out / "target" / "model.safetensors").exists():
        subprocess.run(
            [sys.executable, str(ROOT / "gpu" / "train_models.py"), "--out", str(out)],
            check=True,
            timeout=900,
        )
    return out


@pytest.fixture(scope="session")
def language(models) -> ChainLanguage:
    return ChainLanguage.load(models / "language.json")


@pytest.fixture(scope="session")
def threshold_supported(models) -> bool:
    return _has_threshold_flag()


@pytest.fixture(scope="session")
def servers(models, logs, threshold_supported):
    attached = os.environ.get("PATCHKIT_GPU_SERVERS")
    if attached:
        yield engines.attach(attached, logs)
        return
    labels = engines.line_labels()
    if not threshold_supported:
        labels = [la for la in labels if la not in THRESHOLD_LABELS]
    started = engines.launch_all(
        labels,
        models,
        logs,
        os.environ.get("PATCHKIT_GPU_ATTENTION_BACKEND", "triton"),
        probe=True,
        timeout=float(os.environ.get("PATCHKIT_GPU_SERVER_TIMEOUT", "600")),
    )
    yield started
    for server in started.values():
        server.stop()


@dataclass
class Phase:
    concurrency: int
    used_before: int = 0
    used_after: int | None = None
    running_after: int | None = None
    events: tuple[int, int] = (0, 0)  # probe event index range of the phase


@dataclass
class Ramp:
    label: str
    line: str = "0.5.17"  # the installed sglang's line (engines.installed_line)
    outputs: dict[str, list[int]] = field(default_factory=dict)
    meta: dict[str, dict] = field(default_factory=dict)
    phase_of: dict[str, int] = field(default_factory=dict)
    phases: list[Phase] = field(default_factory=list)
    initial_used: int = 0
    events: list[tuple] = field(default_factory=list)
    log: str = ""


def _requests(language: ChainLanguage, phase: int, concurrency: int):
    """The ramp's requests: per worker, a list of (key, prompt, max_new_tokens)."""
    work = []
    for w in range(concurrency):
        items = []
        for j in range(REQUESTS_PER_WORKER):
            key = f"p{phase}-w{w}-r{j}"
            items.append((key, _prompt_of(language, key), _max_new_tokens(key)))
        work.append(items)
    return work


def _idle_usage(server: engines.Server, timeout: float = 60.0) -> tuple[int, int]:
    deadline = time.time() + timeout
    load = server.loads()
    while load.get("num_running_reqs", 0) + load.get("num_waiting_reqs", 0) and (
        time.time() < deadline
    ):
        time.sleep(0.5)
        load = server.loads()
    return int(load["num_used_tokens"]), int(load.get("num_running_reqs", 0))


def run_ramp(server: engines.Server, language: ChainLanguage) -> Ramp:
    ramp = Ramp(server.config.label, engines.installed_line())
    tag = f"{server.config.label}-{time.time_ns()}"
    # what the server did before this ramp (an attached server's earlier tests or
    # benchmark, requests cut off with a killed run) is not the ramp's: its records and
    # log lines are read from here on
    _idle_usage(server)
    server.set_probe(True)
    server.probe_flush()
    first_event, log_from = len(server.probe_events()), len(server.serving_text())
    # warm-up outside the phases: every request shape once
    server.generate(language.prompt(10**6, 8), 8, rid=f"{tag}-warm")
    ramp.initial_used, _ = _idle_usage(server)
    # grammar requests where the server runs a grammar backend (engines.grammar_backend)
    grammar = server.server_info().get("grammar_backend", "none") != "none"
    server.probe_flush()
    for p, concurrency in enumerate(RAMP):
        phase = Phase(concurrency, used_before=_idle_usage(server)[0])
        start_events = len(server.probe_events()) - first_event

        def worker(items, p=p):
            for key, prompt, n in items:
                if _kind(key) == "grammar" and not grammar:
                    continue
                out = server.generate(prompt, n, rid=f"{tag}-{key}", timeout=REQUEST_TIMEOUT,
                                      kind=_kind(key))  # fmt: skip
                ramp.outputs[key] = out["output_ids"]
                ramp.meta[key] = out.get("meta_info", {})
                ramp.phase_of[key] = p

        pool = concurrent.futures.ThreadPoolExecutor(concurrency)
        futures = [pool.submit(worker, items) for items in _requests(language, p, concurrency)]
        done, pending = concurrent.futures.wait(futures, timeout=PHASE_TIMEOUT)
        pool.shutdown(wait=not pending, cancel_futures=True)
        assert not pending, f"{ramp.label}: phase {p} (C={concurrency}) hung: {server.tail()}"
        for future in done:
            future.result()
        assert server.healthy(), f"{ramp.label}: unhealthy after phase {p}: {server.tail()}"
        phase.used_after, phase.running_after = _idle_usage(server)
        server.probe_flush()
        phase.events = (start_events, len(server.probe_events()) - first_event)
        ramp.phases.append(phase)
    ramp.events = server.probe_events()[first_event:]
    ramp.log = server.serving_text()[log_from:]
    if server.log.parent.is_dir():  # what the ramp saw, for reading after the run
        record = {"outputs": ramp.outputs, "phase_of": ramp.phase_of, "meta": ramp.meta}
        record["phases"] = [vars(phase) for phase in ramp.phases]
        (server.log.parent / f"ramp-{ramp.label}.json").write_text(json.dumps(record))
    return ramp


@pytest.fixture(scope="session")
def ramps(servers, language):
    """The ramp of each server, run on first use for every server of the line at once (each
    server its own ramp: the checks read each server's own steps, whatever the GPU's other
    load; serially with PATCHKIT_GPU_SERIAL_RAMPS=1). A ramp that failed fails the tests of
    its label only."""
    cache: dict[str, Ramp | BaseException] = {}
    line = engines.installed_line()
    serial = os.environ.get("PATCHKIT_GPU_SERIAL_RAMPS") == "1"

    def run(labels: list[str]) -> None:
        with concurrent.futures.ThreadPoolExecutor(max(1, len(labels))) as pool:
            futures = {la: pool.submit(run_ramp, servers[la], language) for la in labels}
        for label, future in futures.items():
            cache[label] = future.exception() or future.result()

    def get(label: str) -> Ramp:
        if label not in engines.LINE_LABELS[line]:
            pytest.skip(f"{label}: not a configuration of the installed sglang's line {line}")
        if label not in servers:
            pytest.skip(f"{label}: no server (the installed sglang lacks the threshold patch)")
        if label not in cache:
            line_servers = [la for la in servers if la in engines.LINE_LABELS[line]]
            run([label] if serial else [la for la in line_servers if la not in cache])
        if isinstance(cache[label], BaseException):
            raise cache[label]
        return cache[label]

    return get


def _steps(ramp: Ramp, lo: int = 0, hi: int | None = None) -> list[decode.Step]:
    """The target decode-class steps the probe saw (gpu/steps.py), of events [lo, hi)."""
    config = engines.CONFIGS.get(ramp.label)
    draft_tokens = config.steps + 1 if config else engines.STEPS + 1
    return decode.decode_steps(ramp.events[lo:hi], draft_tokens)


def _describe(ramp: Ramp, key: str, step: int) -> str:
    phase = ramp.phases[ramp.phase_of[key]]
    steps = _steps(ramp, *phase.events)
    sizes = [s.bs for s in steps]
    nodraft = sum(1 for s in steps if not s.speculative)
    return (
        f"{key}: first difference at output token {step}, phase C={phase.concurrency} "
        f"(target decode batch sizes {min(sizes, default=0)}..{max(sizes, default=0)}, "
        f"{len(steps) - nodraft} speculative / {nodraft} no-draft steps in the phase)"
    )


def _parts(key: str) -> tuple[int, int, int]:
    """(phase, worker, request) of a ramp request's key ``p<phase>-w<worker>-r<request>``."""
    p, w, r = (int(x[1:]) for x in key.split("-"))
    return p, w, r


def _index(key: str) -> int:
    p, w, r = _parts(key)
    return 1000 * p + REQUESTS_PER_WORKER * w + r


def _max_new_tokens(key: str) -> int:
    return 24 + (37 * _index(key)) % 73


def _kind(key: str) -> str:
    _, w, r = _parts(key)
    return KIND_CYCLE[(w + r) % len(KIND_CYCLE)]


def _greedy(outputs: dict[str, list[int]]) -> dict[str, list[int]]:
    return {key: out for key, out in outputs.items() if _kind(key) != "sampled"}


def _prompt_of(language: ChainLanguage, key: str) -> list[int]:
    n = _index(key)
    return language.prompt(n, 6 + n % 17)


def _decided(language: ChainLanguage, key: str, out: list[int]) -> int:
    """How many leading tokens of a greedy output the trained margins decide: all of them,
    but for a constrained request only those before the first the grammar forces off the
    language (from there the pick is among tokens the model ranks close together, and
    speculative and plain decoding may break a near tie differently, upstream's EAGLE-3 as
    much as the flag)."""
    if _kind(key) != "grammar":
        return len(out)
    rule = language.continue_(_prompt_of(language, key), len(out))
    return next((i for i, t in enumerate(rule) if not grammar_allows(t)), len(out))


def _mismatches(ramp: Ramp, reference: Ramp, language: ChainLanguage) -> list[str]:
    report = []
    for key, want in _greedy(reference.outputs).items():
        got = ramp.outputs.get(key)
        if got is None:
            report.append(f"{key}: no output")
            continue
        n = _decided(language, key, want)
        if n < len(want):
            got, want = got[:n], want[:n]
        if got == want:
            continue
        diffs = (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b)
        step = next(diffs, min(len(got), len(want)))
        rule = language.continue_(_prompt_of(language, key), step + 4)[step:]
        report.append(
            _describe(ramp, key, step)
            + f": got {got[step : step + 4]}, want {want[step : step + 4]}"
            + f" (the language: {rule})"
        )
    return report


# -- the baseline speaks the trained language ---------------------------------------------


def test_baseline_follows_the_trained_language(ramps, language, models):
    """Trained weights loaded and large margins: greedy output is the language's continuation."""
    ramp = ramps("baseline")
    total = correct = 0
    for key, out in _greedy(ramp.outputs).items():
        if _kind(key) == "grammar":  # the grammar bends half the language's tokens
            continue
        want = language.continue_(_prompt_of(language, key), len(out))
        total += len(out)
        correct += sum(a == b for a, b in zip(out, want, strict=False))
    training = json.loads((models / "training.json").read_text())
    assert correct / total >= 0.99, (
        f"baseline follows the language on {correct}/{total} tokens; training: {training}"
    )


# -- every configuration through the ramp -------------------------------------------------


@pytest.mark.parametrize("label", SPEC_LABELS)
def test_ramp_outputs_equal_baseline(ramps, label, language):
    reference, ramp = ramps("baseline"), ramps(label)
    assert "Traceback" not in ramp.log, ramp.log[-3000:]
    bad = _mismatches(ramp, reference, language)
    assert not bad, (
        f"{label}: {len(bad)} of {len(_greedy(reference.outputs))} greedy outputs differ:\n"
        + "\n".join(bad[:20])
    )


def _logprobs(ramp: Ramp, key: str) -> list[float]:
    return [entry[0] for entry in ramp.meta.get(key, {}).get("output_token_logprobs") or []]


@pytest.mark.parametrize("label", SPEC_LABELS)
def test_logprobs_equal_baselines(ramps, label):
    """A request asking for logprobs gets one per output token, the baseline's within
    LOGPROB_TOLERANCE, whether its step drafted, ran without drafts or ran eager."""
    reference, ramp = ramps("baseline"), ramps(label)
    keys = [key for key in reference.outputs if _kind(key) == "logprob"]
    assert keys and all(len(_logprobs(reference, k)) == len(reference.outputs[k]) for k in keys)
    bad = []
    for key in keys:
        got, want = _logprobs(ramp, key), _logprobs(reference, key)
        worst = max((abs(a - b) for a, b in zip(got, want, strict=False)), default=0.0)
        if len(got) != len(want) or worst > LOGPROB_TOLERANCE:
            bad.append(
                f"{key}: {len(got)} logprobs for {len(want)}, largest difference "
                f"{worst:.4f} (phase C={ramp.phases[ramp.phase_of[key]].concurrency})"
            )
    assert not bad, f"{label}: {len(bad)} of {len(keys)} requests:\n" + "\n".join(bad[:10])


@pytest.mark.parametrize("label", ALL_LABELS)
def test_sampled_requests_give_their_length_in_the_vocabulary(ramps, label, models):
    ramp = ramps(label)
    vocab = json.loads((models / "target" / "config.json").read_text())["vocab_size"]
    keys = [key for key in ramp.outputs if _kind(key) == "sampled"]
    assert keys, f"{label}: no sampled requests in the ramp"
    bad = [key for key in keys
           if len(ramp.outputs[key]) != _max_new_tokens(key)
           or not all(0 <= t < vocab for t in ramp.outputs[key])]  # fmt: skip
    assert not bad, f"{label}: sampled outputs off: {[(k, ramp.outputs[k][:8]) for k in bad[:5]]}"


@pytest.mark.parametrize("label", ALL_LABELS)
def test_constrained_requests_emit_what_their_grammar_allows(ramps, label):
    """Requests under ``language.GRAMMAR_REGEX`` (half the content tokens) emit only those:
    the grammar's mask reached every step, verify and steps without drafts alike (the
    language's own continuation breaks it within a few tokens); their tokens up to the first
    the grammar forces off the language equal the baseline's in
    ``test_ramp_outputs_equal_baseline``."""
    ramp = ramps(label)
    keys = [key for key in ramp.outputs if _kind(key) == "grammar"]
    if not keys:
        pytest.skip(f"{label}: no grammar backend (models without a tokenizer, or no xgrammar)")
    bad = [key for key in keys
           if not ramp.outputs[key] or not all(map(grammar_allows, ramp.outputs[key]))]  # fmt: skip
    shown = ", ".join(f"{k} {ramp.outputs[k][:8]}" for k in bad[:5])
    assert not bad, f"{label}: {len(bad)} of {len(keys)} constrained outputs off grammar: {shown}"


@pytest.mark.parametrize("label", ALL_LABELS)
def test_a_phase_runs_above_the_graph_sizes(ramps, label):
    """The widest phase's batches exceed --cuda-graph-max-bs: its steps run eagerly (the
    other checks then cover the eager decode, plain or without drafts, too)."""
    ramp = ramps(label)
    above = [s for s in _steps(ramp) if s.bs > engines.CUDA_GRAPH_MAX_BS]
    assert above, f"{label}: no step above batch size {engines.CUDA_GRAPH_MAX_BS}"
    assert not any(s.graph for s in above), f"{label}: a graph replayed above its sizes"


@pytest.mark.parametrize("label", ALL_LABELS)
def test_kv_pool_back_to_initial_after_each_phase(ramps, label):
    ramp = ramps(label)
    for phase in ramp.phases:
        assert phase.running_after == 0, f"{label}: C={phase.concurrency}: requests left running"
        assert phase.used_after == ramp.initial_used, (
            f"{label}: after phase C={phase.concurrency} the KV pool holds "
            f"{phase.used_after} tokens, {ramp.initial_used} before the ramp"
        )


@pytest.mark.parametrize("label", ALL_LABELS)
def test_decode_steps_replay_cuda_graphs(ramps, label):
    """Every target decode / verify step up to --cuda-graph-max-bs replays a CUDA graph, steps
    without drafts included (the threshold: DECODE graphs, 0.5.17's in its zero-step state;
    upstream's adaptive modes: the zero-step state's one-token TARGET_VERIFY graphs)."""
    ramp = ramps(label)
    steps = _steps(ramp)
    assert steps, f"{label}: the probe saw no target decode steps"
    eager = [(s.mode, s.bs) for s in steps if not s.graph and s.bs <= engines.CUDA_GRAPH_MAX_BS]
    assert not eager, (
        f"{label}: {len(eager)} of {len(steps)} target steps ran eagerly: {eager[:10]}"
    )
    modes = {s.mode for s in steps}
    want = {"DECODE"} if label == "baseline" else {"TARGET_VERIFY"}
    if label in POLICY_LABELS:
        want |= {engines.nodraft_mode(label)}
    assert modes == want, f"{label}: target decode modes {sorted(modes)}"


@pytest.mark.parametrize("label", POLICY_LABELS)
def test_verify_graphs_replayed_after_speculation_resumes(ramps, label):
    ramp = ramps(label)
    steps = _steps(ramp)
    first_nodraft = next((i for i, s in enumerate(steps) if not s.speculative), None)
    assert first_nodraft is not None, f"{label}: no step ran without drafts (threshold never fired)"
    after = [s for s in steps[first_nodraft:] if s.speculative]
    assert after, f"{label}: speculation never resumed after the first step without drafts"
    assert all(s.graph for s in after), f"{label}: verify steps ran eagerly after resuming"


@pytest.mark.parametrize("label", SPEC_LABELS)
def test_draft_steps_follow_the_policy(ramps, label):
    """Each step's draft steps are what the configuration decides for its batch size: the
    configured steps always without a policy; our flag: none above N until a batch of <= M
    (hysteresis, on the batch's own size); an adaptive config: one of the candidates of the
    slot the batch size pads to (exact for the threshold config, whose slots have one each)."""
    ramp = ramps(label)
    config = engines.CONFIGS[label]
    steps = _steps(ramp)
    assert steps, f"{label}: the probe saw no target decode steps"
    if config.hysteresis():
        bad = decode.hysteresis_mismatches(steps, *config.hysteresis())
    elif config.slot_config():
        bad = decode.slot_mismatches(steps, config.slot_config(), engines.CUDA_GRAPH_BS)
    else:
        bad = [f"step {i} at batch size {s.bs}: {s.drafts} draft steps"
               for i, s in enumerate(steps) if s.drafts != config.steps]  # fmt: skip
    assert not bad, f"{label}: {len(bad)} of {len(steps)} steps off the policy: {bad[:10]}"


@pytest.mark.parametrize("label", V2_LABELS)
def test_draft_work_matches_each_step(ramps, label):
    """Around a step with drafts the v2 worker drafts once and extends the draft once; a step
    without drafts drafts nothing and, after it, the threshold from 0.5.17 writes the draft's
    K/V alone, a configuration told so (``-full``) and upstream's adaptive mode extend the draft,
    and one told SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND runs nothing of the draft."""
    ramp = ramps(label)
    steps = _steps(ramp)
    if not any(e[0] in ("D", "E") for e in ramp.events):
        pytest.skip(f"{label}: no draft calls recorded (a probe older than its D/E records)")
    config = engines.CONFIGS[label]
    bad = decode.draft_work_mismatches(steps, config.zero_step_draft(ramp.line))
    assert not bad, f"{label}: {len(bad)} of {len(steps)} steps: {bad[:10]}"


@pytest.mark.parametrize("label", SPEC_LABELS)
def test_acceptance_metrics_book_what_the_line_books(ramps, label):
    """0.5.12 books the verify steps' requests only; 0.5.17 books every decode step of a
    speculative server, a step without drafts as its rows with no accepted draft (the
    reported accept length falls while speculation is off). The draft is accepted."""
    ramp = ramps(label)
    steps = _steps(ramp)
    books_nodraft = engines.BOOKS_STEPS_WITHOUT_DRAFTS[ramp.line]
    want_rows = sum(s.bs for s in steps if s.speculative or books_nodraft)
    booked = decode.bookings(ramp.events)
    booked_rows = sum(bs for bs, _, _ in booked)
    assert booked_rows == want_rows, (
        f"{label}: acceptance metrics booked {booked_rows} request-steps, the target ran "
        f"{want_rows} ({'all decode steps' if books_nodraft else 'verify steps with drafts'})"
    )
    if books_nodraft:
        nodraft = [(bs, correct) for bs, correct, stride in booked if stride == 1]
        assert sum(bs for bs, _ in nodraft) == sum(s.bs for s in steps if not s.speculative), (
            f"{label}: bookings of one draft token differ from the steps without drafts"
        )
        accepted = [(bs, correct) for bs, correct in nodraft if correct]
        assert not accepted, (
            f"{label}: steps without drafts booked accepted drafts (rows, drafts): {accepted[:10]}"
        )
    spec = [(bs, correct) for bs, correct, stride in booked if stride != 1]
    rows = sum(bs for bs, _ in spec)
    accept_length = (sum(correct for _, correct in spec) + rows) / max(rows, 1)
    # 1.0 means nothing accepted; the trained draft reaches ~3 with 2 steps
    assert accept_length >= 1.5, f"{label}: accept length {accept_length:.2f}"
    meta_verify = sum(m.get("spec_verify_ct", 0) for m in ramp.meta.values())
    assert meta_verify <= booked_rows, (
        f"{label}: per-request spec_verify_ct {meta_verify} > {booked_rows}"
    )


@pytest.mark.parametrize("label", ["eagle3-v1", "eagle3-v2"])
def test_aux_layers_selected_before_graph_capture(ramps, label):
    """The draft was trained on layers [0, 3, 5] (SGLang's default would be [2, 4, 5]).

    Verify steps are all graph replays, so a high acceptance there shows the graphs were
    captured with the draft's aux layers (upstream 0.5.12 selects them before capture).
    """
    ramp = ramps(label)
    steps = [s for s in _steps(ramp) if s.speculative and s.bs <= engines.CUDA_GRAPH_MAX_BS]
    assert steps and all(s.graph for s in steps)
    booked = decode.bookings(ramp.events)
    rows = sum(bs for bs, _, _ in booked)
    accept_length = (sum(correct for _, correct, _ in booked) + rows) / max(rows, 1)
    assert accept_length >= 1.5, f"{label}: accept length {accept_length:.2f} in graph replays"


# speculative steps after each resume whose acceptance is compared with the others'
RESUME_WINDOW = 5
KEEPS_DRAFT_KV = [
    la for la in POLICY_LABELS if engines.CONFIGS[la].zero_step_draft("0.5.17") != "skip"
]


@pytest.mark.parametrize("label", KEEPS_DRAFT_KV)
def test_acceptance_after_resume_is_continuous_speculations(ramps, label):
    """A step without drafts keeps the draft's KV history current, so speculative steps after
    speculation resumes accept at least 95 % of what the other speculative steps accept: the
    first RESUME_WINDOW of them where the draft extend ran (its top-k current too), the
    RESUME_WINDOW after the first where only the draft's K/V were written (the first drafts
    from a zero top-k; the draft extend after its verify makes the draft current).  (With the
    draft's work skipped, the first steps after a resume accept little:
    `eagle3-v2+threshold-skip` and `+adaptive-skip` show it, not asserted.)  Resumes are read
    from the bookings, so the line must book steps without drafts (0.5.14+)."""
    ramp = ramps(label)
    if not engines.BOOKS_STEPS_WITHOUT_DRAFTS[ramp.line]:
        pytest.skip(f"{label}: line {ramp.line} does not book its steps without drafts")
    cold = int(engines.CONFIGS[label].zero_step_draft(ramp.line) == "kv")
    booked = decode.bookings(ramp.events)
    after, steady = decode.acceptance_after_resume(booked, RESUME_WINDOW, cold)
    assert after[1] and steady[1], f"{label}: no speculative steps after a resume, or no others"
    rate, steady_rate = after[0] / after[1], steady[0] / steady[1]
    assert rate >= 0.95 * steady_rate, (
        f"{label}: {RESUME_WINDOW} steps after each resume (past the first {cold}) accept "
        f"{rate:.3f} of their drafts ({after[0]} of {after[1]}), continuous {steady_rate:.3f}"
    )


@pytest.mark.parametrize("label", THRESHOLD_LABELS)
def test_one_info_line_per_transition(ramps, label):
    ramp = ramps(label)
    offs, ons = decode.switches(_steps(ramp))
    disabled = re.findall(engines.DISABLED_RE, ramp.log)
    enabled = re.findall(engines.REENABLED_RE, ramp.log)
    assert offs >= 2 and ons >= 2, (
        f"{label}: the ramp crossed the threshold {offs}x up, {ons}x down"
    )
    assert (len(disabled), len(enabled)) == (offs, ons), (
        f"{label}: {len(disabled)} 'disabled' / {len(enabled)} 're-enabled' lines for "
        f"{offs} / {ons} switches"
    )
    assert all(int(bs) > engines.THRESHOLD for bs, _ in disabled)
    assert all(int(bs) <= engines.REENABLE for bs, _ in enabled)
