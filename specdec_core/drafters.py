"""Drafters: who proposes the tokens the target verifies.

A model draft (`ModelDrafter`) is a cache the engines step themselves (`rounds.RoundEngine._draft`). Other
drafters start one session per item (`SessionDrafter`) that proposes up to k tokens and rolls back when the target
rejects some. `Picker` is the engine's choice rule, so a drafter draws its tokens exactly from the q the
accept/reject step uses (docs/how-it-works.md, "Drafters")."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel

from specdec_core.batch_kv import BatchKV, one_row
from specdec_core.decoder import eos_ids
from specdec_core.loading import context_limit
from specdec_core.pass_settings import DEFAULT, PassSettings
from specdec_core.plan import slot_kv_for
from specdec_core.slot_kv import SlotKV

# (sequence so far, logits row (1, V)) -> (chosen token, its distribution (1, V) or None when greedy).
# Where every pick is a plain argmax, the round picks on the device instead (`RoundEngine._plain_greedy`).
Picker = Callable[[list[int], torch.Tensor], tuple[int, torch.Tensor | None]]


def through_end(tokens: list[int], ends: set[int] | frozenset[int]) -> list[int]:
    """Tokens (a chain of drafts, a round's) cut after their first end token: nothing after an end is ever kept."""
    end = next((i for i, t in enumerate(tokens) if t in ends), None)
    return tokens if end is None else tokens[: end + 1]


NO_LIMIT = 1 << 62  # `Drafter.room` where nothing but the budget bounds a round's drafts

# (index of the token about to be proposed, the draft's confidence in it) -> propose it?
KeepDrafting = Callable[[int, float], bool]


@dataclass
class Draft:
    tokens: list[int]
    q: torch.Tensor | None  # (k, V) probabilities the tokens were sampled from; None = one-hot / greedy


class DraftSession(ABC):
    steps = 0  # draft model forward passes, for statistics

    @abstractmethod
    def propose(self, seq: list[int], k: int) -> Draft:
        """Up to k tokens after `seq` (only a model drafter stops early on its confidence: `Row.keep`)."""

    def rollback(self, valid_len: int) -> None:  # noqa: B027 (an optional hook: stateless drafters keep nothing)
        """The first `valid_len` tokens of the decoder sequence are now final."""


# Seconds of drafting per proposed token on this machine: the paper's c before dividing by a target step.
StepTimer = Callable[[], float]


class Drafter:
    def room(self, seq_len: int) -> int:
        """The most tokens this drafter may propose after `seq_len` decoder tokens; the engines never ask for more."""
        return NO_LIMIT


class SessionDrafter(Drafter, ABC):
    """A drafter that drafts for each row apart, through a session of its own."""

    @abstractmethod
    def start(self, prompt_ids: list[int], decoder_ids: list[int], pick: Picker) -> DraftSession:
        """A drafting session for one item."""

    def step_timer(self, prompt_ids: list[int], seq: list[int], burst: int) -> StepTimer | None:
        """A timer of this drafter's cost per proposed token after `seq` (`burst` proposals a timing, as in a round),
        or None where it costs next to nothing against a model pass (prompt lookup)."""
        return None


class NoDrafter(SessionDrafter):
    """Target-only decoding through the same loop: the baseline."""

    def start(self, prompt_ids: list[int], decoder_ids: list[int], pick: Picker) -> DraftSession:
        return _EmptySession()


class _EmptySession(DraftSession):
    def propose(self, seq: list[int], k: int) -> Draft:
        return Draft([], None)


def open_row(model: PreTrainedModel, static: SlotKV | None, prompt_ids: list[int], held: contextlib.ExitStack,
             encoded: dict | None = None) -> SlotKV | BatchKV:
    """A model's decoder for one item, prompt encoded (`encoded`: another decoder's outputs of this model's encoder)
    and decoder empty: its static slot when free (held until `held` closes), else a growing one-row cache."""
    if static is not None and static.acquire():
        held.callback(static.release)
        static.start(prompt_ids, encoded)
        return static
    return one_row(model, prompt_ids, encoded)


def _clamp_ids(embeddings: torch.nn.Embedding, args: tuple) -> tuple:
    return (args[0].clamp(max=embeddings.num_embeddings - 1), *args[1:])


def input_embeddings(owner: torch.nn.Module) -> torch.nn.Module | None:
    """A model's (or its encoder's or decoder's) input embeddings, None where none is found (FSMT's: `embed_tokens`)."""
    try:
        return owner.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return getattr(owner, "embed_tokens", None)


def _clamp_lookups(model: PreTrainedModel) -> None:
    """Clamp ids in the draft's embedding lookup (once per model, inside any graph captured of it): a target with
    more output rows (padded to another multiple) can write one past the draft's embeddings, which the draft then
    reads as its last row, a worse guess, never another output."""
    embeddings = input_embeddings(model.get_decoder() if model.config.is_encoder_decoder else model)
    if isinstance(embeddings, torch.nn.Embedding) and not getattr(embeddings, "_reads_any_token", False):
        embeddings.register_forward_pre_hook(_clamp_ids)
        embeddings._reads_any_token = True


class ModelDrafter(Drafter):
    """A small LM sharing the target's vocabulary, with its own KV cache (another tokenizer: cross_tokenizer.py)."""

    def __init__(self, model: PreTrainedModel, cuda_graphs: str = "auto", chain: bool = False,
                 torch_compile: bool = False, settings: PassSettings = DEFAULT):
        """cuda_graphs, torch_compile: as the engine's. chain: with a static cache and argmax picks, a round's draft
        steps run chained on the device, read back once; the job turns it on with compiled passes, where it pays."""
        self.model = model
        _clamp_lookups(model)
        # A round's drafts end at the draft's end token: nothing after an end is ever kept.
        self.ends = eos_ids(model)
        self.static = slot_kv_for(model, cuda_graphs, compile=torch_compile, settings=settings)
        self.chain = chain
        # The draft's decoder positions (None: relative, as T5's); past them the target goes on alone (`room`).
        self.limit = context_limit(model)
        # An encoder-decoder draft's encoder positions and rows: a longer prompt is cut to them for it, an id past them
        # (a token its target embeds, it not) read as its last row.
        encdec = model.config.is_encoder_decoder
        self.encoder_limit = context_limit(model, encoder=True) if encdec else None
        self.encoder_rows = getattr(input_embeddings(model.get_encoder()), "num_embeddings", None) if encdec else None

    def room(self, seq_len: int) -> int:
        """The most tokens the draft may propose after `seq_len` tokens: its k steps, and a batch row's pad after them,
        stay inside its positions. It depends on the length alone, so a seed's sample does not depend on it either."""
        return NO_LIMIT if self.limit is None else max(self.limit - seq_len, 0)

    def encoder_prompt(self, prompt_ids: list[int]) -> list[int]:
        """What an encoder-decoder draft's encoder reads of a prompt: all of it, or as many tokens as it has positions,
        the last (an end token) kept, each id it has no row for as its last row: a worse guess, never another output."""
        limit, rows = self.encoder_limit, self.encoder_rows
        if limit is not None and len(prompt_ids) > limit:
            prompt_ids = prompt_ids[: limit - 1] + prompt_ids[-1:]
        return prompt_ids if rows is None else [min(t, rows - 1) for t in prompt_ids]

    def open(self, prompt_ids: list[int], held: contextlib.ExitStack, encoded: dict | None = None) -> SlotKV | BatchKV:
        """The draft's decoder for one item, prompt encoded and decoder empty: its static slot when free, else a
        growing one-row cache. `encoded`: the target's encoder outputs, when the draft shares the target's encoder."""
        return open_row(self.model, self.static, prompt_ids if encoded is not None else self.encoder_prompt(prompt_ids),
                        held, encoded)


class NgramDrafter(SessionDrafter):
    """Prompt lookup: find the sequence's last n tokens (longest n first) earlier in the prompt or output, and propose
    what followed. The EARLIEST occurrence wins, as in HF: a continuation copies from the source text, not from the
    output's latest repeat (docs/performance.md)."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= ngram_min_size <= ngram_max_size, got {min_ngram}, {max_ngram}")
        self.sizes = range(max_ngram, min_ngram - 1, -1)  # longest first

    def start(self, prompt_ids: list[int], decoder_ids: list[int], pick: Picker) -> DraftSession:
        # For encoder-decoder models the prompt is not in the decoder sequence: search it too.
        prefix = [] if decoder_ids[: len(prompt_ids)] == prompt_ids else list(prompt_ids)
        return _NgramSession(prefix, self.sizes)


class _NgramSession(DraftSession):
    def __init__(self, prefix: list[int], sizes: range):
        self.prefix = prefix
        self.sizes = sizes

    def propose(self, seq: list[int], k: int) -> Draft:
        return Draft(lookup(np.asarray(self.prefix + seq), self.sizes, k) if k else [], None)


def lookup(hay: np.ndarray, sizes: range, k: int) -> list[int]:
    """Continuation (up to k tokens) of the first occurrence of hay's last n tokens before them."""
    for n in sizes:
        if len(hay) <= n:
            continue
        windows = np.lib.stride_tricks.sliding_window_view(hay[:-1], n)  # excludes the suffix itself
        hits = np.flatnonzero((windows == hay[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n  # < len(hay): every hit has at least one token after it
            return hay[start : start + k].tolist()
    return []
