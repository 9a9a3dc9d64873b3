"""How often does a verify block's argmax differ from the one-token step's? (issue 16)

Greedy speculative output equals the target alone's unless, at some position, the k-token
verify pass and the 1-token pass round differently AND the target's two best tokens are closer
than that rounding. This script decodes each prompt greedily one token at a time (the target
alone), then re-scores the same sequence in blocks of gamma+1 tokens on a cache, as verification
does, and counts positions whose argmax differs. It also reports the largest logit difference and
the smallest top-2 gap it met, to say how far from a flip the pair was.

    python benchmarks/argmax_flips.py [--pairs synthetic demo] [--prompts 8] [--max_new_tokens 64]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.bench import speed as bench  # noqa: E402
from specdec_core.cpu_speed import prepare_for_cpu  # noqa: E402
from specdec_core.decoder import CachedDecoder, initial_decoder_ids  # noqa: E402
from specdec_core.loading import load_model, load_tokenizer  # noqa: E402


@torch.inference_mode()
def flips(target, prompts: list[list[int]], max_new: int, gamma: int) -> dict:
    positions = flipped = 0
    max_diff, min_gap = 0.0, float("inf")
    for ids in prompts:
        seq = initial_decoder_ids(target, ids)
        single = CachedDecoder(target, ids)
        if len(seq) > 1:
            single.forward(seq[:-1], 0)
        step_logits = []
        for _ in range(max_new):  # the target alone, one token per pass
            logits = single.forward(seq, 1)[0]
            step_logits.append(logits)
            seq = seq + [int(logits.argmax())]
        start = len(seq) - max_new - 1  # seq[start] is the last decoder token before the output
        block = CachedDecoder(target, ids)
        if start > 0:
            block.forward(seq[:start], 0)
        for t in range(0, max_new, gamma + 1):  # verify blocks over the same tokens
            k = min(gamma + 1, max_new - t)
            logits = block.forward(seq[: start + t + k], k)
            for j in range(k):
                ref = step_logits[t + j]
                top = ref.topk(2).values
                min_gap = min(min_gap, float(top[0] - top[1]))
                max_diff = max(max_diff, float((logits[j] - ref).abs().max()))
                flipped += int(logits[j].argmax()) != int(ref.argmax())
                positions += 1
    return {"positions": positions, "flips": flipped, "max_abs_logit_diff": max_diff, "min_top2_gap": min_gap}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", nargs="+", default=["synthetic"], choices=["synthetic", "quick", "demo"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--cache_dir", default="benchmarks/.cache")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = {"cpu": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__, "pairs": {}}
    for name in args.pairs:
        t0 = time.perf_counter()
        if name == "demo":
            from pipeline.demo.models import demo_pair_dirs, demo_prompt_rows

            target_dir, _ = demo_pair_dirs()
            target, tok = load_model(str(target_dir), torch.device("cpu"), torch.float32), load_tokenizer(target_dir)
            prompts = [tok(r["prompt"]).input_ids for r in demo_prompt_rows()[: args.prompts]]
        else:
            spec = bench.FULL_SYNTH if name == "synthetic" else bench.QUICK_SYNTH
            dirs = bench.build_synthetic_pair(spec, Path(args.cache_dir))
            target = load_model(str(dirs["target"]), torch.device("cpu"), torch.float32)
            tok = load_tokenizer(dirs["target"])
            prompts = [tok(p).input_ids for _, p in bench.synthetic_prompts(spec, args.prompts, 64)]
        prepare_for_cpu(target)  # the product's default kernels: prepacked blocks, stock 1-token steps
        res = flips(target, prompts, args.max_new_tokens, args.gamma)
        res["seconds"] = round(time.perf_counter() - t0, 1)
        out["pairs"][name] = res
        print(name, json.dumps(res), flush=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
