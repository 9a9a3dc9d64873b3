"""The 1-token step and the k-token verify pass of the bench's 325M target with transformers'
`DynamicCache` (a `torch.cat` per step) against `specdec_core.kv_cache.GrowingCache` (writes in
place), interleaved, median of rounds; also checks that the logits are equal. Cited in
docs/performance.md and BENCHMARKS.md ("Costs behind the CPU choices").

Run after `python -m pipeline.bench --pairs synthetic` (builds the 325M pair); CTX sets the context:

    NT=1 CTX=112 python benchmarks/cache_inplace.py
    NT=1 CTX=512 python benchmarks/cache_inplace.py
"""
import glob
import os
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.decoder import CachedDecoder

torch.set_num_threads(int(os.environ.get("NT", 2)))
path = sorted(glob.glob(os.environ.get("PAIR", "benchmarks/.cache/synthetic-8000-*") + "/target"))[0]
model = prepare_for_cpu(AutoModelForCausalLM.from_pretrained(path).eval())
ctx = int(os.environ.get("CTX", 256))
ids = [10 + i % 7000 for i in range(ctx)]
extra = list(range(100, 120))


def make(kind):
    dec = CachedDecoder(model, ids)
    if kind == "dynamic":
        dec.cache = DynamicCache()
    dec.forward(ids[:-1], 0)
    return dec


def step(dec, k):
    dec.rollback(len(ids) - 1)
    return dec.forward(ids + extra[: k - 1], k)


decs = {kind: make(kind) for kind in ("dynamic", "inplace")}
for k in (1, 5):
    a, b = step(decs["dynamic"], k), step(decs["inplace"], k)
    print(f"k={k} max|d logit| dynamic vs inplace: {(a - b).abs().max().item():.2e}")
times = {(kind, k): [] for kind in decs for k in (1, 5)}
for _ in range(int(os.environ.get("ROUNDS", 15))):
    for k in (1, 5):
        for kind, dec in decs.items():
            t = time.perf_counter()
            step(dec, k)
            times[kind, k].append(time.perf_counter() - t)
for kind in decs:
    one, five = (statistics.median(times[kind, k]) * 1e3 for k in (1, 5))
    print(f"{kind:8s} ctx {ctx}: 1-token {one:.1f} ms, 5-token {five:.1f} ms, v(5) {five / one:.3f}")
print("load", os.getloadavg())
