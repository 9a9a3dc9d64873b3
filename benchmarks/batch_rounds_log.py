"""One-off: the adaptive batch rule round by round on the quick pair (why it drafts in bursts on a CPU).

`PYTHONPATH=. python benchmarks/batch_rounds_log.py B PROMPTS [CACHE_DIR]`: the costs the rule measured at width B
with the rates it predicts per K, then one line per round (rows, the batch's K, rows drafting, mean acceptance
estimate, rows whose draft cache is behind, the round's milliseconds, the fewest new tokens a row has left).
128-token prompts, 48 new tokens, 2 threads, as `pipeline.bench.throughput` runs them.
"""
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair, synthetic_prompts
from specdec_core import batch_engine as be
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter
from specdec_core.gamma import AdaptiveGamma, batch_gamma
from specdec_core.loading import load_model

torch.set_num_threads(2)
B, N, NEW = int(sys.argv[1]), int(sys.argv[2]), 48
dirs = build_synthetic_pair(QUICK_SYNTH, Path(sys.argv[3] if len(sys.argv) > 3 else "benchmarks/.cache"))
cpu = torch.device("cpu")
target = prepare_for_cpu(load_model(str(dirs["target"]), cpu, torch.float32))
draft = prepare_for_cpu(load_model(str(dirs["draft"]), cpu, torch.float32))
tok = AutoTokenizer.from_pretrained(dirs["target"])
items = [(tok(t)["input_ids"], 0) for _, t in synthetic_prompts(QUICK_SYNTH, N, 128)]
policy = AdaptiveGamma(max_gamma=4)
be.BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=B, num_speculative_tokens=4, max_new_tokens=1,
                             gamma_policy=policy).generate_many(items[:B])  # the costs at width B, as the bench does
c = policy.costs
print(f"costs c={c.c:.3f} v={ {k: round(v, 2) for k, v in c.v.items()} } step_s={c.step_s:.4f}")
for a in (0.7, 0.8, 0.85, 0.9):
    print(f" a={a:.2f} batch_gamma={batch_gamma(c, [a] * B, 4, 0.0, be.DRAFT_HURDLE)} rates by K:",
          [round(B * sum(a ** i for i in range(k + 1)) / c.round_cost(k), 1) for k in range(5)])
eng = be.BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=B, num_speculative_tokens=4,
                                   max_new_tokens=NEW, gamma_policy=policy)
orig, log = eng._round, []


def logged(live, tkv, dkv):
    t = time.perf_counter()
    orig(live, tkv, dkv)
    ks = [r.stats.gammas[-1] for r in live]
    log.append((len(live), max(ks), sum(k > 0 for k in ks), sum(r.gamma_state.acceptance for r in live) / len(live),
                sum(r.draft_behind for r in live), 1000 * (time.perf_counter() - t),
                min(NEW - len(r.new) for r in live)))


eng._round = logged
eng.generate_many(items)
for i, (rows, k, drafting, a, behind, ms, left) in enumerate(log):
    print(f"{i}: rows {rows} K {k} drafting {drafting} acc {a:.2f} behind {behind} {ms:.0f} ms, fewest left {left}")
print(f"admitting {eng.admit_s:.1f} s in {eng.admitted[1]} prefill passes of the target")
