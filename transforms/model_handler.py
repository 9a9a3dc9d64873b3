"""A RunInference ModelHandler that holds the draft/target pair for one worker process.

RunInference loads the pair once per process (Beam's `Shared`) and every thread of the
process uses it. With `large_model=True`, or on a machine whose placement
(specdec_core/placement.py) gives several copies (one per GPU, or per group of GPUs for a
split pair), each process gets a `PairRouter` over copies that live in processes of their own
(transforms/copies.py), reached through proxies that expose methods only: so all work goes
through `TextGenerator.generate`, which takes and returns plain data. Not RunInference's own
`large_model` sharing: it hosts the pair, and its model status that every batch asks, in the
SDK process that set up first, so that process's end would fail every other process's rows.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from specdec_core import placement
from specdec_core.placement import DeviceLost
from specdec_core.text import GeneratorSpec, TextGenerator
from transforms.copies import PairGone
from transforms.worker_exit import end_worker

NAMESPACE = "specdec"
LIST_FACTOR = 8  # rows per RunInference call, in units of --batch_size (see SpecDecModelHandler)
ERROR_KEY = "error_type"  # a per-row failure marker from TextGenerator.generate_batch
_LOG = logging.getLogger(__name__)


class _Progress:
    """Beam metrics per item, plus a log line at most every `every_s` seconds."""

    def __init__(self, every_s: float = 15.0):
        self.prompts = Metrics.counter(NAMESPACE, "prompts_generated")
        self.new_tokens = Metrics.counter(NAMESPACE, "new_tokens")
        self.draft_tokens = Metrics.counter(NAMESPACE, "draft_tokens")
        self.accepted = Metrics.counter(NAMESPACE, "accepted_tokens")
        self.verify_steps = Metrics.counter(NAMESPACE, "verify_steps")
        self.latency_ms = Metrics.distribution(NAMESPACE, "item_latency_ms")
        self.every_s = every_s
        self.totals = {"prompts": 0, "new": 0, "drafted": 0, "accepted": 0, "seconds": 0.0}
        self.last_log = time.monotonic()

    def record(self, out: dict) -> None:
        self.prompts.inc()
        self.new_tokens.inc(out["new_tokens"])
        self.draft_tokens.inc(out["draft_tokens"])
        self.accepted.inc(out["accepted_tokens"])
        self.verify_steps.inc(out["verify_steps"])
        self.latency_ms.update(int(out["latency_s"] * 1000))
        t = self.totals
        t["prompts"] += 1
        t["new"] += out["new_tokens"]
        t["drafted"] += out["draft_tokens"]
        t["accepted"] += out["accepted_tokens"]
        t["seconds"] += out["latency_s"]
        if time.monotonic() - self.last_log >= self.every_s:
            self.last_log = time.monotonic()
            acc = f"{t['accepted'] / t['drafted']:.2f}" if t["drafted"] else "n/a"
            # Per prompt: batched prompts decode side by side, so a job's throughput is higher. Per thread: each of
            # a worker's threads has its own handler (the job's totals are the counters).
            _LOG.info("specdec: %d prompt%s done in this thread, %d new tokens, acceptance %s, %.1f new tokens/s "
                      "per prompt",
                      t["prompts"], "" if t["prompts"] == 1 else "s", t["new"], acc,
                      t["new"] / max(t["seconds"], 1e-9))


class SpecDecModelHandler(ModelHandler[tuple[dict, int], PredictionResult, TextGenerator]):
    """Speculative decoding of input rows (dicts, each with its seed) with a shared TextGenerator: one row per call,
    or, with --batch_size > 1, lists of rows decoded together."""

    def __init__(self, spec: GeneratorSpec, prompt_column: str = "prompt", *, large_model: bool = False):
        # batch_size 1: one row per call, the batch-1 engine. batch_size B > 1: lists of
        # LIST_FACTOR * B rows, decoded with continuous batching; the batch is full until fewer
        # than B rows of a list remain, i.e. for about (1 - 1/LIST_FACTOR) of its rows. Longer
        # lists fill it better but hold more rows per bundle (and per retry, if a list fails).
        # BatchElements adapts sizes between min and max to ~1 s per call; a generation call
        # takes far longer, so min is what it uses: min = max pins the list size (a bundle's
        # last list may be shorter).
        rows = 1 if spec.batch_size == 1 else LIST_FACTOR * spec.batch_size
        super().__init__(min_batch_size=rows, max_batch_size=rows)  # (large_model: our copies, not Beam's sharing)
        self.spec = spec
        self.prompt_column = prompt_column
        self.large_model = large_model
        self.job_tag = f"specdec-{uuid.uuid4().hex[:12]}"  # one per job: keys the copies of each machine
        self._progress: _Progress | None = None
        self._copies: tuple[int, list[placement.Copy]] | None = None

    def copies(self) -> list[placement.Copy]:
        """This machine's copies of the pair, from the GPUs it sees (once per process: the
        launcher's own answer, pickled with the handler, is not the worker's)."""
        if self._copies is None or self._copies[0] != os.getpid():
            gpus = placement.visible_gpus() if self.spec.device != "cpu" else []
            need = None
            if self.spec.device_map == "auto" and len(gpus) > 1:
                need = self._weights_need()
            self._copies = os.getpid(), placement.plan_copies(self.spec.device, self.spec.device_map, gpus, need)
        return self._copies[1]

    def _weights_need(self) -> placement.Footprint:
        """The pair's weights (no KV cache), from the configs: what a split is planned on."""
        import torch
        from transformers import AutoConfig

        from specdec_core.loading import resolve_dtype
        from transforms.model_cache import localize

        trust = self.spec.trust_remote_code
        target = AutoConfig.from_pretrained(localize(self.spec.target_model), trust_remote_code=trust)
        draft = (AutoConfig.from_pretrained(localize(self.spec.draft_model), trust_remote_code=trust)
                 if self.spec.drafter == "model" else None)
        dtype = resolve_dtype(self.spec.dtype, torch.device("cuda"))
        return placement.footprint(target, draft, dtype, rows=0, prompt_tokens=0, new_tokens=0,
                                   trust_remote_code=trust)

    def load_model(self) -> TextGenerator:
        from transforms.copies import start_copies
        from transforms.model_cache import localize

        copies = self.copies()
        _LOG.info("specdec: %s", placement.describe_plan(copies))
        if len(copies) > 1 or self.large_model:
            return start_copies(self.spec, copies, self.job_tag)  # type: ignore[return-value]
        local = {f: localize(getattr(self.spec, f)) for f in ("target_model", "draft_model", "tokenizer")
                 if getattr(self.spec, f)}
        return TextGenerator.load(dataclasses.replace(self.spec, devices=copies[0].devices, **local))

    def run_inference(
        self, batch: Sequence[tuple[dict, int]], model: TextGenerator, inference_args: dict[str, Any] | None = None
    ) -> Iterable[PredictionResult]:
        if self._progress is None:
            self._progress = _Progress()
        try:
            return self._run(batch, model)
        except (DeviceLost, PairGone) as e:  # no row can be decoded in this process any more
            end_worker(e)
            raise

    def _run(self, batch: Sequence[tuple[dict, int]], model: TextGenerator) -> list[PredictionResult]:
        results = []  # a list, not a generator: RunInference counts failures only then
        if self.spec.batch_size > 1:
            # Bad prompts come back as per-row markers (GenerateRows makes them failed rows).
            outs = model.generate_batch([(row[self.prompt_column], seed) for row, seed in batch])
            for (row, _), out in zip(batch, outs, strict=True):
                if ERROR_KEY not in out:
                    self._progress.record(out)
                results.append(PredictionResult(row, out))
            return results
        for row, seed in batch:
            out = model.generate(row[self.prompt_column], seed)
            self._progress.record(out)
            results.append(PredictionResult(row, out))
        return results

    def get_metrics_namespace(self) -> str:
        return NAMESPACE
