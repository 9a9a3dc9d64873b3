"""A `DynamicCache` that appends in place, for the verify loop.

transformers' `DynamicLayer` appends a step's keys and values with `torch.cat`, which copies
the whole cache of every layer on every forward: on the 325M bench target (CPU, 1 thread,
`benchmarks/cache_inplace.py`) avoiding it makes a pass 2-3% faster at 112 tokens of context
and 10-11% at 512, and the copy grows with the rows of a batch too. `GrowingLayer` keeps each
layer's cache in a buffer with spare columns and writes a step's columns into them;
`keys`/`values` stay what transformers expects (the valid prefix, as a view), so attention,
`crop`, masks and `get_seq_length` are untouched. The buffer grows by half its size when full,
so the copies are amortised.

Anything that assigns `keys`/`values` from outside (batch row selection, `BatchKV.merge`) just
replaces the prefix; the next update sees it is no longer a view of the buffer and adopts it
into a new one. Values are the same numbers `torch.cat` would produce.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, EncoderDecoderCache
from transformers.cache_utils import DynamicLayer

MIN_SPARE = 256  # columns allocated beyond what a growth needs


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose appends write into preallocated spare columns."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def _holds_prefix(self, new: torch.Tensor) -> bool:
        """True when keys/values are still views of the buffers' first columns, and the new
        columns fit behind them."""
        buf, keys = self._kbuf, self.keys
        return (buf is not None and keys.dim() == 4 and keys.data_ptr() == buf.data_ptr()
                and keys.shape[:2] == buf.shape[:2] == new.shape[:2] and keys.stride() == buf.stride()
                and self.values.data_ptr() == self._vbuf.data_ptr()
                and keys.shape[-2] + new.shape[-2] <= buf.shape[-2])

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """New buffers holding the current prefix, with room for the new columns and more."""
        old = self.keys.shape[-2] if self.keys.dim() == 4 else 0
        need = old + key_states.shape[-2]
        columns = need + max(MIN_SPARE, need // 2)
        kbuf = key_states.new_empty((*key_states.shape[:2], columns, key_states.shape[-1]))
        vbuf = value_states.new_empty((*value_states.shape[:2], columns, value_states.shape[-1]))
        if old:
            kbuf[:, :, :old].copy_(self.keys)
            vbuf[:, :, :old].copy_(self.values)
        self._kbuf, self._vbuf = kbuf, vbuf
        self.keys, self.values = kbuf[:, :, :old], vbuf[:, :, :old]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if not self._holds_prefix(key_states):
            self._grow(key_states, value_states)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        self._kbuf[:, :, start:end].copy_(key_states)
        self._vbuf[:, :, start:end].copy_(value_states)
        self.keys, self.values = self._kbuf[:, :, :end], self._vbuf[:, :, :end]
        return self.keys, self.values

    def reset(self) -> None:
        self._kbuf = self._vbuf = None
        super().reset()


class GrowingCache(DynamicCache):
    """`DynamicCache` made of `GrowingLayer`s (one per decoder layer, created on first use)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_class_to_replicate = GrowingLayer


def new_cache(is_encoder_decoder: bool) -> DynamicCache | EncoderDecoderCache:
    """The cache a decoder starts from: in-place self-attention, and for encoder-decoder models a
    cross-attention cache that is written once."""
    if is_encoder_decoder:
        return EncoderDecoderCache(GrowingCache(), DynamicCache())
    return GrowingCache()
