"""A model's decoder over a preallocated KV cache, its passes replayed as CUDA graphs.

Eager, a GPU waits on a pass's thousands of kernel launches; a graph replays them in one but needs fixed shapes
and addresses, so the cache is one buffer per layer of `capacity` columns, a pass writes at its positions and
attends through an explicit 4D mask, and a rollback only moves a row's length. `StaticKV` holds the buffers and plain
pass functions for any number of rows (`graphs.PassGraphs` runs them); `slot_kv.SlotKV` holds a batch's rows in
slots, batch 1 in one. Without CUDA the same passes run eagerly
(docs/how-it-works.md, "On a GPU: static caches and CUDA graphs").
"""

from __future__ import annotations

import contextlib
import logging

import torch
from transformers import EncoderDecoderCache, PreTrainedModel
from transformers.cache_utils import Cache

from specdec_core.decoder import (
    _accepts_logits_to_keep,
    counts_positions_from_ids,
    decoder_position_modules,
    encoder_output,
    hooked,
    initial_decoder_ids,
    mixed_layer_types,
    own_kv_layers,
    pass_lock,
    position_table,
    run_encoder,
    shape_only_hidden,
    sliding_window,
)
from specdec_core.graphs import PassGraphs
from specdec_core.loading import context_limit, positions
from specdec_core.pass_settings import DEFAULT, PassSettings
from specdec_core.placement import decoder_layers
from specdec_core.static_layers import CrossLayer, FixedLayer, ScratchLayer

log = logging.getLogger(__name__)

CAPACITY_STEP = 512  # columns; a cache grows to the next multiple of this when an item needs more
MAX_GRAPH_WIDTH = 16  # widest decode pass captured: a verify pass is gamma + 1 tokens
# Graphed prefills are padded to a few widths (`prefill_width`); wider than MAX_PREFILL_GRAPH, eager at their own.
PREFILL_STEP = 512
MAX_PREFILL_GRAPH = 4096


def capacity_for(n: int) -> int:
    """Columns a static buffer allocates to hold n: the next multiple of `CAPACITY_STEP`."""
    return -(-n // CAPACITY_STEP) * CAPACITY_STEP


def prefill_width(n: int) -> int:
    """The width a graphed prefill of n tokens is padded to: at most twice the work, 17 widths up to 4096."""
    if n <= PREFILL_STEP:
        return 1 << max(n - 1, 0).bit_length()
    return -(-n // PREFILL_STEP) * PREFILL_STEP


def admission_rows(rows: int, most: int) -> int:
    """The rows (one graph each) of a pass admitting `rows` new ones: 1, 4 or 16, at most `most`, dummies filling in."""
    return min(next(r for r in (1, 4, 16, rows) if r >= rows), most)


class StaticKV:
    """Key/value buffers for `rows` sequences, a row's column i holding its token at position i, and passes over them.

    A pass writes each row from its length on (a short row's pads past its tokens, overwritten by its next pass),
    attending through a 4D mask that hides every column after the query's own; a rollback only moves a length."""

    def __init__(self, model: PreTrainedModel, rows: int, graphs: bool | None = None, strict: bool = False,
                 batched: bool = False, compile: bool = False, min_width: int = 1, settings: PassSettings = DEFAULT,
                 full_width: bool = False):
        """min_width: the narrowest pass the model runs (`takes_static`); narrower ones are widened with hidden pads.
        full_width: eager passes attend over every column too, as graphed ones do (the self-checks: a model that
        ignores a mask sees the most columns it can). A failed capture leaves passes eager over the same buffers."""
        self.model = model
        self.settings = settings
        self.device = model.device
        self.buffer_rows = rows
        self.min_width = min_width
        self.layers = decoder_layers(model.config)
        # A chain's steps past a row's drafts are clamped here: no position table is indexed past its end.
        limit = context_limit(model)
        self._last_position = None if limit is None else limit - 1
        self.capacity = 0
        self.visible = 0  # the columns a pass attends over (`_fit`)
        self.full_width = full_width
        # compile_prefills None: compiled in slots (measured faster at wide batches), not at batch 1 (not measured).
        prefills = compile and batched if settings.compile_prefills is None else settings.compile_prefills
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
        # Position embeddings counting from ids (M2M100, NLLB) read this cache's table copies (`_copy_tables`);
        # every other position table is looked up at each row's positions (`_lookup_forward`).
        embeds = decoder_position_modules(model)[0] if self.encdec else []
        self._tables = [m for m in embeds if counts_positions_from_ids(m)]
        self._table: dict[torch.nn.Module, torch.Tensor] = {}
        self._forwards = {m: self._table_forward(m) for m in self._tables}
        self._forwards |= {m: self._lookup_forward(m) for m in embeds if position_table(m)}

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
            self.positions = positions  # read by relative biases in slots (`SlotKV._by_row`), and `_table_forward`
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
        """An encoder-decoder's self-attention length, as its layers report it: the pass's first position (one row)."""
        return base[0]

    def _by_row(self):
        """A context in which `_forwards`' embeddings take each row's `self.positions`; an encoder-decoder's pass
        holds the model's pass lock either way (`decoder.pass_lock`)."""
        if not self._forwards:
            return pass_lock(self.model) if self.encdec else contextlib.nullcontext()
        return hooked(self.model, {}, self._forwards)

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

    def _table_forward(self, module: torch.nn.Module):
        """A `counts_positions_from_ids` embedding's forward (its own compares a device length with its table's size on
        the host): the module's count for each token fed alone at `self.positions`, as `generate()` feeds it (a pad id
        keeps the padding position, moving no later token), in this cache's copy of its table."""
        def forward(input_ids=None, inputs_embeds=None, cache_length=0):
            at = self.positions.reshape(-1, 1)
            if input_ids is not None:
                ids = module.create_position_ids_from_input_ids(input_ids.reshape(-1, 1), module.padding_idx, at)
            else:
                ids = module.create_position_ids_from_inputs_embeds(
                    inputs_embeds.reshape(-1, 1, inputs_embeds.shape[-1]), at, module.padding_idx)
            table = self._table[module]
            return table.index_select(0, ids.view(-1)).view(*self.positions.shape, table.shape[-1])
        return forward

    def _lookup_forward(self, module: torch.nn.Module):
        """A `position_table` embedding's forward: its rows at `self.positions` past its `offset` (BART's table has two
        rows first); pads repeat their row's last position, so none passes the table."""
        offset = int(getattr(module, "offset", 0))

        def forward(*args, **kwargs):
            return torch.nn.functional.embedding(self.positions + offset, module.weight)
        return forward

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
        with self._by_row():
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

