# ruff: noqa: E402
"""One-off: sampled rows of the batch engine against the batch-1 engine's sample of the same seed (fixed gamma, where
a row's draws do not depend on its batch-mates).
Usage: python benchmarks/fuzz/sample_fuzz.py START DEADLINE_EPOCH | --trial N
(results: sample-results.jsonl)."""
import json
import random
import sys
import time
import traceback
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]
import fuzzlib

from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.engine import SpeculativeGenerator
from specdec_core.pass_settings import PassSettings
from specdec_core.processing import SamplingSettings


def config(trial: int) -> dict:
    cfg = fuzzlib.random_config2(trial)
    r = random.Random(30_000_000 + trial)
    cfg["policy"] = {"type": "fixed"}
    cfg["sampling"] = {"temperature": round(r.uniform(0.2, 1.6), 2),
                       "top_k": None if r.random() < 0.5 else r.randint(1, 60),
                       "top_p": None if r.random() < 0.5 else round(r.uniform(0.3, 1.0), 2)}
    cfg["repetition_penalty"] = None if r.random() < 0.7 else round(r.uniform(1.05, 1.6), 2)
    cfg["eos"] = None if r.random() < 0.5 else {"token": r.randrange(4, 300)}  # a token sampling may hit
    return cfg


def run(cfg: dict) -> dict:
    t0 = time.time()
    target, draft = fuzzlib.build(cfg)
    if cfg["eos"]:
        target.generation_config.eos_token_id = cfg["eos"]["token"]
    if cfg["repetition_penalty"]:
        target.generation_config.repetition_penalty = cfg["repetition_penalty"]
    sampling = SamplingSettings(**cfg["sampling"])
    items = list(zip(cfg["prompts"], cfg["seeds"], strict=True))
    try:
        batch = BatchSpeculativeGenerator(target, fuzzlib.make_drafter(cfg, draft), batch_size=cfg["B"],
                                          num_speculative_tokens=cfg["gamma"], max_new_tokens=cfg["max_new"],
                                          sampling=sampling, prefill_tokens=cfg["prefill_tokens"],
                                          cuda_graphs=cfg["graphs"],
                                          settings=PassSettings(admit_together=cfg["admit_together"]))
        single = SpeculativeGenerator(target, fuzzlib.make_drafter(cfg, draft), num_speculative_tokens=cfg["gamma"],
                                      max_new_tokens=cfg["max_new"], sampling=sampling, cuda_graphs=cfg["graphs"])
    except ValueError as exc:
        return {"status": "refused", "msg": str(exc)[:300], "s": time.time() - t0}
    try:
        k = cfg["split"]
        outs = []
        for call in ([items] if not k else [items[:k], items[k:]]):
            outs += batch.generate_many(call)
        alone = [single.generate(p, s) for p, s in items]
    except Exception:
        return {"status": "error", "tb": traceback.format_exc()[-3000:], "s": time.time() - t0}
    bad = [{"prompt": i, "alone": a.tokens, "batched": getattr(o, "tokens", repr(o)[:200])}
           for i, (a, o) in enumerate(zip(alone, outs, strict=True)) if getattr(o, "tokens", None) != a.tokens]
    return {"status": "fail" if bad else "ok", "s": time.time() - t0, **({"bad": bad} if bad else {})}


def main() -> None:
    if sys.argv[1] == "--trial":
        c = config(int(sys.argv[2]))
        print(json.dumps(c))
        print(json.dumps(run(c)))
        return
    t, deadline = int(sys.argv[1]), float(sys.argv[2])
    keys = ("trial", "kind", "drafter", "graphs", "draft_graphs", "B", "gamma", "max_new", "admit_together", "split")
    with open("sample-results.jsonl", "a") as f:
        while time.time() < deadline:
            c = config(t)
            try:
                res = run(c)
            except Exception:
                res = {"status": "error", "tb": traceback.format_exc()[-3000:]}
            f.write(json.dumps({**{k: c[k] for k in keys}, "sampling": c["sampling"], "rep": c["repetition_penalty"],
                                "eos": bool(c["eos"]), "n": len(c["prompts"]), **res}) + "\n")
            f.flush()
            print(t, res["status"], flush=True)
            t += 1


if __name__ == "__main__":
    main()
