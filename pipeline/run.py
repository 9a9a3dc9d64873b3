"""`python -m pipeline.run`: Parquet prompts -> speculative decoding -> Parquet results."""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import traceback

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import MetricsFilter
from apache_beam.options.pipeline_options import StandardOptions

from pipeline.flags import FlagError, check_pipeline_flags
from pipeline.logs import setup_logging
from pipeline.options import SpecDecOptions
from pipeline.preflight import JobConfigError, damaged_files, is_dry_run, preflight
from pipeline.provenance import placement_record, run_record, with_provenance
from specdec_core.loading import ModelRefused
from transforms.durable import (
    ASIDE,
    DISK_FULL,
    NAMESPACE,
    CommitChunks,
    CommitRows,
    absolute,
    aside_folder,
    beam_temp_dirs,
    chunk_patterns,
    delete_dirs,
    match,
    output_files,
    put_back,
    set_aside,
)
from transforms.generate import GenerateRows
from transforms.ids import SelectRows
from transforms.model_handler import SpecDecModelHandler
from transforms.prompts import ReadPrompts
from transforms.results import WRITTEN, WriteResults
from transforms.schema import failed_schema, result_schema

log = logging.getLogger(__name__)  # (the root logger stays at WARNING: `setup_logging`)

# The plain DirectRunner first tries to download a Prism binary (impossible offline); the
# FnApiRunner is what it falls back to for batch jobs, so we go there directly.
LOCAL_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"


def build_pipeline(p: beam.Pipeline, opts: SpecDecOptions, schema: pa.Schema) -> None:
    """The job graph. Touches neither the input nor the models: those are read by workers."""
    passthrough = opts.passthrough()
    handler = SpecDecModelHandler(opts.generator_spec(), opts.prompt_column, large_model=opts.large_model)
    rows = p | "ReadPrompts" >> ReadPrompts(opts.input, opts.input_columns(), opts.prompt_column)
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
    # Local paths as absolute ones for every step of the job (Beam matches no bare `gens-*`); an --output that is empty
    # or ends in / is left as given, for preflight to refuse (made absolute, it would write beside the folder).
    opts.input = absolute(opts.input)
    if opts.output.strip() and not opts.output.endswith("/"):
        opts.output = absolute(opts.output)
    if opts.resume_from:
        opts.resume_from = [absolute(p) for p in opts.resume_prefixes()]
    for name in ("target_model", "draft_model", "tokenizer"):  # (`--target_model=~/m`: no shell expands it)
        if getattr(opts, name):
            setattr(opts, name, os.path.expanduser(getattr(opts, name)))
    return opts


def _pipeline(opts: SpecDecOptions) -> beam.Pipeline:
    """The job's Pipeline, whose making runs Beam's own checks of its options (the runner's name, Dataflow's
    required options): their error is a bad job setting, said in one line before any model is read."""
    try:
        return beam.Pipeline(options=opts)
    except ValueError as e:
        raise JobConfigError(" ".join(str(e).split())) from e
    except (ImportError, AttributeError) as e:  # (a runner named by its module path)
        raise JobConfigError(f"--runner {opts.view_as(StandardOptions).runner!r}: {e}") from e


def _in_chain(e: BaseException, kind: type | tuple[type, ...]) -> BaseException | None:
    """The first exception of that kind in e's chain (Beam re-raises a worker's error as another)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _damaged_files(opts: SpecDecOptions, e: BaseException) -> tuple[str, list[str]]:
    """(flag, its files damaged past their footers), where the job failed in Beam's Parquet source,
    whose error names no file (a remote runner's error holds its workers' traceback as text). Rows
    are grouped by id before any is decoded, so every file was read before any work."""
    if not re.search(r'parquetio\.py", line \d+, in read_records', "".join(traceback.format_exception(e))):
        return "", []
    log.info("the job failed reading a Parquet file (%s): reading each file it reads to find which", type(e).__name__)
    return damaged_files(opts)


def _disk_full(e: BaseException) -> tuple[str | None, str] | None:
    """(the path, if said, and the reason) where a write failed for want of room, or on a read-only or
    over-quota disk. A multi-process or remote runner's error holds its worker's OSError as text only: taken where
    it names its file, or failed in the output's commit (another full disk of a worker, as weights download, is
    not the output's, and keeps its traceback)."""
    if (full := _in_chain(e, OSError)) and full.errno in DISK_FULL:
        return full.filename, full.strerror
    text = "".join(traceback.format_exception(e))
    ours = "in write_parquet_file" in text
    for m in re.finditer(r"\[Errno (\d+)\] [^\n]*?(?:: '([^'\n\\]+)')?(?: \[while running|$)", text, re.M):
        if int(m[1]) in DISK_FULL and (m[2] or ours):
            return m[2], os.strerror(int(m[1]))
    return None


def _how_to_continue(opts: SpecDecOptions, old: list[str]) -> str:
    """(old: --overwrite's earlier files, of which a stopped move may have left some under the prefix)"""
    if chunks := sorted(set(match(chunk_patterns(opts.output))) - set(old)):
        return (f"finished rows are committed in {len(chunks)} chunk file{'s' * (len(chunks) > 1)} under "
                f"{opts.output}: continue with --resume_from {','.join([*opts.resume_prefixes(), opts.output])} "
                "and a new --output")
    return "no row was committed"


def _why_it_stopped(opts: SpecDecOptions, e: BaseException, old: list[str]) -> tuple[str | None, int, bool]:
    """(the one line to print, or None to raise e; exit status; whether rows may have been decoded)."""
    if _in_chain(e, KeyboardInterrupt):
        return f"interrupted: {_how_to_continue(opts, old)}", 130, True
    if isinstance(e, ModelRefused):
        return str(e).split(" [while running")[0], 2, False
    if full := _disk_full(e):
        return f"cannot write {full[0] or opts.output} ({full[1]}): {_how_to_continue(opts, old)}", 1, True
    flag, damaged = _damaged_files(opts, e)
    if damaged:
        return (f"{flag}: {len(damaged)} of its files cannot be read past their footers: "
                f"{'; '.join(damaged[:3])}{' ...' if len(damaged) > 3 else ''}: write them again, or leave them "
                f"out of {flag}"), 1, False
    return None, 1, True


def _restore(opts: SpecDecOptions, aside: str, old: list[str], decoded: bool) -> None:
    """--overwrite's earlier files after a job that did not finish: put back, where the job kept no rows
    of its own (with none decoded, what it wrote, failed rows, is deleted), else kept aside, said."""
    try:
        new = sorted(set(output_files(opts.output)) - set(old))  # (earlier files a stopped move left)
        if new and decoded:
            log.warning("--overwrite: the job did not finish: the earlier output files are kept in %s, beside its "
                        "%d committed files under %s", aside, len(new), opts.output)
            return
        FileSystems.delete(new)
        put_back(aside, old)
        log.info("--overwrite: the job did not finish: the earlier output files are back under %s", opts.output)
    except Exception as cleanup:  # (kept where they are, said)
        log.warning("--overwrite: the earlier output files are in %s: could not put them back: %s", aside, cleanup)


def main(argv: list[str] | None = None, wait: bool = True) -> int:
    """Run the job; 0 on success, 2 (with one line on stderr) for a bad job setting; one line too, status 1,
    for input files damaged past their footers (only reading them finds them) or a full disk, 130 for Ctrl-C.

    wait=False returns as soon as the job is submitted (Flex Template launchers must).
    """
    setup_logging()
    argv = sys.argv[1:] if argv is None else argv
    p = None
    try:
        check_pipeline_flags(argv)
        opts = parse_options(argv)
        p = _pipeline(opts)
        schema = preflight(opts)
    except (FlagError, JobConfigError) as e:
        if p is not None:  # (the folder a Pipeline makes, which only its run removes)
            shutil.rmtree(p.local_tempdir, ignore_errors=True)
        print(f"error: {e}", file=sys.stderr)
        return 2
    old, aside = [], None
    if opts.overwrite and not is_dry_run(opts):
        old = output_files(opts.output)
        # a killed run's shards, never renamed, and earlier files a killed launcher had set aside
        if staged := beam_temp_dirs(opts.output) + beam_temp_dirs(opts.output, ASIDE):
            log.info("--overwrite: deleting %d folders of unfinished writes: %s", len(staged), ", ".join(staged))
            delete_dirs(staged)
    log.info("placement on each worker: %s", placement_record(opts))
    build_pipeline(p, opts, schema)
    result = None
    try:
        if old:
            aside = aside_folder(opts.output)  # (known before the move, which Ctrl-C may stop midway)
            set_aside(old, aside)
            log.info("--overwrite: moved %d earlier output files under %s to %s, deleted when the job has %s",
                     len(old), opts.output, aside, "finished" if wait else "been submitted (or its job file written)")
        result = p.run()
        if wait:
            result.wait_until_finish()
    except BaseException as e:  # (Ctrl-C too: the earlier files are not deleted for a job that did not finish)
        if (result is not None and "dataflow" in str(opts.view_as(StandardOptions).runner).lower()
                and type(e).__name__ != "DataflowRuntimeException"):  # (raised once the job has ended)
            # the launcher stopped waiting (Ctrl-C, a poll that failed), not the job: it may still write there
            if aside:
                log.warning("--overwrite: the earlier output files are in %s (the next --overwrite deletes them)",
                            aside)
            if not _in_chain(e, KeyboardInterrupt):
                raise
            print(f"error: interrupted: the launcher stopped waiting, the Dataflow job goes on: to stop it, cancel "
                  f"{result.job_id()} (`gcloud dataflow jobs cancel`)", file=sys.stderr)
            return 130
        line, status, decoded = None, 1, True
        try:  # (a diagnosis that fails, or a second Ctrl-C during it, still restores)
            line, status, decoded = _why_it_stopped(opts, e, old)
        finally:
            if aside:
                _restore(opts, aside, old, decoded)
        if line is None:
            raise
        try:  # (the sinks' staging folders: not left behind)
            delete_dirs(beam_temp_dirs(opts.output))
        except Exception as cleanup:  # (the line below is what the user must read)
            log.warning("could not delete the staging folders beside %s: %s", opts.output, cleanup)
        print(f"error: {line}", file=sys.stderr)
        return status
    if aside:
        log.info("--overwrite: deleting the %d earlier output files in %s", len(old), aside)
        try:
            delete_dirs([aside])
        except Exception as cleanup:  # (the job ran, or was submitted: not a failure of it)
            log.warning("--overwrite: could not delete %s (the next --overwrite deletes it): %s", aside, cleanup)
    if wait:
        log.info("done: %sresults in %s-*-of-*.parquet, failed rows in %s-failed-*-of-*.parquet", _counts(result),
                 opts.output, opts.output)
    return 0


def _counts(result: beam.runners.runner.PipelineResult) -> str:
    """'N result rows, M failed rows (K skipped rows: done in --resume_from); ' from the job's counters, summed
    over their steps ('' where the runner cannot say)."""
    words = dict(zip((*WRITTEN, "rows_skipped_done"), ("result", "failed", "skipped"), strict=True))
    try:
        found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    except Exception as e:  # (a summary only: the job has finished)
        log.debug("no counters: %s", e)
        return ""
    n = dict.fromkeys(words, 0)
    for c in found:
        if c.key.metric.name in n:
            n[c.key.metric.name] += c.committed if c.committed is not None else c.attempted
    if not {c.key.metric.name for c in found} & set(WRITTEN):  # (no row written, or counters not reported)
        return ""
    said = [f"{n[k]} {word} row{'' if n[k] == 1 else 's'}" for k, word in words.items()]
    return f"{said[0]}, {said[1]}{f' ({said[2]}: done in --resume_from)' if n['rows_skipped_done'] else ''}; "


if __name__ == "__main__":
    sys.exit(main())
