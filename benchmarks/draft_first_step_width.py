"""How wide a batch's draft steps are, and what each width costs: after a row keeps every draft, the next round's
first draft step feeds two tokens (its last draft and the target's), which widens the whole padded pass.

One-off. `python benchmarks/draft_first_step_width.py [B]` (quick pair, 192 prompts of 48 tokens, 24 new, gamma 1
and 2, 1 thread; default B = 32).
"""

import collections
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

import specdec_core.batch_kv as bk
from pipeline.bench import throughput as tp
from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair, synthetic_prompts
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter
from specdec_core.loading import load_model

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    b = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    torch.set_num_threads(1)
    dirs = build_synthetic_pair(QUICK_SYNTH, ROOT / "benchmarks/.cache")
    tok = AutoTokenizer.from_pretrained(dirs["target"])
    ids = [tok(t)["input_ids"] for _, t in synthetic_prompts(QUICK_SYNTH, 192, 48)]
    target, draft = (prepare_for_cpu(load_model(str(dirs[k]), torch.device("cpu"), torch.float32))
                     for k in ("target", "draft"))
    widths: dict[int, list] = collections.defaultdict(lambda: [0, 0.0])
    forward = bk.BatchKV.forward

    def timed(self, feeds, logits=True, last=False):
        t = time.perf_counter()
        out = forward(self, feeds, logits, last)
        if self.model is draft and last and len(feeds) == b:  # a draft step of a full batch
            entry = widths[max(len(f) for f in feeds)]
            entry[0] += 1
            entry[1] += time.perf_counter() - t
        return out
    bk.BatchKV.forward = timed
    tp.ours_batched(target, ModelDrafter(draft), ids[:2], 2, 2, 4)  # warm-up
    for gamma in (1, 2):
        widths.clear()
        tp.ours_batched(target, ModelDrafter(draft), ids, b, gamma, 24)
        print(f"gamma {gamma}, B = {b}: full-batch draft steps by feed width (steps, ms a step):",
              {w: (n, round(1000 * s / n, 2)) for w, (n, s) in sorted(widths.items())})


if __name__ == "__main__":
    main()
