"""`python -m pipeline.demo`: a real summarization job, offline, the same on every machine.

The job: summarize Python functions into their docstrings (code-to-text summarization). The
prompts are documented functions from standard-library files the models never saw, with the
real docstring kept as a `reference` column. The pair is a T5 target and a T5 draft committed to
the repository (``pipeline/demo_pair/``, checked by SHA-256 before use; `pipeline.demo_models`
holds the recipe that made them). The demo runs the Beam job three times over the same prompts:
with the model draft, with prompt lookup (`--drafter ngram`) and with the target alone, then
judges its own output: speed per drafter, ROUGE against the references, degenerate outputs,
and whether every generation equals the target alone's.
"""

from __future__ import annotations

# demo_models sets OMP_WAIT_POLICY before torch is imported: keep this import first.
from pipeline.demo_models import (  # isort: skip
    ASSETS, DemoSetupError, QualityGate, demo_prompt_rows, name_baseline, verify_assets,
)

import argparse
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline import run
from pipeline.flags import ArgumentParser
from pipeline.logs import setup_logging
from pipeline.quality import score_generations
from pipeline.report.summary import read_results, summarize
from pipeline.report.stats import format_rows

DEFAULT_WORKDIR = "specdec-demo"
JOBS = {  # name -> extra flags; the last one is the baseline every speed-up is measured against
    "model draft": ["--drafter", "model"],
    "prompt lookup": ["--drafter", "ngram"],
    "target alone": ["--drafter", "none"],
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default=DEFAULT_WORKDIR,
                   help=f"where prompts and outputs go (default ./{DEFAULT_WORKDIR})")
    p.add_argument("--pair", default=str(ASSETS), help="the demo pair's directory (default: the committed one)")
    p.add_argument("--tiny", action="store_true", help="6 prompts, 16 new tokens: a smoke test in seconds")
    p.add_argument("--prompts", type=int, default=None, help="number of prompts (default 40, at most the pair's)")
    p.add_argument("--max_new_tokens", type=int, default=None, help="default 64 (16 with --tiny); summaries end "
                   "at their end token long before")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: these small models are bound by per-op overhead)")
    p.add_argument("--num_speculative_tokens", type=int, default=4)
    return p.parse_args(argv)


def _write_prompts(workdir: Path, rows: list[dict]) -> Path:
    dest = workdir / "prompts.parquet"
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        tmp = workdir / f".prompts.parquet.tmp-{os.getpid()}"
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        os.replace(tmp, dest)
    except OSError as e:
        raise DemoSetupError(f"cannot write {dest}: {e.strerror or e}") from None
    return dest


def _run_job(name: str, workdir: Path, prompts: Path, target: Path, draft: Path, args) -> tuple[str, float]:
    out = workdir / "out" / name.replace(" ", "_")
    shutil.rmtree(out, ignore_errors=True)  # a fresh directory per run: no stale shards
    prefix = str(out / "gens")
    logging.getLogger(__name__).info("running the job with %s on %s", name, prompts)
    start = time.perf_counter()
    rc = run.main(["--input", str(prompts), "--output", prefix, "--target_model", str(target),
                   "--draft_model", str(draft), "--passthrough_columns", "reference",
                   "--max_new_tokens", str(args.max_new_tokens),
                   "--num_speculative_tokens", str(args.num_speculative_tokens), *JOBS[name]])
    if rc:
        raise SystemExit(rc)
    return prefix, time.perf_counter() - start


def _quality_rows(q: dict[str, float]) -> list[tuple[str, str]]:
    return [("ROUGE-1 / 2 / L", f"{q['rouge1']:.3f} / {q['rouge2']:.3f} / {q['rougeL']:.3f}"),
            ("degenerate outputs", f"{q['degenerate_share']:.0%}"),
            ("distinct outputs", f"{q['distinct_share']:.0%}")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.max_new_tokens = args.max_new_tokens or (16 if args.tiny else 64)
    setup_logging()
    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir).expanduser()
    try:
        manifest = verify_assets(Path(args.pair))
        target, draft = Path(args.pair) / "target", Path(args.pair) / "draft"
        rows = demo_prompt_rows(Path(args.pair))
        rows = rows[: args.prompts or (6 if args.tiny else 40)]
        prompts = _write_prompts(workdir, rows)
    except DemoSetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    runs = {name: _run_job(name, workdir, prompts, target, draft, args) for name in JOBS}
    tables = {name: read_results(prefix) for name, (prefix, _) in runs.items()}
    base_name = list(JOBS)[-1]
    base = tables[base_name][0]
    base_gen = dict(zip(base["id"].to_pylist(), base["generation"].to_pylist(), strict=True))
    summaries = {name: summarize(*t) for name, t in tables.items()}

    quality = {name: score_generations(t["generation"].to_pylist(), t["reference"].to_pylist())
               for name, (t, _) in tables.items()}
    columns = {}
    identical = {}
    for name, (table, _) in tables.items():
        s = summaries[name]
        gen = dict(zip(table["id"].to_pylist(), table["generation"].to_pylist(), strict=True))
        identical[name] = sum(gen.get(k) == v for k, v in base_gen.items())
        speedup = summaries[base_name].total_latency_s / s.total_latency_s
        columns[name] = [*s.rows(), *_quality_rows(quality[name]),
                         ("speed-up vs target alone", f"{speedup:.2f}x"),
                         ("outputs identical to target alone", f"{identical[name]}/{len(base_gen)}"),
                         ("whole job, loading included", f"{runs[name][1]:.1f} s")]
    print()
    print("Summarizing Python functions into docstrings (greedy; held-out standard-library files)")
    print(format_rows(columns))

    print("\nexamples (target alone's output, which every drafter reproduces):")
    by_id = {r["id"]: r for r in rows}
    for row_id in list(base_gen)[:3]:
        r = by_id[row_id]
        print(f"  {r['function']}() in {r['source_file']}:{r['source_line']}")
        print(f"    reference: {r['reference']}")
        print(f"    generated: {base_gen[row_id]}")
    exact = all(n == len(base_gen) for n in identical.values())
    q, gate = quality[base_name], QualityGate()
    if q["degenerate_share"] > gate.max_degenerate_share or q["distinct_share"] < gate.min_distinct_share:
        print(f"WARNING: {q['degenerate_share']:.0%} of the generations are empty or repeat themselves and "
              f"{q['distinct_share']:.0%} are distinct: the pair is not fit to show speed on "
              "(rebuild it with `python -m pipeline.demo_models --retrain`)")
    print(f"\nfor scale: restating each function's name (\"Return the <name>.\") scores ROUGE-L "
          f"{name_baseline(rows):.3f}")
    if not manifest.get("gate_passed", True):
        print(f"NOTE: this pair was committed below its recipe's quality gate ({manifest['gate_missed']}). "
              "The figures above are real; README says where the pair falls short.")
    print(f"greedy outputs identical across drafters: {'yes' if exact else 'NO'}")
    print(f"files: {prompts}\n" + "".join(f"       {p}-*.parquet\n" for p, _ in runs.values())
          + f"       pair in {Path(args.pair)}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
