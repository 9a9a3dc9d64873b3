"""A static cache's layers as transformers cache layers: fixed buffers that a pass writes at each row's own columns
(`FixedLayer`), an encoder-decoder's cross-attention columns written once per prompt (`CrossLayer`), and the throw-away
self-attention of the pass that writes them (`ScratchLayer`). Their owner (`slot_kv.SlotKV`) sizes the buffers and
sets the columns a pass writes (`slots`); a pass over its first rows (new rows admitted together) writes and reads those
rows only."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import CacheLayerMixin

if TYPE_CHECKING:
    from specdec_core.slot_kv import SlotKV


def _first_rows(keys: torch.Tensor, values: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `rows` rows, where a pass writes; sliced even if all (testing `rows` fixes a compiled prefill's)."""
    return keys[:rows], values[:rows]


class Buffers(CacheLayerMixin):
    """One layer's keys/values in fixed buffers (rows, heads, columns, dim) sized by its owner."""

    is_compileable = True
    is_sliding = False

    def __init__(self, owner: SlotKV):
        super().__init__()
        self.owner = owner

    def size(self) -> tuple[int, int]:
        """(rows, columns) of the buffers."""
        raise NotImplementedError

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        rows, columns = self.size()
        self.keys = key_states.new_zeros((rows, key_states.shape[1], columns, key_states.shape[-1]))
        self.values = value_states.new_zeros((rows, value_states.shape[1], columns, value_states.shape[-1]))
        self.is_initialized = True

    def write(self, rows: torch.Tensor | slice, keys: torch.Tensor, values: torch.Tensor, clear: bool = False) -> None:
        """Columns 0..n-1 of these rows from (rows, heads, n, dim) keys/values; clear: zeros after them (a prompt's
        cross-attention columns, where a longer one's may remain)."""
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        n = keys.shape[2]
        for buffer, new in ((self.keys, keys), (self.values, values)):
            buffer[rows, :, :n] = new
            if clear:
                buffer[rows, :, n:] = 0

    def grow(self, keep: int) -> None:
        """Buffers of the owner's new `size`, holding the first `keep` columns."""
        if self.is_initialized:
            k, v = self.keys, self.values
            self.lazy_initialization(k, v)
            self.keys[:, :, :keep] = k[:, :, :keep]
            self.values[:, :, :keep] = v[:, :, :keep]


class FixedLayer(Buffers):
    """A decoder layer's own keys/values; a pass writes each row's tokens at its owner's `slots` (rows, width)."""

    def size(self) -> tuple[int, int]:
        return self.owner.buffer_rows, self.owner.capacity

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = _first_rows(self.keys, self.values, key_states.shape[0])
        slots = self.owner.slots[:, None, :, None]  # (rows, 1, width, 1): distinct columns per row
        keys.scatter_(2, slots.expand(-1, key_states.shape[1], -1, key_states.shape[-1]), key_states)
        values.scatter_(2, slots.expand(-1, value_states.shape[1], -1, value_states.shape[-1]), value_states)
        visible = self.owner.visible  # (all columns in a graph: `SlotKV._fit`)
        if visible < keys.shape[2]:
            return keys[:, :, :visible], values[:, :, :visible]
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.visible, 0

    def get_seq_length(self) -> int | torch.Tensor:
        # A graph would freeze a number read here: decoder-only models (position_ids, explicit mask) get 0; an
        # encoder-decoder's decoder counts positions (BART) or distances (T5) from this, so it gets the pass's first
        # position as a device tensor a replay updates (per row in slots: `SlotKV._starts`, `SlotKV._by_row`).
        return self.owner.seen

    def get_max_length(self) -> int:
        return self.owner.capacity


class CrossLayer(Buffers):
    """An encoder-decoder layer's cross-attention keys/values: the encoder's L columns, then zeros its mask hides.
    Written once per item (`SlotKV.encode_rows`), then only read."""

    def size(self) -> tuple[int, int]:
        return self.owner.buffer_rows, self.owner.enc_capacity

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized or self.keys.shape[2] != self.owner.enc_capacity:
            self.lazy_initialization(key_states, value_states)
        self.write(slice(0, key_states.shape[0]), key_states, value_states, clear=True)
        return _first_rows(self.keys, self.values, key_states.shape[0])

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.enc_capacity, 0

    def get_seq_length(self) -> int:
        # Filled before any pass reads it: the model reuses these, not computing them from encoder outputs it lacks.
        return self.owner.enc_capacity if self.is_initialized else 0

    def get_max_length(self) -> int:
        return self.owner.enc_capacity


class ScratchLayer(CacheLayerMixin):
    """Self-attention of `SlotKV.encode_rows`'s one-token decoder pass, run only for its cross-attention writes: the
    token sees itself, nothing is kept (a `DynamicCache` builds its start from host data, which no graph captures)."""

    is_compileable = False
    is_sliding = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0

    def get_seq_length(self) -> int:
        return 0

    def get_max_length(self) -> int:
        return -1
