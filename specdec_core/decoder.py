"""What every cache needs to know of a model's decoder, causal and encoder-decoder alike: its start and end ids, the
kinds of its layers (sliding windows, layers a key/value cache cannot hold), its position modules and the hooks that
place each row's positions, the lock that keeps one thread's hooked pass from another's, and whether it takes
`logits_to_keep`. Nothing here is specific to one architecture.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from functools import cache

import torch
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, ModelOutput


@cache
def _accepts_logits_to_keep(model_cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_cls.forward).parameters


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: a timer around a GPU pass must, as the call returns early."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decoder_start(config, generation_config) -> int | None:
    """generate()'s first decoder token: the generation config's start token, else its bos token; then the config's."""
    tried = [getattr(generation_config, name, None) for name in ("decoder_start_token_id", "bos_token_id")]
    start = next((s for s in [*tried, getattr(config, "decoder_start_token_id", None)] if s is not None), None)
    return start[0] if isinstance(start, list) else start


def initial_decoder_ids(model: PreTrainedModel, prompt_ids: list[int]) -> list[int]:
    """The token sequence the decoder starts from: the prompt, or the decoder start token."""
    if not model.config.is_encoder_decoder:
        return list(prompt_ids)
    if (start := decoder_start(model.config, model.generation_config)) is None:
        raise ValueError(f"{type(model).__name__} has no decoder_start_token_id in its config")
    return [int(start)]


_OUTPUT_CLASS: dict[type, type] = {}  # a model class's encoder output class, once `run_encoder` ran one


def run_encoder(model: PreTrainedModel, **inputs) -> ModelOutput:
    _OUTPUT_CLASS[type(model)] = type(out := model.get_encoder()(**inputs, return_dict=True))
    return out


def encoder_output(model: PreTrainedModel, hidden: torch.Tensor) -> ModelOutput:
    """`hidden` in the model's own encoder output class: Switch's and NLLB-MoE's decoders read router logits there."""
    return _OUTPUT_CLASS.get(type(model), BaseModelOutput)(last_hidden_state=hidden)


def shape_only_hidden(model: PreTrainedModel, rows: int, columns: int) -> torch.Tensor:
    """Encoder outputs in shape only: cross-attention reads its cached keys/values, never these."""
    text = model.config.get_text_config(decoder=True)
    d = getattr(text, "d_model", None) or text.hidden_size
    return torch.zeros((), dtype=model.dtype, device=model.device).expand(rows, columns, d)


def eos_ids(model: PreTrainedModel) -> set[int]:
    """The ids that end a generation: the generation config's, as generate() reads them (a model config's own
    eos_token_id does not end generate() when the generation config has none)."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, list) else [eos])}


_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pass_lock(model: PreTrainedModel) -> threading.RLock:
    """The lock of `model`'s hooked passes (`hooked` changes its modules for every caller), which an encoder-decoder's
    other passes take too, so none runs through another thread's hooks. Decoder-only models are never hooked."""
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
    """Whether a decoder position embedding is fairseq's sinusoidal one (M2M100, NLLB): it counts positions from the
    ids (a pad keeps the padding position) and grows its table by a check on the host, which a capture cannot do
    (`table_by_row` looks them up on the device instead)."""
    return (callable(getattr(module, "create_position_ids_from_input_ids", None))
            and callable(getattr(module, "get_embedding", None))
            and isinstance(getattr(module, "weights", None), torch.Tensor)
            and isinstance(getattr(module, "padding_idx", None), int))


def position_table(module: torch.nn.Module) -> bool:
    """Whether a decoder position embedding is a table of one row per position (`nn.Embedding`: BART's, LED's,
    Marian's sinusoids), which static caches look up at each row's positions. Its own forward, where the decoder
    passes no position ids (LED, MVP), counts them with `torch.arange` from the cache length read on the host (a
    capture cannot) and gives every row the same positions."""
    return isinstance(module, torch.nn.Embedding) and not counts_positions_from_ids(module)


def fed_alone(module: torch.nn.Module):
    """A `counts_positions_from_ids` embedding's forward for eager passes of several tokens: each token embedded as
    if fed alone after the cache, as `generate()` feeds them. Its own forward counts over the whole pass, so a pad
    inside it would move every later token back a position; here a pad keeps the padding position and moves nothing
    (the module's own forward still runs, growing its table)."""
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
    """While a pass of `model` runs: relative-bias modules' `compute_bias` and position modules' forward replaced by
    `biases[m]` and `forwards[m]`, restored after. They change the model for every caller, so such passes, and an
    encoder-decoder's other passes, run one at a time (`pass_lock`)."""
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


def sliding_window(config) -> int | None:
    """The sliding window (tokens) of a model whose decoder has such layers, or None; read from the decoder's text
    config, where multimodal (Gemma 3 4B and up) and encoder-decoder (T5Gemma) models keep it."""
    text = config.get_text_config(decoder=True)
    window = getattr(text, "sliding_window", None)
    if not window or not getattr(text, "use_sliding_window", True):
        return None
    types = getattr(text, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return None
    return int(window)


def other_layer_kinds(config) -> list[str]:
    """Layer kinds other than full and sliding-window attention (chunked or linear attention, state-space layers):
    neither padded batches nor static caches take them. GPT-Neo's local layers count their window in cache columns
    (a fixed bias no mask undoes), which only a growing one-row cache keeps equal to positions."""
    text = config.get_text_config(decoder=True)
    kinds = set(getattr(text, "layer_types", None) or ())
    if "local" in (getattr(text, "attention_layers", None) or ()):
        kinds.add("local_attention")
    return sorted(kinds - {"full_attention", "sliding_attention"})


def own_kv_layers(config, layers: int) -> list[int]:
    """The decoder layers that keep keys/values of their own: all but those that reuse an earlier
    layer's (`kv_sharing_modes` "reuse": Gemma 3n's last layers), which a cache never holds."""
    modes = getattr(config.get_text_config(decoder=True), "kv_sharing_modes", None) or ()
    return [i for i in range(layers) if i >= len(modes) or modes[i] != "reuse"]


def mixed_layer_types(config) -> list[str] | None:
    """Per layer, its attention kind, for a model mixing full and sliding-window layers (Gemma 2/3, Qwen2 past
    `max_window_layers`): a 4D mask per kind. None where all are alike (Mistral's one mask ignores `layer_types`)."""
    types = getattr(config.get_text_config(decoder=True), "layer_types", None)
    return list(types) if types and len(set(types)) > 1 else None


def bias_by_row(module, queries: Callable[[], torch.Tensor], keys) -> Callable:
    """A relative-bias module's `compute_bias` looking up, per row, its class's bias of every distance (never patched
    in place) at each query's and key's true position: `queries()` -> (rows, q); `keys(key_length)` -> (key positions
    broadcastable to (rows, q, key_length), the number of distances to tabulate, above any that occurs)."""
    original = type(module).compute_bias

    def compute_bias(query_length, key_length, device=None, past_seen_tokens=0):
        key_positions, top = keys(key_length)
        table = original(module, 1, top, device=device, past_seen_tokens=top - 1)[0, :, 0]  # (heads, top)
        distance = (key_positions - queries()[:, :, None]).clamp(1 - top, 0) + top - 1  # query after key
        return table[:, distance.to(table.device)].permute(1, 0, 2, 3)  # (rows, heads, queries, keys)
    return compute_bias


def table_by_row(module: torch.nn.Module, positions: Callable[[], torch.Tensor], tables: dict) -> Callable:
    """A `counts_positions_from_ids` embedding's forward for static caches (its own compares a device length with its
    table's size on the host): the module's count for each token fed alone at `positions()`, as `generate()` feeds
    it (a pad id keeps the padding position, moving no later token), in the cache's copy of its table
    (`tables[module]`, which stays put while an eager pass elsewhere grows the module's own)."""
    def forward(input_ids=None, inputs_embeds=None, cache_length=0):
        at = positions()
        if input_ids is not None:
            ids = module.create_position_ids_from_input_ids(input_ids.reshape(-1, 1), module.padding_idx,
                                                            at.reshape(-1, 1))
        else:
            ids = module.create_position_ids_from_inputs_embeds(
                inputs_embeds.reshape(-1, 1, inputs_embeds.shape[-1]), at.reshape(-1, 1), module.padding_idx)
        table = tables[module]
        return table.index_select(0, ids.view(-1)).view(*at.shape, table.shape[-1])
    return forward


def lookup_by_row(module: torch.nn.Module, positions: Callable[[], torch.Tensor]) -> Callable:
    """A `position_table` embedding's forward for static caches: its rows at `positions()` past its `offset` (BART's
    table has two rows first); pads repeat their row's last position, so none passes the table."""
    offset = int(getattr(module, "offset", 0))

    def forward(*args, **kwargs):
        return torch.nn.functional.embedding(positions() + offset, module.weight)
    return forward


def table_size(module: torch.nn.Module) -> int | None:
    """The positions a learned or fixed position table embeds (BART's holds 2 more rows than it
    has positions), or None for one that grows (M2M100's) or that is no table."""
    return module.num_embeddings - int(getattr(module, "offset", 0)) if position_table(module) else None
