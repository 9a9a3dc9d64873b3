"""`python -m pipeline.bench`: speed side by side, in one process, one run, interleaved per prompt.

Configurations (same prompts, same pair, same gamma): the target alone (our engine with the
`none` drafter, and Hugging Face greedy `generate`), our engine with the model drafter and
the n-gram drafter (fixed gamma and adaptive), Hugging Face assisted generation with the
same draft model (`num_assistant_tokens=gamma`, constant schedule, confidence threshold 0)
and with prompt lookup (`prompt_lookup_num_tokens=gamma`). It measures the step costs c and
v(k), computes the paper's analytic bound, profiles our per-round overhead, compares the
adaptive gamma with every fixed gamma, times a whole Beam job against the bare engine loop,
checks that every greedy output is identical, and writes BENCHMARKS.md plus a raw CSV.
Beside greedy, as in the paper's table: sampling at temperature 1 and at 0.7 with top-p 0.9
(the target alone, ours and HF assisted sampling at the same gamma), and the draft in fp32,
bf16 and int8 (its c measured side by side, its acceptance and speed-up).

Pairs: a synthetic Llama pair of realistic size built here (random weights; the target's
deeper layers are damped so an early-exit draft made of its first layer agrees with it: the
COSTS are those of a real 325M model, the ACCEPTANCE is whatever the damping gives), and a
disagreeing variant (a random draft: acceptance ~0, to check the back-off). The demo pair, a
translation pair with its own tokenizer and prompts, is measured by `python -m pipeline.demo`.

Where things are: `pipeline.bench.pairs` (the synthetic pair and prompts), `pipeline.bench.configs`
(the configurations run side by side), `pipeline.bench.measure` (timing, step costs, the
interleaved runs, Beam overhead, v(k) under CPU settings), `pipeline.bench.report` (aggregates
and BENCHMARKS.md); this module is the command line and the order of the run.
"""

from __future__ import annotations

import argparse
import copy
import csv
import gc
import json
import logging
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from pipeline.bench.configs import Config, greedy_configs, sampling_configs
from pipeline.bench.measure import (
    _fmt_v,
    beam_overhead,
    kernel_experiments,
    measure_costs_interleaved,
    run_interleaved,
    target_step_ms,
)
from pipeline.bench.pairs import (  # noqa: F401 (re-exported: other modules import them from pipeline.bench)
    BENCH_DRAFT_DTYPES,
    FULL_SYNTH,
    QUICK_SYNTH,
    TINY_SYNTH,
    SynthSpec,
    build_synthetic_pair,
    draft_variants,
    load_pair,
    synthetic_prompts,
)
from pipeline.bench.report import machine, replace_section, summarize, write_report  # noqa: F401 (machine: re-exported)
from pipeline.flags import ArgumentParser, positive_int
from pipeline.threads import keeps_torch_threads, recommended_threads
from specdec_core.cpu_speed import packed_threshold, prepare_for_cpu
from specdec_core.drafters import ModelDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.gamma import Costs

_LOG = logging.getLogger("pipeline.bench")
PAIRS = ("synthetic", "bad_draft")  # (the demo pair: `python -m pipeline.demo` measures it)


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

    dtype_drafts = draft_variants(draft, draft_p, args.draft_dtypes) if full_set else {}
    if dtype_drafts:
        # c of each draft dtype, measured alongside one another (bursts of gamma draft steps, as
        # in a round); v(k) is the target's, the same for all.
        t0 = time.perf_counter()
        dc = measure_costs_interleaved(
            {f"{d} draft": SpeculativeGenerator(target_p, ModelDrafter(m), num_speculative_tokens=g)
             for d, m in dtype_drafts.items()}, ids_list[0], (g + 1,), args.cost_rounds)
        for key, cst in dc.items():
            costs[key] = Costs(c=cst.c, v=costs["prepacked"].v)
        _LOG.info("[%s] draft dtype costs in %.0f s: %s", label, time.perf_counter() - t0,
                  ", ".join(f"{k} c={v.c:.3f}" for k, v in dc.items()))
    draft_q = dtype_drafts.get("int8") if full_set and args.int8_draft else None
    configs: list[Config] = greedy_configs(target, draft, target_p, draft_p, costs, args, full_set, draft_q,
                                           dtype_drafts)
    rows = run_interleaved(label, configs, prompts, ids_list, target)
    sampling = None
    if full_set and not args.skip_sampling:
        sconfigs = sampling_configs(target, draft, target_p, draft_p, args)
        sampling = {"rows": run_interleaved(f"{label} [sampling]", sconfigs, prompts, ids_list, target,
                                            reference=None), "configs": sconfigs, "costs": costs}
        for r in sampling["rows"]:
            r["pair"] = label
    return {"label": label, "note": note, "rows": rows, "configs": configs, "costs": costs, "sampling": sampling,
            "params": n_params, "draft_params": d_params, "gamma": g, "max_new": N,
            "step_ms": target_step_ms(target_p, ids_list[0]), "packed_from_rows": packed_threshold(target_p),
            "prompts": len(prompts),
            "prompt_tokens": statistics.fmean(len(x) for x in ids_list)}


def summarized(res: dict) -> dict:
    """Aggregates in place of the configurations (which hold the models: freed here)."""
    res["summary"] = summarize(res)
    res.pop("configs")
    if res["sampling"]:
        res["sampling"]["summary"] = summarize(res["sampling"])
        res["sampling"].pop("configs")
    return res


# --------------------------------------------------------------------------------------------
# Main


def parse(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m pipeline.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: small synthetic pair, few prompts (< 2 min)")
    p.add_argument("--tiny", action="store_true", help="tiny models (for tests)")
    p.add_argument("--out", default=None,
                   help="report path (default: BENCHMARKS.md; with --quick or --tiny bench-quick/BENCHMARKS.md, "
                   "so that a smoke test leaves the committed report and raw rows alone)")
    p.add_argument("--csv", default=None, help="raw rows (default: benchmarks/results.csv beside --out)")
    p.add_argument("--cache_dir", default="benchmarks/.cache", help="where the synthetic pairs are saved")
    p.add_argument("--prompts", type=positive_int, default=None)
    p.add_argument("--prompt_tokens", type=positive_int, default=None)
    p.add_argument("--max_new_tokens", type=positive_int, default=None)
    p.add_argument("--gamma", type=positive_int, default=4)
    p.add_argument("--max_gamma", type=positive_int, default=None,
                   help="cap for the adaptive policy and the v(k) table")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: all cores available)")
    p.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated subset of {', '.join(PAIRS)}")
    p.add_argument("--skip_beam", action="store_true")
    p.add_argument("--skip_kernels", action="store_true")
    p.add_argument("--skip_bad_draft", action="store_true")
    p.add_argument("--skip_sampling", action="store_true",
                   help="leave out the sampling rows (temperature 1, and 0.7 with top-p 0.9: the target alone, ours "
                   "and HF assisted sampling at the same gamma)")
    p.add_argument("--draft_dtypes", default="float32,auto,bfloat16,int8",
                   help="comma-separated draft dtypes measured side by side (acceptance, c, speed) with the fp32 "
                   "target: float32, auto (the job's default: large linears in bf16 where the CPU has native "
                   "bf16), bfloat16, int8 (dynamic int8 linears); float32 alone to skip")
    p.add_argument("--throughput", action="store_true",
                   help="also run pipeline.bench.throughput (plain batched generate vs ours at B=1,4,8,16) on the "
                   "same synthetic pair and prompt settings, into the same report")
    p.add_argument("--cross", action="store_true",
                   help="also run pipeline.bench.cross (a pair with two tokenizers: ours against HF universal "
                   "assisted generation at the same gamma) into the same report; trains its pair once (minutes)")
    a = p.parse_args(argv)
    a.pairs = {x.strip() for x in a.pairs.split(",") if x.strip()}
    if not a.pairs or a.pairs - set(PAIRS):  # (a typo measured nothing, then rewrote the report)
        p.error(f"argument --pairs: unknown pair {sorted(a.pairs - set(PAIRS))[0] if a.pairs else ''!r} "
                f"(choose from {', '.join(PAIRS)})")
    a.draft_dtypes = [d.strip() for d in a.draft_dtypes.split(",") if d.strip()]
    bad = [d for d in a.draft_dtypes if d not in BENCH_DRAFT_DTYPES]
    if bad:
        p.error(f"argument --draft_dtypes: unknown dtype {bad[0]!r} (choose from {', '.join(BENCH_DRAFT_DTYPES)})")
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
    a.out = a.out or ("bench-quick/BENCHMARKS.md" if quick else "BENCHMARKS.md")
    return a


@keeps_torch_threads
def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("transformers", "apache_beam", "specdec_core.cpu_speed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    started = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    torch.set_num_threads(args.threads or recommended_threads())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    csv_path = Path(args.csv) if args.csv else out.parent / "benchmarks" / "results.csv"
    cache = Path(args.cache_dir)
    spec = TINY_SYNTH if args.tiny else QUICK_SYNTH if args.quick else FULL_SYNTH
    dirs = build_synthetic_pair(spec, cache)
    prompts = synthetic_prompts(spec, args.prompts, args.prompt_tokens)
    results = []
    agreement = ("Random weights, so the target's 'text' is meaningless; the deeper layers are damped by "
                 f"{spec.damp} so the 1-layer early-exit draft agrees with it. Costs (c, v, ms/token) are those of a "
                 "real model of this size on this machine; acceptance, tokens/step, speed-ups and the bound DEPEND ON "
                 "THAT ARTIFICIAL AGREEMENT. Prompts alternate between random token strings and a repeated "
                 "7-token pattern (a mixed set: prompt lookup only works on the second kind).")
    pairs = args.pairs
    if "synthetic" in pairs:
        res = run_pair(f"Synthetic pair ({spec.layers}-layer Llama target, {spec.draft_layers}-layer early-exit "
                       "draft)", dirs["target"], dirs["draft"], prompts, args, note=agreement)
        results.append(summarized(res))
        gc.collect()
    if not args.skip_bad_draft and "bad_draft" in pairs:
        bad = run_pair("Synthetic target with a disagreeing draft (acceptance ≈ 0: does the engine back off?)",
                       dirs["target"], dirs["bad_draft"], prompts[: max(2, args.prompts // 2)], args,
                       full_set=False, note="Same target; the draft is a random 1-layer model, so it almost never "
                       "agrees. The adaptive policy must notice and stop drafting.")
        results.append(summarized(bad))
        gc.collect()
    gc.collect()
    kernels = None
    if not args.skip_kernels:
        from transformers import AutoTokenizer

        ids = AutoTokenizer.from_pretrained(dirs["target"])(prompts[0][1])["input_ids"]
        kernels = kernel_experiments(dirs["target"], ids, args)
    beam = None if args.skip_beam else beam_overhead(dirs["target"], dirs["draft"], prompts, args)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    rows = [r for res in results for r in res["rows"] + (res["sampling"]["rows"] if res["sampling"] else [])]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(csv_path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=keys)
        wr.writeheader()
        wr.writerows(rows)
    summary_json = csv_path.with_name(csv_path.stem + "-summary.json")
    summary_json.write_text(json.dumps({"results": [{"label": r["label"], "summary": r["summary"],
                                                     "sampling": r["sampling"]["summary"] if r["sampling"] else None,
                                                     "costs": {k: {"c": v.c, "v": v.v} for k, v in r["costs"].items()}}
                                                    for r in results], "beam": beam, "kernels": kernels},
                                       indent=1, default=str))
    write_report(out, csv_path, results, beam, kernels, argv, started, args)
    if args.throughput:
        from pipeline.bench import throughput as bench_throughput

        size = "tiny" if args.tiny else "quick" if args.quick else "full"
        bench_throughput.main(["--size", size, "--cache_dir", str(cache), "--out", str(out), "--prompts",
                               str(max(args.prompts, 16)), "--prompt_tokens", str(args.prompt_tokens),
                               "--max_new_tokens", str(args.max_new_tokens),
                               "--gammas", ",".join(sorted({"2", str(args.gamma)}))])
    if args.cross:
        cross_section(out, cache, args, argv)
    _LOG.info("wrote %s and %s (%.0f s)", out, csv_path, time.perf_counter() - started)
    return 0 if all(s["equal"] is not False for r in results for s in r["summary"]) else 1


def cross_section(out: Path, cache: Path, args: argparse.Namespace, argv: list[str]) -> None:
    """The cross-tokenizer pair (pipeline.bench.cross) at this run's gamma, prompts and length."""
    from pipeline.bench import cross as bench_cross

    res = bench_cross.run(argparse.Namespace(gamma=args.gamma, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                                             threads=args.threads or 0, cache_dir=str(cache / "cross"), batch_sizes=[],
                                             repeats=1))
    begin, end = "<!-- cross:begin -->", "<!-- cross:end -->"
    replace_section(out, "\n".join([
        begin, "## Cross-tokenizer pair in this run (`pipeline.bench --cross`)\n",
        f"Command: `python -m pipeline.bench {shlex.join(argv)}`. Target {res['params'][0] / 1e6:.1f}M parameters and "
        f"{res['vocab'][0]} tokens, draft {res['params'][1] / 1e6:.2f}M and {res['vocab'][1]} tokens (trained by "
        f"`pipeline/bench/cross.py`); {res['prompts']} prompts x {res['max_new_tokens']} new tokens, greedy, gamma "
        f"{res['gamma']}, {res['threads']} thread(s).\n", bench_cross.table(res), end, ""]), begin, end)


if __name__ == "__main__":
    sys.exit(main())
