"""One-off: the draft's prefill work and drafted row-rounds of one adaptive call per batch width (quick pair,
256 prompts of 128 tokens, 48 new), to see what an empty batch's start decision saves.

Run from a tree's root: `PYTHONPATH=. python benchmarks/draft_prefill_at_start.py 64,128` (an older commit: its
worktree as the working directory and PYTHONPATH, this file by its path)."""

import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

import specdec_core.batch_engine as be
from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair, synthetic_prompts
from pipeline.bench.throughput import ours_batched
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter
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
    seen.update(draft=list(self._draft_prefill), admitted=list(self.admitted),
                drafted=sum(sum(1 for g in o.stats.gammas if g) for o in out),
                rounds=sum(len(o.stats.gammas) for o in out))
    return out


be.BatchSpeculativeGenerator.generate_many = recorded
for b in map(int, sys.argv[1].split(",")):
    ours_batched(target, ModelDrafter(draft), ids[:2], 2, "adaptive", 4)  # warm-up
    _, secs, _ = ours_batched(target, ModelDrafter(draft), ids, b, "adaptive", 48)
    s, prompts, tokens = seen["draft"]
    print(f"B={b}: {secs:.2f} s; draft prefill {s:.2f} s, {prompts} prompts, {tokens} tokens; "
          f"{seen['admitted'][0]} rows in {seen['admitted'][1]} target prefill passes; "
          f"{seen['drafted']} of {seen['rounds']} row-rounds drafted", flush=True)
