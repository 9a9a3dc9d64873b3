"""Turning logits into the distributions p and q, the same way for target and draft.

The accept/reject rule is exact only if p and q are the distributions the target and the
draft would actually sample from, after the same processing. We use Hugging Face's own
logits processors, built from our settings plus the target's generation config (forced
BOS/EOS, repetition rules), so that greedy output equals `target.generate()` exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

# Processors whose output for a row ignores the tokens before it: they run on a whole verify block at once.
_ROW_WISE = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, SuppressTokensLogitsProcessor)


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 (none: no top-k), got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


# Generation-config fields whose processors `build_processors` leaves out (rare); `unapplied` names them for the log.
_NOT_APPLIED = ("sequence_bias", "encoder_repetition_penalty", "encoder_no_repeat_ngram_size",
                "exponential_decay_length_penalty", "begin_suppress_tokens", "guidance_scale", "watermarking_config",
                "stop_strings")  # (the job's --stop sets its stop strings)


def unapplied(generation_config: GenerationConfig) -> list[str]:
    """What of a generation config the engines do not do as `generate()` would, as "field=value": beam search (the
    outputs are `generate(num_beams=1)`'s) and the processors of `_NOT_APPLIED`."""
    gc, default = generation_config, GenerationConfig()
    out = [f"num_beams={gc.num_beams}"] if (gc.num_beams or 1) > 1 else []
    return out + [f"{name}={getattr(gc, name)!r}" for name in _NOT_APPLIED
                  if getattr(gc, name, None) not in (None, getattr(default, name))]


def config_sampling(gc: GenerationConfig) -> str:
    """The flags that sample as a config's `generate()` does by default (top-k 50 unless set), "" where it is greedy."""
    if not gc.do_sample or gc.temperature == 0:
        return ""
    top_k, top_p = 50 if gc.top_k is None else gc.top_k, gc.top_p
    return " ".join([f"--temperature {1.0 if gc.temperature is None else gc.temperature!r}"]
                    + [f"--top_k {top_k}"] * bool(top_k) + [f"--top_p {top_p!r}"] * (top_p not in (None, 1.0)))


def build_processors(sampling: SamplingSettings, generation_config: GenerationConfig, start_length: int,
                     max_new_tokens: int, device: torch.device) -> LogitsProcessorList:
    """The processors `generate()` would apply for these settings (greedy or sampling, batch 1), in its order.
    `start_length`: the decoder tokens a generation starts from; max_length is that plus max_new_tokens, as in generate.
    """
    gc = generation_config
    max_length, eos = start_length + max_new_tokens, gc.eos_token_id
    procs = LogitsProcessorList()
    if gc.repetition_penalty is not None and gc.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(gc.repetition_penalty))
    if gc.no_repeat_ngram_size:
        procs.append(NoRepeatNGramLogitsProcessor(gc.no_repeat_ngram_size))
    if gc.bad_words_ids:  # Marian's configs forbid the pad token this way
        procs.append(NoBadWordsLogitsProcessor(gc.bad_words_ids, gc.eos_token_id))
    # No end before a length (BART-large-CNN: min_length=56); as in generate(), min_new_tokens + start replaces it.
    min_length = gc.min_length if gc.min_new_tokens is None else start_length + gc.min_new_tokens
    if min_length and eos is not None:
        procs.append(MinLengthLogitsProcessor(min_length, eos, device=device))
    if gc.min_new_tokens and eos is not None:
        procs.append(MinNewTokensLengthLogitsProcessor(start_length, gc.min_new_tokens, eos, device=device))
    if gc.forced_bos_token_id is not None:
        procs.append(ForcedBOSTokenLogitsProcessor(gc.forced_bos_token_id))
    if gc.forced_eos_token_id is not None:
        procs.append(ForcedEOSTokenLogitsProcessor(max_length, gc.forced_eos_token_id, device=device))
    if gc.suppress_tokens:
        procs.append(SuppressTokensLogitsProcessor(gc.suppress_tokens, device=device))
    if not sampling.greedy:
        if sampling.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(sampling.temperature))
        if sampling.top_k is not None:
            procs.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p is not None and sampling.top_p < 1.0:
            procs.append(TopPLogitsWarper(sampling.top_p))
    return procs


class LogitsTransform:
    """Applies the processors to the last rows of a sequence's logits."""

    def __init__(self, processors: LogitsProcessorList):
        self.processors = processors
        self.row_wise = all(isinstance(p, _ROW_WISE) for p in processors)

    def _apply(self, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # Called directly: `LogitsProcessorList.__call__` runs `inspect.signature` on each, every call (slow).
        for processor in self.processors:
            scores = processor(ids, scores)
        return scores

    def __call__(self, seq: list[int], scores: torch.Tensor) -> torch.Tensor:
        """Row j of `scores` (m, V) predicts the token after seq[:len(seq)-m+1+j]."""
        if not self.processors:
            return scores
        m = scores.shape[0]
        if self.row_wise:  # these processors ignore the ids: skip building them
            return self._apply(torch.zeros((m, 1), dtype=torch.long, device=scores.device), scores)
        ids = torch.tensor([seq], device=scores.device)
        rows = [self._apply(ids[:, : len(seq) - m + 1 + j], scores[j : j + 1]) for j in range(m)]
        return torch.cat(rows)


def draft_pick(scores: torch.Tensor, greedy: bool, generator: torch.Generator) -> tuple[int, torch.Tensor | None]:
    """A draft's token from its processed scores (1, V): the argmax, or a sample and the q it was drawn from.
    Where the draft's logits overflowed (NaN or inf, as fp16 can), q is uniform: accept/reject is exact for any q a
    draft really draws from, so those drafts are only wasted, where torch's sampler would have failed the row."""
    if greedy:
        return int(scores.argmax(-1).item()), None
    q = scores.softmax(-1)
    q = torch.where(q.isfinite().all(-1, keepdim=True), q, torch.full_like(q, 1.0 / q.shape[-1]))
    return int(torch.multinomial(q[0], 1, generator=generator).item()), q


def residual(p: torch.Tensor, q: torch.Tensor | None, drafted: int) -> torch.Tensor:
    """norm(max(0, p - q)): where to sample after a rejection (q None: one-hot on `drafted`); p itself where no mass
    is left (p == q up to rounding: the rejection was a rounding artefact)."""
    r = p.clone()
    if q is None:
        r[drafted] = 0.0
    else:
        r = (r - q).clamp_min_(0.0)
    total = r.sum()
    if total.item() <= 1e-12:
        return p
    return r / total
