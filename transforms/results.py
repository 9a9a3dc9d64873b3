"""Output rows: one result row per generated prompt, one failed row per prompt that could not be
generated (DESIGN.md, "Output"; their columns and Parquet schemas: `transforms.schema`)."""

from __future__ import annotations

import json
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.parquetio import WriteToParquet
from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import PredictionResult

from specdec_core.text import NotUtf8
from transforms.durable import NAMESPACE, delete_chunks
from transforms.schema import STATS

WRITTEN = ("result_rows", "failed_rows")  # counters of the rows that reach the output files
CODEC = "snappy"  # (WriteToParquet's default is none; the chunk files are pyarrow's snappy too)


def result_row(pred: PredictionResult, id_column: str, passthrough: list[str]) -> dict[str, Any]:
    row, out = pred.example, pred.inference
    return {"id": row[id_column], **{name: out[name] for name, _ in STATS}, **{c: row[c] for c in passthrough}}


def prompt_text(prompt: Any) -> str | None:
    """A failed row's prompt column: the prompt; a conversation as JSON text (readable, parseable);
    the repr of any other value that is not a string."""
    if prompt is None or isinstance(prompt, str):
        return prompt
    if isinstance(prompt, NotUtf8):
        return prompt.shown
    if isinstance(prompt, list | tuple | dict):
        return json.dumps(prompt, ensure_ascii=False, default=repr)
    return repr(prompt)


def failed_rows(dead_letter: tuple, id_column: str, prompt_column: str) -> list[dict[str, Any]]:
    """RunInference's dead letter (batch of (row, seed), (exception type, repr, traceback lines)) as failed rows."""
    batch, (exc_type, exc_repr, trace) = dead_letter
    # The traceback's "Type: message" line, the message as str() gives it: the last line unless
    # notes (`add_note`) follow it; the type as the traceback names it, with its module or not.
    names = (f"{exc_type.__name__}: ", f"{exc_type.__module__}.{exc_type.__qualname__}: ")
    line = next((t.strip() for t in reversed(trace or []) if t.startswith(names)), None)
    if line is None:
        line = trace[-1].strip() if trace else exc_repr
    message = line.split(": ", 1)[1] if ": " in line else line
    rows = []
    for row, _ in batch:
        rows.append({
            "id": row.get(id_column),
            "prompt": prompt_text(row.get(prompt_column)),
            "error_type": exc_type.__name__,
            "error_message": message,
        })
    return rows


def marked_failed_row(pred: PredictionResult, id_column: str, prompt_column: str) -> dict[str, Any]:
    """A row that the batched path reported as failed ({"error_type", "error_message"})."""
    row, out = pred.example, pred.inference
    return {
        "id": row.get(id_column),
        "prompt": prompt_text(row.get(prompt_column)),
        "error_type": out["error_type"],
        "error_message": out["error_message"],
    }


def _counted(row: dict, counter: str) -> dict:
    Metrics.counter(NAMESPACE, counter).inc()
    return row


class WriteResults(beam.PTransform):
    """Writes PREFIX-SSSSS-of-NNNNN.parquet, then PREFIX-failed-SSSSS-of-NNNNN.parquet, then
    deletes the chunks that CommitRows wrote while the job ran: the final files hold their rows.

    The failed rows are written only after the results are committed: Beam's finalize step
    deletes every file matching PREFIX-*-of-NNNNN.parquet, which would include failed files
    already written under the same prefix. Chunk names never match that glob.
    """

    def __init__(self, prefix: str, schema: pa.Schema, failed: pa.Schema):
        super().__init__()
        self.prefix, self.schema, self.failed = prefix, schema, failed

    def expand(self, pcolls: tuple[beam.PCollection, beam.PCollection]) -> beam.PCollection:
        results, failed = pcolls
        written = (results
                   | "CountResults" >> beam.Map(_counted, WRITTEN[0])
                   | "WriteResults" >> WriteToParquet(self.prefix, self.schema, codec=CODEC,
                                                      file_name_suffix=".parquet"))
        written_failed = (
            failed
            | "AfterResults" >> beam.Map(lambda row, _: row, beam.pvalue.AsList(written))
            | "CountFailed" >> beam.Map(_counted, WRITTEN[1])
            | "WriteFailed" >> WriteToParquet(f"{self.prefix}-failed", self.failed, codec=CODEC,
                                              file_name_suffix=".parquet")
        )
        _ = (
            results.pipeline
            | "Once" >> beam.Create([None])
            | "DropChunks" >> beam.Map(lambda _, prefix, final: delete_chunks(prefix), self.prefix,
                                       beam.pvalue.AsList(written_failed))
        )
        return written_failed
