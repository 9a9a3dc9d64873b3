"""Reading prompt rows from Parquet (local or gs://, through Beam's filesystems)."""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.parquetio import ReadFromParquetBatched

from specdec_core.text import NotUtf8

_BAD = object()  # a value that did not decode


def _decoded(column: pa.ChunkedArray) -> list:
    """The column's values, `_BAD` for one that is not valid UTF-8."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        values = []
        for scalar in column:
            try:
                values.append(scalar.as_py())
            except UnicodeDecodeError:
                values.append(_BAD)
        return values


def _shown(column: pa.ChunkedArray, i: int) -> str | None:
    """A text value with U+FFFD for its bad bytes (None for other types): what a failed row can
    hold. A dictionary-encoded column's value is its dictionary's."""
    value = column[i]
    if isinstance(value, pa.DictionaryScalar):
        value = value.value
    if pa.types.is_string(value.type) or pa.types.is_large_string(value.type):
        return value.cast(pa.binary()).as_py().decode("utf-8", "replace")
    return None


def table_rows(table: pa.Table, prompt_column: str) -> list[dict]:
    """The table's rows as dicts, as Beam's ReadFromParquet gives them, except that a row with a
    value that is not valid UTF-8 fails alone instead of the job: its prompt becomes `NotUtf8`
    (which the text layer refuses, naming the columns) and its bad values their U+FFFD
    decoding. Costs nothing for valid tables: Arrow's own conversion, retried only if it raises."""
    try:
        return table.to_pylist()
    except UnicodeDecodeError:
        columns = {name: _decoded(table.column(name)) for name in table.column_names}
    rows = []
    for i, values in enumerate(zip(*columns.values(), strict=True)):
        row = dict(zip(columns, values, strict=True))
        if bad := tuple(name for name, value in row.items() if value is _BAD):
            row.update({name: _shown(table.column(name), i) for name in bad})
            row[prompt_column] = NotUtf8(bad, row[prompt_column])
        rows.append(row)
    return rows


class _Rows(beam.DoFn):
    def __init__(self, prompt_column: str):
        self.prompt_column = prompt_column

    def process(self, table: pa.Table) -> Iterator[dict]:
        yield from table_rows(table, self.prompt_column)


class ReadPrompts(beam.PTransform):
    """Parquet rows (dicts of the named columns).

    Parquet splits only at row groups, so a few large files alone would keep most workers
    idle; no Reshuffle here, as the grouping by id that follows (`SelectRows`) spreads the rows
    across workers already, and a second shuffle of every prompt would only cost.
    """

    def __init__(self, pattern: str, columns: list[str], prompt_column: str):
        super().__init__()
        self.pattern = pattern
        self.columns = columns
        self.prompt_column = prompt_column

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "ReadParquet" >> ReadFromParquetBatched(self.pattern, columns=self.columns, validate=False)
            | "Rows" >> beam.ParDo(_Rows(self.prompt_column))
        )
