"""`python -m pipeline.tune`'s command line: its flags (the job's own and tune's), the job's command line for a
setting, and the job's own checks on every candidate before any measuring."""

from __future__ import annotations

import argparse
import os
import tempfile

from pipeline.flags import ArgumentParser, FlagError, check_pipeline_flags
from pipeline.options import none_or, spec_default
from specdec_core.cpu_speed import DRAFT_DTYPES
from specdec_core.plan import GRAPH_MODES
from specdec_core.text import CPU_KERNELS

PROG = "python -m pipeline.tune"
DESCRIPTION = "`python -m pipeline.tune`: choose the drafter, gamma and batch size before a large job."


class TuneError(ValueError):
    """A setting or input that stops tune before any measuring; the message is one line."""


def parse(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(prog=PROG, description=DESCRIPTION)
    a = p.add_argument
    # The job's own flags, as pipeline.run reads them.
    a("--input", required=True, help="the job's Parquet prompt files, local or gs://")
    a("--prompt_column", default="prompt")
    a("--target_model", required=True)
    a("--draft_model", action="append", default=[], help="a candidate draft (repeatable)")
    a("--tokenizer", default=None)
    a("--max_new_tokens", type=int, default=128)
    a("--temperature", type=float, default=0.0)
    a("--top_k", type=none_or(int), default=None)
    a("--top_p", type=none_or(float), default=None)
    a("--chat_template", action="store_true", default=False)
    a("--system_prompt", default=None)
    a("--ngram_max_size", type=int, default=spec_default("ngram_max_size"))
    a("--ngram_min_size", type=int, default=spec_default("ngram_min_size"))
    a("--device", default="auto")
    a("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    a("--cpu_kernels", default="prepacked", choices=CPU_KERNELS)
    a("--draft_dtype", default=spec_default("draft_dtype"), choices=DRAFT_DTYPES)
    a("--cuda_graphs", default="auto", choices=GRAPH_MODES)
    a("--torch_compile", nargs="?", const="on", default="auto", choices=GRAPH_MODES)
    a("--trust_remote_code", action="store_true", default=False)
    # Tune's own.
    a("--sample", type=int, default=8, help="prompts measured: the first N usable distinct prompts of --input")
    a("--max_gamma", type=int, default=8, help="largest gamma predicted and tried")
    a("--verify", type=int, default=3, help="best predicted settings run for real, besides each candidate's first")
    a("--batch_sizes", default="1,4,8,16", help="comma-separated batch sizes measured (capped by --sample)")
    a("--threads", type=int, default=None,
      help="torch threads while measuring (default: torch's own, as pipeline.run leaves it)")
    a("--no_ngram", action="store_true", default=False, help="leave prompt lookup out of the candidates")
    a("--output_json", default=None, help="write the results and the recommendation as JSON (local or gs://)")
    args = p.parse_args(argv)
    try:
        sizes = sorted({int(b) for b in args.batch_sizes.split(",") if b.strip()})
    except ValueError:
        sizes = []
    if not sizes:
        p.error(f"--batch_sizes {args.batch_sizes!r}: expected comma-separated integers")
    args.batch_sizes = sizes
    threads = 1 if args.threads is None else args.threads
    for flag, value, low in [("--sample", args.sample, 1), ("--threads", threads, 1),
                             ("--max_gamma", args.max_gamma, 1),
                             ("--verify", args.verify, 0), ("--max_new_tokens", args.max_new_tokens, 1),
                             ("--batch_sizes", min(args.batch_sizes), 1)]:
        if value < low:
            p.error(f"{flag} must be >= {low}, got {value}")
    args.target_model, args.draft_model = os.path.expanduser(args.target_model), [  # (`--x=~/m`: no shell expands it)
        os.path.expanduser(d) for d in args.draft_model]
    args.tokenizer = args.tokenizer and os.path.expanduser(args.tokenizer)
    if any(not d.strip() for d in args.draft_model):  # (an empty one was measured as no draft, then failed)
        p.error("--draft_model '': names no draft")
    if len(set(args.draft_model)) != len(args.draft_model):
        p.error("--draft_model: the same draft is given twice")
    return args


def run_argv(args: argparse.Namespace, drafter: str, draft_model: str | None, gamma: int, policy: str,
             batch_size: int, output: str = "OUTPUT_PREFIX") -> list[str]:
    """pipeline.run's command line for one setting: the job's flags as given to tune."""
    argv = ["--input", args.input, "--output", output, "--target_model", args.target_model]
    if args.tokenizer:
        argv += ["--tokenizer", args.tokenizer]
    if args.prompt_column != "prompt":
        argv += ["--prompt_column", args.prompt_column]
    argv += ["--drafter", drafter]
    if drafter == "model":
        argv += ["--draft_model", draft_model]
    if drafter != "none":
        argv += ["--num_speculative_tokens", str(gamma), "--gamma_policy", policy]
    if drafter == "ngram" and any(getattr(args, n) != spec_default(n) for n in ("ngram_max_size", "ngram_min_size")):
        argv += ["--ngram_max_size", str(args.ngram_max_size), "--ngram_min_size", str(args.ngram_min_size)]
    argv += ["--batch_size", str(batch_size), "--max_new_tokens", str(args.max_new_tokens)]
    if args.temperature:
        argv += ["--temperature", repr(args.temperature)]  # (as measured: :g kept 6 digits)
    for flag, value in (("--top_k", args.top_k), ("--top_p", args.top_p)):
        if value is not None:
            argv += [flag, repr(value)]
    if args.chat_template:
        argv.append("--chat_template")
    if args.system_prompt is not None:
        argv += ["--system_prompt", args.system_prompt]
    for flag, value, default in (("--device", args.device, "auto"), ("--dtype", args.dtype, "auto"),
                                 ("--cpu_kernels", args.cpu_kernels, "prepacked"),
                                 ("--draft_dtype", args.draft_dtype if drafter == "model" else "auto", "auto"),
                                 ("--cuda_graphs", args.cuda_graphs, "auto"),
                                 ("--torch_compile", args.torch_compile, "auto")):
        if value != default:
            argv += [flag, value]
    if args.trust_remote_code:
        argv.append("--trust_remote_code")
    return argv


def check_settings(args: argparse.Namespace) -> None:
    """pipeline.run's own checks (preflight) on the job each candidate would run, so a setting
    the job would refuse stops tune too, with the same line."""
    from pipeline.paths import writable_file
    from pipeline.preflight import JobConfigError, preflight
    from pipeline.run import parse_options

    candidates = [("model" if draft else "none", draft) for draft in args.draft_model or [None]]
    if not args.no_ngram:
        candidates.append(("ngram", None))
    if args.output_json is not None:  # (not after the measuring; `--output_json=~/x` reaches us unexpanded)
        try:
            args.output_json = writable_file("--output_json", args.output_json)
        except JobConfigError as e:
            raise TuneError(str(e)) from e
    with tempfile.TemporaryDirectory() as tmp:  # an output prefix that holds no files
        for drafter, draft in candidates:
            argv = run_argv(args, drafter, draft, 4, "fixed", 1, output=f"{tmp}/out")
            try:
                check_pipeline_flags(argv)
                preflight(parse_options(argv))
            except (FlagError, JobConfigError) as e:
                raise TuneError(str(e)) from e
