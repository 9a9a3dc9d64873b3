"""Checks that stop a bad job before any work, each with one line naming the culprit."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from pipeline.options import SpecDecOptions
from transforms.results import result_schema


class JobConfigError(ValueError):
    pass


def input_schema(pattern: str) -> pa.Schema:
    try:
        files = sorted(m.path for r in FileSystems.match([pattern]) for m in r.metadata_list)
    except Exception as e:  # Beam raises BeamIOError for unreachable locations
        raise JobConfigError(f"--input {pattern!r}: cannot list files ({e})") from e
    if not files:
        raise JobConfigError(f"--input {pattern!r} matches no files")
    try:
        with FileSystems.open(files[0]) as f:
            return pq.read_schema(f)
    except Exception as e:
        raise JobConfigError(f"--input: {files[0]} is not a readable Parquet file ({e})") from e


def _check_columns(opts: SpecDecOptions, schema: pa.Schema) -> None:
    names = schema.names
    for flag, col in [("--prompt_column", opts.prompt_column), ("--id_column", opts.id_column)] + [
        ("--passthrough_columns", c) for c in opts.passthrough()
    ]:
        if col not in names:
            raise JobConfigError(f"{flag} {col!r} is not a column of the input (columns: {', '.join(names)})")
    taken = set(result_schema(schema, opts.id_column, []).names)
    clash = [c for c in opts.passthrough() if c in taken]
    if clash:
        raise JobConfigError(f"--passthrough_columns {clash[0]!r} clashes with an output column of that name")


def _check_model_path(flag: str, path: str) -> None:
    if path.startswith("gs://"):
        if not FileSystems.exists(path.rstrip("/") + "/config.json"):
            raise JobConfigError(f"{flag} {path!r}: no config.json there")
    elif os.path.exists(path) or path.startswith((".", "/", "~")):
        if not os.path.isfile(os.path.join(os.path.expanduser(path), "config.json")):
            raise JobConfigError(f"{flag} {path!r}: not a model directory (no config.json)")
    else:  # a hub id: transformers resolves it (from the local cache when offline)
        from transformers import AutoConfig

        try:
            AutoConfig.from_pretrained(path)
        except Exception as e:
            raise JobConfigError(f"{flag} {path!r}: cannot load the model config ({type(e).__name__})") from e


def _check_pair(opts: SpecDecOptions) -> None:
    """Kind and vocabulary checks, where both models are local (gs:// pairs are checked on load)."""
    paths = [opts.target_model, opts.draft_model]
    if any(p.startswith("gs://") for p in paths):
        return
    from transformers import AutoConfig

    from specdec_core.loading import IncompatiblePairError, check_compatible, draft_tokenizer_for, load_tokenizer

    try:
        target_tokenizer = load_tokenizer(opts.tokenizer or opts.target_model)
    except Exception as e:
        raise JobConfigError(f"--tokenizer/--target_model: cannot load a tokenizer ({type(e).__name__}: {e})") from e
    try:
        check_compatible(*(AutoConfig.from_pretrained(p) for p in paths), target_tokenizer,
                         draft_tokenizer_for(opts.draft_model, target_tokenizer))
    except IncompatiblePairError as e:
        raise JobConfigError(f"--draft_model {opts.draft_model!r}: {e}") from e


def _check_batching(opts: SpecDecOptions) -> None:
    """--batch_size > 1 decodes decoder-only full-attention models only (gs:// models are
    checked on load)."""
    if opts.batch_size == 1:
        return
    from transformers import AutoConfig

    from specdec_core.batch_engine import unbatchable

    models = [("--target_model", opts.target_model)]
    if opts.drafter == "model":
        models.append(("--draft_model", opts.draft_model))
    for flag, path in models:
        if path.startswith("gs://"):
            continue
        why = unbatchable(AutoConfig.from_pretrained(path))
        if why:
            raise JobConfigError(f"--batch_size {opts.batch_size}: {flag} {path!r} {why}; batching needs "
                                 "decoder-only models with full attention (use --batch_size 1)")


def preflight(opts: SpecDecOptions) -> pa.Schema:
    """Validate settings, input and models; return the input's Parquet schema."""
    try:
        opts.generator_spec()
    except ValueError as e:
        raise JobConfigError(str(e)) from e
    for flag, value in [("--num_speculative_tokens", opts.num_speculative_tokens),
                        ("--max_new_tokens", opts.max_new_tokens)]:
        if value < 1:
            raise JobConfigError(f"{flag} must be >= 1, got {value}")
    schema = input_schema(opts.input)
    _check_columns(opts, schema)
    _check_model_path("--target_model", opts.target_model)
    if opts.tokenizer and opts.tokenizer.startswith((".", "/", "~")) and not os.path.isdir(opts.tokenizer):
        raise JobConfigError(f"--tokenizer {opts.tokenizer!r}: no such directory")
    if opts.drafter == "model":
        _check_model_path("--draft_model", opts.draft_model)
        _check_pair(opts)
    _check_batching(opts)
    return schema
