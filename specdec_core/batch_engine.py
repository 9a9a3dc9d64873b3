"""Speculative decoding of several prompts at once, exact per prompt (continuous batching).

Up to `batch_size` rows decode together: one draft pass per draft step and ONE target pass for all rows' drafts,
acceptance per row with the batch-1 rule (its own gamma state and random generator), and a finished row's place
refilled with the next waiting prompt. Rows share one padded cache per model (`BatchKV`) or, on a GPU, one static
cache with a fixed slot per row (`SlotKV`, `--cuda_graphs`) (docs/batching.md)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence

from transformers import PreTrainedModel

from specdec_core.attention import attention_kernels
from specdec_core.batch_kv import CPU_PREFILL_TOKENS, BatchKV, prefill_chunks, window_note
from specdec_core.drafters import Drafter, ModelDrafter, NoDrafter
from specdec_core.gamma import AdaptiveGamma, Costs, GammaPolicy, batch_gamma
from specdec_core.pass_settings import DEFAULT, PassSettings
from specdec_core.plan import batch_refusal, padded_width, slot_kv_for
from specdec_core.processing import SamplingSettings
from specdec_core.rounds import RoundEngine, check_prompts, setup_seconds
from specdec_core.rows import FinishCheck, Generation, ItemTimeout, Row
from specdec_core.slot_kv import SlotKV

log = logging.getLogger(__name__)

# Where no drafting pays, the batch still drafts one token per row every this many rounds, doubling after each probe.
FIRST_BATCH_PROBE_WAIT, MAX_BATCH_PROBE_WAIT = 8, 256
# Newcomers skip the draft's prefill while the batch does not draft; a probe catches up rows to at least this many.
PROBE_ROWS = 8
# A batch drafts the fewest tokens predicted within this share of the best rate (none counted), one that does not draft
# starts past twice it: what the rule leaves out (holes of rejected drafts, rows ending apart) grows with K (docs).
DRAFT_HURDLE = 0.05
# Drafting rounds' measured seconds against their predicted costs, relative to plain rounds', over this many recent
# rounds of each at the full width (what the costs leave out: per-row host work, the holes of rejected drafts).
FIT_ROUNDS, FIT_MIN_ROUNDS = 64, 3
WARM_WAVES = 2  # a worker's first waves of rows (this many times its width) time its costs and admissions


def _by_rows(kv: BatchKV | SlotKV | None, rows: int) -> bool:
    """Whether these many new rows enter this cache through graphs rather than in padded eager passes."""
    return (isinstance(kv, SlotKV) and kv.prefills_in_graphs
            and (kv.settings.graph_prefill_rows is None or rows <= kv.settings.graph_prefill_rows))


def pad_id_of(target: PreTrainedModel) -> int:
    """The id a batch pads its rows with: the target's (a multimodal model's: its text's), or 0."""
    pad = getattr(target.config.get_text_config(decoder=True), "pad_token_id", None)
    return int(pad) if isinstance(pad, int) else 0


class BatchSpeculativeGenerator(RoundEngine):
    """Exact speculative decoding of many prompts, up to `batch_size` rows per model pass."""

    def __init__(self, target: PreTrainedModel, drafter: Drafter | None = None, *, batch_size: int = 8,
                 num_speculative_tokens: int = 4, max_new_tokens: int = 128,
                 sampling: SamplingSettings = SamplingSettings(), gamma_policy: GammaPolicy | None = None,
                 prefill_tokens: int | None = None, cuda_graphs: str = "auto", torch_compile: bool = False,
                 settings: PassSettings = DEFAULT):
        """prefill_tokens: the most prompt tokens (rows x longest row) per prefill pass; None: `CPU_PREFILL_TOKENS` on
        a CPU, no limit elsewhere. cuda_graphs, torch_compile: as the batch-1 engine's, over fixed row slots."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.pad_id = pad_id_of(target)
        for role, model in (("", target), ("the draft ", drafter.model if isinstance(drafter, ModelDrafter) else None)):
            if model is not None and (why := batch_refusal(model, self.pad_id)):
                why, one = f"{role}{type(model).__name__} {why}", "decode it with SpeculativeGenerator"
                raise ValueError(f"batch_size > 1: {why} (use batch_size 1)" if batch_size > 1 else f"{why}: {one}")
        super().__init__(target, drafter, num_speculative_tokens, max_new_tokens, sampling, gamma_policy, settings)
        self.batch_size = batch_size
        self.draft_model = drafter.model if isinstance(drafter, ModelDrafter) else None
        self.encdec = bool(target.config.is_encoder_decoder)
        self._noted: set[tuple[str, int]] = set()
        cpu = prefill_tokens is None and target.device.type == "cpu"
        self.prefill_tokens = CPU_PREFILL_TOKENS if cpu else prefill_tokens
        # Kept across calls: a worker captures each pass width once, not once per batch of items.
        self.slots = {id(m): slot_kv_for(m, cuda_graphs, batch_size, self.pad_id, torch_compile, settings)
                      for m in (target, self.draft_model) if m is not None}
        self._costs_width = 0  # the batch width of the costs this engine measured (0: none yet)
        self._rounds_without_drafts, self._probe_every = 0, FIRST_BATCH_PROBE_WAIT
        self._drafting = True  # the batch policy's latest choice, probes aside (`_starts_drafting` at an empty batch)
        # The batch policy prices what drafting costs outside the rounds from these (`_prefill_per_token`).
        self._draft_prefill = [0.0, 0, 0]  # seconds, prompts, tokens
        self._row_tokens = [0, 0]  # new tokens, finished rows
        # The target's prefill (seconds, rows) of fewer rows than the batch (rows that ended apart), of a whole batch
        self._admissions = ([0.0, 0], [0.0, 0])
        # (seconds, predicted seconds) of recent plain and drafting rounds at the full width
        self._fit: dict[bool, deque[tuple[float, float]]] = {d: deque(maxlen=FIT_ROUNDS) for d in (False, True)}
        self.admit_s = 0.0  # wall seconds spent admitting rows (their prefills), since construction
        self.admitted = [0, 0]  # rows admitted, and the target's prefill passes that took them in

    def _new_row(self, index: int, prompt_ids: list[int], seed: int, finish_check: FinishCheck | None = None) -> Row:
        row = Row.begin(self.target, prompt_ids, seed, self.sampling, self.max_new_tokens,
                        self.gamma_policy.start(self.gamma), index, finish_check)
        if self.draft_model is None:
            row.session = self.drafter.start(prompt_ids, row.seq, row.picker(self.sampling.greedy))
        return row

    # -- the loop -------------------------------------------------------------------------------

    def generate_many(self, items: Sequence[tuple[list[int], int]],
                      finish_checks: Sequence[FinishCheck | None] | None = None,
                      max_seconds: float | None = None) -> list[Generation | ItemTimeout]:
        """(prompt ids, seed) per item -> one Generation per item, in the same order.
        max_seconds: an item running longer since it entered (one-off graph captures and compiles not counted) leaves,
        an ItemTimeout in its place; the other rows go on."""
        if not items:
            return []
        check_prompts([ids for ids, _ in items])
        checks = list(finish_checks) if finish_checks is not None else [None] * len(items)
        longest = self.max_new_tokens + self.gamma + (0 if self.encdec else max(len(ids) for ids, _ in items))
        for model in (self.target, self.draft_model):
            note = model is not None and window_note(model, longest)
            if note and (key := (note.split(" (rows")[0], id(model))) not in self._noted:  # its outcome, once
                self._noted.add(key)
                log.info(note)
        waiting = deque((i, (ids, seed, check)) for i, ((ids, seed), check)
                        in enumerate(zip(items, checks, strict=True)))
        results: list[Generation | None] = [None] * len(items)
        live: list[Row] = []
        t0, admit_s, (rows, passes) = time.perf_counter(), self.admit_s, self.admitted
        with contextlib.ExitStack() as held:
            held.enter_context(attention_kernels(self.target.device, self.settings.cudnn_attention))
            tkv = self._cache(self.target, held)
            dkv = self._cache(self.draft_model, held) if self.draft_model is not None else None
            self._decode(waiting, results, live, tkv, dkv, max_seconds)
        spent = time.perf_counter() - t0
        log.info("%d rows admitted in %d prefill passes of the target, %.2f s admitting (%.0f%% of the call's %.2f s)",
                 self.admitted[0] - rows, self.admitted[1] - passes, self.admit_s - admit_s,
                 100 * (self.admit_s - admit_s) / max(spent, 1e-9), spent)
        return results  # type: ignore[return-value]

    def _cache(self, model: PreTrainedModel, held: contextlib.ExitStack) -> BatchKV | SlotKV:
        """The model's slots for this call when free, else a new padded cache (another thread's call holds them)."""
        slots = self.slots[id(model)]
        if slots is not None and slots.acquire():
            held.callback(slots.release)
            return slots
        return BatchKV(model, 0, self.pad_id, padded_width(model, self.pad_id) or 1)

    def _decode(self, waiting: deque, results: list, live: list[Row], tkv: BatchKV | SlotKV,
                dkv: BatchKV | SlotKV | None, max_seconds: float | None) -> None:
        while waiting or live:
            if waiting and not live:
                self._drafting = self._starts_drafting(min(len(waiting), self.batch_size))
            if waiting and self._admits(self.batch_size - len(live), len(waiting)):
                live += self._admit(waiting, self.batch_size - len(live), live, tkv, dkv)
                if self._wants_costs(len(live)):
                    self._measure_costs(live, tkv, dkv)
            self._fitted_round(live, tkv, dkv)
            if max_seconds is not None:
                setup = setup_seconds(tkv, dkv)
                for r in live:
                    if not r.finish and r.own_s(setup) > max_seconds:
                        r.finish = "timeout"
            done = [b for b, r in enumerate(live) if r.finish]
            if done:
                for b in done:
                    r = live[b]
                    self._row_tokens[0] += len(r.new)
                    self._row_tokens[1] += 1
                    out = r.result()
                    results[r.index] = r.timeout(max_seconds) if r.finish == "timeout" else out
                # Waiting prompts take finished rows' places (rows that go on are not copied); the rest are dropped.
                full = len(live) == self.batch_size and self._admits(len(done), len(waiting))
                refill = done[: len(waiting)] if full else []
                if refill:
                    new = self._admit(waiting, len(refill), live, tkv, dkv, into=refill)
                    for b, row in zip(refill, new, strict=True):
                        live[b] = row
                if gone := done[len(refill):]:  # those not refilled leave: the last rows move into their places
                    order = tkv.drop(gone)
                    if dkv is not None:
                        dkv.drop(gone)
                    live = [live[b] for b in order]

    def _admits(self, free: int, waiting: int) -> bool:
        """Whether `free` slots take new rows now: `admit_together` of them, or all waiting prompts (at most B)."""
        return free >= min(self.settings.admit_together, waiting, self.batch_size)

    def _admit(self, waiting: deque, slots: int, live: list[Row], tkv: BatchKV | SlotKV,
               dkv: BatchKV | SlotKV | None, into: list[int] | None = None) -> list[Row]:
        """Prefill up to `slots` waiting prompts, merged after the live rows or over the finished rows `into`; the time
        counts in the `admit_s` of the new rows and of the live ones, which waited for it."""
        t0, passes = time.perf_counter(), self.admitted[1]
        rows = [self._new_row(i, list(ids), seed, check) for i, (ids, seed, check) in
                (waiting.popleft() for _ in range(min(slots, len(waiting))))]
        waited = live + rows
        setup = setup_seconds(tkv, dkv)
        # Invariant between rounds, as at batch 1: each cache holds every committed token but the newest; the draft's
        # may hold fewer (`_draft` feeds what it lacks), and newcomers skip it while the batch does not draft.
        by_rows = _by_rows(tkv, len(rows))
        encoded = self._prefill(self.target, tkv, rows, into)
        if dkv is not None:
            # An encoder-decoder draft is always prefilled: without its cross cache a row has nothing to attend to.
            # A draft sharing the encoder takes the target's outputs where both prefill alike (graphs, or same chunks).
            if self._drafting or self.encdec:
                shared = self.shared_encoder and _by_rows(dkv, len(rows)) == by_rows
                self._prefill(self.draft_model, dkv, rows, into, encoded if shared else None)
            else:
                for r in rows:
                    r.draft_behind = True
                empty = BatchKV(self.draft_model, len(rows), self.pad_id)  # their places, to be caught up
                dkv.merge(empty) if into is None else dkv.place(into, empty)
        now = time.perf_counter()
        spent = now - t0 - (setup_seconds(tkv, dkv) - setup)  # one-off graph captures left out
        for r in rows:
            r.setup, r.stats.prefill_s = setup, now - r.start
            r.stats.admitted_with, r.stats.admit_passes = len(rows), self.admitted[1] - passes
        for r in waited:  # the rows that go on waited for the new ones
            if not r.finish:
                r.stats.admit_s += spent
        self.admit_s += spent
        return rows

    def _prefill(self, model: PreTrainedModel, kv: BatchKV | SlotKV, rows: list[Row], into: list[int] | None,
                 encoded: list | None = None) -> list:
        """Each row's committed tokens but the newest into `kv`, in passes of at most `prefill_tokens` tokens, merged
        after its rows or over the rows `into`. Encoder-decoder: returns the encoder's outputs (per pass, or per row
        through graphs); `encoded`, from a model sharing this encoder and prefilled alike, spares running it again."""
        t0, setup = time.perf_counter(), setup_seconds(kv)
        # A row past a model draft's positions is never drafted: the draft reads none of it.
        drafts = model is self.draft_model
        feeds = [[] if drafts and self.drafter.room(len(r.seq)) < 1 else r.seq[:-1] for r in rows]
        # (a draft's own encoder reads what it can position of a prompt)
        prompts = [self.drafter.encoder_prompt(r.prompt) if drafts and not encoded else r.prompt for r in rows]
        if _by_rows(kv, len(rows)):
            hidden = kv.prefill(feeds, into, prompts if self.encdec else None, encoded)
            passes = len(kv.admission_parts(len(rows)))
        else:
            parts, hidden = [], []
            lengths = [len(p) for p in prompts] if self.encdec else [len(f) for f in feeds]
            chunks = prefill_chunks(lengths, self.prefill_tokens)
            passes = len(chunks)
            for i, chunk in enumerate(chunks):
                fresh = BatchKV(model, len(chunk), self.pad_id)
                if self.encdec:  # the decoder holds no prompt: the encoder runs, the cross cache fills
                    hidden.append(fresh.encode([prompts[j] for j in chunk], encoded[i] if encoded else None))
                else:
                    fresh.forward([feeds[j] for j in chunk], logits=False)
                if into is not None:
                    kv.place([into[j] for j in chunk], fresh)
                parts.append(fresh)
            if into is None:
                kv.merge(*parts)
        spent = time.perf_counter() - t0 - (setup_seconds(kv) - setup)  # one-off graph captures left out
        if model is self.target:
            self.admitted[:] = self.admitted[0] + len(rows), self.admitted[1] + passes
            admissions = self._admissions[len(rows) >= self.batch_size]
            admissions[:] = admissions[0] + spent, admissions[1] + len(rows)
        if model is self.draft_model:  # what drafting costs per prompt
            fed = sum(len(p) for p in prompts) if self.encdec else sum(len(f) for f in feeds)
            self._draft_prefill = [a + b for a, b in zip(self._draft_prefill, (spent, len(rows), fed), strict=True)]
            for r, feed in zip(rows, feeds, strict=True):
                r.draft_behind = not feed and len(r.seq) > 1
        return hidden

    def _prefill_per_token(self, costs: Costs, live: list[Row]) -> float:
        """What drafting costs outside the rounds per token generated, in plain steps. The draft's prefill: each new
        prompt's, spread over the tokens a row yields; and, to turn drafting on, the catch-up of the rows admitted
        while the batch did not draft (each one's tokens so far, at the measured seconds per token), spread over the
        tokens the live rows have left. A drafting batch has none to catch up: it drafts while its rounds pay, and
        starts again only where they also pay for the catch-up. And for a batch in step (rows that entered together
        and end together unless drafting scatters them), the target's prefill per row of rows admitted apart over
        that of a whole batch admitted at once: a batch already scattered gains nothing by not drafting."""
        seconds, prompts, tokens = self._draft_prefill
        (apart_s, apart), (whole_s, whole) = self._admissions
        if not costs.step_s:
            return 0.0
        expected = max(self._row_tokens[0] / self._row_tokens[1] if self._row_tokens[1] else self.max_new_tokens, 1.0)
        in_step = whole and apart and len({len(r.new) for r in live}) < 2
        per_row = max(apart_s / apart - whole_s / whole, 0.0) if in_step else 0.0  # seconds a row
        if prompts:
            behind = sum(len(r.seq) - 1 for r in live if r.draft_behind and self.drafter.room(len(r.seq)) >= 1)
            left = max(sum(max(expected - len(r.new), 1.0) for r in live), 1.0)
            per_row += seconds / prompts + seconds / max(tokens, 1) * behind * expected / left
        return per_row / expected / costs.step_s

    # -- costs at this batch width ---------------------------------------------------------------

    def _wants_costs(self, width: int) -> bool:
        """Given costs are kept; measured ones are remeasured for a wider batch (a job's first call may be narrower)."""
        remeasure = self.gamma_policy.needs_costs or 0 < self._costs_width < width
        return remeasure and not isinstance(self.drafter, NoDrafter)

    def _measure_costs(self, live: list[Row], tkv: BatchKV | SlotKV, dkv: BatchKV | SlotKV | None) -> None:
        """c and v(k) at this batch width (batch-1 costs mislead a batch), timed on the live caches and rolled back.
        The rows' clocks leave this time out. A row's gammas depend on its batch-mates, so adaptive sampling does not
        reproduce a seed's batch-1 sample (greedy output never depends on gamma)."""
        t0, setup = time.perf_counter(), setup_seconds(tkv, dkv)
        costs = self._time_passes(live, tkv, dkv, tuple(range(2, self.gamma + 2)), reps=2)
        if not self._admissions[0][1] and not _by_rows(tkv, 1):  # a row admitted apart, timed here (its cache thrown
            counts = list(self.admitted)  # away) so that the batch rule prices scattering rows before any is
            self._prefill(self.target, BatchKV(self.target, 0, self.pad_id), live[:1], None)
            self.admitted[:] = counts
        for kv in (tkv, dkv):
            if isinstance(kv, BatchKV):
                kv.merge()  # the timing passes left holes (slots have none)
        self.gamma_policy.set_costs(costs, replace=True)
        self._costs_width = len(live)
        # (Graphs captured meanwhile are left out of the rows' limits with the others: `r.setup`.)
        spent = time.perf_counter() - t0 - (setup_seconds(tkv, dkv) - setup)
        for r in live:
            r.start += spent

    def _fitted_round(self, live: list[Row], tkv: BatchKV | SlotKV, dkv: BatchKV | SlotKV | None) -> None:
        """A round and its holes' compaction, its seconds kept against what the costs predict for it (a catch-up of
        the draft's cache and one-off graph captures left out: priced apart, and not the round's)."""
        t0, setup, caught = time.perf_counter(), setup_seconds(tkv, dkv), self._draft_prefill[0]
        self._round(live, tkv, dkv)
        for kv in (tkv, dkv):
            # Holes (none in slots) cost attention work every pass; a gather costs about one cache copy.
            if isinstance(kv, BatchKV) and kv.rows and kv.wasted() > 8 + kv.width // 8:
                kv.merge()
        costs, ks = getattr(self.gamma_policy, "costs", None), {r.stats.gammas[-1] for r in live}
        # (kept where every row drafted one K: a probe, or rows drafting less near their ends, cost less than priced)
        if costs is not None and costs.step_s and len(live) == self.batch_size > 1 and len(ks) == 1:
            k = ks.pop()
            spent = time.perf_counter() - t0 - (setup_seconds(tkv, dkv) - setup) - (self._draft_prefill[0] - caught)
            self._fit[k > 0].append((spent, costs.step_s * costs.round_cost(k)))

    def _round_factor(self) -> float:
        """Drafting rounds' cost against the costs' prediction over plain rounds' (each predicted as one step); a side
        timed in fewer than a few rounds is taken as the other's (plain: 1.0): plain ones say nothing of drafting."""
        draft, plain = [sum(s for s, _ in f) / sum(p for _, p in f) if len(f) >= FIT_MIN_ROUNDS else None  # (copies:
                        for f in (list(self._fit[True]), list(self._fit[False]))]  # another thread may append)
        return 1.0 if draft is None else draft / (plain or 1.0)

    def _starts_drafting(self, width: int) -> bool:
        """Whether rows entering an empty batch prefill the draft: unless the batch rule, with the costs known and every
        row at the policy's pooled acceptance (where a new row starts), says that `width` rows do not draft."""
        policy = self.gamma_policy
        if not (isinstance(policy, AdaptiveGamma) and policy.costs is not None and width > 1):
            return True
        return batch_gamma(policy.costs, [policy.prior()] * width, min(self.gamma, policy.max_gamma),
                           self._prefill_per_token(policy.costs, []), DRAFT_HURDLE, self._round_factor()) > 0

    def _batch_gamma(self, policy: AdaptiveGamma, live: list[Row]) -> int:
        """One gamma for all rows: a verify pass is as wide as its longest row; a row drafting less wastes its share."""
        cap = min(self.gamma, policy.max_gamma)
        per_token = self._prefill_per_token(policy.costs, live)
        k = batch_gamma(policy.costs, [r.gamma_state.acceptance for r in live], cap, per_token,
                        DRAFT_HURDLE * (1 if self._drafting else 2), self._round_factor())
        self._drafting = k > 0
        if k > 0:
            self._rounds_without_drafts, self._probe_every = 0, FIRST_BATCH_PROBE_WAIT
            return k
        if batch_gamma(policy.costs, [1.0] * len(live), cap, per_token=per_token) == 0:
            return 0  # no acceptance pays for drafting at this width (every draft accepted): nothing to probe
        # Rows learn acceptance only from rounds that draft: probe now and then, backing off as at batch 1.
        self._rounds_without_drafts += 1
        if self._rounds_without_drafts < self._probe_every:
            return 0
        self._rounds_without_drafts = 0
        self._probe_every = min(2 * self._probe_every, MAX_BATCH_PROBE_WAIT)
        return 1

    # -- one round --------------------------------------------------------------------------------

    def _gammas(self, live: list[Row], dkv: BatchKV | SlotKV | None) -> tuple[list[int], bool, bool]:
        """Each row's drafts: one gamma for the batch under the adaptive policy with measured costs, else each row's
        own; and whether the round is a probe, whose rows keep one token each (in step with their wave, which enters
        in as few prefill passes). Rows admitted while the batch did not draft get their draft cache prefilled first
        (in a probe, a few)."""
        policy = self.gamma_policy
        batch_k = isinstance(policy, AdaptiveGamma) and policy.costs is not None and len(live) > 1
        k = self._batch_gamma(policy, live) if batch_k else 0
        ks = self._row_gammas(live, (lambda r: k) if batch_k else (lambda r: r.gamma_state.next()))
        behind = [b for b, r in enumerate(live) if r.draft_behind and ks[b] > 0]
        if behind and dkv is not None:
            if not self._drafting:  # a probe: the rows with a draft cache, and a few caught up
                room = max(PROBE_ROWS - sum(not r.draft_behind for r in live), 0)
                for b in behind[room:]:
                    ks[b] = 0
                behind = behind[:room]
            if behind:  # their draft cache, written over their (empty) places
                self._prefill(self.draft_model, dkv, [live[b] for b in behind], behind)
        return ks, batch_k, batch_k and not self._drafting and any(ks)
