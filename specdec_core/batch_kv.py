"""One decoder-only model's KV cache shared by rows of different lengths (continuous batching).

The cache is a `DynamicCache` (`kv_cache.GrowingCache`, appending in place) whose batch
dimension is the rows. Every forward appends the same number of columns to every row, so rows
that feed fewer tokens than the longest feed are right-padded; a 2D attention mask marks which
columns hold a row's valid tokens. Rejected drafts and pads become masked holes, positions are
explicit per row (a token's position is the number of valid tokens before it), and `compact`
gathers each row's valid columns again when the holes grow. Masked columns get exactly zero
attention weight, so a row's logits equal the row decoded alone up to float rounding (different
GEMM shapes sum in a different order).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from specdec_core.decoder import _accepts_logits_to_keep
from specdec_core.kv_cache import GrowingCache, GrowingLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (rows, heads, columns, dim)


class BatchKV:
    """Rows' valid cache columns (`cols[b]`, in sequence order) plus the cache and its mask."""

    def __init__(self, model: PreTrainedModel, rows: int = 0, pad_id: int = 0):
        self.model = model
        self.device = model.device
        self.pad_id = pad_id
        self.cache = GrowingCache()
        self.mask = torch.zeros((rows, 0), dtype=torch.long, device=self.device)
        self.cols: list[list[int]] = [[] for _ in range(rows)]

    @property
    def rows(self) -> int:
        return len(self.cols)

    @property
    def width(self) -> int:
        return self.cache.get_seq_length()

    def length(self, b: int) -> int:
        """Valid tokens of row b in the cache: the position of the next token it feeds."""
        return len(self.cols[b])

    @torch.inference_mode()
    def forward(self, feeds: list[list[int]], logits: bool = True) -> list[torch.Tensor]:
        """Feed each row its tokens (a row may feed none) in ONE model pass; return each row's
        float32 logits at its fed positions, (len(feeds[b]), V)."""
        assert len(feeds) == self.rows
        m = max((len(f) for f in feeds), default=0)
        if m == 0:
            return [torch.empty(0) for _ in feeds]
        width = self.width
        ids = torch.full((self.rows, m), self.pad_id, dtype=torch.long)
        pos = torch.empty((self.rows, m), dtype=torch.long)
        for b, f in enumerate(feeds):
            start = len(self.cols[b])
            ids[b, : len(f)] = torch.tensor(f, dtype=torch.long)
            # Pads repeat the last real position so that they never pass the context limit.
            pos[b] = start + torch.arange(m).clamp_max(max(len(f) - 1, 0))
        # Pads attend too (to themselves and the row's valid prefix, so no query sees an empty
        # row and no NaN enters the cache); they sit after the row's real tokens, so causality
        # hides them from those, and they become holes right after this pass.
        mask = torch.cat([self.mask, torch.ones((self.rows, m), dtype=torch.long, device=self.device)], dim=1)
        kwargs = {}
        if not logits and _accepts_logits_to_keep(type(self.model)):
            kwargs["logits_to_keep"] = 1  # a prefill: no logits wanted
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask, position_ids=pos.to(self.device),
                         past_key_values=self.cache, use_cache=True, **kwargs)
        new = torch.zeros((self.rows, m), dtype=torch.long, device=self.device)
        for b, f in enumerate(feeds):
            new[b, : len(f)] = 1
            self.cols[b].extend(range(width, width + len(f)))
        self.mask = torch.cat([self.mask, new], dim=1)
        if not logits:
            return []
        return [out.logits[b, : len(f)].float() for b, f in enumerate(feeds)]

    @torch.inference_mode()
    def rollback(self, b: int, length: int) -> None:
        """Row b keeps its first `length` valid tokens; the columns after become holes."""
        if length < len(self.cols[b]):
            self.mask[b, self.cols[b][length:]] = 0
            del self.cols[b][length:]

    def wasted(self) -> int:
        """Columns that no row needs: the cache width beyond the longest row."""
        return self.width - max((len(c) for c in self.cols), default=0)

    @torch.inference_mode()
    def drop(self, gone: list[int]) -> list[int]:
        """Remove these rows. The last rows that stay move into the places of those that go and
        the cache's row view is narrowed, so only the moved rows are copied (gathering the rows
        that stay copied the whole cache, and the next pass copied it again into a buffer with
        room). Returns the new order: row i is the old row order[i]."""
        gone_set = set(gone)
        n = self.rows - len(gone_set)
        holes = sorted(b for b in gone_set if b < n)
        movers = [b for b in range(n, self.rows) if b not in gone_set]
        order = list(range(n))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        if holes:
            dst = torch.tensor(holes, dtype=torch.long, device=self.device)
            src = torch.tensor(movers, dtype=torch.long, device=self.device)
            for k, v in self._layers():
                k[dst] = k[src]
                v[dst] = v[src]
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[:n], layer.values[:n]
        self.mask = self.mask[order]
        self.cols = [self.cols[i] for i in order]
        return order

    @torch.inference_mode()
    def place(self, slots: list[int], fresh: BatchKV) -> None:
        """Write `fresh`'s rows over these rows (whose items have left, or which have no cache
        yet), right-aligned at this cache's width; their old columns become holes. The rows that
        go on are not copied, which is what makes refilling a finished row cheaper than `drop`
        then `merge`."""
        assert len(slots) == fresh.rows
        need = max((len(c) for c in fresh.cols), default=0)
        mine, theirs = self._layers(), fresh._layers()
        if theirs and not mine:  # no pass ran here, so every row is empty: start at no columns
            for i, (fk, fv) in enumerate(theirs):
                self.cache.update(fk.new_zeros((self.rows, fk.shape[1], 0, fk.shape[3])),
                                  fv.new_zeros((self.rows, fv.shape[1], 0, fv.shape[3])), i)
            mine = self._layers()
        if need > self.width:
            self._widen(need - self.width)
            mine = self._layers()
        width = self.width
        index = [torch.tensor(c, dtype=torch.long, device=self.device) for c in fresh.cols]
        for (k, v), (fk, fv) in zip(mine, theirs, strict=True) if theirs else ():  # none: one-token prompts
            for j, (slot, cols) in enumerate(zip(slots, index, strict=True)):
                k[slot, :, width - len(cols):] = fk[j, :, cols]
                v[slot, :, width - len(cols):] = fv[j, :, cols]
        for j, slot in enumerate(slots):
            n = len(fresh.cols[j])
            self.mask[slot] = 0
            self.mask[slot, width - n:] = 1
            self.cols[slot] = list(range(width - n, width))

    def _widen(self, n: int) -> None:
        """n more columns for every row, all holes (zeros: a masked column must not hold NaN)."""
        for layer in self.cache.layers:
            if layer.is_initialized:
                k, v = layer.keys, layer.values
                layer.update(k.new_zeros((*k.shape[:2], n, k.shape[3])), v.new_zeros((*v.shape[:2], n, v.shape[3])))
        self.mask = torch.cat([self.mask, self.mask.new_zeros((self.rows, n))], dim=1)

    def _layers(self) -> KV:
        return [(layer.keys, layer.values) for layer in self.cache.layers if layer.is_initialized]

    def _gather_into(self, kv: tuple[torch.Tensor, torch.Tensor] | None, width: int, k_out: torch.Tensor,
                     v_out: torch.Tensor, index: torch.Tensor | None) -> None:
        """One layer's keys/values of this cache (None: it never ran a pass) with every row's
        valid columns right-aligned in `width` columns (left padding, zeros), into k_out/v_out."""
        if kv is None or not kv[0].shape[2]:  # no pass ran, or none left columns: rows empty
            k_out.zero_()
            v_out.zero_()
            return
        k, v = kv
        if index is None:  # every column valid (prompts of one length): already aligned
            k_out.copy_(k)
            v_out.copy_(v)
            return
        torch.gather(k, 2, index[:, None, :, None].expand(self.rows, k.shape[1], width, k.shape[3]), out=k_out)
        torch.gather(v, 2, index[:, None, :, None].expand(self.rows, v.shape[1], width, v.shape[3]), out=v_out)

    def _alignment(self, width: int) -> torch.Tensor | None:
        """For each row, the cache column that goes to each of `width` right-aligned columns
        (0 for padding, masked anyway); None when the cache is aligned already."""
        if self.width == width and all(len(c) == width for c in self.cols):
            return None
        index = torch.zeros((self.rows, width), dtype=torch.long, device=self.device)
        for b, c in enumerate(self.cols):
            if c:
                index[b, width - len(c):] = torch.tensor(c, dtype=torch.long)
        return index

    def _aligned_mask(self, width: int) -> tuple[torch.Tensor, list[list[int]]]:
        mask = torch.zeros((self.rows, width), dtype=torch.long, device=self.device)
        cols = []
        for b, c in enumerate(self.cols):
            mask[b, width - len(c):] = 1
            cols.append(list(range(width - len(c), width)))
        return mask, cols

    def compact(self) -> None:
        """Drop the holes: each row's valid columns, right-aligned in the longest row's width."""
        self.merge(BatchKV(self.model, 0, self.pad_id))

    @torch.inference_mode()
    def merge(self, *others: BatchKV) -> None:
        """Append the rows of `others` (e.g. freshly prefilled prompts, one cache per prefill
        pass) after this cache's rows, compacting all on the way: each part is gathered straight
        into the new cache's buffer, which keeps spare columns for the next appends."""
        every = [kv for kv in (self, *others) if kv.rows]
        width = max((len(c) for kv in every for c in kv.cols), default=0)
        holder = next((kv for kv in (self, *others) if kv._layers()), None)
        if holder is None:  # no cache has run a pass yet (one-token prompts): nothing to move
            self.mask = torch.zeros((sum(kv.rows for kv in every), 0), dtype=torch.long, device=self.device)
            self.cols = [c for kv in every for c in kv.cols]
            return
        indexes = [kv._alignment(width) for kv in every]
        if len(every) > 1 or indexes[0] is not None:  # else: aligned already, keep its buffer
            rows = sum(kv.rows for kv in every)
            layers = [layer for layer in holder.cache.layers if layer.is_initialized]
            layers_of = [kv._layers() for kv in every]
            for i, (layer, (k, v)) in enumerate(zip(layers, holder._layers(), strict=True)):
                kbuf, vbuf = GrowingLayer.buffers_for(k, v, width, rows)
                start = 0
                for kv, own, index in zip(every, layers_of, indexes, strict=True):
                    part = slice(start, start + kv.rows)
                    kv._gather_into(own[i] if own else None, width, kbuf[part, :, :width], vbuf[part, :, :width],
                                    index)
                    start += kv.rows
                layer.adopt(kbuf, vbuf, width)
        masks = [kv._aligned_mask(width) for kv in every]
        self.cache = holder.cache
        self.mask = torch.cat([m for m, _ in masks], dim=0)
        self.cols = [c for _, cols in masks for c in cols]
