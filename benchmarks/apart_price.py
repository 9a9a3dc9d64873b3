"""One-off: what the batch rule's scatter charge prices against what rows ending apart cost (quick pair, 1 thread).
A warm adaptive engine (2B prompts decoded) holds the row it timed alone with its costs and its whole batches; a
gamma-2 engine decoding 4B prompts holds real refills. Target prefill ms a row, 3 engines each.

Run from the root: `python benchmarks/apart_price.py 8 48 24` (B, prompt tokens, new tokens)."""

import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair, synthetic_prompts  # noqa: E402
from specdec_core.batch_engine import BatchSpeculativeGenerator  # noqa: E402
from specdec_core.cpu_speed import prepare_for_cpu  # noqa: E402
from specdec_core.drafters import ModelDrafter  # noqa: E402
from specdec_core.gamma import AdaptiveGamma  # noqa: E402
from specdec_core.loading import load_model  # noqa: E402

torch.set_num_threads(1)
b, length, new = (int(x) for x in sys.argv[1:4])
dirs = build_synthetic_pair(QUICK_SYNTH, ROOT / "benchmarks" / ".cache")
cpu = torch.device("cpu")
target = prepare_for_cpu(load_model(str(dirs["target"]), cpu, torch.float32))
draft = prepare_for_cpu(load_model(str(dirs["draft"]), cpu, torch.float32))
tok = AutoTokenizer.from_pretrained(dirs["target"])
items = [(tok(p)["input_ids"], 0) for _, p in synthetic_prompts(QUICK_SYNTH, 4 * b, length)]


def per_row(engine) -> str:
    (apart_s, apart), (whole_s, whole) = engine._admissions
    apart_ms, whole_ms = 1e3 * apart_s / apart, 1e3 * whole_s / whole
    return f"apart {apart_ms:.1f} ms/row ({apart} rows), whole {whole_ms:.1f} ms/row ({whole})"


for _ in range(3):
    warm = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=b, num_speculative_tokens=4,
                                     max_new_tokens=new, gamma_policy=AdaptiveGamma(max_gamma=4))
    warm.generate_many(items[: 2 * b])
    print(f"adaptive, warm: {per_row(warm)}", flush=True)
    drafting = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=b, num_speculative_tokens=2,
                                         max_new_tokens=new)
    drafting.generate_many(items)
    rows, passes = drafting.admitted
    print(f"gamma 2: {per_row(drafting)}; {rows} rows admitted in {passes} target prefill passes", flush=True)
