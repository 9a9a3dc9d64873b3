"""What made an output file: every Parquet file a job writes carries it as key-value metadata.

Built once by the launcher and attached to the output schemas, so final shards and chunks,
results and failed rows, carry the same record. The versions are the launching
environment's; with the recommended single image (templates/Dockerfile) they are the
workers' too.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json

import pyarrow as pa

from pipeline.options import SpecDecOptions

KEY = "specdec_run"
PACKAGES = ("specdec-beam", "torch", "transformers", "apache-beam")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_record(opts: SpecDecOptions) -> dict:
    """Every flag of this pipeline (model locations and generation flags included, by their
    flag names) and the package versions under "versions"."""
    parser = argparse.ArgumentParser(add_help=False)
    SpecDecOptions._add_argparse_args(parser)  # noqa: SLF001
    flags = {a.dest: getattr(opts, a.dest) for a in parser._actions}  # noqa: SLF001
    return {**flags, "versions": {p: _version(p) for p in PACKAGES}}


def with_provenance(schema: pa.Schema, record: dict) -> pa.Schema:
    return schema.with_metadata({**(schema.metadata or {}), KEY: json.dumps(record, sort_keys=True, default=str)})
