"""Scratch: v(k) of the synthetic 325M bench target prepacked with oneDNN packing hints 8, 5 and 4
(the pack_rows of cpu_speed.prepare_for_cpu), interleaved, median of rounds, 1 thread.

Run after `python -m pipeline.bench` (uses its cached synthetic pair): HINTS=8,5,4 python benchmarks/pack_hint.py"""
import copy
import glob
import os
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.decoder import CachedDecoder

torch.set_num_threads(1)
path = sorted(glob.glob("benchmarks/.cache/synthetic-8000-*/target"))[0]
base = AutoModelForCausalLM.from_pretrained(path).eval()
hints = [int(x) for x in os.environ.get("HINTS", "8,5,4").split(",")]
models = {h: prepare_for_cpu(copy.deepcopy(base), pack_rows=h) for h in hints}
del base
ids = [10 + i % 7000 for i in range(112)]
extra = list(range(100, 120))
decs = {}
for h, m in models.items():
    decs[h] = CachedDecoder(m, ids)
    decs[h].forward(ids[:-1], 0)


def step(d, k):
    d.rollback(len(ids) - 1)
    d.forward(ids + extra[: k - 1], k)


ks = (1, 4, 5, 6)
times = {(h, k): [] for h in decs for k in ks}
for r in range(int(os.environ.get("ROUNDS", 12))):
    for k in ks:
        for h, d in (list(decs.items()) if r % 2 else list(decs.items())[::-1]):
            t = time.perf_counter()
            step(d, k)
            times[h, k].append(time.perf_counter() - t)
for h in decs:
    med = {k: statistics.median(times[h, k]) * 1e3 for k in ks}
    print(f"pack_rows {h}: 1-token {med[1]:.1f} ms; " + " ".join(f"v({k}) {med[k] / med[1]:.3f}" for k in ks[1:]))
print("load", os.getloadavg())
