"""One-off: what the batch rule sees and predicts on the quick pair, after a worker's warm-up and after a call held
at gamma 2; and how often the draft agrees with the target's greedy tokens.

    python benchmarks/batch_rule_view.py B PROMPTS PROMPT_TOKENS NEW [ENGINES]   # e.g. 8 64 48 24 2

Per engine: a warm-up of two waves (as `pipeline.bench.throughput` warms adaptive), then one call with the rule's
`batch_gamma` patched to 2, then one adaptive call. After each it prints the pooled acceptance, the target's prefill
per row admitted apart and whole, the round factor and the rule's predicted rate over plain (per row) for K = 0..4.
1 thread, the bench's quick pair (built under benchmarks/.cache).
"""

import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from pipeline.bench.pairs import QUICK_SYNTH, build_synthetic_pair, synthetic_prompts
from specdec_core import batch_engine
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import ModelDrafter
from specdec_core.gamma import AdaptiveGamma
from specdec_core.loading import load_model


def rates(gen, width: int) -> list[float]:
    """The rule's tokens per plain step per row at K = 0..4, every row at the pooled acceptance."""
    costs, a = gen.gamma_policy.costs, gen.gamma_policy.prior()
    per_token, factor = gen._prefill_per_token(costs, []), gen._round_factor()
    tokens, power, out = float(width), float(width), [1.0]
    for k in range(1, 5):
        power *= a
        tokens += power
        out.append(tokens / (costs.round_cost(k) * factor + per_token * tokens) / width)
    return out


def show(gen, width: int, tag: str) -> None:
    (apart_s, apart), (whole_s, whole) = gen._admissions
    fits = {k: len(v) for k, v in gen._fit.items()}
    print(f"{tag}: acceptance {gen.gamma_policy.prior():.3f}; target prefill a row apart "
          f"{1e3 * apart_s / max(apart, 1):.1f} ms (x{apart}), "
          f"whole {1e3 * whole_s / max(whole, 1):.1f} ms (x{whole}); "
          f"round factor {gen._round_factor():.3f} (plain/drafting rounds timed: {fits[False]}/{fits[True]}); "
          f"rate over plain at K = 0..4: {' / '.join(f'{r:.3f}' for r in rates(gen, width))}", flush=True)


def main() -> None:
    b, n, length, new = (int(x) for x in sys.argv[1:5])
    engines = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    torch.set_num_threads(1)
    dirs = build_synthetic_pair(QUICK_SYNTH, Path("benchmarks/.cache"))
    cpu = torch.device("cpu")
    target = prepare_for_cpu(load_model(str(dirs["target"]), cpu, torch.float32))
    draft = prepare_for_cpu(load_model(str(dirs["draft"]), cpu, torch.float32))
    tok = AutoTokenizer.from_pretrained(dirs["target"])
    ids = [tok(t)["input_ids"] for _, t in synthetic_prompts(QUICK_SYNTH, n, length)]
    # How often the draft's greedy token equals the target's along the target's greedy output.
    agree, pairs = [], []
    for p in ids:
        out = target.generate(torch.tensor([p]), max_new_tokens=new, do_sample=False, pad_token_id=0)
        with torch.inference_mode():
            guess = draft(out).logits[0, len(p) - 1:-1].argmax(-1)
        hits = (guess == out[0, len(p):]).tolist()
        agree += hits
        pairs += list(zip(hits, hits[1:], strict=False))
    after_hit = [y for x, y in pairs if x]
    print(f"draft agrees with {sum(agree) / len(agree):.3f} of the target's greedy tokens "
          f"({sum(after_hit) / len(after_hit):.3f} after an agreement)")
    for e in range(engines):
        gen = batch_engine.BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=b,
                                                     num_speculative_tokens=4, max_new_tokens=new,
                                                     gamma_policy=AdaptiveGamma(max_gamma=4))
        gen.generate_many([(p, 0) for p in ids[: batch_engine.WARM_WAVES * b]])
        show(gen, b, f"[{e}] after the warm-up")
        rule = batch_engine.batch_gamma
        batch_engine.batch_gamma = lambda *args, **kwargs: 2
        t0 = time.perf_counter()
        gen.generate_many([(p, 0) for p in ids])
        held = n * new / (time.perf_counter() - t0)
        batch_engine.batch_gamma = rule
        show(gen, b, f"[{e}] after a call held at gamma 2 ({held:.1f} tokens/s)")
        t0 = time.perf_counter()
        gen.generate_many([(p, 0) for p in ids])
        print(f"[{e}] then adaptive: {n * new / (time.perf_counter() - t0):.1f} tokens/s, drafting: {gen._drafting}")


if __name__ == "__main__":
    main()
