"""One-off: tokens/s, target prefill passes and drafted row-rounds of one batched call (quick pair, 256 prompts of
128 tokens, 48 new, 2 threads): the batch rule as it is ("adaptive"), with a batch that does not draft starting only
past twice the hurdle ("h10", patched in here), and drafting nothing ("none"), alternating.

Run from the root: `PYTHONPATH=. python benchmarks/restart_hurdle.py 32 adaptive,h10,none 3` (B, configs, rounds)."""

import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

import specdec_core.batch_engine as be
from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair, synthetic_prompts
from pipeline.bench.throughput import ours_batched
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter, NoDrafter
from specdec_core.loading import load_model

torch.set_num_threads(2)
dirs = build_synthetic_pair(QUICK_SYNTH, Path(__file__).resolve().parent / ".cache")
cpu = torch.device("cpu")
target = prepare_for_cpu(load_model(str(dirs["target"]), cpu, torch.float32))
draft = prepare_for_cpu(load_model(str(dirs["draft"]), cpu, torch.float32))
tok = AutoTokenizer.from_pretrained(dirs["target"])
ids = [tok(p)["input_ids"] for _, p in synthetic_prompts(QUICK_SYNTH, 256, 128)]
seen = {}
generate_many = be.BatchSpeculativeGenerator.generate_many


def recorded(self, items, *args, **kwargs):
    out = generate_many(self, items, *args, **kwargs)
    seen.update(passes=self.admitted[1], drafted=sum(sum(1 for g in o.stats.gammas if g) for o in out))
    return out


be.BatchSpeculativeGenerator.generate_many = recorded
orig = be.BatchSpeculativeGenerator._batch_gamma
HYST = [False]


def patched(self, policy, live):
    if HYST[0] and not self._drafting:
        be.DRAFT_HURDLE = 0.10
    try:
        return orig(self, policy, live)
    finally:
        be.DRAFT_HURDLE = 0.05


be.BatchSpeculativeGenerator._batch_gamma = patched
b = int(sys.argv[1])
ours_batched(target, NoDrafter(), ids[:2], 2, 1, 4)  # warm-up
for config in sys.argv[2].split(",") * int(sys.argv[3]):
    HYST[0] = config == "h10"
    drafter, gamma = (ModelDrafter(draft), "adaptive") if config in ("adaptive", "h10") else (NoDrafter(), 1)
    _, secs, _ = ours_batched(target, drafter, ids, b, gamma, 48)
    drafted = seen["drafted"] if config != "none" else 0
    print(f"{config} B={b}: {len(ids) * 48 / secs:.1f} tokens/s; {seen['passes']} target prefill passes; "
          f"{drafted} row-rounds drafted", flush=True)
