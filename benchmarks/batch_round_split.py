"""One-off: where a batched call's time goes on the quick pair, per drafter (why drafting loses at B = 32 on a CPU).

`PYTHONPATH=. python benchmarks/batch_round_split.py B PROMPTS CONFIGS REPS [CACHE_DIR]`, CONFIGS comma-separated
from none, g1..g4 (fixed gamma), adaptive: each config's tokens/s, its admitting seconds and target prefill passes,
its rounds' seconds and count, the rest (compaction, drops), drafts and acceptance, the draft's prefill seconds, and
for adaptive the factor by which its drafting rounds overran their predicted costs (`_round_factor`). Configs
alternate, REPS times. 128-token prompts, 48 new tokens, 2 threads, as `pipeline.bench.throughput` runs them.
"""
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair, synthetic_prompts
from specdec_core import batch_engine as be
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter, NoDrafter
from specdec_core.gamma import AdaptiveGamma
from specdec_core.loading import load_model

torch.set_num_threads(2)
B, N, NEW, CONFIGS, REPS = int(sys.argv[1]), int(sys.argv[2]), 48, sys.argv[3].split(","), int(sys.argv[4])
dirs = build_synthetic_pair(QUICK_SYNTH, Path(sys.argv[5] if len(sys.argv) > 5 else "benchmarks/.cache"))
cpu = torch.device("cpu")
target = prepare_for_cpu(load_model(str(dirs["target"]), cpu, torch.float32))
draft = prepare_for_cpu(load_model(str(dirs["draft"]), cpu, torch.float32))
tok = AutoTokenizer.from_pretrained(dirs["target"])
items = [(tok(t)["input_ids"], 0) for _, t in synthetic_prompts(QUICK_SYNTH, N, 128)]


def engine(config: str) -> be.BatchSpeculativeGenerator:
    if config == "none":
        return be.BatchSpeculativeGenerator(target, NoDrafter(), batch_size=B, max_new_tokens=NEW)
    if config == "adaptive":  # costs measured at width B first, as the bench does
        policy = AdaptiveGamma(max_gamma=4)
        be.BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=B, num_speculative_tokens=4,
                                     max_new_tokens=1, gamma_policy=policy).generate_many(items[:B])
        return be.BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=B, num_speculative_tokens=4,
                                            max_new_tokens=NEW, gamma_policy=policy)
    return be.BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=B,
                                        num_speculative_tokens=int(config[1:]), max_new_tokens=NEW)


def run(config: str) -> None:
    eng = engine(config)
    rounds, plain_round = [0.0, 0], eng._round

    def timed(live, tkv, dkv):
        t = time.perf_counter()
        plain_round(live, tkv, dkv)
        rounds[0] += time.perf_counter() - t
        rounds[1] += 1

    eng._round = timed
    t0 = time.perf_counter()
    out = eng.generate_many(items)
    wall = time.perf_counter() - t0
    drafted = sum(o.stats.draft_tokens for o in out)
    accepted = sum(o.stats.accepted_tokens for o in out) / max(drafted, 1)
    print(f"{config:9s} {sum(len(o.tokens) for o in out) / wall:6.1f} tok/s, wall {wall:5.2f} s, admitting "
          f"{eng.admit_s:5.2f} s ({eng.admitted[1]} passes), rounds {rounds[0]:5.2f} s ({rounds[1]}), rest "
          f"{wall - eng.admit_s - rounds[0]:4.2f} s, drafts {drafted} (acceptance {accepted:.2f}), draft prefill "
          f"{eng._draft_prefill[0]:.2f} s, round factor {eng._round_factor():.2f}", flush=True)


for rep in range(REPS):
    for config in CONFIGS if rep % 2 == 0 else CONFIGS[::-1]:
        run(config)
