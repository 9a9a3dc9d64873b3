"""`python -m pipeline.report PREFIX[,PREFIX...] [--baseline PREFIX] [--html FILE] [--references COLUMN]`:
what a finished run did, from its output files alone.

Prints counts, failures, acceptance, tokens per target step, latency, throughput and the
measured step costs; with --baseline (a `--drafter none` run of the same prompts) the speed-up
overall and per item and whether the generations are identical; with --references the quality
of the generations against a passthrough column; with --html one self-contained page with plots.
The numbers live in pipeline/report/stats.py, the page in pipeline/report/html.py.
"""

from __future__ import annotations

import argparse
import sys

import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from pipeline.errors import JobConfigError
from pipeline.flags import ArgumentParser
from pipeline.paths import check_prefix, one_spelling, writable_file
from pipeline.provenance import generation_differences, read_record
from pipeline.quality import METRICS, rouge_unread_share
from pipeline.report.stats import (
    Summary,
    compare,
    format_sections,
    format_table,
    quality_scores,
    run_stats,
    sections,
    summarize,
)
from transforms.durable import UnreadableFile, output_files, read_outputs
from transforms.schema import result_schema

__all__ = ["Summary", "format_table", "main", "read_results", "summarize"]  # the demo imports these from here


def _parts(prefix: str) -> list[str]:
    return [p for p in prefix.split(",") if p]


def _record(prefix: str) -> dict:
    """The flags the first of the prefixes whose files carry them ran with ({} if none)."""
    return next((r for r in map(read_record, _parts(prefix)) if r), {})


def read_results(prefix: str, flag: str = "PREFIX", texts: bool = True) -> tuple[pa.Table, pa.Table | None]:
    """A run's rows, each id once: final shards, and the chunks a running or killed job
    committed (transforms/durable.py reads both); several comma-separated prefixes (a resumed
    run and the one it continued, a job split in several) are read as one output. Without
    `texts`, the rows lack their generation (their statistics are all a report without a
    baseline or references reads)."""
    parts = _parts(prefix)
    for part in parts:  # (a glob's * would match another run's files: j* takes j1-failed-* for results)
        check_prefix(flag, part, written=False)
    for part in parts if len(parts) > 1 else ():  # (a typo would leave its rows out unseen)
        if not output_files(part):
            raise FileNotFoundError(f"{part}: no output files there ({prefix})")
    results, failed = read_outputs(parts, skip=() if texts else ("generation",))
    if results is None and failed is not None:  # a killed job that had only failed rows so far
        results = result_schema(failed.schema, "id", []).empty_table()
    said = "" if flag == "PREFIX" else f"{flag} {prefix!r}: "  # (which of the two prefixes)
    if results is None:
        raise FileNotFoundError(f"{said}no result files {prefix}-SSSSS-of-NNNNN.parquet or {prefix}-chunk-*.parquet")
    if "new_tokens" not in results.schema.names:  # (prompt shards of the same name)
        raise FileNotFoundError(f"{said or prefix + ': '}its files hold no generations (no 'new_tokens' column): not "
                                "a run's --output prefix")
    return results, failed


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m pipeline.report", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", help="the --output prefix of a run (several, comma-separated: read as one)")
    parser.add_argument("--baseline", default=None,
                        help="the --output prefix of a --drafter none run of the same prompts: speed-up and "
                        "identical generations, joined on id")
    parser.add_argument("--html", default=None, help="also write one self-contained HTML page with plots here")
    parser.add_argument("--references", default=None,
                        help="a passthrough column of reference texts: score the generations against it")
    parser.add_argument("--metric", choices=METRICS, default=None,
                        help="with --references: rouge (ROUGE-1/2/L, summarization; the default), bleu or chrf "
                             "(translation; chrf reads any script)")
    args = parser.parse_args(argv)
    if args.metric and not args.references:  # (it was ignored)
        print(f"error: --metric {args.metric} scores against --references COLUMN: pass it", file=sys.stderr)
        return 2
    for flag in ("baseline", "references"):  # (an empty one was left out without a word)
        if getattr(args, flag) is not None and not getattr(args, flag).strip():
            print(f"error: --{flag} '': names nothing: drop it, or name one", file=sys.stderr)
            return 2
    def spelled(prefix: str) -> list[str]:
        return sorted(map(one_spelling, _parts(prefix)))

    if args.baseline and spelled(args.baseline) == spelled(args.prefix):  # (compared with itself: "speed-up 1.00x")
        print(f"error: --baseline {args.baseline!r} is the run itself: name the --drafter none run of its prompts",
              file=sys.stderr)
        return 2
    args.metric = args.metric or "rouge"
    try:
        if args.html is not None:  # (before the reading and plotting)
            args.html = writable_file("--html", args.html)
        results, failed = read_results(args.prefix, texts=bool(args.baseline or args.references))
        base, base_failed = read_results(args.baseline, "--baseline") if args.baseline else (None, None)
        scores = quality_scores(results, args.references, args.metric) if args.references else None
    except (FileNotFoundError, KeyError, JobConfigError, UnreadableFile) as e:
        print(f"error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    if scores and args.metric == "rouge" and (unread := rouge_unread_share(results[args.references])) > 0.1:
        print(f"note: ROUGE reads a-z and 0-9 only (rouge-score's tokenizer, as published ROUGE figures): it drops "
              f"{unread:.0%} of the references' letters and digits here; --metric chrf scores any script",
              file=sys.stderr)
    alone = True
    if args.baseline:  # what its files say made them
        made, run = _record(args.baseline), _record(args.prefix)
        alone = made.get("drafter", "none") == "none"
        if not alone:  # an A/B of two drafted runs: speed-up and identical generations hold
            print(f"note: --baseline {args.baseline} drafted (--drafter {made['drafter']}): its steps are not the "
                  "target's alone, so its target step, c and v are left out", file=sys.stderr)
        for flag in ("target_model", "tokenizer"):  # (a run without --tokenizer reads its target's)
            where = [r.get(flag) or r.get("target_model") for r in (made, run)]
            if (None not in where and one_spelling(where[0]) != one_spelling(where[1])
                    and (flag == "target_model" or made.get(flag) or run.get(flag))):
                print(f"note: --baseline {args.baseline} ran --{flag} {where[0]}, this run {where[1]}", file=sys.stderr)
        if other := generation_differences(made, run, sampling=False):  # (its texts differ for that alone)
            flags = ", ".join(f"--{k} {theirs!r} (this run {ours!r})" for k, theirs, ours in other)
            print(f"note: --baseline {args.baseline} ran other generation flags: {flags}; its generations differ "
                  "for that reason, and its speed-up compares other work", file=sys.stderr)
    stats = run_stats(results, failed)
    try:
        comparison = compare(results, base, alone) if base is not None else None
    except ValueError as e:
        print(f"error: --baseline {args.baseline}: {e}", file=sys.stderr)
        return 2
    if comparison is not None and comparison.matched == 0 and results.num_rows and base.num_rows:
        print(f"note: --baseline {args.baseline} shares no id with this run: nothing to compare (run it on the same "
              "prompts)", file=sys.stderr)
    parts = sections(stats, comparison, scores, args.references)
    print(f"report: {args.prefix}" + (f" (baseline: {args.baseline})" if args.baseline else ""))
    print(format_sections(parts), end="")
    if args.html:
        from pipeline.report import html as report_html  # matplotlib: loaded only for the page

        figures = report_html.plots(stats, comparison, run_stats(base, base_failed) if base is not None else None)
        subtitle = f"baseline: {args.baseline}" if args.baseline else "no baseline given"
        page = report_html.page(f"specdec report: {args.prefix}", subtitle, parts, figures)
        with FileSystems.create(args.html, mime_type="text/html") as f:
            f.write(page.encode("utf-8"))
        print(f"html: {args.html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
