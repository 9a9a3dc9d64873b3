"""`python -m pipeline.demo`: a real translation job, offline, the same on every machine.

The job: translate short English lists with digits in (amounts of money, quantities with units,
dates, times) into German with every number written out in words. A narrow domain, chosen so that
a pair trained on a 2-core CPU gets it right; real jobs bring their own models. The references
come from `num2words` and Babel's CLDR data (`pipeline.demo.data`), and the prompts are
combinations the models never saw. The pair is a small decoder-only target and a draft cut from
its first layer, committed to the repository (``pipeline/demo/pair/``, checked by SHA-256 before
use; `pipeline.demo.recipes` holds the recipe, `models` trains it). The demo runs the Beam job three times over the same
prompts: with the model draft, with prompt lookup (`--drafter ngram`) and with the target alone,
then judges its own output: speed per drafter, chrF and exact matches against the references, and
whether every generation equals the target alone's. It exits 1 if one does not.
"""

from __future__ import annotations

# models sets OMP_WAIT_POLICY before torch is imported: keep this import first.
import pipeline.demo.models  # noqa: F401  # isort: skip

import argparse
import contextlib
import io
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
from pipeline.demo.assets import ASSETS, DemoSetupError, demo_prompt_rows, verify_assets
from pipeline.flags import ArgumentParser, positive_int
from pipeline.logs import setup_logging
from pipeline.quality import chrf, exact_match
from pipeline.report.stats import format_rows, summarize
from pipeline.report.summary import main as report_main
from pipeline.report.summary import read_results
from pipeline.threads import keeps_torch_threads

DEFAULT_WORKDIR = "specdec-demo"
JOBS = {  # name -> extra flags; the last one is the baseline every speed-up is measured against
    "model draft": ["--drafter", "model"],
    "prompt lookup": ["--drafter", "ngram"],
    "target alone": ["--drafter", "none"],
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m pipeline.demo", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default=DEFAULT_WORKDIR,
                   help=f"where prompts and outputs go (default ./{DEFAULT_WORKDIR})")
    p.add_argument("--pair", default=str(ASSETS), help="the demo pair's directory (default: the committed one)")
    p.add_argument("--tiny", action="store_true", help="4 prompts, 24 new tokens: a smoke test in seconds")
    p.add_argument("--prompts", type=positive_int, default=None,
                   help="number of prompts (default 40, at most the pair's)")
    p.add_argument("--max_new_tokens", type=positive_int, default=None,
                   help="default 160 (24 with --tiny); translations end at their end token before")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch threads (default 1: these small models are bound by per-op overhead)")
    p.add_argument("--num_speculative_tokens", type=positive_int, default=None,
                   help="gamma (default: the one the pair was measured at, in its manifest)")
    args = p.parse_args(argv)
    if not args.workdir.strip():  # (it wrote prompts.parquet and out/ into the working folder)
        p.error("--workdir '': names no folder: say --workdir DIR (default ./" + DEFAULT_WORKDIR + ")")
    return args


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
                   "--passthrough_columns", "reference", "--max_new_tokens", str(args.max_new_tokens),
                   "--num_speculative_tokens", str(args.num_speculative_tokens), *JOBS[name],
                   *(["--draft_model", str(draft)] if "model" in JOBS[name] else [])])  # (refused with ngram, none)
    if rc:
        raise SystemExit(rc)
    return prefix, time.perf_counter() - start


def _report_page(prefix: str, baseline: str) -> str:
    """The model-draft run's report page (`python -m pipeline.report PREFIX --html F`), beside its outputs."""
    page = str(Path(prefix).parent / "report.html")
    with contextlib.redirect_stdout(io.StringIO()):  # the table below says it all; the page has the rest
        report_main([prefix, "--baseline", baseline, "--html", page, "--references", "reference",
                     "--metric", "chrf"])
    return page


@keeps_torch_threads
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.max_new_tokens = args.max_new_tokens or (24 if args.tiny else 160)
    setup_logging()
    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir).expanduser()
    try:
        manifest = verify_assets(Path(args.pair))
        if not manifest.get("gate_passed"):
            raise DemoSetupError(f"{Path(args.pair)}: {manifest.get('gate_missed') or 'the pair has no gate result'}; "
                                 "the demo runs only a pair at its gate (docs/demo.md)")
        gamma = manifest["quality"].get("num_speculative_tokens", 4)  # the gamma the pair was measured at
        args.num_speculative_tokens = args.num_speculative_tokens or gamma
        target, draft = Path(args.pair) / "target", Path(args.pair) / "draft"
        rows = demo_prompt_rows(Path(args.pair))
        rows = rows[: args.prompts or (4 if args.tiny else 40)]
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

    columns, identical, exact = {}, {}, {}
    for name, (table, _) in tables.items():
        s = summaries[name]
        gens, refs = table["generation"].to_pylist(), table["reference"].to_pylist()
        gen = dict(zip(table["id"].to_pylist(), gens, strict=True))
        identical[name] = sum(gen.get(k) == v for k, v in base_gen.items())
        exact[name] = exact_match(gens, refs)
        speedup = summaries[base_name].total_latency_s / s.total_latency_s
        columns[name] = [*s.rows(),
                         ("chrF vs references", f"{chrf(gens, refs):.1f}"),
                         ("exact matches", f"{exact[name]:.0%}"),
                         ("speed-up vs target alone", f"{speedup:.2f}x"),
                         ("outputs identical to target alone", f"{identical[name]}/{len(base_gen)}"),
                         ("whole job, loading included", f"{runs[name][1]:.1f} s")]
    print()
    print(f"English with digits -> German with the numbers in words (greedy, {args.num_speculative_tokens} "
          "drafted tokens per round; prompts the models never saw)")
    print(format_rows(columns))

    by_id = {r["id"]: r for r in rows}
    # What is typical first: two outputs equal to their reference, then one that is not, labelled.
    right = [k for k, g in base_gen.items() if g == by_id[k]["reference"]]
    wrong = [k for k, g in base_gen.items() if g != by_id[k]["reference"]]
    print(f"\nexamples (target alone's output, which every drafter reproduces; {len(right)} of {len(base_gen)} "
          "equal their reference):")
    for row_id in right[:2] + wrong[:1]:
        r = by_id[row_id]
        print(f"  prompt:    {r['prompt']}")
        print(f"  reference: {r['reference']}")
        print(f"  generated: {base_gen[row_id]}" + ("  (= reference)" if row_id in right[:2]
                                                    else "  (an error: differs from the reference)"))
    same = all(n == len(base_gen) for n in identical.values())
    page = _report_page(runs["model draft"][0], runs[base_name][0])
    print(f"greedy outputs identical across drafters: {'yes' if same else 'NO'}")
    print(f"report page of the model-draft run: {page}")
    print(f"files: {prompts}\n" + "".join(f"       {p}-*.parquet\n" for p, _ in runs.values())
          + f"       pair in {Path(args.pair)}")
    return 0 if same else 1
