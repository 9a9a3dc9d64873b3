"""Scratch: two costs behind BENCHMARKS' "Plain batching with HF's static cache, and long prompts".

1. Attention over a long cache by query length: one `scaled_dot_product_attention` call at
   B=64 rows, 6 heads, 640 cache columns, head dim 64 (the quick pair at 512 + 128 tokens),
   for 1, 2, 3 and 5 query tokens, without a mask and with bool/float masks.
2. Prefill of 64 prompts of 511 tokens with the quick pair's target, in one pass or in passes
   of fewer rows.

Run after `python -m pipeline.bench --quick` (uses its cached quick pair), on a quiet machine:
python benchmarks/long_prompt_costs.py
"""
import glob
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

torch.set_num_threads(2)

B, H, C, D = 64, 6, 640, 64
k, v = torch.randn(B, H, C, D), torch.randn(B, H, C, D)
for rep in range(2):
    for q in (1, 2, 3, 5):
        x = torch.randn(B, H, q, D)
        for kind, mask in (("none", None), ("bool", torch.ones(B, 1, q, C, dtype=torch.bool)),
                           ("float", torch.zeros(B, 1, q, C))):
            F.scaled_dot_product_attention(x, k, v, attn_mask=mask)
            t0 = time.perf_counter()
            for _ in range(10):
                F.scaled_dot_product_attention(x, k, v, attn_mask=mask)
            print(f"sdpa rep {rep} q={q} mask={kind}: {(time.perf_counter() - t0) / 10 * 1000:.2f} ms", flush=True)

pair = sorted(glob.glob("benchmarks/.cache/synthetic-2000-*"))[0]
target = AutoModelForCausalLM.from_pretrained(pair + "/target").eval()
L = 511
ids = torch.randint(3, 2000, (64, L))
with torch.inference_mode():
    for rep in range(2):
        for rows in (64, 32, 16, 8, 4):
            t0 = time.perf_counter()
            for i in range(0, 64, rows):
                target(ids[i : i + rows], attention_mask=torch.ones(rows, L, dtype=torch.long), use_cache=True,
                       logits_to_keep=1)
            print(f"prefill rep {rep}, 64 x {L} tokens in passes of {rows} rows: {time.perf_counter() - t0:.2f} s",
                  flush=True)
