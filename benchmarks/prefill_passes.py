"""Prefill of many prompts in one target pass against passes of fewer rows: why
`specdec_core.batch_engine.CPU_PREFILL_TOKENS` is 2048. One pass over N prompts of L tokens, then
the same prompts in passes of R rows, twice in order. Cited in docs/batching.md and BENCHMARKS.md
("Prefill in passes").

Run after `python -m pipeline.bench --quick` (quick pair) or `python -m pipeline.bench --pairs
synthetic` (full), which build the pairs under benchmarks/.cache, on a quiet machine:

    python benchmarks/prefill_passes.py quick 64 511 64,8,4,2
    python benchmarks/prefill_passes.py quick 128 64 128,64,32,16,8,4
    python benchmarks/prefill_passes.py full 32 128 32,16,8,4
    python benchmarks/prefill_passes.py quick 64 511 64,8 profile   # torch.profiler, per pass size
"""
import glob
import sys
import time

import torch
from transformers import AutoModelForCausalLM

torch.set_num_threads(2)
size, n, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
row_counts = [int(r) for r in sys.argv[4].split(",")]
profile = sys.argv[5:] == ["profile"]
vocab = {"quick": 2000, "full": 8000}[size]
target = AutoModelForCausalLM.from_pretrained(sorted(glob.glob(f"benchmarks/.cache/synthetic-{vocab}-*"))[0]
                                              + "/target").eval()
ids = torch.randint(3, vocab, (n, length))


def passes(rows: int) -> None:
    for i in range(0, n, rows):
        chunk = ids[i : i + rows]
        target(chunk, attention_mask=torch.ones_like(chunk), use_cache=True, logits_to_keep=1)


with torch.inference_mode():
    passes(n)  # warm-up
    for rep in range(1 if profile else 2):
        for rows in row_counts:
            if profile:
                with torch.profiler.profile() as prof:
                    passes(rows)
                print(f"{n} x {length} tokens in passes of {rows} rows:")
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
            else:
                t0 = time.perf_counter()
                passes(rows)
                print(f"{size} rep {rep}: {n} x {length} tokens in passes of {rows} rows ({rows * length} tokens): "
                      f"{time.perf_counter() - t0:.2f} s", flush=True)
