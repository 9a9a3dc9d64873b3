"""The output's columns, which the job writes (`transforms.results`) and `pipeline.report` reads:
kept apart from the writing so that reading them needs neither torch nor Beam (DESIGN.md, "Output")."""

import pyarrow as pa

# The contract's columns, then the engine's timing split (so the draft/target cost ratio
# can be computed from the files), then passthrough columns.
STATS = [
    ("generation", pa.string()),
    ("new_tokens", pa.int32()),
    ("draft_tokens", pa.int32()),
    ("accepted_tokens", pa.int32()),
    ("acceptance_rate", pa.float64()),
    ("verify_steps", pa.int32()),
    ("latency_s", pa.float64()),
    ("ttft_s", pa.float64()),
    ("tokens_per_s", pa.float64()),
    ("finish_reason", pa.string()),
    ("seed", pa.int64()),
    ("prompt_tokens", pa.int32()),
    ("draft_steps", pa.int32()),
    ("prefill_s", pa.float64()),
    ("draft_s", pa.float64()),
    ("verify_s", pa.float64()),
    ("admit_s", pa.float64()),
    ("admitted_with", pa.int32()),
    ("admit_passes", pa.int32()),
    ("rejections", pa.int32()),
]
FAILED = [("prompt", pa.string()), ("error_type", pa.string()), ("error_message", pa.string())]


def result_schema(input_schema: pa.Schema, id_column: str, passthrough: list[str]) -> pa.Schema:
    fields = [pa.field("id", input_schema.field(id_column).type)]
    fields += [pa.field(name, typ) for name, typ in STATS]
    fields += [input_schema.field(c) for c in passthrough]
    return pa.schema(fields)


def failed_schema(input_schema: pa.Schema, id_column: str) -> pa.Schema:
    return pa.schema([pa.field("id", input_schema.field(id_column).type)] + [pa.field(n, t) for n, t in FAILED])


def plain_type(typ: pa.DataType) -> pa.DataType:
    """A type as Python values see it: dictionary-encoded as its values, large and view layouts as
    the plain one (pandas 3 and Polars write large_string where pyarrow writes string)."""
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    if pa.types.is_large_string(typ) or pa.types.is_string_view(typ):
        return pa.string()
    if pa.types.is_large_binary(typ) or pa.types.is_binary_view(typ):
        return pa.binary()
    return typ


def id_type_problem(typ: pa.DataType) -> str | None:
    """Why ids of this type cannot key rows (said after the column's name), or None: Beam encodes dates, times
    and decimals nondeterministically, so duplicates go unfound; Arrow cannot group an output by nested ids
    (no report, no resume). Ids are read as their `plain_type`."""
    typ = plain_type(typ)
    if pa.types.is_temporal(typ) or pa.types.is_decimal(typ):
        return (f"is {typ}, which Beam cannot encode deterministically to find duplicate ids: cast it to text or "
                "integers")
    if pa.types.is_nested(typ):
        return f"is {typ}, which cannot key rows: use a column of text or integers"
    return None
