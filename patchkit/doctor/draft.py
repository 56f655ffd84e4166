"""`doctor draft`: check an EAGLE-3 draft checkpoint against the SGLang line that will load it.

Reads the draft's config.json and safetensors headers, the target's config.json and the line's
model code (see :mod:`patchkit.doctor.expected`); returns a :class:`DraftReport` of checks,
each with its status and the exact fix.  Nothing is printed here and no weight is loaded.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from patchkit.doctor.checkpoint import (
    SGLANG_ARCH,
    SPECULATORS_FLAGS,
    Checkpoint,
    claimed_rope,
    load_checkpoint,
    load_target_config,
    sglang_view,
)
from patchkit.doctor.expected import (
    CaptureResult,
    DraftExpectation,
    SourceTree,
    aux_ids_rule,
    derive_capture,
    derive_draft,
    graph_order,
)
from patchkit.doctor.interp import Config, Opaque
from patchkit.doctor.sources import ModelSource

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
INT_DTYPES = {"I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64"}
TORCH_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}
# Renamings between naming conventions, tried (and kept only when SGLang's real load_weights
# then loads every tensor): speculators and SGLang >= 0.5.12 call the decoder layer
# `layers.0`, SGLang's EAGLE-3 model up to 0.5.11 calls it `midlayer`.
CONVENTION_RENAMES = (("layers.0.", "midlayer."), ("midlayer.", "layers.0."))


@dataclass
class Check:
    id: str
    title: str
    status: str
    detail: str
    fix: str = ""


@dataclass
class DraftReport:
    """Every check of one draft against one target on one SGLang line."""

    draft: str
    target: str
    source: str
    patched: bool | None
    convention: str
    architecture: str
    checks: list[Check] = field(default_factory=list)
    rename: dict[str, str] = field(default_factory=dict)  # what --fix applies
    fixed_config: dict | None = None  # the config --fix writes (None: keep the draft's)
    capture: dict = field(default_factory=dict)

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, id: str, title: str, status: str, detail: str, fix: str = "") -> None:
        self.checks.append(Check(id, title, status, detail, fix))

    def to_json(self) -> dict:
        return {
            "draft": self.draft,
            "target": self.target,
            "sglang": {"source": self.source, "patched": self.patched},
            "convention": self.convention,
            "architecture": self.architecture,
            "ok": self.ok,
            "problems": len(self.problems),
            "checks": [asdict(c) for c in self.checks],
            "rename": self.rename,
            "capture": self.capture,
        }


def check_draft(draft: Path, target: Path, source: ModelSource) -> DraftReport:
    """Run every check of ``draft`` against the target config at ``target``."""
    ckpt = load_checkpoint(draft)
    target_cfg = load_target_config(target)
    tree = SourceTree(source)
    view = sglang_view(ckpt.config)
    report = DraftReport(
        str(draft), str(target), source.label, source.patched, ckpt.convention,
        str((view.get("architectures") or ["?"])[0]),
    )  # fmt: skip
    _check_format(report, ckpt, view)
    expectation = derive_draft(tree, view, ckpt.tensor_values())
    if expectation.refused:
        report.add(
            "model", "SGLang builds the draft model", FAIL,
            f"{expectation.architecture}: {expectation.refused}"
            + (f" ({expectation.refused_where})" if expectation.refused_where else ""),
            _refusal_fix(expectation),
        )  # fmt: skip
        return report
    report.add(
        "model", "SGLang builds the draft model", PASS,
        f"{expectation.architecture} from {expectation.module} "
        f"({len(expectation.params)} parameters)",
    )  # fmt: skip
    rename = _propose_rename(tree, view, ckpt, expectation)
    fixed = derive_draft(tree, view, ckpt.tensor_values(rename)) if rename else expectation
    _check_keys(report, ckpt, expectation, fixed, rename)
    _check_shapes(report, ckpt, fixed, rename)
    capture = _check_aux(report, tree, ckpt, view, target_cfg, fixed, rename)
    tcfg = capture.config if capture and capture.config is not None else _text_config(target_cfg)
    _check_vocab(report, ckpt, view, tcfg, fixed, rename)
    _check_hidden(report, view, tcfg, fixed)
    _check_heads_rope(report, ckpt, view, fixed)
    _check_rope_vs_target(report, fixed, tcfg)
    _check_dtype(report, ckpt, view, target_cfg)
    _check_flags(report, ckpt, view, fixed)
    report.rename = rename
    return report


# ---- config -------------------------------------------------------------------------------
def _check_format(report: DraftReport, ckpt: Checkpoint, view: dict) -> None:
    if ckpt.convention == "speculators":
        report.fixed_config = view
        report.add(
            "config", "config.json is in SGLang's layout", FAIL,
            "speculators layout (speculators_model_type "
            f"{ckpt.config.get('speculators_model_type')!r}, architectures "
            f"{ckpt.config.get('architectures')}): SGLang reads a flat LlamaConfig with "
            f"architectures [{SGLANG_ARCH}] and the aux layer ids under eagle_config; checks "
            "below use that converted config",
            "patchkit doctor draft ... --fix OUT writes the converted config.json",
        )  # fmt: skip
    else:
        report.add(
            "config",
            "config.json is in SGLang's layout",
            PASS,
            f"architectures {ckpt.config.get('architectures')}",
        )


def _refusal_fix(exp: DraftExpectation) -> str:
    if "no model class" in (exp.refused or "") or "not an EAGLE-3" in (exp.refused or ""):
        return f'set "architectures": ["{SGLANG_ARCH}"] in the draft\'s config.json'
    missing = re.search(r"has no '(\w+)'", exp.refused or "")
    if missing:
        return f'add "{missing.group(1)}" to the draft\'s config.json (the model code reads it)'
    return "change the draft's config so the model code accepts it (see the message)"


# ---- key names ----------------------------------------------------------------------------
def _propose_rename(
    tree: SourceTree, view: dict, ckpt: Checkpoint, exp: DraftExpectation
) -> dict[str, str]:
    """A renaming of the skipped names after which SGLang's load_weights loads every tensor
    and fills every parameter; tried against the real rules, kept only if it works."""
    skipped = [k for k, o in exp.outcomes.items() if o.skipped]
    if not skipped and not exp.unfilled():
        return {}
    best: dict[str, str] = {}
    best_score = (len(exp.unfilled()), len(skipped))
    for old, new in CONVENTION_RENAMES:
        candidate = {}
        for key in skipped:
            for prefix in ("", "model."):
                if key.startswith(prefix + old):
                    candidate[key] = prefix + new + key[len(prefix + old) :]
        if not candidate:
            continue
        trial = derive_draft(tree, view, ckpt.tensor_values(candidate))
        left = [k for k, o in trial.outcomes.items() if o.skipped]
        score = (len(trial.unfilled()), len(left))
        if score < best_score:
            best, best_score = candidate, score
    return best


def _summarise_rename(rename: dict[str, str]) -> str:
    pairs = sorted({(_stem(o, n)) for o, n in rename.items()})
    return ", ".join(f"{a}* -> {b}*" for a, b in pairs) + f" ({len(rename)} tensors)"


def _stem(old: str, new: str) -> tuple[str, str]:
    i = 0
    while i < min(len(old), len(new)) and old[-1 - i] == new[-1 - i]:
        i += 1
    a, b = old[: len(old) - i], new[: len(new) - i]
    if i and old[len(old) - i] == ".":  # keep the separator in the shown prefix
        a, b = a + ".", b + "."
    return a, b


def _check_keys(report, ckpt, exp: DraftExpectation, fixed: DraftExpectation, rename) -> None:
    fix_words = ""
    if rename and not fixed.unfilled():
        who = "the speculators" if ckpt.convention == "speculators" else "another"
        fix_words = f"names follow {who} convention; --fix OUT renames {_summarise_rename(rename)}"
    _check_expected_keys(report, exp, fixed, fix_words)
    _check_leftover_keys(report, exp, rename, fix_words)


def _check_expected_keys(report, exp: DraftExpectation, fixed: DraftExpectation, fix_words: str):
    """Every parameter the model builds is loaded from the checkpoint or supplied at runtime."""
    unfilled = exp.unfilled()
    if unfilled:
        report.add(
            "keys.expected", "every parameter SGLang builds is loaded", FAIL,
            f"{len(unfilled)} of {len(exp.params)} parameters keep their initial values "
            f"(SGLang loads without an error, acceptance ~0): {_few(unfilled)}",
            fix_words or f"the checkpoint lacks {_few(fixed.unfilled() or unfilled)}; "
            "retrain or export them",
        )  # fmt: skip
        return
    supplied = ", ".join(f"{p} ({w})" for p, w in exp.supplied.items()) or "none"
    report.add(
        "keys.expected", "every parameter SGLang builds is loaded", PASS,
        f"{len(exp.params)} parameters filled; supplied at runtime: {supplied}",
    )  # fmt: skip


def _check_leftover_keys(report, exp: DraftExpectation, rename, fix_words: str) -> None:
    """No tensor is dropped without a word (names load_weights skips by its own rule are
    listed, not failed)."""
    skipped = sorted(k for k, o in exp.outcomes.items() if o.skipped)
    if not skipped:
        by_rule = sorted(
            k
            for k, o in exp.outcomes.items()
            if o.skipped_by_rule and not (o.loads or o.consumed_as)
        )
        extra = f" ({', '.join(by_rule)} skipped by load_weights' own rule)" if by_rule else ""
        report.add(
            "keys.leftover", "no tensor is silently skipped", PASS,
            f"all {len(exp.outcomes)} tensors are used{extra}",
        )  # fmt: skip
        return
    left = [k for k in skipped if k not in rename]
    drop = f"drop or rename {_few(left)}: {exp.architecture} has no such parameter" if left else ""
    fix = "; ".join(part for part in (fix_words, drop) if part)  # fix_words: only with a rename
    report.add(
        "keys.leftover", "no tensor is silently skipped", FAIL,
        f"SGLang's load_weights skips {len(skipped)} tensor(s) without a word: {_few(skipped)}",
        fix,
    )  # fmt: skip


def _few(names: list[str], n: int = 4) -> str:
    names = list(names)
    shown = ", ".join(names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


# ---- shapes -------------------------------------------------------------------------------
def _check_shapes(report, ckpt: Checkpoint, fixed: DraftExpectation, rename) -> None:
    back = {v: k for k, v in rename.items()}
    bad = []
    for key, outcome in fixed.outcomes.items():
        info = ckpt.tensors[back.get(key, key)]
        for param, shard in outcome.loads:
            spec = fixed.params.get(param)
            if spec is None:
                continue
            want = spec.shards.get(shard) if (spec.shards and shard is not None) else spec.shape
            if want is None or any(d is Opaque for d in want):
                continue
            if tuple(info.shape) != tuple(want):
                bad.append(
                    f"{key} is {list(info.shape)}, {param}"
                    + (f"[{shard}]" if shard is not None else "")
                    + f" expects {list(want)}"
                )
    if bad:
        report.add(
            "shapes", "tensor shapes match the parameters SGLang builds", FAIL,
            f"{len(bad)} mismatch(es), loading stops with a shape error: {'; '.join(bad[:4])}",
            ("fc's input width is target_hidden_size (else hidden_size) x the aux layer count "
             "this line builds: see aux.width; " if any("fc.weight" in b for b in bad) else "")
            + "make the draft's config.json describe the checkpoint (hidden_size, "
            "intermediate_size, heads, head_dim, target_hidden_size, draft_vocab_size)",
        )  # fmt: skip
    else:
        report.add(
            "shapes",
            "tensor shapes match the parameters SGLang builds",
            PASS,
            "every loaded tensor fits its parameter",
        )


# ---- aux hidden states --------------------------------------------------------------------
AUX_CONFIG_TITLE = "SGLang reads the draft's aux layer ids"
AUX_WIDTH_TITLE = "fc input width = aux layers x target hidden"


def _check_aux(
    report, tree, ckpt, view, target_cfg, fixed: DraftExpectation, rename
) -> CaptureResult | None:
    rule = aux_ids_rule(tree)
    ids, readable = _check_aux_config(report, ckpt, view, rule)
    if not readable:
        return None
    capture = derive_capture(tree, target_cfg, ids)
    report.capture = {
        "layer_ids": ids, "captured": capture.layers, "chain": capture.chain,
        "rule": "input of layer i for each i captured (SGLang adds 1 to configured ids)",
    }  # fmt: skip
    if capture.error:
        report.add(
            "aux.capture",
            "the target captures aux hidden states",
            FAIL,
            capture.error,
            "use a line whose target class supports EAGLE-3 (the patched series adds it)",
        )
        return capture
    positions = list(capture.layers or [])
    unique = _check_aux_layers(report, capture, positions, ids, rule)
    if ids is not None:
        _check_graph_order(report, tree, target_cfg, positions)
    _check_aux_width(report, ckpt, fixed, rename, len(unique), _int(capture.config, "hidden_size"))
    return capture


def _check_aux_config(report, ckpt, view, rule: str) -> tuple[Any, bool]:
    """The configured aux layer ids, and whether SGLang can read them at all."""
    raw = view.get("eagle_config")
    eagle = raw if isinstance(raw, dict) else {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    top = ckpt.config.get("eagle_aux_hidden_state_layer_ids")
    if raw is not None and not isinstance(raw, dict):
        report.add(
            "aux.config", AUX_CONFIG_TITLE, FAIL,
            f"eagle_config is {type(raw).__name__}, not an object: SGLang ignores it and the "
            "target captures its default layers",
            '"eagle_config": {"eagle_aux_hidden_state_layer_ids": [...]} with the trained ids',
        )  # fmt: skip
    if ids is not None and not _int_list(ids):
        report.add(
            "aux.config", AUX_CONFIG_TITLE, FAIL,
            f"{rule} is {ids!r}, not a list of integers: SGLang fails when it sets the layers",
            "list the trained layer ids as integers, e.g. [1, 29, 57]",
        )  # fmt: skip
        return ids, False
    if ckpt.convention == "sglang" and top is not None and ids is None:
        report.add(
            "aux.config", AUX_CONFIG_TITLE, FAIL,
            f"eagle_aux_hidden_state_layer_ids {top} is at the top level; SGLang reads only "
            f"{rule}, so the target captures its default layers instead",
            f'move it: "eagle_config": {{"eagle_aux_hidden_state_layer_ids": {top}}}',
        )  # fmt: skip
    return ids, True


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    )


def _check_aux_layers(report, capture: CaptureResult, positions: list, ids, rule: str) -> list:
    """Check that every configured id names a layer the target has, once; return the unique
    captured positions."""
    layers = _int(capture.config, "num_hidden_layers")
    where = " -> ".join(capture.chain)
    source = f"{rule} = {ids}" if ids is not None else "none configured: the target's default"
    valid = [p for p in positions if isinstance(p, int) and 0 <= p < (layers or 0)]
    unique = sorted(set(valid))
    problems, fixes = [], []
    if layers is None:
        problems.append("the target config has no num_hidden_layers")
    out_of_range = [p for p in positions if p not in valid]
    if out_of_range and layers is not None:
        bad_ids = [p - 1 for p in out_of_range] if ids is not None else out_of_range
        problems.append(
            f"{'ids' if ids is not None else 'default positions'} {bad_ids} capture nothing: the "
            f"target ({where}) has layers 0..{layers - 1} and captures the input of layer id+1"
        )
        fixes.append(f"use ids in 0..{layers - 2}")
    if len(unique) != len(valid):
        dup = sorted({p for p in valid if valid.count(p) > 1})
        problems.append(
            f"duplicate ids (capture positions {dup}): the target captures {len(unique)} unique "
            f"layers, not {len(positions)}"
        )
        fixes.append("list each aux layer once")
    status = FAIL if problems else PASS
    detail = (
        f"{source}; {where} captures the input of layers {positions}"
        + (f" of {layers}" if layers else "")
        + ("; " + "; ".join(problems) if problems else "")
    )
    report.add(
        "aux.layers", "aux layer ids are captured by the target", status, detail, "; ".join(fixes)
    )
    return unique


def _check_aux_width(
    report, ckpt, fixed: DraftExpectation, rename, count: int, hidden: int | None
) -> None:
    """fc.weight must take one target hidden state per captured layer."""
    fc_key = next(
        (k for k, o in fixed.outcomes.items() for p, _ in o.loads if p.endswith("fc.weight")), None
    )
    if fc_key is None:
        report.add(
            "aux.width", AUX_WIDTH_TITLE, FAIL,
            "no tensor loads into fc.weight", "the checkpoint needs fc.weight",
        )  # fmt: skip
        return
    if hidden is None:
        report.add("aux.width", AUX_WIDTH_TITLE, SKIP, "target hidden_size unknown", "")
        return
    back = {v: k for k, v in rename.items()}
    width = ckpt.tensors[back.get(fc_key, fc_key)].shape[-1]
    want = count * hidden
    if width == want:
        report.add("aux.width", AUX_WIDTH_TITLE, PASS, f"{width} = {count} x {hidden}")
        return
    report.add(
        "aux.width", AUX_WIDTH_TITLE, FAIL,
        f"{fc_key} takes {width} inputs; the target feeds {count} x {hidden} = {want} "
        "(a mismatch hangs or crashes the server after the target has loaded)",
        _aux_width_fix(width, count, hidden),
    )  # fmt: skip


def _aux_width_fix(width: int, count: int, hidden: int) -> str:
    """Each cause the sizes allow: fc trained on another number of aux layers of this
    target's width, or on this number of layers of another target's width."""
    causes = []
    if hidden and width % hidden == 0:
        n = width // hidden
        causes.append(
            f"configure {n} aux layer ids the draft was trained on in eagle_config "
            f"({n} x {hidden} = {width})"
        )
    if count and width % count == 0 and width // count != hidden:
        other = width // count
        causes.append(
            f"the draft was trained on a target of hidden size {other} ({count} x {other} = "
            f"{width}): use it with that target, or retrain fc on this target's aux states "
            f"(width {hidden})"
        )
    if not causes:
        return f"retrain the draft on aux states of width {hidden} (the target's hidden_size)"
    if len(causes) == 1:
        return causes[0]
    return "the sizes fit two causes: " + "; or ".join(causes)


def _check_graph_order(report, tree, target_cfg: dict, positions: list) -> None:
    """Configured ids only reach decode steps if the runner sets them before graph capture;
    otherwise the graphs keep the target's default layers (the series fixes the order)."""
    order = graph_order(tree)
    title = "CUDA graphs capture the configured layers"
    if order.before is None:
        report.add("aux.graphs", title, SKIP, order.detail)
        return
    if order.before:
        report.add("aux.graphs", title, PASS, order.detail)
        return
    defaults = derive_capture(tree, target_cfg, None).layers
    if defaults == positions:
        report.add("aux.graphs", title, PASS, f"{order.detail}; the ids equal the defaults")
        return
    report.add(
        "aux.graphs", title, FAIL,
        f"{order.detail}: decode steps replayed from CUDA graphs capture the default layers "
        f"{defaults}, prefill the configured {positions} (acceptance collapses)",
        "use the patched line (it sets the layers before graph capture), or ids whose +1 are "
        f"the defaults {defaults}, or --disable-cuda-graph",
    )  # fmt: skip


def _text_config(target_cfg: dict) -> Config:
    """Without a capture to say which model holds the text layers: a multimodal config's
    ``text_config`` (the Hugging Face convention), else the config itself."""
    text = target_cfg.get("text_config")
    return Config(text if isinstance(text, dict) else target_cfg, name="target config")


def _int(cfg: Config | None, name: str) -> int | None:
    if cfg is None:
        return None
    try:
        value = cfg.get(name)
    except AttributeError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ---- vocabulary ---------------------------------------------------------------------------
def _check_vocab(
    report, ckpt: Checkpoint, view: dict, tcfg: Config, fixed: DraftExpectation, rename
) -> None:
    """Draft and target vocabularies and d2t (every problem found is named, not the first);
    t2d in a row of its own (`_check_t2d`)."""
    target_vocab = _int(tcfg, "vocab_size")
    vocab = view.get("vocab_size")
    draft_vocab = view.get("draft_vocab_size") or vocab
    problems, fixes, notes = [], [], []
    if target_vocab is None:
        report.add(
            "vocab",
            "draft and target vocabularies agree",
            SKIP,
            "the target config has no vocab_size",
        )
        return
    if vocab != target_vocab:
        problems.append(f"draft vocab_size {vocab} != target vocab_size {target_vocab}")
        fixes.append(f"set vocab_size {target_vocab} (the draft embeds target token ids)")
    d2t_key = next((k for k in ckpt.tensors if "d2t" in k), None)
    t2d_key = next((k for k in ckpt.tensors if "t2d" in k), None)
    if isinstance(draft_vocab, int) and draft_vocab < target_vocab and d2t_key is None:
        problems.append(
            f"draft_vocab_size {draft_vocab} < target {target_vocab} and no d2t: SGLang takes "
            "draft token ids for target ids (wrong tokens, acceptance ~0)"
        )
        fixes.append(
            "add the d2t tensor (draft id -> target id offsets) the draft was trained with"
        )
    mapped = None
    if d2t_key is not None:
        mapped = _check_d2t(ckpt, d2t_key, draft_vocab, target_vocab, problems, fixes, notes)
    if draft_vocab == target_vocab and d2t_key is None:
        notes.append("draft and target share one vocabulary")
    status = FAIL if problems else PASS
    detail = "; ".join(problems or notes) or f"vocab {vocab}, draft vocab {draft_vocab}"
    report.add(
        "vocab", "draft and target vocabularies agree (d2t/t2d)", status, detail, "; ".join(fixes)
    )
    if t2d_key is not None:
        _check_t2d(report, ckpt, t2d_key, d2t_key, mapped, target_vocab, fixed, rename)


def _check_d2t(
    ckpt: Checkpoint, d2t_key: str, draft_vocab, target_vocab: int,
    problems: list[str], fixes: list[str], notes: list[str],
) -> list[int] | None:  # fmt: skip
    """d2t must map each draft token to its own target token; findings go into ``problems``,
    ``fixes`` and ``notes``.  Returns the target ids d2t maps to (None: not an integer map)."""
    d2t_info = ckpt.tensors[d2t_key]
    d2t = ckpt.read_ints(d2t_key)
    if d2t_info.dtype not in INT_DTYPES or d2t is None:
        problems.append(f"{d2t_key} is {d2t_info.dtype}, not an integer tensor")
        fixes.append("store d2t as int64")
        return None
    if len(d2t) != draft_vocab:
        problems.append(f"{d2t_key} has {len(d2t)} entries, draft_vocab_size is {draft_vocab}")
        fixes.append("d2t needs one entry per draft token")
    mapped = [d + i for i, d in enumerate(d2t)]
    inside = [m for m in mapped if 0 <= m < target_vocab]
    if len(inside) != len(mapped):
        outside = next(m for m in mapped if not 0 <= m < target_vocab)
        problems.append(
            f"{d2t_key}[i]+i leaves the target vocabulary ({len(mapped) - len(inside)} entries, "
            f"e.g. {outside})"
        )
        fixes.append("d2t holds target_id - draft_id per draft token")
    if len(set(inside)) != len(inside):
        problems.append(f"{d2t_key} maps two draft tokens to one target token")
        fixes.append("rebuild d2t from the draft vocabulary")
    notes.append(f"d2t maps {len(d2t)} draft tokens into {target_vocab}")
    return mapped


T2D_TITLE = "t2d marks the target tokens d2t maps to"


def _check_t2d(
    report, ckpt: Checkpoint, t2d_key: str, d2t_key: str | None, mapped: list[int] | None,
    target_vocab: int, fixed: DraftExpectation, rename,
) -> None:  # fmt: skip
    """t2d (one boolean per target token) must mark exactly what d2t maps to.  When the line's
    load_weights never reads t2d, a disagreement cannot hurt this line: a warning that says so."""
    outcome = fixed.outcomes.get(rename.get(t2d_key, t2d_key))
    ignored = outcome is not None and not (outcome.loads or outcome.consumed_as)
    t2d = ckpt.read_ints(t2d_key)
    problems, fixes = [], []
    if t2d is None or len(t2d) != target_vocab:
        problems.append(
            f"{t2d_key} has {len(t2d) if t2d is not None else '?'} entries, target vocab is "
            f"{target_vocab}"
        )
        fixes.append("t2d needs one boolean per target token")
    elif mapped is not None:
        drafted = {m for m in mapped if 0 <= m < target_vocab}
        if {i for i, v in enumerate(t2d) if v} != drafted:
            problems.append(f"{t2d_key} and {d2t_key} disagree on which target tokens are drafted")
            fixes.append("rebuild t2d from d2t (t2d[d2t[i]+i] = True)")
    unread = f"this line's {fixed.architecture}.load_weights never reads {t2d_key}"
    if not problems:
        detail = f"{sum(1 for v in t2d if v)} target tokens marked" + (
            f" ({unread})" if ignored else ""
        )
        report.add("vocab.t2d", T2D_TITLE, PASS, detail)
    elif ignored:
        report.add(
            "vocab.t2d", T2D_TITLE, WARN,
            f"{'; '.join(problems)}; {unread}, so SGLang is unaffected (other engines may read it)",
            f"{'; '.join(fixes)} for engines that read it",
        )  # fmt: skip
    else:
        report.add("vocab.t2d", T2D_TITLE, FAIL, "; ".join(problems), "; ".join(fixes))


# ---- hidden, heads, rope, dtype, flags ----------------------------------------------------
def _check_hidden(report, view: dict, tcfg: Config, fixed: DraftExpectation) -> None:
    hidden = view.get("hidden_size")
    target_hidden = _int(tcfg, "hidden_size")
    claimed = view.get("target_hidden_size")
    if target_hidden is None:
        report.add("hidden", "hidden sizes agree", SKIP, "the target config has no hidden_size")
        return
    if claimed is not None and claimed != target_hidden:
        report.add(
            "hidden",
            "hidden sizes agree",
            FAIL,
            f"target_hidden_size {claimed} but the target's hidden_size is {target_hidden}",
            f"set target_hidden_size {target_hidden} "
            f"(and retrain fc if it was trained on {claimed})",
        )
    elif claimed is None and hidden != target_hidden:
        report.add(
            "hidden",
            "hidden sizes agree",
            FAIL,
            f"draft hidden_size {hidden} != target {target_hidden} and no target_hidden_size: "
            f"SGLang sizes fc for aux states of width {hidden}",
            f"set target_hidden_size {target_hidden}",
        )
    else:
        shared = (
            "embedding shared with the target"
            if any("embed" in p for p in fixed.supplied)
            else "draft keeps its own embedding"
        )
        report.add(
            "hidden",
            "hidden sizes agree",
            PASS,
            f"draft {hidden}, target {target_hidden}; {shared}",
        )


def _check_heads_rope(report, ckpt: Checkpoint, view: dict, fixed: DraftExpectation) -> None:
    heads, kv = (
        view.get("num_attention_heads"),
        view.get("num_key_value_heads", view.get("num_attention_heads")),
    )
    hidden, head_dim = view.get("hidden_size"), view.get("head_dim")
    if not isinstance(heads, int) or not isinstance(kv, int) or kv <= 0 or heads % kv:
        report.add(
            "heads",
            "attention heads are consistent",
            FAIL,
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}",
            "fix num_key_value_heads in the draft's config.json",
        )
    else:
        dim = head_dim or (hidden // heads if isinstance(hidden, int) else "?")
        report.add(
            "heads",
            "attention heads are consistent",
            PASS,
            f"{heads} heads, {kv} kv heads, head_dim {dim}",
        )
    claimed = claimed_rope(ckpt.config)
    used = fixed.ropes[0] if fixed.ropes else None
    if used is None:
        report.add(
            "rope", "rope settings reach SGLang", SKIP, "the draft model builds no rotary embedding"
        )
        return
    got_theta, got_scaling = used.get("base"), _scaling(used.get("rope_scaling"))
    want_theta = claimed["rope_theta"] if claimed["rope_theta"] is not None else got_theta
    want_scaling = _scaling(claimed["rope_scaling"])
    if got_theta != want_theta or got_scaling != want_scaling:
        report.add(
            "rope",
            "rope settings reach SGLang",
            FAIL,
            f"the draft claims rope_theta {want_theta}, scaling {want_scaling}; this line's "
            f"code builds rope with base {got_theta}, scaling {got_scaling}",
            f'set "rope_theta": {want_theta}'
            + (f', "rope_scaling": {want_scaling}' if want_scaling else "")
            + " at the top level of config.json (--fix writes it)",
        )
    else:
        report.add(
            "rope", "rope settings reach SGLang", PASS, f"base {got_theta}, scaling {got_scaling}"
        )


def _check_rope_vs_target(report, fixed: DraftExpectation, tcfg: Config) -> None:
    """The draft sees the target's positions: a rope cache shorter than the target's context,
    or another base than the target's, is worth a look (a warning: drafts may differ)."""
    used = fixed.ropes[0] if fixed.ropes else None
    if used is None:
        return
    target_theta = _number(tcfg, "rope_theta")
    target_len = _int(tcfg, "max_position_embeddings")
    length = used.get("max_position")
    notes = []
    if isinstance(length, int) and target_len is not None and length < target_len:
        notes.append(
            f"the draft's rope covers {length} positions, the target {target_len}: longer "
            "requests index past the draft's rope cache"
        )
    if target_theta is not None and used.get("base") not in (None, target_theta):
        notes.append(f"rope base {used.get('base')} vs the target's {target_theta}")
    if notes:
        report.add(
            "rope.target", "draft rope covers the target's positions", WARN, "; ".join(notes),
            f"set max_position_embeddings >= {target_len} if the draft was trained for it",
        )  # fmt: skip
    else:
        report.add(
            "rope.target", "draft rope covers the target's positions", PASS,
            f"{length} positions" + (f", target {target_len}" if target_len else ""),
        )  # fmt: skip


def _number(cfg: Config | None, name: str) -> float | None:
    if cfg is None:
        return None
    try:
        value = cfg.get(name)
    except AttributeError:
        return None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _scaling(value: Any) -> Any:
    if value is Opaque or not isinstance(value, dict):
        return None if value is Opaque else value
    kept = {
        k: v
        for k, v in value.items()
        if k not in ("rope_theta", "original_max_position_embeddings")
    }
    if kept.get("rope_type", kept.get("type", "default")) == "default" and len(kept) <= 1:
        return None
    return kept


def _check_dtype(report, ckpt: Checkpoint, view: dict, target_cfg: dict) -> None:
    floats = sorted({t.dtype for t in ckpt.tensors.values() if t.dtype in FLOAT_DTYPES})
    claimed = (
        view.get("torch_dtype")
        or view.get("dtype")
        or ckpt.config.get("torch_dtype")
        or ckpt.config.get("dtype")
    )
    text_cfg = (
        target_cfg.get("text_config") if isinstance(target_cfg.get("text_config"), dict) else {}
    )
    target_dtype = (
        target_cfg.get("torch_dtype")
        or target_cfg.get("dtype")
        or text_cfg.get("torch_dtype")
        or text_cfg.get("dtype")
    )
    if len(floats) > 1:
        report.add(
            "dtype",
            "one floating dtype",
            FAIL,
            f"the draft mixes {', '.join(floats)}",
            "save every weight in one dtype (the target's)",
        )
        return
    got = floats[0] if floats else None
    if claimed and TORCH_DTYPES.get(str(claimed)) not in (None, got):
        report.add(
            "dtype",
            "one floating dtype",
            FAIL,
            f"config.json says {claimed}, the tensors are {got}",
            f'set "torch_dtype": "{_torch_name(got)}" in config.json',
        )
    elif target_dtype and TORCH_DTYPES.get(str(target_dtype)) not in (None, got):
        report.add(
            "dtype",
            "one floating dtype",
            WARN,
            f"draft tensors are {got}, the target runs in {target_dtype}; SGLang casts the "
            "draft at load (fine), but check it was trained in a compatible dtype",
        )
    else:
        report.add(
            "dtype",
            "one floating dtype",
            PASS,
            f"{got}" + (f", target {target_dtype}" if target_dtype else ""),
        )


def _torch_name(code: str | None) -> str:
    return next((k for k, v in TORCH_DTYPES.items() if v == code), str(code))


def _check_flags(report, ckpt: Checkpoint, view: dict, fixed: DraftExpectation) -> None:
    claims = {k: view.get(k, ckpt.config.get(k)) for k in SPECULATORS_FLAGS}
    set_true = [k for k, v in claims.items() if v]
    ignored = [k for k in set_true if not fixed.reads_config(k)]
    if ignored:
        report.add(
            "flags", "behaviour flags are honoured (norm_before_residual, ...)", FAIL,
            f"the draft was built with {', '.join(f'{k}=true' for k in ignored)}, which this "
            f"line's {fixed.architecture} never reads: it would run different math than trained",
            "use a line whose EAGLE-3 model implements it, or retrain with it false",
        )  # fmt: skip
    else:
        honoured = ", ".join(set_true) or "none set"
        report.add(
            "flags",
            "behaviour flags are honoured (norm_before_residual, ...)",
            PASS,
            f"flags set: {honoured}",
        )
    tie = bool(view.get("tie_word_embeddings"))
    lm_loaded = any(p.startswith("lm_head") for o in fixed.outcomes.values() for p, _ in o.loads)
    head_from_target = fixed.model_attrs.get("load_lm_head_from_target") is True
    if tie and any(k.endswith("lm_head.weight") for k in ckpt.tensors):
        report.add(
            "tying",
            "embedding / lm_head tying as the config claims",
            FAIL,
            "tie_word_embeddings is true but the checkpoint carries its own lm_head.weight "
            "(SGLang ignores it)",
            'set "tie_word_embeddings": false if the head was trained separately',
        )
    elif not tie and not lm_loaded and not head_from_target:
        report.add(
            "tying",
            "embedding / lm_head tying as the config claims",
            FAIL,
            "tie_word_embeddings is false and draft_vocab_size is set, yet no lm_head is loaded",
            "add lm_head.weight, or drop draft_vocab_size so SGLang takes the target's head",
        )
    else:
        how = (
            "tied to the embedding"
            if tie
            else ("taken from the target" if head_from_target else "the draft's own")
        )
        report.add(
            "tying", "embedding / lm_head tying as the config claims", PASS, f"lm_head: {how}"
        )
