"""Host time per speculative round with the passes made free: every pass over a static cache
returns the output it computed the first time for its (cache, width), as a graph replay costs the
host next to nothing. What remains is the engine's own work per round (drafting bookkeeping,
reading picks back, acceptance, rollbacks), which on a GPU adds to the GPU's time per round. A tiny
Llama pair (2-layer target, 1-layer draft, vocabulary 320), gamma 4, 128 new tokens, one thread;
a warm-up call first. The rounds' acceptance means nothing here (the outputs are frozen).

    python benchmarks/round_host_time.py [B ...] [--chain]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_core.batch_engine import BatchSpeculativeGenerator  # noqa: E402
from specdec_core.drafters import ModelDrafter  # noqa: E402
from specdec_core.engine import SpeculativeGenerator  # noqa: E402
from specdec_core.static_decoder import StaticKV  # noqa: E402
from tests.tiny_models import build_tokenizer, make_model  # noqa: E402

_stored: dict = {}


def free_run(self, key, inp, run, what, prefill=False):
    k = (id(self), key, tuple(inp.shape))
    if k not in _stored:
        _stored[k] = run(inp.to(self.device)).clone()
    return _stored[k]


def rounds_of(target, drafter, b: int, prompts: list[list[int]]):
    """A call that decodes 2 prompts per row of a batch of b (b = 1: the batch-1 engine)."""
    if b == 1:
        gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=4, max_new_tokens=128, cuda_graphs="on")
        return lambda: [gen.generate(p) for p in prompts[:2]]
    batch = BatchSpeculativeGenerator(target, drafter, batch_size=b, num_speculative_tokens=4, max_new_tokens=128,
                                      cuda_graphs="on")
    return lambda: batch.generate_many([(p, 0) for p in prompts[: 2 * b]])


def main() -> None:
    StaticKV._run = free_run
    torch.set_num_threads(1)
    tok = build_tokenizer()
    target, draft = make_model("llama", tok, 0, layers=2).eval(), make_model("llama", tok, 1, layers=1).eval()
    prompts = [tok(f"Summarize: the committee met on day {i} and agreed to fund the new library.")["input_ids"]
               for i in range(64)]
    chain = "--chain" in sys.argv
    for b in [int(a) for a in sys.argv[1:] if a.isdigit()] or [1, 8, 32]:
        drafter = ModelDrafter(draft, cuda_graphs="on", chain=chain)
        run = rounds_of(target, drafter, b, prompts)
        run()
        t0 = time.perf_counter()
        out = run()
        seconds = time.perf_counter() - t0
        rounds = sum(g.stats.verify_steps for g in out) / b  # a batch's rows share each round
        print(f"B={b} {'chained' if chain else 'stepped'} draft: {seconds * 1e3 / rounds:.3f} ms host per round "
              f"({rounds:.0f} rounds)")


if __name__ == "__main__":
    main()
