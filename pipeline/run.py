"""`python -m pipeline.run`: Parquet prompts -> speculative decoding -> Parquet results."""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import StandardOptions

from pipeline.flags import FlagError, check_pipeline_flags
from pipeline.logs import setup_logging
from pipeline.options import SpecDecOptions
from pipeline.preflight import JobConfigError, damaged_inputs, is_dry_run, preflight
from pipeline.provenance import placement_record, run_record, with_provenance
from specdec_core.loading import ModelRefused
from transforms.durable import (
    ASIDE,
    CommitChunks,
    CommitRows,
    absolute,
    beam_temp_dirs,
    delete_dirs,
    output_files,
    put_back,
    set_aside,
)
from transforms.generate import GenerateRows
from transforms.ids import SelectRows
from transforms.model_handler import SpecDecModelHandler
from transforms.prompts import ReadPrompts
from transforms.results import WriteResults
from transforms.schema import failed_schema, result_schema

log = logging.getLogger(__name__)  # (the root logger stays at WARNING: `setup_logging`)

# The plain DirectRunner first tries to download a Prism binary (impossible offline); the
# FnApiRunner is what it falls back to for batch jobs, so we go there directly.
LOCAL_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"


def build_pipeline(p: beam.Pipeline, opts: SpecDecOptions, schema: pa.Schema) -> None:
    """The job graph. Touches neither the input nor the models: those are read by workers."""
    passthrough = opts.passthrough()
    handler = SpecDecModelHandler(opts.generator_spec(), opts.prompt_column, large_model=opts.large_model)
    columns = list(dict.fromkeys([opts.id_column, opts.prompt_column, *passthrough]))
    rows = p | "ReadPrompts" >> ReadPrompts(opts.input, columns, opts.prompt_column)
    rows, early = rows | "SelectIds" >> SelectRows(opts.id_column, opts.prompt_column, opts.resume_prefixes())
    results, *failed = rows | "Generate" >> GenerateRows(
        handler,
        id_column=opts.id_column,
        prompt_column=opts.prompt_column,
        passthrough=passthrough,
        seed=opts.seed,
        accelerator=opts.accelerator,
    )
    record = run_record(opts)
    schemas = (with_provenance(result_schema(schema, opts.id_column, passthrough), record),
               with_provenance(failed_schema(schema, opts.id_column), record))
    # Durable as they finish, each kind of row in the step that finds it (a Flatten first would put
    # the commit in a stage of its own, after generation): generated and failed rows in the model's
    # environment (CommitRows says why); rows failed before any generation, a row whose id is not
    # valid UTF-8 as the input is read, duplicates and other rows not valid UTF-8 as ids are grouped.
    results, *failed = (results, *failed) | "Commit" >> CommitRows(
        opts.output, *schemas, opts.commit_every_s, accelerator=opts.accelerator)
    early = [rows | f"Commit{kind}" >> beam.ParDo(
        CommitChunks(f"{opts.output}-failed-chunk", schemas[1], opts.commit_every_s))
        for kind, rows in early.items()]
    failed = (*failed, *early) | "AllFailed" >> beam.Flatten()
    _ = (results, failed) | "Write" >> WriteResults(opts.output, *schemas)


def parse_options(argv: list[str]) -> SpecDecOptions:
    opts = SpecDecOptions(argv)
    if opts.view_as(StandardOptions).runner is None:
        opts.view_as(StandardOptions).runner = LOCAL_RUNNER
    # Local paths as absolute ones for every step of the job (Beam matches no bare `gens-*`); an --output ending in / is
    # left as given, for preflight to refuse (a local one made absolute would write beside the folder it names).
    opts.input = absolute(opts.input)
    if not opts.output.endswith("/"):
        opts.output = absolute(opts.output)
    if opts.resume_from:
        opts.resume_from = [absolute(p) for p in opts.resume_prefixes()]
    for name in ("target_model", "draft_model", "tokenizer"):  # (`--target_model=~/m`: no shell expands it)
        if getattr(opts, name):
            setattr(opts, name, os.path.expanduser(getattr(opts, name)))
    return opts


def _damaged_inputs(opts: SpecDecOptions, e: Exception) -> list[str]:
    """The input files damaged past their footers, where the job failed in Beam's Parquet source,
    whose error names no file (a remote runner's error holds its workers' traceback as text). Rows
    are grouped by id before any is decoded, so every input was read before any work."""
    if not re.search(r'parquetio\.py", line \d+, in read_records', "".join(traceback.format_exception(e))):
        return []
    log.info("the job failed reading its input (%s): reading every input file to find which", type(e).__name__)
    return damaged_inputs(opts)


def main(argv: list[str] | None = None, wait: bool = True) -> int:
    """Run the job; 0 on success, 2 (with one line on stderr) for a bad job setting, 1 (one line) for
    input files damaged past their footers, which only reading them finds.

    wait=False returns as soon as the job is submitted (Flex Template launchers must).
    """
    setup_logging()
    argv = sys.argv[1:] if argv is None else argv
    try:
        check_pipeline_flags(argv)
        opts = parse_options(argv)
        schema = preflight(opts)
    except (FlagError, JobConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    old, aside = [], None
    if opts.overwrite and not is_dry_run(opts):
        old = output_files(opts.output)
        if old and not wait:  # (a launcher that returns at once cannot put them back)
            log.info("--overwrite: deleting %d earlier output files under %s", len(old), opts.output)
            FileSystems.delete(old)
        # a killed run's shards, never renamed, and earlier files a killed launcher had set aside
        if staged := beam_temp_dirs(opts.output) + beam_temp_dirs(opts.output, ASIDE):
            log.info("--overwrite: deleting %d folders of unfinished writes: %s", len(staged), ", ".join(staged))
            delete_dirs(staged)
    log.info("placement on each worker: %s", placement_record(opts))
    p = beam.Pipeline(options=opts)
    build_pipeline(p, opts, schema)
    try:
        if old and wait:
            aside = set_aside(old, opts.output)
            log.info("--overwrite: moved %d earlier output files under %s to %s, deleted when the job ends",
                     len(old), opts.output, aside)
        result = p.run()
        if wait:
            result.wait_until_finish()
    except Exception as e:  # no row was decoded: a worker's load refused the pair, or an input could not be read
        if isinstance(e, ModelRefused):
            line, status = str(e).split(" [while running")[0], 2
        elif damaged := _damaged_inputs(opts, e):
            line, status = (f"--input: {len(damaged)} of its files cannot be read past their footers: "
                            f"{'; '.join(damaged[:3])}{' ...' if len(damaged) > 3 else ''}: write them again, "
                            "or leave them out of --input"), 1
        else:
            raise
        if aside:  # the earlier run's files as they were (rows failed before the load: not kept)
            try:
                FileSystems.delete(output_files(opts.output))
                put_back(aside, old)
            except Exception as cleanup:  # (kept where they are, said)
                log.warning("--overwrite: the earlier output files are in %s: could not put them back: %s",
                            aside, cleanup)
            aside = None
        try:  # (the sinks' staging folders, empty: not left behind)
            delete_dirs(beam_temp_dirs(opts.output))
        except Exception as cleanup:  # (the refusal is what the user must read)
            log.warning("could not delete the unused staging folders beside %s: %s", opts.output, cleanup)
        print(f"error: {line}", file=sys.stderr)
        return status
    finally:
        if aside:
            log.info("--overwrite: deleting the %d earlier output files in %s", len(old), aside)
            delete_dirs([aside])
    if wait:
        log.info("done: results in %s-*-of-*.parquet, failed rows in %s-failed-*-of-*.parquet",
                     opts.output, opts.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
