"""One-off: adaptive gamma as the throughput bench times it now ("warm": one wave decoded off the clock on the same
engine) and as it timed it before ("cold": a new engine whose policy learnt only the costs, from a 1-token call),
against a fixed gamma and drafting nothing; quick pair, 64 prompts of 48 tokens, 24 new, 1 thread, the order rotating
each rep, outputs checked equal. Prints tokens/s per rep and the median ratio to the fixed gamma.

Run from the root: `PYTHONPATH=. python benchmarks/warm_cold_adaptive.py B REPS FIXED_GAMMA [draft|bad_draft]`."""

import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair, synthetic_prompts
from pipeline.bench.throughput import ADAPTIVE_MAX, ours_batched
from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.gamma import AdaptiveGamma
from specdec_core.loading import load_model

torch.set_num_threads(1)
dirs = build_synthetic_pair(QUICK_SYNTH, Path(__file__).resolve().parent / ".cache")
cpu = torch.device("cpu")
target = prepare_for_cpu(load_model(str(dirs["target"]), cpu, torch.float32))
draft = prepare_for_cpu(load_model(str(dirs[sys.argv[4] if len(sys.argv) > 4 else "draft"]), cpu, torch.float32))
ids = [AutoTokenizer.from_pretrained(dirs["target"])(p)["input_ids"] for _, p in synthetic_prompts(QUICK_SYNTH, 64, 48)]
B, REPS, FIXED = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])


def cold() -> tuple[list[list[int]], float]:
    """The bench before: costs from a separate engine, a new engine timed with the policy at its prior."""
    policy = AdaptiveGamma(max_gamma=ADAPTIVE_MAX)
    if B == 1:
        policy.set_costs(SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=ADAPTIVE_MAX,
                                              gamma_policy=policy).measure_costs(ids[0]))
        gen = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=ADAPTIVE_MAX, max_new_tokens=24,
                                   gamma_policy=policy)
        t0 = time.perf_counter()
        return [gen.generate(p, 0).tokens for p in ids], time.perf_counter() - t0
    BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=B, num_speculative_tokens=ADAPTIVE_MAX,
                              max_new_tokens=1, gamma_policy=policy).generate_many([(p, 0) for p in ids[:B]])
    gen = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=B, num_speculative_tokens=ADAPTIVE_MAX,
                                    max_new_tokens=24, gamma_policy=policy)
    t0 = time.perf_counter()
    return [o.tokens for o in gen.generate_many([(p, 0) for p in ids])], time.perf_counter() - t0


def run(config: str) -> tuple[float, list[list[int]]]:
    if config == "cold":
        tokens, secs = cold()
    else:
        drafter = NoDrafter() if config == "none" else ModelDrafter(draft)
        tokens, secs, _ = ours_batched(target, drafter, ids, B, "adaptive" if config == "warm" else FIXED, 24)
    return len(ids) * 24 / secs, tokens


ours_batched(target, NoDrafter(), ids[:2], 2, 1, 4)  # warm-up
configs = ["warm", "cold", f"g{FIXED}", "none"]
rates: dict[str, list[float]] = {c: [] for c in configs}
reference = None
for rep in range(REPS):
    for config in configs[rep % 4:] + configs[: rep % 4]:
        rate, tokens = run(config)
        reference = reference or tokens
        assert tokens == reference, config
        rates[config].append(rate)
    print(rep, {c: round(rates[c][-1], 1) for c in configs}, flush=True)
for config in configs:
    ratios = [a / b for a, b in zip(rates[config], rates[f"g{FIXED}"], strict=True)]
    print(config, "mean tok/s", round(statistics.mean(rates[config]), 1), "median ratio to the fixed gamma",
          round(statistics.median(ratios), 3), [round(x, 2) for x in ratios])
