"""Where the pairs of one worker go: one copy of the pair per GPU, or a pair split over several.

Pure planning over a list of GPUs (a fake list in tests, `visible_gpus()` on a worker) and an
estimate of what a pair needs (weights from the config's parameter count and dtype, KV cache for
the rows decoded together), so the launcher can refuse a pair that cannot fit before any work
and a worker can lay its copies out the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

GIB = 1024**3
DEVICE_MAPS = ("none", "auto")
USABLE = 0.9  # of each GPU's memory; the rest, and CONTEXT_BYTES, for the CUDA context and workspace
CONTEXT_BYTES = 1 * GIB
SPLIT_FILL = 0.8  # --device_map auto: weights fill at most this much of a copy's GPUs
DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


@dataclass(frozen=True)
class Gpu:
    name: str  # "cuda:K"
    total_bytes: int


@dataclass(frozen=True)
class Copy:
    """One copy of the pair: the target over `devices` (split in order), the draft and the input ids on the first."""

    devices: tuple[str, ...]

    def describe(self) -> str:
        return "+".join(self.devices)


class DeviceLost(RuntimeError):
    """A GPU of this process fails every call since an error that CUDA keeps (an illegal memory
    access, a device-side assert): no row can be decoded in this process any more."""


def device_failed(e: BaseException) -> bool:
    """A CUDA error, which may have left the device failing every later call of the process
    (`check_device` tells); running out of memory never does."""
    if isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e):
        return False
    # (torch.AcceleratorError from torch 2.8; before, a RuntimeError saying so)
    return isinstance(e, getattr(torch, "AcceleratorError", ())) or (isinstance(e, RuntimeError)
                                                                      and "CUDA error" in str(e))


def device_works(devices: list[torch.device]) -> bool:
    """Whether a tiny kernel still runs on each of these GPUs (CPUs always work)."""
    try:
        for d in devices:
            if d.type == "cuda":
                torch.ones(1, device=d).add_(1)
                torch.cuda.synchronize(d)
    except Exception:  # (the error CUDA kept, raised again)
        return False
    return True


def check_device(e: Exception, devices: list[torch.device]) -> None:
    """Raises `DeviceLost` from `e` when it is a CUDA error after which the devices fail every
    call; else returns, and `e` is one row's error (an input's shape, say), failing that row only."""
    if device_failed(e) and not device_works(devices):
        first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        raise DeviceLost(f"{', '.join(map(str, devices))} fail every call since {type(e).__name__}: {first}") from e


def visible_gpus() -> list[Gpu]:
    """The GPUs torch sees, with their memory; [] without CUDA (no CUDA context is created)."""
    if not torch.cuda.is_available():
        return []
    return [Gpu(f"cuda:{i}", torch.cuda.get_device_properties(i).total_memory)
            for i in range(torch.cuda.device_count())]


def usable_bytes(gpu: Gpu) -> int:
    return max(0, int(gpu.total_bytes * USABLE) - CONTEXT_BYTES)


def device_capacity(device: str) -> int:
    """Bytes a split may place on `device`: a GPU's usable memory (as planned), or the host's available memory."""
    d = torch.device(device)
    if d.type == "cuda":
        index = torch.cuda.current_device() if d.index is None else d.index
        return usable_bytes(Gpu(device, torch.cuda.get_device_properties(index).total_memory))
    import psutil

    return psutil.virtual_memory().available


@dataclass(frozen=True)
class Footprint:
    """Bytes a pair needs: each model's weights and KV cache, and the largest block, which a split cannot cut."""

    target_weights: int
    draft_weights: int
    target_kv: int
    draft_kv: int
    largest_block: int
    target_params: int = 0
    graphs: int = 0  # what CUDA graphs keep besides the caches: their passes' logits
    prefill: int = 0  # of the KV caches: the new rows' prefill caches'
    prefill_rows: int = 0  # the rows they hold (at most the batch; 0: as much whatever the batch)

    @property
    def total(self) -> int:
        return self.target_weights + self.draft_weights + self.target_kv + self.draft_kv + self.graphs

    @property
    def draft(self) -> int:
        return self.draft_weights + self.draft_kv


def check_device_map(device_map: str) -> None:
    if device_map not in DEVICE_MAPS:
        raise ValueError(f"--device_map {device_map!r}: expected one of {', '.join(DEVICE_MAPS)}")


def gpus_per_copy(gpus: list[Gpu], need: Footprint | None) -> int:
    """The fewest GPUs (each counted as the smallest) whose SPLIT_FILL holds the weights and whose first holds the
    draft beside the largest layer; all when the need is unknown or too much. Weights only, so a worker (which cannot
    know the longest prompt) plans as the launcher does; the launcher's fit check adds the KV cache."""
    if need is None or not gpus:
        return max(1, len(gpus))
    smallest = min(usable_bytes(g) for g in gpus)
    weights = need.target_weights + need.draft_weights
    if need.draft + need.largest_block > smallest:
        return len(gpus)
    return next((g for g in range(1, len(gpus)) if weights <= g * smallest * SPLIT_FILL), len(gpus))


def plan_copies(device: str, device_map: str, gpus: list[Gpu], need: Footprint | None = None) -> list[Copy]:
    """The copies of the pair a worker with these GPUs runs.

    `--device cpu` (or `auto` without a GPU): one on the CPU; `cuda:K`: one on that GPU; `cuda` or `auto`: one per
    GPU, or with `--device_map auto` one per group of the fewest GPUs holding its weights (a GPU left over idles)."""
    check_device_map(device_map)
    if device == "cpu" or (device == "auto" and not gpus):
        return [Copy(("cpu",))]
    names = [g.name for g in gpus]
    if device not in ("auto", "cuda"):
        if torch.device(device).type != "cuda":
            raise ValueError(f"--device {device}: expected auto, cpu, cuda or cuda:N")
        if device not in names:
            raise ValueError(f"--device {device}: this machine has {len(gpus)} GPU(s)"
                             + (f" ({', '.join(names)})" if names else ""))
        return [Copy((device,))]
    if not gpus:
        raise ValueError(f"--device {device}: CUDA is not available on this machine")
    if device_map == "none":
        return [Copy((name,)) for name in names]
    per = gpus_per_copy(gpus, need)
    return [Copy(tuple(names[i:i + per])) for i in range(0, len(names) - per + 1, per)]


# --- what a pair needs, from configs alone -------------------------------------------------


def parameter_count(config: PretrainedConfig, trust_remote_code: bool = False) -> tuple[int, int]:
    """(parameters, parameters of the largest repeated block), counted on a model built on the
    meta device: exact for any architecture transformers can build, and no weight is read."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config, trust_remote_code=trust_remote_code)
    unique = {id(p): p.numel() for p in model.parameters()}
    # (the classes a device map never cuts, as accelerate reads them)
    kinds = set(getattr(model, "_no_split_modules", None) or ())
    block = max((sum(p.numel() for p in m.parameters()) for m in model.modules() if type(m).__name__ in kinds),
                default=0)
    return sum(unique.values()), block


def decoder_layers(config: PretrainedConfig) -> int:
    """The decoder's layer count (a T5's `num_hidden_layers` counts its encoder's)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return (getattr(text, "num_decoder_layers", None) if text.is_encoder_decoder else None) or next(
        (v for a in ("num_hidden_layers", "n_layer", "num_layers", "decoder_layers")
         if isinstance(v := getattr(text, a, None), int)), 0)


def _kv_width(config: PretrainedConfig) -> int:
    """Key and value elements one token takes in the cache, over the decoder layers keeping their own (not Gemma 3n's
    last ones), layer by layer where layers have their own shapes (Gemma 4's full-attention head dim)."""
    from specdec_core.decoder import own_kv_layers

    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    layers = own_kv_layers(config, decoder_layers(config))
    each = text.per_layer_config if getattr(text, "is_heterogeneous", False) else None

    def width(c: PretrainedConfig) -> int:
        heads = next((v for a in ("num_attention_heads", "n_head", "num_heads", "decoder_attention_heads")
                      if isinstance(v := getattr(c, a, None), int)), 1)
        kv_heads = getattr(c, "num_key_value_heads", None) or heads
        hidden = next((v for a in ("hidden_size", "n_embd", "d_model") if isinstance(v := getattr(c, a, None), int)), 0)
        return 2 * kv_heads * (getattr(c, "head_dim", None) or getattr(c, "d_kv", None) or hidden // max(heads, 1))
    return sum(width(each[i]) for i in layers) if each is not None else len(layers) * width(text)


def kv_bytes(config: PretrainedConfig, rows: int, prompt_tokens: int, new_tokens: int, dtype: torch.dtype) -> int:
    """Keys and values for `rows` rows: a decoder-only model caches prompt + output; an
    encoder-decoder caches the output (self-attention) and the prompt (cross-attention)."""
    return rows * _kv_width(config) * DTYPE_BYTES.get(dtype, 4) * (prompt_tokens + new_tokens)


def footprint(target: PretrainedConfig, draft: PretrainedConfig | None, dtype: torch.dtype, *, rows: int,
              prompt_tokens: int, new_tokens: int, trust_remote_code: bool = False) -> Footprint:
    """What one copy of the pair needs (`draft` None: no draft model)."""
    size = DTYPE_BYTES.get(dtype, 4)
    params, block = parameter_count(target, trust_remote_code)
    draft_params = parameter_count(draft, trust_remote_code)[0] if draft is not None else 0
    return Footprint(target_weights=params * size, draft_weights=draft_params * size,
                     target_kv=kv_bytes(target, rows, prompt_tokens, new_tokens, dtype),
                     draft_kv=kv_bytes(draft, rows, prompt_tokens, new_tokens, dtype) if draft is not None else 0,
                     largest_block=block * size, target_params=params)


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def fit_problem(need: Footprint, gpus: list[Gpu], copies: list[Copy], *, batch_size: int, device_map: str,
                tokens: int) -> str | None:
    """One line naming the culprit flag when a copy cannot fit its GPUs, else None."""
    by_name = {g.name: g for g in gpus}
    copy = copies[0]
    if copy.devices == ("cpu",) or any(d not in by_name for d in copy.devices):
        return None
    held = sum(usable_bytes(by_name[d]) for d in copy.devices)
    one = min(usable_bytes(by_name[d]) for d in copy.devices)
    where = (f"{len(copy.devices)} GPUs of {gib(held)} usable together" if len(copy.devices) > 1
             else f"one GPU's {gib(held)} usable ({gib(by_name[copy.devices[0]].total_bytes)} total)")
    draft = f"draft {gib(need.draft_weights)}" if need.draft_weights else "no draft model"
    what = (f"the pair needs {gib(need.total)} (weights: target {gib(need.target_weights)} for "
            f"{need.target_params / 1e9:.2f}B parameters, {draft}; KV cache "
            f"{gib(need.target_kv + need.draft_kv)} for {batch_size} row(s) of {tokens} tokens"
            + (f"; CUDA graphs' logits {gib(need.graphs)}" if need.graphs else "") + ")")
    if need.total <= held and need.draft + need.largest_block <= one:
        return None
    weights = need.target_weights + need.draft_weights
    split = device_map == "none" and need.total <= sum(usable_bytes(g) for g in gpus) and len(gpus) > 1
    if weights > held or need.draft + need.largest_block > one:
        if split:
            return f"--device_map: {what}, more than {where}; pass --device_map auto to split it over the GPUs"
        wide = need.target_weights > 2 * need.target_params  # (wider than 16 bits a parameter)
        return (f"--target_model: {what}, more than {where}; use larger or more GPUs per worker"
                + (", or a smaller --dtype" if wide else ""))
    per_row = max(1, (need.target_kv + need.draft_kv - need.prefill + need.graphs) // batch_size)
    fixed, each = (0, need.prefill // need.prefill_rows) if need.prefill_rows else (need.prefill, 0)
    rows = max((b for b in range(1, batch_size)  # (a smaller batch prefills fewer rows together)
                if weights + fixed + b * per_row + min(b, need.prefill_rows) * each <= held), default=0)
    if rows == 0:
        return (f"--max_new_tokens: {what}, more than {where}: not one row of {tokens} tokens (the longest "
                "prompt and --max_new_tokens) fits beside the weights; lower --max_new_tokens, "
                + ("or pass --device_map auto" if split else "or use larger GPUs"))
    return (f"--batch_size {batch_size}: {what}, more than {where}; use --batch_size {rows} or less"
            + (", or --device_map auto" if split else ""))


def describe_plan(copies: list[Copy]) -> str:
    """The log and provenance line naming the device of every copy."""
    return f"{len(copies)} cop{'y' if len(copies) == 1 else 'ies'} of the pair: " + ", ".join(
        f"copy {i} on {c.describe()}" for i, c in enumerate(copies))
