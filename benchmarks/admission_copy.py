"""Host time of moving rows prefilled together (one padded pass) into their slots: one write per
layer's keys and values for all rows (`SlotKV._copy`) against the row-by-row copy it replaced
(2 x layers x rows indexing ops). On a GPU those ops are launches the host queues one by one
while the GPU waits; here a Llama of TinyLlama's depth (22 layers) but tiny width stands in, so
that moving the numbers costs little and the host's work per op dominates (not a GPU figure).
One thread; each admission timed 5 times, the median kept.

    python benchmarks/admission_copy.py [ROWS ...]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_core.batch_kv import BatchKV  # noqa: E402
from specdec_core.slot_kv import SlotKV  # noqa: E402
from tests.tiny_models import build_tokenizer, make_model  # noqa: E402


def row_by_row(kv: SlotKV, slots: list[int], fresh: BatchKV) -> None:
    """The copy as it was: each row's valid columns, layer by layer."""
    lengths = [len(c) for c in fresh.cols]
    index = [torch.tensor(c) for c in fresh.cols]
    for layer, (fk, fv) in zip(kv.own_layers, fresh._layers(), strict=True):
        for j, (slot, n) in enumerate(zip(slots, lengths, strict=True)):
            if n:
                layer.keys[slot, :, :n] = fk[j, :, index[j]]
                layer.values[slot, :, :n] = fv[j, :, index[j]]


def main(sizes: list[int]) -> None:
    torch.set_num_threads(1)
    target = make_model("llama", build_tokenizer(), seed=0, layers=22, hidden=32).eval()
    gen = torch.Generator().manual_seed(0)
    print("| rows admitted together | one write per buffer, ms | row by row, ms | ratio |")
    print("|---|---|---|---|")
    for rows in sizes:
        lengths = torch.randint(64, 200, (rows,), generator=gen).tolist()
        feeds = [torch.randint(5, 300, (n,), generator=gen).tolist() for n in lengths]
        with torch.inference_mode():
            fresh = BatchKV(target, rows)
            fresh.forward(feeds, logits=False)
            kv = SlotKV(target, rows, graphs=False)
            kv.merge(fresh)  # buffers made and sized once
            times = {"one": [], "rows": []}
            for _ in range(5):
                for how in times:
                    t0 = time.perf_counter()
                    if how == "one":
                        kv._copy(list(range(rows)), fresh)
                    else:
                        row_by_row(kv, list(range(rows)), fresh)
                    times[how].append(time.perf_counter() - t0)
        one, by_row = (statistics.median(times[k]) * 1e3 for k in ("one", "rows"))
        print(f"| {rows} | {one:.2f} | {by_row:.2f} | {by_row / one:.1f}x |")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [4, 16, 64, 128])
