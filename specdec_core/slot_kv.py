"""The batch engine's cache at fixed row slots: every pass over all slots, replayable as a CUDA graph.

Each row owns a slot of a `StaticKV` whose column i holds its token at position i: no holes, a rollback moves the
row's length, a finished row's slot is refilled in place, and every pass has one shape per width, so one graph per
width serves every round. It keeps `BatchKV`'s interface (`forward`, `rollback`, `drop`, `place`, `merge`); new
rows are prefilled together through graphs (`prefill`) or eagerly into a `BatchKV`, then copied into their slots
(docs/batching.md, "What the engine does per row"; docs/how-it-works.md, "On a GPU: static caches and CUDA graphs").
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

import torch
from transformers import PreTrainedModel

from specdec_core.batch_kv import KV, BatchKV, drop_order, last_logits
from specdec_core.decoder import bias_by_row, decoder_position_modules, hooked
from specdec_core.pass_settings import DEFAULT, PassSettings
from specdec_core.static_kv import MAX_GRAPH_WIDTH, StaticKV

log = logging.getLogger(__name__)

ADMIT_ROWS = 16  # the most new rows prefilled in one pass (`SlotKV.prefill`)


class SlotKV(StaticKV):
    """`slots` rows of fixed buffers, the rows of a batch in some of them (`slot_of`); batch 1 is one slot, which
    `acquire` takes for an item (empty) and `release` gives back."""

    def __init__(self, model: PreTrainedModel, slots: int, pad_id: int = 0, graphs: bool | None = None,
                 strict: bool = False, compile: bool = False, min_width: int = 1, settings: PassSettings = DEFAULT,
                 full_width: bool = False):
        super().__init__(model, slots, graphs, strict, batched=slots > 1, compile=compile, min_width=min_width,
                         settings=settings, full_width=full_width)
        self.pad_id = pad_id
        self._lock = threading.Lock()
        self._reset()
        # Encoder-decoder: each relative position bias at each row's own positions (`_by_row`), made once.
        biases = decoder_position_modules(model)[1] if self.encdec else []
        self._bias_by_row = {m: bias_by_row(m, lambda: self.positions, self._key_columns) for m in biases}
        self._prefiller: StaticKV | None = None  # new rows' prefills (`prefill`), made on first use

    def acquire(self) -> bool:
        """Take the buffers, emptied, for one call; False while another thread holds them (it then decodes with a
        growing cache)."""
        if not self._lock.acquire(blocking=False):
            return False
        self._reset()
        return True

    def release(self) -> None:
        self._lock.release()

    def _reset(self) -> None:
        self.lengths = [0] * self.buffer_rows  # per slot: its row's cached tokens (0 when free)
        self.slot_of: list[int] = []  # per row of the batch, in the engine's order: its slot
        self.logits: torch.Tensor | None = None  # the last pass's float32 logits (rows, fed, V)
        self.encoded: dict = {}  # batch 1, encoder-decoder: the item's encoder outputs and mask (`start`)

    # Encoder-decoder rows at their own positions, inside a captured pass (device ops only); one slot
    # takes the model's own positions, as any one row does.

    def _starts(self, base: torch.Tensor) -> torch.Tensor:
        # Per row, (slots, 1): position embeddings then count from each row's own start.
        return base[:, None] if self.buffer_rows > 1 else super()._starts(base)

    def _by_row(self):
        """While a pass runs: position embeddings look up each row's own positions (`StaticKV._lookup_forward`,
        `_table_forward`), relative biases each row's (`decoder.bias_by_row`, over the static column count: no host
        wait). Set around the pass, outside compiled code: dynamo's tracing does not keep a patched `compute_bias`."""
        if not self.encdec or self.buffer_rows == 1:
            return super()._by_row()
        return hooked(self.model, self._bias_by_row, self._forwards)

    def _key_columns(self, key_length: int) -> tuple[torch.Tensor, int]:
        return self.columns[None, None, :key_length], key_length

    # BatchKV's interface: its rows are the batch's rows, whichever slots they sit in.

    @property
    def rows(self) -> int:
        return len(self.slot_of)

    @property
    def width(self) -> int:
        return max(self.lengths, default=0)

    def length(self, b: int) -> int:
        return self.lengths[self.slot_of[b]]

    @torch.inference_mode()
    def start(self, prompt_ids: list[int], encoded: dict | None = None) -> None:
        """Batch 1: the item's row in slot 0, empty, its prompt encoded in place (encoder-decoder: `encode_rows`;
        `encoded`: another decoder's outputs of this model's encoder), kept in `encoded` for a draft sharing it."""
        if self._take_free(1) != [0]:  # (not an assert: the slot must be taken under `python -O` too)
            raise ValueError("start() writes an item into slot 0 of an empty cache (batch 1); a batch's rows enter "
                             "by prefill()")
        if self.encdec:
            self.encoded = self.encode_rows([prompt_ids], None if encoded is None else [encoded])[0]

    def _prefill_head(self, new: list[int], tail: int) -> list[int]:
        """Batch 1 with prefill graphs (decoder-only): a feed of no logits, or wider than any decode graph, prefilled
        in place (`prefill_rows`) but for its last `tail` tokens, returned for the pass that needs their logits."""
        if not self.passes.prompt_graphs("prefill") or self.encdec:
            return new
        if tail and (len(new) <= MAX_GRAPH_WIDTH or tail > MAX_GRAPH_WIDTH):
            return new  # a decode graph's width already, or more logits than a decode graph keeps
        head, new = (new, []) if tail == 0 else (new[:-tail], new[-tail:])
        self.prefill_rows([head], [self.lengths[0]])
        self.lengths[0] += len(head)
        return new

    @torch.inference_mode()
    def forward(self, feeds: list[list[int]], logits: bool = True, last: bool = False) -> torch.Tensor | None:
        """Feed each row its tokens (a row may feed none) in ONE pass over all slots; return the float32 logits as
        `BatchKV.forward` does: (rows, fed, V), row b's in [b, :len(feeds[b])], or (last) (rows, 1, V)."""
        assert len(feeds) == len(self.slot_of)
        one = self.buffer_rows == 1
        wanted = (1 if last else len(feeds[0])) if logits and one else 0  # (one slot: the logits kept)
        if one and feeds[0]:
            feeds = [self._prefill_head(feeds[0], wanted)]
        w = max((len(f) for f in feeds), default=0)
        if w == 0:
            return torch.empty(len(feeds), 0, 0)
        self._fit(self.width + w, self.width)
        inp = self._slot_inputs(feeds, w)
        narrow = w <= MAX_GRAPH_WIDTH
        # A graph or compiled pass keeps every position's logits; one slot's eager pass only those wanted (a
        # compiled prefill keeps one).
        keep = max(wanted, 1) if one and not (narrow and (self.passes.on or self.passes.compiles)) else w
        out = self.passes.run(w, inp, lambda x: self._pass(x, keep),
                              f"a {w}-token pass" + ("" if one else f" over {self.buffer_rows} slots"), graphed=narrow)
        for slot, f in zip(self.slot_of, feeds, strict=True):
            self.lengths[slot] += len(f)
        # A copy either way: in fp32 `.float()` would return a graph's output, which the next replay overwrites.
        if not logits:
            self.logits = None
        elif one:  # (its last fed position is the pass's last)
            self.logits = out[:, -wanted:].to(torch.float32, copy=True)
        elif last:
            self.logits = last_logits(out, feeds, self.slot_of)
        elif self.slot_of == list(range(self.buffer_rows)):
            self.logits = out.to(torch.float32, copy=True)
        else:
            self.logits = out[torch.tensor(self.slot_of, device=out.device)].float()
        return self.logits

    @torch.inference_mode()
    def draft_greedy(self, feeds: list[list[int]], k: int) -> list[list[int]]:
        """Feed each row and draft k greedy tokens, every slot's steps on the device, read back at once (one sync per
        round). A row that feeds nothing gets meaningless picks and keeps its length; the others then hold their
        tokens and first k-1 drafts."""
        assert len(feeds) == len(self.slot_of) and k >= 1
        if self.buffer_rows == 1 and len(feeds[0]) > 1:  # batch 1: chains start from one token (a graph per k)
            self.forward([feeds[0][:-1]], logits=False)
            feeds = [feeds[0][-1:]]
        w = max((len(f) for f in feeds), default=0)
        if w == 0:
            return [[] for _ in feeds]
        self._fit(self.width + w + k - 1, self.width)
        inp = self._slot_inputs(feeds, w)
        picks = self.passes.run((w, k), inp, lambda x: self._chain(x, k), f"{k} draft steps after {w} tokens over "
                                f"{self.buffer_rows} slots", graphed=w <= MAX_GRAPH_WIDTH).tolist()
        for slot, f in zip(self.slot_of, feeds, strict=True):
            if f:
                self.lengths[slot] += len(f) + k - 1
        return [picks[slot] for slot in self.slot_of]

    def _slot_inputs(self, feeds: list[list[int]], w: int) -> torch.Tensor:
        """A pass's packed inputs by slot: each writes w columns from its length on (a free slot or short row: pads)."""
        tokens: list[list[int]] = [[] for _ in range(self.buffer_rows)]
        for slot, f in zip(self.slot_of, feeds, strict=True):
            tokens[slot] = f
        inp = self._inputs([t or [self.pad_id] for t in tokens], self.lengths, self.pad_id)
        inp[:, w + 1] = torch.tensor([len(t) for t in tokens])
        return inp

    def _copy_cross(self, slots: list[int], layers: KV, visible: torch.Tensor) -> None:
        """Cross-attention keys/values (rows, heads, n, dim) per layer into these slots' first n
        columns, the rest zeroed, and their encoder masks from `visible` (rows, n)."""
        n = visible.shape[1]
        if n > self.enc_capacity:
            self._grow_encoder(n)
        index = torch.tensor(slots, device=self.device)
        for layer, (fk, fv) in zip(self.cross.layers, layers, strict=True):
            layer.write(index, fk, fv, clear=True)
        visible = visible.to(self.device).bool()[:, None, None, :]
        self.enc_mask[index] = self._low
        self.enc_mask[index, ..., :n] = torch.zeros((), dtype=self.enc_mask.dtype, device=self.device).masked_fill(
            ~visible, self._low)

    def rollback(self, b: int, length: int) -> None:
        """Row b keeps its first `length` tokens; the columns after are overwritten later."""
        slot = self.slot_of[b]
        self.lengths[slot] = min(self.lengths[slot], length)

    def drop(self, gone: list[int]) -> list[int]:
        """These rows leave and their slots are free; nothing moves. Returns the new order of the
        rows (row i is the old row order[i]), the same as `BatchKV.drop`'s."""
        for b in gone:
            self.lengths[self.slot_of[b]] = 0
        order = drop_order(len(self.slot_of), gone)
        self.slot_of = [self.slot_of[b] for b in order]
        return order

    @torch.inference_mode()
    def place(self, rows: list[int], fresh: BatchKV) -> None:
        """`fresh`'s rows, freshly prefilled (tokens in columns 0..n-1, as every caller's), to columns 0.. of the slots
        of these rows, whose items have left (and an encoder-decoder row's cross-attention keys/values and mask)."""
        assert len(rows) == fresh.rows
        if any(cols != list(range(len(cols))) for cols in fresh.cols):
            raise ValueError("only freshly prefilled rows (tokens in columns 0..n-1, no holes) move into slots")
        slots = [self.slot_of[b] for b in rows]
        if self.encdec:
            self._copy_cross(slots, fresh._layers(cross=True), fresh.enc_mask)
        self._write_rows(slots, fresh._layers(), [len(c) for c in fresh.cols])

    @property
    def admit_rows(self) -> int:
        """The most new rows one prefill pass takes (`prefill`)."""
        return min(self.buffer_rows, ADMIT_ROWS)

    def admission_parts(self, n: int) -> list[slice]:
        """The new rows each pass of an admission of n rows takes (`prefill`): `admit_rows` at most."""
        return [slice(first, first + self.admit_rows) for first in range(0, n, self.admit_rows)]

    @property
    def prefills_in_graphs(self) -> bool:
        """Whether `prefill` takes new rows (with graphs); else they prefill into a `BatchKV` and are copied in."""
        # An encoder-decoder needs its cross pass graphed; an encoder that failed to capture just runs eagerly.
        kind = "cross" if self.encdec else "prefill"
        return self.passes.prompt_graphs(kind) and (self._prefiller is None
                                                    or self._prefiller.passes.prompt_graphs(kind))

    @torch.inference_mode()
    def prefill(self, feeds: list[list[int]], into: list[int] | None = None, prompts: list[list[int]] | None = None,
                encoded: list[dict] | None = None) -> list[dict]:
        """New rows' tokens (all but their newest), in free slots after the batch's rows or over the rows `into`.
        Prefilled together, up to `ADMIT_ROWS` a pass, in this model's own static cache (`StaticKV.prefill_rows`; an
        encoder-decoder's `prompts` by `StaticKV.encode_rows`, given `encoded`: a shared encoder's), then copied into
        their slots. Returns an encoder-decoder's `encoded` per row."""
        slots = self._take_free(len(feeds)) if into is None else [self.slot_of[b] for b in into]
        if self._prefiller is None:
            settings = replace(self.settings, compile_prefills=self.passes.compile_prefills)
            self._prefiller = StaticKV(self.model, self.admit_rows, graphs=self.passes.on, strict=self.passes.strict,
                                       min_width=self.min_width, settings=settings, full_width=self.full_width)
        pre, out = self._prefiller, []
        setup = pre.passes.capture_s
        for part in self.admission_parts(len(slots)):
            into_slots, part_feeds = slots[part], feeds[part]
            for slot in into_slots:
                self.lengths[slot] = 0
            if self.encdec:
                rows = pre.encode_rows(prompts[part], encoded[part] if encoded else None)
                out += rows
                visible = torch.cat([e["attention_mask"] for e in rows])  # (rows, the padded width written)
                r, w = visible.shape
                self._copy_cross(into_slots, [(c.keys[:r, :, :w], c.values[:r, :, :w]) for c in pre.cross.layers],
                                 visible)
            fed = [j for j, f in enumerate(part_feeds) if f]  # (a one-token prompt prefills nothing)
            if not fed:
                continue
            pre.prefill_rows([part_feeds[j] for j in fed], [0] * len(fed))
            self._write_rows([into_slots[j] for j in fed],
                             [(layer.keys[: len(fed)], layer.values[: len(fed)]) for layer in pre.own_layers],
                             [len(part_feeds[j]) for j in fed])
        self.passes.capture_s += pre.passes.capture_s - setup
        return out

    def merge(self, *others: BatchKV) -> None:
        """The rows of `others` after the batch's rows, each in a free slot."""
        for fresh in others:
            self._take_free(fresh.rows)
            self.place(list(range(self.rows - fresh.rows, self.rows)), fresh)

    def _take_free(self, n: int) -> list[int]:
        """n free slots, given to n new rows after the batch's rows."""
        taken = set(self.slot_of)
        free = [s for s in range(self.buffer_rows) if s not in taken]
        if n > len(free):
            raise ValueError(f"{self.rows + n} rows do not fit {self.buffer_rows} slots")
        self.slot_of += free[:n]
        return free[:n]

    def _write_rows(self, slots: list[int], theirs: KV, lengths: list[int]) -> None:
        """Rows whose tokens sit in columns 0..n-1 of `theirs` (per own layer, (rows, heads, columns, dim)) into these
        slots, all in one write per buffer (host time: docs/how-it-works.md); pads land past a row's length, hidden."""
        for s in slots:
            self.lengths[s] = 0
        m = max(lengths, default=0)
        if m > self.capacity:
            self._grow(m, self.width)
        index = torch.tensor(slots, device=self.device)
        for layer, (fk, fv) in zip(self.own_layers, theirs, strict=True) if theirs else ():  # (none: rows empty)
            layer.write(index, fk[:, :, :m], fv[:, :, :m])
        for s, n in zip(slots, lengths, strict=True):
            self.lengths[s] = n
