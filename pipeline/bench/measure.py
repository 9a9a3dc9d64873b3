"""How `pipeline.bench` measures: forward hooks that time each model call, one timed run of a
configuration, step costs (c, v(k)) measured interleaved, the configurations run interleaved
per prompt with the greedy identity check, the Beam job against the bare loop, and v(k)
under several CPU settings."""

from __future__ import annotations

import copy
import logging
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pipeline.bench.configs import Config
from specdec_core.cpu_speed import prepare_for_cpu
from specdec_core.drafters import NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.gamma import Costs

_LOG = logging.getLogger("pipeline.bench")


class ForwardMeter:
    """Counts and times a model's top-level forward calls (hooks; microseconds of cost)."""

    def __init__(self, *models: torch.nn.Module):
        self.calls: list[tuple[float, int]] = []  # (seconds, input tokens)
        self._t0 = 0.0
        self._handles = []
        for m in models:
            self._handles.append(m.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._handles.append(m.register_forward_hook(self._post, with_kwargs=True))

    def _pre(self, module, args, kwargs):
        self._t0 = time.perf_counter()
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._n = int(ids.shape[-1]) if ids is not None else 0

    def _post(self, module, args, kwargs, out):
        self.calls.append((time.perf_counter() - self._t0, self._n))

    def reset(self) -> None:
        self.calls = []

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


@dataclass
class Run:
    tokens: list[int]
    latency: float
    cpu: float
    stats: dict = field(default_factory=dict)


def timed_run(cfg: Config, ids: list[int], meter: ForwardMeter, draft_meter: ForwardMeter | None) -> Run:
    meter.reset()
    if draft_meter:
        draft_meter.reset()
    c0, t0 = time.process_time(), time.perf_counter()
    tokens, st = cfg.fn(ids)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    tcalls = list(meter.calls)
    dcalls = list(draft_meter.calls) if draft_meter else []
    prefill = tcalls[0][0] if tcalls else 0.0
    st.update({
        "target_calls": len(tcalls), "target_fwd_s": sum(t for t, _ in tcalls[1:]), "prefill_s": prefill,
        "draft_calls": len(dcalls), "draft_fwd_s": sum(t for t, _ in dcalls),
    })
    st.setdefault("rounds", max(len(tcalls) - 1, 0))
    if cfg.family == "hf" and cfg.drafter != "none":
        # HF's assisted loop has no separate prefill: its first target call scores the prompt
        # AND the first round's candidates. Every call is a round; the bare prompt pass is
        # taken from the target-alone runs of the same prompt (see summarize).
        st["rounds"] = len(tcalls)
        st["prefill_s"] = float("nan")
        st["accepted"] = max(len(tokens) - st["rounds"], 0)
        if cfg.drafter == "model":
            st["drafted"] = len(dcalls)
    return Run(tokens, wall, cpu, st)


def measure_costs_interleaved(engines: dict[str, SpeculativeGenerator], ids: list[int], ks: tuple[int, ...],
                              rounds: int) -> dict[str, Costs]:
    """Costs per engine, measured alternately so that load drift hits all equally (median of rounds)."""
    got: dict[str, list[Costs]] = {n: [] for n in engines}
    for eng in engines.values():  # warm-up: oneDNN builds a kernel per input shape on first use
        eng.measure_costs(ids, ks=ks, reps=1)
    for _ in range(rounds):
        for name, eng in engines.items():
            got[name].append(eng.measure_costs(ids, ks=ks, reps=1))
    out = {}
    for name, cs in got.items():
        out[name] = Costs(c=statistics.median(c.c for c in cs),
                          v={k: statistics.median(c.v[k] for c in cs) for k in ks})
    return out


def target_step_ms(model, ids: list[int], reps: int = 3) -> float:
    from specdec_core.batch_kv import feed_to, one_row

    dec = one_row(model, ids)
    feed_to(dec, ids[:-1], 0)
    ts = []
    for _ in range(reps):
        dec.rollback(0, len(ids) - 1)
        t0 = time.perf_counter()
        feed_to(dec, ids, 1)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


@torch.inference_mode()
def top2_gap(target, seq: list[int]) -> float:
    """The target's top-2 logit gap (full recompute, stock kernels) where two outputs first
    differ: ~1e-5 means a floating-point near-tie between kernels, not a logic error."""
    top = target(torch.tensor([seq])).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


def _fmt_v(costs: Costs) -> str:
    return " ".join(f"{k}:{v:.2f}" for k, v in sorted(costs.v.items()))


def run_interleaved(label: str, configs: list[Config], prompts: list[tuple[str, str]], ids_list: list[list[int]],
                    target: torch.nn.Module, reference: str | None = "ours: target alone") -> list[dict]:
    """Every configuration on every prompt, the order rotating per prompt (no configuration always
    first), after one warm-up call each; one row per (configuration, prompt). Each row's `equal`
    says whether its tokens are the `reference` configuration's on that prompt; where not, the
    position of the first difference and the target's top-2 logit gap there. Without a
    reference (sampled runs: random draws), `equal` is None."""
    meters: dict[int, ForwardMeter] = {}
    for m in {id(x): x for c in configs for x in (c.target, c.draft) if x is not None}.values():
        meters[id(m)] = ForwardMeter(m)

    # Warm-up (first calls allocate, and oneDNN builds its kernels), then interleaved runs.
    for c in configs:
        c.fn(ids_list[0][:8] if len(ids_list[0]) > 8 else ids_list[0])

    rows = []
    for pi, ((kind, _text), ids) in enumerate(zip(prompts, ids_list, strict=True)):
        order = configs[pi % len(configs):] + configs[: pi % len(configs)]  # rotate: no config always first
        runs: dict[str, Run] = {}
        for c in order:
            la = os.getloadavg()[0]
            r = timed_run(c, ids, meters[id(c.target)], meters[id(c.draft)] if c.draft is not None else None)
            runs[c.name] = r
            rows.append({"pair": label, "config": c.name, "family": c.family, "kernels": c.kernels,
                         "drafter": c.drafter, "gamma": c.gamma, "prompt": pi, "prompt_kind": kind,
                         "prompt_tokens": len(ids), "new_tokens": len(r.tokens), "latency_s": r.latency,
                         "cpu_s": r.cpu, "cpu_util": r.cpu / r.latency, "load1": la, **r.stats})
        ref = runs[reference].tokens if reference else None
        for row in rows[-len(configs):]:
            row["equal"] = None if ref is None else runs[row["config"]].tokens == ref
            if row["equal"] is False:
                at = next((i for i, (a, b) in enumerate(zip(runs[row["config"]].tokens, ref, strict=False))
                           if a != b), min(len(ref), len(runs[row["config"]].tokens)))
                row["diverge_at"] = at
                row["tie_gap"] = top2_gap(target, ids + ref[:at])
        _LOG.info("[%s] prompt %d/%d (%s) done; load %.2f", label, pi + 1, len(prompts), kind, os.getloadavg()[0])

    for m in meters.values():
        m.remove()
    return rows


def beam_overhead(target_dir: Path, draft_dir: Path, prompts: list[tuple[str, str]], args) -> dict:
    """The Beam job's cost over the bare engine on the same prompts, in a temporary folder removed after."""
    with tempfile.TemporaryDirectory(prefix="specdec-bench-beam-") as tmp:  # (the job's outputs go with it)
        return _beam_overhead(Path(tmp), target_dir, draft_dir, prompts, args)


def _beam_overhead(work: Path, target_dir: Path, draft_dir: Path, prompts: list[tuple[str, str]], args) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from specdec_core.loading import item_seed
    from specdec_core.text import GeneratorSpec, TextGenerator

    ids = [f"p{i:03d}" for i in range(len(prompts))]
    pq.write_table(pa.table({"id": ids, "prompt": [t for _, t in prompts]}), work / "prompts.parquet")
    spec = GeneratorSpec(target_model=str(target_dir), draft_model=str(draft_dir), drafter="model",
                         num_speculative_tokens=args.gamma, max_new_tokens=args.max_new_tokens, device="cpu")

    def bare() -> tuple[float, float, list]:
        t0 = time.perf_counter()
        gen = TextGenerator.load(spec)
        load = time.perf_counter() - t0
        outs = [gen.generate(p, item_seed(0, i)) for i, (_, p) in zip(ids, prompts, strict=True)]
        return time.perf_counter() - t0, load, outs

    def job() -> tuple[float, list]:
        from pipeline.run import main

        out = work / f"out-{time.monotonic_ns()}"
        argv = ["--input", str(work / "prompts.parquet"), "--output", str(out), "--target_model", str(target_dir),
                "--draft_model", str(draft_dir), "--drafter", "model", "--num_speculative_tokens", str(args.gamma),
                "--max_new_tokens", str(args.max_new_tokens), "--device", "cpu"]
        t0 = time.perf_counter()
        rc = main(argv)
        wall = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"Beam job failed with exit code {rc}")
        table = pq.read_table([str(p) for p in sorted(work.glob(out.name + "-0*.parquet"))])
        return wall, table.to_pylist()

    la0 = os.getloadavg()[0]
    c0 = time.process_time()
    results = {"bare": [], "job": []}
    for _ in range(args.beam_reps):
        results["bare"].append(bare())
        results["job"].append(job())
    bare_wall = statistics.median(x[0] for x in results["bare"])
    bare_load = statistics.median(x[1] for x in results["bare"])
    bare_gen = statistics.median(sum(o["latency_s"] for o in x[2]) for x in results["bare"])
    job_wall = statistics.median(x[0] for x in results["job"])
    job_gen = statistics.median(sum(r["latency_s"] for r in x[1]) for x in results["job"])
    bare_texts = {i: o["generation"] for i, o in zip(ids, results["bare"][0][2], strict=True)}
    job_texts = {r["id"]: r["generation"] for r in results["job"][0][1]}
    return {"prompts": len(prompts), "bare_wall": bare_wall, "bare_load": bare_load, "bare_gen": bare_gen,
            "job_wall": job_wall, "job_gen": job_gen, "overhead_frac": (job_wall - bare_wall) / job_wall,
            "same_outputs": bare_texts == job_texts, "reps": args.beam_reps,
            "load1": (la0 + os.getloadavg()[0]) / 2,
            "cpu_util": (time.process_time() - c0) / max(sum(x[0] for x in results["bare"]) + job_wall
                                                         * args.beam_reps, 1e-9)}


def kernel_experiments(target_dir: Path, ids: list[int], args) -> list[dict]:
    """v(k) and the 1-token step under several CPU settings, interleaved, same process."""
    from transformers import AutoModelForCausalLM

    stock = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    packed = prepare_for_cpu(copy.deepcopy(stock))
    packed_for_1 = prepare_for_cpu(copy.deepcopy(stock), pack_rows=1)
    packed_all = prepare_for_cpu(copy.deepcopy(stock), threshold_rows=1)
    ks = (2, 3, 4, 5, 9)
    engines = {"stock": stock, "prepacked for 8 rows, used at k>=4 (default)": packed,
               "prepacked for 1 row, used at k>=4": packed_for_1, "prepacked for 8 rows, used at all k": packed_all}
    threads_default = torch.get_num_threads()
    settings = [(name, nt) for nt in sorted({1, threads_default}) for name in engines]
    got: dict[tuple, list[tuple[float, Costs]]] = {s: [] for s in settings}
    for name, nt in settings:  # warm-up (oneDNN kernels are built per shape on first use)
        torch.set_num_threads(nt)
        SpeculativeGenerator(engines[name], NoDrafter(), num_speculative_tokens=max(ks) - 1).measure_costs(
            ids, ks=ks, reps=1)
    for _ in range(args.cost_rounds):
        for name, nt in settings:
            torch.set_num_threads(nt)
            eng = SpeculativeGenerator(engines[name], NoDrafter(), num_speculative_tokens=max(ks) - 1)
            t1 = target_step_ms(engines[name], ids, reps=2)
            got[(name, nt)].append((t1, eng.measure_costs(ids, ks=ks, reps=1)))
    torch.set_num_threads(threads_default)
    out = []
    for (name, nt), vals in got.items():
        out.append({"setting": f"{name}, {nt} thread{'s' if nt > 1 else ''}", "t1_ms": statistics.median(v[0]
                    for v in vals), **{f"v{k}": statistics.median(v[1].v[k] for v in vals) for k in ks}})
    return out
