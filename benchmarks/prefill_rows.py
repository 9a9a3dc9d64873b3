"""One-off: a CPU prefill pass's cost per row by the number of rows it admits (quick pair,
prompts of 128 tokens, 1 thread, best of 5): whether admitting rows together pays on a CPU.

    python benchmarks/prefill_rows.py   # after `python -m pipeline.bench.throughput --size quick` built the pair
"""

import time
from pathlib import Path

import torch

from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair
from specdec_core.batch_kv import BatchKV
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.loading import load_model


def main() -> None:
    torch.set_num_threads(1)
    dirs = build_synthetic_pair(QUICK_SYNTH, Path("benchmarks/.cache"))
    g = torch.Generator().manual_seed(0)
    print("| model | rows per pass | ms per pass | ms per row |\n|---|---|---|---|")
    for name in ("target", "draft"):
        model = prepare_for_cpu(load_model(str(dirs[name]), torch.device("cpu"), torch.float32))
        for rows in (1, 2, 4, 8, 16):
            best = float("inf")
            for _ in range(5):
                feeds = [torch.randint(3, QUICK_SYNTH.vocab - 10, (127,), generator=g).tolist() for _ in range(rows)]
                kv = BatchKV(model, rows)
                t0 = time.perf_counter()
                kv.forward(feeds, logits=False)
                best = min(best, time.perf_counter() - t0)
            print(f"| {name} | {rows} | {best * 1e3:.1f} | {best * 1e3 / rows:.1f} |")


if __name__ == "__main__":
    main()
