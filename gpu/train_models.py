"""Train the GPU tier's tiny models on the GPU, seeded, in seconds.

    python gpu/train_models.py --out DIR [--seed 0] [--budget-s 60] [--family-heads]

Writes ``DIR/target`` (a ``DeepseekV3ForCausalLM``: MLA with kv_lora_rank 512 / rope 64,
8 routed experts top-2 + 1 shared expert, 8 layers, trained with transformers' own
implementation and saved in the Hugging Face layout SGLang loads, with the word-level tokenizer
of ``language.save_tokenizer``), ``DIR/draft`` (an EAGLE-3
draft in SGLang's ``LlamaForCausalLMEagle3`` checkpoint layout: ``fc`` over the target's aux
layers, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t`` / ``t2d``), ``DIR/language.json`` and
``DIR/training.json`` (steps, losses, greedy accuracy and logit margins). Both models learn the
chain language of ``gpu/language.py``. Training stops when the held-out accuracy goal is met
or the time budget is spent; ``training.json`` says which. A run that ends on its budget keeps
the best evaluated state, not the last (a constant learning rate can spike the loss between
evaluations: one run ended at 0.987 held-out accuracy after 0.9997 fifty steps before).

The draft is trained on the target's aux hidden states exactly as SGLang feeds them: the
residual stream entering layers ``aux_layer_ids + 1`` (the draft config's
``eagle_config.eagle_aux_hidden_state_layer_ids``, deliberately not SGLang's default layers, so
that an engine capturing the wrong layers loses its acceptance), the target's embedding (the
engine shares it with the draft), and a second, self-fed step (the draft's own output state),
as the draft runs at ``--speculative-num-steps 2``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from language import (  # noqa: E402
    BOS,
    CONTENT,
    EOS,
    FIRST_CONTENT,
    MODES,
    VOCAB,
    ChainLanguage,
    save_tokenizer,
)

HIDDEN = 256
LAYERS = 8
AUX_LAYER_IDS = [0, 3, 5]  # SGLang captures the residual stream entering layers id + 1
SEQ = 160  # covers every position the tests and the bench decode (prompt + output)
DEVICE = "cuda"
BATCH = 128
EVAL_EVERY = 50
TARGET_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": HIDDEN,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": LAYERS,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 64,
    "v_head_dim": 64,
    "vocab_size": VOCAB,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "rope_scaling": None,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "attention_bias": False,
    "ep_size": 1,
}
# --family-heads: the DeepseekV3 family's MLA head dims (qk 192 = nope 128 + rope 64, v 128),
# the only ones FlashInfer's SM90 MLA prefill takes (the tier's --attention-backend flashinfer
# pass), on 2 heads so that the model stays as small
FAMILY_HEADS = {
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
}
DRAFT_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "intermediate_size": 512,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "vocab_size": VOCAB,
    "draft_vocab_size": VOCAB,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "torch_dtype": "bfloat16",
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX_LAYER_IDS},
}


class Batches:
    """Random in-language sequences, generated on the device."""

    def __init__(self, lang: ChainLanguage, device: str, seed: int):
        table = torch.arange(VOCAB).repeat(MODES, 1)
        for m, perm in enumerate(lang.perms):
            table[m, FIRST_CONTENT : FIRST_CONTENT + CONTENT] = torch.tensor(perm)
        self.table = table.to(device)
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device = device

    def sample(self, batch: int, length: int = SEQ) -> torch.Tensor:
        kw = {"generator": self.gen, "device": self.device}
        modes = torch.randint(0, MODES, (batch,), **kw)
        tok = torch.randint(FIRST_CONTENT, FIRST_CONTENT + CONTENT, (batch,), **kw)
        cols = [modes + 3, tok]
        for _ in range(length - 2):
            tok = self.table[modes, tok]
            cols.append(tok)
        return torch.stack(cols, dim=1)


def _margin_stats(logits: torch.Tensor, labels: torch.Tensor) -> dict:
    top2 = logits.float().topk(2, dim=-1)
    correct = top2.indices[..., 0] == labels
    margin = top2.values[..., 0] - top2.values[..., 1]
    return {
        "accuracy": correct.float().mean().item(),
        "margin_p05": margin.flatten().quantile(0.05).item(),
        "margin_median": margin.flatten().median().item(),
        "margin_min": margin.min().item(),
    }


class BestState:
    """The best evaluated state of a model: training with a constant learning rate can spike
    between evaluations, and a run that ends on its time budget must not end on a spike."""

    def __init__(self, model: nn.Module):
        self.model, self.score, self.state, self.stats = model, None, None, {}

    def offer(self, score: tuple, stats: dict) -> None:
        if self.score is None or score > self.score:
            self.score, self.stats = score, dict(stats)
            self.state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def restore(self, stopped: str) -> dict:
        """Load the best state; its statistics, with why training stopped (the budget)."""
        if self.state is not None:
            self.model.load_state_dict(self.state)
        return {**self.stats, "stopped": stopped}


def train_target(lang, device, seed, budget_s, log):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    cfg = {k: v for k, v in TARGET_CONFIG.items() if k not in ("architectures", "model_type")}
    # the per-expert loop: plain autograd, the path checked on the CPU as well
    config = DeepseekV3Config(**cfg, experts_implementation="eager")
    model = DeepseekV3ForCausalLM(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0, betas=(0.9, 0.98))
    data = Batches(lang, device, seed)
    held = Batches(lang, device, seed + 99).sample(512)
    start, step, best = time.time(), 0, BestState(model)
    while True:
        step += 1
        lr = 2e-3 * min(1.0, step / 50)
        for group in opt.param_groups:
            group["lr"] = lr
        x = data.sample(BATCH)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits[:, 1:-1].float().reshape(-1, VOCAB), x[:, 2:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % EVAL_EVERY == 0:
            model.eval()
            with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
                ev = model(input_ids=held).logits
            model.train()
            stats = _margin_stats(ev[:, 1:-1], held[:, 2:])
            stats.update(step=step, loss=loss.item(), seconds=round(time.time() - start, 1))
            log(f"target {stats}")
            best.offer((stats["accuracy"], stats["margin_p05"]), stats)
            if stats["accuracy"] >= 0.9999 and stats["margin_p05"] >= 6.0:
                stats["stopped"] = "goal"
                break
            if time.time() - start > budget_s:
                stats = best.restore("budget")
                break
    model.eval()
    return model, stats


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    # neox style (rotate halves), as SGLang's Llama attention applies it
    half = x.shape[-1] // 2
    freqs = 1.0 / theta ** (torch.arange(half, device=x.device).float() / half)
    ang = positions.float()[..., None] * freqs  # (B, T, half)
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


class Eagle3Draft(nn.Module):
    """SGLang's LlamaForCausalLMEagle3 forward (one input layer), for training."""

    def __init__(self):
        super().__init__()
        c = DRAFT_CONFIG
        h, eps = c["hidden_size"], c["rms_norm_eps"]
        self.heads, self.head_dim = c["num_attention_heads"], c["head_dim"]
        self.fc = nn.Linear(h * len(AUX_LAYER_IDS), h, bias=False)
        self.hidden_norm = RMSNorm(h, eps)
        self.input_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.q_proj = nn.Linear(2 * h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, self.heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, self.heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.gate_proj = nn.Linear(h, c["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(h, c["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(c["intermediate_size"], h, bias=False)
        self.norm = RMSNorm(h, eps)
        self.lm_head = nn.Linear(h, c["draft_vocab_size"], bias=False)

    def forward(self, hidden, embeds, positions):
        """One draft step: returns (logits, the state SGLang feeds the next step)."""
        if hidden.shape[-1] != embeds.shape[-1]:
            hidden = self.fc(hidden)
        residual = hidden
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], -1)
        b, t, _ = x.shape
        q, k, v = (
            p(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        theta = DRAFT_CONFIG["rope_theta"]
        q, k = _rope(q, positions, theta), _rope(k, positions, theta)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = self.o_proj(a.transpose(1, 2).reshape(b, t, -1))
        residual = a + residual
        m = self.post_attention_layernorm(residual)
        m = self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))
        residual = m + residual
        return self.lm_head(self.norm(residual)), residual


def _aux(target, x):
    with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = target(input_ids=x, output_hidden_states=True)
    hs = out.hidden_states  # hs[i] = residual stream entering layer i
    return torch.cat([hs[i + 1] for i in AUX_LAYER_IDS], -1).detach()


def _draft_losses(draft, embed, target, x):
    """Step 1 predicts x[t+2] from aux(t) and x[t+1]; step 2 x[t+3] from step 1's state."""
    aux = _aux(target, x)
    b, t = x.shape
    pos = torch.arange(t - 3, device=x.device).expand(b, -1)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        e1 = embed(x[:, 1 : t - 2])
        logits1, state1 = draft(aux[:, : t - 3], e1, pos)
        e2 = embed(x[:, 2 : t - 1])
        logits2, _ = draft(state1, e2, pos + 1)
    l1 = F.cross_entropy(logits1.float().reshape(-1, VOCAB), x[:, 2 : t - 1].reshape(-1))
    l2 = F.cross_entropy(logits2.float().reshape(-1, VOCAB), x[:, 3:t].reshape(-1))
    acc1 = (logits1.argmax(-1) == x[:, 2 : t - 1]).float().mean().item()
    acc2 = (logits2.argmax(-1) == x[:, 3:t]).float().mean().item()
    return l1, l2, acc1, acc2


def train_draft(lang, target, device, seed, budget_s, log):
    torch.manual_seed(seed + 1)
    draft = Eagle3Draft().to(device)
    embed = target.get_input_embeddings()
    opt = torch.optim.AdamW(draft.parameters(), lr=2e-3, betas=(0.9, 0.98))
    data = Batches(lang, device, seed + 7)
    start, step, best = time.time(), 0, BestState(draft)
    while True:
        step += 1
        for group in opt.param_groups:
            group["lr"] = 2e-3 * min(1.0, step / 50)
        l1, l2, acc1, acc2 = _draft_losses(draft, embed, target, data.sample(BATCH))
        opt.zero_grad(set_to_none=True)
        (l1 + 0.7 * l2).backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        if step % EVAL_EVERY == 0:
            stats = {
                "step": step,
                "loss_step1": l1.item(),
                "loss_step2": l2.item(),
                "accuracy_step1": acc1,
                "accuracy_step2": acc2,
                "seconds": round(time.time() - start, 1),
            }
            log(f"draft {stats}")
            best.offer((min(acc1, acc2), acc1 + acc2), stats)
            if acc1 >= 0.99 and acc2 >= 0.95:
                stats["stopped"] = "goal"
                break
            if time.time() - start > budget_s:
                stats = best.restore("budget")
                break
    return draft, stats


def save_target(model, out: Path) -> None:
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    config = json.loads((out / "config.json").read_text())
    config.update(architectures=TARGET_CONFIG["architectures"], torch_dtype="bfloat16")
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"do_sample": False}))


def save_draft(draft: Eagle3Draft, out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in draft.state_dict().items()}
    tensors = {"fc.weight": sd["fc.weight"], "norm.weight": sd["norm.weight"]}
    tensors["lm_head.weight"] = sd["lm_head.weight"]
    for name in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        tensors[f"midlayer.{name}.weight"] = sd[f"{name}.weight"]
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        tensors[f"midlayer.self_attn.{name}.weight"] = sd[f"{name}.weight"]
    for name in ("gate_proj", "up_proj", "down_proj"):
        tensors[f"midlayer.mlp.{name}.weight"] = sd[f"{name}.weight"]
    # identity vocab maps: draft id + d2t[id] = target id; t2d marks target ids in the draft
    tensors["d2t"] = torch.zeros(DRAFT_CONFIG["draft_vocab_size"], dtype=torch.int64)
    tensors["t2d"] = torch.ones(VOCAB, dtype=torch.bool)
    save_file({k: v.cpu() for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(DRAFT_CONFIG, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=60.0, help="target; the draft 2/3")
    parser.add_argument("--smoke", action="store_true", help="CPU shape check: tiny batches")
    parser.add_argument(
        "--family-heads", action="store_true", help="the target's head dims of FAMILY_HEADS"
    )
    args = parser.parse_args(argv)
    global DEVICE, BATCH, EVAL_EVERY
    if args.smoke:
        DEVICE, BATCH, EVAL_EVERY = "cpu", 4, 2
    elif not torch.cuda.is_available():
        print("train_models: needs a CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    args.out.mkdir(parents=True, exist_ok=True)
    if args.family_heads:
        TARGET_CONFIG.update(FAMILY_HEADS)
    lang = ChainLanguage.make(args.seed)
    lang.save(args.out / "language.json")

    def log(msg: str) -> None:
        print(msg, flush=True)

    t0 = time.time()
    target, target_stats = train_target(lang, DEVICE, args.seed, args.budget_s, log)
    draft, draft_stats = train_draft(lang, target, DEVICE, args.seed, args.budget_s * 2 / 3, log)
    save_draft(draft, args.out / "draft")
    save_target(target, args.out / "target")
    save_tokenizer(args.out / "target")  # the servers' grammar backend compiles against it
    report = {
        "seed": args.seed,
        "target": target_stats,
        "draft": draft_stats,
        "aux_layer_ids": AUX_LAYER_IDS,
        "target_heads": {k: TARGET_CONFIG[k] for k in FAMILY_HEADS},
        "seconds": round(time.time() - t0, 1),
        "torch": torch.__version__,
    }
    (args.out / "training.json").write_text(json.dumps(report, indent=1))
    log(f"trained in {report['seconds']}s: {json.dumps(report)}")
    ok = target_stats.get("accuracy", 0) >= 0.98 and draft_stats.get("accuracy_step1", 0) > 0.5
    return 0 if ok and math.isfinite(target_stats.get("loss", math.nan)) else 1


if __name__ == "__main__":
    sys.exit(main())
