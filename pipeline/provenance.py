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
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:  # (the options import torch through the engine's choices; reading a record needs neither)
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
    flag names), the package versions under "versions", and under "placement" the device of
    every copy of the pair on a worker, as planned at launch."""
    from pipeline.options import SpecDecOptions

    parser = argparse.ArgumentParser(add_help=False)
    SpecDecOptions._add_argparse_args(parser)  # noqa: SLF001
    flags = {a.dest: getattr(opts, a.dest) for a in parser._actions}  # noqa: SLF001
    return {**flags, "versions": {p: _version(p) for p in PACKAGES}, "placement": placement_record(opts)}


def placement_record(opts: SpecDecOptions) -> dict:
    """{"gpus": what the launcher knows of a worker's GPUs, "copies": [devices of each copy]}.
    Reads nothing: preflight's plan where it made one, else the plan from the flags and the
    worker's GPUs (a split is then sized on the workers, and said so)."""
    from pipeline.fit import planned_copies, worker_gpus
    from specdec_core.placement import plan_copies

    planned = planned_copies(opts)
    if planned is not None:
        worker, copies = planned
    else:
        worker = worker_gpus(opts) if opts.device != "cpu" else None
        try:
            copies = plan_copies(opts.device, opts.device_map, worker.gpus if worker else [])
        except ValueError:
            copies = []
        if opts.device_map == "auto" and worker and len(worker.gpus) > 1:
            return {"gpus": worker.source, "copies": "split per copy over the fewest GPUs that hold it, "
                    "planned on each worker"}
    if opts.device != "cpu" and worker is None:
        return {"gpus": "unknown at launch", "copies": "one per GPU of each worker"
                if opts.device in ("auto", "cuda") and opts.device_map == "none" else opts.device}
    return {"gpus": worker.source if worker else "none", "copies": [list(c.devices) for c in copies]}


def with_provenance(schema: pa.Schema, record: dict) -> pa.Schema:
    return schema.with_metadata({**(schema.metadata or {}), KEY: json.dumps(record, sort_keys=True, default=str)})


def record_in(metadata: dict[bytes, bytes] | None) -> dict | None:
    """The record in a Parquet file's key-value metadata, or None (files of a job before records,
    or written by something else)."""
    raw = (metadata or {}).get(KEY.encode())
    return json.loads(raw) if raw else None


def read_record(prefix: str) -> dict | None:
    """The record a run's output files carry (the first result file's), or None."""
    import pyarrow.parquet as pq
    from apache_beam.io.filesystems import FileSystems

    from transforms.durable import match, result_patterns

    for path in match(result_patterns(prefix))[:1]:
        with FileSystems.open(path) as f:
            return record_in(pq.read_metadata(f).metadata)
    return None


# The flags that decide which text a row gets (the models' locations aside: a model may move,
# to gs:// say; --dtype as it ran where --device names the device, else as given); where either
# run samples, those that decide which sample a seed draws too (the drafts it is drawn against:
# not its distribution, but the very sample).
GENERATION_FLAGS = ("prompt_column", "max_new_tokens", "temperature", "chat_template", "system_prompt", "stop", "dtype")
SAMPLING_FLAGS = ("top_k", "top_p", "seed", "drafter", "num_speculative_tokens", "gamma_policy", "draft_dtype")
NGRAM_FLAGS = ("ngram_min_size", "ngram_max_size")


def _generation(flags: dict) -> dict:
    """A run's flags as they decide its text: stop strings in any order, `auto` gamma and draft dtype as
    sampling runs them (fixed, the draft's own), `auto` dtype as it runs on a named --device, or under
    --device auto on the one kind of device its recorded placement names."""
    out = {k: flags[k] for k in GENERATION_FLAGS + SAMPLING_FLAGS + NGRAM_FLAGS if k in flags}
    device = flags.get("device", "auto")
    if device == "auto":
        copies = (flags.get("placement") or {}).get("copies")
        kinds = {str(d).split(":")[0] for c in copies for d in c} if isinstance(copies, list) else set()
        device = kinds.pop() if len(kinds) == 1 else device
    if out.get("dtype") == "auto" and device != "auto":
        import torch

        from specdec_core.loading import resolve_dtype

        try:
            out["dtype"] = str(resolve_dtype("auto", torch.device(device))).removeprefix("torch.")
        except RuntimeError:  # (a device name torch does not know: compared as given)
            pass
    if isinstance(out.get("stop"), list):
        out["stop"] = sorted(out["stop"])
    if out.get("gamma_policy") == "auto":
        out["gamma_policy"] = "fixed"
    if out.get("draft_dtype") == "auto":  # (a sampled job's draft keeps its dtype)
        out["draft_dtype"] = "same"
    return out


def generation_differences(earlier: dict, now: dict, sampling: bool = True) -> list[tuple[str, object, object]]:
    """(flag, earlier's, now's) for each flag, recorded in both runs' flags, on which the two runs'
    texts differ: the GENERATION_FLAGS, and where either samples and `sampling`, those that decide
    which sample a seed draws."""
    earlier, now = _generation(earlier), _generation(now)
    sampled = sampling and (bool(earlier.get("temperature")) or bool(now.get("temperature")))
    ngram = sampled and "ngram" in (earlier.get("drafter"), now.get("drafter"))
    keys = GENERATION_FLAGS + (SAMPLING_FLAGS if sampled else ()) + (NGRAM_FLAGS if ngram else ())
    return [(k, earlier[k], now[k]) for k in keys if k in earlier and k in now and earlier[k] != now[k]]
