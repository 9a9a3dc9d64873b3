"""How many admissions (prefill passes per model) a batched job makes, target alone against
drafting: alone, rows that start together finish together and are admitted in groups; with a
draft, each row's acceptance ends it at its own round, so rows enter one or two at a time, and
each admission was one eager prefill, launch-bound on a GPU. The bench's tiny pair on a CPU
(outputs and admissions only, no timing); prompts of 64-256 tokens, gamma 4, as the GPU bench.

    python benchmarks/admission_count.py [B] [prompts] [new tokens] [damp] [shape]

damp: the tiny pair's damping of the target's layers past the draft's (lower: higher acceptance);
shape: the bench's "tiny" (Llama, the default) or "tiny-t5" (an encoder-decoder pair whose draft
runs the target's encoder: each admission was an eager encoder pass and cross-attention pass).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.bench.gpu import SHAPES, build_pair, distinct_prompts  # noqa: E402
from specdec_core.batch_engine import BatchSpeculativeGenerator  # noqa: E402
from specdec_core.drafters import ModelDrafter, NoDrafter  # noqa: E402


def main() -> None:
    shape = SHAPES[sys.argv[5] if len(sys.argv) > 5 else "tiny"]
    args = sys.argv[1:5] + ["8", "64", "32", str(shape.damp)][len(sys.argv[1:5]):]
    b, n, new, damp = int(args[0]), int(args[1]), int(args[2]), float(args[3])
    torch.set_num_threads(2)
    target, draft = build_pair(dataclasses.replace(shape, damp=damp), torch.device("cpu"), torch.float32)
    items = [(p, 0) for p in distinct_prompts(n, 64, 256, shape.vocab, seed=2)]
    for name, drafter in (("target alone", NoDrafter()), ("draft, chained", ModelDrafter(draft, chain=True))):
        engine = BatchSpeculativeGenerator(target, drafter, batch_size=b, num_speculative_tokens=4,
                                           max_new_tokens=new, cuda_graphs="on")
        sizes, admit = [], engine._admit

        def counted(*args, admit=admit, sizes=sizes, **kwargs):
            rows = admit(*args, **kwargs)
            sizes.append(len(rows))
            return rows

        engine._admit = counted
        out = engine.generate_many(items)
        rounds = max(len(g.stats.gammas) for g in out)  # a round per verify pass of the busiest row
        drafted = sum(g.stats.draft_tokens for g in out)
        acceptance = sum(g.stats.accepted_tokens for g in out) / drafted if drafted else 0.0
        print(f"B={b} {name}: {len(sizes)} admissions of {sum(sizes)} rows (1 row: {sizes.count(1)}), "
              f"acceptance {acceptance:.2f}, longest row {rounds} rounds")


if __name__ == "__main__":
    main()
