"""One-off: adaptive gamma (warm: one wave decoded first on the same engine, as a job's worker) against drafting
nothing at one batch width, with every row ending at the budget (48 new tokens: rows of a wave end together) and with
rows ending at their own lengths (a per-row stop after 24 to 72 tokens, as stop tokens end a real job's rows: the
batch is scattered whether it drafts or not). Quick pair, 256 prompts of 128 tokens, 2 threads; the configs alternate,
the order reversed every other rep; outputs checked equal between configs.

Run from the root: `PYTHONPATH=. python benchmarks/scattered_ends.py B REPS`."""

import random
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair, synthetic_prompts
from pipeline.bench.throughput import ADAPTIVE_MAX
from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter, NoDrafter
from specdec_core.gamma import AdaptiveGamma
from specdec_core.loading import load_model

torch.set_num_threads(2)
dirs = build_synthetic_pair(QUICK_SYNTH, Path(__file__).resolve().parent / ".cache")
cpu = torch.device("cpu")
target = prepare_for_cpu(load_model(str(dirs["target"]), cpu, torch.float32))
draft = prepare_for_cpu(load_model(str(dirs["draft"]), cpu, torch.float32))
tok = AutoTokenizer.from_pretrained(dirs["target"])
ids = [tok(p)["input_ids"] for _, p in synthetic_prompts(QUICK_SYNTH, 256, 128)]
B, REPS = int(sys.argv[1]), int(sys.argv[2])
ENDS = {"fixed": [48] * len(ids), "own": [random.Random(i).randint(24, 72) for i in range(len(ids))]}


def stop_after(n: int):
    """A row's finish check that ends it after n new tokens (the check sees each round's kept tokens once)."""
    seen = [0]

    def check(kept: list[int]) -> int | None:
        if seen[0] + len(kept) >= n:
            return n - seen[0] - 1
        seen[0] += len(kept)
        return None
    return check


def run(config: str, ends: str) -> tuple[float, list[list[int]], int]:
    adaptive = config == "adaptive"
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft) if adaptive else NoDrafter(), batch_size=B,
                                       num_speculative_tokens=ADAPTIVE_MAX if adaptive else 1, max_new_tokens=72,
                                       gamma_policy=AdaptiveGamma(max_gamma=ADAPTIVE_MAX) if adaptive else None)
    lengths = ENDS[ends]
    if adaptive:  # one wave first, off the clock
        engine.generate_many([(p, 0) for p in ids[:B]], finish_checks=[stop_after(n) for n in lengths[:B]])
    passes = engine.admitted[1]
    t0 = time.perf_counter()
    outs = engine.generate_many([(p, 0) for p in ids], finish_checks=[stop_after(n) for n in lengths])
    secs = time.perf_counter() - t0
    return sum(len(o.tokens) for o in outs) / secs, [o.tokens for o in outs], engine.admitted[1] - passes


run("none", "fixed")  # warm-up
for ends in ("fixed", "own"):
    rates: dict[str, list[float]] = {"adaptive": [], "none": []}
    reference = None
    for rep in range(REPS):
        for config in ("adaptive", "none") if rep % 2 == 0 else ("none", "adaptive"):
            rate, tokens, passes = run(config, ends)
            reference = reference or tokens
            assert tokens == reference, (config, ends)
            rates[config].append(rate)
            print(f"{ends} ends, {config} B={B}: {rate:.1f} tokens/s, {passes} target prefill passes", flush=True)
    print(f"{ends} ends: adaptive / none = {sum(rates['adaptive']) / sum(rates['none']):.3f}", flush=True)
