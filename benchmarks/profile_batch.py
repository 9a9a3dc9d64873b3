"""Scratch: where a batched run of our engine spends its time (cProfile), against plain HF batched
generate, on the quick synthetic pair: 2*B prompts of 64 tokens, 48 new tokens, gamma 2, 1 thread.

Run after `python -m pipeline.bench --quick` (uses its cached quick pair): python benchmarks/profile_batch.py 32
(the source of the 7.04 s -> 6.02 s and select+merge 1.16 s -> 0.33 s figures in BENCHMARKS.md).
Optional arguments after B: PROMPTS PROMPT_TOKENS NEW_TOKENS GAMMA THREADS, GAMMA 0 = no draft
(`python benchmarks/profile_batch.py 64 64 512 128 0 2`: the long-prompt profile in BENCHMARKS.md)."""
import cProfile
import glob
import pstats
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.bench.pairs import QUICK_SYNTH, synthetic_prompts
from pipeline.bench.throughput import hf_batched
from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter, NoDrafter

B = int(sys.argv[1]) if len(sys.argv) > 1 else 32
N, LEN, NEW, GAMMA, THREADS = ([int(x) for x in sys.argv[2:7]] + [2 * B, 64, 48, 2, 1][len(sys.argv[2:7]):])
torch.set_num_threads(THREADS)
pair = sorted(glob.glob("benchmarks/.cache/synthetic-2000-*"))[0]
target = prepare_for_cpu(AutoModelForCausalLM.from_pretrained(pair + "/target").eval())
draft = prepare_for_cpu(AutoModelForCausalLM.from_pretrained(pair + "/draft").eval())
tok = AutoTokenizer.from_pretrained(pair + "/target")
ids = [tok(text)["input_ids"] for _, text in synthetic_prompts(QUICK_SYNTH, N, LEN)]

forwards = {"s": 0.0, "n": 0}
for model in (target, draft):
    def timed(*a, _forward=model.forward, **k):
        t = time.perf_counter()
        out = _forward(*a, **k)
        forwards["s"] += time.perf_counter() - t
        forwards["n"] += 1
        return out
    model.forward = timed

gen = BatchSpeculativeGenerator(target, ModelDrafter(draft) if GAMMA else NoDrafter(), batch_size=B,
                                num_speculative_tokens=max(GAMMA, 1), max_new_tokens=NEW)
gen.generate_many([(p, 0) for p in ids[:B]])  # warm-up
forwards.update(s=0.0, n=0)
t0 = time.perf_counter()
prof = cProfile.Profile()
prof.enable()
outs = gen.generate_many([(p, 0) for p in ids])
prof.disable()
wall = time.perf_counter() - t0
print(f"ours B={B}: {wall:.2f} s, forwards {forwards['s']:.2f} s ({forwards['n']}), "
      f"{sum(len(o.tokens) for o in outs) / wall:.0f} tokens/s")
pstats.Stats(prof).sort_stats("cumulative").print_stats("batch_kv|batch_engine|kv_cache")
forwards.update(s=0.0, n=0)
t0 = time.perf_counter()
hf_outs, _ = hf_batched(target, ids, B, NEW)
wall = time.perf_counter() - t0
print(f"plain HF B={B}: {wall:.2f} s, forwards {forwards['s']:.2f} s ({forwards['n']}), "
      f"{sum(len(x) for x in hf_outs) / wall:.0f} tokens/s")
