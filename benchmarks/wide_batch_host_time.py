"""One-off: host time of a wide batch on the GPU path's shape, measured on a CPU (docs/performance.md).

Tiny Llama pair, B = 128, 128 prompts, eager slots (`cuda_graphs="on"` on a CPU) with chained draft steps. Prints
(1) the milliseconds per round (gamma 3) spent outside the model passes (what a GPU would replay as graphs), and
(2) the milliseconds per round of the draft loop when no row drafts (every round K = 0, as adaptive gamma's plain
rounds). ROOT=<a checkout> measures that tree's engine (old against new: run both, alternating).
Usage: ROOT=/path/to/checkout python benchmarks/wide_batch_host_time.py
"""

import os
import random
import sys
import time

import torch

sys.path.insert(0, os.environ.get("ROOT", os.getcwd()))
from specdec_core import graphs, rounds  # noqa: E402
from specdec_core.batch_engine import BatchSpeculativeGenerator  # noqa: E402
from specdec_core.drafters import ModelDrafter  # noqa: E402
from tests.tiny_models import build_tokenizer, make_model, perturbed_copy  # noqa: E402

B, CALLS = 128, 9
torch.manual_seed(0)
torch.set_num_threads(1)
tok = build_tokenizer()
target = make_model("llama", tok, 0, layers=1, hidden=32).eval()
draft = perturbed_copy(target, 0.05, 1).eval()
rng = random.Random(0)
items = [([rng.randrange(3, 300) for _ in range(rng.randrange(8, 24))], i) for i in range(B)]
inside, drafting, host = [0.0], [0.0, 0], [0.0, 0]
run, draft_loop, one_round = graphs.PassGraphs.run, rounds.RoundEngine._draft, rounds.RoundEngine._round


def timed_run(self, *a, **k):
    t = time.perf_counter()
    try:
        return run(self, *a, **k)
    finally:
        inside[0] += time.perf_counter() - t


def timed_draft(self, *a, **k):
    t = time.perf_counter()
    try:
        return draft_loop(self, *a, **k)
    finally:
        drafting[0] += time.perf_counter() - t
        drafting[1] += 1


def timed_round(self, *a, **k):
    t, passes = time.perf_counter(), inside[0]
    try:
        return one_round(self, *a, **k)
    finally:
        host[0] += time.perf_counter() - t - (inside[0] - passes)
        host[1] += 1


graphs.PassGraphs.run, rounds.RoundEngine._draft, rounds.RoundEngine._round = timed_run, timed_draft, timed_round


def engine(max_new: int) -> BatchSpeculativeGenerator:
    return BatchSpeculativeGenerator(target, ModelDrafter(draft, chain=True), batch_size=B, num_speculative_tokens=3,
                                     max_new_tokens=max_new, cuda_graphs="on")


eng = engine(48)
eng.generate_many(items)
outside = []
for _ in range(CALLS):
    host[:] = [0.0, 0]
    eng.generate_many(items)
    outside.append(host[0] / host[1] * 1e3)
plain = engine(32)
plain._gammas = lambda live, dkv: ([0] * len(live), True)  # every round: no row drafts
plain.generate_many(items)
per_round = []
for _ in range(CALLS):
    drafting[:] = [0.0, 0]
    plain.generate_many(items)
    per_round.append(drafting[0] / drafting[1] * 1e3)
outside.sort()
per_round.sort()
print(f"{os.environ.get('ROOT', os.getcwd())}: ms per round outside passes, median {outside[CALLS // 2]:.2f} "
      f"(min {outside[0]:.2f}); draft loop ms per round at K = 0, median {per_round[CALLS // 2]:.3f}")
