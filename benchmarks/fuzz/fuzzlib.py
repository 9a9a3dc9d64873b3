"""Exactness fuzz of specdec-beam's greedy engines against HF generate(do_sample=False)."""
import random
import time
import traceback

import torch

from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.drafters import ModelDrafter, NgramDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.gamma import AdaptiveGamma, Costs
from specdec_core.pass_settings import PassSettings
from tests.tiny_models import build_tokenizer, make_model, perturbed_copy

torch.set_num_threads(1)

TOK = build_tokenizer()
KINDS = ["llama", "gpt2", "t5", "bart"]
EOS = TOK.eos_token_id


def hf_greedy(model, ids, n):  # as tests/test_batch_engine.py
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n,
                             pad_token_id=model.config.pad_token_id)
    return out[0, 1 if model.config.is_encoder_decoder else len(ids):].tolist()


COSTS = {
    "dear": lambda: Costs(c=0.9, v={2: 1.9, 3: 2.8, 4: 3.7, 5: 4.6}),
    "cheap": lambda: Costs(c=0.01, v={2: 1.01, 3: 1.02, 4: 1.03, 5: 1.04}),
    "probe": lambda: Costs(c=0.2, v={k: 0.22 + 0.78 * k for k in range(2, 6)}),
    "hurdle": lambda: Costs(c=0.16, v={2: 1.23, 3: 1.4, 4: 1.6, 5: 1.7}),
    "never": lambda: Costs(c=1.5, v={k: 1.0 + 0.2 * k for k in range(2, 14)}),
}


def random_config(trial: int) -> dict:
    r = random.Random(trial)
    kind = KINDS[trial % 4] if r.random() < 0.5 else r.choice(KINDS)
    cfg = {"trial": trial, "kind": kind, "layers": r.choice([1, 2, 2, 3]), "hidden": r.choice([32, 64, 64]),
           "target_seed": r.randrange(1000)}
    dt = r.choices(["perturbed", "far", "self"], [0.6, 0.25, 0.15])[0]
    if dt == "perturbed":
        cfg["draft"] = {"type": dt, "noise": round(r.uniform(0.0, 0.5), 3), "seed": r.randrange(1000)}
    elif dt == "far":
        cfg["draft"] = {"type": dt, "seed": r.randrange(1000), "layers": r.choice([1, 2]), "hidden": r.choice([32, 64])}
    else:
        cfg["draft"] = {"type": dt}
    cfg["drafter"] = r.choices(["model", "model_chain", "ngram", "none"], [0.45, 0.2, 0.25, 0.1])[0]
    if cfg["drafter"] == "ngram":
        mn = r.randint(1, 3)
        cfg["ngram"] = [r.randint(mn, 4), mn]
    cfg["engine"] = r.choices(["batch", "single"], [0.75, 0.25])[0]
    cfg["B"] = r.randint(1, 9)
    n_prompts = r.randint(1, 20) if cfg["engine"] == "batch" else r.randint(1, 6)
    prompts = []
    for _ in range(n_prompts):
        L = r.randint(1, 40)
        p = [r.randrange(4, len(TOK)) for _ in range(L)]
        if L > 2 and r.random() < 0.15:
            p[r.randrange(1, L - 1)] = EOS
        prompts.append(p)
    cfg["prompts"] = prompts
    cfg["seeds"] = [r.randrange(100) for _ in prompts]
    cfg["max_new"] = r.randint(1, 30)
    cfg["gamma"] = r.randint(1, 8)
    cfg["prefill_tokens"] = None if r.random() < 0.4 else r.randint(1, 64)
    gp = r.choices(["fixed", "adaptive", "adaptive_costs"], [0.4, 0.2, 0.4])[0]
    cfg["policy"] = {"type": gp}
    if gp != "fixed":
        cfg["policy"].update(max_gamma=r.randint(1, 8), prior=round(r.uniform(0.3, 0.99), 2),
                             early_stop=r.random() < 0.5, share=r.random() < 0.7)
        if gp == "adaptive_costs":
            cfg["policy"]["costs"] = r.choice(list(COSTS))
    cfg["admit_together"] = r.randint(1, 5)
    cfg["graphs"] = r.choices(["off", "on"], [0.55, 0.45])[0]
    cfg["draft_graphs"] = cfg["graphs"] if r.random() < 0.85 else ("off" if cfg["graphs"] == "on" else "on")
    # EOS: the target's end token set to a token greedy emits (rows then end at scattered rounds)
    cfg["eos"] = None if r.random() < 0.6 else {"prompt": r.randrange(n_prompts), "pos": r.randint(0, 10),
                                                "draft_too": r.random() < 0.5}
    cfg["split"] = None if r.random() < 0.7 or n_prompts < 2 else r.randint(1, n_prompts - 1)
    return cfg


def build(cfg):
    target = make_model(cfg["kind"], TOK, seed=cfg["target_seed"], layers=cfg["layers"], hidden=cfg["hidden"])
    d = cfg["draft"]
    if d["type"] == "perturbed":
        draft = perturbed_copy(target, d["noise"], seed=d["seed"])
    elif d["type"] == "far":
        draft = make_model(cfg["kind"], TOK, seed=d["seed"], layers=d["layers"], hidden=d["hidden"])
    else:
        draft = target
    return target, draft


def make_drafter(cfg, draft):
    k = cfg["drafter"]
    if k == "model":
        return ModelDrafter(draft, cuda_graphs=cfg["draft_graphs"])
    if k == "model_chain":
        return ModelDrafter(draft, cuda_graphs=cfg["draft_graphs"], chain=True)
    if k == "ngram":
        return NgramDrafter(*cfg["ngram"])
    return NoDrafter()


def make_policy(cfg):
    p = cfg["policy"]
    if p["type"] == "fixed":
        return None
    costs = COSTS[p["costs"]]() if p["type"] == "adaptive_costs" else None
    return AdaptiveGamma(costs, max_gamma=p["max_gamma"], prior_acceptance=p["prior"], early_stop=p["early_stop"],
                         share_across_items=p["share"])


def top2(target, prompt, prefix):
    """Raw logits' top-2 (ids, values) after prompt+prefix, in a plain uncached forward."""
    with torch.inference_mode():
        if target.config.is_encoder_decoder:
            start = target.generation_config.decoder_start_token_id
            if start is None:
                start = target.config.decoder_start_token_id
            logits = target(input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([[start] + prefix])).logits
        else:
            logits = target(input_ids=torch.tensor([prompt + prefix])).logits
    v, i = logits[0, -1].float().topk(2)
    return i.tolist(), v.tolist()


def run_config(cfg, check_ties=True):
    """-> dict(status=ok|fail|refused|error, ...)"""
    t0 = time.time()
    target, draft = build(cfg)
    prompts, n = cfg["prompts"], cfg["max_new"]
    if cfg["eos"]:
        e = cfg["eos"]
        ref0 = hf_greedy(target, prompts[e["prompt"]], 30)
        eos = ref0[min(e["pos"], len(ref0) - 1)]
        target.generation_config.eos_token_id = eos
        if e["draft_too"] and draft is not target:
            draft.generation_config.eos_token_id = eos
        cfg = dict(cfg, eos_id=eos)
    refs = [hf_greedy(target, p, n) for p in prompts]
    try:
        drafter = make_drafter(cfg, draft)
        policy = make_policy(cfg)
        if cfg["engine"] == "single":
            eng = SpeculativeGenerator(target, drafter, num_speculative_tokens=cfg["gamma"], max_new_tokens=n,
                                       gamma_policy=policy, cuda_graphs=cfg["graphs"])
        else:
            eng = BatchSpeculativeGenerator(target, drafter, batch_size=cfg["B"], num_speculative_tokens=cfg["gamma"],
                                            max_new_tokens=n, gamma_policy=policy, prefill_tokens=cfg["prefill_tokens"],
                                            cuda_graphs=cfg["graphs"],
                                            settings=PassSettings(admit_together=cfg["admit_together"]))
    except ValueError as exc:
        if "cuda_graphs on" in str(exc) or "batch_size > 1" in str(exc):
            return {"status": "refused", "msg": str(exc)[:300], "s": time.time() - t0}
        return {"status": "error", "where": "construct", "tb": traceback.format_exc()[-3000:], "s": time.time() - t0}
    except Exception:
        return {"status": "error", "where": "construct", "tb": traceback.format_exc()[-3000:], "s": time.time() - t0}
    items = list(zip(prompts, cfg["seeds"], strict=True))
    try:
        if cfg["engine"] == "single":
            outs = [eng.generate(p, s) for p, s in items]
        else:
            k = cfg["split"]
            calls = [items] if not k else [items[:k], items[k:]]
            outs = []
            for c in calls:
                outs += eng.generate_many(c)
    except Exception:
        return {"status": "error", "where": "generate", "tb": traceback.format_exc()[-3000:], "s": time.time() - t0}
    bad = []
    for i, (p, o, ref) in enumerate(zip(prompts, outs, refs, strict=True)):
        got = getattr(o, "tokens", None)
        if got != ref:
            rec = {"prompt": i, "ref": ref, "got": got if got is not None else repr(o)[:300]}
            if got is not None:
                j = next((j for j in range(min(len(got), len(ref))) if got[j] != ref[j]), min(len(got), len(ref)))
                rec["first_diff"] = j
                if check_ties and j < min(len(got), len(ref)):
                    ids, vals = top2(target, p, ref[:j])
                    rec["top2"] = [ids, vals]
                    rec["gap"] = vals[0] - vals[1]
                    rec["near_tie"] = (vals[0] - vals[1]) < 1e-4
            bad.append(rec)
    res = {"status": "fail" if bad else "ok", "s": time.time() - t0}
    if bad:
        res["bad"] = bad
        res["n_bad"] = len(bad)
        res["eos_id"] = cfg.get("eos_id")
    return res


def random_config2(trial: int) -> dict:
    """Phase 2: biased to the batch engine's continuous batching (many prompts, small B, EOS, batch-level gamma)."""
    cfg = random_config(trial)
    r = random.Random(10_000_000 + trial)
    cfg["phase"] = 2
    cfg["engine"] = "batch"
    cfg["B"] = r.randint(2, 9)
    n_prompts = r.randint(max(cfg["B"] + 1, 8), 20)
    prompts = []
    for _ in range(n_prompts):
        L = r.randint(1, 40)
        p = [r.randrange(4, len(TOK)) for _ in range(L)]
        if L > 2 and r.random() < 0.15:
            p[r.randrange(1, L - 1)] = EOS
        prompts.append(p)
    cfg["prompts"], cfg["seeds"] = prompts, [r.randrange(100) for _ in prompts]
    if r.random() < 0.7:
        cfg["policy"] = {"type": "adaptive_costs", "max_gamma": r.randint(1, 8),
                         "prior": round(r.uniform(0.3, 0.99), 2),
                         "early_stop": r.random() < 0.5, "share": r.random() < 0.7, "costs": r.choice(list(COSTS))}
    cfg["eos"] = None if r.random() < 0.3 else {"prompt": r.randrange(n_prompts), "pos": r.randint(0, 10),
                                                "draft_too": r.random() < 0.5}
    cfg["split"] = None if r.random() < 0.5 else r.randint(1, n_prompts - 1)
    if cfg["drafter"] == "none" or r.random() < 0.3:
        cfg["drafter"] = r.choice(["model", "model_chain"])
    return cfg


def random_config3(trial: int) -> dict:
    """Phase 3: phase 2 with half the adaptive trials timing their own costs at the batch's width (the batch rule
    with measured costs, its in-step charge, probes catching up rows the draft skipped)."""
    cfg = random_config2(trial)
    r = random.Random(20_000_000 + trial)
    if r.random() < 0.5:
        cfg["policy"] = {"type": "adaptive", "max_gamma": r.randint(1, 8), "prior": round(r.uniform(0.3, 0.99), 2),
                         "early_stop": r.random() < 0.5, "share": r.random() < 0.7}
    cfg["phase"] = 3
    return cfg
