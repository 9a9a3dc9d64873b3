"""One model's KV cache shared by rows of different lengths (continuous batching).

A `kv_cache.growing_cache()` whose batch dimension is the rows: feeds shorter than the longest are right-padded, a 2D
mask marks each row's valid columns (pads and rejected drafts become holes that `merge` gathers away) and
positions are explicit per row, so a row's logits equal the row decoded alone up to float rounding. Models that
compute from cache columns (position tables, relative biases, sliding windows) get each row's true positions here
(`_true_positions`, `_window_masks`); encoder-decoder rows carry their cross-attention keys/values
(docs/batching.md, "Rows whose model computes from cache columns").
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import MethodType

import torch
from transformers import DynamicCache, EncoderDecoderCache, PreTrainedModel
from transformers.modeling_outputs import ModelOutput

from specdec_core.decoder import (
    _accepts_logits_to_keep,
    bias_by_row,
    counts_positions_from_ids,
    decoder_position_modules,
    encoder_output,
    fed_alone,
    hooked,
    initial_decoder_ids,
    mixed_layer_types,
    pass_lock,
    run_encoder,
    shape_only_hidden,
    sliding_window,
    table_size,
)
from specdec_core.kv_cache import GrowingLayer, growing_cache

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (rows, heads, columns, dim)


def drop_order(rows: int, gone: list[int]) -> list[int]:
    """The rows that stay after `gone` leave, in their new order: the last rows that stay move
    into the places of those that go (row i is the old row order[i])."""
    gone_set = set(gone)
    n = rows - len(gone_set)
    order = list(range(n))
    for hole, mover in zip(sorted(b for b in gone_set if b < n), [b for b in range(n, rows) if b not in gone_set],
                           strict=True):
        order[hole] = mover
    return order


def _narrowed(value, m: int, w: int):
    """A position embedding's argument of a pass of m tokens narrowed to w: an ids shape (LED's),
    ids or embeddings (rows, m, ...), position ids (m,) (BART's); anything else as it is."""
    if w == m:
        return value
    if isinstance(value, torch.Size) and len(value) >= 2 and value[1] == m:
        return torch.Size((value[0], w, *value[2:]))
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] == m:
        return value[:, :w]
    if isinstance(value, torch.Tensor) and value.dim() == 1 and value.shape[0] == m:
        return value[:w]
    return value


class BatchKV:
    """Rows' valid cache columns (`cols[b]`, in sequence order) plus the cache and its mask."""

    def __init__(self, model: PreTrainedModel, rows: int = 0, pad_id: int = 0, min_width: int = 1):
        """min_width: the narrowest pass over holes, 2 for a decoder that builds no mask for a
        one-token pass (LED's: it would attend to the holes); its pad becomes a hole too."""
        self.model = model
        self.device = model.device
        self.pad_id = pad_id
        self.min_width = min_width
        self.cache = growing_cache()
        # The mask lives on the CPU: rollbacks and refills change a few entries of a few rows
        # each round, which on a GPU would be a kernel launch per row; a pass sends it over once.
        self._mask: torch.Tensor | None = torch.zeros((rows, 0), dtype=torch.long)
        self.logits: torch.Tensor | None = None  # the last pass's float32 logits (rows, fed, V)
        self.cols: list[list[int]] = [[] for _ in range(rows)]
        config = model.config
        self.encdec = bool(config.is_encoder_decoder)
        # Encoder-decoder: each row's cross-attention keys/values (written once, by `encode`) and
        # the encoder's padding mask over their columns.
        self.cross = DynamicCache() if self.encdec else None
        self.enc_mask = torch.zeros((rows, 0), dtype=torch.long, device=self.device)
        self.window = sliding_window(config)
        self.layer_types = mixed_layer_types(config)
        self._pos_modules, self._bias_modules = decoder_position_modules(model) if self.encdec else ([], [])
        # Position embeddings that count from the ids (M2M100, NLLB): counted per token (`fed_alone`).
        self._forwards = {m: fed_alone(m) for m in self._pos_modules if counts_positions_from_ids(m)}
        self._caps = {m: table_size(m) for m in self._pos_modules}  # (positions each table embeds)
        self.encoded: dict = {}  # encoder-decoder: this cache's encoder outputs and mask (`encode`)
        for module in self._pos_modules if rows != 1 else ():  # (one row runs `_plain` passes)
            if "cache_length" not in inspect.signature(module.forward).parameters:
                raise ValueError(f"{type(model).__name__}: its decoder's position embedding takes no cache length, so "
                                 "rows of different lengths cannot share a batch")

    @property
    def mask(self) -> torch.Tensor:  # (rows, width): 1 where a row's column is valid (`_mask` None while all are)
        if self._mask is None:
            self._mask = torch.ones((self.rows, max(map(len, self.cols), default=0)), dtype=torch.long)
        return self._mask

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
    def encode(self, prompts: list[list[int]], encoded: torch.Tensor | dict | None = None,
               lazy: bool = False) -> torch.Tensor:
        """Encoder-decoder: the rows' encoder outputs (run here over the right-padded prompts, or
        `encoded`: the same encoder's, a tensor or another decoder's `encoded`) and their
        cross-attention keys/values, written by a one-token decoder pass or (`lazy`, one row, as
        `generate()` does) by the first pass. Returns the encoder's outputs."""
        assert self.encdec and len(prompts) == self.rows and not self.cross.layers
        if isinstance(encoded, dict):
            self.encoded = encoded
        else:
            width = max(len(p) for p in prompts)
            mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts], device=self.device)
            if encoded is None:
                ids = torch.tensor([p + [self.pad_id] * (width - len(p)) for p in prompts], device=self.device)
                encoded = run_encoder(self.model, input_ids=ids, attention_mask=mask)
            else:
                encoded = encoder_output(self.model, encoded)
            self.encoded = {"encoder_outputs": encoded, "attention_mask": mask}
        self.enc_mask = self.encoded["attention_mask"]
        if not lazy:
            start = initial_decoder_ids(self.model, [])[0]
            kwargs = {"logits_to_keep": 1} if _accepts_logits_to_keep(type(self.model)) else {}
            with pass_lock(self.model):  # a decoder pass: not while another thread's hooks change it
                self.model(**self.encoded, cache=EncoderDecoderCache(DynamicCache(), self.cross), use_cache=True,
                           decoder_input_ids=torch.full((self.rows, 1), start, dtype=torch.long, device=self.device),
                           **kwargs)
        return self.encoded["encoder_outputs"].last_hidden_state

    @torch.inference_mode()
    def forward(self, feeds: list[list[int]], logits: bool = True, last: bool = False) -> torch.Tensor | None:
        """Feed each row its tokens (a row may feed none) in ONE model pass; return the float32 logits, (rows, fed, V),
        row b's at its fed positions in [b, :len(feeds[b])] (one tensor: a view per row costs more host time than a GPU
        pass at wide batches), or (last) each row's at its last, (rows, 1, V); None without logits.
        One row without holes runs as `generate()` runs it: the model's own positions and masks."""
        assert len(feeds) == self.rows
        m = max((len(f) for f in feeds), default=0)
        if m == 0:
            return torch.empty(len(feeds), 0, 0)
        width = self.width
        aligned = all(len(c) == width for c in self.cols)  # no holes, one length: columns are positions
        plain = aligned and self.rows == 1
        if not aligned:
            m = max(m, self.min_width)
        # Built as lists and made tensors once: a few tensor ops per row cost more host time than
        # a GPU pass of a small model at wide batches.
        ids = torch.tensor([f + [self.pad_id] * (m - len(f)) for f in feeds], dtype=torch.long, device=self.device)
        kwargs = {}
        if (not logits or (last and plain)) and _accepts_logits_to_keep(type(self.model)):
            kwargs["logits_to_keep"] = 1  # a prefill (no logits wanted), or one row's last
        out = self._plain(ids, kwargs) if plain else self._padded(feeds, ids, m, width, aligned, kwargs)
        for b, f in enumerate(feeds):
            self.cols[b].extend(range(width, width + len(f)))
        self._mask = None if plain else torch.cat([self.mask, torch.tensor(
            [[1] * len(f) + [0] * (m - len(f)) for f in feeds], dtype=torch.long)], dim=1)
        if not logits:
            self.logits = None
        elif plain and last:
            self.logits = out.logits[:, -1:].float()
        else:
            self.logits = last_logits(out.logits, feeds) if last else out.logits.float()
        return self.logits

    def _plain(self, ids: torch.Tensor, kwargs: dict):
        """One row's pass with no mask and no positions, as `generate()` runs it (and the only pass
        a model that batches nowhere runs: ALiBi, fixed-bias local attention, no position ids)."""
        if not self.encdec:
            return self.model(input_ids=ids, cache=self.cache, use_cache=True, **kwargs)
        # (its encoder outputs are read once, by the first pass, which writes the cross-attention cache)
        encoded = self.encoded or {"encoder_outputs": self._no_encoder_outputs(), "attention_mask": self.enc_mask}
        with hooked(self.model, {}, self._forwards):  # not while another thread's hooks change its decoder
            return self.model(decoder_input_ids=ids, cache=EncoderDecoderCache(self.cache, self.cross),
                              use_cache=True, **encoded, **kwargs)

    def _no_encoder_outputs(self) -> ModelOutput:
        return encoder_output(self.model, shape_only_hidden(self.model, self.rows, self.enc_mask.shape[1]))

    def _padded(self, feeds: list[list[int]], ids: torch.Tensor, m: int, width: int, aligned: bool, kwargs: dict):
        """Rows right-padded to m tokens, each at its own positions, through a 2D mask of its valid columns."""
        # Pads repeat the last real position so that they never pass the context limit.
        pos = torch.tensor([[len(c) + min(j, max(len(f) - 1, 0)) for j in range(m)]
                            for c, f in zip(self.cols, feeds, strict=True)], dtype=torch.long)
        # Pads attend too (to themselves and the row's valid prefix, so no query sees an empty
        # row and no NaN enters the cache); they sit after the row's real tokens, so causality
        # hides them from those, and they become holes right after this pass.
        mask = torch.cat([self.mask, torch.ones((self.rows, m), dtype=torch.long)], dim=1).to(self.device)
        pos = pos.to(self.device)
        if self.encdec:  # hooked, or (aligned) not while another thread's hooks change the model
            # (aligned rows' pads could still run past a position table near its end)
            fits = all(cap is None or width + m <= cap for cap in self._caps.values())
            with hooked(self.model, {}, self._forwards) if aligned and fits else self._true_positions(pos, width):
                return self.model(decoder_input_ids=ids, decoder_attention_mask=mask, attention_mask=self.enc_mask,
                                  encoder_outputs=self._no_encoder_outputs(),
                                  cache=EncoderDecoderCache(self.cache, self.cross), use_cache=True, **kwargs)
        # The model's own window counts columns: right only while they are the positions
        # (aligned), or while no two columns are a window apart (then no key is hidden).
        if self.window is not None and not aligned and width + m > self.window:
            mask = self._window_masks(mask, pos, width)
        return self.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=self.cache, use_cache=True,
                          **kwargs)

    def _column_positions(self, pos: torch.Tensor, width: int) -> torch.Tensor:
        """(rows, width + fed) the position of the token in each column (holes: 0, masked)."""
        colpos = torch.zeros((self.rows, width + pos.shape[1]), dtype=torch.long, device=self.device)
        for b, c in enumerate(self.cols):
            if c:
                colpos[b, c] = torch.arange(len(c), device=self.device)
        colpos[:, width:] = pos
        return colpos

    def _window_masks(self, mask: torch.Tensor, pos: torch.Tensor, width: int) -> torch.Tensor | dict:
        """This pass's additive 4D masks by true positions: a column is visible when valid, not after the query and
        (sliding layers) less than a window behind it; a dict by layer type for a hybrid model."""
        m = pos.shape[1]
        colpos = self._column_positions(pos, width)
        cols = torch.arange(width + m, device=self.device)
        causal = (cols[None, :] <= cols[width:, None])[None] & mask.bool()[:, None, :]  # (rows, m, columns)
        near = (pos[:, :, None] - colpos[:, None, :]) < self.window
        dtype = self.model.dtype
        low = torch.finfo(dtype).min

        def additive(allowed: torch.Tensor) -> torch.Tensor:
            return torch.zeros(allowed.shape, dtype=dtype, device=self.device).masked_fill(~allowed, low)[:, None]

        if self.layer_types is None:
            return additive(causal & near)
        return {kind: additive(causal & near if kind == "sliding_attention" else causal)
                for kind in set(self.layer_types)}

    def _true_positions(self, pos: torch.Tensor, width: int):
        """While an encoder-decoder pass runs: each row's position embeddings at its own cache
        length (`_embed_by_row`), and relative position biases from its true query-key distances."""
        colpos = self._column_positions(pos, width)
        top = int(max(colpos.max(), pos.max())) + 1

        def keys(key_length: int) -> tuple[torch.Tensor, int]:
            return colpos[:, None, :key_length], top

        return hooked(self.model, {m: bias_by_row(m, lambda: pos, keys) for m in self._bias_modules},
                      {m: self._embed_by_row(m, pos.shape[1]) for m in self._pos_modules})

    def _embed_by_row(self, module: torch.nn.Module, m: int) -> Callable:
        """A decoder position embedding's forward for a pass of m tokens per row: each row's
        embeddings at its own cache length, never past the table (`table_size`: a row's pads near
        its end take its last position's, as a causal decoder's pads repeat its last position)."""
        # (the class's forward: while another thread's pass runs, the instance's is patched)
        own = self._forwards.get(module) or MethodType(type(module).forward, module)
        cap = self._caps[module]
        lengths = [len(c) for c in self.cols]

        def forward(*args, **kwargs):
            given = dict(inspect.signature(own).bind(*args, **kwargs).arguments)
            base, out = given.get("cache_length", 0), None
            for length in sorted(set(lengths)):
                which = [b for b, n in enumerate(lengths) if n == length]
                w = m if cap is None else max(1, min(m, cap - length))
                call = {k: _narrowed(v, m, w) for k, v in given.items()} | {"cache_length": length}
                if call.get("position_ids") is not None:
                    call["position_ids"] = call["position_ids"] - base + length
                res = own(**call)
                res = res[which] if res.dim() == 3 and res.shape[0] == self.rows else res.reshape(1, *res.shape[-2:])
                if w < m:
                    res = torch.cat([res, res[:, -1:].expand(-1, m - w, -1)], dim=1)
                if out is None:
                    out = res.new_empty((self.rows, m, res.shape[-1]))
                out[which] = res
            return out
        return forward

    @torch.inference_mode()
    def rollback(self, b: int, length: int) -> None:
        """Row b keeps its first `length` valid tokens; the columns after become holes, or, for
        one row without holes, are cropped (so it stays without: `_plain`)."""
        if length >= len(self.cols[b]):
            return
        if self.rows == 1 and len(self.cols[0]) == self.width:
            self.cache.crop(length - self.width)  # (a count of columns to remove)
            self._mask = None
        else:
            self.mask[b, self.cols[b][length:]] = 0
        del self.cols[b][length:]

    def wasted(self) -> int:
        """Columns that no row needs: the cache width beyond the longest row."""
        return self.width - max((len(c) for c in self.cols), default=0)

    @torch.inference_mode()
    def drop(self, gone: list[int]) -> list[int]:
        """Remove these rows: the last rows that stay move into the gaps and the row view narrows, so only moved rows
        are copied (a gather copied the whole cache, twice). Returns the new order: row i is the old row order[i]."""
        order = drop_order(self.rows, gone)
        n = len(order)
        holes = [b for b, mover in enumerate(order) if b != mover]
        if holes:
            dst = torch.tensor(holes, dtype=torch.long, device=self.device)
            src = torch.tensor([order[b] for b in holes], dtype=torch.long, device=self.device)
            for k, v in self._layers() + self._layers(cross=True):  # a split model's layers sit on several devices
                k[dst.to(k.device)] = k[src.to(k.device)]
                v[dst.to(v.device)] = v[src.to(v.device)]
        for layer in self.cache.layers + (self.cross.layers if self.encdec else []):
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[:n], layer.values[:n]
        self._mask = self.mask[order]
        if self.encdec:
            self.enc_mask = self.enc_mask[order]
        self.cols = [self.cols[i] for i in order]
        return order

    @torch.inference_mode()
    def place(self, slots: list[int], fresh: BatchKV) -> None:
        """Write `fresh`'s rows over these rows (left, or never filled), right-aligned at this cache's width, their old
        columns holes: the other rows are not copied, which makes a refill cheaper than `drop` then `merge`."""
        assert len(slots) == fresh.rows
        if self.encdec:
            self._place_cross(slots, fresh)
        need = max((len(c) for c in fresh.cols), default=0)
        theirs = fresh._layers()
        if theirs and not self._layers():  # no pass ran here, so every row is empty: start at no columns
            for i, (fk, fv) in enumerate(theirs):
                self.cache.update(fk.new_zeros((self.rows, fk.shape[1], 0, fk.shape[3])),
                                  fv.new_zeros((self.rows, fv.shape[1], 0, fv.shape[3])), i)
        if need > self.width:
            self._widen(need - self.width)
        width = self.width
        index = [torch.tensor(c, dtype=torch.long, device=self.device) for c in fresh.cols]
        for (k, v), (fk, fv) in zip(self._layers(), theirs, strict=True) if theirs else ():  # none: one-token prompts
            for j, (slot, cols) in enumerate(zip(slots, index, strict=True)):
                k[slot, :, width - len(cols):] = fk[j, :, cols.to(fk.device)]
                v[slot, :, width - len(cols):] = fv[j, :, cols.to(fv.device)]
        for slot, c in zip(slots, fresh.cols, strict=True):
            self.mask[slot] = torch.arange(width) >= width - len(c)
            self.cols[slot] = list(range(width - len(c), width))

    def _place_cross(self, slots: list[int], fresh: BatchKV) -> None:
        """Cross-attention keys/values and encoder masks of `fresh`'s rows over these rows."""
        # (rows enter only by `merge`, which brings their cross-attention keys/values, or already encoded)
        assert self._layers(cross=True), "rows placed over rows that were never encoded"
        need = fresh.enc_mask.shape[1]
        self._widen(need - self.enc_mask.shape[1], cross=True)
        index = torch.tensor(slots, dtype=torch.long, device=self.device)
        for (k, v), (fk, fv) in zip(self._layers(cross=True), fresh._layers(cross=True), strict=True):
            k[index.to(k.device), :, :need] = fk
            v[index.to(v.device), :, :need] = fv
        self.enc_mask[index] = 0
        self.enc_mask[index, :need] = fresh.enc_mask

    def _merge_cross(self, every: list[BatchKV]) -> None:
        """The rows' cross-attention keys/values and encoder masks, one after another, padded (masked) to the widest."""
        width = max(kv.enc_mask.shape[1] for kv in every)
        for kv in every:
            kv._widen(width - kv.enc_mask.shape[1], cross=True)
        merged = DynamicCache()
        for i, layers in enumerate(zip(*(kv._layers(cross=True) for kv in every), strict=True)):
            merged.update(torch.cat([k for k, _ in layers]), torch.cat([v for _, v in layers]), i)
        self.cross = merged
        self.enc_mask = torch.cat([kv.enc_mask for kv in every])

    def _widen(self, n: int, cross: bool = False) -> None:
        """n more columns for every row, all holes (zeros: a masked column must not hold NaN); cross: n more encoder
        columns, in the cross-attention keys/values and the encoder mask (none when n <= 0)."""
        if n <= 0:
            return
        for layer in (self.cross if cross else self.cache).layers:
            if layer.is_initialized:
                k, v = layer.keys, layer.values
                layer.update(k.new_zeros((*k.shape[:2], n, k.shape[3])), v.new_zeros((*v.shape[:2], n, v.shape[3])))
        if cross:
            self.enc_mask = torch.cat([self.enc_mask, self.enc_mask.new_zeros((self.rows, n))], dim=1)
        else:
            self._mask = torch.cat([self.mask, self.mask.new_zeros((self.rows, n))], dim=1)

    def _layers(self, cross: bool = False) -> KV:
        """The initialized layers' keys and values: the decoder's own, or (cross) its cross-attention ones."""
        cache = self.cross if cross else self.cache
        return [] if cache is None else [(layer.keys, layer.values) for layer in cache.layers if layer.is_initialized]

    def _gather_into(self, kv: tuple[torch.Tensor, torch.Tensor] | None, k_out: torch.Tensor, v_out: torch.Tensor,
                     index: torch.Tensor | None) -> None:
        """One layer's keys/values (None: no pass ran) into k_out/v_out, each row's valid columns right-aligned in
        their width (zeros before)."""
        if kv is None or not kv[0].shape[2]:  # no pass ran, or none left columns: rows empty
            k_out.zero_()
            v_out.zero_()
            return
        k, v = kv
        if index is None:  # every column valid (prompts of one length): already aligned
            k_out.copy_(k)
            v_out.copy_(v)
            return
        index = index.to(k.device)
        torch.gather(k, 2, index[:, None, :, None].expand(k_out.shape), out=k_out)
        torch.gather(v, 2, index[:, None, :, None].expand(v_out.shape), out=v_out)

    def _alignment(self, width: int) -> torch.Tensor | None:
        """Per row, the cache column of each of `width` right-aligned columns (0: padding, masked);
        None when aligned already."""
        if self.width == width and all(len(c) == width for c in self.cols):
            return None
        index = torch.zeros((self.rows, width), dtype=torch.long, device=self.device)
        for b, c in enumerate(self.cols):
            if c:
                index[b, width - len(c):] = torch.tensor(c, dtype=torch.long)
        return index

    @torch.inference_mode()
    def merge(self, *others: BatchKV) -> None:
        """Append the rows of `others` (freshly prefilled prompts, used up: their buffers and cross-attention caches
        become this cache's) after its rows, compacted: each part gathered into a new buffer with spare columns (no
        `others`: the holes dropped, each row's valid columns right-aligned in the longest row's width)."""
        every = [kv for kv in (self, *others) if kv.rows]
        if self.encdec and every and (len(every) > 1 or every[0] is not self):
            self._merge_cross(every)
        width = max((len(c) for kv in every for c in kv.cols), default=0)
        # (none: no cache has run a pass yet, one-token prompts, an encoder-decoder's new rows: nothing to move)
        holder = next((kv for kv in every if kv._layers()), None)  # (not a cache whose rows all left: stale layers)
        indexes = [kv._alignment(width) for kv in every] if holder is not None else []
        if holder is not None and (len(every) > 1 or indexes[0] is not None):  # else: aligned already, keep its buffer
            rows = sum(kv.rows for kv in every)
            layers = [layer for layer in holder.cache.layers if layer.is_initialized]
            layers_of = [kv._layers() for kv in every]
            for i, (layer, (k, v)) in enumerate(zip(layers, holder._layers(), strict=True)):
                kbuf, vbuf = GrowingLayer.buffers_for(k, v, width, rows)
                start = 0
                for kv, own, index in zip(every, layers_of, indexes, strict=True):
                    part = slice(start, start + kv.rows)
                    kv._gather_into(own[i] if own else None, kbuf[part, :, :width], vbuf[part, :, :width], index)
                    start += kv.rows
                layer.adopt(kbuf, vbuf, width)
        self.cache = growing_cache() if holder is None else holder.cache
        self.cols = [list(range(width - len(c), width)) for kv in every for c in kv.cols]
        starts = torch.tensor([width - len(c) for c in self.cols], dtype=torch.long)[:, None]
        self._mask = (torch.arange(width)[None] >= starts).long()  # (right-aligned)


# On a CPU one pass over many prompts is slower than several smaller ones: its activations outgrow
# the caches (measured in docs/batching.md, "Prefill in passes"). GPUs want big passes.
CPU_PREFILL_TOKENS = 2048


def last_logits(logits: torch.Tensor, feeds: list[list[int]], rows: list[int] | None = None) -> torch.Tensor:
    """(rows, 1, V) float32, a copy: each row's logits (at `rows`, else in order) at its last fed
    position (a row that fed none: its first, unread)."""
    at = torch.tensor([max(len(f) - 1, 0) for f in feeds], device=logits.device)
    rows_at = torch.tensor(range(len(feeds)) if rows is None else rows, device=logits.device)
    return logits[rows_at, at][:, None].float()


def one_row(model: PreTrainedModel, prompt_ids: list[int], encoded: dict | None = None) -> BatchKV:
    """A growing cache of one row for one item, its prompt encoded (encoder-decoder; `encoded`:
    another decoder's outputs of this model's encoder) and its decoder empty."""
    kv = BatchKV(model, 1)
    if kv.encdec:
        kv.encode([prompt_ids], encoded, lazy=True)
    return kv


def feed_to(kv, tokens: list[int], n: int) -> torch.Tensor:
    """What a one-row cache lacks of `tokens` fed in one pass: the float32 logits of its last n
    positions (n = 0: none, a prefill)."""
    out = kv.forward([tokens[kv.length(0):]], logits=n > 0, last=n == 1)
    return out[0][-n:] if n else torch.empty(0)  # (one row: no pads)


def prefill_chunks(lengths: list[int], budget: int | None) -> list[list[int]]:
    """Consecutive row indices per prefill pass: rows x longest row <= budget (one row at least)."""
    chunks: list[list[int]] = []
    longest = 0
    for j, n in enumerate(lengths):
        if chunks and (budget is None or (len(chunks[-1]) + 1) * max(longest, n) <= budget):
            chunks[-1].append(j)
            longest = max(longest, n)
        else:
            chunks.append([j])
            longest = n
    return chunks


def window_note(model: PreTrainedModel, longest: int) -> str | None:
    """A log line on a sliding-window model: whether rows of at most `longest` decoder tokens
    (prompt + new tokens + drafts) can reach its window; None for a model without one."""
    window = sliding_window(model.config)
    if window is None:
        return None
    name = type(model).__name__
    if longest <= window:
        return (f"{name}: sliding window of {window} tokens is never reached (rows of at most {longest} tokens): "
                "full attention for every row")
    return (f"{name}: sliding window of {window} tokens can be reached (rows up to {longest} tokens): rows past it "
            "get per-row window masks by position")
