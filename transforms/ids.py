"""Which input rows get generated: one group per id, before any generation.

- An id that occurs more than once: every one of its rows becomes a failed row
  (`DuplicateId`), never two output rows sharing an id. A null id is an id like any other:
  one null-id row is generated, two are duplicates.
- With resume prefixes: an id that already has a result row there is skipped (ids that only
  failed are tried again).
- A row with a value that is not valid UTF-8 (`NotUtf8`) fails: as it is read where that value
  is its id (shown with U+FFFD, it could equal another row's), else once grouped, as a row whose
  id occurs once (a valid id's other copies all fail as `DuplicateId`, as any duplicate's do).

Both are one CoGroupByKey on the id, joining the input rows with the ids done in earlier
runs. The done ids are read by the pipeline itself (ReadAllFromParquet, id column only), not
by the launcher: a million ids would not fit in the job graph, the launcher never touches
the earlier output, and the grouping is a barrier, so every done id is known before the
first row reaches generation.
"""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
from apache_beam.io.parquetio import ReadAllFromParquet
from apache_beam.metrics import Metrics

from specdec_core.text import InvalidUtf8, NotUtf8
from transforms.durable import NAMESPACE, result_patterns
from transforms.results import prompt_text

FAILED = "failed"


def _unreadable(key: object, prompt: NotUtf8) -> dict:
    """The failed row of a row with a value that is not valid UTF-8."""
    Metrics.counter(NAMESPACE, "rows_not_utf8").inc()
    return {"id": key, "prompt": prompt_text(prompt), "error_type": InvalidUtf8.__name__,
            "error_message": prompt.reason}


class _Select(beam.DoFn):
    def __init__(self, prompt_column: str):
        self.prompt_column = prompt_column
        self.skipped = Metrics.counter(NAMESPACE, "rows_skipped_done")
        self.duplicates = Metrics.counter(NAMESPACE, "rows_duplicate_id")

    def process(self, group: tuple) -> Iterator:
        key, joined = group
        rows, done = list(joined["rows"]), list(joined.get("done", ()))
        if not rows:
            return
        if done:
            self.skipped.inc(len(rows))
            return
        if len(rows) == 1:
            prompt = rows[0].get(self.prompt_column)
            yield beam.pvalue.TaggedOutput(FAILED, _unreadable(key, prompt)) if isinstance(prompt, NotUtf8) else rows[0]
            return
        self.duplicates.inc(len(rows))
        # Numbered by prompt text (a null first), so that identical rows stay distinct rows however
        # a retry orders the group (readers keep one DuplicateId row per id, prompt and message).
        prompts = sorted((prompt_text(row.get(self.prompt_column)) for row in rows), key=lambda p: (p is not None, p))
        for i, prompt in enumerate(prompts, 1):
            yield beam.pvalue.TaggedOutput(FAILED, {
                "id": key,
                "prompt": prompt,
                "error_type": "DuplicateId",
                "error_message": f"id {key!r} occurs {len(rows)} times in the input (row {i} of {len(rows)})",
            })


class _Readable(beam.DoFn):
    """Rows whose id is not valid UTF-8 fail as they are read (their U+FFFD form is no id to group by)."""

    def __init__(self, id_column: str, prompt_column: str):
        self.id_column, self.prompt_column = id_column, prompt_column

    def process(self, row: dict) -> Iterator:
        prompt = row.get(self.prompt_column)
        if isinstance(prompt, NotUtf8) and self.id_column in prompt.columns:
            yield beam.pvalue.TaggedOutput(FAILED, _unreadable(row.get(self.id_column), prompt))
        else:
            yield row


class SelectRows(beam.PTransform):
    """rows -> (rows to generate, {"Grouped": failed rows, "Read": failed rows}): the rows failed
    once grouped by id (`DuplicateId`, and `InvalidUtf8` of a valid id) and those failed as read
    (`InvalidUtf8` of an invalid id), each in its own stage, so that a step on each runs where
    its rows are found."""

    def __init__(self, id_column: str, prompt_column: str, resume_from: list[str] | None = None):
        super().__init__()
        self.id_column, self.prompt_column = id_column, prompt_column
        self.resume_from = list(resume_from or [])

    def expand(self, rows: beam.PCollection) -> tuple[beam.PCollection, dict[str, beam.PCollection]]:
        readable = rows | "Readable" >> beam.ParDo(_Readable(self.id_column, self.prompt_column)).with_outputs(
            FAILED, main="rows")
        rows = readable.rows
        groups = {"rows": rows | "KeyById" >> beam.Map(lambda row, col: (row.get(col), row), self.id_column)}
        if self.resume_from:
            patterns = [p for prefix in self.resume_from for p in result_patterns(prefix)]
            groups["done"] = (
                rows.pipeline
                | "ResumePatterns" >> beam.Create(patterns)
                | "ReadDoneIds" >> ReadAllFromParquet(columns=["id"])
                | "KeyDone" >> beam.Map(lambda row: (row["id"], None))
            )
        selected = (
            groups
            | "GroupById" >> beam.CoGroupByKey()
            | "Select" >> beam.ParDo(_Select(self.prompt_column)).with_outputs(FAILED, main="rows")
        )
        return selected.rows, {"Grouped": selected[FAILED], "Read": readable[FAILED]}
