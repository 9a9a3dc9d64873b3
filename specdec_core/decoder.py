"""One model's decoder with its KV cache, for causal and encoder-decoder models alike.

The engine sees every model through this class: feed the tokens the cache has not seen yet
(plus optional extra tokens), get logits for the last positions, and roll the cache back
to a shorter length. Positions come from the cache length, so nothing here is specific
to one architecture.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import weakref
from functools import cache

import torch
from transformers import PreTrainedModel

from specdec_core.kv_cache import new_cache


@cache
def _accepts_logits_to_keep(model_cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_cls.forward).parameters


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: a timer around a GPU pass must, as the call returns early."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def initial_decoder_ids(model: PreTrainedModel, prompt_ids: list[int]) -> list[int]:
    """The token sequence the decoder starts from: the prompt, or the decoder start token."""
    if not model.config.is_encoder_decoder:
        return list(prompt_ids)
    start = model.generation_config.decoder_start_token_id
    if start is None:
        start = model.config.decoder_start_token_id
    if isinstance(start, list):
        start = start[0]
    if start is None:
        raise ValueError(f"{type(model).__name__} has no decoder_start_token_id in its config")
    return [int(start)]


def eos_ids(model: PreTrainedModel) -> set[int]:
    """The token ids that end a generation (generation config first, as generate() reads them)."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, list) else [eos])}


_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pass_lock(model: PreTrainedModel) -> threading.RLock:
    """The lock of `model`'s passes that hook its modules (`batch_kv.hooked`: position embeddings
    and relative biases, changed for every caller while such a pass runs), which an
    encoder-decoder's other passes take too (here, in `BatchKV` and in static caches), so that
    none runs through another thread's hooks. Decoder-only models are never hooked."""
    return _LOCKS.setdefault(model, threading.RLock())


class CachedDecoder:
    """A model plus the KV cache of the decoder tokens it has already processed."""

    def __init__(self, model: PreTrainedModel, prompt_ids: list[int], encoded: dict | None = None):
        """encoded: another decoder's `encoded`, over the same prompt and from this model's own
        encoder module (a draft sharing the target's encoder): the encoder does not run again."""
        self.model = model
        self.device = model.device
        self.length = 0  # decoder tokens held in the cache
        self._logits_kwarg = _accepts_logits_to_keep(type(model))
        self.encoded: dict = {}
        if model.config.is_encoder_decoder:
            if encoded is not None:
                self.encoded = encoded
            else:
                ids = torch.tensor([prompt_ids], device=self.device)
                mask = torch.ones_like(ids)
                # Encode once per item; every decoder step reuses the encoder outputs.
                self.encoded = {
                    "encoder_outputs": model.get_encoder()(input_ids=ids, attention_mask=mask),
                    "attention_mask": mask,
                }
        self.cache = new_cache(model.config.is_encoder_decoder)

    @torch.inference_mode()
    def forward(self, tokens: list[int], num_logits: int) -> torch.Tensor:
        """Feed tokens[self.length:], return float32 logits of the last `num_logits` positions."""
        new = tokens[self.length :]
        if not new:
            raise ValueError("forward() needs at least one token the cache has not seen")
        ids = torch.tensor([new], device=self.device)
        key = "decoder_input_ids" if self.model.config.is_encoder_decoder else "input_ids"
        kwargs = {key: ids, "cache": self.cache, "use_cache": True, **self.encoded}
        if self._logits_kwarg:
            kwargs["logits_to_keep"] = max(num_logits, 1)
        # An encoder-decoder's pass: not while another thread's pass hooks its decoder.
        with pass_lock(self.model) if self.model.config.is_encoder_decoder else contextlib.nullcontext():
            out = self.model(**kwargs)
        self.length = len(tokens)
        if num_logits == 0:
            return out.logits[0, :0].float()
        return out.logits[0, -num_logits:].float()

    def rollback(self, length: int) -> None:
        """Drop cached positions >= length (only the decoder self-attention cache)."""
        if length < self.length:
            # transformers 5 caches take a negative count of tokens to remove.
            self.cache.crop(length - self.length)
            self.length = length
