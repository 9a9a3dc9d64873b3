"""How often do greedy outputs in bf16 part from the target's own `generate()`, and why?

Decodes the committed demo pair's prompts (a trained pair: few near-ties) or random prompts of the
GPU benchmark's synthetic pair (random weights: many) greedily in one dtype, five ways: Hugging
Face `generate`, our engine with the target alone and with the draft, eagerly and through the
static-cache decoder (`--cuda_graphs on`; CUDA graphs on a GPU, the same passes eagerly on a CPU),
and counts outputs identical to `generate()`'s and to our target alone's. Every difference is a
tie-break between two ways of rounding the same logits; fp32 is the control.

    python benchmarks/bf16_agreement.py --pair demo --dtype bfloat16 [--device cpu] [--prompts 40]
    python benchmarks/bf16_agreement.py --pair synthetic --dtype float32 --device cuda
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_core.drafters import ModelDrafter, NoDrafter  # noqa: E402
from specdec_core.engine import SpeculativeGenerator  # noqa: E402


def pair(name: str, device: torch.device, dtype: torch.dtype, n: int):
    """(target, draft, prompt ids, max new tokens, gamma)."""
    if name == "demo":
        from pipeline.demo.models import demo_pair_dirs, demo_prompt_rows, read_manifest
        from specdec_core.loading import load_model, load_tokenizer

        target_dir, draft_dir = demo_pair_dirs()
        tok = load_tokenizer(str(target_dir))
        prompts = [tok(r["prompt"]).input_ids for r in demo_prompt_rows()[:n]]
        gamma = read_manifest()["quality"].get("num_speculative_tokens", 4)
        return (load_model(str(target_dir), device, dtype), load_model(str(draft_dir), device, dtype), prompts, 160,
                gamma)
    from pipeline.bench.gpu import SHAPES, build_pair, distinct_prompts

    shape = SHAPES["tinyllama-1.1b" if device.type == "cuda" else "tiny"]
    target, draft = build_pair(shape, device, dtype)
    return target, draft, distinct_prompts(n, 16, 64, shape.vocab, seed=1), 64, 4


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", choices=["demo", "synthetic"], default="demo")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompts", type=int, default=40)
    args = p.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    target, draft, prompts, max_new, gamma = pair(args.pair, device, dtype, args.prompts)

    def hf(ids):
        with torch.inference_mode():
            out = target.generate(torch.tensor([ids], device=device), do_sample=False, max_new_tokens=max_new)
        return out[0, len(ids):].tolist()

    def ours(drafter, graphs):
        engine = SpeculativeGenerator(target, drafter, num_speculative_tokens=gamma, max_new_tokens=max_new,
                                      cuda_graphs=graphs)
        return lambda ids: engine.generate(ids).tokens

    ways = {"HF generate": hf,
            "ours alone, eager": ours(NoDrafter(), "off"), "ours draft, eager": ours(ModelDrafter(draft, "off"), "off"),
            "ours alone, static": ours(NoDrafter(), "on"), "ours draft, static": ours(ModelDrafter(draft, "on"), "on")}
    outs = {name: [fn(ids) for ids in prompts] for name, fn in ways.items()}
    result = {"pair": args.pair, "dtype": args.dtype, "device": str(device), "prompts": len(prompts),
              "same_as_hf": {}, "same_as_ours_alone_eager": {}}
    for name, got in outs.items():
        result["same_as_hf"][name] = sum(a == b for a, b in zip(got, outs["HF generate"], strict=True))
        result["same_as_ours_alone_eager"][name] = sum(
            a == b for a, b in zip(got, outs["ours alone, eager"], strict=True))
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
