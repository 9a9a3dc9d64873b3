"""What every cache needs to know of a model's decoder, causal and encoder-decoder alike: its
start and end ids, its position modules and the hooks that place each row's positions, the lock
that keeps one thread's hooked pass from another's, and whether it takes `logits_to_keep`.
Nothing here is specific to one architecture.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from contextlib import contextmanager
from functools import cache

import torch
from transformers import PreTrainedModel


@cache
def _accepts_logits_to_keep(model_cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_cls.forward).parameters


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: a timer around a GPU pass must, as the call returns early."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def initial_decoder_ids(model: PreTrainedModel, prompt_ids: list[int]) -> list[int]:
    """The token sequence the decoder starts from: the prompt, or the decoder start token."""
    if not model.config.is_encoder_decoder:
        return list(prompt_ids)
    start = model.generation_config.decoder_start_token_id
    if start is None:
        start = model.config.decoder_start_token_id
    if isinstance(start, list):
        start = start[0]
    if start is None:
        raise ValueError(f"{type(model).__name__} has no decoder_start_token_id in its config")
    return [int(start)]


def eos_ids(model: PreTrainedModel) -> set[int]:
    """The token ids that end a generation: the generation config's, as generate() reads them
    (a model config's own eos_token_id does not end its generate() when the generation config
    has none)."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, list) else [eos])}


_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pass_lock(model: PreTrainedModel) -> threading.RLock:
    """The lock of `model`'s passes that hook its modules (`hooked`: position embeddings
    and relative biases, changed for every caller while such a pass runs), which an
    encoder-decoder's other passes take too (here, in `BatchKV` and in static caches), so that
    none runs through another thread's hooks. Decoder-only models are never hooked."""
    return _LOCKS.setdefault(model, threading.RLock())


def decoder_position_modules(model: PreTrainedModel) -> tuple[list, list]:
    """An encoder-decoder's decoder modules that compute from its cache length: position
    embeddings (`embed_positions`) and relative position biases (`compute_bias`)."""
    embeds, biases = [], []
    for name, module in model.get_decoder().named_modules():
        if name.rsplit(".", 1)[-1] == "embed_positions":
            embeds.append(module)
        if getattr(module, "has_relative_attention_bias", False) and callable(getattr(module, "compute_bias", None)):
            biases.append(module)
    return embeds, biases


def counts_positions_from_ids(module: torch.nn.Module) -> bool:
    """Whether a decoder position embedding is fairseq's sinusoidal one (M2M100, NLLB): it counts
    positions from the token ids (a pad keeps the padding position) and the cache length, and
    compares them with its table's size on the host to grow it, which a capture cannot do with
    the device's length (`StaticKV._table_forward` looks them up on the device instead)."""
    return (callable(getattr(module, "create_position_ids_from_input_ids", None))
            and callable(getattr(module, "get_embedding", None))
            and isinstance(getattr(module, "weights", None), torch.Tensor)
            and isinstance(getattr(module, "padding_idx", None), int))


def position_table(module: torch.nn.Module) -> bool:
    """Whether a decoder position embedding is a table of one row per position (an
    `nn.Embedding`, learned like BART's and LED's or fixed like Marian's sinusoids), which static
    caches look up at each row's own positions (`StaticKV._lookup_forward`). Its own forward, where
    its decoder passes no position ids (LED's, MVP's), counts them from the cache length with
    `torch.arange`, which reads that length on the host (a capture cannot) and gives every row the
    same positions."""
    return isinstance(module, torch.nn.Embedding) and not counts_positions_from_ids(module)


def fed_alone(module: torch.nn.Module):
    """A `counts_positions_from_ids` embedding's forward for the eager passes of several tokens:
    each token's embedding as the module gives it fed alone after the cache's earlier tokens, as
    `generate()` feeds them. Its own forward counts over the whole pass, so a pad id inside a
    pass (a draft, or an output that holds one) would move every later token back a position:
    here a pad keeps the padding position and moves nothing. The module's own forward runs
    (growing its table as it does), over the ids with each pad counted."""
    own = type(module).forward

    def forward(input_ids=None, inputs_embeds=None, cache_length=0):
        if input_ids is None:  # (embeddings count every position)
            return own(module, input_ids, inputs_embeds, cache_length)
        pad = (input_ids == module.padding_idx)[..., None]
        counted = own(module, input_ids.masked_fill(pad[..., 0], module.padding_idx + 1), None, cache_length)
        return torch.where(pad, module.weights[module.padding_idx].to(counted), counted)
    return forward


@contextmanager
def hooked(model: PreTrainedModel, biases: dict, forwards: dict):
    """While a pass of `model` runs: each relative-bias module's `compute_bias` replaced by
    `biases[module]`, and each module of `forwards` (position embeddings) run as
    `forwards[module]` instead of its own forward. They change the model for every caller, so
    one such pass of a model runs at a time, and the other passes of an encoder-decoder model
    (growing caches, aligned padded passes, static caches) wait for it (`pass_lock`). An
    instance's own `compute_bias` or `forward` comes back after."""
    with pass_lock(model):
        patches = [(m, "compute_bias", f) for m, f in biases.items()]
        patches += [(m, "forward", f) for m, f in forwards.items()]
        saved = [(m, name, vars(m).get(name)) for m, name, _ in patches]
        try:
            for module, name, fn in patches:
                setattr(module, name, fn)
            yield
        finally:
            for module, name, before in saved:
                if before is None:
                    vars(module).pop(name, None)  # the class's own again
                else:
                    setattr(module, name, before)
