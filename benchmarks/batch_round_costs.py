"""What the adaptive gamma rule measures at batch width B against what a round really costs.

Prints the costs the batched engine measures at width B (c and v(k), in 1-token passes over the
same rows), the gammas the adaptive policy then drafts, and, for fixed gamma 1 and no draft, the
median time of a round while all B rows are live. Cited in docs/batching.md and BENCHMARKS.md
("Adaptive gamma at batch width").

Run after `python -m pipeline.bench --quick` (builds the quick pair), on a quiet machine:

    python benchmarks/batch_round_costs.py quick|full B PROMPTS PROMPT_TOKENS NEW_TOKENS
    python benchmarks/batch_round_costs.py quick 128 128 64 48
"""
import collections
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.bench.pairs import FULL_SYNTH, QUICK_SYNTH, build_synthetic_pair, synthetic_prompts
from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter, NoDrafter
from specdec_core.gamma import AdaptiveGamma

SIZE, (B, N, L, NEW) = sys.argv[1], (int(x) for x in sys.argv[2:6])
torch.set_num_threads(2)
spec = {"quick": QUICK_SYNTH, "full": FULL_SYNTH}[SIZE]
dirs = build_synthetic_pair(spec, Path("benchmarks/.cache"))
tok = AutoTokenizer.from_pretrained(dirs["target"])
target = prepare_for_cpu(AutoModelForCausalLM.from_pretrained(dirs["target"]).eval())
draft = prepare_for_cpu(AutoModelForCausalLM.from_pretrained(dirs["draft"]).eval())
ids = [tok(t)["input_ids"] for _, t in synthetic_prompts(spec, N, L)]


def engine(drafter, gamma, new, policy=None):
    return BatchSpeculativeGenerator(target, drafter, batch_size=B, num_speculative_tokens=gamma, max_new_tokens=new,
                                     gamma_policy=policy)


policy = AdaptiveGamma(max_gamma=4)
engine(ModelDrafter(draft), 4, 1, policy).generate_many([(p, 0) for p in ids[:B]])  # measures the costs only
print("costs at this width:", policy.costs)
t = time.perf_counter()
outs = engine(ModelDrafter(draft), 4, NEW, policy).generate_many([(p, 0) for p in ids])
t = time.perf_counter() - t
ks = collections.Counter(k for o in outs for k in o.stats.gammas)
drafted = sum(o.stats.draft_tokens for o in outs)
print(f"adaptive: {N * NEW / t:.1f} tokens/s, row-rounds by gamma {sorted(ks.items())}, "
      f"acceptance {sum(o.stats.accepted_tokens for o in outs) / max(drafted, 1):.2f}")

for label, drafter in (("gamma 1", ModelDrafter(draft)), ("no draft", NoDrafter())):
    gen, rounds = engine(drafter, 1, NEW), []

    def timed(live, tkv, dkv, run=gen._round, rounds=rounds):
        t0 = time.perf_counter()
        run(live, tkv, dkv)
        rounds.append((time.perf_counter() - t0, len(live)))

    gen._round = timed
    t = time.perf_counter()
    gen.generate_many([(p, 0) for p in ids])
    t = time.perf_counter() - t
    full = sorted(x for x, n in rounds if n == B)
    print(f"{label}: {N * NEW / t:.1f} tokens/s, {len(rounds)} rounds, median round with {B} rows "
          f"{full[len(full) // 2] * 1e3:.1f} ms, rounds {sum(x for x, _ in rounds):.2f} s of {t:.2f} s")
