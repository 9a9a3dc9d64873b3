"""A model's KV cache at fixed row slots, its passes replayed as CUDA graphs: the static layout.

Eager, a GPU waits on a pass's thousands of kernel launches; a graph replays them in one but needs fixed shapes
and addresses, so the cache is one buffer per layer of `capacity` columns, each row owning a slot whose column i
holds its token at position i. A pass writes at the rows' positions and attends through an explicit 4D mask; a
rollback only moves a row's length, a finished row's slot is refilled in place, and every pass has one shape per
width, so one graph per width serves every round (`graphs.PassGraphs` runs the plain passes). Batch 1 is one
slot. It keeps `BatchKV`'s interface (`forward`, `rollback`, `drop`, `place`, `merge`); new rows are prefilled
together through graphs in a second cache of this kind, or eagerly into a `BatchKV`, then copied into their slots
(`prefill`). Without CUDA the passes run eagerly (docs/how-it-works.md, "On a GPU: static caches and CUDA graphs").
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import replace

import torch
from transformers import EncoderDecoderCache, PreTrainedModel
from transformers.cache_utils import Cache

from specdec_core.batch_kv import KV, BatchKV, drop_order, last_logits
from specdec_core.decoder import (
    _accepts_logits_to_keep,
    bias_by_row,
    counts_positions_from_ids,
    decoder_position_modules,
    encoder_output,
    hooked,
    initial_decoder_ids,
    lookup_by_row,
    mixed_layer_types,
    own_kv_layers,
    pass_lock,
    position_table,
    run_encoder,
    shape_only_hidden,
    sliding_window,
    table_by_row,
)
from specdec_core.graphs import (
    MAX_GRAPH_WIDTH,
    MAX_PREFILL_GRAPH,
    PassGraphs,
    admission_rows,
    capacity_for,
    prefill_width,
)
from specdec_core.loading import context_limit, positions
from specdec_core.pass_settings import DEFAULT, PassSettings
from specdec_core.placement import decoder_layers
from specdec_core.static_layers import CrossLayer, FixedLayer, ScratchLayer

log = logging.getLogger(__name__)

ADMIT_ROWS = 16  # the most new rows prefilled in one pass (`SlotKV.prefill`)


class SlotKV:
    """Key/value buffers of `slots` rows, a row's column i holding its token at position i, and passes over them; the
    rows of a batch sit in some slots (`slot_of`). Batch 1 is one slot, which `acquire` takes for an item (empty)
    and `release` gives back.

    A pass writes each row from its length on (a short row's pads past its tokens, overwritten by its next pass),
    attending through a 4D mask that hides every column after the query's own; a rollback only moves a length."""

    def __init__(self, model: PreTrainedModel, slots: int, pad_id: int = 0, graphs: bool | None = None,
                 strict: bool = False, compile: bool = False, min_width: int = 1, settings: PassSettings = DEFAULT,
                 full_width: bool = False):
        """min_width: the narrowest pass the model runs (`takes_static`); narrower ones are widened with hidden pads.
        full_width: eager passes attend over every column too, as graphed ones do (the self-checks: a model that
        ignores a mask sees the most columns it can). A failed capture leaves passes eager over the same buffers."""
        self.model = model
        self.settings = settings
        self.device = model.device
        self.buffer_rows = slots
        self.pad_id = pad_id
        self.min_width = min_width
        self.layers = decoder_layers(model.config)
        # A chain's steps past a row's drafts are clamped here: no position table is indexed past its end.
        limit = context_limit(model)
        self._last_position = None if limit is None else limit - 1
        self.capacity = 0
        self.visible = 0  # the columns a pass attends over (`_fit`)
        self.full_width = full_width
        # compile_prefills None: compiled in slots (measured faster at wide batches), not at batch 1 (not measured).
        prefills = compile and slots > 1 if settings.compile_prefills is None else settings.compile_prefills
        self.passes = PassGraphs(type(model).__name__, self.device, settings,
                                 graphs=self.device.type == "cuda" if graphs is None else graphs, strict=strict,
                                 compile=compile, compile_prefills=prefills)
        self.cache = Cache(layers=[FixedLayer(self) for _ in range(self.layers)])
        self.own_layers = [self.cache.layers[i] for i in own_kv_layers(model.config, self.layers)]
        self._low = torch.finfo(model.dtype).min
        # Sliding-window layers keep their keys past the window, hidden by the mask (`_masks`), as `BatchKV` does.
        self.window = sliding_window(model.config)
        self.layer_types = mixed_layer_types(model.config)
        self._logits_kwarg = _accepts_logits_to_keep(type(model))
        self.seen: int | torch.Tensor = 0  # what the layers report as their length (`FixedLayer`)
        # Encoder-decoder: per row, cross-attention buffers and an additive encoder mask (`_grow_encoder` sizes them).
        self.encdec = bool(model.config.is_encoder_decoder)
        self.enc_capacity = 0
        self._start: torch.Tensor | None = None  # the decoder start ids (1, 1), on the device
        self._first = torch.zeros((1, 1), dtype=torch.long, device=self.device)  # the start token's position
        self.cross = Cache(layers=[CrossLayer(self) for _ in range(self.layers)]) if self.encdec else None
        # Encoder-decoder rows at their own positions: position embeddings counting from ids (M2M100, NLLB) read this
        # cache's table copies (`_copy_tables`), other tables are looked up by row, relative biases too (`_by_row`).
        embeds, biases = decoder_position_modules(model) if self.encdec else ([], [])
        self._tables = [m for m in embeds if counts_positions_from_ids(m)]
        self._table: dict[torch.nn.Module, torch.Tensor] = {}
        self._forwards = {m: table_by_row(m, lambda: self.positions, self._table) for m in self._tables}
        self._forwards |= {m: lookup_by_row(m, lambda: self.positions) for m in embeds if position_table(m)}
        self._bias_by_row = {m: bias_by_row(m, lambda: self.positions, self._key_columns) for m in biases}
        self._prefiller: SlotKV | None = None  # new rows' prefills (`prefill`), made on first use
        self._lock = threading.Lock()
        self._reset()

    def _fit(self, end: int, keep: int) -> None:
        """Room for a pass that writes up to column `end` (widened to `min_width`), keeping the first `keep`."""
        if end + self.min_width - 1 > self.capacity:
            self._grow(end + self.min_width - 1, keep)
        # Graphed or compiled passes attend over every column (one shape per capacity); eager ones only up to their
        # end, which is faster (docs/how-it-works.md, "On a GPU: static caches and CUDA graphs").
        fixed = self.full_width or self.passes.on or self.passes.compiles or self.passes.compile_prefills
        self.visible = self.capacity if fixed else end + self.min_width - 1

    def _grow(self, need: int, keep: int) -> None:
        """Room for `need` columns per row, keeping the first `keep`."""
        self.capacity = capacity_for(need)
        for layer in self.cache.layers:
            layer.grow(keep)
        self.columns = torch.arange(self.capacity, device=self.device)
        self.passes.drop("encode", "cross")  # (the only ones that never touch these buffers)
        self._copy_tables()

    def _inputs(self, tokens: list[list[int]], bases: list[int], pad: int, width: int = 0) -> torch.Tensor:
        """A pass's packed host inputs: per row its tokens (padded to the widest, or `width`), first position, count."""
        w = max(width, *(len(t) for t in tokens))
        return torch.tensor([t + [pad] * (w - len(t)) + [b, len(t)] for t, b in zip(tokens, bases, strict=True)],
                            dtype=torch.long)

    def _pass(self, inp: torch.Tensor, keep: int) -> torch.Tensor:
        """`_packed_pass` inside `_by_row`; compiled where asked (all-logits passes up to a graph's width; with
        `compile_prefills`, one-logit prefills) once the buffers exist (a first pass allocates them)."""
        w = inp.shape[1] - 2
        with self._by_row():
            ready = self.cache.layers[0].is_initialized
            if ready and keep == 1 < w and self.passes.compiling("prefill"):
                out = self.passes.compiled("prefill", self._prefill_pass, inp)
            elif ready and keep == w <= MAX_GRAPH_WIDTH and self.passes.compiling("decode"):
                out = self.passes.compiled("decode", self._packed_pass, inp, 0)  # 0: all logits
            else:
                out = None
            return self._packed_pass(inp, keep) if out is None else out

    def _prefill_pass(self, inp: torch.Tensor) -> torch.Tensor:
        return self._packed_pass(inp, 1)

    def _packed_pass(self, inp: torch.Tensor, keep: int) -> torch.Tensor:
        """`_forward` over packed inputs (rows, w + 2): one tensor, so a compiled pass sees one layout at every width.
        Narrower than `min_width`, it repeats its last token as pads (past each row's tokens, logits dropped)."""
        ids, extra = inp[:, :-2], self.min_width - (inp.shape[1] - 2)
        if extra <= 0:
            return self._forward(ids, inp[:, -2], inp[:, -1], keep)
        ids = torch.cat([ids, ids[:, -1:].expand(-1, extra)], dim=1)
        logits = self._forward(ids, inp[:, -2], inp[:, -1], keep + extra if keep else 0)  # (0: every position's)
        return logits[:, : logits.shape[1] - extra]

    def _forward(self, ids: torch.Tensor, base: torch.Tensor, fed: torch.Tensor, keep: int) -> torch.Tensor:
        """The model over `ids` (rows, w), row r's at columns base[r].., logits of the last `keep`; device ops only.
        A pad's position repeats its row's last real one, so pads never pass a model's position limit."""
        w = ids.shape[1]
        self.slots = base[:, None] + self.columns[:w]
        last = (fed - 1).clamp(min=0)[:, None]
        positions = base[:, None] + torch.minimum(self.columns[:w][None], last)
        mask = self._masks()
        kwargs = {"logits_to_keep": keep} if self._logits_kwarg else {}
        if self.encdec:
            self.seen = self._starts(base)
            self.positions = positions  # read by relative biases in slots (`_by_row`) and position tables (`_forwards`)
            # (the encoder mask at the pass's own query count: some attention modules check its size)
            out = self.model(decoder_input_ids=ids, decoder_attention_mask=mask,
                             attention_mask=self.enc_mask[: ids.shape[0]].expand(-1, -1, w, -1),
                             encoder_outputs=encoder_output(self.model, self.unused[: ids.shape[0]]),
                             cache=EncoderDecoderCache(self.cache, self.cross), use_cache=True, **kwargs)
        else:
            out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask, cache=self.cache,
                             use_cache=True, **kwargs)
        return out.logits

    def _masks(self) -> torch.Tensor | dict[str, torch.Tensor]:
        """The pass's 4D additive masks (rows, 1, w, visible): columns after the query's own hidden and, for sliding
        layers, those `window` or more behind it (as the models count); by layer type for a hybrid (Gemma 2/3)."""
        behind = self.slots[:, None, :, None] - self.columns[None, None, None, : self.visible]
        full = torch.zeros(behind.shape, dtype=self.model.dtype, device=self.device).masked_fill_(behind < 0, self._low)
        if self.window is None:
            return full
        slide = full.masked_fill(behind >= self.window, self._low)
        if self.layer_types is None:
            return slide
        return {kind: slide if kind == "sliding_attention" else full for kind in set(self.layer_types)}

    def _chain(self, inp: torch.Tensor, k: int) -> torch.Tensor:
        """(rows, k) greedy tokens: the pass `inp`, then k-1 one-token passes fed the picks on the device (no host wait)
        A row that fed nothing writes from its length on, like a pad, never over its tokens."""
        w = inp.shape[1] - 2
        base, fed = inp[:, w], inp[:, w + 1]
        # One row past the graph width (a prompt) feeds all w: its last position's logits suffice.
        keep = 1 if self.buffer_rows == 1 and w > MAX_GRAPH_WIDTH else w
        logits = self._pass(inp, keep)
        last = (fed - 1).clamp(min=0) - (w - logits.shape[1])  # (a model may return them all)
        picks = [logits[torch.arange(self.buffer_rows, device=self.device), last].argmax(-1)]
        one, start = torch.ones_like(fed), base + fed
        for i in range(1, k):
            # Rows with fewer drafts step past them, at most to the model's last position: a column no real token
            # takes, as a row's last token is never fed.
            at = start + (i - 1) if self._last_position is None else (start + (i - 1)).clamp(max=self._last_position)
            picks.append(self._pass(torch.stack([picks[-1], at, one], dim=1), 1)[:, -1].argmax(-1))
        return torch.stack(picks, dim=1)

    def _starts(self, base: torch.Tensor) -> torch.Tensor:
        """An encoder-decoder's self-attention length, as its layers report it: per row (slots, 1), so position
        embeddings count from each row's own start; one slot's, the pass's first position, as any one row's."""
        return base[:, None] if self.buffer_rows > 1 else base[0]

    def _by_row(self, biases: bool = True):
        """A context in which `_forwards`' embeddings take each row's `self.positions` and, over several slots (and
        `biases`), relative biases each row's (`decoder.bias_by_row`, over the static column count: no host wait); an
        encoder-decoder's pass holds the model's pass lock either way (`decoder.pass_lock`). Set around the pass,
        outside compiled code: dynamo's tracing does not keep a patched `compute_bias`."""
        by_row = self._bias_by_row if biases and self.buffer_rows > 1 else {}
        if not self._forwards and not by_row:
            return pass_lock(self.model) if self.encdec else contextlib.nullcontext()
        return hooked(self.model, by_row, self._forwards)

    def _key_columns(self, key_length: int) -> tuple[torch.Tensor, int]:
        return self.columns[None, None, :key_length], key_length

    def _copy_tables(self) -> None:
        """This cache's copy of each `_tables` table, extended with the module's sinusoids to every column. Graphs read
        the copy, which stays put when an eager pass elsewhere grows (and frees) the module's own table."""
        for module in self._tables:
            need = self.capacity + module.padding_idx + 1
            if module in self._table and self._table[module].shape[0] >= need:
                continue
            own = module.weights
            more = module.get_embedding(max(need, own.shape[0]), own.shape[-1], module.padding_idx)[own.shape[0]:]
            self._table[module] = torch.cat([own, more.to(own)])
            self.passes.drop("encode")  # (decoder passes read the old copy)

    def _grow_encoder(self, n: int) -> None:
        """Cross-attention buffers and encoder masks of at least n columns, keeping each row's; new columns masked by
        the dtype's minimum, not -inf (a free slot, with none visible, attends uniformly to finite zeros)."""
        old = self.enc_capacity
        self.enc_capacity = capacity_for(n)
        mask = torch.full((self.buffer_rows, 1, 1, self.enc_capacity), self._low, dtype=self.model.dtype,
                          device=self.device)
        mask[..., :old] = self.enc_mask if old else 0
        self.enc_mask = mask
        self.unused = shape_only_hidden(self.model, self.buffer_rows, self.enc_capacity)
        for layer in self.cross.layers:
            layer.grow(old)
        self.passes.drop()  # they hold the old buffers' addresses

    # -- prompts: new rows' prefills, together in one pass ----------------------------------------

    @torch.inference_mode()
    def encode_rows(self, prompts: list[list[int]], encoded: list[dict] | None = None) -> list[dict]:
        """Encoder-decoder: the prompts' encoder outputs (run now, or `encoded`: another decoder's, from this model's
        encoder module) and cross-attention keys/values, written into the first rows (row j's in row j) by a one-token
        decoder pass (`_cross`). With graphs, prompts and rows are padded (`_encoder_width`, `admission_rows`) and both
        passes replay a graph per (width, rows); the pads are masked everywhere, so each prompt's results are its own
        (up to rounding). Returns each row's outputs and mask (for a draft sharing the encoder)."""
        r = len(prompts)
        rows = admission_rows(r, self.buffer_rows)
        n = max(len(p) for p in prompts)
        graphed = self.passes.prompt_graphs("cross") and n <= MAX_PREFILL_GRAPH
        if encoded is None:
            width = self._encoder_width(n) if graphed else n
        else:  # graphed where padded as this decoder pads (not, say, a growing cache's outputs)
            width = encoded[0]["encoder_outputs"].last_hidden_state.shape[1]
            same = all(e["encoder_outputs"].last_hidden_state.shape[1] == width for e in encoded)
            if not same:  # (rows prefilled another way: the encoder runs again)
                return self.encode_rows(prompts)
            graphed = graphed and width == self._encoder_width(n)
        if width > self.enc_capacity:  # new buffers (and graphs over them)
            self._grow_encoder(width)
        seen = torch.tensor([len(p) for p in prompts] + [1] * (rows - r))  # (a dummy row sees its first pad)
        self.enc_mask[:rows] = torch.zeros((), dtype=self.enc_mask.dtype).masked_fill(
            torch.arange(self.enc_capacity)[None] >= seen[:, None], self._low).to(self.device)[:, None, None]
        if self._start is None:
            self._start = torch.tensor([initial_decoder_ids(self.model, [])], device=self.device)
        self._copy_tables()
        key = (lambda kind: (kind, width)) if rows == 1 else (lambda kind: (kind, width, rows))
        of = "" if rows == 1 else f" of {rows} rows"
        if encoded is None:
            pad = getattr(self.model.config, "pad_token_id", None) or 0
            ids = torch.tensor([p + [pad] * (width - len(p)) for p in prompts] + [[pad] * width] * (rows - r))
            visible = (torch.arange(width)[None] < seen[:, None]).long().to(self.device)

            def eager(x: torch.Tensor) -> torch.Tensor:  # (without graphs unpadded: all ones, as `generate()` has it)
                return run_encoder(self.model, input_ids=x.to(self.device), attention_mask=visible).last_hidden_state

            if graphed and self.passes.prompt_graphs("encode"):
                # A copy: the next admission's replay overwrites a graph's output. An encoder that cannot be captured
                # (BART's in float16 checks its outputs on the host; LED's reads global attention there) runs `eager`.
                hidden = self.passes.run(key("encode"), ids, self._encoder, f"the encoder over {width} tokens{of}",
                                         graphed=True, fallback=eager).clone()
            else:
                hidden = eager(ids)
        else:
            hidden = torch.cat([e["encoder_outputs"].last_hidden_state for e in encoded])
            visible = torch.cat([e["attention_mask"] for e in encoded])
            if rows > r:
                hidden = torch.cat([hidden, hidden[-1:].expand(rows - r, -1, -1)])
        self.passes.run(key("cross"), hidden, self._cross, f"the cross-attention of {width} encoder outputs{of}",
                        graphed=graphed)
        return [{"encoder_outputs": encoder_output(self.model, hidden[j:j + 1]),
                 "attention_mask": visible[j:j + 1]} for j in range(r)]

    def _encoder_width(self, n: int) -> int:
        """A graphed encoder pass's padded width: `prefill_width`, within the encoder's position table where it has one
        (`loading.positions`: BART's learned, Marian's and Pegasus's sinusoidal; T5's are relative)."""
        limit = positions(self.model.config, encoder=True)
        return max(n, min(prefill_width(n), limit or prefill_width(n)))

    def _encoder(self, ids: torch.Tensor) -> torch.Tensor:
        """Encoder outputs over padded prompts, pads hidden by `enc_mask` (4D: never read on the host); device ops."""
        rows, w = ids.shape  # (the mask at the pass's own query count: some attention modules check its size)
        return run_encoder(self.model, input_ids=ids, attention_mask=self.enc_mask[:rows, ..., :w].expand(
            -1, -1, w, -1)).last_hidden_state

    def _cross(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each layer's cross-attention keys/values of `hidden` (rows, w, d) into the first rows, by a one-token decoder
        pass; device ops only. Returns its logits (the graph's output, which its check replay compares)."""
        rows = hidden.shape[0]
        cache = EncoderDecoderCache(Cache(layers=[ScratchLayer() for _ in range(self.layers)]), self.cross)
        cache.is_updated = dict.fromkeys(range(self.layers), False)  # every layer computes its keys and writes them
        kwargs = {"logits_to_keep": 1} if self._logits_kwarg else {}
        # A 4D decoder mask (the token sees itself), taken as it is: nothing is read on the host.
        alone = torch.zeros((rows, 1, 1, 1), dtype=self.model.dtype, device=self.device)
        self.positions = self._first.expand(rows, 1)  # the token's position, for `_tables` (`_by_row`)
        with self._by_row(biases=False):  # (at position 0 in every row: the model's own bias)
            return self.model(encoder_outputs=encoder_output(self.model, hidden),
                              attention_mask=self.enc_mask[:rows], decoder_input_ids=self._start.expand(rows, 1),
                              decoder_attention_mask=alone, cache=cache, use_cache=True, **kwargs).logits

    def prefill_rows(self, feeds: list[list[int]], bases: list[int]) -> None:
        """These rows' tokens into the first rows (row j's from column bases[j] on), no logits kept, in one pass padded
        to `prefill_width` and `admission_rows`, replayed as that graph (eagerly it costs a decode step's launches).
        Pads land past the tokens, hidden; causal attention keeps the tokens' keys/values the unpadded pass's."""
        r = len(feeds)
        rows = admission_rows(r, self.buffer_rows)
        n = max(len(f) for f in feeds)
        padded = n <= MAX_PREFILL_GRAPH
        width = prefill_width(n) if padded else n
        self._fit(max(bases) + width, max(bases))
        inp = self._inputs(feeds + [[]] * (rows - r), bases + [0] * (rows - r), 0, width)
        key, of = (("prefill", width), "") if rows == 1 else (("prefill", width, rows), f" of {rows} rows")
        self.passes.run(key, inp, lambda x: self._pass(x, 1), f"a {width}-token prefill{of}", graphed=padded)

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
        Prefilled together, up to `ADMIT_ROWS` a pass, in a second cache of this model (`_prefiller`'s `prefill_rows`;
        an encoder-decoder's `prompts` by its `encode_rows`, given `encoded`: a shared encoder's), then copied into
        their slots. Returns an encoder-decoder's `encoded` per row."""
        slots = self._take_free(len(feeds)) if into is None else [self.slot_of[b] for b in into]
        if self._prefiller is None:
            settings = replace(self.settings, compile_prefills=self.passes.compile_prefills)
            self._prefiller = SlotKV(self.model, self.admit_rows, self.pad_id, graphs=self.passes.on,
                                     strict=self.passes.strict, min_width=self.min_width, settings=settings,
                                     full_width=self.full_width)
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
