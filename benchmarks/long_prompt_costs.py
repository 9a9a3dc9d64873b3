"""Attention over a long cache by query length: one `scaled_dot_product_attention` call at B=64
rows, 6 heads, 640 cache columns, head dim 64 (the quick pair at 512 + 128 tokens), for 1, 2, 3
and 5 query tokens, without a mask and with bool/float masks. Why decoding with speculation gets
cheaper per token at long contexts in a batch. Cited in BENCHMARKS.md ("Costs behind the CPU
choices"); prefill by pass size, the other cost of long prompts, is `prefill_passes.py`.

    python benchmarks/long_prompt_costs.py
"""
import time

import torch
import torch.nn.functional as F

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
