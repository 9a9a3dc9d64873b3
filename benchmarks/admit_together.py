"""One-off: does waiting for free slots (`PassSettings.admit_together`) pay on this CPU?

`python benchmarks/admit_together.py PROMPT_TOKENS B F1,F2,... ROUNDS`: the quick bench pair, 64 prompts, 24 new tokens,
gamma 2, 1 thread; each F in turn, the order alternating per round; every output checked equal to the first run's.
"""

import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair, synthetic_prompts
from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter
from specdec_core.loading import load_model
from specdec_core.pass_settings import PassSettings

torch.set_num_threads(1)
ptoks, B, Fs, reps = int(sys.argv[1]), int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")], int(sys.argv[4])
dirs = build_synthetic_pair(QUICK_SYNTH, Path("benchmarks/.cache"))
cpu = torch.device("cpu")
target = prepare_for_cpu(load_model(str(dirs["target"]), cpu, torch.float32))
draft = prepare_for_cpu(load_model(str(dirs["draft"]), cpu, torch.float32))
tok = AutoTokenizer.from_pretrained(dirs["target"])
items = [(tok(p)["input_ids"], 0) for _, p in synthetic_prompts(QUICK_SYNTH, 64, ptoks)]


def run(f: int):
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=B, num_speculative_tokens=2,
                                       max_new_tokens=24, settings=PassSettings(admit_together=f))
    t0 = time.perf_counter()
    outs = engine.generate_many(items)
    return [o.tokens for o in outs], time.perf_counter() - t0, engine.admit_s, engine.admitted[1]


reference = run(1)[0]  # (warm-up)
res = {f: [] for f in Fs}
for r in range(reps):
    for f in Fs if r % 2 == 0 else Fs[::-1]:
        tokens, *timing = run(f)
        assert tokens == reference, f
        res[f].append(timing)
for f in Fs:
    s, a, p = (statistics.median(x[i] for x in res[f]) for i in range(3))
    ratios = [round(b[0] / x[0], 3) for b, x in zip(res[Fs[0]], res[f], strict=True)]
    print(f"B={B} F={f}: median {s:.2f} s, admitting {a:.2f} s, {p:.0f} target prefill passes; "
          f"speed vs F={Fs[0]} per round {ratios}")
