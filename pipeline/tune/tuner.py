"""`python -m pipeline.tune`: choose the drafter, gamma and batch size before a large job.

The paper's serving lesson is that the best draft is not the most accurate one but the one that
balances acceptance against its cost, on the machine that runs the job. So tune measures, on
this machine and on a sample of the job's own prompts (encoded exactly as `pipeline.run`
encodes them): each candidate's acceptance a, its step cost c and the target's verify costs
v(k); predicts the speed-up at every gamma (`pipeline.tune.model`); runs the most promising
settings for real next to the target alone; then, for decoder-only targets, measures
throughput per worker at several batch sizes (what an offline job pays for). It prints a
table, the recommended `pipeline.run` flags and the job's estimated time, and with
--output_json writes the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import statistics
import sys
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from apache_beam.io.filesystems import FileSystems

from pipeline.logs import setup_logging
from pipeline.threads import keeps_torch_threads
from pipeline.tune.command import TuneError, check_settings, parse, run_argv
from pipeline.tune.model import (
    PAY_MARGIN,
    Candidate,
    SampleRun,
    best_setting,
    fit_overhead,
    pick_to_verify,
    relative_error,
)
from pipeline.tune.report import format_report
from specdec_core.batch_engine import WARM_WAVES, BatchSpeculativeGenerator, pad_id_of
from specdec_core.cross_tokenizer import CrossTokenizerDrafter
from specdec_core.drafters import Drafter, NgramDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.gamma import AdaptiveGamma, Costs, GammaPolicy
from specdec_core.loading import ModelRefused, resolve_device, resolve_dtype
from specdec_core.plan import batch_refusal, compiles
from specdec_core.processing import SamplingSettings
from specdec_core.rounds import setup_seconds
from specdec_core.self_check import verify_disagreement
from specdec_core.text import GeneratorSpec, PromptError, TextGenerator, load_model_drafter
from transforms.durable import match
from transforms.prompts import table_rows

_LOG = logging.getLogger("pipeline.tune")
# Fixed gammas tried at each batch size besides the batch-1 choice: the best gamma falls as B grows
# (docs/batching.md), and the batch rule's prediction can miss the few % between these and none.
BATCH_GAMMAS = (2, 1)


# --------------------------------------------------------------------------------------------
# The sample


def read_sample(pattern: str, column: str, n: int, encode) -> tuple[list[list[int]], int, dict[str, int]]:
    """(prompt ids of the first n usable rows of distinct prompts, rows in the whole input, rows
    skipped by error type: unusable, or DuplicatePrompt for a prompt already in the sample, which
    measures nothing new and weights one prompt twice). Row counts come from each file's Parquet
    footer: nothing else is read past the sample."""
    files = match([pattern])
    ids: list[list[int]] = []
    skipped: dict[str, int] = {}
    seen: set[tuple[int, ...]] = set()  # (prompts as encoded: the same text from another row or id is a duplicate)
    rows = 0
    for path in files:
        with FileSystems.open(path) as f:
            pf = pq.ParquetFile(f)
            rows += pf.metadata.num_rows
            if len(ids) >= n:
                continue
            for batch in pf.iter_batches(columns=[column], batch_size=max(n, 16)):
                for value in (row[column] for row in table_rows(pa.Table.from_batches([batch]), column)):
                    if len(ids) >= n:
                        break
                    try:
                        prompt = encode(value)
                    except PromptError as e:
                        skipped[type(e).__name__] = skipped.get(type(e).__name__, 0) + 1
                        continue
                    if tuple(prompt) in seen:
                        skipped["DuplicatePrompt"] = skipped.get("DuplicatePrompt", 0) + 1
                        continue
                    seen.add(tuple(prompt))
                    ids.append(prompt)
                if len(ids) >= n:
                    break
    if not ids:
        why = ", ".join(f"{k} x{v}" for k, v in skipped.items()) or "no rows"
        raise TuneError(f"--input {pattern!r}: no usable prompt in column {column!r} ({why})")
    return ids, rows, skipped


# --------------------------------------------------------------------------------------------
# Measuring


class Progress:
    """Work done against work planned, in tokens to generate, with an ETA, on stderr (logging)."""

    def __init__(self, planned_tokens: int):
        self.planned = planned_tokens
        self.done = 0
        self.start = time.perf_counter()

    def add_plan(self, tokens: int) -> None:
        self.planned += tokens

    def step(self, label: str, tokens: int, seconds: float, off_clock: int = 0) -> None:
        """off_clock: tokens of planned work not in `tokens` and `seconds` (an adaptive engine's warm-up)."""
        self.done += tokens + off_clock
        elapsed = time.perf_counter() - self.start
        share = min(self.done / self.planned, 1.0) if self.planned else 1.0
        eta = elapsed * (1 - share) / share if share > 0 else float("nan")
        _LOG.info("%s: %d tokens in %.1f s (%.1f tok/s) | %.0f%% of the work, %.0f s elapsed, ETA %.0f s",
                  label, tokens, seconds, tokens / seconds if seconds > 0 else 0.0, 100 * share, elapsed, eta)


def _add(run: SampleRun, out) -> None:
    s = out.stats  # one-off graph captures and compiles left out: a job's worker pays them once
    run.new_tokens += s.new_tokens
    run.total_s += s.latency_s - s.setup_s
    run.decode_s += (s.latency_s - s.prefill_s) - (s.setup_s - s.prefill_setup_s)
    run.rounds += s.verify_steps
    run.drafted += s.draft_tokens
    run.accepted += s.accepted_tokens
    run.rejections += s.rejections
    run.drafts_per_round += s.drafts
    run.outputs.append(out.tokens)


def engine_options(args: argparse.Namespace, device: torch.device) -> dict:
    """The engines' `cuda_graphs` and `torch_compile`, from the job's flags as pipeline.run reads them."""
    return {"cuda_graphs": args.cuda_graphs, "torch_compile": compiles(args.torch_compile, args.cuda_graphs, device)}


def run_interleaved(target, drafters: list[Drafter], ids: list[list[int]], gammas: list[int], max_new: int,
                    sampling: SamplingSettings, policies: list[GammaPolicy | None] | None = None,
                    progress: Progress | None = None, engine: dict | None = None) -> list[SampleRun]:
    """One prompt at a time through the batch-1 engine (pipeline.run's --batch_size 1), every
    setting on each prompt before the next prompt, in alternating order: load that drifts on a
    shared machine then hits all settings alike, which a setting-after-setting order does not.
    engine: `engine_options`. Graph captures and compiles are left out of the times (`_add`)."""
    policies = policies or [None] * len(drafters)
    gens = [SpeculativeGenerator(target, d, num_speculative_tokens=max(g, 1), max_new_tokens=max_new,
                                 sampling=sampling, gamma_policy=p, **(engine or {}))
            for d, g, p in zip(drafters, gammas, policies, strict=True)]
    runs = [SampleRun(new_tokens=0, total_s=0.0, decode_s=0.0) for _ in gens]
    for seed, prompt in enumerate(ids):
        order = list(range(len(gens))) if seed % 2 == 0 else list(range(len(gens)))[::-1]
        t0, tokens = time.perf_counter(), sum(r.new_tokens for r in runs)
        outs = {}
        for i in order:
            outs[i] = gens[i].generate(prompt, seed)
        for i in range(len(gens)):  # outputs in prompt order, whatever the running order
            _add(runs[i], outs[i])
        if progress is not None:
            progress.step(f"prompt {seed + 1}/{len(ids)}, {len(gens)} settings",
                          sum(r.new_tokens for r in runs) - tokens, time.perf_counter() - t0)
    return runs


def run_batched(target, drafter: Drafter, ids: list[list[int]], gamma: int, batch: int, args,
                sampling: SamplingSettings, policy: GammaPolicy | None = None, engine: dict | None = None
                ) -> SampleRun:
    """All prompts through the continuous-batching engine, as pipeline.run's --batch_size B
    (engine: `engine_options`). Its graph captures and compiles (on a GPU) are left out of the
    time: a job's worker pays them once. So are, for the adaptive policy, the first WARM_WAVES x B
    prompts decoded first by the same engine (two waves, the second's rows entering as the first's end):
    a job's worker times its pass costs at its width, pools acceptance and times admitting rows
    together and apart once, and keeps them for all its later batches."""
    gen = BatchSpeculativeGenerator(target, drafter, batch_size=batch, num_speculative_tokens=max(gamma, 1),
                                    max_new_tokens=args.max_new_tokens, sampling=sampling, gamma_policy=policy,
                                    **(engine or {}))
    if isinstance(policy, AdaptiveGamma):
        gen.generate_many([(p, seed) for seed, p in enumerate(ids[: WARM_WAVES * batch])])
    t0, setup = time.perf_counter(), setup_seconds(*gen.slots.values())
    outs = gen.generate_many([(p, seed) for seed, p in enumerate(ids)])
    secs = time.perf_counter() - t0 - (setup_seconds(*gen.slots.values()) - setup)
    run = SampleRun(new_tokens=sum(len(o.tokens) for o in outs), total_s=secs, decode_s=secs)
    run.drafted = sum(o.stats.draft_tokens for o in outs)
    run.accepted = sum(o.stats.accepted_tokens for o in outs)
    run.rejections = sum(o.stats.rejections for o in outs)
    run.outputs = [o.tokens for o in outs]
    return run


def measure_costs(target, drafters: dict[str, Drafter], prompt: list[int], max_gamma: int,
                  rounds: int = 5, engine: dict | None = None) -> dict[str, Costs]:
    """c and v(k) per candidate, measured alternately (median of rounds) so that load changes on
    a shared machine hit every candidate alike; the first round warms the kernels up (and
    captures and compiles the passes: engine, `engine_options`)."""
    ks = tuple(range(2, max_gamma + 2))
    engines = {name: SpeculativeGenerator(target, d, num_speculative_tokens=max_gamma, max_new_tokens=1,
                                          **(engine or {}))
               for name, d in drafters.items()}
    got: dict[str, list[Costs]] = {name: [] for name in engines}
    for r in range(rounds + 1):
        for name, eng in engines.items():
            costs = eng.measure_costs(prompt, ks=ks, reps=1)
            if r:
                got[name].append(costs)
    return {name: Costs(c=statistics.median(x.c for x in cs),
                        v={k: statistics.median(x.v[k] for x in cs) for k in ks}) for name, cs in got.items()}


@dataclass
class Setting:
    """One thing tune runs: a candidate at a gamma (and policy) and batch size, and its result."""

    candidate: Candidate
    gamma: int
    policy: str = "fixed"
    batch_size: int = 1
    run: SampleRun | None = None
    measured: float | None = None  # decode speed-up over the target alone (batch 1)
    fitted: bool = False  # the overhead term was fitted on this very run

    def row(self, max_gamma: int, reference: list[list[int]] | None) -> dict:
        c = self.candidate
        pred = {p["gamma"]: p for p in c.predictions(max_gamma)}.get(self.gamma) if self.policy == "fixed" else None
        run = self.run
        equal = None
        if reference is not None and run is not None:
            equal = sum(a == b for a, b in zip(run.outputs, reference, strict=True))
        return {
            "candidate": c.name, "drafter": c.drafter, "draft_model": c.draft_model,
            "gamma": self.gamma if c.drafter != "none" else None, "gamma_policy": self.policy,
            "batch_size": self.batch_size,
            "a": c.a, "c": c.costs.c if c.costs and c.drafter != "none" else None,
            "a_this_run": run.acceptance if run else None,
            "predicted": pred["predicted"] if pred else (1.0 if c.drafter == "none" else None),
            "predicted_with_overhead": pred["predicted_with_overhead"] if pred else (1.0 if c.drafter == "none"
                                                                                     else None),
            "overhead_fitted_here": self.fitted,
            "measured": self.measured,
            "tokens_per_s": run.tokens_per_s if run else None,
            "new_tokens": run.new_tokens if run else None,
            "drafted_tokens": run.drafted if run else None,
            "seconds": run.total_s if run else None,
            "equal_to_target": equal,
        }


def _label(s: Setting) -> str:
    c = s.candidate
    if c.drafter == "none":
        return f"{c.name} B={s.batch_size}"
    g = f"adaptive<={s.gamma}" if s.policy == "adaptive" else f"gamma {s.gamma}"
    return f"{c.name} {g} B={s.batch_size}"


# --------------------------------------------------------------------------------------------
# The run


def _draft_name(path: str, paths: list[str]) -> str:
    """A short table name: the directory's base name, with its position when two share one."""
    base = path.rstrip("/").rsplit("/", 1)[-1] or path
    if sum(p.rstrip("/").rsplit("/", 1)[-1] == base for p in paths) > 1:
        base = f"{paths.index(path) + 1}:{base}"
    return f"draft {base}"


def load(args) -> tuple[TextGenerator, dict[str, Drafter], list[Candidate]]:
    """The target as pipeline.run loads it (TextGenerator: tokenizer, chat template, prepacked
    kernels) and each candidate draft, checked against it as the job would."""
    spec = GeneratorSpec(target_model=args.target_model, tokenizer=args.tokenizer, drafter="none",
                         max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, device=args.device, dtype=args.dtype, cpu_kernels=args.cpu_kernels,
                         chat_template=args.chat_template, system_prompt=args.system_prompt,
                         trust_remote_code=args.trust_remote_code, cuda_graphs=args.cuda_graphs,
                         torch_compile=args.torch_compile)
    try:
        text = TextGenerator.load(spec)
    except ModelRefused as e:
        raise TuneError(f"--target_model {args.target_model!r}: {e}") from e
    target = text.engine.target
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    engine = engine_options(args, target.device)
    drafters: dict[str, Drafter] = {}
    candidates = [Candidate("target alone", "none")]
    for path in args.draft_model:
        try:
            drafter = load_model_drafter(path, target, text.tokenizer, device=device, dtype=dtype,
                                         draft_dtype=args.draft_dtype, sampled=args.temperature > 0,
                                         cpu_kernels=args.cpu_kernels,
                                         trust_remote_code=args.trust_remote_code, **engine)
        except ValueError as e:
            raise TuneError(f"--draft_model {path!r}: {e}") from e
        name = _draft_name(path, args.draft_model)
        drafters[name] = drafter
        candidates.append(Candidate(name, "model", path))
    if not args.no_ngram:
        drafters["n-gram lookup"] = NgramDrafter(args.ngram_max_size, args.ngram_min_size)
        candidates.append(Candidate("n-gram lookup", "ngram"))
    return text, drafters, candidates


class Tuner:
    """The measuring session: the loaded pair, the sample, and the work done so far."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.text, self.drafters, self.candidates = load(args)
        self.target = self.text.engine.target
        if self.drafters and (why := verify_disagreement(self.target)):
            raise TuneError(f"--target_model {args.target_model}: {type(self.target).__name__} {why}: drafts cannot be "
                            "verified in one pass (pipeline.run --drafter none runs it alone)")
        self.engine = engine_options(args, self.target.device)
        self.sampling = SamplingSettings(args.temperature, args.top_k, args.top_p)
        self.ids, self.input_rows, self.skipped = read_sample(args.input, args.prompt_column, args.sample,
                                                              self.text.encode)
        self.n = len(self.ids)
        self.alone = self.candidates[0]
        self.per_run = self.n * args.max_new_tokens
        self.g0 = min(4, args.max_gamma)
        self.batches = [b for b in args.batch_sizes if 1 < b <= self.n]
        self.pad_id = pad_id_of(self.target)  # (what the batch engine pads with)
        why = batch_refusal(self.target, self.pad_id)
        self.why_no_batch = f"the target {why}: pipeline.run decodes it at --batch_size 1 only" if why else None
        if why:
            self.batches = []
        # Per B: the chosen setting, the same draft at the small gammas (at large B the cores are busy
        # and a rejected draft token costs a whole row of the verify pass) and the target alone.
        self.batch_plan = (2 + len(BATCH_GAMMAS)) * len(self.batches)
        self.progress = Progress(self.per_run * (1 + len(self.drafters) + 1 + args.verify
                                                 + (1 if self.sampling.greedy else 0) + self.batch_plan))
        _LOG.info("sample: %d prompts (%.0f tokens on average), %d rows in the input; %d candidate draft(s)",
                  self.n, statistics.fmean(len(x) for x in self.ids), self.input_rows, len(self.drafters))

    # -- pieces -----------------------------------------------------------------------------------

    def drafter_of(self, c: Candidate) -> Drafter:
        return NoDrafter() if c.drafter == "none" else self.drafters[c.name]

    @staticmethod
    def policy_of(s: Setting) -> GammaPolicy | None:
        """As the job builds it: batched, without batch-1 costs (the engine times its own at its width)."""
        if s.policy != "adaptive":
            return None
        return AdaptiveGamma(costs=s.candidate.costs if s.batch_size == 1 else None, max_gamma=s.gamma)

    def measure_costs(self) -> None:
        # Warm-up outside every clock: oneDNN builds kernels per shape on first use.
        run_interleaved(self.target, [NoDrafter(), *self.drafters.values()], self.ids[:1],
                        [self.g0] * (1 + len(self.drafters)), min(8, self.args.max_new_tokens), self.sampling,
                        engine=self.engine)
        prompt = sorted(self.ids, key=len)[self.n // 2]  # costs measured on the median-length prompt
        costs = measure_costs(self.target, self.drafters, prompt, self.args.max_gamma,
                              engine=self.engine) if self.drafters else {}
        for c in self.candidates:
            c.costs = costs.get(c.name)
        _LOG.info("costs measured: %s", "; ".join(f"{k}: c={c.c:.3f}" for k, c in costs.items()))

    def phase(self, settings: list[Setting]) -> float:
        """Batch 1, interleaved per prompt; settings[0] is the target alone, the yardstick of the
        others' measured speed-up. Returns its decode seconds per token."""
        runs = run_interleaved(self.target, [self.drafter_of(x.candidate) for x in settings], self.ids,
                               [x.gamma for x in settings], self.args.max_new_tokens, self.sampling,
                               [self.policy_of(x) for x in settings], self.progress, self.engine)
        for x, r in zip(settings, runs, strict=True):
            x.run = r
        base = settings[0].run.decode_s_per_token
        for x in settings:
            x.measured = base / x.run.decode_s_per_token
        return base

    def batched(self, x: Setting) -> Setting:
        x.run = run_batched(self.target, self.drafter_of(x.candidate), self.ids, x.gamma, x.batch_size, self.args,
                            self.sampling, self.policy_of(x), self.engine)
        self.progress.step(_label(x), x.run.new_tokens, x.run.total_s, self.warm_tokens(x))
        return x

    def warm_tokens(self, x: Setting) -> int:
        """The tokens an adaptive engine decodes off the clock before its run (`run_batched`), at most."""
        return min(WARM_WAVES * x.batch_size, self.n) * self.args.max_new_tokens if x.policy == "adaptive" else 0

    # -- the steps --------------------------------------------------------------------------------

    def batch1(self) -> tuple[list[Setting], list[Setting]]:
        """Phase 1: every candidate at one gamma next to the target alone, for its acceptance (and
        the overhead term, fitted on this run). Phase 2: the best predicted settings not run yet
        and, for greedy jobs, the engine's adaptive policy (gamma up to --max_gamma) with phase 1's
        fastest drafter, again next to the target alone. Returns (target-alone runs, the others)."""
        args = self.args
        base1, first = Setting(self.alone, 0), [Setting(c, self.g0) for c in self.candidates[1:]]
        base_s = self.phase([base1, *first])
        for x in first:
            c = x.candidate
            c.a, c.coverage = x.run.acceptance, x.run.coverage
            if c.a is None:  # nothing was ever proposed (e.g. lookup on text that never repeats)
                c.a = 0.0
            # A round cannot cost less than its model passes: a negative fit is noise, not a saving.
            c.overhead = max(0.0, fit_overhead(c.costs, x.run.drafts_per_round, x.run.decode_s, base_s))
            x.fitted = True
        done = {(x.candidate.name, x.gamma) for x in first}
        second = [Setting(c, g) for c, g in pick_to_verify(self.candidates, args.max_gamma, done, args.verify)]
        lead = max(first, key=lambda x: x.measured, default=None)
        if self.sampling.greedy and lead is not None and lead.measured > 1.0:
            second.append(Setting(lead.candidate, args.max_gamma, "adaptive"))
        planned = 1 + args.verify + self.sampling.greedy
        self.progress.add_plan(self.per_run * ((len(second) + 1 if second else 0) - planned))
        if not second:
            return [base1], first
        base2 = Setting(self.alone, 0)
        self.phase([base2, *second])
        return [base1, base2], [*first, *second]

    def throughput(self, chosen: Setting | None, reference) -> list[dict]:
        """The chosen batch-1 setting, the same draft at each fixed gamma of `BATCH_GAMMAS` (up to
        --max_gamma), and the target alone at each batch size, order alternating."""
        if chosen is not None and chosen.candidate.drafter == "model":
            drafter = self.drafters[chosen.candidate.name]
            # (a draft with another tokenizer drafts row by row, its model never in a padded batch)
            # (pipeline.run refuses an int8 draft batched by its flag; the self-check would by its logits, mostly)
            why = None if isinstance(drafter, CrossTokenizerDrafter) else (
                "is int8 (--draft_dtype int8: dynamic quantization scales a pass's rows together)"
                if self.args.draft_dtype == "int8" else batch_refusal(drafter.model, self.pad_id))
            if why and self.batches:
                why += ": pipeline.run decodes it at --batch_size 1 only"
                self.why_no_batch = f"the draft {why}"
                self.batches = []
        def settings(b: int) -> list[Setting]:
            out = [Setting(self.alone, 0, batch_size=b)]
            if chosen is not None:
                small = [g for g in BATCH_GAMMAS if g <= self.args.max_gamma
                         and (g, "fixed") != (chosen.gamma, chosen.policy)]
                out[:0] = [Setting(chosen.candidate, chosen.gamma, chosen.policy, b),
                           *(Setting(chosen.candidate, g, "fixed", b) for g in small)]
            return out

        self.progress.add_plan(self.per_run * (len(settings(1)) * len(self.batches) - self.batch_plan)
                               + sum(self.warm_tokens(x) for b in self.batches for x in settings(b)))
        rows = []
        for i, b in enumerate(self.batches):
            group = settings(b)
            for x in group if i % 2 == 0 else group[::-1]:
                self.batched(x)
            rows += [x.row(self.args.max_gamma, reference) for x in group]
        return rows


def tune(args: argparse.Namespace) -> dict:
    """Measure, predict, verify, recommend: the whole of `pipeline.tune` but the printing."""
    t_start = time.perf_counter()
    t = Tuner(args)
    t.measure_costs()
    base_runs, single = t.batch1()
    reference = base_runs[0].run.outputs if t.sampling.greedy else None
    base_row = {**base_runs[0].row(args.max_gamma, reference), "measured": 1.0,
                "tokens_per_s": sum(b.run.new_tokens for b in base_runs) / sum(b.run.total_s for b in base_runs),
                "seconds": statistics.fmean(b.run.total_s for b in base_runs)}
    rows = [base_row] + [x.row(args.max_gamma, reference) for x in single]
    settings: list[Setting | None] = [None, *single]  # index-aligned with rows; None = the target alone
    best = best_setting(rows, "measured")
    chosen = settings[next(i for i, r in enumerate(rows) if r is best)]
    tput = ([best] if chosen is not None else []) + [base_row] + t.throughput(chosen, reference)
    final = best_setting(tput, "tokens_per_s")

    recommended = {
        "drafter": final["drafter"], "draft_model": final["draft_model"],
        "num_speculative_tokens": final["gamma"], "gamma_policy": final["gamma_policy"] if final["gamma"] else None,
        "batch_size": final["batch_size"],
        "tokens_per_s": final["tokens_per_s"],
        "speedup_batch1": best["measured"] if final["drafter"] != "none" else 1.0,
    }
    argv = run_argv(args, final["drafter"], final["draft_model"], final["gamma"] or 1, final["gamma_policy"],
                    final["batch_size"])
    recommended["flags"] = f"python -m pipeline.run {shlex.join(argv)}"
    recommended["reason"] = _reason(final, best, tput, base_row)

    def estimate(row: dict) -> float:
        return t.input_rows * row["seconds"] / t.n

    errors = [{"candidate": x.candidate.name, "gamma": x.gamma, "measured": x.measured,
               "predicted": r["predicted"], "error": relative_error(r["predicted"], x.measured),
               "predicted_with_overhead": r["predicted_with_overhead"],
               "error_with_overhead": relative_error(r["predicted_with_overhead"], x.measured),
               "overhead_fitted_here": x.fitted}
              for x in single if x.policy == "fixed" for r in [x.row(args.max_gamma, reference)]]
    first_costs = next((c.costs for c in t.candidates if c.costs), None)
    return {
        "settings": {"input": args.input, "target_model": args.target_model, "draft_models": args.draft_model,
                     "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k,
                     "top_p": args.top_p, "greedy": t.sampling.greedy, "max_gamma": args.max_gamma,
                     "threads": torch.get_num_threads(), "device": str(t.target.device),
                     "cuda_graphs": args.cuda_graphs, "compiled": t.engine["torch_compile"]},
        "sample": {"prompts": t.n, "input_rows": t.input_rows, "skipped": t.skipped,
                   "mean_prompt_tokens": statistics.fmean(len(x) for x in t.ids)},
        "target_v": first_costs.v if first_costs else {},
        "candidates": [{"name": c.name, "drafter": c.drafter, "draft_model": c.draft_model, "a": c.a,
                        "c": c.costs.c if c.costs else None, "v": c.costs.v if c.costs else None,
                        "coverage": c.coverage, "overhead": c.overhead,
                        "predictions": c.predictions(args.max_gamma)} for c in t.candidates[1:]],
        "runs": rows,
        "throughput": tput,
        "batching": t.why_no_batch or _no_batch(t.batches, t.n),
        "prediction_error": errors,
        "recommended": recommended,
        "job_estimate": {"rows": t.input_rows, "seconds": estimate(final),
                         "seconds_target_alone_batch1": estimate(base_row)},
        "tune_seconds": time.perf_counter() - t_start,
    }


def _no_batch(batches: list[int], n: int) -> str | None:
    """Why no batch size was measured where the settings left none, or None."""
    if batches:
        return None
    if n < 2:
        return "a sample of one prompt batches nothing"
    return f"--batch_sizes has no size in 2..{n} ({n} usable prompts in the sample)"


def _reason(final: dict, best: dict, tput: list[dict], base_row: dict) -> str:
    """Why the recommendation is what it is, in one line, with the numbers that decided it."""
    alone = max((r for r in tput if r["drafter"] == "none"), key=lambda r: r["tokens_per_s"])
    spec = [r for r in tput if r["drafter"] != "none"]
    if best["drafter"] == "none":
        return f"no candidate drafter beat the target alone by at least {PAY_MARGIN - 1:.0%} at batch 1 on this machine"
    top = max(spec, key=lambda r: r["tokens_per_s"])
    if final["drafter"] == "none":
        relation = "beats" if alone["tokens_per_s"] >= top["tokens_per_s"] else f"is within {PAY_MARGIN - 1:.0%} of"
        return (f"the target alone batched (B={alone['batch_size']}, {alone['tokens_per_s']:.1f} tokens/s per "
                f"worker) {relation} the best speculative setting ({top['candidate']}, B={top['batch_size']}, "
                f"{top['tokens_per_s']:.1f} tokens/s): batching spends the spare compute speculation needs")
    against = f"{base_row['tokens_per_s']:.1f} for the target alone at batch 1"
    if alone["batch_size"] > 1:
        against += f" and {alone['tokens_per_s']:.1f} at its best batch size (B={alone['batch_size']})"
    return f"the fastest measured setting: {final['tokens_per_s']:.1f} tokens/s per worker, against {against}"


def write_json(path: str, res: dict) -> None:
    with FileSystems.create(path) as f:
        f.write(json.dumps(res, indent=2, default=str).encode())


@keeps_torch_threads
def main(argv: list[str] | None = None) -> int:
    setup_logging()
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        check_settings(args)
        res = tune(args)
    except TuneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_report(res))
    if args.output_json:
        write_json(args.output_json, res)
        _LOG.info("wrote %s", args.output_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
