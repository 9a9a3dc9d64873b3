"""A transformers `Cache` whose layers append in place, for the verify loop (`growing_cache`).

transformers' `DynamicLayer` appends with `torch.cat`, copying every layer's whole cache on every forward.
`GrowingLayer` writes into spare columns of a buffer and keeps `keys`/`values` as views of the valid prefix, so
attention, `crop` and masks are untouched; keys/values assigned from outside are adopted into a new buffer on the
next update, and `adopt` takes buffers filled elsewhere (`BatchKV.merge`)
(docs/performance.md, "What the engine does for speed").
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

MIN_SPARE = 256  # columns allocated beyond what a growth needs


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose appends write into preallocated spare columns."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def _holds_prefix(self, new: torch.Tensor) -> bool:
        """Whether keys/values are still views of the buffers' prefix, with room for the new columns behind them."""
        buf, keys = self._kbuf, self.keys
        return (buf is not None and keys.dim() == 4 and keys.data_ptr() == buf.data_ptr()
                and keys.shape[0] == new.shape[0] <= buf.shape[0] and keys.shape[1] == buf.shape[1] == new.shape[1]
                and keys.stride() == buf.stride()
                and self.values.data_ptr() == self._vbuf.data_ptr()
                and keys.shape[-2] + new.shape[-2] <= buf.shape[-2])

    @staticmethod
    def buffers_for(keys: torch.Tensor, values: torch.Tensor, need: int, rows: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Empty buffers like keys/values (rows, heads, _, dim): `rows` rows (default keys'), `need` columns + spare."""
        columns = need + max(MIN_SPARE, need // 2)
        rows = keys.shape[0] if rows is None else rows
        return (keys.new_empty((rows, keys.shape[1], columns, keys.shape[-1])),
                values.new_empty((rows, values.shape[1], columns, values.shape[-1])))

    def adopt(self, kbuf: torch.Tensor, vbuf: torch.Tensor, columns: int) -> None:
        """Take these buffers as the cache, their first `columns` columns holding it."""
        if not self.is_initialized:
            self.lazy_initialization(kbuf, vbuf)
        self._kbuf, self._vbuf = kbuf, vbuf
        self.keys, self.values = kbuf[:, :, :columns], vbuf[:, :, :columns]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if not self._holds_prefix(key_states):  # new buffers holding the prefix, with room for the new columns and more
            old = self.keys.shape[-2] if self.keys.dim() == 4 else 0
            kbuf, vbuf = self.buffers_for(key_states, value_states, old + key_states.shape[-2])
            if old:
                kbuf[:, :, :old].copy_(self.keys)
                vbuf[:, :, :old].copy_(self.values)
            self.adopt(kbuf, vbuf, old)
        rows, start = self.keys.shape[0], self.keys.shape[-2]
        end = start + key_states.shape[-2]
        self._kbuf[:rows, :, start:end].copy_(key_states)
        self._vbuf[:rows, :, start:end].copy_(value_states)
        self.keys, self.values = self._kbuf[:rows, :, :end], self._vbuf[:rows, :, :end]
        return self.keys, self.values

    def reset(self) -> None:
        self._kbuf = self._vbuf = None
        super().reset()


def growing_cache() -> Cache:
    """A transformers `Cache` made of `GrowingLayer`s (one per decoder layer, created on first use)."""
    return Cache(layer_class_to_replicate=GrowingLayer)
