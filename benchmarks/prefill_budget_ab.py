"""Whole batched jobs with the CPU prefill budget (`CPU_PREFILL_TOKENS`, 2048 prompt tokens per
pass) against one prefill pass per admission, alternating, 3 runs each, on the quick bench pair;
outputs must be identical. Cited in docs/batching.md and BENCHMARKS.md ("Prefill in passes").

Run after `python -m pipeline.bench --quick` (builds the quick pair), on a quiet machine:

    python benchmarks/prefill_budget_ab.py B PROMPTS PROMPT_TOKENS NEW_TOKENS GAMMA   # GAMMA 0: no draft
    python benchmarks/prefill_budget_ab.py 64 64 512 128 0
"""
import glob
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.bench.pairs import QUICK_SYNTH, synthetic_prompts
from specdec_core.batch_engine import CPU_PREFILL_TOKENS, BatchSpeculativeGenerator
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter, NoDrafter

torch.set_num_threads(2)
B, N, L, NEW, GAMMA = (int(x) for x in sys.argv[1:6])
pair = sorted(glob.glob("benchmarks/.cache/synthetic-2000-*"))[0]
target = prepare_for_cpu(AutoModelForCausalLM.from_pretrained(pair + "/target").eval())
draft = prepare_for_cpu(AutoModelForCausalLM.from_pretrained(pair + "/draft").eval())
tok = AutoTokenizer.from_pretrained(pair + "/target")
ids = [tok(t)["input_ids"] for _, t in synthetic_prompts(QUICK_SYNTH, N, L)]
reference = None
for rep in range(3):
    for budget in (10**9, CPU_PREFILL_TOKENS)[:: 1 if rep % 2 == 0 else -1]:
        gen = BatchSpeculativeGenerator(target, ModelDrafter(draft) if GAMMA else NoDrafter(), batch_size=B,
                                        num_speculative_tokens=max(GAMMA, 1), max_new_tokens=NEW,
                                        prefill_tokens=budget)
        t0 = time.perf_counter()
        tokens = [r.tokens for r in gen.generate_many([(p, 0) for p in ids])]
        secs = time.perf_counter() - t0
        reference = reference or tokens
        assert tokens == reference, "outputs differ"
        label = "one pass" if budget == 10**9 else f"{budget} tokens per pass"
        print(f"prefill in {label}: {N * NEW / secs:.1f} tokens/s ({secs:.1f} s)", flush=True)
