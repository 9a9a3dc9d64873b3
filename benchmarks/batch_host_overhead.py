"""Host time of the batch engine: a tiny pair (hidden 64, 3 layers) whose passes cost next to
nothing, so the job's time is the engine's own Python and tensor bookkeeping per row and pass,
which on a GPU sets the pace of a wide batch. 256 prompts of 16-64 tokens, B = 128, gamma 4,
32 new tokens, one thread; a warm-up job first.

    python benchmarks/batch_host_overhead.py [--profile]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.bench.gpu import SHAPES, build_pair, distinct_prompts  # noqa: E402
from specdec_core.batch_engine import BatchSpeculativeGenerator  # noqa: E402
from specdec_core.drafters import ModelDrafter  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    target, draft = build_pair(SHAPES["tiny"], torch.device("cpu"), torch.float32)
    items = [(p, 0) for p in distinct_prompts(256, 16, 64, SHAPES["tiny"].vocab, seed=1)]
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=128, num_speculative_tokens=4,
                                       max_new_tokens=32)
    engine.generate_many(items[:128])
    if "--profile" in sys.argv:
        cProfile.runctx("engine.generate_many(items)", globals(), locals(), "/tmp/batch_host.prof")
        pstats.Stats("/tmp/batch_host.prof").sort_stats("tottime").print_stats(15)
        return
    t0 = time.perf_counter()
    out = engine.generate_many(items)
    print(f"{time.perf_counter() - t0:.3f} s for {sum(len(g.tokens) for g in out)} tokens")


if __name__ == "__main__":
    main()
