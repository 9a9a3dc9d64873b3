"""Reading prompt rows from Parquet (local or gs://, through Beam's filesystems)."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.io.parquetio import ReadFromParquet


class ReadPrompts(beam.PTransform):
    """Parquet rows (dicts of the named columns), spread across workers.

    Parquet splits only at row groups, so a few large files would otherwise keep most
    workers idle: the Reshuffle hands prompts out one by one.
    """

    def __init__(self, pattern: str, columns: list[str]):
        super().__init__()
        self.pattern = pattern
        self.columns = columns

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "ReadParquet" >> ReadFromParquet(self.pattern, columns=self.columns, validate=False)
            | "Spread" >> beam.Reshuffle()
        )
