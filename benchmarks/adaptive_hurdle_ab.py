"""Batch adaptive gamma with its hurdle (`DRAFT_HURDLE`) against without it, the target alone and gamma 2, paired.

One-off: all four configs in one process on the same weights, alternating order each rep; greedy outputs must be
equal. `python benchmarks/adaptive_hurdle_ab.py B PROMPTS REPS [bad]` (quick pair, prompts of 48 tokens, 24 new,
1 thread; `bad`: the pair's draft that never agrees).
"""

import statistics
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

import specdec_core.batch_engine as be
from pipeline.bench import throughput as tp
from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair, synthetic_prompts
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter, NoDrafter
from specdec_core.loading import load_model

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    b, n, reps = (int(x) for x in sys.argv[1:4])
    torch.set_num_threads(1)
    dirs = build_synthetic_pair(QUICK_SYNTH, ROOT / "benchmarks/.cache")
    tok = AutoTokenizer.from_pretrained(dirs["target"])
    ids = [tok(t)["input_ids"] for _, t in synthetic_prompts(QUICK_SYNTH, n, 48)]
    target = prepare_for_cpu(load_model(str(dirs["target"]), torch.device("cpu"), torch.float32))
    kind = "bad_draft" if sys.argv[4:] == ["bad"] else "draft"
    draft = prepare_for_cpu(load_model(str(dirs[kind]), torch.device("cpu"), torch.float32))
    hurdle = be.DRAFT_HURDLE
    configs = [("alone", NoDrafter, 1, hurdle), ("gamma 2", lambda: ModelDrafter(draft), 2, hurdle),
               ("adaptive", lambda: ModelDrafter(draft), "adaptive", hurdle),
               ("adaptive, no hurdle", lambda: ModelDrafter(draft), "adaptive", 0.0)]
    tp.ours_batched(target, ModelDrafter(draft), ids[:2], 2, 2, 4)  # warm-up
    secs: dict[str, list[float]] = {}
    ref = None
    for rep in range(reps):
        for name, make, gamma, be.DRAFT_HURDLE in configs if rep % 2 == 0 else configs[::-1]:
            outs, s, _ = tp.ours_batched(target, make(), ids, b, gamma, 24)
            assert ref is None or outs == ref, f"{name}: outputs differ"
            ref = outs
            secs.setdefault(name, []).append(s)
            print(f"{name}: {n * 24 / s:.1f} tokens/s", flush=True)
    for name, s in secs.items():
        alone = statistics.median(a / x for a, x in zip(secs["alone"], s, strict=True))
        g2 = statistics.median(a / x for a, x in zip(secs["gamma 2"], s, strict=True))
        print(f"B = {b} {name}: {n * 24 / statistics.median(s):.1f} tokens/s; tokens/s / alone {alone:.3f}, "
              f"/ gamma 2 {g2:.3f} (medians of the reps' ratios)")


if __name__ == "__main__":
    main()
