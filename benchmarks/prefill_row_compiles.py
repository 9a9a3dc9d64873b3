"""One-off: compiled new-row prefills (inductor, CPU): each row count's first call (its compile) and steady pass.

Run in a checkout, `PYTHONPATH=. python benchmarks/prefill_row_compiles.py NAME REPS`, with
TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 for cold compiles; the figures are in docs/performance.md."""

import json
import statistics
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_core.pass_settings import PassSettings
from specdec_core.static_kv import StaticKV


def main(name: str, reps: int) -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg).eval()
    kv = StaticKV(model, 16, graphs=False, batched=True, compile=True, settings=PassSettings(compile_prefills=True))
    g = torch.Generator().manual_seed(1)

    def timed(rows: int) -> float:
        feeds = [torch.randint(3, 8000, (60,), generator=g).tolist() for _ in range(rows)]
        t0 = time.perf_counter()
        kv.prefill_rows(feeds, [0] * rows)
        return time.perf_counter() - t0

    timed(16)  # allocates the buffers, uncompiled
    out = {}
    for rows in (16, 4, 1):
        first = timed(rows)
        steady = statistics.median(timed(rows) for _ in range(reps))
        out[rows] = {"first_s": round(first, 2), "pass_ms": round(1000 * steady, 2)}
    print(name, json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
