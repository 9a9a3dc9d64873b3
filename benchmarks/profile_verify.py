"""Scratch: where a k-token verify pass of the synthetic 325M target spends its time (torch.profiler).

Run after `python -m pipeline.bench` (uses its cached synthetic pair):
python benchmarks/profile_verify.py   (set OMP_WAIT_POLICY=PASSIVE to see each small op pay a thread wake-up)"""
import glob
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM

from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.decoder import CachedDecoder

torch.set_num_threads(int(os.environ.get("NT", 2)))
path = sorted(glob.glob("benchmarks/.cache/synthetic-8000-*/target"))[0]
model = prepare_for_cpu(AutoModelForCausalLM.from_pretrained(path).eval())
ids = list(range(10, 74))
dec = CachedDecoder(model, ids)
dec.forward(ids[:-1], 0)
extra = list(range(100, 120))


def step(k):
    dec.rollback(len(ids) - 1)
    dec.forward(ids + extra[: k - 1], k)


for k in (1, 5, 1, 5):
    step(k)
c0, w0 = time.process_time(), time.perf_counter()
for k in (1, 5):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step(k)
    print(f"== k={k}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
print("load", os.getloadavg(), "cpu/wall", (time.process_time() - c0) / (time.perf_counter() - w0))
