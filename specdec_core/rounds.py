"""One round of speculative decoding for any number of rows (Leviathan, Kalman, Matias 2023), the
one loop both engines run: batch 1 (`engine.SpeculativeGenerator`) is a batch of one row.

Per round each row's drafter proposes up to k tokens, the target scores every row's drafts in ONE pass, each row
keeps a prefix of its drafts plus one target token by the accept/reject rule, and every cache rolls back to what
its row kept. Invariant between rounds: each row's target cache holds every committed token except the newest
(docs/how-it-works.md, "The round").
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from specdec_core.acceptance import verify_greedy, verify_sampled
from specdec_core.decoder import eos_ids, synchronize
from specdec_core.drafters import NO_LIMIT, Drafter, ModelDrafter, NoDrafter, StepTimer, through_end
from specdec_core.gamma import LOOKUP_DRAFT_COST, Costs, GammaPolicy, fixed_gamma
from specdec_core.loading import check_draft_rows, context_limit, output_rows
from specdec_core.pass_settings import PassSettings
from specdec_core.processing import SamplingSettings
from specdec_core.rows import Row
from specdec_core.self_check import cache_failure, state_failure, verify_disagreement
from specdec_core.slot_kv import SlotKV


def setup_seconds(*caches) -> float:
    """Seconds these (static) caches spent capturing graphs and compiling: one-off work no item's time limit counts."""
    return sum(kv.passes.capture_s for kv in caches if hasattr(kv, "passes"))


def timing_tokens(tokens: list[int], n: int) -> list[int]:
    """n tokens to time passes with: `tokens`, repeated as often as that takes."""
    return list(itertools.islice(itertools.cycle(tokens), n))


def check_engine(target: PreTrainedModel, drafter: Drafter | None, num_speculative_tokens: int,
                 max_new_tokens: int) -> Drafter:
    """The checks both engines make before any work; returns the drafter (the target alone: `NoDrafter`)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
    drafter = drafter or NoDrafter()
    checks = [(target, state_failure)]  # (a draft's own numerics may part from an uncached pass)
    if isinstance(drafter, ModelDrafter):
        checks.append((drafter.model, cache_failure))
        check_draft_rows(output_rows(target), output_rows(drafter.model))
    for model, failure in checks:
        if why := failure(model):
            raise ValueError(f"{type(model).__name__} {why}: the engines cannot decode it")
    if not isinstance(drafter, NoDrafter) and (why := verify_disagreement(target)):
        raise ValueError(f"{type(target).__name__} {why}: a draft's tokens cannot be verified in one pass "
                         "(use the target alone: --drafter none)")
    return drafter


def check_prompts(prompts: list[list[int]]) -> None:
    """Before any work: each prompt holds a token (a decoder goes on from its last; an encoder reads it)."""
    if empty := [i for i, ids in enumerate(prompts) if len(ids) == 0]:
        raise ValueError(f"item {empty[0]}'s prompt has no tokens ({len(empty)} of {len(prompts)} empty)")


class RoundEngine:
    """What both engines share: the checked settings and models, and the round (`_round`)."""

    def __init__(self, target: PreTrainedModel, drafter: Drafter | None, num_speculative_tokens: int,
                 max_new_tokens: int, sampling: SamplingSettings, gamma_policy: GammaPolicy | None,
                 settings: PassSettings):
        self.target = target
        self.drafter = check_engine(target, drafter, num_speculative_tokens, max_new_tokens)
        self.eos = eos_ids(target)
        self.gamma, self.max_new_tokens = num_speculative_tokens, max_new_tokens
        self.sampling, self.gamma_policy = sampling, gamma_policy or fixed_gamma
        self.settings = settings
        self.positions = context_limit(target) or NO_LIMIT  # the decoder positions the target can embed
        # A draft running the target's own encoder module takes the target's encoder outputs.
        self.shared_encoder = (bool(target.config.is_encoder_decoder) and isinstance(self.drafter, ModelDrafter)
                               and self.drafter.model.get_encoder() is target.get_encoder())

    def _row_gammas(self, live: list[Row], pick: Callable[[Row], int]) -> list[int]:
        """Each row's `pick`ed drafts, never past its budget (the round's extra target token needs one slot) nor past
        the target's positions or a model draft's (past a draft's the target goes on alone, as `generate()` would)."""
        return [max(min(pick(r), self.max_new_tokens - len(r.new) - 1, self.drafter.room(len(r.seq)),
                        self.positions - len(r.seq)), 0) for r in live]

    def _gammas(self, live: list[Row], dkv) -> tuple[list[int], bool, bool]:
        """Each row's drafts (its gamma state's choice), whether the batch chose one gamma, and whether it probes."""
        return self._row_gammas(live, lambda r: r.gamma_state.next()), False, False

    def _round(self, live: list[Row], tkv, dkv) -> None:
        """One round over the rows `live`: target cache `tkv` (`BatchKV`, `SlotKV`, at batch 1 one row of either),
        a model draft's cache `dkv` or None (each row's `session` drafts)."""
        greedy = self.sampling.greedy
        ks, batch_k, probe = self._gammas(live, dkv)
        for r, k in zip(live, ks, strict=True):
            r.stats.gammas.append(k)
        t0 = time.perf_counter()
        drafts, qs, confs, caught = self._draft(live, ks, dkv, batch_k)
        t1 = time.perf_counter()
        feeds = [r.seq[tkv.length(b):] + drafts[b] for b, r in enumerate(live)]
        logits = tkv.forward(feeds)
        choices = self._argmax_rows(live, tkv.logits)
        t2 = time.perf_counter()
        for b, r in enumerate(live):
            d, at = drafts[b], slice(len(feeds[b]) - len(drafts[b]) - 1, len(feeds[b]))  # its drafts' positions, +1
            if choices is not None:
                n, token = verify_greedy(d, choices[b][at])
            else:
                scores = r.transform(r.seq + d, logits[b, at])
                if greedy:
                    n, token = verify_greedy(d, scores.argmax(-1))
                else:
                    n, token = verify_sampled(d, scores.softmax(-1), qs[b], r.generator)
            r.stats.prefill_s += caught[b]
            r.stats.draft_s += t1 - t0 - caught[b]  # the row waited for the whole batched pass
            r.stats.verify_s += t2 - t1
            valid = r.commit(d, n, token, confs[b], self.max_new_tokens, self.eos, probe)
            tkv.rollback(b, valid)
            if dkv is not None:
                # A row past the draft's positions drafts no more: its cache is dropped so its pads stay in positions.
                dkv.rollback(b, valid if self.drafter.room(len(r.seq)) > 0 else 0)
            elif r.session is not None:
                r.session.rollback(valid)

    def _time_passes(self, live: list[Row], tkv, dkv, ks: tuple[int, ...], reps: int) -> Costs:
        """c and v(k) (`gamma.Costs`) of these rows' passes, timed on their target cache (and a model draft's `dkv`,
        else their sessions) and rolled back. Each pass runs as in a round, with the per-row work after it (picks read
        back, or each row's processors), which grows with the rows; a width's first pass runs untimed where it captures
        a graph or compiles."""
        draft_step = self._draft_timer(live, dkv) if dkv is not None else self._session_timer(live, ks)
        n = len(live)
        fill = [timing_tokens(r.seq, max(ks)) for r in live]
        # A row near its last position times fewer tokens; its pending token always has a position.
        room = [max(1, self.positions - tkv.length(b)) for b in range(n)]

        def target_step(k: int) -> float:
            bases = [tkv.length(b) for b in range(n)]
            feeds = [([r.seq[-1]] + fill[b][: k - 1])[: room[b]] for b, r in enumerate(live)]
            t = time.perf_counter()
            logits = tkv.forward(feeds)
            if self._argmax_rows(live, tkv.logits) is None:
                for b, r in enumerate(live):
                    r.transform(r.seq + feeds[b][1:], logits[b, : len(feeds[b])]).argmax(-1)
            for b in range(n):
                tkv.rollback(b, bases[b])
            synchronize(self.target.device)  # a GPU runs the pass after the call returns
            return time.perf_counter() - t

        target_step(1)  # warm-up
        if any(hasattr(kv, "passes") and (kv.passes.on or kv.passes.compiles) for kv in (tkv, dkv)):  # (one-off work)
            for k in ks:
                target_step(k)
            if draft_step is not None:
                draft_step()
        costs = Costs.measure(target_step, draft_step, ks, reps)
        if draft_step is None and not isinstance(self.drafter, NoDrafter):
            costs.c = LOOKUP_DRAFT_COST
        return costs

    def _session_timer(self, live: list[Row], ks: tuple[int, ...]) -> StepTimer | None:
        """A session drafter's cost per proposed token for these rows (another tokenizer's draft), or None where it
        costs next to nothing (prompt lookup). Rows draft one after another, each in its own session: one row's cost,
        timed on a session of its own, times the rows."""
        timer = self.drafter.step_timer(live[0].prompt, live[0].seq, max(max(ks) - 1, 1))
        return None if timer is None else lambda: len(live) * timer()

    def _draft_timer(self, live: list[Row], dkv) -> StepTimer:
        """A timer of one model-draft step as a round runs them: consecutive (a lone step runs cold), chained where a
        round chains them, each row's picks after each step; rolled back after."""
        n = len(live)
        fill = [timing_tokens(r.seq, self.gamma) for r in live]
        limit = self.drafter.limit  # a row near the end of the draft's positions drafts fewer
        room = [self.gamma + 1 if limit is None else limit - dkv.length(b) for b in range(n)]

        def step() -> float:
            bases = [dkv.length(b) for b in range(n)]
            t = time.perf_counter()
            if self._chains(live, dkv):  # the round's steps in one replay, read back once
                dkv.draft_greedy([fill[b][:1] for b in range(n)], self.gamma)  # (its steps kept in positions)
            else:
                for i in range(self.gamma):
                    # (a row that feeds nothing pads at its next position: kept inside the positions too)
                    feeds = [[fill[b][i]] if i < room[b] - 1 else [] for b in range(n)]
                    if not any(feeds):
                        break
                    logits = dkv.forward(feeds, last=True)
                    if self._argmax_rows(live, dkv.logits) is None:
                        for b, r in enumerate(live):
                            if feeds[b]:
                                r.picker(True)(r.seq + fill[b][: i + 1], logits[b])
            for b in range(n):
                dkv.rollback(b, bases[b])
            synchronize(self.target.device)
            return (time.perf_counter() - t) / self.gamma

        return step

    def _argmax_rows(self, live: list[Row], logits: torch.Tensor) -> list[list[int]] | None:
        """Greedy with no logits processor on any row: every row's argmax at every fed position, in one read-back
        (one per row would stall a GPU each); None when some row's picks need its own processing."""
        return logits.argmax(-1).tolist() if self._plain_greedy(live) else None

    def _chains(self, live: list[Row], dkv) -> bool:
        """Whether a round's draft steps can run chained on the device: static cache, chaining drafter, argmax picks."""
        return isinstance(dkv, SlotKV) and getattr(self.drafter, "chain", False) and self._plain_greedy(live)

    def _plain_greedy(self, live: list[Row]) -> bool:
        """Greedy, and no row's picks go through a logits processor: a pick is an argmax."""
        return self.sampling.greedy and not any(r.transform.processors for r in live)

    def _draft(self, live: list[Row], ks: list[int], dkv, batch_k: bool = False):
        """Each row's drafts (tokens, q and confidences), and the seconds spent reading its prompt.
        batch_k: the batch chose one gamma for all rows, so a row stopping early on its draft's confidence would save
        nothing (the passes run while any row drafts)."""
        n = len(live)
        caught = [0.0] * n
        greedy = self.sampling.greedy
        if dkv is None or not any(ks):  # sessions draft per row; with no row drafting nothing else runs either
            found = [r.session.propose(r.seq, k) if k > 0 else None for r, k in zip(live, ks, strict=True)]
            return [d.tokens if d else [] for d in found], [d.q if d else None for d in found], [None] * n, caught
        keeps = [None if batch_k else r.keep(greedy) for r in live]
        confs: list[list[float] | None] = [None if keep is None else [] for keep in keeps]
        ends = self.drafter.ends
        chained = self._chains(live, dkv) and all(keep is None for keep in keeps)
        # A row's draft reads its prompt lazily (never if it never drafts), in a pass counted as prefill: one row's
        # first step (folded), else a pass of no logits first (chains feed one token; padded steps keep all logits).
        lazy = [b for b, (r, k) in enumerate(zip(live, ks, strict=True))
                if k > 0 and not r.new and dkv.length(b) < len(r.seq) - 1]
        folded = bool(lazy) and n == 1 and not chained
        if lazy and not folded:
            t0 = time.perf_counter()
            dkv.forward([r.seq[dkv.length(b):-1] if b in lazy else [] for b, r in enumerate(live)], logits=False)
            synchronize(self.target.device)
            caught = [time.perf_counter() - t0 if b in lazy else 0.0 for b in range(n)]
        if chained:
            # The round's steps chained on the device for every row, read back once.
            feeds = [r.seq[dkv.length(b):] if k > 0 else [] for b, (r, k) in enumerate(zip(live, ks, strict=True))]
            picks = dkv.draft_greedy(feeds, max(ks))
            for r, k in zip(live, ks, strict=True):
                r.draft_steps += k
            return [through_end(p[:k], ends) for p, k in zip(picks, ks, strict=True)], [None] * n, confs, caught
        curs = [list(r.seq) for r in live]  # each row's tokens and its drafts so far (a picker reads them)
        picks = [r.picker(greedy) for r in live]
        draft_q: list[list[torch.Tensor]] = [[] for _ in live]
        active = [k > 0 for k in ks]
        for i in range(max(ks, default=0)):
            rows = [b for b in range(n) if active[b] and i < ks[b]]
            if not rows:
                break
            feeds = [curs[b][dkv.length(b):] if b in rows else [] for b in range(n)]
            t0 = time.perf_counter()
            logits = dkv.forward(feeds, last=True)
            if i == 0 and folded:
                synchronize(self.target.device)
                caught = [time.perf_counter() - t0]
            choices = self._argmax_rows(live, dkv.logits) if all(keep is None for keep in keeps) else None
            for b in rows:
                live[b].draft_steps += 1
                if choices is not None:
                    token, q = choices[b][0], None
                else:
                    token, q = picks[b](curs[b], logits[b])
                if keeps[b] is not None:
                    conf = float(q[0, token]) if q is not None else float(torch.softmax(logits[b][-1], -1)[token])
                    if not keeps[b](i, conf):
                        active[b] = False
                        continue
                    confs[b].append(conf)
                curs[b].append(token)
                if q is not None:
                    draft_q[b].append(q)
                if token in ends:  # as at batch 1: nothing after an end is ever kept
                    active[b] = False
        drafts = [curs[b][len(r.seq):] for b, r in enumerate(live)]
        return drafts, [torch.cat(q) if q else None for q in draft_q], confs, caught
