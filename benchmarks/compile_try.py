"""Scratch: does torch.compile lower the verify cost v(k) of the synthetic 325M target on this CPU?

Run after `python -m pipeline.bench` (uses its cached synthetic pair):
OMP_WAIT_POLICY=PASSIVE python benchmarks/compile_try.py   (prints compile time, t(1), v(k), load)"""
import glob
import os
import time

import torch
from transformers import AutoModelForCausalLM

from specdec_core.decoder import CachedDecoder

torch.set_num_threads(int(os.environ.get("NT", 2)))
path = sorted(glob.glob("benchmarks/.cache/synthetic-8000-*/target"))[0]
stock = AutoModelForCausalLM.from_pretrained(path).eval()
ids = list(range(10, 74))
extra = list(range(100, 120))


def timings(model, ks=(1, 2, 3, 5, 9), reps=3):
    dec = CachedDecoder(model, ids)
    dec.forward(ids[:-1], 0)
    out = {}
    for k in ks:
        ts = []
        for _ in range(reps):
            dec.rollback(len(ids) - 1)
            t0 = time.perf_counter()
            dec.forward(ids + extra[: k - 1], k)
            ts.append(time.perf_counter() - t0)
        out[k] = sorted(ts)[reps // 2]
    return out


compiled = AutoModelForCausalLM.from_pretrained(path).eval()
t0 = time.perf_counter()
compiled.forward = torch.compile(compiled.forward, dynamic=True)
with torch.inference_mode():
    timings(compiled, reps=1)  # compiles (dynamic shapes)
print(f"compile+first calls {time.perf_counter() - t0:.0f} s", flush=True)
c0, w0 = time.process_time(), time.perf_counter()
for name, m in (("stock", stock), ("compiled", compiled), ("stock", stock), ("compiled", compiled)):
    with torch.inference_mode():
        t = timings(m)
    print(name, f"t1 {t[1] * 1e3:.1f} ms", {k: round(v / t[1], 2) for k, v in t.items() if k > 1}, flush=True)
print("load", os.getloadavg(), "cpu/wall", (time.process_time() - c0) / (time.perf_counter() - w0))
