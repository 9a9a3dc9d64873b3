"""One item while it decodes, and what a round does to it: the row both engines step.

A row holds its sequence, its own random generator, logits processors, gamma state and
statistics. Each round ends in `Row.commit` (drafts kept, the target's token, the cut at the
row's end, the statistics), the one accept-side rule of the batch-1 and the batch engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from specdec_core.decoder import initial_decoder_ids
from specdec_core.drafters import DraftSession, KeepDrafting, Picker, through_end
from specdec_core.gamma import GammaState
from specdec_core.loading import output_rows
from specdec_core.processing import LogitsTransform, SamplingSettings, build_processors, draft_pick

# An item's own end rule (e.g. stop strings): called with each round's committed tokens, once each and in order;
# returns the index of the token that ends the item (kept), or None. Stateful per item; the engine sees no tokenizer.
FinishCheck = Callable[[list[int]], int | None]


class ItemTimeout(TimeoutError):
    """An item ran past its time limit; the class name is the failed row's error_type."""


@dataclass
class ItemStats:
    """Per-item statistics; DESIGN.md defines each column."""

    new_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0
    draft_steps: int = 0
    prompt_tokens: int = 0
    latency_s: float = 0.0
    ttft_s: float = 0.0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    finish_reason: str = ""
    rejections: int = 0  # rounds that ended at a rejected draft (for the geometric estimate of a)
    # Admissions: seconds waited while items entered its batch (its own prefill included), the items that entered
    # with it (itself included), and the target's prefill passes that took them in.
    admit_s: float = 0.0
    admitted_with: int = 1
    admit_passes: int = 1
    # Not output columns: one-off graph captures and compiles inside latency_s and prefill_s, for measurements.
    setup_s: float = 0.0
    prefill_setup_s: float = 0.0
    gammas: list[int] = field(default_factory=list)  # drafts asked for in each round
    drafts: list[int] = field(default_factory=list)  # drafts proposed in each round

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.latency_s if self.latency_s > 0 else 0.0


@dataclass
class Generation:
    tokens: list[int]  # new tokens only, EOS included if produced
    stats: ItemStats = field(default_factory=ItemStats)


def cut_at_end(emitted: list[int], remaining: int, eos: set[int] | frozenset[int],
               finish_check: FinishCheck | None = None) -> tuple[list[int], str]:
    """A round's tokens cut at the first end: a stop (finish_check), an EOS, or the budget. They are the target's own
    up to the cut, so a rule on committed tokens alone stops where the target alone would (greedy and sampled)."""
    emitted = emitted[:remaining]
    kept = through_end(emitted, eos)
    stop = finish_check(kept) if finish_check else None
    if stop is not None:
        return kept[: stop + 1], "stop"
    if kept and kept[-1] in eos:
        return kept, "eos"
    if len(emitted) >= remaining:
        return emitted, "length"
    return emitted, ""


@dataclass
class Row:
    """One prompt being decoded: its sequence, its own RNG, processors, gamma state and stats."""

    index: int  # position in the caller's list
    prompt: list[int]  # the prompt's ids (an encoder-decoder's encoder input)
    seq: list[int]  # the decoder's tokens: prompt (decoder-only) or start token, then the new ones
    start: float
    transform: LogitsTransform
    generator: torch.Generator
    gamma_state: GammaState
    stats: ItemStats
    finish_check: FinishCheck | None = None
    session: DraftSession | None = None  # the row's own drafting (prompt lookup, another tokenizer)
    new: list[int] = field(default_factory=list)
    finish: str = ""
    draft_steps: int = 0
    draft_behind: bool = False  # admitted without the draft's prefill (the batch was not drafting)
    setup: float = 0.0  # the caches' one-off seconds (`rounds.setup_seconds`) when it entered
    vocab: int = 0  # the target's output rows (0: unknown): a draft's narrower logits are padded to them

    @classmethod
    def begin(cls, target: PreTrainedModel, prompt_ids: list[int], seed: int, sampling: SamplingSettings,
              max_new_tokens: int, gamma_state: GammaState, index: int = 0,
              finish_check: FinishCheck | None = None) -> Row:
        device = target.device
        seq = initial_decoder_ids(target, prompt_ids)
        procs = build_processors(sampling, target.generation_config, len(seq), max_new_tokens, device)
        return cls(index=index, prompt=list(prompt_ids), seq=seq,
                   start=time.perf_counter(), transform=LogitsTransform(procs),
                   generator=torch.Generator(device=device).manual_seed(seed), gamma_state=gamma_state,
                   stats=ItemStats(prompt_tokens=len(prompt_ids)), finish_check=finish_check, vocab=output_rows(target))

    def picker(self, greedy: bool) -> Picker:
        """The row's draft picks: its processors (over the target's rows, the draft's missing ones -inf: a processor
        may keep tensors of the first width it sees), then argmax or a sample from its generator."""
        def pick(cur: list[int], logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
            if logits.shape[-1] < self.vocab:
                logits = torch.nn.functional.pad(logits, (0, self.vocab - logits.shape[-1]), value=float("-inf"))
            return draft_pick(self.transform(cur, logits), greedy, self.generator)

        return pick

    def keep(self, greedy: bool) -> KeepDrafting | None:
        """The gamma state's early-stop rule, or None: stopping on the draft's confidence in a drawn token changes the
        distribution kept drafts come from, so it is exact only for greedy drafting."""
        return self.gamma_state.keep_drafting if greedy and self.gamma_state.stops_early else None

    def commit(self, drafts: list[int], n: int, token: int, confidences: list[float] | None, budget: int,
               eos: set[int] | frozenset[int], probe: bool = False) -> int:
        """A round's outcome: the first `n` drafts kept and the target's `token` after them, cut at the row's end; stats
        and gamma state told. Returns the cached length still on the committed path, for the caches to roll back to.
        probe: only the first of those tokens, distributed as the target's (so a plain batch's rows stay in step)."""
        s = self.stats
        s.verify_steps += 1
        s.draft_tokens += len(drafts)
        s.drafts.append(len(drafts))
        self.gamma_state.update(len(drafts), n)
        if confidences is not None:
            self.gamma_state.record_confidences(confidences, n)
        kept = (drafts[:n] + [token])[: 1 if probe else None]
        emitted, self.finish = cut_at_end(kept, budget - len(self.new), eos, self.finish_check)
        s.accepted_tokens += min(n, len(emitted))
        s.rejections += n < len(drafts) and len(emitted) > n  # (one past a row's end is not: a's counts are its text's)
        if not self.new:
            s.ttft_s = time.perf_counter() - self.start
        self.new += emitted
        valid = len(self.seq) + (0 if probe else n)
        self.seq += emitted
        return valid

    def own_s(self, setup: float) -> float:
        """Seconds since the row started, less one-off work (`rounds.setup_seconds`, now `setup`) done meanwhile, so
        that a row that pays for new graphs or compiles is not timed out for it."""
        return time.perf_counter() - self.start - (setup - self.setup)

    def timeout(self, max_seconds: float) -> ItemTimeout:
        return ItemTimeout(f"item ran longer than {max_seconds:g} s (stopped after {len(self.new)} new tokens)")

    def result(self) -> Generation:
        """The row's generation, its statistics completed: it ends now."""
        s = self.stats
        s.latency_s = time.perf_counter() - self.start
        s.new_tokens, s.finish_reason = len(self.new), self.finish
        s.draft_steps = self.draft_steps if self.session is None else self.session.steps
        return Generation(self.new, s)
