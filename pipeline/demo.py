"""`python -m pipeline.demo`: the whole job, offline, on a draft/target pair made here.

Trains (once, then cached) a target and a draft on the Python standard library's sources,
writes held-out "continue this code" prompts, runs the Beam job twice over them
(speculative, and target alone with --drafter none), and prints what it measured.
"""

from __future__ import annotations

# demo_models sets OMP_WAIT_POLICY before torch is imported: keep this import first.
from pipeline.demo_models import DemoSetupError, ensure_demo_models, write_demo_prompts  # isort: skip

import argparse
import logging
import shutil
import sys
import time
from pathlib import Path

import torch

from pipeline import run
from pipeline.flags import ArgumentParser
from pipeline.logs import setup_logging
from pipeline.report import format_table, read_results, summarize

DEFAULT_WORKDIR = "specdec-demo"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default=DEFAULT_WORKDIR, help=f"where models, prompts and outputs go "
                   f"(default ./{DEFAULT_WORKDIR})")
    p.add_argument("--tiny", action="store_true", help="tiny models and few prompts: a smoke test in seconds")
    p.add_argument("--prompts", type=int, default=None, help="number of prompts (default 40; 6 with --tiny)")
    p.add_argument("--max_new_tokens", type=int, default=None,
                   help="default 128 (the models train on 256-token windows; prompts are <= 128); 16 with --tiny")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: these small models are bound by per-op overhead, and "
                   "OpenMP synchronisation across busy cores costs more than a second core gives)")
    p.add_argument("--num_speculative_tokens", type=int, default=4)
    return p.parse_args(argv)


def _run_job(name: str, workdir: Path, prompts: Path, target: Path, args, extra: list[str]) -> tuple[str, float]:
    out = workdir / "out" / name
    shutil.rmtree(out, ignore_errors=True)  # a fresh directory per run: no stale shards
    prefix = str(out / "gens")
    logging.getLogger(__name__).info("running the %s job on %s", name, prompts)
    start = time.perf_counter()
    rc = run.main(["--input", str(prompts), "--output", prefix, "--target_model", str(target),
                   "--max_new_tokens", str(args.max_new_tokens),
                   "--num_speculative_tokens", str(args.num_speculative_tokens), *extra])
    if rc:
        raise SystemExit(rc)
    return prefix, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.prompts = args.prompts or (6 if args.tiny else 40)
    args.max_new_tokens = args.max_new_tokens or (16 if args.tiny else 128)
    setup_logging()
    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir).expanduser()
    try:
        target, draft = ensure_demo_models(workdir, tiny=args.tiny)
        prompts = write_demo_prompts(workdir, args.prompts, target, tiny=args.tiny)
    except DemoSetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    spec_prefix, spec_wall = _run_job("speculative", workdir, prompts, target, args, ["--draft_model", str(draft)])
    base_prefix, base_wall = _run_job("baseline", workdir, prompts, target, args, ["--drafter", "none"])

    spec, spec_failed = read_results(spec_prefix)
    base, base_failed = read_results(base_prefix)
    s, b = summarize(spec, spec_failed), summarize(base, base_failed)
    gens = {name: dict(zip(t["id"].to_pylist(), t["generation"].to_pylist(), strict=True))
            for name, t in (("spec", spec), ("base", base))}
    same = sum(gens["spec"].get(k) == v for k, v in gens["base"].items())
    identical = same == len(gens["base"]) == len(gens["spec"])

    print()
    print(format_table({"speculative": s, "target alone": b}))
    print(f"{'speed-up (target-alone / speculative latency)':<46} {b.total_latency_s / s.total_latency_s:.2f}x"
          f"   (whole jobs, loading included: target alone {base_wall:.1f} s, speculative {spec_wall:.1f} s)")
    print(f"{'greedy outputs identical':<46} {'yes' if identical else 'NO'}: {same}/{len(gens['base'])} rows")
    print(f"files: {prompts}\n       {spec_prefix}-*.parquet\n       {base_prefix}-*.parquet\n"
          f"       models in {target.parent}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
