"""`python -m pipeline.bench`: speed side by side, in one process, one run, interleaved per prompt.

Configurations (same prompts, same pair, same gamma): the target alone (our engine with the
`none` drafter, and Hugging Face greedy `generate`), our engine with the model drafter and
the n-gram drafter (fixed gamma and adaptive), Hugging Face assisted generation with the
same draft model (`num_assistant_tokens=gamma`, constant schedule, confidence threshold 0)
and with prompt lookup (`prompt_lookup_num_tokens=gamma`). It measures the step costs c and
v(k), computes the paper's analytic bound, profiles our per-round overhead, compares the
adaptive gamma with every fixed gamma, times a whole Beam job against the bare engine loop,
checks that every greedy output is identical, and writes BENCHMARKS.md plus a raw CSV.

Pairs: a synthetic Llama pair of realistic size built here (random weights; the target's
deeper layers are damped so an early-exit draft made of its first layer agrees with it: the
COSTS are those of a real 325M model, the ACCEPTANCE is whatever the damping gives), and a
disagreeing variant (a random draft: acceptance ~0, to check the back-off). The demo pair is
encoder-decoder now and is measured by `python -m pipeline.demo`.
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime as _dt
import gc
import json
import logging
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pipeline.flags import ArgumentParser
from specdec_core.cpu_speed import prepare_for_cpu, quantize_draft, recommended_threads
from specdec_core.drafters import ModelDrafter, NgramDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.gamma import AdaptiveGamma, Costs, expected_tokens

_LOG = logging.getLogger("pipeline.bench")


# --------------------------------------------------------------------------------------------
# Pairs


@dataclass(frozen=True)
class SynthSpec:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    draft_layers: int
    damp: float

    def key(self) -> str:
        return "-".join(str(x) for x in (self.vocab, self.hidden, self.intermediate, self.layers, self.heads,
                                          self.draft_layers, self.damp))


FULL_SYNTH = SynthSpec(vocab=8000, hidden=1024, intermediate=2816, layers=24, heads=16, draft_layers=1, damp=0.015)
QUICK_SYNTH = SynthSpec(vocab=2000, hidden=384, intermediate=1024, layers=8, heads=6, draft_layers=1, damp=0.02)
TINY_SYNTH = SynthSpec(vocab=300, hidden=64, intermediate=128, layers=3, heads=2, draft_layers=1, damp=0.02)


def _word_tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    words.update({f"t{i}": i for i in range(4, vocab)})
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=4096)


def _llama_config(spec: SynthSpec, layers: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                       num_hidden_layers=layers, num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
                       max_position_embeddings=2048, tie_word_embeddings=False, pad_token_id=0,
                       bos_token_id=1, eos_token_id=None)


def build_synthetic_pair(spec: SynthSpec, dest: Path) -> dict[str, Path]:
    """Save (once) target, early-exit draft and a disagreeing random draft under `dest`."""
    from transformers import LlamaForCausalLM

    dest = Path(dest) / f"synthetic-{spec.key()}"
    dirs = {"target": dest / "target", "draft": dest / "draft", "bad_draft": dest / "bad_draft"}
    if all((d / "config.json").exists() for d in dirs.values()):
        return dirs
    t0 = time.perf_counter()
    torch.manual_seed(0)
    target = LlamaForCausalLM(_llama_config(spec, spec.layers)).eval()
    with torch.no_grad():
        # Damping the residual-branch outputs of the deeper layers changes what the target
        # computes (so an early exit agrees with it), not what it costs.
        for layer in target.model.layers[spec.draft_layers:]:
            layer.self_attn.o_proj.weight.mul_(spec.damp)
            layer.mlp.down_proj.weight.mul_(spec.damp)
    draft = LlamaForCausalLM(_llama_config(spec, spec.draft_layers)).eval()
    missing = draft.load_state_dict(target.state_dict(), strict=False)
    assert not missing.missing_keys, missing.missing_keys
    torch.manual_seed(1)
    bad = LlamaForCausalLM(_llama_config(spec, spec.draft_layers)).eval()
    tok = _word_tokenizer(spec.vocab)
    for name, model in (("target", target), ("draft", draft), ("bad_draft", bad)):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        tmp = dirs[name].with_name(dirs[name].name + ".tmp")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, dirs[name])
    _LOG.info("built synthetic pair in %s (%.0f s)", dest, time.perf_counter() - t0)
    return dirs


def synthetic_prompts(spec: SynthSpec, n: int, length: int, seed: int = 0) -> list[tuple[str, str]]:
    """A mixed set: odd items are random token strings (no repetition to look up), even items
    repeat a short random pattern (easy for prompt lookup)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        if i % 2:
            ids = torch.randint(4, spec.vocab, (length,), generator=g).tolist()
            kind = "random"
        else:
            pat = torch.randint(4, spec.vocab, (7,), generator=g).tolist()
            ids = (pat * (length // 7 + 1))[:length]
            kind = "repetitive"
        out.append((kind, " ".join(f"t{t}" for t in ids)))
    return out


def demo_pair() -> str:
    """Why the demo pair is not benchmarked here: it is an encoder-decoder (T5) pair now, and this
    side-by-side runner (HF generate's output slicing, forward meters on input_ids) is causal-only.
    `python -m pipeline.demo` measures it against the target alone."""
    return ("the demo pair is an encoder-decoder T5 pair; this runner measures causal pairs only "
            "(`python -m pipeline.demo` prints its speed-ups)")


# --------------------------------------------------------------------------------------------
# Measuring


class ForwardMeter:
    """Counts and times a model's top-level forward calls (hooks; microseconds of cost)."""

    def __init__(self, *models: torch.nn.Module):
        self.calls: list[tuple[float, int]] = []  # (seconds, input tokens)
        self._t0 = 0.0
        self._handles = []
        for m in models:
            self._handles.append(m.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._handles.append(m.register_forward_hook(self._post, with_kwargs=True))

    def _pre(self, module, args, kwargs):
        self._t0 = time.perf_counter()
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._n = int(ids.shape[-1]) if ids is not None else 0

    def _post(self, module, args, kwargs, out):
        self.calls.append((time.perf_counter() - self._t0, self._n))

    def reset(self) -> None:
        self.calls = []

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


@dataclass
class Run:
    tokens: list[int]
    latency: float
    cpu: float
    stats: dict = field(default_factory=dict)


@dataclass
class Config:
    name: str
    family: str  # "ours" | "hf"
    kernels: str  # "prepacked" | "stock"
    drafter: str  # "none" | "model" | "ngram"
    gamma: str  # "4", "adaptive", "-"
    fn: Callable[[list[int]], tuple[list[int], dict]]
    target: torch.nn.Module
    draft: torch.nn.Module | None = None
    baseline: str = ""  # name of the target-alone config with the same kernels
    c: float = 0.0


def ours(target, drafter, gamma: int, max_new: int, policy=None):
    gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=gamma, max_new_tokens=max_new,
                               gamma_policy=policy)

    def fn(ids: list[int]) -> tuple[list[int], dict]:
        out = gen.generate(ids, seed=0)
        s = out.stats
        return out.tokens, {"drafted": s.draft_tokens, "accepted": s.accepted_tokens, "rounds": s.verify_steps,
                            "rejections": s.rejections, "draft_steps": s.draft_steps,
                            "drafts_per_round": " ".join(map(str, s.drafts)),
                            "mean_gamma": statistics.fmean(s.gammas) if s.gammas else 0.0}

    return fn


def hf(target, max_new: int, assistant=None, lookup: int | None = None, gamma: int = 4):
    if assistant is not None:
        gc = assistant.generation_config
        gc.num_assistant_tokens = gamma
        gc.num_assistant_tokens_schedule = "constant"
        gc.assistant_confidence_threshold = 0.0

    def fn(ids: list[int]) -> tuple[list[int], dict]:
        kwargs = {}
        if assistant is not None:
            kwargs["assistant_model"] = assistant
        if lookup:
            kwargs["prompt_lookup_num_tokens"] = lookup
        with torch.inference_mode():
            out = target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new,
                                  pad_token_id=0, eos_token_id=None, **kwargs)
        return out[0, len(ids):].tolist(), {}

    return fn


def timed_run(cfg: Config, ids: list[int], meter: ForwardMeter, draft_meter: ForwardMeter | None) -> Run:
    meter.reset()
    if draft_meter:
        draft_meter.reset()
    c0, t0 = time.process_time(), time.perf_counter()
    tokens, st = cfg.fn(ids)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    tcalls = list(meter.calls)
    dcalls = list(draft_meter.calls) if draft_meter else []
    prefill = tcalls[0][0] if tcalls else 0.0
    st.update({
        "target_calls": len(tcalls), "target_fwd_s": sum(t for t, _ in tcalls[1:]), "prefill_s": prefill,
        "draft_calls": len(dcalls), "draft_fwd_s": sum(t for t, _ in dcalls),
    })
    st.setdefault("rounds", max(len(tcalls) - 1, 0))
    if cfg.family == "hf" and cfg.drafter != "none":
        # HF's assisted loop has no separate prefill: its first target call scores the prompt
        # AND the first round's candidates. Every call is a round; the bare prompt pass is
        # taken from the target-alone runs of the same prompt (see summarize).
        st["rounds"] = len(tcalls)
        st["prefill_s"] = float("nan")
        st["accepted"] = max(len(tokens) - st["rounds"], 0)
        if cfg.drafter == "model":
            st["drafted"] = len(dcalls)
    return Run(tokens, wall, cpu, st)


def measure_costs_interleaved(engines: dict[str, SpeculativeGenerator], ids: list[int], ks: tuple[int, ...],
                              rounds: int) -> dict[str, Costs]:
    """Costs per engine, measured alternately so that load drift hits all equally (median of rounds)."""
    got: dict[str, list[Costs]] = {n: [] for n in engines}
    for eng in engines.values():  # warm-up: oneDNN builds a kernel per input shape on first use
        eng.measure_costs(ids, ks=ks, reps=1)
    for _ in range(rounds):
        for name, eng in engines.items():
            got[name].append(eng.measure_costs(ids, ks=ks, reps=1))
    out = {}
    for name, cs in got.items():
        out[name] = Costs(c=statistics.median(c.c for c in cs),
                          v={k: statistics.median(c.v[k] for c in cs) for k in ks})
    return out


def target_step_ms(model, ids: list[int], reps: int = 3) -> float:
    from specdec_core.decoder import CachedDecoder

    dec = CachedDecoder(model, ids)
    dec.forward(ids[:-1], 0)
    ts = []
    for _ in range(reps):
        dec.rollback(len(ids) - 1)
        t0 = time.perf_counter()
        dec.forward(ids, 1)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


# --------------------------------------------------------------------------------------------
# One pair


def load_pair(target_dir: Path, draft_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(target_dir)
    return target, draft, tok


def run_pair(label: str, target_dir: Path, draft_dir: Path, prompts: list[tuple[str, str]], args,
             full_set: bool = True, note: str = "") -> dict:
    target, draft, tok = load_pair(target_dir, draft_dir)
    target_p = prepare_for_cpu(copy.deepcopy(target))
    draft_p = prepare_for_cpu(copy.deepcopy(draft))
    n_params = sum(p.numel() for p in target.parameters())
    d_params = sum(p.numel() for p in draft.parameters())
    g, N = args.gamma, args.max_new_tokens
    ids_list = [tok(text)["input_ids"] for _, text in prompts]
    ks = tuple(range(2, args.max_gamma + 2))

    # Step costs, prepacked vs stock kernels, interleaved.
    t0 = time.perf_counter()
    cost_engines = {
        "prepacked": SpeculativeGenerator(target_p, ModelDrafter(draft_p), num_speculative_tokens=args.max_gamma),
        "stock": SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=args.max_gamma),
    }
    costs = measure_costs_interleaved(cost_engines, ids_list[0], ks, args.cost_rounds)
    _LOG.info("[%s] costs measured in %.0f s: prepacked c=%.3f v=%s | stock c=%.3f v=%s", label,
              time.perf_counter() - t0, costs["prepacked"].c, _fmt_v(costs["prepacked"]), costs["stock"].c,
              _fmt_v(costs["stock"]))

    draft_q = None
    configs: list[Config] = []

    def add(name, family, kernels, drafter, gamma, fn, tgt, drf=None, baseline="", c=0.0):
        configs.append(Config(name, family, kernels, drafter, str(gamma), fn, tgt, drf, baseline, c))

    cp, cs = costs["prepacked"].c, costs["stock"].c
    add("ours: target alone", "ours", "prepacked", "none", "-", ours(target_p, NoDrafter(), g, N), target_p)
    add("HF greedy", "hf", "stock", "none", "-", hf(target, N), target)
    add(f"ours: model g={g}", "ours", "prepacked", "model", g, ours(target_p, ModelDrafter(draft_p), g, N),
        target_p, draft_p, "ours: target alone", cp)
    add("ours: model adaptive", "ours", "prepacked", "model", "adaptive",
        ours(target_p, ModelDrafter(draft_p), args.max_gamma, N, AdaptiveGamma(costs["prepacked"],
                                                                                max_gamma=args.max_gamma)),
        target_p, draft_p, "ours: target alone", cp)
    add(f"HF assisted g={g}", "hf", "stock", "model", g, hf(target, N, assistant=draft, gamma=g), target, draft,
        "HF greedy", cs)
    if full_set:
        add("ours: model adaptive, no early stop", "ours", "prepacked", "model", "adaptive",
            ours(target_p, ModelDrafter(draft_p), args.max_gamma, N,
                 AdaptiveGamma(costs["prepacked"], max_gamma=args.max_gamma, early_stop=False)),
            target_p, draft_p, "ours: target alone", cp)
    add(f"ours: ngram g={g}", "ours", "prepacked", "ngram", g, ours(target_p, NgramDrafter(), g, N), target_p,
        None, "ours: target alone", 0.0)
    ngram_costs = Costs(c=0.001, v=costs["prepacked"].v)
    add("ours: ngram adaptive", "ours", "prepacked", "ngram", "adaptive",
        ours(target_p, NgramDrafter(), args.max_gamma, N, AdaptiveGamma(ngram_costs, max_gamma=args.max_gamma)),
        target_p, None, "ours: target alone", 0.0)
    add(f"HF prompt lookup g={g}", "hf", "stock", "ngram", g, hf(target, N, lookup=g), target, None, "HF greedy")
    if full_set:
        add("ours: target alone, stock kernels", "ours", "stock", "none", "-", ours(target, NoDrafter(), g, N),
            target)
        add(f"ours: model g={g}, stock kernels", "ours", "stock", "model", g,
            ours(target, ModelDrafter(draft), g, N), target, draft, "ours: target alone, stock kernels", cs)
        for gg in args.sweep:
            if gg != g:
                add(f"ours: model g={gg}", "ours", "prepacked", "model", gg,
                    ours(target_p, ModelDrafter(draft_p), gg, N), target_p, draft_p, "ours: target alone", cp)
        for gg in args.ngram_sweep:
            if gg != g:
                add(f"ours: ngram g={gg}", "ours", "prepacked", "ngram", gg, ours(target_p, NgramDrafter(), gg, N),
                    target_p, None, "ours: target alone", 0.0)
        if args.int8_draft:
            draft_q = quantize_draft(copy.deepcopy(draft))
            if draft_q is not draft:
                costs["int8 draft"] = measure_costs_interleaved(
                    {"q": SpeculativeGenerator(target_p, ModelDrafter(draft_q), num_speculative_tokens=args.max_gamma)},
                    ids_list[0], ks, 1)["q"]
                add("ours: int8 draft adaptive", "ours", "prepacked", "model", "adaptive",
                    ours(target_p, ModelDrafter(draft_q), args.max_gamma, N,
                         AdaptiveGamma(costs["int8 draft"], max_gamma=args.max_gamma)),
                    target_p, draft_q, "ours: target alone", costs["int8 draft"].c)
    for c in configs:
        if not c.baseline:
            c.baseline = c.name

    meters: dict[int, ForwardMeter] = {}
    for m in {id(x): x for c in configs for x in (c.target, c.draft) if x is not None}.values():
        meters[id(m)] = ForwardMeter(m)

    # Warm-up (first calls allocate, and oneDNN builds its kernels), then interleaved runs.
    for c in configs:
        c.fn(ids_list[0][:8] if len(ids_list[0]) > 8 else ids_list[0])

    rows = []
    for pi, ((kind, _text), ids) in enumerate(zip(prompts, ids_list, strict=True)):
        order = configs[pi % len(configs):] + configs[: pi % len(configs)]  # rotate: no config always first
        runs: dict[str, Run] = {}
        for c in order:
            la = os.getloadavg()[0]
            r = timed_run(c, ids, meters[id(c.target)], meters[id(c.draft)] if c.draft is not None else None)
            runs[c.name] = r
            rows.append({"pair": label, "config": c.name, "family": c.family, "kernels": c.kernels,
                         "drafter": c.drafter, "gamma": c.gamma, "prompt": pi, "prompt_kind": kind,
                         "prompt_tokens": len(ids), "new_tokens": len(r.tokens), "latency_s": r.latency,
                         "cpu_s": r.cpu, "cpu_util": r.cpu / r.latency, "load1": la, **r.stats})
        ref = runs["ours: target alone"].tokens
        for row in rows[-len(configs):]:
            row["equal"] = runs[row["config"]].tokens == ref
            if not row["equal"]:
                at = next((i for i, (a, b) in enumerate(zip(runs[row["config"]].tokens, ref, strict=False))
                           if a != b), min(len(ref), len(runs[row["config"]].tokens)))
                row["diverge_at"] = at
                row["tie_gap"] = top2_gap(target, ids + ref[:at])
        _LOG.info("[%s] prompt %d/%d (%s) done; load %.2f", label, pi + 1, len(prompts), kind, os.getloadavg()[0])

    for m in meters.values():
        m.remove()
    return {"label": label, "note": note, "rows": rows, "configs": configs, "costs": costs,
            "params": n_params, "draft_params": d_params, "gamma": g, "max_new": N,
            "step_ms": target_step_ms(target_p, ids_list[0]), "prompts": len(prompts),
            "prompt_tokens": statistics.fmean(len(x) for x in ids_list)}


@torch.inference_mode()
def top2_gap(target, seq: list[int]) -> float:
    """The target's top-2 logit gap (full recompute, stock kernels) where two outputs first
    differ: ~1e-5 means a floating-point near-tie between kernels, not a logic error."""
    top = target(torch.tensor([seq])).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


def invert_expected(e: float, g: int) -> float:
    """a such that E(a, g) = e (bisection; E grows with a)."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, g) < e else (lo, mid)
    return (lo + hi) / 2


def _fmt_v(costs: Costs) -> str:
    return " ".join(f"{k}:{v:.2f}" for k, v in sorted(costs.v.items()))


# --------------------------------------------------------------------------------------------
# Aggregation


def summarize(res: dict) -> list[dict]:
    rows, costs = res["rows"], res["costs"]
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["config"], []).append(r)
    out = []
    # Configurations without a separate prompt pass (HF assisted) get the median prompt-pass
    # time of the target-alone runs of the same prompt and kernels.
    pass_time: dict[tuple, list[float]] = {}
    for r in rows:
        if r["drafter"] == "none":
            pass_time.setdefault((r["prompt"], r["kernels"]), []).append(r["prefill_s"])
    for r in rows:
        if r["prefill_s"] != r["prefill_s"]:  # NaN
            r["prefill_s"] = statistics.median(pass_time[(r["prompt"], r["kernels"])])
    base_decode = {}
    for name, rs in by.items():
        tokens = sum(r["new_tokens"] for r in rs)
        lat = sum(r["latency_s"] for r in rs)
        dec = sum(r["latency_s"] - r["prefill_s"] for r in rs)
        base_decode[name] = (lat, dec, tokens)
    fastest_base = min((v[1] / v[2], k) for k, v in base_decode.items()
                       if next(c for c in res["configs"] if c.name == k).drafter == "none")
    for c in res["configs"]:
        rs = by[c.name]
        lat, dec, tokens = base_decode[c.name]
        blat, bdec, btok = base_decode[c.baseline]
        drafted = sum(r.get("drafted", 0) for r in rs)
        accepted = sum(r.get("accepted", 0) for r in rs)
        rounds = sum(r["rounds"] for r in rs)
        rej = sum(r.get("rejections", 0) for r in rs) if c.family == "ours" else None
        alpha = accepted / (accepted + rej) if rej is not None and accepted + rej else None
        if c.family == "hf" and c.drafter == "model" and rounds:
            # HF does not report rejections: invert E(a, g) = tokens per round (constant schedule).
            alpha = invert_expected(tokens / rounds, int(c.gamma))
            for r in rs:
                r["drafts_per_round"] = " ".join([c.gamma] * r["rounds"])
        kc = costs["stock" if c.kernels == "stock" else "prepacked"]
        if c.name.startswith("ours: int8"):
            kc = costs.get("int8 draft", kc)
        cc = kc.c if c.drafter == "model" else (0.0 if c.drafter == "ngram" else None)
        bound = g_used = None
        if alpha is not None and c.drafter != "none":
            # The paper's bound for the drafts actually proposed in each round (a fixed gamma
            # proposes g every round; n-gram lookup and the adaptive policy vary):
            # sum_r E(a, d_r) / sum_r (d_r c + v(d_r + 1)).
            k2 = Costs(c=cc, v=kc.v)
            ds = [int(x) for r in rs for x in str(r.get("drafts_per_round", "")).split()]
            if ds:
                bound = sum(expected_tokens(alpha, d) for d in ds) / sum(k2.round_cost(d) for d in ds)
                g_used = statistics.fmean(ds)
        speed = (bdec / btok) / (dec / tokens)
        tf = [r["target_fwd_s"] for r in rs]
        df = [r["draft_fwd_s"] for r in rs]
        overhead = dec - sum(tf) - sum(df)
        out.append({
            "config": c.name, "family": c.family, "kernels": c.kernels, "drafter": c.drafter, "gamma": c.gamma,
            "tokens": tokens, "tok_s": tokens / lat, "ms_tok": 1e3 * lat / tokens, "decode_ms_tok": 1e3 * dec / tokens,
            "acceptance": accepted / drafted if drafted else None, "alpha": alpha,
            "tokens_per_step": tokens / rounds if rounds else None,
            "mean_gamma": statistics.fmean(r.get("mean_gamma", 0) for r in rs)
            if c.family == "ours" and c.drafter != "none" else None,
            "c": cc, "speedup": speed, "speedup_total": (blat / btok) / (lat / tokens),
            "vs_fastest_target": fastest_base[0] / (dec / tokens), "baseline": c.baseline,
            "bound": bound, "bound_gamma": g_used, "efficiency": speed / bound if bound else None,
            "overhead_ms_round": 1e3 * overhead / rounds if rounds else None,
            "overhead_frac": overhead / dec if dec else None,
            "target_ms_round": 1e3 * sum(tf) / rounds if rounds else None,
            "draft_ms_round": 1e3 * sum(df) / rounds if rounds else None,
            "equal": all(r["equal"] for r in rs), "cpu_util": statistics.fmean(r["cpu_util"] for r in rs),
            "load1": statistics.fmean(r["load1"] for r in rs),
        })
    return out


# --------------------------------------------------------------------------------------------
# Beam job vs bare loop


def beam_overhead(target_dir: Path, draft_dir: Path, prompts: list[tuple[str, str]], args) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from specdec_core.loading import item_seed
    from specdec_core.text import GeneratorSpec, TextGenerator

    work = Path(tempfile.mkdtemp(prefix="specdec-bench-beam-"))
    ids = [f"p{i:03d}" for i in range(len(prompts))]
    pq.write_table(pa.table({"id": ids, "prompt": [t for _, t in prompts]}), work / "prompts.parquet")
    spec = GeneratorSpec(target_model=str(target_dir), draft_model=str(draft_dir), drafter="model",
                         num_speculative_tokens=args.gamma, max_new_tokens=args.max_new_tokens, device="cpu")

    def bare() -> tuple[float, float, list]:
        t0 = time.perf_counter()
        gen = TextGenerator.load(spec)
        load = time.perf_counter() - t0
        outs = [gen.generate(p, item_seed(0, i)) for i, (_, p) in zip(ids, prompts, strict=True)]
        return time.perf_counter() - t0, load, outs

    def job() -> tuple[float, list]:
        from pipeline.run import main

        out = work / f"out-{time.monotonic_ns()}"
        argv = ["--input", str(work / "prompts.parquet"), "--output", str(out), "--target_model", str(target_dir),
                "--draft_model", str(draft_dir), "--drafter", "model", "--num_speculative_tokens", str(args.gamma),
                "--max_new_tokens", str(args.max_new_tokens), "--device", "cpu"]
        t0 = time.perf_counter()
        rc = main(argv)
        wall = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"Beam job failed with exit code {rc}")
        table = pq.read_table([str(p) for p in sorted(work.glob(out.name + "-0*.parquet"))])
        return wall, table.to_pylist()

    la0 = os.getloadavg()[0]
    c0 = time.process_time()
    results = {"bare": [], "job": []}
    for _ in range(args.beam_reps):
        results["bare"].append(bare())
        results["job"].append(job())
    bare_wall = statistics.median(x[0] for x in results["bare"])
    bare_load = statistics.median(x[1] for x in results["bare"])
    bare_gen = statistics.median(sum(o["latency_s"] for o in x[2]) for x in results["bare"])
    job_wall = statistics.median(x[0] for x in results["job"])
    job_gen = statistics.median(sum(r["latency_s"] for r in x[1]) for x in results["job"])
    bare_texts = {i: o["generation"] for i, o in zip(ids, results["bare"][0][2], strict=True)}
    job_texts = {r["id"]: r["generation"] for r in results["job"][0][1]}
    return {"prompts": len(prompts), "bare_wall": bare_wall, "bare_load": bare_load, "bare_gen": bare_gen,
            "job_wall": job_wall, "job_gen": job_gen, "overhead_frac": (job_wall - bare_wall) / job_wall,
            "same_outputs": bare_texts == job_texts, "reps": args.beam_reps,
            "load1": (la0 + os.getloadavg()[0]) / 2,
            "cpu_util": (time.process_time() - c0) / max(sum(x[0] for x in results["bare"]) + job_wall
                                                         * args.beam_reps, 1e-9)}


# --------------------------------------------------------------------------------------------
# Thread / kernel experiments on v(k)


def kernel_experiments(target_dir: Path, ids: list[int], args) -> list[dict]:
    """v(k) and the 1-token step under several CPU settings, interleaved, same process."""
    from transformers import AutoModelForCausalLM

    stock = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    packed = prepare_for_cpu(copy.deepcopy(stock))
    packed_for_1 = prepare_for_cpu(copy.deepcopy(stock), pack_rows=1)
    packed_all = prepare_for_cpu(copy.deepcopy(stock), threshold_rows=1)
    ks = (2, 3, 4, 5, 9)
    engines = {"stock": stock, "prepacked for 8 rows, used at k>=4 (default)": packed,
               "prepacked for 1 row, used at k>=4": packed_for_1, "prepacked for 8 rows, used at all k": packed_all}
    threads_default = torch.get_num_threads()
    settings = [(name, nt) for nt in sorted({1, threads_default}) for name in engines]
    got: dict[tuple, list[tuple[float, Costs]]] = {s: [] for s in settings}
    for name, nt in settings:  # warm-up (oneDNN kernels are built per shape on first use)
        torch.set_num_threads(nt)
        SpeculativeGenerator(engines[name], NoDrafter(), num_speculative_tokens=max(ks) - 1).measure_costs(
            ids, ks=ks, reps=1)
    for _ in range(args.cost_rounds):
        for name, nt in settings:
            torch.set_num_threads(nt)
            eng = SpeculativeGenerator(engines[name], NoDrafter(), num_speculative_tokens=max(ks) - 1)
            t1 = target_step_ms(engines[name], ids, reps=2)
            got[(name, nt)].append((t1, eng.measure_costs(ids, ks=ks, reps=1)))
    torch.set_num_threads(threads_default)
    out = []
    for (name, nt), vals in got.items():
        out.append({"setting": f"{name}, {nt} thread{'s' if nt > 1 else ''}", "t1_ms": statistics.median(v[0]
                    for v in vals), **{f"v{k}": statistics.median(v[1].v[k] for v in vals) for k in ks}})
    return out


# --------------------------------------------------------------------------------------------
# Report


def _f(x, fmt="{:.2f}", none="–"):
    return none if x is None else fmt.format(x)


def machine() -> str:
    name = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} logical cores, {platform.system()} {platform.release()}"


def versions() -> str:
    import apache_beam
    import transformers

    return (f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
            f"apache-beam {apache_beam.__version__}")


def write_report(path: Path, csv_path: Path, results: list[dict], skipped: list[str], beam: dict | None,
                 kernels: list[dict] | None, argv: list[str], started: float, args) -> None:
    L: list[str] = []
    w = L.append
    w("# Benchmarks\n")
    w(f"Generated by `python -m pipeline.bench {shlex.join(argv)}` on {_dt.date.today().isoformat()} "
      f"(total {time.perf_counter() - started:.0f} s).\n")
    w(f"- Machine: {machine()}; torch threads {torch.get_num_threads()}, OMP_WAIT_POLICY="
      f"{os.environ.get('OMP_WAIT_POLICY', 'unset (OpenMP default: spin, then sleep)')}.")
    w(f"- Versions: {versions()}.")
    w(f"- Raw rows: `{csv_path.name}` (one row per configuration and prompt, with load average and CPU/wall).")
    w("- Every configuration runs on every prompt in one process, interleaved (the order rotates per prompt), so "
      "load drift hits all configurations alike; all ratios below come from the same run. The machine is shared: "
      "`load1` and `cpu/wall` say how much CPU this process got (2.0 cpu/wall = both cores).")
    w("- Greedy, fp32, batch 1. `speed-up` = decode time per token of the configuration's own target-alone baseline "
      "(same kernels: ours-prepacked vs `ours: target alone`, HF vs `HF greedy`) / the configuration's; prefill "
      "excluded (it is the same prompt pass for everyone). `total` includes prefill. `a` = per-token acceptance "
      "(geometric estimate: accepted / (accepted + rejections)); `acc.` = accepted/drafted (DESIGN.md's "
      "acceptance_rate). `bound` = the paper's E(a,g)/(g c + v(g+1)) with the measured a, c, v and g; "
      "`eff.` = speed-up / bound.\n")
    for s in skipped:
        w(f"> Skipped: {s}\n")
    for res in results:
        summ = res["summary"]
        w(f"## {res['label']}\n")
        if res["note"]:
            w(res["note"] + "\n")
        w(f"Target {res['params'] / 1e6:.1f}M parameters, draft {res['draft_params'] / 1e6:.1f}M "
          f"({100 * res['draft_params'] / res['params']:.1f}%); {res['prompts']} prompts of "
          f"{res['prompt_tokens']:.0f} tokens on average, {res['max_new']} new tokens each; gamma {res['gamma']}; "
          f"1-token target step {res['step_ms']:.1f} ms (prepacked).\n")
        w("| configuration | tok/s | ms/tok (total) | ms/tok (decode) | acc. | a | tokens/step | mean g | c | "
          "speed-up | total | bound | eff. | identical | cpu/wall | load1 |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for s in summ:
            w(f"| {s['config']} | {s['tok_s']:.2f} | {s['ms_tok']:.1f} | {s['decode_ms_tok']:.1f} | "
              f"{_f(s['acceptance'])} | {_f(s['alpha'])} | {_f(s['tokens_per_step'])} | {_f(s['mean_gamma'], '{:.1f}')}"
              f" | {_f(s['c'], '{:.3f}')} | {s['speedup']:.2f}x | {s['speedup_total']:.2f}x | "
              f"{_f(s['bound'], '{:.2f}x')} | {_f(s['efficiency'])} | {'yes' if s['equal'] else '**NO**'} | "
              f"{s['cpu_util']:.2f} | {s['load1']:.1f} |")
        w("")
        costs = res["costs"]
        ks = sorted(costs["prepacked"].v)
        w("Measured step costs (median of interleaved rounds; v(k) = target pass over k tokens / 1-token pass, "
          "c = draft step / target step):\n")
        w("| kernels | c | " + " | ".join(f"v({k})" for k in ks) + " |")
        w("|---|---|" + "---|" * len(ks))
        for name, cst in costs.items():
            w(f"| {name} | {cst.c:.3f} | " + " | ".join(f"{cst.v.get(k, float('nan')):.2f}" for k in ks) + " |")
        w("")
        by = {s["config"]: s for s in summ}
        checks = headline(res, by)
        if checks:
            w("Targets of issue 5 (ratios from this run):\n")
            for line in checks:
                w(f"- {line}")
            w("")
        prof = by.get(f"ours: model g={res['gamma']}")
        if prof and prof["overhead_ms_round"] is not None:
            w(f"Per-round profile of `ours: model g={res['gamma']}` (forward hooks on both models; decode only): "
              f"target forward {prof['target_ms_round']:.1f} ms, draft forwards {prof['draft_ms_round']:.1f} ms, "
              f"everything else (our loop: list/tensor handling, argmax, accept/reject, cache rollback) "
              f"{prof['overhead_ms_round']:.2f} ms = **{100 * prof['overhead_frac']:.1f}%** of a round.\n")
        sweep = sorted((s for s in summ if s["drafter"] in ("model", "ngram") and s["family"] == "ours"
                        and s["kernels"] == "prepacked" and "int8" not in s["config"] and "early" not in s["config"]),
                       key=lambda s: (s["drafter"], s["gamma"] != "adaptive", int(s["gamma"])
                                      if s["gamma"].isdigit() else 0))
        if len(sweep) > 2:
            w("Adaptive gamma vs fixed gamma on this (mixed) prompt set:\n")
            w("| drafter | gamma | ms/tok (decode) | speed-up | a | tokens/step |")
            w("|---|---|---|---|---|---|")
            for s in sweep:
                w(f"| {s['drafter']} | {s['gamma']} | {s['decode_ms_tok']:.1f} | {s['speedup']:.2f}x | "
                  f"{_f(s['alpha'])} | {_f(s['tokens_per_step'])} |")
            w("")
            kinds = sorted({r["prompt_kind"] for r in res["rows"]})
            if len(kinds) > 1:
                w("Per prompt kind (decode ms/token):\n")
                w("| configuration | " + " | ".join(kinds) + " |")
                w("|---|" + "---|" * len(kinds))
                for s in sweep:
                    cells = []
                    for k in kinds:
                        rs = [r for r in res["rows"] if r["config"] == s["config"] and r["prompt_kind"] == k]
                        t = sum(r["new_tokens"] for r in rs)
                        cells.append(f"{1e3 * sum(r['latency_s'] - r['prefill_s'] for r in rs) / t:.1f}")
                    w(f"| {s['config']} | " + " | ".join(cells) + " |")
                w("")
    if kernels:
        w("## Verify cost v(k) under CPU settings (synthetic target, prompt context)\n")
        ks = [k for k in kernels[0] if k.startswith("v")]
        w("| setting | 1-token step ms | " + " | ".join(f"v({k[1:]})" for k in ks) + " |")
        w("|---|---|" + "---|" * len(ks))
        for r in kernels:
            w(f"| {r['setting']} | {r['t1_ms']:.1f} | " + " | ".join(f"{r[k]:.2f}" for k in ks) + " |")
        w("")
    if beam:
        w("## Beam job vs bare engine loop\n")
        w(f"`pipeline.run.main([...])` (FnApiRunner, in process) against `TextGenerator.load` + a loop over the same "
          f"{beam['prompts']} prompts, both including model loading; median of {beam['reps']} alternating runs; "
          f"load1 {beam['load1']:.1f}.\n")
        w("| | wall s | of which generation (sum of latency_s) |")
        w("|---|---|---|")
        w(f"| bare loop | {beam['bare_wall']:.2f} | {beam['bare_gen']:.2f} (loading {beam['bare_load']:.2f}) |")
        w(f"| Beam job | {beam['job_wall']:.2f} | {beam['job_gen']:.2f} |")
        w(f"\nBeam overhead = (job − bare) / job = **{100 * beam['overhead_frac']:.1f}%** of the job's time "
          f"(target < 10%); same generations: {'yes' if beam['same_outputs'] else 'NO'}.\n")
    notes = Path(__file__).resolve().parent.parent / "benchmarks" / "NOTES.md"
    if notes.exists() and not args.quick:  # hand-written interpretation of the full run
        w(notes.read_text())
    path.write_text("\n".join(L) + "\n")


def headline(res: dict, by: dict) -> list[str]:
    g = res["gamma"]
    out = []
    ours_m, hf_m = by.get(f"ours: model g={g}"), by.get(f"HF assisted g={g}")
    ad = by.get("ours: model adaptive")
    if ours_m and hf_m:
        best = max((x for x in (ours_m, ad) if x), key=lambda s: 1 / s["decode_ms_tok"])
        r1 = hf_m["decode_ms_tok"] / ours_m["decode_ms_tok"]
        r2 = hf_m["ms_tok"] / ours_m["ms_tok"]
        out.append(f"ours (model, g={g}) vs HF assisted (g={g}): {r1:.2f}x decode, {r2:.2f}x total "
                   f"[target ≥ 1.2x: {'met' if r1 >= 1.2 else 'NOT met'}]; best of ours ({best['config']}): "
                   f"{hf_m['decode_ms_tok'] / best['decode_ms_tok']:.2f}x; outputs identical: "
                   f"{'yes' if ours_m['equal'] and hf_m['equal'] else 'NO'}")
        st = by.get(f"ours: model g={g}, stock kernels")
        if st:
            out.append(f"same kernels (stock) loop vs loop: ours {hf_m['decode_ms_tok'] / st['decode_ms_tok']:.2f}x "
                       "HF assisted (what our loop alone gives, without prepacked kernels)")
    effs = [(s["config"], s["efficiency"]) for s in by.values() if s["efficiency"] is not None]
    if effs:
        out.append("efficiency against the analytic bound: " + ", ".join(f"{n} {e:.2f}" for n, e in effs)
                   + " [target ≥ 0.9]")
    if ours_m and ours_m["overhead_frac"] is not None:
        out.append(f"per-round overhead outside the two models' forwards: {100 * ours_m['overhead_frac']:.1f}% "
                   f"[target < 5%: {'met' if ours_m['overhead_frac'] < 0.05 else 'NOT met'}]")
    if ad:
        fixed = [s for s in by.values() if s["drafter"] == "model" and s["kernels"] == "prepacked"
                 and s["gamma"].isdigit() and "int8" not in s["config"]]
        if fixed:
            best_fixed = min(fixed, key=lambda s: s["decode_ms_tok"])
            beats = ad["decode_ms_tok"] < best_fixed["decode_ms_tok"]
            out.append(f"adaptive gamma {ad['decode_ms_tok']:.1f} ms/tok vs best fixed ({best_fixed['config']}) "
                       f"{best_fixed['decode_ms_tok']:.1f} ms/tok: "
                       f"{'beats every fixed gamma' if beats else 'does NOT beat every fixed gamma'}")
        if ad["alpha"] is not None and ad["alpha"] < 0.2:
            slow = ad["decode_ms_tok"] / by["ours: target alone"]["decode_ms_tok"] - 1
            slow_t = ad["ms_tok"] / by["ours: target alone"]["ms_tok"] - 1
            out.append(f"near-zero acceptance (a={ad['alpha']:.2f}): adaptive is {100 * slow:+.1f}% decode, "
                       f"{100 * slow_t:+.1f}% total vs the target alone [target ≤ +5%: "
                       f"{'met' if slow_t <= 0.05 else 'NOT met'}]; fixed g={g}: "
                       f"{100 * (ours_m['ms_tok'] / by['ours: target alone']['ms_tok'] - 1):+.1f}% total")
    return out


# --------------------------------------------------------------------------------------------
# Main


def parse(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m pipeline.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: small synthetic pair, few prompts (< 2 min)")
    p.add_argument("--tiny", action="store_true", help="tiny models (for tests)")
    p.add_argument("--out", default="BENCHMARKS.md", help="report path")
    p.add_argument("--csv", default=None, help="raw rows (default: benchmarks/results.csv beside --out)")
    p.add_argument("--cache_dir", default=None, help="where the synthetic pair is saved (default: benchmarks/.cache)")
    p.add_argument("--prompts", type=int, default=None)
    p.add_argument("--prompt_tokens", type=int, default=None)
    p.add_argument("--max_new_tokens", type=int, default=None)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max_gamma", type=int, default=None, help="cap for the adaptive policy and the v(k) table")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores available)")
    p.add_argument("--pairs", default="synthetic,bad_draft,demo",
                   help="comma-separated subset of synthetic, bad_draft, demo")
    p.add_argument("--skip_beam", action="store_true")
    p.add_argument("--skip_kernels", action="store_true")
    p.add_argument("--skip_bad_draft", action="store_true")
    p.add_argument("--throughput", action="store_true",
                   help="also run pipeline.bench_throughput (plain batched generate vs ours at B=1,4,8,16) on the "
                   "same synthetic pair and prompt settings, into the same report")
    a = p.parse_args(argv)
    quick = a.quick or a.tiny
    a.prompts = a.prompts or (3 if quick else 6)
    a.prompt_tokens = a.prompt_tokens or (24 if quick else 64)
    a.max_new_tokens = a.max_new_tokens or (16 if quick else 48)
    a.max_gamma = a.max_gamma or (6 if quick else 10)
    a.cost_rounds = 1 if quick else 3
    a.sweep = (2, 4) if quick else (2, 3, 4, 6, 8)
    a.ngram_sweep = () if quick else (2,)
    a.int8_draft = not quick
    a.beam_reps = 1
    a.quick = quick
    return a


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("transformers", "apache_beam", "specdec_core.cpu_speed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    started = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    torch.set_num_threads(args.threads or recommended_threads())
    out = Path(args.out)
    csv_path = Path(args.csv) if args.csv else out.parent / "benchmarks" / "results.csv"
    cache = Path(args.cache_dir) if args.cache_dir else out.parent / "benchmarks" / ".cache"
    spec = TINY_SYNTH if args.tiny else QUICK_SYNTH if args.quick else FULL_SYNTH
    dirs = build_synthetic_pair(spec, cache)
    prompts = synthetic_prompts(spec, args.prompts, args.prompt_tokens)
    results, skipped = [], []
    agreement = ("Random weights, so the target's 'text' is meaningless; the deeper layers are damped by "
                 f"{spec.damp} so the 1-layer early-exit draft agrees with it. Costs (c, v, ms/token) are those of a "
                 "real model of this size on this machine; acceptance, tokens/step, speed-ups and the bound DEPEND ON "
                 "THAT ARTIFICIAL AGREEMENT. Prompts alternate between random token strings and a repeated "
                 "7-token pattern (a mixed set: prompt lookup only works on the second kind).")
    pairs = {x.strip() for x in args.pairs.split(",")}
    if "synthetic" in pairs:
        res = run_pair(f"Synthetic pair ({spec.layers}-layer Llama target, {spec.draft_layers}-layer early-exit "
                       "draft)", dirs["target"], dirs["draft"], prompts, args, note=agreement)
        res["summary"] = summarize(res)
        res.pop("configs")
        results.append(res)
        gc.collect()
    if not args.skip_bad_draft and "bad_draft" in pairs:
        bad = run_pair("Synthetic target with a disagreeing draft (acceptance ≈ 0: does the engine back off?)",
                       dirs["target"], dirs["bad_draft"], prompts[: max(2, args.prompts // 2)], args,
                       full_set=False, note="Same target; the draft is a random 1-layer model, so it almost never "
                       "agrees. The adaptive policy must notice and stop drafting.")
        bad["summary"] = summarize(bad)
        bad.pop("configs")
        results.append(bad)
        gc.collect()
    if "demo" in pairs:
        skipped.append(f"demo pair: {demo_pair()}")
    for r in results:
        if "summary" not in r:
            r["summary"] = summarize(r)
        r.pop("configs", None)
    gc.collect()
    kernels = None
    if not args.skip_kernels:
        from transformers import AutoTokenizer

        ids = AutoTokenizer.from_pretrained(dirs["target"])(prompts[0][1])["input_ids"]
        kernels = kernel_experiments(dirs["target"], ids, args)
    beam = None if args.skip_beam else beam_overhead(dirs["target"], dirs["draft"], prompts, args)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    rows = [r for res in results for r in res["rows"]]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(csv_path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=keys)
        wr.writeheader()
        wr.writerows(rows)
    summary_json = csv_path.with_name(csv_path.stem + "-summary.json")
    summary_json.write_text(json.dumps({"results": [{"label": r["label"], "summary": r["summary"],
                                                     "costs": {k: {"c": v.c, "v": v.v} for k, v in r["costs"].items()}}
                                                    for r in results], "beam": beam, "kernels": kernels},
                                       indent=1, default=str))
    write_report(out, csv_path, results, skipped, beam, kernels, argv, started, args)
    if args.throughput:
        from pipeline import bench_throughput

        size = "tiny" if args.tiny else "quick" if args.quick else "full"
        bench_throughput.main(["--size", size, "--cache_dir", str(cache), "--out", str(out), "--prompts",
                               str(max(args.prompts, 16)), "--prompt_tokens", str(args.prompt_tokens),
                               "--max_new_tokens", str(args.max_new_tokens),
                               "--gammas", ",".join(sorted({"2", str(args.gamma)}))])
    _LOG.info("wrote %s and %s (%.0f s)", out, csv_path, time.perf_counter() - started)
    return 0 if all(s["equal"] for r in results for s in r["summary"]) else 1


if __name__ == "__main__":
    sys.exit(main())
