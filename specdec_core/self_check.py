"""Self-checks of a model before any item: a few passes over a short prompt, run the way the
engines would run it, against the model's own growing cache fed as `generate()` feeds it.

Most Hugging Face models keep the engines' contracts (multi-token passes, explicit 4D masks, per-row positions)
and a few do not: a model that breaks one is refused with the reason, or run the way that keeps it exact, instead
of changing outputs. Each check runs once per model object and process
(docs/how-it-works.md, "Self-checks: the models' contracts").
"""

from __future__ import annotations

import os
import traceback
import weakref
from collections.abc import Callable

import torch
from transformers import PretrainedConfig, PreTrainedModel

from specdec_core.batch_kv import BatchKV, feed_to, one_row
from specdec_core.cpu_speed import Bf16Linear
from specdec_core.decoder import initial_decoder_ids, other_layer_kinds, sliding_window
from specdec_core.slot_kv import SlotKV

_DONE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _once(model: PreTrainedModel, key: tuple, check):
    """`check()`'s answer for this model and the special ids its probes leave out (set in place: other probes)."""
    done, key = _DONE.setdefault(model, {}), (*key, _special_ids(model))
    if key not in done:
        done[key] = check()
    return done[key]


def _said(e: Exception) -> str:
    """An error in a reason: its message, or where it was raised (FSMT's static-cache one is a bare assert)."""
    frame = e.__traceback__ and traceback.extract_tb(e.__traceback__)[-1]
    where = f"at {os.path.basename(frame.filename)}:{frame.lineno}" if frame else ""
    return f"{type(e).__name__}: {str(e)[:120]}" if str(e) else f"{type(e).__name__} {where}".strip()


def _special_ids(model: PreTrainedModel) -> frozenset[int]:
    """The config's pad, bos, eos (one id or a list, as Llama 3.1's) and decoder-start ids."""
    config = model.config.get_text_config(decoder=True)
    ids = [getattr(config, f"{k}_token_id", None) for k in ("pad", "bos", "eos", "decoder_start")]
    return frozenset(i for v in ids for i in (v if isinstance(v, list) else [v]) if i is not None)


def probe_ids(model: PreTrainedModel, n: int, offset: int = 0) -> list[int]:
    """n ordinary token ids of the model's vocabulary (none of its special ids)."""
    config, special = model.config.get_text_config(decoder=True), _special_ids(model)
    # (the output layer's rows: an int8 draft's layer has no weight tensor)
    vocab = getattr(model.get_output_embeddings(), "out_features", None) or config.vocab_size
    ids = [i for i in range(vocab // 3 + offset, vocab) if i not in special]
    return [ids[(7 * j) % len(ids)] for j in range(n)]


def logits_differ(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype = torch.float32) -> str | None:
    """How a check's logits part beyond rounding, or None: by 1e-3 of the largest in float32, 10% in 16-bit types
    (a broken contract moves them more; the float32 tests are the proof; a false alarm costs speed, or refuses an
    ill-conditioned model, never outputs)."""
    rel = 1e-3 if dtype == torch.float32 and got.dtype == want.dtype == torch.float32 else 0.1
    gap = float((got.float() - want.float()).abs().max()) if got.shape == want.shape else float("inf")
    top = float(want.float().abs().max())
    return None if gap <= rel * max(top, 1e-6) else f"by {gap:.3g} (largest logit {top:.3g})"


def _probe(model: PreTrainedModel) -> tuple[list[int], list[int], list[int]]:
    """The checks' prompt, the decoder tokens it starts from, and the tokens fed after them."""
    prompt = probe_ids(model, 9)
    return prompt, initial_decoder_ids(model, prompt), probe_ids(model, 6, offset=1)


def probe_passes(kv, seq: list[int], extra: list[int]) -> list[torch.Tensor]:
    """The checks' passes over a one-row cache (holding nothing yet): seq then 3 drafts, the third
    rejected (rolled back) and re-fed alone, then two more."""
    out = [feed_to(kv, seq + extra[:3], 4)]
    kv.rollback(0, len(seq) + 2)
    return out + [feed_to(kv, seq + extra[:3], 1), feed_to(kv, seq + extra[:5], 2)]


@torch.inference_mode()
def _growing(model: PreTrainedModel) -> list[torch.Tensor]:
    """`probe_passes` over the model's own growing cache, once per model (on the CPU): the checks' reference."""
    def passes() -> list[torch.Tensor]:
        prompt, seq, extra = _probe(model)
        return [t.cpu() for t in probe_passes(one_row(model, prompt), seq, extra)]
    return _once(model, ("growing passes",), passes)


@torch.inference_mode()
def _fed_one_at_a_time(model: PreTrainedModel) -> torch.Tensor:
    """The probe's logits after seq's last token and each of extra[:5], fed one at a time as `generate()` does."""
    def passes() -> torch.Tensor:
        prompt, seq, extra = _probe(model)
        kv, full = one_row(model, prompt), seq + extra[:5]
        if len(seq) > 1:
            feed_to(kv, seq[:-1], 0)
        return torch.cat([feed_to(kv, full[: i + 1], 1) for i in range(len(seq) - 1, len(full))]).cpu()
    return _once(model, ("fed one at a time",), passes)


def _uncached(model: PreTrainedModel) -> torch.Tensor:
    """The same logits from one pass over the probe's tokens, without a cache."""
    prompt, seq, extra = _probe(model)
    full = torch.tensor([seq + extra[:5]], device=model.device)
    if model.config.is_encoder_decoder:
        out = model(input_ids=torch.tensor([prompt], device=model.device), decoder_input_ids=full, use_cache=False)
    else:
        out = model(input_ids=full, use_cache=False)
    return out.logits[0, len(seq) - 1 :]


def _compare(got: list[torch.Tensor], want: list[torch.Tensor], what: str, model: PreTrainedModel,
             of: str = "logits") -> str | None:
    dtype = torch.bfloat16 if any(isinstance(m, Bf16Linear) for m in model.modules()) else model.dtype  # (coarsest)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if why := logits_differ(g.cpu(), w.cpu(), dtype):
            return f"gives other {of} {what} (pass {i + 1} of {len(want)}, {why})"
    return None


def cache_failure(model: PreTrainedModel) -> str | None:
    """Why this model cannot decode over the engines' growing cache at all (one token at a time,
    a rollback), or None: a model whose layers keep other state (Mamba's) fails here."""
    def check() -> str | None:
        prompt, seq, extra = _probe(model)
        try:
            with torch.inference_mode():
                kv = one_row(model, prompt)
                feed_to(kv, seq + extra[:2], 1)
                kv.rollback(0, len(seq))
                feed_to(kv, seq + extra[:1], 1)
        except Exception as e:
            return _layers_said(model, f"fails over a growing key/value cache ({_said(e)})")
        return None
    return _once(model, ("cache",), check)


def _layers_said(model: PreTrainedModel, why: str) -> str:
    """A growing cache's failure, led by the config's layer kinds that explain it (state-space, linear-attention,
    convolution: per-row state no key/value cache rolls back), as the failure itself reads like an internal error."""
    other = other_layer_kinds(model.config)
    return f"has {', '.join(other)} layers, whose state a key/value cache cannot roll back: it {why}" if other else why


def state_failure(model: PreTrainedModel) -> str | None:
    """Why a target's logits fed one token at a time over a growing cache are not one uncached pass's, or None
    (RecurrentGemma keeps state in its layers, reset only without a cache). Targets only: a draft's numerics (int8,
    bf16 linears) may differ, which changes its guesses, never the output."""
    def check() -> str | None:
        if why := cache_failure(model):
            return why
        with torch.inference_mode():
            try:
                whole = _uncached(model)
            except Exception:  # (no pass without a cache to compare with: nothing this check can say)
                return None
        why = _compare([_fed_one_at_a_time(model)], [whole],
                       "over a growing key/value cache than in one pass without one", model)
        return why and _layers_said(model, why)
    return _once(model, ("state",), check)


def verify_disagreement(model: PreTrainedModel) -> str | None:
    """Why this model's passes of several tokens do not give the logits of those tokens fed one
    at a time, which verifying drafts in one pass needs (FSMT's decoder does not), or None."""
    def check() -> str | None:
        if why := cache_failure(model):
            return why
        try:
            want = _growing(model)
        except Exception as e:  # (its one-token passes work: `cache_failure`)
            return f"fails over several tokens in one pass ({_said(e)})"
        each = _fed_one_at_a_time(model)  # (cut into `probe_passes`' passes)
        return _compare(want, [each[:4], each[3:4], each[4:6]],
                        "over several tokens in one pass than one token at a time", model)
    return _once(model, ("verify",), check)


def static_disagreement(model: PreTrainedModel, min_width: int = 1) -> str | None:
    """Why this model's passes over a static cache (`SlotKV`'s one slot, eager, at least `min_width` wide) would not
    give its own logits, or None: catches a decoder ignoring a 1-token pass's mask (LED's) or failing over buffers."""
    def check() -> str | None:
        prompt, seq, extra = _probe(model)
        try:
            want = _growing(model)
            with torch.inference_mode():
                static = SlotKV(model, 1, graphs=False, min_width=min_width, full_width=True)
                static.acquire()
                static.start(prompt)
                got = probe_passes(static, seq, extra)
        except Exception as e:  # a model whose passes fail over the buffers
            return f"fails over static caches ({_said(e)})"
        return _compare(got, want, "over static caches than over its own cache", model)
    return _once(model, ("static", min_width), check)


def encoder_mask_disagreement(model: PreTrainedModel) -> str | None:
    """Why padded prompts under the static caches' 4D mask (`SlotKV._encoder`, the graphed pass) are not encoded as
    under the encoder's own 2D one, or None: Switch's reads any mask as 2D (a replay repeats the wrong pass unseen)."""
    encoder = getattr(model.config, "encoder", None)
    if isinstance(encoder, PretrainedConfig) and sliding_window(encoder) is not None:  # (T5Gemma's: past any probe)
        return "builds its encoder's window masks from a 2D mask only"
    def check() -> str | None:
        prompts, pad = _rows_probe(model)[0], getattr(model.config, "pad_token_id", None) or 0
        cut = [len(p) for p in prompts]
        try:
            with torch.inference_mode():
                kv = SlotKV(model, 2, graphs=False)
                own = [o["encoder_outputs"].last_hidden_state[0] for o in kv.encode_rows(prompts)]  # (its 2D mask)
                got = kv._encoder(torch.tensor([p + [pad] * (max(cut) - len(p)) for p in prompts], device=model.device))
        except Exception as e:
            return f"fails under a 4D mask ({_said(e)})"
        return _compare([g[:k] for g, k in zip(got, cut, strict=True)], [o[:k] for o, k in zip(own, cut, strict=True)],
                        "under a 4D mask than under its own 2D one", model, of="encoder outputs")
    return _once(model, ("encoder mask",), check)


def narrowest_width(disagreement: Callable[[int], str | None]) -> int | None:
    """The narrowest width, 1 or 2, at which a check (given the width) finds a model exact, or None: a decoder that
    builds no mask for a one-token pass (LED's) gets its own logits with such passes widened to two."""
    return next((w for w in (1, 2) if disagreement(w) is None), None)


def _rows_probe(model: PreTrainedModel) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """The rows check's two prompts, the decoder tokens each starts from, and the tokens fed after."""
    prompts = [probe_ids(model, 9), probe_ids(model, 5, offset=2)]
    return prompts, [initial_decoder_ids(model, p) for p in prompts], probe_ids(model, 6, offset=1)


@torch.inference_mode()
def _rows_growing(model: PreTrainedModel) -> list[list[torch.Tensor]]:
    """Each row's `rows_disagreement` passes over its own growing cache (the first with more rejections), once per
    model (on the CPU): the reference of every rows check (slots, padded batches, pass widths)."""
    def passes() -> list[list[torch.Tensor]]:
        prompts, seqs, e = _rows_probe(model)
        first = one_row(model, prompts[0])
        want = [[feed_to(first, seqs[0] + e[:5], 6)]]
        first.rollback(0, len(seqs[0]) + 1)
        want[0] += [feed_to(first, seqs[0] + e[:n], k) for n, k in ((2, 1), (4, 2))]
        alone = one_row(model, prompts[1])
        want.append([feed_to(alone, seqs[1] + e[:n], k) for n, k in ((1, 2), (2, 1), (4, 2))])
        return [[t.cpu() for t in row] for row in want]
    return _once(model, ("rows passes",), passes)


def rows_disagreement(model: PreTrainedModel, pad_id: int = 0, slots: bool = True, min_width: int = 1) -> str | None:
    """Why rows decoded together would not get their own logits, or None: in slots (`slots`, new rows prefilled
    together; after `static_disagreement`) or an eager padded batch. Two rows of different lengths at their own
    positions (a position embedding that cannot take them per row fails), four drafts rejected in one (holes a
    one-token pass must not see), against each row's growing cache. min_width: `SlotKV`'s or `BatchKV`'s."""
    def check() -> str | None:
        if slots and (why := static_disagreement(model, min_width)):
            return why
        where = "in slots" if slots else "in a padded batch"
        prompts, seqs, e = _rows_probe(model)
        try:
            want = _rows_growing(model)
            with torch.inference_mode():
                if slots:  # (rows admitted together, as the batch engine's slots take them on a GPU)
                    kv = SlotKV(model, 2, pad_id, graphs=False, min_width=min_width, full_width=True)
                    kv.acquire()
                    kv.prefill([s[:-1] for s in seqs], prompts=prompts if kv.encdec else None)
                else:  # (the batch engine's admission without slots)
                    kv = BatchKV(model, 2, pad_id, min_width)
                    if kv.encdec:
                        kv.encode(prompts)
                    else:
                        kv.forward([s[:-1] for s in seqs], logits=False)
                got: list[list[torch.Tensor]] = [[], []]
                # row 0's last 4 drafts rejected; the second pass feeds one token per row, over the holes
                for feeds in ([[seqs[0][-1], *e[:5]], [seqs[1][-1], e[0]]], [[e[1]], [e[1]]], [e[2:4], e[2:4]]):
                    for row, logits, fed in zip(got, kv.forward(feeds), feeds, strict=True):
                        row.append(logits[: len(fed)])
                    if len(got[0]) == 1:
                        kv.rollback(0, len(seqs[0]) + 1)
        except Exception as ex:  # a model whose passes fail there
            return f"fails {where} ({_said(ex)})"
        return _compare(got[0], want[0], f"{where} (row 1) than over its own cache", model) or \
            _compare(got[1], want[1], f"{where} (row 2) than over its own cache", model)
    return _once(model, ("rows", pad_id, slots, min_width), check)
