"""Several prompts per verify pass (`BatchSpeculativeGenerator`), still exact per prompt.

Greedy: every row's output equals that prompt decoded alone (batch-1 engine) and equals
`target.generate`, with prompts of different lengths, rows that finish at different rounds
(EOS or length) and rows admitted as others leave (continuous batching). Sampling: each row
follows the target's distribution (chi-square, as in test_engine_sampling) and reproduces
the batch-1 sample of its seed.
"""


import pytest
import torch

from specdec_core import batch_engine
from specdec_core.batch_engine import BatchSpeculativeGenerator, prefill_chunks
from specdec_core.batch_kv import BatchKV
from specdec_core.drafters import ModelDrafter, NgramDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.gamma import AdaptiveGamma, Costs
from specdec_core.pass_settings import PassSettings
from specdec_core.processing import SamplingSettings
from tests.numerics import assert_logits_close
from tests.test_engine_sampling import N_NEW, SAMPLES, chi2_pvalue, exact_distribution, tiny
from tests.tiny_models import make_model, perturbed_copy

TEXTS = ["The quick brown fox", "def add(a, b):\n    return", "Hello", "A",
         "for i in range(10):\n    print(i * i)\n and then the quick brown fox jumps over",
         "Summarize: the committee met on Tuesday", "Speculative decoding drafts a few tokens"]


def drafter_for(name, draft):
    return {"model": lambda: ModelDrafter(draft), "ngram": lambda: NgramDrafter(),
            "none": lambda: NoDrafter()}[name]()


def hf_greedy(model, ids, n):
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n,
                             pad_token_id=model.config.pad_token_id)
    return out[0, 1 if model.config.is_encoder_decoder else len(ids):].tolist()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(t)["input_ids"] for t in TEXTS]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_row_logits_in_a_batch_equal_the_row_alone(models, prompts, kind):
    """Padding, holes (rejected drafts), explicit positions, compaction, merging, dropping a row
    and refilling a row's place leave each row's logits those of the row alone. Tolerance: fp32
    with different GEMM shapes (a batch of rows, masked columns) sums in a different order; the
    tiny models' logits are O(10) and differ by under 1e-5 here (7e-6 measured), far below the
    top-2 gaps greedy decoding depends on; tests/numerics.py scales the tolerance to the logits."""
    target, _ = models[kind]
    rows = [list(prompts[i]) for i in (0, 2, 4)]
    kv = BatchKV(target, len(rows))
    kv.forward([r[:-1] for r in rows], logits=False)
    gen = torch.Generator().manual_seed(0)
    compacted = None
    for step in range(4):
        check_a_round(kv, target, rows, gen, idle=1 if step == 1 else None)  # rejected drafts leave holes
        if step == 3:  # the pass after compaction appended in place
            assert kv.cache.layers[0]._kbuf.data_ptr() == compacted
        if step == 0:  # a finished row's place taken by a prompt longer than the cache is wide
            long = prompts[4] + prompts[6]
            new = BatchKV(target, 1)
            new.forward([long[:-1]], logits=False)
            assert len(long) - 1 > kv.width
            kv.place([1], new)
            rows[1] = list(long)
        if step == 2:
            kv.merge()  # (nothing to append: the holes dropped)
            compacted = kv.cache.layers[0]._kbuf.data_ptr()  # gathered into a buffer with room
        if step == 1:  # a newly admitted row merged in, then an old one leaving
            new = BatchKV(target, 1)
            new.forward([prompts[5][:-1]], logits=False)
            kv.merge(new)
            rows.append(list(prompts[5]))
            buffer = kv.cache.layers[0]._kbuf.data_ptr()
            order = kv.drop([1])  # the last row moves into its place; nothing else is copied
            assert order == [0, 3, 2]
            assert kv.cache.layers[0]._kbuf.data_ptr() == buffer
            rows = [rows[i] for i in order]


def check_a_round(kv, target, rows: list[list[int]], gen: torch.Generator, idle: int | None = None) -> None:
    """One pass over a batch cache (`BatchKV` or `SlotKV`): each row feeds what its cache lacks
    plus 1-3 random tokens (row `idle` feeds nothing), and its logits must be the row's alone;
    then the second half of each row's block is rejected (rolled back), and rows[b] becomes its
    kept tokens plus one new one, the next round's uncached token."""
    blocks = [torch.randint(4, 300, (int(torch.randint(1, 4, (1,), generator=gen)),), generator=gen).tolist()
              for _ in rows]
    if idle is not None:
        blocks[idle] = []
    feeds = [r[kv.length(b):] + blk for b, (r, blk) in enumerate(zip(rows, blocks, strict=True))]
    logits = kv.forward(feeds)
    for b, r in enumerate(rows):
        full = r + blocks[b]
        if not feeds[b]:
            continue
        with torch.inference_mode():
            alone = target(input_ids=torch.tensor([full])).logits[0, -len(feeds[b]):].float()
        assert_logits_close(logits[b, : len(feeds[b])], alone)
        keep = len(r) + len(blocks[b]) // 2
        kv.rollback(b, keep)
        rows[b] = full[: keep + 1]


def _admissions(engine, admitted: list | None = None):
    """Wrap _admit to record (live rows before, rows admitted) per call; and into `admitted`,
    the callers' indices of the rows each call admitted."""
    calls, admit = [], engine._admit

    def wrapped(waiting, slots, live, tkv, dkv, **kwargs):
        before = tkv.rows
        rows = admit(waiting, slots, live, tkv, dkv, **kwargs)
        calls.append((before, len(rows)))
        if admitted is not None:
            admitted.append([r.index for r in rows])
        return rows
    engine._admit = wrapped
    return calls


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("drafter", ["model", "ngram", "none"])
def test_greedy_rows_equal_batch_one_and_target_generate(models, prompts, kind, drafter):
    target, draft = models[kind]
    n = 14
    single = SpeculativeGenerator(target, drafter_for(drafter, draft), num_speculative_tokens=3, max_new_tokens=n)
    alone = [single.generate(p).tokens for p in prompts]
    # An EOS that greedy emits mid-output for some prompts: those rows stop early.
    eos = alone[0][5]
    saved = target.generation_config.eos_token_id
    target.generation_config.eos_token_id = eos
    try:
        single = SpeculativeGenerator(target, drafter_for(drafter, draft), num_speculative_tokens=3,
                                      max_new_tokens=n)
        alone = [single.generate(p) for p in prompts]
        engine = BatchSpeculativeGenerator(target, drafter_for(drafter, draft), batch_size=3,
                                           num_speculative_tokens=3, max_new_tokens=n)
        groups = []
        calls = _admissions(engine, groups)
        passes = engine.admitted[1]
        batched = engine.generate_many([(p, 0) for p in prompts])
        reference = [hf_greedy(target, p, n) for p in prompts]
    finally:
        target.generation_config.eos_token_id = saved
    for i, (a, b, ref) in enumerate(zip(alone, batched, reference, strict=True)):
        assert b.tokens == a.tokens == ref, f"prompt {i}"
        assert b.stats.finish_reason == a.stats.finish_reason
        assert b.stats.verify_steps == a.stats.verify_steps  # same rounds: same gammas, same accepts
        assert b.stats.accepted_tokens == a.stats.accepted_tokens
        assert (b.stats.draft_steps, b.stats.draft_tokens) == (a.stats.draft_steps, a.stats.draft_tokens)  # each row's
        assert b.stats.new_tokens == len(b.tokens)
    reasons = {b.stats.finish_reason for b in batched}
    assert reasons == {"eos", "length"}, reasons
    assert len({b.stats.verify_steps for b in batched}) > 1  # rows finished at different rounds
    # Continuous batching: prompts were admitted into a batch that still had live rows.
    assert calls[0] == (0, 3)
    assert any(before > 0 for before, _ in calls[1:])
    assert sum(k for _, k in calls) == len(prompts)
    # Each row says how it entered: with whom, in how many of the target's prefill passes, and
    # how long it waited on admissions (its own, and those of the rows that came in after it).
    for group in groups:
        for i in group:
            s = batched[i].stats
            assert s.admitted_with == len(group)
            assert 1 <= s.admit_passes <= len(group)
            assert s.admit_s >= s.prefill_s > 0  # (no graphs captured meanwhile, which admit_s leaves out)
    assert sum(b.stats.admit_passes / b.stats.admitted_with for b in batched) == pytest.approx(
        engine.admitted[1] - passes)
    assert all((a.stats.admitted_with, a.stats.admit_passes) == (1, 1) and 0 < a.stats.admit_s <= a.stats.prefill_s
               for a in alone)


def test_chained_rows_count_their_own_draft_steps_as_at_batch_one(models, prompts):
    """A chain runs the round's longest row's steps for every row; each row counts its own (the report's c), as at
    batch 1: rows cut short by their budgets draft fewer in their last rounds."""
    target, draft = models["llama"]
    settings = dict(num_speculative_tokens=3, max_new_tokens=12, cuda_graphs="on")
    single = SpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs="on", chain=True), **settings)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs="on", chain=True), batch_size=3,
                                       **settings)
    rows = prompts[:3]
    alone = [single.generate(p).stats for p in rows]
    batched = [o.stats for o in engine.generate_many([(p, 0) for p in rows])]
    assert len({tuple(s.gammas) for s in alone}) > 1  # rows whose last rounds draft differently
    assert [(s.draft_steps, s.draft_tokens, s.gammas) for s in batched] == \
        [(s.draft_steps, s.draft_tokens, s.gammas) for s in alone]
    assert all(s.draft_steps == sum(s.gammas) for s in alone)  # (a chain runs all its row's steps)


def test_freed_slots_wait_to_admit_rows_together(models, prompts):
    """`admit_together`: finished rows' slots stay free until that many are (or every waiting prompt fits), so new
    rows enter in fewer, wider admissions; the outputs are the same."""
    target, draft = models["llama"]
    n, items = 10, [(p, 0) for p in prompts * 2]
    reference = [hf_greedy(target, p, n) for p, _ in items]
    sizes = {}
    for together in (1, 3):
        engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=4, num_speculative_tokens=3,
                                           max_new_tokens=n, settings=PassSettings(admit_together=together))
        calls = _admissions(engine)
        assert [o.tokens for o in engine.generate_many(items)] == reference, together
        sizes[together] = [k for _, k in calls]
    assert sum(sizes[1]) == sum(sizes[3]) == len(items)
    assert min(sizes[1][1:]) == 1  # at once, a row enters alone when one slot frees
    for i, k in enumerate(sizes[3]):
        assert k >= min(3, len(items) - sum(sizes[3][:i])), sizes[3]
    assert len(sizes[3]) < len(sizes[1])


def test_the_last_waiting_prompt_enters_when_one_slot_frees(models, tokenizer):
    """`admit_together` waits for that many free slots or for every waiting prompt: one prompt left enters at once."""
    target, draft = models["llama"]
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=4, num_speculative_tokens=2,
                                       max_new_tokens=8, settings=PassSettings(admit_together=3))
    calls = _admissions(engine)
    ids = tokenizer(TEXTS[1]).input_ids
    engine.generate_many([(ids, 0)] * 5, [lambda tokens: 0] + [None] * 4)  # the first row ends after one round
    assert calls == [(0, 4), (4, 1)]  # the fifth prompt took its place while three rows went on


def test_a_finished_rows_place_is_refilled_and_the_rows_that_go_on_count_the_wait(models, tokenizer, monkeypatch):
    """A finished row's place is taken by the next prompt in place (`BatchKV.place`); the row that goes on waited for
    that prompt's prefill too, the new row for its own."""
    from tests.test_engine_greedy import FakeClock

    target, draft = models["llama"]
    placed, place = [], BatchKV.place
    monkeypatch.setattr(BatchKV, "place", lambda self, slots, fresh: placed.append((self.model, list(slots)))
                        or place(self, slots, fresh))
    clock = FakeClock(monkeypatch)
    handle = clock.on_prompt_passes(target, 1.0)
    try:
        engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=2, num_speculative_tokens=2,
                                           max_new_tokens=6, cuda_graphs="off")
        prompts = [tokenizer(t).input_ids for t in ("The quick brown fox", TEXTS[1], "Summarize: the committee")]
        outs = engine.generate_many([(p, 0) for p in prompts], [lambda tokens: 0, None, None])  # row 0 ends at once
    finally:
        handle.remove()
    assert outs[0].stats.new_tokens == 1 and outs[2].stats.admitted_with == 1
    assert (target, [0]) in placed
    assert outs[1].stats.admit_s == 2.0 and outs[2].stats.admit_s == 1.0  # its own admission and the third row's
    assert outs[0].stats.admit_s == 1.0  # (it had left: the third row's admission is not its wait)


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_rows_admitted_together_into_an_emptied_batch(models, kind):
    """Every row leaves, then the next prompts enter together, merged into the emptied cache: its layers, of no
    rows, must not come back (an encoder-decoder's new rows bring no decoder columns to replace them)."""
    target, _ = models[kind]
    items, n = [([174], 0), ([232, 260, 259], 0), ([201], 0), ([313], 0)], 4
    engine = BatchSpeculativeGenerator(target, NgramDrafter(), batch_size=2, num_speculative_tokens=1,
                                       max_new_tokens=n, settings=PassSettings(admit_together=2))
    calls = _admissions(engine)
    assert [o.tokens for o in engine.generate_many(items)] == [hf_greedy(target, p, n) for p, _ in items]
    assert calls == [(0, 2), (0, 2)]  # (the second pair enters a cache of no rows)


def test_rows_admitted_while_the_batch_does_not_draft_into_an_emptied_draft_cache(tokenizer):
    """The same for the draft's cache: while the batch drafts nothing, newcomers enter it as empty rows (their
    prefill skipped), also once every row has left it (here it did, before this was mended)."""
    target = make_model("llama", tokenizer, seed=1)
    draft = perturbed_copy(target, 0.5, seed=3)
    target.generation_config.eos_token_id = draft.generation_config.eos_token_id = 110  # (rows end at scattered rounds)
    first = [108, 212, 104, 164, 203, 171, 69, 135, 273, 280, 42, 27, 216, 183, 12, 36, 250, 106, 38, 255, 19, 113, 80,
             43, 100, 133, 88, 170, 202, 224, 296, 297, 273]
    items, n = [(first, 0), ([150], 0), ([128, 22], 0), ([88], 0), ([7], 0)], 6
    never = AdaptiveGamma(Costs(c=1.5, v={k: 1.0 + 0.2 * k for k in range(2, 14)}), max_gamma=1,
                          share_across_items=False)  # (a draft step dearer than a target step: it never pays)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=2, num_speculative_tokens=1,
                                       max_new_tokens=n, gamma_policy=never, settings=PassSettings(admit_together=2))
    assert [o.tokens for o in engine.generate_many(items)] == [hf_greedy(target, p, n) for p, _ in items]


def test_prefill_passes_keep_rows_times_longest_within_the_budget():
    assert prefill_chunks([5, 3, 4, 9, 1], 10) == [[0, 1], [2], [3], [4]]
    assert prefill_chunks([30, 2], 10) == [[0], [1]]  # a prompt over the budget passes alone
    assert prefill_chunks([5, 3, 4], None) == [[0, 1, 2]]
    assert prefill_chunks([], 10) == []


@pytest.mark.parametrize("drafter", ["model", "none"])
def test_prompts_prefilled_in_several_passes_decode_as_alone(models, prompts, monkeypatch, drafter):
    """A small prefill budget splits each admission into several passes, merged (first wave) or
    placed over finished rows (refills); every row still decodes as alone."""
    target, draft = models["llama"]
    passes = []

    def recorded(lengths, budget):
        passes.append(prefill_chunks(lengths, budget))
        return passes[-1]
    monkeypatch.setattr(batch_engine, "prefill_chunks", recorded)
    single = SpeculativeGenerator(target, drafter_for(drafter, draft), num_speculative_tokens=3, max_new_tokens=10)
    alone = [single.generate(p).tokens for p in prompts]
    engine = BatchSpeculativeGenerator(target, drafter_for(drafter, draft), batch_size=4, num_speculative_tokens=3,
                                       max_new_tokens=10, prefill_tokens=12)
    out = engine.generate_many([(p, 0) for p in prompts])
    assert [o.tokens for o in out] == alone
    assert max(len(chunks) for chunks in passes) > 1


def test_one_token_prompts_and_batch_larger_than_the_input(models):
    target, draft = models["llama"]
    items = [([5], 0), ([7], 1)]  # nothing to prefill: the caches start empty
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=8, num_speculative_tokens=2,
                                       max_new_tokens=6)
    out = engine.generate_many(items)
    for (ids, _), o in zip(items, out, strict=True):
        assert o.tokens == hf_greedy(target, ids, 6)


@pytest.mark.parametrize("kind", ["t5", "bart"])
@pytest.mark.parametrize("drafter", ["model", "ngram", "none"])
def test_encoder_decoder_rows_equal_batch_one_and_target_generate(models, prompts, kind, drafter):
    """Every family and the per-row positions: tests/test_batch_families.py."""
    target, draft = models[kind]
    single = SpeculativeGenerator(target, drafter_for(drafter, draft), num_speculative_tokens=3, max_new_tokens=12)
    alone = [single.generate(p) for p in prompts]
    engine = BatchSpeculativeGenerator(target, drafter_for(drafter, draft), batch_size=3, num_speculative_tokens=3,
                                       max_new_tokens=12)
    batched = engine.generate_many([(p, 0) for p in prompts])
    for a, b, p in zip(alone, batched, prompts, strict=True):
        assert b.tokens == a.tokens == hf_greedy(target, p, 12)
        assert b.stats.verify_steps == a.stats.verify_steps


# -- sampling ------------------------------------------------------------------------------------

PROMPTS = ([1, 2, 3, 1, 2], [4, 0, 5, 3, 2, 1, 4, 4, 5])  # two lengths in one batch


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["model", "ngram", "probes"])
def test_batched_sampling_matches_target_distribution_per_row(drafter, monkeypatch):
    """probes: every round a probe of a batch that does not draft (each row keeps the first token of its round)."""
    target = tiny("llama", seed=0, std=0.8)
    draft = perturbed_copy(target, noise=0.8, seed=1)
    sampling = SamplingSettings(temperature=1.0)
    make = (lambda: ModelDrafter(draft)) if drafter != "ngram" else (lambda: NgramDrafter(max_ngram=2))
    policy = AdaptiveGamma(Costs(c=0.1, v={2: 1.5, 3: 2.0})) if drafter == "probes" else None
    engine = BatchSpeculativeGenerator(target, make(), batch_size=128, num_speculative_tokens=2,
                                       max_new_tokens=N_NEW, sampling=sampling, gamma_policy=policy)
    if drafter == "probes":
        def probe(policy, live):
            engine._drafting = False
            return 1
        engine._batch_gamma = probe
        monkeypatch.setattr(batch_engine, "PROBE_ROWS", engine.batch_size)  # every row probes, every round
    items = [(list(PROMPTS[s % 2]), s) for s in range(2 * SAMPLES)]
    outs = engine.generate_many(items)
    for which, prompt in enumerate(PROMPTS):
        counts: dict[tuple, int] = {}
        for (ids, _), o in zip(items, outs, strict=True):
            if ids == prompt:
                counts[tuple(o.tokens)] = counts.get(tuple(o.tokens), 0) + 1
        p = chi2_pvalue(counts, exact_distribution(target, sampling, prompt))
        assert p > 1e-3, f"prompt {which}: samples do not follow the target (p={p:.2e})"
        if drafter != "ngram":
            assert chi2_pvalue(counts, exact_distribution(draft, sampling, prompt)) < 1e-6  # the test has power
    drafted = sum(o.stats.draft_tokens for o in outs)
    assert 0 < sum(o.stats.accepted_tokens for o in outs) < drafted  # rejections happened
    if drafter == "probes":
        assert all(o.stats.verify_steps == o.stats.new_tokens <= o.stats.draft_tokens + 1 for o in outs)


def test_batched_sample_of_a_seed_equals_its_batch_one_sample(models, prompts):
    """Each row draws from its own generator, seeded with its own seed, in the batch-1 order."""
    target, draft = models["llama"]
    sampling = SamplingSettings(temperature=1.0, top_k=20)
    single = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=3, max_new_tokens=10,
                                  sampling=sampling)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=4, num_speculative_tokens=3,
                                       max_new_tokens=10, sampling=sampling)
    items = [(p, 100 + i) for i, p in enumerate(prompts)]
    batched = engine.generate_many(items)
    assert [b.tokens for b in batched] == [single.generate(p, s).tokens for p, s in items]


def test_adaptive_gamma_per_row_keeps_greedy_exact(models, prompts):
    """Per-row adaptive gamma with early stopping (rows stop drafting at different steps)."""
    from specdec_core.gamma import AdaptiveGamma, Costs

    target, draft = models["llama"]
    policy = AdaptiveGamma(Costs(c=0.05, v={k: 1.0 + 0.1 * k for k in range(2, 8)}), max_gamma=4)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, num_speculative_tokens=4,
                                       max_new_tokens=12, gamma_policy=policy)
    out = engine.generate_many([(p, 0) for p in prompts])
    assert [o.tokens for o in out] == [hf_greedy(target, p, 12) for p in prompts]
    assert len({k for o in out for k in o.stats.drafts}) > 1  # the rows' gammas varied


def test_adaptive_gamma_never_drafts_what_no_acceptance_pays_for(models, prompts):
    """Costs at which even a draft accepted every time loses (a proposed token costing two target
    steps): the batch decodes as the target alone, not one probe drafted, at batch 1 and batched."""
    from specdec_core.gamma import AdaptiveGamma, Costs

    target, draft = models["llama"]
    costs = Costs(c=2.0, v={k: 1.0 + 0.1 * k for k in range(2, 8)})
    single = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=4, max_new_tokens=40,
                                  gamma_policy=AdaptiveGamma(costs, max_gamma=4))
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, num_speculative_tokens=4,
                                       max_new_tokens=40, gamma_policy=AdaptiveGamma(costs, max_gamma=4))
    out = [single.generate(p) for p in prompts] + engine.generate_many([(p, 0) for p in prompts])
    assert [o.tokens for o in out] == [hf_greedy(target, p, 40) for p in prompts] * 2
    assert sum(o.stats.draft_tokens for o in out) == 0


def test_adaptive_costs_are_measured_at_the_batch_width_and_rolled_back(models, prompts):
    """Without given costs the engine times the pair on its live rows (then rolls those passes
    back: outputs stay exact), and times it again for a wider batch; given costs are kept."""
    from specdec_core.gamma import AdaptiveGamma, Costs

    target, draft = models["llama"]
    policy = AdaptiveGamma(max_gamma=3)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=4, num_speculative_tokens=3,
                                       max_new_tokens=10, gamma_policy=policy)
    out = engine.generate_many([(p, 0) for p in prompts[:2]])
    first = policy.costs
    assert engine._costs_width == 2 and first is not None and sorted(first.v) == [2, 3, 4] and first.c > 0
    out += engine.generate_many([(p, 0) for p in prompts[2:]])
    assert engine._costs_width == 4 and policy.costs is not first
    assert [o.tokens for o in out] == [hf_greedy(target, p, 10) for p in prompts]
    assert all(o.stats.latency_s >= o.stats.ttft_s > 0 for o in out)

    given = Costs(c=0.05, v={k: 1.1 for k in range(2, 6)})
    kept = AdaptiveGamma(given, max_gamma=3)
    BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=4, num_speculative_tokens=3,
                              max_new_tokens=4, gamma_policy=kept).generate_many([(p, 0) for p in prompts])
    assert kept.costs is given


def test_adaptive_batch_drafts_one_gamma_for_all_rows_or_none(models, prompts):
    """Every row drafts the batch's gamma (capped by its budget); a batch whose verify pass costs
    k plain steps drafts only in its occasional probes, one token per row."""
    from specdec_core.gamma import AdaptiveGamma, Costs

    target, draft = models["llama"]
    cheap = AdaptiveGamma(Costs(c=0.05, v={k: 1.0 + 0.02 * k for k in range(2, 6)}), max_gamma=3,
                          prior_acceptance=0.9, early_stop=False)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=7, num_speculative_tokens=3,
                                       max_new_tokens=12, gamma_policy=cheap)
    out = engine.generate_many([(p, 0) for p in prompts])
    assert [o.tokens for o in out] == [hf_greedy(target, p, 12) for p in prompts]
    rounds = list(zip(*(o.stats.gammas for o in out), strict=False))  # round by round while all 7 rows live
    assert len(set(rounds[0])) == 1 and rounds[0][0] > 0

    full = AdaptiveGamma(Costs(c=0.2, v={k: float(k) for k in range(2, 6)}), max_gamma=4, prior_acceptance=0.95)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=4, num_speculative_tokens=4,
                                       max_new_tokens=24, gamma_policy=full)
    out = engine.generate_many([(p, 0) for p in prompts])
    assert [o.tokens for o in out] == [hf_greedy(target, p, 24) for p in prompts]
    assert {k for o in out for k in o.stats.gammas} <= {0, 1}
    assert sum(o.stats.draft_tokens for o in out) <= sum(len(o.stats.gammas) for o in out) / 8


def test_a_batch_does_not_draft_for_a_gain_within_the_hurdle(models, prompts, monkeypatch):
    """At the rows' acceptance drafting one token is predicted 4% faster than none (3.13 tokens per plain
    step against 3): within `DRAFT_HURDLE`, so the batch's first round decodes plainly; without it, it drafts."""
    import specdec_core.batch_engine as batch_engine
    from specdec_core.gamma import AdaptiveGamma, Costs

    target, draft = models["llama"]

    def first_round(hurdle):
        monkeypatch.setattr(batch_engine, "DRAFT_HURDLE", hurdle)
        policy = AdaptiveGamma(Costs(c=0.16, v={2: 1.23, 3: 1.4, 4: 1.6, 5: 1.7}), max_gamma=4,
                               prior_acceptance=0.45, early_stop=False)
        engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, num_speculative_tokens=4,
                                           max_new_tokens=12, gamma_policy=policy)
        out = engine.generate_many([(p, 0) for p in prompts[:3]])
        assert [o.tokens for o in out] == [hf_greedy(target, p, 12) for p in prompts[:3]]
        return [o.stats.gammas[0] for o in out]

    assert first_round(batch_engine.DRAFT_HURDLE) == [0, 0, 0]
    assert first_round(0.0) == [1, 1, 1]


def test_a_batch_that_does_not_draft_starts_only_past_twice_the_hurdle(models, prompts):
    """At the rows' acceptance drafting one token is predicted 8% faster than none: past `DRAFT_HURDLE`, so a batch
    that drafts goes on drafting, but within twice it, so a batch that does not (its rows end in waves) stays plain."""
    from specdec_core.gamma import AdaptiveGamma, Costs

    target, draft = models["llama"]
    policy = AdaptiveGamma(Costs(c=0.16, v={2: 1.23, 3: 1.4, 4: 1.6, 5: 1.7}), max_gamma=4, prior_acceptance=0.5,
                           early_stop=False)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, num_speculative_tokens=4,
                                       max_new_tokens=12, gamma_policy=policy)
    live = [engine._new_row(b, p, 0) for b, p in enumerate(prompts[:3])]
    assert engine._drafting and engine._batch_gamma(policy, live) == 1 and engine._drafting
    engine._drafting = False
    assert engine._batch_gamma(policy, live) == 0 and not engine._drafting


def test_rows_admitted_while_the_batch_does_not_draft_skip_the_draft_prefill(models, prompts):
    """An empty batch starts drafting only where the batch rule, at the pooled acceptance new rows start from, says
    it pays; while it does not draft, newcomers skip the draft's prefill, and a probe catches up the rows it drafts
    on, as does a batch that starts drafting again. Outputs stay exact."""
    from specdec_core.gamma import AdaptiveGamma, Costs

    target, draft = models["llama"]

    def run(policy, starts=None):
        engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=2, num_speculative_tokens=3,
                                           max_new_tokens=24, gamma_policy=policy)
        if starts is not None:
            engine._starts_drafting = lambda width: starts
        prefilled, prefill = [], engine._prefill

        def recorded(model, kv, rows, into, *encoded):  # (row, caught up rather than admitted) per draft prefill
            if model is draft:
                prefilled.extend((r.index, r.draft_behind) for r in rows)
            return prefill(model, kv, rows, into, *encoded)
        engine._prefill = recorded
        out = engine.generate_many([(p, 0) for p in prompts])
        assert [o.tokens for o in out] == [hf_greedy(target, p, 24) for p in prompts]
        return prefilled, out

    # Drafting pays only at an acceptance above 0.99 (so it probes, and does not draft at the rows' acceptance).
    full = AdaptiveGamma(Costs(c=0.2, v={k: 0.22 + 0.78 * k for k in range(2, 6)}), max_gamma=3, prior_acceptance=0.95)
    prefilled, out = run(full)
    assert prefilled and all(late for _, late in prefilled)  # none at admission: only probes caught rows up
    # A probe's rows keep one token each, as plain rounds do (its accepted drafts measured, not kept): in step.
    assert sum(o.stats.accepted_tokens for o in out) > 0
    assert all(o.stats.verify_steps == o.stats.new_tokens for o in out[:-1])  # (the last, alone, drafts its own way)
    never = set(range(len(prompts))) - {i for i, _ in prefilled}
    assert never and all(not any(out[i].stats.gammas) for i in never)  # skipped, and never drafted
    assert all(i in {j for j, _ in prefilled} for i, o in enumerate(out) if any(o.stats.gammas))
    prefilled, _ = run(full, starts=True)  # an engine that started drafting
    assert prefilled[:2] == [(0, False), (1, False)]  # the first rows, admitted before the batch chose

    cheap = AdaptiveGamma(Costs(c=0.05, v={k: 1.0 + 0.02 * k for k in range(2, 6)}), max_gamma=3,
                          prior_acceptance=0.9, early_stop=False)
    prefilled, out = run(cheap)
    assert prefilled[:2] == [(0, False), (1, False)]  # drafting pays at the prior: prefilled as they enter
    assert all(o.stats.draft_tokens > 0 for o in out if o.stats.new_tokens > 1)
    prefilled, out = run(cheap, starts=False)  # admitted without the prefill, then the batch drafts
    assert prefilled[:2] == [(0, True), (1, True)]  # caught up, before any draft cache existed
    assert sorted({i for i, _ in prefilled}) == list(range(len(prompts)))
    assert all(o.stats.draft_tokens > 0 for o in out if o.stats.new_tokens > 1)


def test_a_batch_turns_drafting_on_only_where_its_rounds_pay_for_the_catch_up(models, prompts):
    """Rows admitted while the batch did not draft have no draft cache: turning drafting on first prefills the
    draft with each row's tokens so far. Near the rows' end that catch-up costs more than the rounds gain, so the
    batch stays plain; the same rows caught up (a batch that drafts) go on drafting, and fresh rows catch up."""
    from specdec_core.gamma import AdaptiveGamma, Costs

    target, draft = models["llama"]
    policy = AdaptiveGamma(Costs(c=0.1, v={k: 0.8 + 0.2 * k for k in range(2, 6)}, step_s=0.01), max_gamma=3,
                           prior_acceptance=0.8, early_stop=False)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=4, num_speculative_tokens=3,
                                       max_new_tokens=40, gamma_policy=policy)
    engine._draft_prefill = [0.02, 4, 40]  # 0.05 plain steps per prompt token

    def rows(done: int, behind: bool):
        live = [engine._new_row(b, p, 0) for b, p in enumerate(prompts[:4])]
        for r in live:
            r.new, r.seq, r.draft_behind = [5] * done, r.seq + [5] * done, behind
        return live

    assert engine._prefill_per_token(policy.costs, rows(36, False)) == pytest.approx(0.0125)  # the prompts' alone
    assert engine._batch_gamma(policy, rows(36, True)) == 0  # 4 tokens a row left to pay for ~43 prefilled
    assert engine._batch_gamma(policy, rows(36, False)) > 0
    assert engine._batch_gamma(policy, rows(0, True)) > 0

    # Plain rounds timed at 1.1x their predicted cost, drafting ones not yet: no discount for drafting.
    engine._fit[False].extend([(0.011, 0.01)] * 3)
    engine._fit[True].extend([(0.0286, 0.013)] * 2)
    assert engine._round_factor() == 1.0
    # Drafting rounds timed at 2.2x their predicted cost where plain rounds took 1.1x: priced at twice the costs.
    engine._fit[True].append((0.0286, 0.013))
    assert engine._round_factor() == pytest.approx(2.0)
    assert engine._batch_gamma(policy, rows(36, False)) == 0


def test_a_batch_in_step_prices_what_admitting_rows_apart_costs(models, prompts):
    """Rows that entered together end together unless drafting scatters them, and rows admitted apart cost more a row
    than a whole batch admitted at once. A batch in step (and an empty one) is charged that difference, spread over
    a row's tokens; a batch already out of step is not: it gains nothing by not drafting. The engine keeps both
    costs from its target's prefills, and outputs stay exact."""
    from specdec_core.gamma import AdaptiveGamma, Costs

    target, draft = models["llama"]
    policy = AdaptiveGamma(Costs(c=0.1, v={k: 0.8 + 0.2 * k for k in range(2, 6)}, step_s=0.01), max_gamma=3,
                           prior_acceptance=0.8, early_stop=False)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=4, num_speculative_tokens=3,
                                       max_new_tokens=40, gamma_policy=policy)

    def rows(*done: int):
        live = [engine._new_row(b, p, 0) for b, p in enumerate(prompts[:4])]
        for r, n in zip(live, done, strict=True):
            r.new, r.seq = [5] * n, r.seq + [5] * n
        return live

    assert engine._starts_drafting(4) and engine._batch_gamma(policy, rows(3, 3, 3, 3)) > 0  # nothing measured yet
    engine._admissions = ([2.0, 16], [0.4, 16])  # 125 ms a row admitted apart, 25 ms together
    assert engine._prefill_per_token(policy.costs, rows(3, 3, 3, 3)) == pytest.approx(0.1 / 40 / 0.01)
    assert not engine._starts_drafting(4)
    assert engine._batch_gamma(policy, rows(3, 3, 3, 3)) == 0
    assert engine._prefill_per_token(policy.costs, rows(3, 5, 3, 3)) == 0.0
    assert engine._batch_gamma(policy, rows(3, 5, 3, 3)) > 0

    fresh = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=2, num_speculative_tokens=3,
                                      max_new_tokens=12)
    out = fresh.generate_many([(p, 0) for p in prompts[:5]])
    assert [o.tokens for o in out] == [hf_greedy(target, p, 12) for p in prompts[:5]]
    (apart_s, apart), (whole_s, whole) = fresh._admissions
    assert whole + apart == 5 and whole >= 2 and whole % 2 == 0 and whole_s > 0 and (apart_s > 0) == (apart > 0)

    # Measuring its costs, an engine also times a row admitted apart: priced before any row has ended apart.
    for kind in ("llama", "t5"):  # (an encoder-decoder's row is encoded into a cache of its own, then dropped)
        target, draft = models[kind]
        first = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=2, num_speculative_tokens=3,
                                          max_new_tokens=12, gamma_policy=AdaptiveGamma())
        out = first.generate_many([(p, 0) for p in prompts[:2]])
        assert [o.tokens for o in out] == [hf_greedy(target, p, 12) for p in prompts[:2]]
        assert first._admissions[0][1] == 1 and first._admissions[0][0] > 0 and first._admissions[1][1] == 2
        assert first.admitted[0] == 2  # (the timed row is not counted as admitted)


def test_full_width_rounds_are_timed_against_their_predicted_cost(models, prompts):
    """The rounds at the batch's full width keep (seconds, predicted seconds): plain ones at one step, drafting ones
    at K c + v(K + 1) steps, where every row drafted K; outputs stay exact."""
    from specdec_core.gamma import AdaptiveGamma, Costs

    target, draft = models["llama"]
    policy = AdaptiveGamma(Costs(c=0.1, v={k: 0.8 + 0.2 * k for k in range(2, 6)}, step_s=0.01), max_gamma=3,
                           prior_acceptance=0.8, early_stop=False)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, num_speculative_tokens=3,
                                       max_new_tokens=16, gamma_policy=policy)
    out = engine.generate_many([(p, 0) for p in prompts])
    assert [o.tokens for o in out] == [hf_greedy(target, p, 16) for p in prompts]
    fits = list(engine._fit[True])
    assert fits and all(s > 0 for s, _ in fits)
    assert {round(p / 0.01, 6) for _, p in fits} <= {round(policy.costs.round_cost(k), 6) for k in range(1, 4)}

    # A probe (a few rows draft one token) costs less than the drafting round it would be priced as: not kept.
    live = [engine._new_row(b, p, 0) for b, p in enumerate(prompts[:3])]
    for gammas, kept in (([1, 0, 0], False), ([0, 0, 0], True), ([2, 2, 2], True)):
        def round_of(live, tkv, dkv, gammas=gammas):
            for r, k in zip(live, gammas, strict=True):
                r.stats.gammas.append(k)
        engine._round = round_of
        before = len(engine._fit[max(gammas) > 0])
        engine._fitted_round(live, None, None)
        assert len(engine._fit[max(gammas) > 0]) == before + kept


def test_stop_strings_end_each_row_where_batch_one_does(models, prompts, tokenizer):
    """A per-row finish check (stop strings) cuts each row at the token the batch-1 engine cuts at."""
    from specdec_core.stopping import StopStrings

    target, draft = models["llama"]
    n = 16
    plain = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=3, max_new_tokens=n)
    text = tokenizer.decode(plain.generate(prompts[0]).tokens, skip_special_tokens=True)
    stop = next(text[i: i + 2] for i in range(len(text) // 2, len(text) - 1)  # completed mid-output for this row
                if text[i: i + 2].isascii() and text[i: i + 2].isprintable())  # (U+FFFD is refused as a stop)
    alone = [plain.generate(p, finish_check=StopStrings(tokenizer, [stop])) for p in prompts]
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, num_speculative_tokens=3,
                                       max_new_tokens=n)
    batched = engine.generate_many([(p, 0) for p in prompts], [StopStrings(tokenizer, [stop]) for _ in prompts])
    for a, b in zip(alone, batched, strict=True):
        assert b.tokens == a.tokens and b.stats.finish_reason == a.stats.finish_reason
    assert batched[0].stats.finish_reason == "stop" and len(batched[0].tokens) < n
    # the job's TextGenerator gives each row its own check (one shared would read all rows' tokens as one text)
    from specdec_core.text import TextGenerator

    gens = [TextGenerator(target, tokenizer, ModelDrafter(draft), num_speculative_tokens=3, max_new_tokens=n,
                          stop=[stop], batch_size=b, cuda_graphs="off") for b in (1, 3)]
    items = [(t, 0) for t in TEXTS[:3]]
    alone_rows = [gens[0].generate(t, seed) for t, seed in items]
    assert [r["token_ids"] for r in gens[1].generate_batch(items)] == [r["token_ids"] for r in alone_rows]
    assert alone_rows[0]["finish_reason"] == "stop"


def test_rows_past_the_time_limit_leave_as_item_timeouts(models, prompts):
    from specdec_core.rows import ItemTimeout

    target, draft = models["llama"]
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, num_speculative_tokens=3,
                                       max_new_tokens=40)
    out = engine.generate_many([(p, 0) for p in prompts], max_seconds=1e-9)
    assert all(isinstance(o, ItemTimeout) for o in out)
    assert "longer than" in str(out[0])
    ok = engine.generate_many([(p, 0) for p in prompts[:2]], max_seconds=600)
    assert all(len(o.tokens) == 40 or o.stats.finish_reason == "eos" for o in ok)
    # a row that ends in the round its time runs out keeps its output, as at batch 1
    short = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, max_new_tokens=1)
    assert [o.stats.finish_reason for o in short.generate_many([(p, 0) for p in prompts[:3]], max_seconds=1e-9)] == [
        "length"] * 3


@pytest.mark.parametrize("kind", ["llama", "t5"])
@pytest.mark.parametrize("together", [1, 2])
def test_rows_that_time_out_mid_batch_leave_and_the_rest_stay_exact(models, prompts, monkeypatch, kind, together):
    """A time limit that fires for some rows only: the rows in the batch when the clock jumps leave as ItemTimeouts,
    mid-output; the prompts admitted into their places afterwards decode what generate() gives; nothing is lost."""
    import time

    from specdec_core.rows import ItemTimeout

    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    target, draft = models[kind]
    n = 12

    seen: list[int] = []

    def jump(tokens):  # row 0's finish check: 100 s pass once it has 3 tokens (every live row sees them)
        if len(seen) < 3 <= len(seen) + len(tokens):
            now[0] += 100.0
        seen.extend(tokens)
        return None

    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=2, num_speculative_tokens=2,
                                       max_new_tokens=n, settings=PassSettings(admit_together=together))
    out = engine.generate_many([(p, 0) for p in prompts], [jump] + [None] * (len(prompts) - 1), max_seconds=50)
    assert len(out) == len(prompts)
    assert all(isinstance(o, ItemTimeout) for o in out[:2]), out[:2]
    assert "stopped after" in str(out[0]) and "after 0 new" not in str(out[0])
    assert [o.tokens for o in out[2:]] == [hf_greedy(target, p, n) for p in prompts[2:]]


@pytest.mark.parametrize("chain", [False, True], ids=["steps", "chained"])
@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_drafts_end_at_an_end_token(models, prompts, kind, chain):
    """A draft that proposes an end token proposes nothing after it (nothing after an end is ever
    kept), at batch 1 and in a batch; the outputs stay the target's. Chained steps (static caches)
    run the round's 6 passes, but their drafts are cut at the end token too."""
    import copy

    target, _ = models[kind]
    plain = SpeculativeGenerator(target, NoDrafter(), max_new_tokens=8).generate(prompts[0]).tokens
    model = copy.deepcopy(target)  # the draft is the target itself, so every draft is accepted ...
    model.generation_config.eos_token_id = plain[2]  # ... and its third token now ends the text
    expected = plain[:3]
    draft = copy.deepcopy(model)  # (another object: a batch's static slots are the model's, one call's at a time)
    graphs = "on" if chain else "off"
    single = SpeculativeGenerator(model, ModelDrafter(draft, cuda_graphs=graphs, chain=chain), num_speculative_tokens=6,
                                  max_new_tokens=8, cuda_graphs=graphs)
    out = single.generate(prompts[0])
    steps = 6 if chain else 3  # (a chain runs all the round's steps)
    assert out.tokens == expected and out.stats.draft_tokens == 3 and out.stats.draft_steps == steps
    assert out.stats.acceptance_rate == 1.0
    engine = BatchSpeculativeGenerator(model, ModelDrafter(draft, cuda_graphs=graphs, chain=chain), batch_size=2,
                                       num_speculative_tokens=6, max_new_tokens=8, cuda_graphs=graphs)
    [row, _] = engine.generate_many([(prompts[0], 0), (prompts[1], 0)])
    assert row.tokens == expected and row.stats.draft_tokens == 3 and row.stats.draft_steps == steps


def test_greedy_picks_are_read_back_once_per_pass(models, prompts, monkeypatch):
    """Greedy rows without logits processors: one read-back of every row's argmax per model pass
    (a GPU waits for each read-back), none per row; with a processor, per-row picks as before."""
    target, draft = models["llama"]
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=4, num_speculative_tokens=3,
                                       max_new_tokens=10)
    reads, items = [], []
    original = BatchSpeculativeGenerator._argmax_rows

    def counted(self, live, logits):
        out = original(self, live, logits)
        reads.append(out is not None)
        return out

    monkeypatch.setattr(BatchSpeculativeGenerator, "_argmax_rows", counted)
    monkeypatch.setattr(torch.Tensor, "item", lambda t: items.append(1) or t.reshape(-1).tolist()[0])
    out = engine.generate_many([(p, 0) for p in prompts])
    assert reads and all(reads) and not items
    assert [g.tokens for g in out] == [hf_greedy(target, p, 10) for p in prompts]
    saved = target.generation_config.repetition_penalty
    target.generation_config.repetition_penalty = 1.3  # a processor that reads each row's tokens
    try:
        reads.clear()
        out = engine.generate_many([(p, 0) for p in prompts])
        reference = [hf_greedy(target, p, 10) for p in prompts]
    finally:
        target.generation_config.repetition_penalty = saved
    assert reads and not any(reads) and items
    assert [g.tokens for g in out] == reference


@pytest.mark.parametrize("kind", ["llama", "t5"])
@pytest.mark.parametrize("graphs", ["off", "on"])
def test_a_target_token_past_the_drafts_rows_reaches_the_draft_as_a_guess(kind, graphs):
    """One tokenizer, the target's output layer wider than the draft's (checkpoints padded to other
    multiples): a token the target writes past the draft's rows, or a prompt holds, cannot index the
    draft's embeddings (an encoder-decoder draft's encoder's too). The draft reads another token in its
    place (a worse guess, never another output); it crashed, at batch 1 and batched. So did a processor
    of the target's generation config that keeps a tensor of the first width it sees (bad words)."""
    import tests.test_engine_sampling as sampling_tests

    base = sampling_tests.V
    sampling_tests.V = base + 2
    try:
        target = tiny(kind, seed=0, std=0.8)
    finally:
        sampling_tests.V = base
    draft = tiny(kind, seed=1, std=0.8)
    prompt = [1, 2, 3, 1, 2]
    first = hf_greedy(target, prompt, 1)[0]
    with torch.no_grad():  # the target writes the draft's missing token first, then goes on
        target.lm_head.weight[base + 1] = target.lm_head.weight[first] * 3
    reference = hf_greedy(target, prompt, 8)
    assert base + 1 in reference
    single = SpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs=graphs), num_speculative_tokens=3,
                                  max_new_tokens=8, cuda_graphs=graphs)
    assert single.generate(prompt).tokens == reference
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs=graphs), batch_size=2,
                                       num_speculative_tokens=3, max_new_tokens=8, cuda_graphs=graphs)
    assert [o.tokens for o in engine.generate_many([(prompt, 0), ([4, 5], 1)])] == [reference,
                                                                                    hf_greedy(target, [4, 5], 8)]
    past = [4, base + 1, 5]  # a prompt holding the token the draft has no row for
    target.generation_config.bad_words_ids = [[3]]
    items = [(prompt, 0), (past, 1)]
    want = [hf_greedy(target, ids, 8) for ids, _ in items]
    assert single.generate(past).tokens == want[1]
    assert [o.tokens for o in engine.generate_many(items)] == want


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_an_empty_prompt_is_refused_before_any_work(models, prompts, kind):
    """Both engines name an item whose prompt has no tokens, in one ValueError, before any row decodes."""
    target, draft = models[kind]
    one = SpeculativeGenerator(target, ModelDrafter(draft), max_new_tokens=4)
    batched = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="item 0's prompt has no tokens"):
        one.generate([])
    with pytest.raises(ValueError, match=r"item 1's prompt has no tokens \(1 of 3 empty\)"):
        batched.generate_many([(prompts[0], 0), ([], 0), (prompts[1], 0)])
    assert batched.admitted == [0, 0]
