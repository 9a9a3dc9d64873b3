"""Where a wide CPU batch's time goes, with and without a draft: rounds, prefills, compaction.

One-off: asks whether adaptive gamma's loss at wide CPU batches lies in its rounds (which it
prices) or outside them, and what the batch rule's hurdle (`DRAFT_HURDLE`) changes.
`python benchmarks/batch_time_outside_rounds.py [B] [prompts] [reps]` (quick pair, prompts of
48 tokens, 24 new, 1 thread; defaults 32 192 3).
"""

import collections
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

import specdec_core.batch_engine as be
import specdec_core.batch_kv as bk
from pipeline.bench import throughput as tp
from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair, synthetic_prompts
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter, NoDrafter
from specdec_core.loading import load_model

ROOT = Path(__file__).resolve().parents[1]
spent: collections.Counter = collections.Counter()
counting = [False]  # not during the throwaway call that measures adaptive gamma's costs


def timed(owner, name: str, key) -> None:
    fn = getattr(owner, name)

    def wrapper(self, *args, **kw):
        t = time.perf_counter()
        out = fn(self, *args, **kw)
        if counting[0]:
            spent[key(self, args) if callable(key) else key] += time.perf_counter() - t
        return out
    setattr(owner, name, wrapper)


def main() -> None:
    b, n, reps = ([int(x) for x in sys.argv[1:]] + [32, 192, 3][len(sys.argv) - 1:])[:3]
    torch.set_num_threads(1)
    dirs = build_synthetic_pair(QUICK_SYNTH, ROOT / "benchmarks/.cache")
    tok = AutoTokenizer.from_pretrained(dirs["target"])
    ids = [tok(t)["input_ids"] for _, t in synthetic_prompts(QUICK_SYNTH, n, 48)]
    target, draft = (prepare_for_cpu(load_model(str(dirs[k]), torch.device("cpu"), torch.float32))
                     for k in ("target", "draft"))
    gen = be.BatchSpeculativeGenerator.generate_many

    def generate_many(self, *a, **kw):
        counting[0] = self.max_new_tokens > 1
        return gen(self, *a, **kw)
    be.BatchSpeculativeGenerator.generate_many = generate_many
    timed(be.BatchSpeculativeGenerator, "_round", "rounds")
    timed(be.BatchSpeculativeGenerator, "_prefill",
          lambda self, args: "target prefill" if args[0] is self.target else "draft prefill")
    timed(bk.BatchKV, "compact", "compaction")
    hurdle = be.DRAFT_HURDLE
    configs = [("alone", NoDrafter, 1, hurdle), ("gamma 1", lambda: ModelDrafter(draft), 1, hurdle),
               ("gamma 2", lambda: ModelDrafter(draft), 2, hurdle),
               ("adaptive", lambda: ModelDrafter(draft), "adaptive", hurdle),
               ("adaptive, no hurdle", lambda: ModelDrafter(draft), "adaptive", 0.0)]
    tp.ours_batched(target, ModelDrafter(draft), ids[:2], 2, 2, 4)  # warm-up
    seen: dict[str, list[dict]] = collections.defaultdict(list)
    ref = None
    for rep in range(reps):
        for name, make, gamma, be.DRAFT_HURDLE in configs if rep % 2 == 0 else configs[::-1]:
            spent.clear()
            outs, secs, _ = tp.ours_batched(target, make(), ids, b, gamma, 24)
            assert ref is None or outs == ref, f"{name}: outputs differ"
            ref = outs
            seen[name].append({"total": secs, **spent, "rest": secs - sum(spent.values())})
    keys = ["total", "rounds", "target prefill", "draft prefill", "compaction", "rest"]
    print(f"B = {b}, {n} prompts, {reps} reps: seconds, median of each part; tokens/s against the target alone's, "
          "median of the reps' ratios")
    print("| config | " + " | ".join(keys) + " | / alone |\n|---|" + "---|" * (len(keys) + 1))
    alone = [r["total"] for r in seen["alone"]]
    for name, runs in seen.items():
        ratio = statistics.median(a / r["total"] for a, r in zip(alone, runs, strict=True))
        print(f"| {name} | " + " | ".join(f"{statistics.median(r.get(k, 0.0) for r in runs):.2f}" for k in keys)
              + f" | {ratio:.3f} |")


if __name__ == "__main__":
    main()
