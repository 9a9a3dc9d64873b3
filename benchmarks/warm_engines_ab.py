"""One-off: adaptive gamma on engines kept across calls, as a job's worker keeps one, the core of an older commit
against this tree's, and drafting nothing; every row ends at 48 new tokens (quick pair, 128-token prompts, 2 threads).
Each engine first decodes 2B prompts off the clock, then the configs alternate; outputs are checked equal.

Run from the root: `python benchmarks/warm_engines_ab.py 2e78084 16,32 256 3` (commit, B list, prompts, reps)."""

import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from old_vs_new_paired import old_package  # noqa: E402

from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair, synthetic_prompts  # noqa: E402
from pipeline.bench.throughput import engine_modules  # noqa: E402
from specdec_core.cpu_speed import prepare_for_cpu  # noqa: E402
from specdec_core.loading import load_model  # noqa: E402

torch.set_num_threads(2)
commit, batches, n, reps = sys.argv[1], [int(b) for b in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
cores = {"old": engine_modules(old_package(commit, Path(tempfile.mkdtemp()))), "new": engine_modules()}
dirs = build_synthetic_pair(QUICK_SYNTH, ROOT / "benchmarks" / ".cache")
cpu = torch.device("cpu")
target = prepare_for_cpu(load_model(str(dirs["target"]), cpu, torch.float32))
draft = prepare_for_cpu(load_model(str(dirs["draft"]), cpu, torch.float32))
tok = AutoTokenizer.from_pretrained(dirs["target"])
items = [(tok(p)["input_ids"], 0) for _, p in synthetic_prompts(QUICK_SYNTH, n, 128)]
for b in batches:
    engines = {name: core.batch_engine.BatchSpeculativeGenerator(
        target, core.drafters.ModelDrafter(draft), batch_size=b, num_speculative_tokens=4, max_new_tokens=48,
        gamma_policy=core.gamma.AdaptiveGamma(max_gamma=4)) for name, core in cores.items()}
    engines["none"] = cores["new"].batch_engine.BatchSpeculativeGenerator(
        target, cores["new"].drafters.NoDrafter(), batch_size=b, max_new_tokens=48)
    for engine in engines.values():
        engine.generate_many(items[: 2 * b])
    ref, speeds = None, {name: [] for name in engines}
    for r in range(reps):
        for name in list(engines) if r % 2 == 0 else list(engines)[::-1]:
            engine, passes = engines[name], engines[name].admitted[1]
            t = time.perf_counter()
            out = engine.generate_many(items)
            secs = time.perf_counter() - t
            assert ref is None or [o.tokens for o in out] == ref
            ref = [o.tokens for o in out]
            speeds[name].append(n * 48 / secs)
            drafted = 0 if name == "none" else sum(sum(1 for g in o.stats.gammas if g) for o in out)
            print(f"B={b} {name}: {n * 48 / secs:.1f} tok/s, {engine.admitted[1] - passes} passes, "
                  f"{drafted} row-rounds drafted", flush=True)
    total = {name: sum(v) for name, v in speeds.items()}
    print(f"B={b} summary: old/none {total['old'] / total['none']:.3f}, new/none {total['new'] / total['none']:.3f}, "
          f"new/old {total['new'] / total['old']:.3f}", flush=True)
