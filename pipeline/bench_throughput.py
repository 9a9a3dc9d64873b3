"""`python -m pipeline.bench_throughput`: tokens per second per worker, batched.

An offline job pays for machine hours, so the number its user compares is throughput. On the
same prompts, in one run, this times plain Hugging Face batched greedy `generate` of the
target alone (left padding) and our batched speculative engine (continuous batching) at each
batch size B, and checks that our outputs equal the target's own greedy decoding per prompt.
It writes (or replaces) a "Throughput" section in the report, between HTML markers, so
`pipeline.bench` can run without erasing it (and `pipeline.bench --throughput` runs it too).
"""

from __future__ import annotations

import argparse
import copy
import gc
import logging
import shlex
import sys
import time
from pathlib import Path

import torch

from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.cpu_speed import prepare_for_cpu, recommended_threads
from specdec_core.drafters import Drafter, ModelDrafter, NgramDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator

_LOG = logging.getLogger("pipeline.bench_throughput")
BEGIN, END = "<!-- throughput:begin -->", "<!-- throughput:end -->"


def hf_batched(model, prompts: list[list[int]], batch: int, max_new: int) -> tuple[list[list[int]], float]:
    """Plain batched greedy generate, B prompts at a time, left-padded; (outputs, seconds)."""
    outs, t0 = [], time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                                 min_new_tokens=max_new, pad_token_id=0, eos_token_id=None)
        outs += out[:, width:].tolist()
    return outs, time.perf_counter() - t0


def ours_batched(target, drafter: Drafter, prompts: list[list[int]], batch: int, gamma: int,
                 max_new: int) -> tuple[list[list[int]], float, dict]:
    """Our engine as the pipeline runs it: batch-1 engine at B=1, the batched one above."""
    t0 = time.perf_counter()
    if batch == 1:
        gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=gamma, max_new_tokens=max_new)
        outs = [gen.generate(p, 0) for p in prompts]
    else:
        bgen = BatchSpeculativeGenerator(target, drafter, batch_size=batch, num_speculative_tokens=gamma,
                                         max_new_tokens=max_new)
        outs = bgen.generate_many([(p, 0) for p in prompts])
    secs = time.perf_counter() - t0
    drafted = sum(o.stats.draft_tokens for o in outs)
    stats = {"acceptance": sum(o.stats.accepted_tokens for o in outs) / drafted if drafted else None,
             "steps": sum(o.stats.verify_steps for o in outs)}
    return [o.tokens for o in outs], secs, stats


def run(target_dir: Path, draft_dir: Path | None, prompts: list[str], batches: list[int], gamma: int,
        max_new: int, drafters: list[str]) -> list[dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(target_dir)
    ids = [tok(p)["input_ids"] for p in prompts]
    target_p = prepare_for_cpu(copy.deepcopy(target))
    draft_p = None
    if draft_dir is not None and "model" in drafters:
        draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
        draft_p = prepare_for_cpu(draft)
    makers = {"model": lambda: ModelDrafter(draft_p), "ngram": lambda: NgramDrafter(), "none": lambda: NoDrafter()}
    n_tokens = len(ids) * max_new
    rows, reference = [], None
    # Warm-up (first-call allocations, oneDNN kernel selection) outside the clock.
    hf_batched(target, ids[:2], 2, 4)
    ours_batched(target_p, makers[drafters[0]](), ids[:2], 2, gamma, 4)
    for b in batches:
        for kernels, model in (("stock", target), ("prepacked", target_p)):
            outs, secs = hf_batched(model, ids, b, max_new)
            if reference is None and b == 1:
                reference = outs
            rows.append({"config": f"HF generate, target alone ({kernels} kernels)", "B": b, "seconds": secs,
                         "tokens_per_s": n_tokens / secs, "acceptance": None, "equal": None})
            _LOG.info("HF %s B=%d: %.1f tok/s", kernels, b, n_tokens / secs)
        for name in drafters:
            outs, secs, st = ours_batched(target_p, makers[name](), ids, b, gamma, max_new)
            equal = sum(o == r for o, r in zip(outs, reference, strict=True)) if reference else None
            rows.append({"config": f"ours, drafter {name}", "B": b, "seconds": secs,
                         "tokens_per_s": n_tokens / secs, "acceptance": st["acceptance"], "equal": equal})
            _LOG.info("ours %s B=%d: %.1f tok/s (acceptance %s, %s/%d equal)", name, b, n_tokens / secs,
                      st["acceptance"], equal, len(ids))
        gc.collect()
    return rows


def report(rows: list[dict], header: str, n_prompts: int) -> str:
    def f(x, fmt="{:.1f}"):
        return "–" if x is None else fmt.format(x)

    plain = {b: max(r["tokens_per_s"] for r in rows if r["B"] == b and r["config"].startswith("HF"))
             for b in sorted({r["B"] for r in rows})}
    best_plain = max(plain.values())
    best_b = max(plain, key=plain.get)
    lines = [BEGIN, "## Throughput per worker: batched (`pipeline.bench_throughput`)\n", header, "",
             f"| config | B | tokens/s | x plain HF at this B | x plain HF at its best (B={best_b}) | acceptance | "
             "greedy equal to HF B=1 |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        equal = "–" if r["equal"] is None else f"{r['equal']}/{n_prompts}"
        lines.append(f"| {r['config']} | {r['B']} | {f(r['tokens_per_s'])} | "
                     f"{f(r['tokens_per_s'] / plain[r['B']], '{:.2f}')} | "
                     f"{f(r['tokens_per_s'] / best_plain, '{:.2f}')} | {f(r['acceptance'], '{:.2f}')} | {equal} |")
    ours = [r for r in rows if r["config"].startswith("ours")]
    best = max(ours, key=lambda r: r["tokens_per_s"])
    lines += ["", f"Plain batching at its best: {best_plain:.1f} tokens/s (B={best_b}). Ours at its best: "
              f"{best['tokens_per_s']:.1f} tokens/s ({best['config']}, B={best['B']}), "
              f"{best['tokens_per_s'] / best_plain:.2f}x plain batching at its best.", END]
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section.rstrip("\n") + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipeline.bench_throughput", description=__doc__)
    p.add_argument("--size", default="full", choices=("full", "quick", "tiny"),
                   help="synthetic pair of pipeline.bench: full (325M target), quick, tiny (tests)")
    p.add_argument("--cache_dir", default="benchmarks/.cache", help="where the synthetic pair is (built if missing)")
    p.add_argument("--out", default="BENCHMARKS.md", help="report whose Throughput section is replaced")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--prompt_tokens", type=int, default=128)
    p.add_argument("--max_new_tokens", type=int, default=48)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--batches", default="1,4,8,16", help="comma-separated batch sizes")
    p.add_argument("--drafters", default="model,none", help="comma-separated: model, ngram, none")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--note", default="", help="free text added to the report (e.g. that the machine was shared)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from pipeline.bench import FULL_SYNTH, QUICK_SYNTH, TINY_SYNTH, build_synthetic_pair, machine, synthetic_prompts

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    torch.set_num_threads(a.threads or recommended_threads())
    spec = {"full": FULL_SYNTH, "quick": QUICK_SYNTH, "tiny": TINY_SYNTH}[a.size]
    dirs = build_synthetic_pair(spec, Path(a.cache_dir))
    prompts = [text for _, text in synthetic_prompts(spec, a.prompts, a.prompt_tokens)]
    batches = [int(b) for b in a.batches.split(",")]
    t0 = time.perf_counter()
    rows = run(dirs["target"], dirs["draft"], prompts, batches, a.gamma, a.max_new_tokens,
               [d.strip() for d in a.drafters.split(",")])
    header = (f"Synthetic pair of `pipeline.bench` ({spec.layers}-layer Llama target, hidden {spec.hidden}; "
              f"{spec.draft_layers}-layer early-exit draft), {a.prompts} prompts of {a.prompt_tokens} tokens "
              f"(mixed random/repetitive, as in the bench), {a.max_new_tokens} new tokens each, greedy, gamma "
              f"{a.gamma} fixed, {torch.get_num_threads()} threads; {machine()}. Each config decodes all prompts; "
              f"ours runs with continuous batching (batch-1 engine at B=1). Run time {time.perf_counter() - t0:.0f} s. "
              f"Command: `python -m pipeline.bench_throughput {shlex.join(argv)}`. {a.note}")
    write_section(Path(a.out), report(rows, header, a.prompts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
