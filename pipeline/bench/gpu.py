"""`python -m pipeline.bench.gpu`: speculative decoding against plain decoding on one GPU.

In one process, on a synthetic pair built on the device (random weights of a real model's
shape, the target's deeper layers damped so that a draft made of its first layers agrees with
it: the COSTS are the real shape's, the ACCEPTANCE is what the damping gives), every measured
prompt distinct and of its own length (a job never repeats a shape), interleaved per prompt:

- batch 1: Hugging Face `generate` (plain, and with a static cache and `torch.compile` when
  asked), HF assisted generation with the same draft at the same constant gamma, our engine
  with the target alone and with the draft, each of ours also with PyTorch's default attention
  kernels (cuDNN attention allowed: `specdec_core.attention`);
- batched: HF `generate` over left-padded batches of B prompts against our batch engine at the
  same B, with and without the draft, tokens/s over the whole set;
- a profile of one generation of ours with the draft: the GPU's busy share and the top CPU ops;
  and of one batched call of ours, alone and with the draft, with its share of time admitting rows.

Exactness counts stand beside every figure: outputs identical to HF `generate` of the same
batch size, and ours with the draft identical to ours alone. Results go to OUT/gpu-<dtype>.json
and OUT/gpu-<dtype>.md as each section ends (a run cut short keeps what it measured).
Runs on a CPU too (`--device cpu --shape tiny`), which is how the tests run it.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pipeline.bench.gpu_page import alone_of, markdown
from pipeline.bench.gpu_pairs import SHAPES, build_pair, distinct_prompts
from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.drafters import ModelDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.gamma import AdaptiveGamma
from specdec_core.graphs import PassGraphs
from specdec_core.pass_settings import PassSettings
from specdec_core.rounds import setup_seconds
from specdec_core.slot_kv import ADMIT_ROWS

_LOG = logging.getLogger("pipeline.bench.gpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- batch 1 ---------------------------------------------------------------------------------------

def _prompt_in_output(model) -> Callable[[list[int]], int]:
    """Where `generate()`'s new tokens start: after the prompt, or after the decoder start token."""
    return (lambda ids: 1) if model.config.is_encoder_decoder else len


def _hf_static_compiled(args, new_tokens: int) -> dict:
    """`generate()` keywords for HF's best plain decoding: a static cache and `torch.compile`. One
    cache size for every prompt and batch, so that one compiled decode step serves them all."""
    from transformers import CompileConfig

    return dict(cache_implementation="static", max_cache_len=args.max_len + new_tokens + 8,
                compile_config=CompileConfig(fullgraph=False, mode="reduce-overhead"))


def single_configs(target, draft, args) -> dict[str, Callable[[list[int]], tuple[list[int], dict]]]:
    """name -> fn(prompt ids) -> (new tokens, stats), all greedy, same gamma and length."""
    device, n, g = target.device, args.max_new_tokens, args.gamma
    skip = _prompt_in_output(target)

    def hf(**kwargs):
        def fn(ids):
            with torch.inference_mode():
                out = target.generate(torch.tensor([ids], device=device), do_sample=False, max_new_tokens=n,
                                      min_new_tokens=n, **kwargs)
            return out[0, skip(ids):].tolist(), {}
        return fn

    def ours(chain: bool | None, cudnn: bool, graphs: str, compiled: bool = False, compiled_prefills: bool = False):
        """chain: None for the target alone, else the draft with its steps chained or not."""
        settings = PassSettings(compile_prefills=compiled_prefills, cudnn_attention=cudnn)
        drafter = NoDrafter() if chain is None else ModelDrafter(draft, cuda_graphs=graphs, chain=chain,
                                                                  torch_compile=compiled, settings=settings)
        engine = SpeculativeGenerator(target, drafter, num_speculative_tokens=g, max_new_tokens=n, cuda_graphs=graphs,
                                      torch_compile=compiled, settings=settings)
        caches = (engine.static, getattr(drafter, "static", None))

        def fn(ids):
            setup = setup_seconds(*caches)
            out = engine.generate(ids)
            s = out.stats
            return out.tokens, {"drafted": s.draft_tokens, "accepted": s.accepted_tokens, "rounds": s.verify_steps,
                                "setup_s": setup_seconds(*caches) - setup}
        return fn

    gc = draft.generation_config
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = g, "constant", 0.0
    configs = {"HF generate": hf()}
    if args.hf_compile:
        configs["HF generate, static cache + compile"] = hf(**_hf_static_compiled(args, n))
    configs["HF assisted"] = hf(assistant_model=draft)
    # Our engine as it runs (CUDA graphs where the model allows), eager, and eager with PyTorch's
    # default attention kernels (cuDNN attention allowed): each with the target alone and the draft.
    for suffix, cudnn, graphs in (("", False, "auto"), (", eager", False, "off"),
                                  (", eager, cuDNN attention", True, "off")):
        configs["ours, target alone" + suffix] = ours(None, cudnn, graphs)
        configs["ours, draft" + suffix] = ours(False, cudnn, graphs)
    # A round's greedy drafts chained on the device, read back once (the job's default when compiled).
    configs["ours, draft, chained"] = ours(True, False, "auto")
    if args.torch_compile:  # each pass compiled (fused kernels) before its capture
        configs["ours, target alone, compiled"] = ours(None, False, "auto", True)
        configs["ours, draft, chained, compiled"] = ours(True, False, "auto", True)
        # Prompts' prefill graphs compiled too, as the batch engine's are (not a default at batch 1
        # until measured here).
        configs["ours, draft, chained, compiled, compiled prefills"] = ours(True, False, "auto", True, True)
    return configs


# What every configuration is compared against, run whatever --include picks (HF's compiled
# generate where --hf_compile asks for it).
REFERENCES = ("HF generate", "HF generate, static cache + compile")


def _order(name: str) -> int:
    """When a configuration runs (`run_single`, `run_batched`), so that a run cut short keeps the comparison that
    matters: 0 those that compile nothing, 1 ours compiled with the defaults, 2 HF's compiled `generate()` (its CUDA
    graph trees clear every cuBLAS workspace each time they record, which ours survive: `graphs.PassGraphs._record`),
    3 ours' other compiled variants, 4 the adaptive gamma, last, as it compiles a chained draft per gamma it picks."""
    if "adaptive" in name:
        return 4
    if name.startswith("HF"):
        return 2 if "compile" in name else 0
    if "compile" not in name:
        return 0
    return 1 if name in ("ours, draft, chained, compiled", "ours, target alone, compiled") else 3


def _single_summary(rows: dict, outputs: dict, failed: dict) -> dict:
    ref = outputs["HF generate"]
    summary = {name: dict(r) for name, r in rows.items() if outputs[name]}
    for name, r in summary.items():
        alone = outputs.get(alone_of(name), outputs["ours, target alone, eager"])
        done = r["prompts"] = len(outputs[name])  # the compiling configurations may have run fewer
        r["ms_per_token"] = 1000 * r["seconds"] / max(r["tokens"], 1)
        r["identical_to_hf"] = sum(a == b for a, b in zip(outputs[name], ref[:done], strict=True))
        r["identical_to_ours_alone"] = sum(a == b for a, b in zip(outputs[name], alone[:done], strict=True))
        r["acceptance"] = r["accepted"] / r["drafted"] if r["drafted"] else None
    return {"prompts": len(ref), "rows": summary, "failed": failed}


def run_single(target, draft, args, save: Callable[[dict], None] = lambda partial: None) -> dict:
    """The configurations that compile are warmed up and measured after the others, on the same
    prompts, so that a run cut short while compiling keeps every other figure. save: called with
    the figures so far after each prompt."""
    device = target.device
    configs = {name: fn for name, fn in single_configs(target, draft, args).items()
               if name in REFERENCES + ("ours, target alone, eager",) or re.search(args.include, name)}
    warm = distinct_prompts(args.warmup, args.min_len, args.max_len, target.config.vocab_size, seed=1000)
    prompts = distinct_prompts(args.prompts, args.min_len, args.max_len, target.config.vocab_size, seed=1)
    rows = {name: {"seconds": 0.0, "tokens": 0, "drafted": 0, "accepted": 0, "rounds": 0, "setup_s": 0.0}
            for name in configs}
    outputs: dict[str, list[list[int]]] = {name: [] for name in configs}
    failed: dict[str, str] = {}
    for rank in sorted({_order(name) for name in configs}):
        group = {name: fn for name, fn in configs.items() if _order(name) == rank}
        for ids in warm:  # compile, allocate, load kernels: on prompts that are never measured
            for name, fn in list(group.items()):
                t0 = time.perf_counter()
                try:
                    fn(ids)
                except Exception as e:  # noqa: BLE001 (a configuration this machine cannot run is reported)
                    _LOG.exception("%s failed in its warm-up: left out", name)
                    failed[name] = f"{type(e).__name__}: {e}"[:300]
                    del group[name]
                    continue
                _LOG.info("warm-up %s: %.1f s", name, time.perf_counter() - t0)
        for i, ids in enumerate(prompts):
            order = list(group) if i % 2 == 0 else list(reversed(group))  # no config always runs first
            for name in order:
                _sync(device)
                t0 = time.perf_counter()
                tokens, stats = group[name](ids)
                _sync(device)
                r = rows[name]
                # One-off graph captures (a prefill width the warm-up did not meet) are left out.
                r["seconds"] += time.perf_counter() - t0 - stats.get("setup_s", 0.0)
                r["tokens"] += len(tokens)
                for key, value in stats.items():
                    r[key] += value
                outputs[name].append(tokens)
            save(_single_summary(rows, outputs, failed))  # every config of the group has run this prompt
    return _single_summary(rows, outputs, failed)


# -- batched ---------------------------------------------------------------------------------------

def hf_batched(target, batch_size: int, items: list[list[int]], n: int, **kwargs) -> list[list[int]]:
    """HF `generate()`'s n new tokens for each prompt, batch_size prompts at a time (left-padded)."""
    outs = []
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk], device=target.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=target.device)
        with torch.inference_mode():
            out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                  **kwargs)
        outs += out[:, 1 if target.config.is_encoder_decoder else width:].tolist()
    return outs


def run_batched(target, draft, args, save: Callable[[dict], None] = lambda partial: None) -> dict:
    """save: called with the figures so far after each configuration (the batch size it was
    measuring under "batch_size_partial")."""
    device, n, g = target.device, args.batch_max_new_tokens or args.max_new_tokens, args.gamma
    prompts = distinct_prompts(args.batch_prompts, args.min_len, args.max_len, target.config.vocab_size, seed=2)
    # Warm-ups run B prompts and up to 16 more (never measured), so that rows admitted later, a few at a time, compile
    # their prefills there (about 50 s each on the H200), not in the measured call, as B prompts alone left them.
    warm = distinct_prompts(max(args.batch_sizes) + ADMIT_ROWS, args.min_len, args.max_len, target.config.vocab_size,
                            seed=2000)

    def hf(batch_size: int, items: list[list[int]], **kwargs) -> list[list[int]]:
        return hf_batched(target, batch_size, items, n, **kwargs)

    def hf_compiled(batch_size: int):
        return lambda items: hf(batch_size, items, **_hf_static_compiled(args, n))

    def ours(batch_size: int, drafter, graphs: str = "auto", cudnn: bool = False, compiled: bool = False,
             graph_prefills: bool = True, compiled_prefills: bool | None = None, graph_prefill_rows: int | None = None,
             adaptive: bool = False, pinned: bool = False, admit_together: int = 1):
        # One engine per configuration: its static slots and graphs are made once, in the warm-up.
        # compiled_prefills None: the engine's default (compiled with its passes).
        settings = PassSettings(graph_prefills=graph_prefills, compile_prefills=compiled_prefills,
                                graph_prefill_rows=graph_prefill_rows, pinned_inputs=pinned, cudnn_attention=cudnn,
                                admit_together=admit_together)
        engine = BatchSpeculativeGenerator(target, drafter, batch_size=batch_size, num_speculative_tokens=g,
                                           max_new_tokens=n, cuda_graphs=graphs, torch_compile=compiled,
                                           gamma_policy=AdaptiveGamma(max_gamma=g) if adaptive else None,
                                           settings=settings)

        def fn(items: list[list[int]]) -> list[list[int]]:
            gens = engine.generate_many([(p, 0) for p in items])
            fn.drafts = [k for gen in gens for k in gen.stats.drafts]  # each round's drafted tokens
            return [gen.tokens for gen in gens]
        fn.engine = engine  # its seconds in admissions (prefills), for the table
        return fn

    results, failed = {}, {}
    for b in args.batch_sizes:
        # Ours as it runs (fixed slots and CUDA graphs where the model allows); eager at the first B.
        configs = {"HF generate": lambda items, b=b: hf(b, items)}
        if args.hf_compile:
            configs["HF generate, static cache + compile"] = hf_compiled(b)
        configs["ours, target alone"] = ours(b, NoDrafter())
        configs["ours, draft"] = ours(b, ModelDrafter(draft))
        configs["ours, draft, chained"] = ours(b, ModelDrafter(draft, chain=True))
        if args.torch_compile:
            configs["ours, target alone, compiled"] = ours(b, NoDrafter(), compiled=True)
            configs["ours, draft, chained, compiled"] = ours(b, ModelDrafter(draft, chain=True), compiled=True)
            # New rows' prefill graphs uncompiled; or rows admitted 4 (16) or more at a time
            # prefilled in one padded eager pass (on the H200 an eager pass of the 1.1B target took
            # 13-15 ms, launch-bound) instead of the default's graphs of up to 16 rows a pass.
            configs["ours, draft, chained, compiled, uncompiled prefills"] = ours(
                b, ModelDrafter(draft, chain=True), compiled=True, compiled_prefills=False)
            configs["ours, draft, chained, compiled, eager prefills of 4+ rows"] = ours(
                b, ModelDrafter(draft, chain=True), compiled=True, graph_prefill_rows=3)
            configs["ours, draft, chained, compiled, eager prefills of 16+ rows"] = ours(
                b, ModelDrafter(draft, chain=True), compiled=True, graph_prefill_rows=15)
            # Passes' inputs copied from pinned memory without waiting, so that the host queues
            # new rows' prefills while the GPU runs them (a plain copy waits for the GPU:
            # the batched profiles had 117-184 ms in cudaStreamSynchronize per call); not a default.
            configs["ours, draft, chained, compiled, pinned inputs"] = ours(
                b, ModelDrafter(draft, chain=True), compiled=True, pinned=True)
            configs["ours, draft, chained, compiled, pinned inputs, eager prefills of 16+ rows"] = ours(
                b, ModelDrafter(draft, chain=True), compiled=True, graph_prefill_rows=15, pinned=True)
            # Freed slots wait until a quarter of the batch is free, so that new rows enter in fewer prefill passes
            # (a pass here costs its launches; on a CPU, which pays for its rows' arithmetic, waiting lost).
            configs["ours, draft, chained, compiled, admitted a quarter at a time"] = ours(
                b, ModelDrafter(draft, chain=True), compiled=True, admit_together=max(2, b // 4))
            configs["ours, target alone, compiled, eager prefills of 4+ rows"] = ours(
                b, NoDrafter(), compiled=True, graph_prefill_rows=3)
            # `--gamma_policy adaptive`: one gamma per round for the batch, from acceptance and
            # pass costs timed at its width (a wide verify pass is no longer nearly free).
            configs["ours, draft, chained, compiled, adaptive gamma"] = ours(
                b, ModelDrafter(draft, chain=True), compiled=True, adaptive=True)
        if b == args.batch_sizes[0]:
            # New rows prefilled eagerly in a padded cache, as before prefill graphs.
            configs["ours, target alone, eager prefills"] = ours(b, NoDrafter(), graph_prefills=False)
            configs["ours, draft, chained, eager prefills"] = ours(b, ModelDrafter(draft, chain=True),
                                                                   graph_prefills=False)
            configs["ours, target alone, eager"] = ours(b, NoDrafter(), "off")
            configs["ours, draft, eager"] = ours(b, ModelDrafter(draft, cuda_graphs="off"), "off")
            if args.batched_before:
                configs["ours, draft, eager, cuDNN attention"] = ours(
                    b, ModelDrafter(draft, cuda_graphs="off"), "off", cudnn=True)
        configs = {name: configs[name] for name in sorted(configs, key=_order)
                   if name in REFERENCES + ("ours, target alone",) or re.search(args.include, name)}
        row: dict[str, dict] = {}
        outs: dict[str, list[list[int]]] = {}
        results[str(b)] = row
        for name, fn in configs.items():
            try:
                # This batch width's shapes, graphs, compiles and allocations; admissions after the first wave too.
                fn(warm[: min(b + ADMIT_ROWS, len(prompts))])
            except Exception as e:  # noqa: BLE001 (a configuration this machine cannot run is reported, not fatal)
                _LOG.exception("B=%d %s failed in its warm-up: left out", b, name)
                failed[f"B={b} {name}"] = f"{type(e).__name__}: {e}"[:300]
                continue
            engine = getattr(fn, "engine", None)
            admitting = engine.admit_s if engine else 0.0
            caches = engine.slots.values() if engine else ()
            setup = setup_seconds(*caches)
            _sync(device)
            t0 = time.perf_counter()
            outs[name] = fn(prompts)
            _sync(device)
            # One-off graph captures (a prefill width the warm-up did not meet) are left out.
            setup = setup_seconds(*caches) - setup
            seconds = time.perf_counter() - t0 - setup
            tokens = sum(len(o) for o in outs[name])
            row[name] = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}
            if engine:
                row[name]["admit_s"] = engine.admit_s - admitting
                row[name]["setup_s"] = setup
                row[name]["drafts_per_round"] = sum(fn.drafts) / max(len(fn.drafts), 1)
            _LOG.info("B=%d %s: %.0f tokens/s", b, name, tokens / seconds)
            for measured, r in row.items():  # against the references measured so far (they run first)
                for key, ref in (("identical_to_hf", "HF generate"), ("identical_to_ours_alone", "ours, target alone")):
                    if ref in outs:
                        r[key] = sum(a == c for a, c in zip(outs[measured], outs[ref], strict=True))
            save({"prompts": len(prompts), "by_batch_size": copy.deepcopy(results), "failed": dict(failed),
                  "batch_size_partial": b})
    return {"prompts": len(prompts), "by_batch_size": results, "failed": failed}


SECTIONS = ("single", "batched", "profile", "profile_batched")


# -- profile ---------------------------------------------------------------------------------------

def _profiled(run: Callable[[], object], device: torch.device, setup: Callable[[], float] = lambda: 0.0) -> dict:
    """`run()` once as it is, then under torch's profiler: wall times, the GPU's kernel time, its
    share of the profiled wall time and of the unprofiled one (the profiler's own cost per
    operation stretches the first, not the kernels), kernel launches, cuDNN kernels and the
    costliest CPU-side ops. Wall times leave out one-off captures and compiles meanwhile
    (`setup()`: the engine's `setup_seconds`), as the bench's timings do."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    t0, s0 = time.perf_counter(), setup()
    run()
    _sync(device)
    plain = time.perf_counter() - t0 - (setup() - s0)
    t0, s0 = time.perf_counter(), setup()
    with profile(activities=activities) as prof:
        run()
        _sync(device)
    wall = time.perf_counter() - t0 - (setup() - s0)
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    kernels = sorted((e for e in events if e.device_type.name == "CUDA"), key=lambda e: e.self_device_time_total,
                     reverse=True)[:12]
    return {"wall_s": wall, "gpu_kernel_s": kernel_us / 1e6, "gpu_busy_share": kernel_us / 1e6 / wall,
            "unprofiled_wall_s": plain, "gpu_busy_share_unprofiled": kernel_us / 1e6 / plain,
            "launches": launches, "cudnn_kernels": sum(e.count for e in events if "cudnn" in e.key.lower()),
            "top_cpu_ops_ms": {e.key: e.self_cpu_time_total / 1000 for e in top},
            # where the GPU's time goes: (kernel, count, ms)
            "top_gpu_kernels": [(e.key[:160], e.count, e.self_device_time_total / 1000) for e in kernels]}


def run_profile(target, draft, args, save: Callable[[dict], None] = lambda partial: None) -> dict:
    """One generation of ours with the draft, on a fresh prompt, per way of running its passes
    (`_profiled`)."""
    out = {}
    ways = [("CUDA graphs", False, "auto", False, False), ("CUDA graphs, chained", False, "auto", True, False),
            ("eager", False, "off", False, False)]
    if args.torch_compile:
        ways.insert(2, ("CUDA graphs, chained, compiled", False, "auto", True, True))
    if args.batched_before:
        ways.append(("eager, cuDNN attention", True, "off", False, False))
    for i, (label, cudnn, graphs, chain, compiled) in enumerate(ways):
        settings = PassSettings(cudnn_attention=cudnn)
        drafter = ModelDrafter(draft, cuda_graphs=graphs, chain=chain, torch_compile=compiled, settings=settings)
        engine = SpeculativeGenerator(target, drafter, num_speculative_tokens=args.gamma,
                                      max_new_tokens=args.max_new_tokens, cuda_graphs=graphs, torch_compile=compiled,
                                      settings=settings)
        ids = distinct_prompts(1, args.min_len, args.max_len, target.config.vocab_size, seed=3000 + i)[0]
        engine.generate(distinct_prompts(1, args.min_len, args.max_len, target.config.vocab_size, 4000)[0])
        out[label] = _profiled(lambda engine=engine, ids=ids: engine.generate(ids), target.device,
                               lambda engine=engine, drafter=drafter: setup_seconds(engine.static, drafter.static))
    return out


def run_profile_batched(target, draft, args, save: Callable[[dict], None] = lambda partial: None) -> dict:
    """Ours batched at the first of `--batch_sizes` (fixed slots and graphs where the model allows),
    the target alone and the draft chained (compiled with `--torch_compile`, as a GPU job runs
    them), each over twice that many fresh prompts after a warm-up on as many: where a batched
    round's time goes, and the share of it spent admitting rows; with `--hf_compile`, HF's
    compiled `generate()` over the same prompts first, whose GPU kernel time and top kernels ours'
    compare with."""
    b, n = args.batch_sizes[0], args.batch_max_new_tokens or args.max_new_tokens
    out = {}
    if args.hf_compile:
        warm, ids = (distinct_prompts(2 * b, args.min_len, args.max_len, target.config.vocab_size, seed=s)
                     for s in (5000, 6000))
        kwargs = _hf_static_compiled(args, n)
        hf_batched(target, b, warm, n, **kwargs)
        hf = out[f"B={b}, HF generate, static cache + compile"] = _profiled(
            lambda: hf_batched(target, b, ids, n, **kwargs), target.device)
        hf["tokens"] = 2 * b * n
        # Its prefills' share: the same calls for one new token (the prefill and a pick). Speculation
        # speeds up decoding only, so this share bounds what any draft can gain over HF here.
        hf_batched(target, b, warm, 1, **kwargs)
        _sync(target.device)
        t0 = time.perf_counter()
        hf_batched(target, b, ids, 1, **kwargs)
        _sync(target.device)
        hf["admit_s"] = time.perf_counter() - t0
        save(dict(out))
    compiled = ", compiled" if args.torch_compile else ""  # as a GPU job runs, its passes compiled
    for i, (label, drafter) in enumerate(((f"B={b}, target alone{compiled}", NoDrafter()),
                                          (f"B={b}, draft, chained{compiled}", ModelDrafter(draft, chain=True)))):
        engine = BatchSpeculativeGenerator(target, drafter, batch_size=b, num_speculative_tokens=args.gamma,
                                           max_new_tokens=n, torch_compile=args.torch_compile)
        warm, ids = (distinct_prompts(2 * b, args.min_len, args.max_len, target.config.vocab_size, seed=s)
                     for s in (5000 + i, 6000 + i))
        engine.generate_many([(p, 0) for p in warm])
        runs: list[tuple[int, float]] = []  # per run: its new tokens, its seconds admitting rows

        def run(engine=engine, ids=ids, runs=runs) -> None:
            before = engine.admit_s
            gens = engine.generate_many([(p, 0) for p in ids])
            runs.append((sum(len(g.tokens) for g in gens), engine.admit_s - before))
        out[label] = _profiled(run, target.device, lambda engine=engine: setup_seconds(*engine.slots.values()))
        out[label]["tokens"], out[label]["admit_s"] = runs[0]  # the unprofiled run's
        save(dict(out))
    return out


# -- a pair for a whole job -------------------------------------------------------------------------

def save_job_inputs(target, draft, args, dest: Path) -> None:
    """The pair (with a word-level tokenizer: token i is the word "t<i>") and `args.batch_prompts`
    distinct prompts as Parquet under `dest`, for `python -m pipeline.run` on this device."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.bench.pairs import _word_tokenizer

    tok = _word_tokenizer(target.config.vocab_size)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(dest / name)
        tok.save_pretrained(dest / name)
    prompts = distinct_prompts(args.batch_prompts, args.min_len, args.max_len, target.config.vocab_size, seed=5)
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(len(prompts))],
                             "prompt": [" ".join(f"t{t}" for t in p) for p in prompts]}), dest / "prompts.parquet")


# -- report ----------------------------------------------------------------------------------------

class _Warnings(logging.Handler):
    """Warning lines of a logger, kept (graphs' fallbacks to eager passes)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage()[:300])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # Plain argparse: the GPU machine has no Beam for pipeline.flags; abbreviations refused all the same.
    p = argparse.ArgumentParser(prog="python -m pipeline.bench.gpu", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (cpu: for tests, with --shape tiny)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--shape", default="tinyllama-1.1b", choices=sorted(SHAPES))
    p.add_argument("--sections", default="single,batched,profile",
                   help="comma-separated: single (batch 1), batched, profile (batch 1), profile_batched (at the "
                   "first --batch_sizes)")
    p.add_argument("--prompts", type=int, default=8, help="measured prompts at batch 1")
    p.add_argument("--warmup", type=int, default=2, help="warm-up prompts at batch 1 (never measured)")
    p.add_argument("--batch_prompts", type=int, default=128, help="prompts in the batched set")
    p.add_argument("--batch_sizes", default="8,32,128")
    p.add_argument("--min_len", type=int, default=64)
    p.add_argument("--max_len", type=int, default=256)
    p.add_argument("--max_new_tokens", type=int, default=128)
    p.add_argument("--batch_max_new_tokens", type=int, default=None, help="batched set (default: --max_new_tokens)")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--batched_before", action="store_true",
                   help="also ours eager with PyTorch's own attention choice (cuDNN attention allowed): batched at "
                        "the first batch size, and in the profile")
    p.add_argument("--include", default="", metavar="REGEX",
                   help="only the configurations whose names match (the references always run: HF generate, with "
                        "--hf_compile also compiled, and ours alone, eager at batch 1, as it runs batched)")
    p.add_argument("--hf_compile", action="store_true",
                   help="also HF generate with a static cache and torch.compile (compiles during warm-up)")
    p.add_argument("--torch_compile", action="store_true",
                   help="also ours with every pass over static caches compiled by torch.compile before its capture, "
                        "the target alone and with chained drafts, batch 1 and batched (compiles during warm-up)")
    p.add_argument("--out", default="gpu-bench", help="folder for gpu-<shape>-<dtype>.json and .md")
    p.add_argument("--report", default=None, metavar="JSON", help="print the tables of a result file and stop")
    p.add_argument("--save", default=None, metavar="DIR",
                   help="instead of measuring: save the pair and --batch_prompts prompts under DIR for pipeline.run")
    args = p.parse_args(argv)
    sizes = [b.strip() for b in args.batch_sizes.split(",") if b.strip()]
    if not all(b.isdecimal() and int(b) >= 1 for b in sizes):
        p.error(f"--batch_sizes {args.batch_sizes!r}: expected comma-separated integers >= 1")
    args.batch_sizes = [int(b) for b in sizes]
    for flag, low in (("prompts", 1), ("warmup", 0), ("batch_prompts", 1), ("max_new_tokens", 1), ("gamma", 1),
                      ("batch_max_new_tokens", 1)):  # (each failed in a traceback once the pair was built)
        if (value := getattr(args, flag)) is not None and value < low:
            p.error(f"--{flag} must be >= {low}, got {value}")
    for flag, check, errors in (("device", torch.device, RuntimeError), ("include", re.compile, re.error)):
        try:
            check(getattr(args, flag))
        except errors as e:
            p.error(f"--{flag} {getattr(args, flag)!r}: {e}")
    args.sections = [s for s in args.sections.split(",") if s]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        p.error(f"--sections: unknown {', '.join(sorted(unknown))} ({', '.join(SECTIONS)})")
    if not 1 <= args.min_len <= args.max_len:
        p.error(f"--min_len/--max_len: need 1 <= min <= max, got {args.min_len}, {args.max_len}")
    if args.report and not Path(args.report).is_file():
        p.error(f"--report {args.report}: no such file")
    batched = {"batched", "profile_batched"} & set(args.sections) and not (args.report or args.save)
    if batched and args.batch_sizes and max(args.batch_sizes) > args.batch_prompts:
        # (the table would say B while fewer rows ever ran together)
        p.error(f"--batch_sizes {max(args.batch_sizes)}: more rows than --batch_prompts {args.batch_prompts}")
    return args


def main(argv: list[str] | None = None) -> dict:
    import transformers

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = parse_args(argv)
    if args.report:
        result = json.loads(Path(args.report).read_text())
        print(markdown(result))
        return result
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"gpu-{args.shape}-{args.dtype}"

    def write(result: dict) -> None:
        (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1))
        (out_dir / f"{stem}.md").write_text(markdown(result))

    t0 = time.perf_counter()
    target, draft = build_pair(SHAPES[args.shape], device, dtype)
    result = {"shape": args.shape, "dtype": args.dtype, "gamma": args.gamma, "max_new_tokens": args.max_new_tokens,
              "batch_max_new_tokens": args.batch_max_new_tokens or args.max_new_tokens,
              "min_len": args.min_len, "max_len": args.max_len, "torch": torch.__version__,
              "cuda": torch.version.cuda, "transformers": transformers.__version__,
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
              or "cpu", "build_s": time.perf_counter() - t0}
    _LOG.info("built the %s pair on %s in %.1f s", args.shape, result["device_name"], result["build_s"])
    if args.save:
        save_job_inputs(target, draft, args, Path(args.save))
        return result
    runners = {"single": run_single, "batched": run_batched, "profile": run_profile,
               "profile_batched": run_profile_batched}
    # A figure labelled "graphs" must be one: any pass that fell back to eager is reported beside them.
    fallbacks, graphs_log = _Warnings(), logging.getLogger(PassGraphs.__module__)  # (where passes fall back)
    graphs_log.addHandler(fallbacks)
    result["graph_fallbacks"] = fallbacks.lines
    try:
        for section in args.sections:
            t0 = time.perf_counter()

            def partial(figures: dict, section: str = section) -> None:
                write({**result, section: figures, f"{section}_partial": True})

            result[section] = runners[section](target, draft, args, partial)
            result[f"{section}_s"] = time.perf_counter() - t0
            write(result)
            _LOG.info("%s done in %.0f s", section, result[f"{section}_s"])
    finally:
        graphs_log.removeHandler(fallbacks)
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
