"""Which cache layout a CPU should decode in: the padded batch cache (`BatchKV`, `--cuda_graphs off`)
against fixed slots run eagerly (`SlotKV`, `--cuda_graphs on`, which on a CPU runs its passes without
graphs), and at batch 1 the growing cache against the one-row static cache; same prompts, the two
alternating, outputs checked equal. The quick synthetic pair of `pipeline.bench`.

    python benchmarks/cpu_layouts.py [--threads 1] [--batches 8,16,32] [--prompts 64] [--reps 2] [--adaptive]

--adaptive: the draft under `--gamma_policy adaptive` (its costs learnt at the batch's width before the
clock, as `pipeline.bench.throughput` does), not at gamma 2.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair, synthetic_prompts
from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.gamma import AdaptiveGamma
from specdec_core.loading import load_model


def timed(run, n_tokens: int) -> tuple[float, list]:
    t0 = time.perf_counter()
    out = run()
    return n_tokens / (time.perf_counter() - t0), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batches", default="8,16,32")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--prompt_tokens", type=int, default=48)
    p.add_argument("--max_new_tokens", type=int, default=24)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--cache_dir", default="benchmarks/.cache")
    p.add_argument("--adaptive", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    logging.disable(logging.INFO)
    dirs = build_synthetic_pair(QUICK_SYNTH, Path(a.cache_dir))
    cpu = torch.device("cpu")
    target = prepare_for_cpu(load_model(str(dirs["target"]), cpu, torch.float32))
    draft = prepare_for_cpu(load_model(str(dirs["draft"]), cpu, torch.float32))
    tok = AutoTokenizer.from_pretrained(dirs["target"])
    ids = [tok(t)["input_ids"] for _, t in synthetic_prompts(QUICK_SYNTH, a.prompts, a.prompt_tokens)]
    new = a.max_new_tokens
    print("| B | drafter | padded / growing (tokens/s) | slots / static, eager (tokens/s) | ratio | outputs equal |")
    print("|---|---|---|---|---|---|")
    for b in [int(x) for x in a.batches.split(",")]:
        for name in ("model", "none"):
            runs = {}
            for mode in ("off", "on"):
                drafter = ModelDrafter(draft) if name == "model" else NoDrafter()
                if b == 1:
                    drafter = ModelDrafter(draft, cuda_graphs=mode) if name == "model" else NoDrafter()
                    gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=2, max_new_tokens=new,
                                               cuda_graphs=mode)
                    runs[mode] = lambda g=gen: [g.generate(q).tokens for q in ids]
                else:
                    policy = AdaptiveGamma(max_gamma=4) if a.adaptive and name == "model" else None
                    gamma = 4 if policy else 2
                    if policy:  # one new token: the rows never draft, so only the costs are learnt
                        BatchSpeculativeGenerator(target, drafter, batch_size=b, num_speculative_tokens=gamma,
                                                  max_new_tokens=1, gamma_policy=policy, cuda_graphs=mode
                                                  ).generate_many([(q, 0) for q in ids[:b]])
                    gen = BatchSpeculativeGenerator(target, drafter, batch_size=b, num_speculative_tokens=gamma,
                                                    max_new_tokens=new, cuda_graphs=mode, gamma_policy=policy)
                    runs[mode] = lambda g=gen: [o.tokens for o in g.generate_many([(q, 0) for q in ids])]
                runs[mode]()  # warm-up: first-call allocations, kernel choice
            speed, outs = {"off": [], "on": []}, {}
            for rep in range(a.reps):
                for mode in ("off", "on") if rep % 2 == 0 else ("on", "off"):
                    s, outs[mode] = timed(runs[mode], len(ids) * new)
                    speed[mode].append(s)
            off, on = (sum(speed[m]) / a.reps for m in ("off", "on"))
            print(f"| {b} | {name} | {off:.1f} | {on:.1f} | {on / off:.3f} | {outs['off'] == outs['on']} |", flush=True)


if __name__ == "__main__":
    main()
