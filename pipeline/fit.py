"""The worker's GPUs as the launcher knows them, the copies of the pair they will run, and the
check that refuses a pair that cannot fit them before any work.

The launcher of a Dataflow job has no GPU: it reads the worker's from `worker_accelerator` in
`--dataflow_service_options` (or `--accelerator`), with each type's memory as the driver reports
it. A local job looks at this machine's GPUs. Anything else (an unknown type, no accelerator
given) skips the check, saying so in the log.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DebugOptions, GoogleCloudOptions, StandardOptions

from pipeline.options import SpecDecOptions
from specdec_core import placement
from specdec_core.placement import Copy, Footprint, Gpu
from specdec_core.text import NotUtf8, is_conversation
from transforms.durable import absolute
from transforms.prompts import table_rows

log = logging.getLogger(__name__)

MIB = 1024**2
# Memory per GPU of Dataflow's accelerator types, in MiB as nvidia-smi reports it.
GPU_MIB = {
    "nvidia-tesla-p4": 7680,
    "nvidia-tesla-t4": 15360,
    "nvidia-tesla-p100": 16280,
    "nvidia-tesla-v100": 16160,
    "nvidia-l4": 23034,
    "nvidia-tesla-a100": 40960,
    "nvidia-a100-80gb": 81920,
    "nvidia-h100-80gb": 81559,
    "nvidia-h100-mega-80gb": 81559,
    "nvidia-h200-141gb": 143771,
}
LONGEST = 16  # prompts tokenized to find the longest, among the longest by UTF-8 length
# At launch, input files are read up to this many bytes (whole files, in path order): a job of
# millions of documents should not wait on a scan of all of them before it starts.
SCAN_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class WorkerGpus:
    gpus: list[Gpu]
    source: str  # e.g. "worker_accelerator 4 x nvidia-l4 (22.5 GiB each)"


def parse_accelerator(spec: str) -> tuple[str, int] | None:
    """(type, count) of `type:nvidia-l4;count:4;install-nvidia-driver`, or None without a type.
    Raises ValueError for a count that is not a whole number of at least 1."""
    fields = {k.strip(): v.strip() for k, v in (part.split(":", 1) for part in spec.split(";") if ":" in part)}
    if "type" not in fields:
        return None
    count = fields.get("count", "1")
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"count:{count} in {spec!r}: expected a whole number of GPUs, at least 1")
    return fields["type"], int(count)


def worker_accelerators(opts: SpecDecOptions) -> list[str]:
    """The `worker_accelerator=` settings of the job: a Dataflow service option, or an experiment (the older way, and
    what `gcloud dataflow flex-template run --additional-experiments` passes)."""
    cloud, debug = opts.view_as(GoogleCloudOptions), opts.view_as(DebugOptions)
    return [s for s in [*(cloud.dataflow_service_options or []), *(debug.experiments or [])]
            if s.startswith("worker_accelerator=")]


def accelerator_hints(opts: SpecDecOptions) -> list[tuple[str, str]]:
    """(flag, spec) of the right-fitting accelerator hints, the generate step's first: --accelerator (its own, which
    Beam keeps over an outer hint), then the last `--resource_hints accelerator=...` (every step's, the last given)."""
    hints = [("--resource_hints accelerator", h.split("=", 1)[1])
             for h in opts.view_as(StandardOptions).resource_hints or [] if h.startswith("accelerator=")]
    return ([("--accelerator", opts.accelerator)] if opts.accelerator else []) + hints[-1:]


def worker_gpus(opts: SpecDecOptions) -> WorkerGpus | None:
    """The GPUs of one worker: from the job's accelerator settings, or this machine's for a local
    job; None when not known (the fit check is then skipped)."""
    specs = [("worker_accelerator", s.split("=", 1)[1]) for s in worker_accelerators(opts)]
    for flag, spec in [*specs, *accelerator_hints(opts)]:
        try:
            parsed = parse_accelerator(spec)
        except ValueError as e:
            raise ValueError(f"{flag}: {e}") from e
        if parsed is None:  # (Dataflow would refuse it after the launch; the fit check was skipped)
            raise ValueError(f"{flag} {spec!r}: names no GPU type (type:GPU_TYPE;count:N;install-nvidia-driver)")
        kind, count = parsed
        if kind not in GPU_MIB:
            log.info("fit check skipped: GPU type %s has no known memory size", kind)
            return None
        gpus = [Gpu(f"cuda:{i}", GPU_MIB[kind] * MIB) for i in range(count)]
        return WorkerGpus(gpus, f"{count} x {kind} ({placement.gib(gpus[0].total_bytes)} each)")
    runner = str(opts.view_as(StandardOptions).runner or "")
    if "Dataflow" in runner:
        return None
    gpus = placement.visible_gpus()
    if not gpus:
        return WorkerGpus([], "no GPU on this machine")
    names = sorted({torch.cuda.get_device_name(i) for i in range(len(gpus))})
    return WorkerGpus(gpus, f"this machine's {len(gpus)} x {'/'.join(names)}")


class OwnCodeConfig(Exception):
    """A gs:// model whose config class is its own code, which the launcher does not fetch."""


def launcher_config(path: str, trust: bool):
    """A model's config as the launcher reads it, also from gs:// (config.json only: no weight is read); preflight's
    checks read the configs not on gs:// through `model_checks.read_config`, which names the flag."""
    from transformers import AutoConfig

    if path.startswith("gs://"):
        with FileSystems.open(path.rstrip("/") + "/config.json") as f:
            data = json.loads(f.read())
        try:
            return AutoConfig.for_model(**data)
        except ValueError as e:
            if data.get("auto_map"):
                raise OwnCodeConfig(f"{path}'s config is its own code (auto_map), which the launcher "
                                    "does not fetch from gs://") from e
            raise
    return AutoConfig.from_pretrained(path, trust_remote_code=trust)


def _dtypes(opts: SpecDecOptions) -> tuple[torch.dtype, torch.dtype]:
    from specdec_core.loading import resolve_dtype

    dtype = resolve_dtype(opts.dtype, torch.device("cuda"))
    draft = resolve_dtype(opts.draft_dtype, torch.device("cuda")) if opts.draft_dtype in ("float32", "bfloat16") \
        else dtype
    return dtype, draft


def _static(opts: SpecDecOptions, config) -> bool:
    """Whether this model decodes over static caches in this job (`--cuda_graphs` auto or on)."""
    from specdec_core.plan import config_support

    return (opts.cuda_graphs != "off" and opts.device_map != "auto"
            and config_support(config) is None)


def row_columns(opts: SpecDecOptions, config, prompt_tokens: int) -> tuple[int, int]:
    """(prompt, new) cache columns a row takes: its prompt, and its new tokens with a round's
    drafts. A static cache allocates in steps of `graphs.CAPACITY_STEP`: a decoder-only
    row's whole sequence, an encoder-decoder's cross-attention (prompt) and self-attention
    (output) buffers each, with a column more for a one-token pass widened to two (LED's)."""
    from specdec_core.graphs import capacity_for

    new = opts.max_new_tokens + opts.num_speculative_tokens + 1
    if not _static(opts, config):
        return prompt_tokens, new
    if config.is_encoder_decoder:
        return capacity_for(prompt_tokens), capacity_for(new + 1)
    return prompt_tokens, capacity_for(prompt_tokens + new + 1) - prompt_tokens


def row_tokens(opts: SpecDecOptions, config, prompt_tokens: int) -> int:
    """Cache columns a row takes in all (`row_columns`)."""
    return sum(row_columns(opts, config, prompt_tokens))


def graph_bytes(opts: SpecDecOptions, config, rows: int, dtype: torch.dtype, draft: bool = False) -> int:
    """What a model's CUDA graphs keep besides the cache: each captured pass's logits, for every
    row, at every width it runs (the target verifies 1..gamma+1 tokens, a draft steps 1 or 2),
    and the float32 copy of a pass's logits."""
    if not _static(opts, config):
        return 0
    vocab = config.get_text_config(decoder=True).vocab_size
    widest = 2 if draft else opts.num_speculative_tokens + 1
    return max(rows, 1) * vocab * (widest * (widest + 1) // 2 * placement.DTYPE_BYTES.get(dtype, 4) + widest * 4)


def prefill_bytes(opts: SpecDecOptions, config, prompt_tokens: int, dtype: torch.dtype) -> int:
    """Batched with CUDA graphs, a model prefills new rows together through a static cache of its
    own (`SlotKV.prefill`: up to `ADMIT_ROWS` rows), as long as the longest prompt padded to its
    prefill width (an encoder-decoder's cross-attention columns): that many more rows of prompt
    columns."""
    from specdec_core.graphs import capacity_for, prefill_width

    if opts.batch_size <= 1 or not _static(opts, config):
        return 0
    return placement.kv_bytes(config, _prefill_rows(opts), capacity_for(prefill_width(max(prompt_tokens, 1))), 0,
                              dtype)


def _prefill_rows(opts: SpecDecOptions) -> int:
    from specdec_core.slot_kv import ADMIT_ROWS

    return min(opts.batch_size, ADMIT_ROWS)


def weights_need(opts: SpecDecOptions, target, rows: int = 0, prompt_tokens: int = 0) -> Footprint:
    """What one copy needs (`placement.Footprint`); `target`: the target's config."""
    trust = opts.trust_remote_code
    draft = launcher_config(opts.draft_model, trust) if opts.drafter == "model" else None
    dtype, draft_dtype = _dtypes(opts)
    prompt, new = row_columns(opts, target, prompt_tokens)
    need = placement.footprint(target, draft, dtype, rows=rows, prompt_tokens=prompt, new_tokens=new,
                               trust_remote_code=trust)
    if draft is not None and draft_dtype != dtype:
        scale = placement.DTYPE_BYTES[draft_dtype] / placement.DTYPE_BYTES[dtype]
        need = replace(need, draft_weights=int(need.draft_weights * scale), draft_kv=int(need.draft_kv * scale))
    graphs = graph_bytes(opts, target, rows, dtype) + (graph_bytes(opts, draft, rows, draft_dtype, draft=True)
                                                       if draft is not None else 0)
    prefill = prefill_bytes(opts, target, prompt_tokens, dtype)
    draft_prefill = prefill_bytes(opts, draft, prompt_tokens, draft_dtype) if draft is not None else 0
    need = replace(need, target_kv=need.target_kv + prefill, draft_kv=need.draft_kv + draft_prefill,
                   prefill=prefill + draft_prefill, prefill_rows=_prefill_rows(opts) if prefill + draft_prefill else 0)
    return replace(need, graphs=graphs)


def _value(column: pa.ChunkedArray, i: int) -> object:
    """One prompt as the job reads it (a value that is not valid UTF-8 fails its row there)."""
    return table_rows(pa.table({"prompt": column.slice(i, 1)}), "prompt")[0]["prompt"]


def _lengths(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """UTF-8 bytes per prompt: the text, or a conversation's contents together."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        flat = pc.list_flatten(column)
        parents = pc.list_parent_indices(column)
        sizes = pc.fill_null(pc.binary_length(pc.struct_field(flat, "content")), 0)
        out = [0] * len(column)
        for i, n in zip(parents.to_pylist(), sizes.to_pylist(), strict=True):
            out[i] += n
        return pa.chunked_array([pa.array(out, pa.int64())])
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return pa.chunked_array([pa.array([0] * len(column), pa.int64())])
    return pc.fill_null(pc.binary_length(column), 0)


def longest_prompt_tokens(opts: SpecDecOptions) -> tuple[int, str]:
    """(tokens, how measured) of the longest prompt: the prompt column of the input files is
    read (up to SCAN_BYTES of files), the LONGEST longest by UTF-8 length are encoded as the job
    encodes them (chat template included); with a tokenizer the launcher cannot load (on gs://),
    UTF-8 bytes bound it."""
    matched = FileSystems.match([absolute(opts.input)])
    every = sorted((m.path, m.size_in_bytes) for r in matched for m in r.metadata_list)
    files, read = [], 0
    for path, size in every:
        if files and read + size > SCAN_BYTES:
            break
        files.append(path)
        read += size
    scope = "" if len(files) == len(every) else (
        f"; the first {len(files)} of {len(every)} input files ({placement.gib(read)}), a longer prompt in the "
        "others is not seen")
    candidates: list[tuple[int, object]] = []
    for file in files:
        with FileSystems.open(file) as f:
            column = pq.read_table(f, columns=[opts.prompt_column]).column(0)
        lengths = np.asarray(_lengths(column).to_numpy(), dtype=np.int64)
        if len(lengths):
            top = np.argpartition(-lengths, min(LONGEST, len(lengths)) - 1)[:LONGEST]
            candidates += [(int(lengths[i]), prompt) for i in top
                           if not isinstance(prompt := _value(column, int(i)), NotUtf8)]
    candidates = sorted(candidates, key=lambda c: -c[0])[:LONGEST]
    if not candidates:
        return 0, "no prompts"
    path = opts.tokenizer or opts.target_model
    if path.startswith("gs://"):
        return candidates[0][0] + 64, "UTF-8 bytes of the longest prompt (tokenizer on gs://)" + scope
    from specdec_core.loading import load_tokenizer

    tokenizer = load_tokenizer(path, opts.trust_remote_code)
    best = 0
    for _, prompt in candidates:
        if is_conversation(prompt) and not prompt:
            continue  # (the job fails its row: EmptyConversation)
        if is_conversation(prompt) or opts.chat_template:
            messages = prompt if is_conversation(prompt) else [{"role": "user", "content": prompt or ""}]
            messages = [{"role": m["role"], "content": m["content"] or ""} for m in messages]
            if opts.system_prompt is not None and messages[0]["role"] != "system":
                messages = [{"role": "system", "content": opts.system_prompt}, *messages]
            try:
                ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                    return_dict=True)["input_ids"]
            except Exception:  # a conversation the template refuses fails its row; count its text
                ids = tokenizer(" ".join(m["content"] for m in messages))["input_ids"]
        else:
            ids = tokenizer(prompt if isinstance(prompt, str) else "")["input_ids"]
        best = max(best, len(ids))
    return best, "tokens of the longest prompt" + scope


_PLANS: dict[tuple, tuple[WorkerGpus | None, list[Copy]]] = {}


def _key(opts: SpecDecOptions) -> tuple:
    return (opts.device, opts.device_map, opts.accelerator, tuple(worker_accelerators(opts)),
            opts.target_model, opts.draft_model, opts.drafter, opts.dtype, opts.draft_dtype)


def planned_copies(opts: SpecDecOptions) -> tuple[WorkerGpus | None, list[Copy]] | None:
    """The worker's GPUs and copies as preflight planned them (None if it did not run or could
    not tell); reads nothing."""
    return _PLANS.get(_key(opts))


def check_fit(opts: SpecDecOptions) -> list[Copy] | None:
    """Plan the worker's copies and refuse (ValueError, one line naming the flag) a pair that
    cannot fit their GPUs: weights from the configs' parameter counts and dtypes, plus the KV
    cache of --batch_size rows at the longest prompt + --max_new_tokens (`row_tokens`). None when
    the worker's GPUs are not known or the job runs on the CPU."""
    if opts.device == "cpu":
        return None
    worker = worker_gpus(opts)
    if worker is None or not worker.gpus:
        if worker is None:
            log.info("fit check skipped: the workers' GPUs are not known here (give worker_accelerator)")
        else:  # --device cuda is refused here; auto runs on the CPU, said so
            copies = placement.plan_copies(opts.device, opts.device_map, [])
            log.info("worker GPUs: %s; %s%s", worker.source, placement.describe_plan(copies),
                     " (--device_map auto: nothing to split)" if opts.device_map == "auto" else "")
        return None
    tokens, how = longest_prompt_tokens(opts)
    try:
        target = launcher_config(opts.target_model, opts.trust_remote_code)
        need = weights_need(opts, target, rows=opts.batch_size, prompt_tokens=tokens)
    except OwnCodeConfig as e:
        log.info("fit check skipped: %s", e)
        return None
    copies = placement.plan_copies(opts.device, opts.device_map, worker.gpus, need)
    _PLANS[_key(opts)] = worker, copies
    problem = placement.fit_problem(need, worker.gpus, copies, batch_size=opts.batch_size,
                                    device_map=opts.device_map,
                                    tokens=row_tokens(opts, target, tokens))
    if problem:  # (its one line only: the plan is logged for a pair that fits)
        raise ValueError(f"{problem} ({worker.source})")
    log.info("worker GPUs: %s; %s; each copy needs %s (%s: %d)", worker.source, placement.describe_plan(copies),
             placement.gib(need.total), how, tokens)
    return copies
