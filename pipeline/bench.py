"""`python -m pipeline.bench`: speed side by side, in one process, one run, interleaved per prompt.

Configurations (same prompts, same pair, same gamma): the target alone (our engine with the
`none` drafter, and Hugging Face greedy `generate`), our engine with the model drafter and
the n-gram drafter (fixed gamma and adaptive), Hugging Face assisted generation with the
same draft model (`num_assistant_tokens=gamma`, constant schedule, confidence threshold 0)
and with prompt lookup (`prompt_lookup_num_tokens=gamma`). It measures the step costs c and
v(k), computes the paper's analytic bound, profiles our per-round overhead, compares the
adaptive gamma with every fixed gamma, times a whole Beam job against the bare engine loop,
checks that every greedy output is identical, and writes BENCHMARKS.md plus a raw CSV.

Pairs: a synthetic Llama pair of realistic size built here (random weights; the target's
deeper layers are damped so an early-exit draft made of its first layer agrees with it: the
COSTS are those of a real 325M model, the ACCEPTANCE is whatever the damping gives), and a
disagreeing variant (a random draft: acceptance ~0, to check the back-off). The demo pair is
encoder-decoder now and is measured by `python -m pipeline.demo`.

Where things are: `pipeline.bench_pairs` (the synthetic pair and prompts), `pipeline.bench_configs`
(the configurations run side by side), `pipeline.bench_measure` (timing, step costs, the
interleaved runs, Beam overhead, v(k) under CPU settings), `pipeline.bench_report` (aggregates
and BENCHMARKS.md); this module is the command line and the order of the run.
"""

from __future__ import annotations

import argparse
import copy
import csv
import gc
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import torch

from pipeline.bench_configs import Config, greedy_configs
from pipeline.bench_measure import (
    _fmt_v,
    beam_overhead,
    kernel_experiments,
    measure_costs_interleaved,
    run_interleaved,
    target_step_ms,
)
from pipeline.bench_pairs import (  # noqa: F401 (re-exported: other modules import them from pipeline.bench)
    FULL_SYNTH,
    QUICK_SYNTH,
    TINY_SYNTH,
    SynthSpec,
    build_synthetic_pair,
    demo_pair,
    load_pair,
    synthetic_prompts,
)
from pipeline.bench_report import machine, summarize, write_report  # noqa: F401 (machine: re-exported)
from pipeline.flags import ArgumentParser
from specdec_core.cpu_speed import prepare_for_cpu, quantize_draft, recommended_threads
from specdec_core.drafters import ModelDrafter
from specdec_core.engine import SpeculativeGenerator

_LOG = logging.getLogger("pipeline.bench")


def run_pair(label: str, target_dir: Path, draft_dir: Path, prompts: list[tuple[str, str]], args,
             full_set: bool = True, note: str = "") -> dict:
    target, draft, tok = load_pair(target_dir, draft_dir)
    target_p = prepare_for_cpu(copy.deepcopy(target))
    draft_p = prepare_for_cpu(copy.deepcopy(draft))
    n_params = sum(p.numel() for p in target.parameters())
    d_params = sum(p.numel() for p in draft.parameters())
    g, N = args.gamma, args.max_new_tokens
    ids_list = [tok(text)["input_ids"] for _, text in prompts]
    ks = tuple(range(2, args.max_gamma + 2))

    # Step costs, prepacked vs stock kernels, interleaved.
    t0 = time.perf_counter()
    cost_engines = {
        "prepacked": SpeculativeGenerator(target_p, ModelDrafter(draft_p), num_speculative_tokens=args.max_gamma),
        "stock": SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=args.max_gamma),
    }
    costs = measure_costs_interleaved(cost_engines, ids_list[0], ks, args.cost_rounds)
    _LOG.info("[%s] costs measured in %.0f s: prepacked c=%.3f v=%s | stock c=%.3f v=%s", label,
              time.perf_counter() - t0, costs["prepacked"].c, _fmt_v(costs["prepacked"]), costs["stock"].c,
              _fmt_v(costs["stock"]))

    draft_q = None
    if full_set and args.int8_draft:
        draft_q = quantize_draft(copy.deepcopy(draft))
        if draft_q is draft:
            draft_q = None
        else:
            costs["int8 draft"] = measure_costs_interleaved(
                {"q": SpeculativeGenerator(target_p, ModelDrafter(draft_q), num_speculative_tokens=args.max_gamma)},
                ids_list[0], ks, 1)["q"]
    configs: list[Config] = greedy_configs(target, draft, target_p, draft_p, costs, args, full_set, draft_q)
    rows = run_interleaved(label, configs, prompts, ids_list, target)
    return {"label": label, "note": note, "rows": rows, "configs": configs, "costs": costs,
            "params": n_params, "draft_params": d_params, "gamma": g, "max_new": N,
            "step_ms": target_step_ms(target_p, ids_list[0]), "prompts": len(prompts),
            "prompt_tokens": statistics.fmean(len(x) for x in ids_list)}


# --------------------------------------------------------------------------------------------
# Main


def parse(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m pipeline.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: small synthetic pair, few prompts (< 2 min)")
    p.add_argument("--tiny", action="store_true", help="tiny models (for tests)")
    p.add_argument("--out", default="BENCHMARKS.md", help="report path")
    p.add_argument("--csv", default=None, help="raw rows (default: benchmarks/results.csv beside --out)")
    p.add_argument("--cache_dir", default=None, help="where the synthetic pair is saved (default: benchmarks/.cache)")
    p.add_argument("--prompts", type=int, default=None)
    p.add_argument("--prompt_tokens", type=int, default=None)
    p.add_argument("--max_new_tokens", type=int, default=None)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max_gamma", type=int, default=None, help="cap for the adaptive policy and the v(k) table")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores available)")
    p.add_argument("--pairs", default="synthetic,bad_draft,demo",
                   help="comma-separated subset of synthetic, bad_draft, demo")
    p.add_argument("--skip_beam", action="store_true")
    p.add_argument("--skip_kernels", action="store_true")
    p.add_argument("--skip_bad_draft", action="store_true")
    p.add_argument("--throughput", action="store_true",
                   help="also run pipeline.bench_throughput (plain batched generate vs ours at B=1,4,8,16) on the "
                   "same synthetic pair and prompt settings, into the same report")
    a = p.parse_args(argv)
    quick = a.quick or a.tiny
    a.prompts = a.prompts or (3 if quick else 6)
    a.prompt_tokens = a.prompt_tokens or (24 if quick else 64)
    a.max_new_tokens = a.max_new_tokens or (16 if quick else 48)
    a.max_gamma = a.max_gamma or (6 if quick else 10)
    a.cost_rounds = 1 if quick else 3
    a.sweep = (2, 4) if quick else (2, 3, 4, 6, 8)
    a.ngram_sweep = () if quick else (2,)
    a.int8_draft = not quick
    a.beam_reps = 1
    a.quick = quick
    return a


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("transformers", "apache_beam", "specdec_core.cpu_speed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    started = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    torch.set_num_threads(args.threads or recommended_threads())
    out = Path(args.out)
    csv_path = Path(args.csv) if args.csv else out.parent / "benchmarks" / "results.csv"
    cache = Path(args.cache_dir) if args.cache_dir else out.parent / "benchmarks" / ".cache"
    spec = TINY_SYNTH if args.tiny else QUICK_SYNTH if args.quick else FULL_SYNTH
    dirs = build_synthetic_pair(spec, cache)
    prompts = synthetic_prompts(spec, args.prompts, args.prompt_tokens)
    results, skipped = [], []
    agreement = ("Random weights, so the target's 'text' is meaningless; the deeper layers are damped by "
                 f"{spec.damp} so the 1-layer early-exit draft agrees with it. Costs (c, v, ms/token) are those of a "
                 "real model of this size on this machine; acceptance, tokens/step, speed-ups and the bound DEPEND ON "
                 "THAT ARTIFICIAL AGREEMENT. Prompts alternate between random token strings and a repeated "
                 "7-token pattern (a mixed set: prompt lookup only works on the second kind).")
    pairs = {x.strip() for x in args.pairs.split(",")}
    if "synthetic" in pairs:
        res = run_pair(f"Synthetic pair ({spec.layers}-layer Llama target, {spec.draft_layers}-layer early-exit "
                       "draft)", dirs["target"], dirs["draft"], prompts, args, note=agreement)
        res["summary"] = summarize(res)
        res.pop("configs")
        results.append(res)
        gc.collect()
    if not args.skip_bad_draft and "bad_draft" in pairs:
        bad = run_pair("Synthetic target with a disagreeing draft (acceptance ≈ 0: does the engine back off?)",
                       dirs["target"], dirs["bad_draft"], prompts[: max(2, args.prompts // 2)], args,
                       full_set=False, note="Same target; the draft is a random 1-layer model, so it almost never "
                       "agrees. The adaptive policy must notice and stop drafting.")
        bad["summary"] = summarize(bad)
        bad.pop("configs")
        results.append(bad)
        gc.collect()
    if "demo" in pairs:
        skipped.append(f"demo pair: {demo_pair()}")
    for r in results:
        if "summary" not in r:
            r["summary"] = summarize(r)
        r.pop("configs", None)
    gc.collect()
    kernels = None
    if not args.skip_kernels:
        from transformers import AutoTokenizer

        ids = AutoTokenizer.from_pretrained(dirs["target"])(prompts[0][1])["input_ids"]
        kernels = kernel_experiments(dirs["target"], ids, args)
    beam = None if args.skip_beam else beam_overhead(dirs["target"], dirs["draft"], prompts, args)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    rows = [r for res in results for r in res["rows"]]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(csv_path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=keys)
        wr.writeheader()
        wr.writerows(rows)
    summary_json = csv_path.with_name(csv_path.stem + "-summary.json")
    summary_json.write_text(json.dumps({"results": [{"label": r["label"], "summary": r["summary"],
                                                     "costs": {k: {"c": v.c, "v": v.v} for k, v in r["costs"].items()}}
                                                    for r in results], "beam": beam, "kernels": kernels},
                                       indent=1, default=str))
    write_report(out, csv_path, results, skipped, beam, kernels, argv, started, args)
    if args.throughput:
        from pipeline import bench_throughput

        size = "tiny" if args.tiny else "quick" if args.quick else "full"
        bench_throughput.main(["--size", size, "--cache_dir", str(cache), "--out", str(out), "--prompts",
                               str(max(args.prompts, 16)), "--prompt_tokens", str(args.prompt_tokens),
                               "--max_new_tokens", str(args.max_new_tokens),
                               "--gammas", ",".join(sorted({"2", str(args.gamma)}))])
    _LOG.info("wrote %s and %s (%.0f s)", out, csv_path, time.perf_counter() - started)
    return 0 if all(s["equal"] for r in results for s in r["summary"]) else 1


if __name__ == "__main__":
    sys.exit(main())
