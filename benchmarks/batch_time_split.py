"""Where a batched job's time goes: rounds, admissions (target and draft prefill), and the cache's
row copies (`drop` as rows leave without a successor, `compact`, `place`), drafting one token
per row against no draft, on the same prompts (outputs identical). Cited in docs/batching.md and
BENCHMARKS.md ("Where a B=128 job's time goes").

Run after `python -m pipeline.bench --quick` (builds the quick pair), on a quiet machine:

    python benchmarks/batch_time_split.py quick 128 512 128 48
"""
import collections
import glob
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.bench.pairs import FULL_SYNTH, QUICK_SYNTH, synthetic_prompts
from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.batch_kv import BatchKV
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter, NoDrafter

torch.set_num_threads(2)
size, (B, N, L, NEW) = sys.argv[1], (int(x) for x in sys.argv[2:6])
spec = {"quick": QUICK_SYNTH, "full": FULL_SYNTH}[size]
pair = sorted(glob.glob(f"benchmarks/.cache/synthetic-{spec.vocab}-*"))[0]
target = prepare_for_cpu(AutoModelForCausalLM.from_pretrained(pair + "/target").eval())
draft = prepare_for_cpu(AutoModelForCausalLM.from_pretrained(pair + "/draft").eval())
tok = AutoTokenizer.from_pretrained(pair + "/target")
ids = [tok(t)["input_ids"] for _, t in synthetic_prompts(spec, N, L)]
seconds: collections.Counter = collections.Counter()


def timed(owner, name: str, key: str) -> None:
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            seconds[key] += time.perf_counter() - t0
    setattr(owner, name, wrapper)


for name in ("drop", "compact", "place"):
    timed(BatchKV, name, name)
reference = None
for label, drafter in (("gamma 1", lambda: ModelDrafter(draft)), ("no draft", NoDrafter)):
    seconds.clear()
    gen = BatchSpeculativeGenerator(target, drafter(), batch_size=B, num_speculative_tokens=1, max_new_tokens=NEW)
    timed(gen, "_round", "rounds")
    prefill = gen._prefill

    def split_prefill(model, kv, rows, into, prefill=prefill):
        t0 = time.perf_counter()
        prefill(model, kv, rows, into)
        seconds["draft prefill" if model is draft else "target prefill"] += time.perf_counter() - t0
    gen._prefill = split_prefill
    t0 = time.perf_counter()
    out = gen.generate_many([(p, 0) for p in ids])
    total = time.perf_counter() - t0
    tokens = [o.tokens for o in out]
    reference = reference or tokens
    assert tokens == reference, "outputs differ"
    rounds = sum(len(o.stats.gammas) for o in out) / len(out)
    rest = total - sum(seconds[k] for k in ("rounds", "target prefill", "draft prefill", "drop", "compact"))
    print(f"{label}: {N * NEW / total:.1f} tokens/s, {total:.1f} s: " + ", ".join(
        f"{k} {seconds[k]:.2f} s" for k in ("rounds", "target prefill", "draft prefill", "drop", "compact", "place"))
        + f", other {rest:.2f} s; {rounds:.1f} rounds per row", flush=True)
