"""Prompt rows -> result rows and failed rows, through RunInference with a dead-letter queue."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.ml.inference.base import RunInference

from specdec_core.loading import item_seed
from transforms.model_handler import ERROR_KEY, SpecDecModelHandler
from transforms.results import failed_rows, marked_failed_row, result_row


def _with_seed(row: dict, id_column: str, base_seed: int) -> tuple[dict, int]:
    """(row, its seed): the seed beside the row, not in it, where an input column named "seed" would be."""
    return row, item_seed(base_seed, row.get(id_column))


class GenerateRows(beam.PTransform):
    """Every input row comes out exactly once: as a result row or as a failed row.

    Bad prompts (null, empty, wrong type, too long...) raise inside the handler and land in
    RunInference's dead letter with their reason; so does any other per-row error. With
    --batch_size > 1 a list of rows is one call: bad prompts come back as per-row markers
    instead (so they do not fail the list), and an error of the whole call fails each of its
    rows through the dead letter.

    The accelerator hint covers the whole step, so the rows' mapping stays fused with the
    model (and with the durable commits that follow under the same hint, CommitRows).
    """

    def __init__(
        self,
        handler: SpecDecModelHandler,
        *,
        id_column: str,
        prompt_column: str,
        passthrough: list[str],
        seed: int,
        accelerator: str | None = None,
    ):
        super().__init__()
        self.handler = handler
        self.id_column, self.prompt_column = id_column, prompt_column
        self.passthrough, self.seed = passthrough, seed
        if accelerator:
            self.with_resource_hints(accelerator=accelerator)

    def expand(self, rows: beam.PCollection) -> tuple[beam.PCollection, beam.PCollection, beam.PCollection]:
        """(results, rows failed in inference, rows marked failed): the two failed kinds apart, each to be
        committed in the step that finds it (a Flatten here would put their commit in a stage of its own, after
        all generation)."""
        inference = RunInference(self.handler).with_exception_handling()
        generated, dead = (
            rows
            | "Seed" >> beam.Map(_with_seed, self.id_column, self.seed)
            | "RunInference" >> inference
        )
        ok, marked = generated | "SplitMarked" >> beam.Partition(lambda p, _: int(ERROR_KEY in p.inference), 2)
        results = ok | "ResultRows" >> beam.Map(result_row, self.id_column, self.passthrough)
        failed = dead.failed_inferences | "FailedRows" >> beam.FlatMap(
            failed_rows, self.id_column, self.prompt_column
        )
        bad = marked | "MarkedFailedRows" >> beam.Map(marked_failed_row, self.id_column, self.prompt_column)
        return results, failed, bad
