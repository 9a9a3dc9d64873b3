"""Per-call cost of a DRAM-resident 1024x2816 linear at k rows under several CPU matmul paths: stock,
oneDNN-packed for 1 and for 8 rows (`onednn_packed_for_N`: the hint picks the blocked layout) and
MKL's packed GEMM; it records the load and CPU/wall. Why `--cpu_kernels prepacked` packs for 8 rows
and times its row threshold per CPU. Cited in docs/performance.md and BENCHMARKS.md.

    NT=1 python benchmarks/linear_paths.py
    NT=2 python benchmarks/linear_paths.py
"""
import os
import time

import torch
import torch.nn as nn

torch.set_num_threads(int(os.environ.get("NT", 1)))
torch.manual_seed(0)
N = 48
lins = [nn.Linear(1024, 2816, bias=False).eval() for _ in range(N)]
onednn = {n: [torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), n) for m in lins] for n in (1, 8)}
mkl = [torch.ops.mkl._mkl_reorder_linear_weight(m.weight.detach(), 1) for m in lins]


def run(fn, k, reps=5):
    x = torch.randn(1, k, 1024)
    ts = []
    with torch.inference_mode():
        for _ in range(reps):
            t0 = time.perf_counter()
            for i in range(N):
                fn(i, x)
            ts.append((time.perf_counter() - t0) / N * 1e6)
    ts.sort()
    return ts[len(ts) // 2]


paths = {
    "default": lambda i, x: lins[i](x),
    "onednn_packed_for_1": lambda i, x: torch.ops.mkldnn._linear_pointwise(x, onednn[1][i], None, "none", [], ""),
    "onednn_packed_for_8": lambda i, x: torch.ops.mkldnn._linear_pointwise(x, onednn[8][i], None, "none", [], ""),
    "mkl_packed": lambda i, x: torch.ops.mkl._mkl_linear(x, mkl[i], lins[i].weight, None, 1),
}
c0, w0 = time.process_time(), time.perf_counter()
for k in (1, 2, 3, 4, 5, 8):
    print(k, {n: round(run(f, k)) for n, f in paths.items()}, flush=True)
print("load", os.getloadavg(), "cpu/wall", (time.process_time() - c0) / (time.perf_counter() - w0))
