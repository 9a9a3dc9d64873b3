"""Greedy speculative output equals the target alone, token for token."""

import time

import pytest
import torch

from specdec_core.batch_kv import BatchKV, feed_to, one_row
from specdec_core.drafters import ModelDrafter, NgramDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.gamma import GammaPolicy, GammaState
from tests.numerics import assert_logits_close

PROMPTS = ["The quick brown", "def add(a, b):\n    return", "Summarize: the committee met on Tuesday", "Hi"]
KINDS = ["llama", "gpt2", "t5", "bart"]


def reference(target, ids, max_new_tokens):
    out = target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens)[0].tolist()
    return out[1:] if target.config.is_encoder_decoder else out[len(ids):]


def drafters(target, draft):
    return {"model": ModelDrafter(draft), "self": ModelDrafter(target), "ngram": NgramDrafter(), "none": NoDrafter()}


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_equals_target_generate(kind, models, tokenizer):
    target, draft = models[kind]
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        ref = reference(target, ids, 24)
        for name, drafter in drafters(target, draft).items():
            for gamma in (1, 3, 5):
                gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=gamma, max_new_tokens=24)
                assert gen.generate(ids).tokens == ref, (kind, name, gamma, prompt)


@pytest.mark.parametrize("kind", ["llama", "t5"])
@pytest.mark.parametrize("max_new", [1, 2, 3, 4, 5, 6, 7, 13])
def test_exact_lengths_at_every_budget(kind, max_new, models, tokenizer):
    target, draft = models[kind]
    ids = tokenizer(PROMPTS[0]).input_ids
    ref = reference(target, ids, max_new)
    for drafter in (ModelDrafter(target), ModelDrafter(draft), NgramDrafter()):
        out = SpeculativeGenerator(target, drafter, num_speculative_tokens=4, max_new_tokens=max_new).generate(ids)
        assert out.tokens == ref
        assert out.stats.new_tokens == len(ref) <= max_new


def test_self_draft_accepts_everything_in_ceil_n_over_gamma_plus_one_steps(models, tokenizer):
    target, _ = models["llama"]
    ids = tokenizer(PROMPTS[1]).input_ids
    out = SpeculativeGenerator(target, ModelDrafter(target), num_speculative_tokens=4, max_new_tokens=23).generate(ids)
    s = out.stats
    assert s.new_tokens == 23 and s.verify_steps == 5  # ceil(23 / 5)
    assert s.accepted_tokens == s.draft_tokens == 18 and s.acceptance_rate == 1.0
    assert s.finish_reason == "length" and s.rejections == 0  # (the report's a: no round ended at a rejection)


def test_drafts_cut_by_a_stop_are_not_counted_accepted(models, tokenizer):
    """A stop inside a round's accepted drafts: only the tokens kept count as accepted."""
    target, _ = models["llama"]
    s = SpeculativeGenerator(target, ModelDrafter(target), num_speculative_tokens=4, max_new_tokens=23).generate(
        tokenizer(PROMPTS[1]).input_ids, finish_check=lambda tokens: 0).stats
    assert s.new_tokens == 1 and s.finish_reason == "stop" and s.draft_tokens == 4
    assert s.accepted_tokens == 1


class FakeClock:
    """time.perf_counter standing still but where a test moves it: the stats' time splits exact, on any machine."""

    def __init__(self, monkeypatch):
        self.now = 0.0
        monkeypatch.setattr(time, "perf_counter", lambda: self.now)

    def on_prompt_passes(self, model, seconds: float):
        """Each pass of `model` over more than 4 tokens (a prompt's; rounds feed fewer) takes `seconds`."""
        def hook(module, args, kwargs):
            if kwargs["input_ids"].shape[1] > 4:
                self.now += seconds
        return model.register_forward_pre_hook(hook, with_kwargs=True)


def test_ttft_is_the_first_rounds_time_and_the_drafts_prompt_read_is_prefill(models, tokenizer, monkeypatch):
    """Time to first token is taken once, in the first round; a draft reads its prompt in its first pass, and that
    time is prefill, not drafting."""
    target, draft = models["llama"]
    clock = FakeClock(monkeypatch)

    def round_takes_a_second(tokens):  # (the finish check runs once a round)
        clock.now += 1.0

    handle = clock.on_prompt_passes(draft, 10.0)
    try:
        s = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=2, max_new_tokens=12).generate(
            tokenizer(PROMPTS[1]).input_ids, finish_check=round_takes_a_second).stats
    finally:
        handle.remove()
    assert s.verify_steps > 2
    assert s.ttft_s == 11.0 and s.prefill_s == 10.0 and s.draft_s == 0.0


@pytest.mark.parametrize("kind", ["gpt2", "bart"])
def test_eos_inside_an_accepted_block_stops_there(kind, models, tokenizer):
    """Make a token that greedy emits mid-way the EOS: output must stop exactly there."""
    target, draft = models[kind]
    found = [(ids, ref, i) for ids, ref in ((tokenizer(p).input_ids, None) for p in PROMPTS)
             for ref in [reference(target, ids, 20)] for i in range(2, 12) if ref[i] not in ref[:i]]
    assert found, "no prompt emits a fresh token mid-way"
    ids, ref, stop_at = found[0]
    eos = ref[stop_at]
    old = target.generation_config.eos_token_id
    target.generation_config.eos_token_id = eos
    try:
        expected = reference(target, ids, 20)
        assert expected == ref[: stop_at + 1]
        for drafter in (ModelDrafter(target), ModelDrafter(draft), NgramDrafter(), NoDrafter()):
            out = SpeculativeGenerator(target, drafter, num_speculative_tokens=4, max_new_tokens=20).generate(ids)
            assert out.tokens == expected and out.stats.finish_reason == "eos"
    finally:
        target.generation_config.eos_token_id = old


def _ending_prompt(target, tokenizer):
    """(ids, greedy tokens, i): a prompt whose greedy token i occurs there first, to end it at."""
    return next((ids, ref, i) for ids in (tokenizer(p).input_ids for p in PROMPTS)
                for ref in [reference(target, ids, 20)] for i in range(2, 12) if ref[i] not in ref[:i])


def _assert_engines_give(expected, target, draft, ids):
    """Batch 1 and batched, with every drafter: `expected`, 20 new tokens at most."""
    from specdec_core.batch_engine import BatchSpeculativeGenerator

    for drafter in drafters(target, draft).values():
        out = SpeculativeGenerator(target, drafter, num_speculative_tokens=4, max_new_tokens=20).generate(ids)
        assert out.tokens == expected
        engine = BatchSpeculativeGenerator(target, drafter, batch_size=2, num_speculative_tokens=4, max_new_tokens=20)
        assert [g.tokens for g in engine.generate_many([(ids, 0), (ids[:2], 0)])][0] == expected


@pytest.mark.parametrize("kind, field", [("gpt2", "min_new_tokens"), ("bart", "min_length")])
def test_a_minimum_length_in_the_generation_config_holds_the_end_back(kind, field, models, tokenizer):
    """A generation config's min_length (BART-large-CNN ships 56) or min_new_tokens keeps the end
    token out until then, as `generate()` does: at batch 1 and batched, with every drafter."""
    target, draft = models[kind]
    ids, ref, stop_at = _ending_prompt(target, tokenizer)
    gc = target.generation_config
    saved = gc.eos_token_id, getattr(gc, field)
    gc.eos_token_id = ref[stop_at]  # greedy would end there ...
    try:
        assert reference(target, ids, 20) == ref[: stop_at + 1]
        # ... but may not end before: a minimum of the decoder's tokens (min_length, the start
        # token included) or of new tokens
        setattr(gc, field, stop_at + 4 if field == "min_new_tokens" else stop_at + 5)
        expected = reference(target, ids, 20)
        assert len(expected) > stop_at + 1 and expected[: stop_at + 1] != ref[: stop_at + 1]
        _assert_engines_give(expected, target, draft, ids)
    finally:
        gc.eos_token_id, _ = saved
        setattr(gc, field, saved[1])


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_the_generation_configs_suppressed_tokens_are_never_emitted(kind, models, tokenizer):
    """A generation config's suppress_tokens (Whisper's, a padded vocabulary's extra rows) holding the token greedy
    emits first: `generate()` picks another, and so do the engines, at batch 1 and batched, with every drafter."""
    target, draft = models[kind]
    ids = tokenizer(PROMPTS[0]).input_ids
    first = reference(target, ids, 1)[0]
    gc = target.generation_config
    saved = gc.suppress_tokens
    gc.suppress_tokens = [first]
    try:
        expected = reference(target, ids, 20)
        assert first not in expected
        _assert_engines_give(expected, target, draft, ids)
    finally:
        gc.suppress_tokens = saved


def test_min_new_tokens_replaces_min_length_as_in_generate(models, tokenizer):
    """With both set, `generate()` takes min_new_tokens and drops min_length (it sets min_length
    to min_new_tokens plus the prompt): a summarizer's min_length must not hold the end back then."""
    target, draft = models["gpt2"]
    ids, ref, stop_at = _ending_prompt(target, tokenizer)
    gc = target.generation_config
    saved = gc.eos_token_id, gc.min_length, gc.min_new_tokens
    gc.eos_token_id, gc.min_length, gc.min_new_tokens = ref[stop_at], len(ids) + 30, 1
    try:
        expected = reference(target, ids, 20)
        assert expected == ref[: stop_at + 1]  # min_length alone would hold the end past 20 tokens
        _assert_engines_give(expected, target, draft, ids)
    finally:
        gc.eos_token_id, gc.min_length, gc.min_new_tokens = saved


def test_only_the_generation_configs_end_tokens_end_a_generation(models, tokenizer):
    """A model saved with a generation config without eos_token_id: `generate()` runs on past the
    model config's eos_token_id, and so do the engines."""
    from specdec_core.batch_engine import BatchSpeculativeGenerator

    target, draft = models["llama"]
    ids = tokenizer(PROMPTS[0]).input_ids
    ref = reference(target, ids, 12)
    saved = target.config.eos_token_id, target.generation_config.eos_token_id
    target.config.eos_token_id, target.generation_config.eos_token_id = ref[3], None
    try:
        expected = reference(target, ids, 12)
        assert len(expected) == 12 and ref[3] in expected[:4]
        out = SpeculativeGenerator(target, drafters(target, draft)["model"], num_speculative_tokens=4,
                                   max_new_tokens=12).generate(ids)
        assert out.tokens == expected
        engine = BatchSpeculativeGenerator(target, NoDrafter(), batch_size=2, max_new_tokens=12)
        assert [g.tokens for g in engine.generate_many([(ids, 0), (ids[:2], 0)])][0] == expected
    finally:
        target.config.eos_token_id, target.generation_config.eos_token_id = saved


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_engines_refuse_a_draft_with_more_output_rows_than_the_target(kind, models):
    """Built directly, not through the job's loading: a wider draft could propose a token the target
    cannot embed (it failed mid-generation, in the target's embedding)."""
    import copy

    from specdec_core.batch_engine import BatchSpeculativeGenerator
    from specdec_core.loading import IncompatiblePairError

    target, draft = models[kind]
    wide = copy.deepcopy(draft)
    wide.resize_token_embeddings(wide.config.vocab_size + 64)
    for build in (lambda d: SpeculativeGenerator(target, d, max_new_tokens=4),
                  lambda d: BatchSpeculativeGenerator(target, d, batch_size=2, max_new_tokens=4)):
        with pytest.raises(IncompatiblePairError, match=r"the draft's output layer has \d+ rows, the target's \d+"):
            build(ModelDrafter(wide))
    narrow = copy.deepcopy(draft)  # fewer rows, as Qwen2.5-0.5B's under 7B's: fine
    narrow.resize_token_embeddings(narrow.config.vocab_size - 8)
    SpeculativeGenerator(target, ModelDrafter(narrow), max_new_tokens=4)


def test_generation_config_settings_the_engines_do_not_apply_are_named():
    """Beam search and the rarer processors a generation config can ask for are named (the job
    logs them at load): the outputs are those of `generate()` without them."""
    from transformers import GenerationConfig

    from specdec_core.processing import unapplied

    assert unapplied(GenerationConfig()) == []
    assert unapplied(GenerationConfig(num_beams=4, no_repeat_ngram_size=3, min_length=56)) == ["num_beams=4"]
    assert unapplied(GenerationConfig(encoder_no_repeat_ngram_size=3, sequence_bias={(5,): 1.0})) == [
        "sequence_bias={(5,): 1.0}", "encoder_no_repeat_ngram_size=3"]
    assert unapplied(GenerationConfig(watermarking_config={"greenlist_ratio": 0.25}, stop_strings=["\n\n"])) == [
        "watermarking_config=WatermarkingConfig()", "stop_strings=['\\n\\n']"]


def test_caches_hold_all_committed_tokens_but_the_last(models, tokenizer, monkeypatch):
    """After every round both caches are rolled back to exactly the committed length - 1."""
    target, draft = models["llama"]
    lengths = []
    original = BatchKV.rollback

    def spy(self, b, length):
        original(self, b, length)
        lengths.append((self.length(b), self.cache.get_seq_length()))

    monkeypatch.setattr(BatchKV, "rollback", spy)
    ids = tokenizer(PROMPTS[0]).input_ids
    SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=4, max_new_tokens=30).generate(ids)
    assert lengths and all(ours == real for ours, real in lengths)


@pytest.mark.parametrize("kind", KINDS)
def test_block_logits_match_single_steps(kind, models, tokenizer):
    """One forward over k tokens on a cache gives the logits of k single steps (fp32)."""
    from specdec_core.decoder import initial_decoder_ids

    target, _ = models[kind]
    ids = tokenizer(PROMPTS[0]).input_ids
    seq = initial_decoder_ids(target, ids) + [5, 17, 42, 8]
    block = one_row(target, ids)
    feed_to(block, seq[:-4], 0) if len(seq) > 5 else None
    many = feed_to(block, seq, 4)
    steps = one_row(target, ids)
    singles = [feed_to(steps, seq[: len(seq) - 4 + j + 1], 1)[0] for j in range(4)]
    # Equal up to the rounding of two computation orders (tests/numerics.py says how much).
    assert_logits_close(many, torch.stack(singles))
    # The tolerance still catches a real bug: logits one position off differ by O(1) of their scale.
    with pytest.raises(AssertionError):
        assert_logits_close(many, torch.stack(singles).roll(1, 0))
    # Rolling back and recomputing gives the same logits as before.
    block.rollback(0, len(seq) - 2)
    assert_logits_close(feed_to(block, seq, 2), many[-2:])


class _NoDrafts(GammaPolicy):
    """A policy whose rounds never draft."""

    class _Zero(GammaState):
        def next(self) -> int:
            return 0

    def start(self, gamma: int) -> GammaState:
        return self._Zero()


def test_the_drafts_prompt_pass_is_counted_as_prefill(models, tokenizer, monkeypatch):
    """At batch 1 a model draft reads the prompt when it first drafts (lazily: an item that never
    drafts never pays it), in its first draft step's pass: the prompt and the first draft's logits
    in one pass, not a pass of no logits and then a one-token step. That pass is the draft's
    prefill: timed and counted in prefill_s, not draft_s (the batch engine counts its draft
    prefills there too)."""
    target, draft = models["llama"]
    ids = tokenizer(PROMPTS[0]).input_ids
    passes = []
    forward = BatchKV.forward

    def spy(self, feeds, logits=True, last=False):
        t0 = time.perf_counter()
        out = forward(self, feeds, logits, last)
        if self.model is draft:
            passes.append((len(feeds[0]), 0 if out is None else len(out[0][-1:]), time.perf_counter() - t0))
        return out
    engine = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=3, max_new_tokens=12)
    monkeypatch.setattr(BatchKV, "forward", spy)  # (after the engine's self-checks, which a first test runs)
    out = engine.generate(ids)
    assert out.tokens == reference(target, ids, 12)
    assert passes[0][:2] == (len(ids), 1)  # the whole prompt, the first draft's logits: one pass
    assert all(fed == 1 and logits == 1 for fed, logits, _ in passes[1:])  # then one token a step
    assert out.stats.prefill_s >= passes[0][2] and out.stats.draft_s >= 0
    assert out.stats.draft_steps == sum(out.stats.gammas) == len(passes)  # every pass a proposed token's

    passes.clear()  # an item whose gamma never drafts never reads its prompt in the draft
    never = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=3, max_new_tokens=12,
                                 gamma_policy=_NoDrafts()).generate(ids)
    assert never.tokens == out.tokens and passes == [] and never.stats.draft_steps == 0


def test_a_rejection_past_a_rows_end_is_not_counted(models):
    """`rejections` (the report's a = accepted / (accepted + rejections)) counts a round's rejected draft only
    where the row's text reaches it: a round cut at an end inside its accepted drafts counts their kept
    ones and no rejection, as `accepted_tokens` counts only the kept."""
    from specdec_core.gamma import fixed_gamma
    from specdec_core.processing import SamplingSettings
    from specdec_core.rows import Row

    target, _ = models["llama"]

    def commit(n: int, token: int, budget: int, eos: set[int]) -> tuple[int, int, list[int]]:
        row = Row.begin(target, [3, 4], 0, SamplingSettings(), budget, fixed_gamma.start(3))
        row.commit([5, 6, 7], n, token, None, budget, eos)
        return row.stats.accepted_tokens, row.stats.rejections, row.new

    assert commit(2, 9, 10, set()) == (2, 1, [5, 6, 9])  # the correction emitted: the rejection is in the text
    assert commit(2, 9, 10, {9}) == (2, 1, [5, 6, 9])  # ... ending the row there too
    assert commit(2, 9, 10, {5}) == (1, 0, [5])  # an EOS among the accepted drafts: the rejection lies past it
    assert commit(2, 9, 2, set()) == (2, 0, [5, 6])  # the budget ends at the accepted drafts
    assert commit(3, 9, 10, set()) == (3, 0, [5, 6, 7, 9])  # all accepted: no rejection
