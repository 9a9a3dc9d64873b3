"""One-row cost of a linear with fp32 weights against `Bf16Linear` (bf16 weights packed for oneDNN,
fp32 in and out, casts included), by shape: where the draft's bf16 linears (`--draft_dtype auto`)
start to pay. Cited in docs/performance.md and BENCHMARKS.md ("Costs behind the CPU choices").

Needs a CPU with native bf16 (the weights stay in cache):

    NT=2 python benchmarks/bf16_linears.py
"""
import os
import time

import torch
from torch import nn

from specdec_core.cpu_speed import Bf16Linear, bf16_native

torch.set_num_threads(int(os.environ.get("NT", 2)))
if not bf16_native():
    raise SystemExit("this CPU has no native bf16: Bf16Linear is never used here")


def per_call_us(module, x, n=2000):
    for _ in range(50):
        module(x)
    t0 = time.perf_counter()
    for _ in range(n):
        module(x)
    return (time.perf_counter() - t0) / n * 1e6


with torch.inference_mode():
    for out_f, in_f in [(2048, 128), (512, 512), (1024, 384), (1024, 1024), (2816, 1024)]:
        lin = nn.Linear(in_f, out_f, bias=False)
        b16 = Bf16Linear(lin)
        x = torch.randn(1, 1, in_f)
        print(f"{out_f}x{in_f} ({out_f * in_f} weights): fp32 {per_call_us(lin, x):.1f} us, "
              f"bf16 weights {per_call_us(b16, x):.1f} us", flush=True)
