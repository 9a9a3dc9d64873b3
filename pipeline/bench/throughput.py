"""`python -m pipeline.bench.throughput`: tokens per second per worker, batched.

An offline job pays for machine hours, so the number its user compares is throughput. On the
same prompts, in one run, this times plain Hugging Face batched greedy `generate` of the
target alone (left padding; with its default cache and with its preallocated static one, the
faster at large B, so that "plain batching at its best" is the best of both) and our batched
speculative engine (continuous batching) at each batch size B, and checks that every output
equals the target's own greedy decoding per prompt.
It writes (or replaces) a "Throughput" section in the report, between HTML markers, so
`pipeline.bench` can run without erasing it (and `pipeline.bench --throughput` runs it too).
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import logging
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from pipeline.bench.report import replace_section
from pipeline.flags import ArgumentParser, positive_int
from pipeline.threads import keeps_torch_threads, recommended_threads
from specdec_core.batch_engine import WARM_WAVES
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.decoder import eos_ids
from specdec_core.drafters import Drafter, ModelDrafter, NgramDrafter, NoDrafter, through_end

ADAPTIVE_MAX = 4  # `--gammas adaptive`: the job's default num_speculative_tokens caps the policy

_LOG = logging.getLogger("pipeline.bench.throughput")
BEGIN, END = "<!-- throughput:begin -->", "<!-- throughput:end -->"
# Each pair's section heading (BENCHMARKS.md links to them: a rerun keeps them).
PAIR_TITLES = {"llama": "batched", "t5": "an encoder-decoder pair", "mistral": "a sliding-window pair",
               "demo": "a trained pair"}


def hf_batched(model, prompts: list[list[int]], batch: int, max_new: int,
               cache: str = "dynamic", eos: set[int] | None = None) -> tuple[list[list[int]], float]:
    """Plain batched greedy generate, B prompts at a time, left-padded; (outputs, seconds).
    cache "static" is HF's preallocated cache (`cache_implementation="static"`), which writes
    each step in place instead of concatenating: at long contexts it is plain batching's best.
    eos: rows end at these tokens, as ours do (the end kept, the pads after it dropped); none:
    every row runs to max_new."""
    extra = {} if cache == "dynamic" else {"cache_implementation": cache}
    stop = {"eos_token_id": sorted(eos)} if eos else {"min_new_tokens": max_new, "eos_token_id": None}
    encdec = model.config.is_encoder_decoder
    outs, t0 = [], time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        if encdec:  # lazy caches: generate() sizes T5's self-attention cache by the (shallower) encoder
            from transformers import DynamicCache, EncoderDecoderCache
            extra = {"cache": EncoderDecoderCache(DynamicCache(), DynamicCache())}
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                                 pad_token_id=0, **stop, **extra)
        outs += [through_end(o, eos) if eos else o for o in out[:, 1 if encdec else width:].tolist()]
    return outs, time.perf_counter() - t0


def engine_modules(package: str = "specdec_core") -> SimpleNamespace:
    """An engine package's modules by name (`engine`, `batch_engine`, `drafters`, `gamma`, `cpu_speed`): this tree's, or
    an older commit's imported under another name (`benchmarks/old_vs_new_paired.py`)."""
    names = ("engine", "batch_engine", "drafters", "gamma", "cpu_speed")
    return SimpleNamespace(**{m: importlib.import_module(f"{package}.{m}") for m in names})


def ours_batched(target, drafter: Drafter, prompts: list[list[int]], batch: int, gamma: int | str,
                 max_new: int, core: SimpleNamespace | None = None, adaptive_max: int = ADAPTIVE_MAX
                 ) -> tuple[list[list[int]], float, dict]:
    """Our engine as the pipeline runs it: batch-1 engine at B=1, the batched one above.
    gamma "adaptive": `--gamma_policy adaptive` as a warm worker runs it. A job's worker keeps one
    engine and policy for all its batches: it measures the pair's costs at its width once, pools
    the rows' acceptance and backs off its probes, so only its first rows start from the prior.
    The first WARM_WAVES x B prompts (at B=1, one prompt), decoded by the same engine off the clock, put it
    there: two waves, the second's rows entering as the first's end, so that it has also timed
    admitting rows apart; a bench of a few hundred rows would otherwise charge every call a
    worker's one-off start. core: the engine's modules (`engine_modules`), by default this tree's.
    adaptive_max: adaptive's cap, as a job's --num_speculative_tokens sets it."""
    core = core or engine_modules()
    one_row, batched = core.engine.SpeculativeGenerator, core.batch_engine.BatchSpeculativeGenerator
    adaptive = gamma == "adaptive"
    policy, cap = (core.gamma.AdaptiveGamma(max_gamma=adaptive_max), adaptive_max) if adaptive else (None, gamma)
    settings = {"num_speculative_tokens": cap, "max_new_tokens": max_new, "gamma_policy": policy}
    gen = one_row(target, drafter, **settings) if batch == 1 else batched(target, drafter, batch_size=batch, **settings)
    if policy is not None and not isinstance(drafter, core.drafters.NoDrafter):
        if batch == 1:
            policy.set_costs(gen.measure_costs(prompts[0]))
            gen.generate(prompts[0], 0)
        else:  # (the engine measures its costs as its first rows enter)
            gen.generate_many([(p, 0) for p in prompts[: WARM_WAVES * batch]])
    t0 = time.perf_counter()
    admit_s = None
    if batch == 1:
        outs = [gen.generate(p, 0) for p in prompts]
    else:
        admitted = gen.admit_s
        outs = gen.generate_many([(p, 0) for p in prompts])
        admit_s = gen.admit_s - admitted
    secs = time.perf_counter() - t0
    drafted = sum(o.stats.draft_tokens for o in outs)
    stats = {"acceptance": sum(o.stats.accepted_tokens for o in outs) / drafted if drafted else None,
             "steps": sum(o.stats.verify_steps for o in outs),
             "admitting": None if admit_s is None else admit_s / secs}
    return [o.tokens for o in outs], secs, stats


def run(target_dir: Path, draft_dir: Path | None, prompts: list[str], batches: list[int], gammas: list[int | str],
        max_new: int, drafters: list[str], hf_kernels: list[str], reps: int,
        hf_caches: tuple[str, ...] = ("dynamic", "static"), share_encoder: bool = False,
        bad_draft_dir: Path | None = None, adaptive_max: int = ADAPTIVE_MAX) -> list[dict]:
    """Every config at every B, `reps` times, alternating the order within a B (ABBA) so that
    load drifting on a shared machine does not favour whichever config runs last. HF's rows end
    at the target's end tokens as ours do (a trained pair's; a synthetic pair's run to the budget);
    tokens/s counts the tokens each run made."""
    from transformers import AutoTokenizer

    from specdec_core.loading import load_model

    cpu = torch.device("cpu")
    target = load_model(str(target_dir), cpu, torch.float32)
    tok = AutoTokenizer.from_pretrained(target_dir)
    ids = [tok(p)["input_ids"] for p in prompts]
    target_p = prepare_for_cpu(copy.deepcopy(target))
    draft_p = None
    if draft_dir is not None and "model" in drafters:
        draft_p = prepare_for_cpu(load_model(str(draft_dir), cpu, torch.float32))
        if share_encoder and target.config.is_encoder_decoder:
            draft_p.encoder = target_p.get_encoder()  # one encoder pass per prompt serves both models
    bad_p = None
    if "bad" in drafters:
        if bad_draft_dir is None:
            raise ValueError("--drafters bad: this pair has no disagreeing draft (the llama pair has)")
        bad_p = prepare_for_cpu(load_model(str(bad_draft_dir), cpu, torch.float32))
    makers = {"model": lambda: ModelDrafter(draft_p), "bad": lambda: ModelDrafter(bad_p),
              "ngram": lambda: NgramDrafter(), "none": lambda: NoDrafter()}
    models = {"stock": target, "prepacked": target_p}
    eos = eos_ids(target)
    rows, reference = [], None
    # Warm-up (first-call allocations, oneDNN kernel selection) outside the clock.
    hf_batched(target, ids[:2], 2, 4)
    ours_batched(target_p, makers[drafters[0]](), ids[:2], 2, gammas[0], 4, adaptive_max=adaptive_max)
    if 1 not in batches:  # every output is still checked against the prompt decoded alone
        reference, _ = hf_batched(target, ids, 1, max_new, eos=eos)
    for b in batches:
        configs = [(f"HF generate, target alone ({k} kernels" + (f", {c} cache)" if c != "dynamic" else ")"),
                    "hf", (k, c), None) for k in hf_kernels for c in hf_caches]
        names = {"bad": "model that never agrees"}
        configs += [(f"ours, drafter {names.get(d, d)}" + ("" if d == "none" else f", gamma {g}" if g != "adaptive"
                                                            else f", adaptive gamma (at most {adaptive_max})"),
                     d, None, g)
                    for d in drafters for g in (gammas if d != "none" else [1])]
        acc: dict[str, dict] = {label: {"seconds": 0.0, "tokens": 0, "runs": [], "acceptance": None, "equal": None,
                                        "admitting": []}
                                for label, *_ in configs}
        for rep in range(reps):
            for label, kind, setting, g in (configs if rep % 2 == 0 else configs[::-1]):
                if kind == "hf":
                    outs, secs = hf_batched(models[setting[0]], ids, b, max_new, setting[1], eos)
                    if reference is None and b == 1:
                        reference = outs
                    st = {"acceptance": None, "admitting": None}
                else:
                    outs, secs, st = ours_batched(target_p, makers[kind](), ids, b, g, max_new,
                                                  adaptive_max=adaptive_max)
                a = acc[label]
                a["seconds"] += secs
                n_tokens = sum(len(o) for o in outs)
                a["tokens"] += n_tokens
                a["runs"].append(n_tokens / secs)
                a["acceptance"] = st["acceptance"]
                if st["admitting"] is not None:
                    a["admitting"].append(st["admitting"])
                if reference is not None:  # HF's own batched rows too: padding may round differently
                    equal = sum(o == r for o, r in zip(outs, reference, strict=True))
                    a["equal"] = equal if a["equal"] is None else min(a["equal"], equal)
                _LOG.info("%s B=%d: %.1f tok/s", label, b, n_tokens / secs)
        for label, *_ in configs:
            a = acc[label]
            rows.append({"config": label, "B": b, "seconds": a["seconds"], "runs": a["runs"],
                         "tokens_per_s": a["tokens"] / a["seconds"], "acceptance": a["acceptance"],
                         "admitting": sum(a["admitting"]) / len(a["admitting"]) if a["admitting"] else None,
                         "equal": a["equal"]})
        gc.collect()
    return rows


def markers(pair: str) -> tuple[str, str]:
    """The report section's markers: one section per pair family."""
    if pair == "llama":
        return BEGIN, END
    return f"<!-- throughput-{pair}:begin -->", f"<!-- throughput-{pair}:end -->"


def report(rows: list[dict], header: str, n_prompts: int, pair: str = "llama") -> str:
    def f(x, fmt="{:.1f}"):
        return "–" if x is None else fmt.format(x)

    plain = {b: max(r["tokens_per_s"] for r in rows if r["B"] == b and r["config"].startswith("HF"))
             for b in sorted({r["B"] for r in rows})}
    best_plain = max(plain.values())
    best_b = max(plain, key=plain.get)
    begin, end = markers(pair)
    what, flag = PAIR_TITLES[pair], "" if pair == "llama" else f" --pair {pair}"
    lines = [begin, f"## Throughput per worker: {what} (`pipeline.bench.throughput{flag}`)\n", header, "",
             f"| config | B | tokens/s | each run | x plain HF at this B | x plain HF at its best (B={best_b}) | "
             "acceptance | time admitting rows | greedy equal to HF B=1 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        equal = "–" if r["equal"] is None else f"{r['equal']}/{n_prompts}"
        runs = " / ".join(f"{x:.1f}" for x in r["runs"])
        lines.append(f"| {r['config']} | {r['B']} | {f(r['tokens_per_s'])} | {runs} | "
                     f"{f(r['tokens_per_s'] / plain[r['B']], '{:.2f}')} | "
                     f"{f(r['tokens_per_s'] / best_plain, '{:.2f}')} | {f(r['acceptance'], '{:.2f}')} | "
                     f"{f(r['admitting'], '{:.0%}')} | {equal} |")
    ours = [r for r in rows if r["config"].startswith("ours")]
    best = max(ours, key=lambda r: r["tokens_per_s"])
    lines += ["", f"Plain batching at its best: {best_plain:.1f} tokens/s (B={best_b}). Ours at its best: "
              f"{best['tokens_per_s']:.1f} tokens/s ({best['config']}, B={best['B']}), "
              f"{best['tokens_per_s'] / best_plain:.2f}x plain batching at its best.", end]
    return "\n".join(lines) + "\n"


def parse(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m pipeline.bench.throughput", description=__doc__)
    p.add_argument("--size", default="full", choices=("full", "quick", "tiny"),
                   help="synthetic pair of pipeline.bench: full (325M target), quick, tiny (tests); with --pair "
                        "t5/mistral: full or tiny")
    p.add_argument("--pair", default="llama", choices=("llama", "t5", "mistral", "demo"),
                   help="llama: the bench's pair; t5: an encoder-decoder pair (draft sharing the target's encoder); "
                        "mistral: a sliding-window pair whose window the rows pass (pipeline/bench/family_pairs.py); "
                        "demo: pipeline.demo's trained pair and its prompts (--size and --prompt_tokens unused)")
    p.add_argument("--cache_dir", default="benchmarks/.cache", help="where the synthetic pair is (built if missing)")
    p.add_argument("--out", default="BENCHMARKS.md", help="report whose Throughput section is replaced")
    p.add_argument("--prompts", type=positive_int, default=32)
    p.add_argument("--prompt_tokens", type=positive_int, default=128)
    p.add_argument("--max_new_tokens", type=positive_int, default=48)
    p.add_argument("--gammas", default="2,4",
                   help="comma-separated gammas for our engine: fixed numbers, or adaptive (--gamma_policy adaptive)")
    p.add_argument("--adaptive_max", type=int, default=ADAPTIVE_MAX,
                   help="adaptive gamma's cap (a job's --num_speculative_tokens)")
    p.add_argument("--hf_kernels", default="stock,prepacked", help="kernels for plain HF: stock, prepacked or both")
    p.add_argument("--hf_cache", default="dynamic,static",
                   help="caches for plain HF: dynamic (generate's default), static (preallocated, written in "
                        "place: the faster at large B) or both")
    p.add_argument("--reps", type=positive_int, default=2, help="runs of every config, order alternating")
    p.add_argument("--batches", default="1,4,8,16", help="comma-separated batch sizes")
    p.add_argument("--drafters", default="model,none",
                   help="comma-separated: model, ngram, none, bad (the llama pair's random draft, which never "
                        "agrees: what speculation costs where it cannot pay)")
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--note", default="", help="free text added to the report (e.g. that the machine was shared)")
    a = p.parse_args(argv)
    # Checked here, in one line, rather than after the models load.
    for flag, allowed in (("hf_kernels", ("stock", "prepacked")), ("hf_cache", ("dynamic", "static")),
                          ("drafters", ("model", "ngram", "none", "bad"))):
        values = [x.strip() for x in getattr(a, flag).split(",")]
        bad = [x for x in values if x not in allowed]
        if bad:
            p.error(f"--{flag}: {', '.join(bad)} is not one of {', '.join(allowed)}")
        setattr(a, flag, values)
    gammas = [g.strip() for g in a.gammas.split(",")]
    bad = [g for g in gammas if g != "adaptive" and not (g.isdecimal() and int(g) >= 1)]
    if bad:
        p.error(f"--gammas: {', '.join(bad)} is neither a gamma >= 1 nor adaptive")
    a.gammas = [g if g == "adaptive" else int(g) for g in gammas]
    if a.adaptive_max < 1:
        p.error(f"--adaptive_max: {a.adaptive_max} is not a gamma >= 1")
    batches = [b.strip() for b in a.batches.split(",")]
    if bad := [b for b in batches if not (b.isdecimal() and int(b) >= 1)]:
        p.error(f"--batches: {', '.join(bad)} is not a batch size >= 1")
    a.batches = [int(b) for b in batches]
    if "bad" in a.drafters and a.pair != "llama":
        p.error(f"--drafters bad: only the llama pair has a draft that never agrees, not --pair {a.pair}")
    return a


@keeps_torch_threads
def main(argv: list[str] | None = None) -> int:
    from pipeline.bench.pairs import FULL_SYNTH, QUICK_SYNTH, TINY_SYNTH, build_synthetic_pair, synthetic_prompts
    from pipeline.bench.report import machine

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)  # (before the measuring, not after it)
    torch.set_num_threads(a.threads or recommended_threads())
    spec = {"full": FULL_SYNTH, "quick": QUICK_SYNTH, "tiny": TINY_SYNTH}[a.size]
    if a.pair == "llama":
        dirs = build_synthetic_pair(spec, Path(a.cache_dir))
        described = (f"Synthetic pair of `pipeline.bench` ({spec.layers}-layer Llama target, hidden {spec.hidden}; "
                     f"{spec.draft_layers}-layer early-exit draft)")
    elif a.pair == "demo":
        from pipeline.demo.assets import ASSETS, demo_prompt_rows

        dirs = {"target": ASSETS / "target", "draft": ASSETS / "draft"}
        described = "The trained pair of `pipeline.demo` (a Llama-style target and its first layer as the draft)"
    else:
        from pipeline.bench.family_pairs import FAMILY_PAIRS, TINY_FAMILY_PAIRS, build_family_pair, describe

        spec = (TINY_FAMILY_PAIRS if a.size == "tiny" else FAMILY_PAIRS)[a.pair]
        dirs = build_family_pair(spec, Path(a.cache_dir))
        described = describe(spec)[0].upper() + describe(spec)[1:]
    prompts = ([r["prompt"] for r in demo_prompt_rows()[: a.prompts]] if a.pair == "demo"
               else [text for _, text in synthetic_prompts(spec, a.prompts, a.prompt_tokens)])
    batches = a.batches
    shown = [x for i, x in enumerate(argv) if x != "--note" and (i == 0 or argv[i - 1] != "--note")]
    t0 = time.perf_counter()
    rows = run(dirs["target"], dirs["draft"], prompts, batches, a.gammas,
               a.max_new_tokens, a.drafters, a.hf_kernels, a.reps, tuple(a.hf_cache), share_encoder=a.pair == "t5",
               bad_draft_dir=dirs.get("bad_draft"), adaptive_max=a.adaptive_max)
    shape = (f"{len(prompts)} of its prompts, up to {a.max_new_tokens} new tokens each (a row ends at its end token)"
             if a.pair == "demo" else f"{a.prompts} prompts of {a.prompt_tokens} tokens (mixed random/repetitive, as "
                                      f"in the bench), {a.max_new_tokens} new tokens each")
    header = (f"{described}, {shape}, greedy, "
              f"{torch.get_num_threads()} thread(s); {machine()}. Each run decodes all prompts; ours runs with "
              f"continuous batching (the batch-1 engine at B=1). Every config ran {a.reps} times per B in alternating "
              f"order; tokens/s is over all its runs. Run time {time.perf_counter() - t0:.0f} s. "
              f"Command: `python -m pipeline.bench.throughput {shlex.join(shown)}{' --note TEXT' if a.note else ''}`. "
              f"{a.note}")
    replace_section(Path(a.out), report(rows, header, len(prompts), a.pair), *markers(a.pair))
    return 0


if __name__ == "__main__":
    sys.exit(main())
