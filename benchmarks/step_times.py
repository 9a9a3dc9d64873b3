"""The 1-token step and the 5-token pass of the bench's 325M target (packed kernels), and one small
KV-cache `torch.cat`, under the current thread count and OpenMP wait policy: why
`OMP_WAIT_POLICY` is best left unset on a machine of your own. Cited in docs/performance.md and
BENCHMARKS.md ("Costs behind the CPU choices").

Run after `python -m pipeline.bench --pairs synthetic` (builds the 325M pair):

    for p in PASSIVE ACTIVE; do for n in 1 2; do OMP_WAIT_POLICY=$p NT=$n python benchmarks/step_times.py; done; done
"""
import glob
import os
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.decoder import CachedDecoder

torch.set_num_threads(int(os.environ.get("NT", 2)))
path = sorted(glob.glob("benchmarks/.cache/synthetic-8000-*/target"))[0]
model = prepare_for_cpu(AutoModelForCausalLM.from_pretrained(path).eval())
ids, extra = list(range(10, 74)), list(range(100, 120))
dec = CachedDecoder(model, ids)
dec.forward(ids[:-1], 0)


def step(k: int) -> float:
    dec.rollback(len(ids) - 1)
    t0 = time.perf_counter()
    dec.forward(ids + extra[: k - 1], k)
    return time.perf_counter() - t0


for k in (1, 5, 1, 5):
    step(k)
times: dict[int, list[float]] = {1: [], 5: []}
for _ in range(5):
    for k in times:
        times[k].append(step(k))
a, b = torch.randn(1, 16, 68, 64)[:, :, :63], torch.randn(1, 16, 5, 64)  # a cropped cache + 5 new positions
t0 = time.perf_counter()
for _ in range(200):
    torch.cat([a, b], -2)
cat_us = (time.perf_counter() - t0) / 200 * 1e6
print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')} threads={torch.get_num_threads()} "
      + " ".join(f"{k}-token {statistics.median(v) * 1e3:.1f} ms" for k, v in times.items())
      + f" cat {cat_us:.1f} us load {os.getloadavg()[0]:.2f}")
