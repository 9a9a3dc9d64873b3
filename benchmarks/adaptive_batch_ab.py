"""Scratch: adaptive gamma in a batch with and without the draft's prefill in its rule.

Three configs of our batched engine, alternating, on the bench's synthetic pair: adaptive gamma
as it is (the draft's prefill of each prompt, spread over its tokens, counts against drafting,
and prompts admitted while the batch does not draft skip that prefill), adaptive as before
(`Before`: neither), and no draft. Outputs must be identical. The costs are measured once at
this B, before the clocks, and shared (as a job measures them once per worker).

Run after `python -m pipeline.bench --quick` (or `--pairs synthetic` for `full`), on a quiet machine:
python benchmarks/adaptive_batch_ab.py SIZE B PROMPTS PROMPT_TOKENS NEW_TOKENS REPS [draft|bad_draft]
python benchmarks/adaptive_batch_ab.py quick 128 512 128 48 2
python benchmarks/adaptive_batch_ab.py quick 64 256 128 48 2 bad_draft   # the disagreeing draft
"""
import glob
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.bench.pairs import FULL_SYNTH, QUICK_SYNTH, synthetic_prompts
from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter, NoDrafter
from specdec_core.gamma import AdaptiveGamma


class Before(BatchSpeculativeGenerator):
    """The rule before: no prefill term, and every newcomer prefilled in the draft."""

    def _prefill_per_token(self, costs):
        return 0.0

    def _batch_gamma(self, policy, live):
        k = super()._batch_gamma(policy, live)
        self._drafting = True
        return k


torch.set_num_threads(2)
size, (B, N, L, NEW, REPS) = sys.argv[1], (int(x) for x in sys.argv[2:7])
spec = {"quick": QUICK_SYNTH, "full": FULL_SYNTH}[size]
pair = sorted(glob.glob(f"benchmarks/.cache/synthetic-{spec.vocab}-*"))[0]
target = prepare_for_cpu(AutoModelForCausalLM.from_pretrained(pair + "/target").eval())
which = sys.argv[7] if len(sys.argv) > 7 else "draft"
draft = prepare_for_cpu(AutoModelForCausalLM.from_pretrained(f"{pair}/{which}").eval())
tok = AutoTokenizer.from_pretrained(pair + "/target")
ids = [tok(t)["input_ids"] for _, t in synthetic_prompts(spec, N, L)]
costs = AdaptiveGamma(max_gamma=4)
BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=B, num_speculative_tokens=4, max_new_tokens=1,
                          gamma_policy=costs).generate_many([(p, 0) for p in ids[:B]])
print(f"costs at B={B}: c {costs.costs.c:.3f}, v {', '.join(f'{k}:{v:.2f}' for k, v in costs.costs.v.items())}")
configs = {"adaptive, prefill counted": BatchSpeculativeGenerator, "adaptive, before": Before, "no draft": None}
reference, speeds = None, {name: [] for name in configs}
for rep in range(REPS):
    for name in list(configs)[:: 1 if rep % 2 == 0 else -1]:
        cls = configs[name]
        policy = AdaptiveGamma(costs.costs, max_gamma=4)
        gen = (BatchSpeculativeGenerator(target, NoDrafter(), batch_size=B, max_new_tokens=NEW) if cls is None else
               cls(target, ModelDrafter(draft), batch_size=B, num_speculative_tokens=4, max_new_tokens=NEW,
                   gamma_policy=policy))
        t0 = time.perf_counter()
        out = gen.generate_many([(p, 0) for p in ids])
        secs = time.perf_counter() - t0
        tokens = [r.tokens for r in out]
        reference = reference or tokens
        assert tokens == reference, "outputs differ"
        rounds = [d for r in out for d in r.stats.drafts]
        drafting = sum(k > 0 for k in rounds) / max(len(rounds), 1)
        speeds[name].append(N * NEW / secs)
        print(f"{name}: {speeds[name][-1]:.1f} tokens/s ({secs:.1f} s; row-rounds drafting {drafting:.0%})", flush=True)
for name, s in speeds.items():
    print(f"{name}: {N * NEW * len(s) / sum(N * NEW / x for x in s):.1f} tokens/s over {len(s)} runs")
