"""The configurations `pipeline.bench` runs side by side: one `Config` per way of generating
(our engine with a drafter and gamma, or Hugging Face `generate`), each a function from prompt
ids to (new tokens, stats) plus what the report needs to group and compare it."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec_core.drafters import ModelDrafter, NgramDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.gamma import LOOKUP_DRAFT_COST, AdaptiveGamma, Costs
from specdec_core.processing import SamplingSettings


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
    draft_dtype: str = "float32"  # the draft's weights: "float32" | "bfloat16" | "int8"
    sampling: str = ""  # "" for greedy, else the label of a SAMPLING_SETTINGS entry


# The paper's table reports temperature 0 and 1 side by side; 0.7 with top-p 0.9 is a common
# serving setting (nucleus sampling changes both p and q, hence acceptance).
SAMPLING_SETTINGS: dict[str, SamplingSettings] = {
    "T=1": SamplingSettings(temperature=1.0),
    "T=0.7, top-p 0.9": SamplingSettings(temperature=0.7, top_p=0.9),
}


def ours(target, drafter, gamma: int, max_new: int, policy=None, sampling: SamplingSettings | None = None):
    gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=gamma, max_new_tokens=max_new,
                               gamma_policy=policy, sampling=sampling or SamplingSettings())
    calls = [0]

    def fn(ids: list[int]) -> tuple[list[int], dict]:
        calls[0] += 1  # a new seed per call: sampled runs are independent draws
        out = gen.generate(ids, seed=calls[0])
        s = out.stats
        return out.tokens, {"drafted": s.draft_tokens, "accepted": s.accepted_tokens, "rounds": s.verify_steps,
                            "rejections": s.rejections, "draft_steps": s.draft_steps,
                            "drafts_per_round": " ".join(map(str, s.drafts)),
                            "mean_gamma": statistics.fmean(s.gammas) if s.gammas else 0.0}

    return fn


def hf(target, max_new: int, assistant=None, lookup: int | None = None, gamma: int = 4,
       sampling: SamplingSettings | None = None):
    """HF `generate`: greedy, or sampling with the same processors as ours (top_k=0 switches off
    HF's default top-k of 50, which ours does not apply). Assisted sampling is HF's
    `_speculative_sampling`: the assistant samples with the target's processors, q is its
    processed distribution."""
    kwargs: dict = {"do_sample": False}
    if sampling is not None and not sampling.greedy:
        kwargs = {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p or 1.0,
                  "top_k": sampling.top_k or 0}
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    if lookup:
        kwargs["prompt_lookup_num_tokens"] = lookup
    calls = [0]

    def fn(ids: list[int]) -> tuple[list[int], dict]:
        if assistant is not None:  # set per call: configs at other gammas share this assistant
            gc = assistant.generation_config
            gc.num_assistant_tokens = gamma
            gc.num_assistant_tokens_schedule = "constant"
            gc.assistant_confidence_threshold = 0.0
        errors = 0
        while True:
            calls[0] += 1
            torch.manual_seed(calls[0])
            try:
                with torch.inference_mode():
                    out = target.generate(torch.tensor([ids]), max_new_tokens=max_new, pad_token_id=0,
                                          eos_token_id=None, **kwargs)
                break
            except RuntimeError:
                # HF's speculative sampling has no guard for an all-zero residual max(0, p - q)
                # (multinomial on NaN); a new draw is the only way on. Counted in the report.
                errors += 1
                if errors >= 3 or not kwargs["do_sample"]:
                    raise
        return out[0, len(ids):].tolist(), {"hf_errors": errors} if errors else {}

    return fn


def greedy_configs(target, draft, target_p, draft_p, costs: dict[str, Costs], args, full_set: bool,
                   draft_q=None, dtype_drafts: dict[str, torch.nn.Module] | None = None) -> list[Config]:
    """The greedy set, all at the same gamma and on the same pair: the target alone (ours and HF),
    the model and n-gram drafters (fixed and adaptive gamma) against HF assisted generation and
    prompt lookup; with `full_set`, stock kernels, the gamma sweep and the int8 draft too.
    `target_p`/`draft_p` are the prepacked copies, `draft_q` the int8 draft (costs["int8 draft"]),
    `dtype_drafts` the draft in other dtypes (one fixed-gamma row each; costs[f"{dtype} draft"])."""
    g, N = args.gamma, args.max_new_tokens
    configs: list[Config] = []

    def add(name, family, kernels, drafter, gamma, fn, tgt, drf=None, baseline="", c=0.0, draft_dtype="float32"):
        configs.append(Config(name, family, kernels, drafter, str(gamma), fn, tgt, drf, baseline, c, draft_dtype))

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
    ngram_costs = Costs(c=LOOKUP_DRAFT_COST, v=costs["prepacked"].v)
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
                add(f"HF assisted g={gg}", "hf", "stock", "model", gg, hf(target, N, assistant=draft, gamma=gg),
                    target, draft, "HF greedy", cs)
        for gg in args.ngram_sweep:
            if gg != g:
                add(f"ours: ngram g={gg}", "ours", "prepacked", "ngram", gg, ours(target_p, NgramDrafter(), gg, N),
                    target_p, None, "ours: target alone", 0.0)
        if draft_q is not None:
            add("ours: int8 draft adaptive", "ours", "prepacked", "model", "adaptive",
                ours(target_p, ModelDrafter(draft_q), args.max_gamma, N,
                     AdaptiveGamma(costs["int8 draft"], max_gamma=args.max_gamma)),
                target_p, draft_q, "ours: target alone", costs["int8 draft"].c, draft_dtype="int8")
    for dtype, model in (dtype_drafts or {}).items():
        if dtype != "float32":
            add(f"ours: model g={g}, {dtype} draft", "ours", "prepacked", "model", g,
                ours(target_p, ModelDrafter(model), g, N), target_p, model, "ours: target alone",
                costs[f"{dtype} draft"].c, dtype)
        if dtype == "auto":
            # HF assisted with the very same draft: what the cheaper draft gives HF's loop too.
            add(f"HF assisted g={g}, {dtype} draft", "hf", "stock", "model", g,
                hf(target, N, assistant=model, gamma=g), target, model, "HF greedy", costs[f"{dtype} draft"].c,
                dtype)
    for c in configs:
        if not c.baseline:
            c.baseline = c.name
    return configs


def sampling_configs(target, draft, target_p, draft_p, args) -> list[Config]:
    """Per sampling setting, at the same gamma: the target alone (ours and HF `generate`), ours
    with the model drafter and HF assisted sampling with the same draft. Outputs are random
    draws, so there is no identity check; speed-ups are against the same setting's target alone."""
    g, N = args.gamma, args.max_new_tokens
    configs = []
    for label, st in SAMPLING_SETTINGS.items():
        alone, hf_alone = f"ours: target alone, {label}", f"HF sample, {label}"
        configs += [
            Config(alone, "ours", "prepacked", "none", "-", ours(target_p, NoDrafter(), g, N, sampling=st),
                   target_p, None, alone, sampling=label),
            Config(hf_alone, "hf", "stock", "none", "-", hf(target, N, sampling=st), target, None, hf_alone,
                   sampling=label),
            Config(f"ours: model g={g}, {label}", "ours", "prepacked", "model", str(g),
                   ours(target_p, ModelDrafter(draft_p), g, N, sampling=st), target_p, draft_p, alone,
                   sampling=label),
            Config(f"HF assisted g={g}, {label}", "hf", "stock", "model", str(g),
                   hf(target, N, assistant=draft, gamma=g, sampling=st), target, draft, hf_alone, sampling=label),
        ]
    return configs
