"""The batch engine at fixed row slots (`SlotKV`, the CUDA-graph path of batches), run here eagerly
and through a stand-in for CUDA graphs: each row's logits are those of the row alone through
passes, rollbacks, refills, merges and drops; greedy rows equal `generate()`; sampled rows draw
what the padded cache draws; a busy cache falls back; models it cannot take are refused."""

import logging

import pytest
import torch

from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.batch_kv import BatchKV, feed_to, one_row
from specdec_core.drafters import ModelDrafter, NgramDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.gamma import AdaptiveGamma
from specdec_core.graphs import MAX_GRAPH_WIDTH, CaptureFailed, PassGraphs, prefill_width
from specdec_core.pass_settings import PassSettings
from specdec_core.plan import slot_kv_for
from specdec_core.processing import SamplingSettings
from specdec_core.slot_kv import SlotKV
from tests.family_models import WINDOW_FAMILIES
from tests.graph_stand_in import trace
from tests.numerics import assert_logits_close, logit_tolerance
from tests.test_batch_engine import TEXTS, check_a_round, drafter_for, hf_greedy


@pytest.fixture
def fake_graphs(monkeypatch):
    monkeypatch.setattr(PassGraphs, "_record", trace)


def graphed(kv, on: bool):
    if kv is not None:
        kv.passes.on = on
    return kv


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(t)["input_ids"] for t in TEXTS]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_row_logits_in_slots_equal_the_row_alone(models, prompts, kind, graphs, fake_graphs, monkeypatch):
    monkeypatch.setattr("specdec_core.graphs.CAPACITY_STEP", 8)  # the buffers grow several times below
    target, _ = models[kind]
    rows = [list(prompts[i]) for i in (0, 2, 4)]
    kv = SlotKV(target, 4, graphs=graphs)
    assert kv.acquire()
    fresh = BatchKV(target, len(rows))
    fresh.forward([r[:-1] for r in rows], logits=False)
    kv.merge(fresh)
    gen = torch.Generator().manual_seed(0)
    for step in range(5):
        check_a_round(kv, target, rows, gen, idle=1 if step == 1 else None)
        if step == 0:  # a finished row's slot refilled with a prompt longer than any row
            long = prompts[4] + prompts[6]
            new = BatchKV(target, 1)
            new.forward([long[:-1]], logits=False)
            kv.place([1], new)
            rows[1] = list(long)
        if step == 1:  # a row merged into the free slot, then an old row leaving: nothing moves
            new = BatchKV(target, 1)
            new.forward([prompts[5][:-1]], logits=False)
            kv.merge(new)
            rows.append(list(prompts[5]))
            buffer = kv.cache.layers[0].keys.data_ptr()
            order = kv.drop([1])
            assert order == [0, 3, 2] and kv.slot_of == [0, 3, 2]  # BatchKV's order; row 3 stays in slot 3
            assert kv.cache.layers[0].keys.data_ptr() == buffer
            rows = [rows[i] for i in order]
    assert kv.capacity % 8 == 0 and kv.capacity >= max(len(r) for r in rows)
    if graphs:  # one graph per pass width, replayed (captured again after each growth)
        assert kv.passes.captures >= len(kv.passes.kept) > 0 and all(g.graph.replays for g in kv.passes.kept.values())
    kv.release()


def test_rows_prefilled_together_enter_their_slots_in_one_write_per_buffer(models, prompts):
    """Rows prefilled in one padded pass reach their slots in a fixed number of tensor writes,
    however many rows there are (row by row, 2 x layers x rows indexing ops: host time a GPU waits
    on when a wide batch admits many rows), and each slot holds its row's keys and values."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Writes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func._schema.is_mutable
            return func(*args, **(kwargs or {}))

    target, _ = models["llama"]
    counts = []
    for n in (2, 6):
        rows = [list(prompts[i % len(prompts)]) for i in range(n)]
        fresh = BatchKV(target, n)
        fresh.forward([r[:-1] for r in rows], logits=False)
        kv = SlotKV(target, 8, graphs=False)
        kv.merge(BatchKV(target, 1))  # slot 0 taken: the rows go to slots 1..n
        with Writes() as writes:
            kv.merge(fresh)
        counts.append(writes.count)
        assert kv.slot_of == list(range(n + 1)) and kv.lengths[1:n + 1] == [len(r) - 1 for r in rows]
        for layer, (fk, fv) in zip(kv.own_layers, fresh._layers(), strict=True):
            for j, r in enumerate(rows):
                m = len(r) - 1
                assert torch.equal(layer.keys[j + 1, :, :m], fk[j, :, :m])
                assert torch.equal(layer.values[j + 1, :, :m], fv[j, :, :m])
    assert counts[0] == counts[1]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("drafter", ["model", "ngram", "none"])
def test_greedy_rows_in_slots_equal_generate(models, prompts, kind, drafter, graphs, fake_graphs):
    target, draft = models[kind]
    n = 14
    eos = hf_greedy(target, prompts[0], n)[5]  # an end that some rows reach mid-output
    saved = target.generation_config.eos_token_id
    target.generation_config.eos_token_id = eos
    try:
        engine = BatchSpeculativeGenerator(target, drafter_for(drafter, draft), batch_size=3,
                                           num_speculative_tokens=3, max_new_tokens=n, cuda_graphs="on")
        kvs = [graphed(kv, graphs) for kv in engine.slots.values()]
        assert all(isinstance(kv, SlotKV) for kv in kvs) and len(kvs) == (2 if drafter == "model" else 1)
        reference = [hf_greedy(target, p, n) for p in prompts]
        first = engine.generate_many([(p, 0) for p in prompts])
        captured = [kv.passes.captures for kv in kvs]
        again = engine.generate_many([(p, 0) for p in prompts])  # slots reused, emptied: same rounds
        recaptured = [kv.passes.captures for kv in kvs]
        fewer = engine.generate_many([(p, 0) for p in prompts[:2]])  # free slots pad along
    finally:
        target.generation_config.eos_token_id = saved
    assert [o.tokens for o in first] == reference
    assert [o.tokens for o in again] == reference
    assert [o.tokens for o in fewer] == reference[:2]
    assert {o.stats.finish_reason for o in first} == {"eos", "length"}
    if graphs:  # each width captured once for the worker, not again per call
        assert all(c > 0 for c in captured) and recaptured == captured


def test_adaptive_costs_and_gammas_in_slots_keep_greedy_exact(models, prompts, fake_graphs):
    """The engine times its passes on the slots and rolls them back; rows draft the batch's gammas."""
    target, draft = models["llama"]
    policy = AdaptiveGamma(max_gamma=3)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=4, num_speculative_tokens=3,
                                       max_new_tokens=10, gamma_policy=policy, cuda_graphs="on")
    for kv in engine.slots.values():
        graphed(kv, True)
    out = engine.generate_many([(p, 0) for p in prompts])
    assert policy.costs is not None and engine._costs_width == 4
    assert [o.tokens for o in out] == [hf_greedy(target, p, 10) for p in prompts]


def test_adaptive_costs_time_the_draft_steps_chained_as_rounds_run_them(models, prompts, fake_graphs,
                                                                         monkeypatch):
    """With a chaining drafter the costs time the draft as its rounds run it, every step in one
    replay read back once (step by step, each step's picks read back, a GPU would wait for the
    host gamma times a round and the policy would think the draft dearer than it is)."""
    target, draft = models["llama"]
    measuring, calls = [False], []
    measure = BatchSpeculativeGenerator._measure_costs

    def measured(self, *args):
        measuring[0] = True
        try:
            measure(self, *args)
        finally:
            measuring[0] = False

    chain, step = SlotKV.draft_greedy, SlotKV.forward
    monkeypatch.setattr(BatchSpeculativeGenerator, "_measure_costs", measured)
    monkeypatch.setattr(SlotKV, "draft_greedy", lambda kv, feeds, k: (measuring[0] and calls.append(("chained", k)))
                        or chain(kv, feeds, k))
    monkeypatch.setattr(SlotKV, "forward", lambda kv, feeds, *a, **kw: (
        measuring[0] and kv.model is draft and calls.append(("step", 1))) or step(kv, feeds, *a, **kw))
    policy = AdaptiveGamma(max_gamma=3)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, chain=True), batch_size=4, num_speculative_tokens=3,
                                       max_new_tokens=10, gamma_policy=policy, cuda_graphs="on")
    for kv in engine.slots.values():
        graphed(kv, True)
    out = engine.generate_many([(p, 0) for p in prompts])
    assert policy.costs is not None and 0 < policy.costs.c
    assert calls and set(calls) == {("chained", 3)}
    assert [o.tokens for o in out] == [hf_greedy(target, p, 10) for p in prompts]


def test_sampled_rows_in_slots_draw_what_the_padded_cache_draws(models, prompts):
    """Each row's seed gives the same sample with either cache (that one is its batch-1 sample)."""
    target, draft = models["llama"]
    sampling = SamplingSettings(temperature=1.0, top_k=20)
    items = [(p, 100 + i) for i, p in enumerate(prompts)]
    outs = []
    for mode in ("on", "off"):
        engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=4, num_speculative_tokens=3,
                                           max_new_tokens=10, sampling=sampling, cuda_graphs=mode)
        outs.append([o.tokens for o in engine.generate_many(items)])
    assert outs[0] == outs[1]


def test_busy_slots_fall_back_to_a_padded_cache(models, prompts):
    target, draft = models["llama"]
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, num_speculative_tokens=3,
                                       max_new_tokens=8, cuda_graphs="on")
    held = engine.slots[id(target)]
    assert held.acquire()  # another call (thread) holds the target's slots
    try:
        out = engine.generate_many([(p, 0) for p in prompts[:4]])
        assert held.rows == 0 and held.capacity == 0  # untouched
    finally:
        held.release()
    assert [o.tokens for o in out] == [hf_greedy(target, p, 8) for p in prompts[:4]]
    assert engine.slots[id(draft)].acquire(), "the call gave the draft's slots back"


def test_models_slots_cannot_take(models):

    target, _ = models["t5"]
    assert slot_kv_for(target, "auto", 4) is None and slot_kv_for(models["llama"][0], "auto", 4) is None  # no CUDA
    assert slot_kv_for(models["llama"][0], "off", 4) is None
    ntk = models["llama"][0].config.__class__.from_dict(models["llama"][0].config.to_dict())
    ntk.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="cuda_graphs on: LlamaForCausalLM uses dynamic-NTK RoPE"):
        BatchSpeculativeGenerator(type(models["llama"][0])(ntk), NoDrafter(), batch_size=2, cuda_graphs="on")
    with pytest.raises(ValueError, match="cuda_graphs must be one of"):
        slot_kv_for(target, "yes", 4)
    kv = SlotKV(models["llama"][0], 2)
    kv.acquire()
    fresh = BatchKV(models["llama"][0], 3)
    with pytest.raises(ValueError, match="3 rows do not fit 2 slots"):
        kv.merge(fresh)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "gpt2", "t5", "bart"])
def test_batch_one_through_graph_replays_equals_generate(models, prompts, kind, fake_graphs):
    """The batch-1 engine's static decoders (target passes, draft steps, chained draft rounds)
    through graph replays; an encoder-decoder's encoder mask and cross-attention buffers are
    rewritten in place for each item."""
    target, draft = models[kind]
    reference = [hf_greedy(target, p, 16) for p in prompts]
    for chain in (False, True):
        drafter = ModelDrafter(draft, cuda_graphs="on", chain=chain)
        gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=3, max_new_tokens=16, cuda_graphs="on")
        gen.static.passes.on = drafter.static.passes.on = True
        assert [gen.generate(p).tokens for p in prompts] == reference
        assert gen.static.passes.captures and drafter.static.passes.captures
        if target.config.is_encoder_decoder:  # each prompt's encoder pass was a graph's replay
            assert not gen.static.passes.uncaptured and any(key[0] == "encode" for key in gen.static.passes.kept
                                                     if isinstance(key, tuple))
        if chain and kind != "bart":  # (BART's forced end token is a logits processor: per-step picks)
            assert any(isinstance(key, tuple) for key in drafter.static.passes.kept)  # the chained rounds were graphs
    gen = SpeculativeGenerator(target, NgramDrafter(), num_speculative_tokens=3, max_new_tokens=16, cuda_graphs="on")
    gen.static.passes.on = True
    assert [gen.generate(p).tokens for p in prompts] == reference


@pytest.mark.slow
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_chained_draft_rounds_equal_step_by_step_drafting(models, prompts, kind, graphs, fake_graphs):
    """A round's greedy draft steps chained on the device for every row: the same drafts, rounds
    and acceptance as step by step, through rows that finish, refills and budgets that cut a
    round short; a draft's end token ends its row's drafts."""
    target, draft = models[kind]
    n = 15
    outs = {}
    for chain in (False, True):
        engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, chain=chain), batch_size=3,
                                           num_speculative_tokens=4, max_new_tokens=n, cuda_graphs="on")
        for kv in engine.slots.values():
            graphed(kv, graphs)
        outs[chain] = engine.generate_many([(p, 0) for p in prompts])
        chained = [key for key in engine.slots[id(draft)].passes.kept if isinstance(key, tuple)]
        assert bool(chained) == (chain and graphs)
    for a, b, p in zip(outs[False], outs[True], prompts, strict=True):
        assert a.tokens == b.tokens == hf_greedy(target, p, n)
        assert (a.stats.drafts, a.stats.draft_steps, a.stats.accepted_tokens, a.stats.verify_steps) == \
            (b.stats.drafts, b.stats.draft_steps, b.stats.accepted_tokens, b.stats.verify_steps)
        assert b.stats.draft_steps > 0  # (chained steps are the draft's passes too: the report's c)

    import copy

    plain = hf_greedy(target, prompts[0], 8)
    model = copy.deepcopy(target)  # the draft is the target itself, so every draft is accepted ...
    model.generation_config.eos_token_id = plain[2]  # ... and its third token now ends the text
    engine = BatchSpeculativeGenerator(model, ModelDrafter(model, chain=True), batch_size=2, num_speculative_tokens=6,
                                       max_new_tokens=8, cuda_graphs="on")
    [row, _] = engine.generate_many([(prompts[0], 0), (prompts[1], 0)])
    assert row.tokens == plain[:3] and row.stats.draft_tokens == 3


def test_a_slot_left_free_holds_no_columns(models, tokenizer):
    """A row that leaves frees its slot's columns: passes are as wide as the longest row still in the batch."""
    target, _ = models["llama"]
    rows = [tokenizer(t).input_ids for t in ("Hi", "Summarize: the committee met on Tuesday and voted")]
    kv = SlotKV(target, 2, graphs=False)
    assert kv.acquire()
    fresh = BatchKV(target, 2)
    fresh.forward([r[:-1] for r in rows], logits=False)
    kv.merge(fresh)
    assert kv.width == len(rows[1]) - 1
    kv.drop([1])
    assert kv.width == kv.length(0) == len(rows[0]) - 1
    kv.release()


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_a_chained_round_leaves_rows_that_feed_nothing_intact(models, prompts, graphs, fake_graphs):
    """A row that drafts nothing this round (a probe leaves it out) keeps its tokens: the chain's
    steps write past its length, never over it."""
    target, _ = models["llama"]
    kv = SlotKV(target, 3, graphs=graphs)
    assert kv.acquire()
    rows = [prompts[0], prompts[4], prompts[2]]
    fresh = BatchKV(target, 3)
    fresh.forward([r[:-1] for r in rows], logits=False)
    kv.merge(fresh)
    picks = kv.draft_greedy([[rows[0][-1]], [], [rows[2][-1]]], 3)
    assert [picks[0], picks[2]] == [hf_greedy(target, rows[0], 3), hf_greedy(target, rows[2], 3)]
    assert [kv.length(b) for b in range(3)] == [len(rows[0]) + 2, len(rows[1]) - 1, len(rows[2]) + 2]
    logits = kv.forward([[], [rows[1][-1]], []])
    assert_logits_close(logits[1], feed_to(one_row(target, rows[1]), rows[1], 1))
    kv.release()


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_a_chained_draft_picks_what_single_steps_pick(models, prompts, kind, graphs, fake_graphs):
    """Batch 1: `draft_greedy`'s k chained steps, each fed the last pick one position on, pick what k one-token
    passes and an argmax each pick, and what `generate()` picks: T5 too, whose positions have no limit to clamp to."""
    from specdec_core.decoder import initial_decoder_ids

    target, _ = models[kind]
    prompt, k = prompts[0], 5
    chained, stepwise = SlotKV(target, 1, graphs=graphs), SlotKV(target, 1, graphs=False)
    for kv in (chained, stepwise):
        assert kv.acquire()
        kv.start(prompt)
    seq = initial_decoder_ids(target, prompt)
    picks = chained.draft_greedy([seq], k)[0]
    for _ in range(k):
        seq.append(int(stepwise.forward([seq[stepwise.length(0):]], last=True)[0, -1].argmax()))
    assert picks == seq[-k:] == hf_greedy(target, prompt, k)
    chained.release()
    stepwise.release()


@pytest.mark.slow
@pytest.mark.parametrize(("family", "graphs"), [(f, True) for f in WINDOW_FAMILIES] + [
    (f, False) for f in ("gemma3n", "gemma4")])  # (eagerly, rows enter through a padded prefill's copy)
def test_sliding_window_families_in_slots_equal_generate(family, graphs, fake_graphs):
    """Families with their own special tokens and end rules (Phi-3, Gemma: several end ids) and
    a sliding window (6 tokens) that every row passes, all layers' (Mistral, Phi-3, StarCoder2)
    or every other one's (Gemma 2/3/3n/4, GPT-OSS with its attention sinks; Gemma 3n's and 4's
    last layers reuse earlier layers' keys and values, which no cache holds), eagerly and through
    graph replays: rows enter slots together through the prefills' graphs or in a padded
    prefill, and each slot's mask hides what its row's window leaves."""
    from tests.family_models import V, family_model

    target, draft = family_model(family, seed=1), family_model(family, seed=2)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, V - 6, (n,), generator=g).tolist() for n in (5, 9, 3, 12, 7)]
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, chain=True), batch_size=3, num_speculative_tokens=3,
                                       max_new_tokens=10, cuda_graphs="on")
    for kv in engine.slots.values():
        graphed(kv, graphs)
    out = engine.generate_many([(p, 0) for p in prompts])
    assert [o.tokens for o in out] == [hf_greedy(target, p, 10) for p in prompts]
    kv = engine.slots[id(target)]
    assert kv.window == 6
    if graphs:
        assert kv._prefiller.passes.captures > 0 and not kv._prefiller.passes.uncaptured


@pytest.mark.slow
def test_a_multimodal_gemma3_keeps_its_window_in_its_text_config(fake_graphs):
    """Gemma 3's larger checkpoints load with a vision tower, their window and layer types in the
    text config: read there, the window is kept at batch 1 (static cache, graphs), in slots and
    in the padded batch; read from the top config it was lost (full attention, other tokens)."""
    from tests.family_models import WINDOW, V, multimodal_gemma3
    from tests.test_batch_families import hf_greedy as hf_greedy_family

    target, draft = multimodal_gemma3(seed=1), multimodal_gemma3(seed=2)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, V - 6, (n,), generator=g).tolist() for n in (5, 12, 3, 9)]
    refs = [hf_greedy_family(target, p, 12) for p in prompts]
    single = SpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs="on"), num_speculative_tokens=3,
                                  max_new_tokens=12, cuda_graphs="on")
    graphed(single.static, True)
    assert single.static.window == WINDOW and single.static.layer_types == ["sliding_attention", "full_attention"]
    assert [single.generate(p).tokens for p in prompts] == refs and single.static.passes.captures > 0
    for graphs in ("on", "off"):
        engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, chain=True), batch_size=3,
                                           num_speculative_tokens=3, max_new_tokens=12, cuda_graphs=graphs)
        for kv in engine.slots.values():
            graphed(kv, True)
        assert [o.tokens for o in engine.generate_many([(p, 0) for p in prompts])] == refs, graphs


def test_a_pass_that_cannot_be_captured_runs_eagerly_unless_graphs_are_insisted_on(models, prompts, monkeypatch,
                                                                                   caplog):
    def refuse(self, run, static):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(PassGraphs, "_record", refuse)
    target, draft = models["llama"]
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, num_speculative_tokens=3,
                                       max_new_tokens=8, cuda_graphs="on")
    kv = engine.slots[id(target)]
    kv.passes.on, kv.passes.strict = True, False  # as "auto" makes it on a GPU
    with caplog.at_level("WARNING"):
        out = engine.generate_many([(p, 0) for p in prompts])
    assert [o.tokens for o in out] == [hf_greedy(target, p, 8) for p in prompts]
    assert not kv.passes.on and "no CUDA graph of a 4-token pass over 3 slots (RuntimeError" in caplog.text
    kv.passes.on, kv.passes.strict = True, True  # "on": the row fails, saying which flag insists
    said = (r"^--cuda_graphs on: a 4-token pass over 3 slots of LlamaForCausalLM cannot be captured as a CUDA graph "
            r"\(RuntimeError: operation not permitted when stream is capturing\); --cuda_graphs auto")
    with pytest.raises(CaptureFailed, match=said):
        engine.generate_many([(prompts[0], 0)])


def test_a_capture_that_recorded_nothing_is_caught_by_its_check_replay(models, prompts, monkeypatch, caplog):
    """A capture whose work ran eagerly instead of being recorded (a graph that replays nothing):
    its first replay leaves the output it was given, so the check replay differs and the model
    decodes eagerly, exactly."""
    class Empty:
        def replay(self):
            pass

    monkeypatch.setattr(PassGraphs, "_record", lambda self, run, static: (Empty(), run(static)))
    target, _ = models["gpt2"]
    gen = SpeculativeGenerator(target, NoDrafter(), max_new_tokens=8, cuda_graphs="on")
    gen.static.passes.on, gen.static.passes.strict = True, False
    with caplog.at_level("WARNING"):
        assert gen.generate(prompts[0]).tokens == hf_greedy(target, prompts[0], 8)
    assert not gen.static.passes.on and "differs from the pass run eagerly" in caplog.text




def test_a_prefill_that_cannot_be_captured_leaves_the_decode_graphs(models, prompts, monkeypatch, caplog):
    """A prompt's prefill graph that fails to capture (out of memory for a long prompt, say) turns
    off prefill graphs only, even with graphs insisted on: prompts prefill eagerly, decode passes
    keep their graphs, at batch 1 and in slots (whose rows then enter through a padded cache)."""
    def record(self, run, static):
        if static.shape[1] - 2 > MAX_GRAPH_WIDTH:  # the prefills of these prompts
            raise torch.OutOfMemoryError("CUDA out of memory (a stand-in)")
        return trace(self, run, static)

    monkeypatch.setattr(PassGraphs, "_record", record)
    target, _ = models["llama"]
    items = [prompts[4], prompts[5], prompts[0]]
    refs = [hf_greedy(target, p, 8) for p in items]
    gen = SpeculativeGenerator(target, NoDrafter(), max_new_tokens=8, cuda_graphs="on")
    gen.static.passes.on = True
    assert gen.static.passes.strict
    with caplog.at_level("WARNING"):
        assert [gen.generate(p).tokens for p in items] == refs
    assert gen.static.passes.on and gen.static.passes.uncaptured == {"prefill"} and gen.static.passes.captures > 0
    assert "no CUDA graph of a 64-token prefill (OutOfMemoryError" in caplog.text
    engine = BatchSpeculativeGenerator(target, NoDrafter(), batch_size=2, max_new_tokens=8, cuda_graphs="on")
    kv = graphed(engine.slots[id(target)], True)
    assert [o.tokens for o in engine.generate_many([(p, 0) for p in items])] == refs
    assert kv.passes.on and kv.passes.captures > 0 and not kv.prefills_in_graphs
    assert kv._prefiller.passes.uncaptured == {"prefill"}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["t5", "mt5", "umt5", "bart", "pegasus", "marian", "m2m100", "mbart", "led", "mvp"])
def test_encoder_decoder_rows_in_slots_equal_generate(family, fake_graphs):
    """Encoder-decoder rows at their own positions in one pass: each row's cross-attention in its
    slot, its position embeddings looked up at its own positions (learned, sinusoidal; M2M100/NLLB's
    counted from the ids) or its relative biases from its own distances (T5: first layer; UMT5:
    every layer), rows finishing and refilled; LED's one-token passes widened to two (its encoder,
    which fails under the static caches' 4D mask, eager by the plan)."""
    from tests.family_models import V, family_model
    from tests.test_batch_families import hf_greedy as hf_greedy_seq2seq

    target, draft = family_model(family, seed=1), family_model(family, seed=2)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, V - 6, (n,), generator=g).tolist() for n in (5, 12, 3, 9, 7)]
    reference = [hf_greedy_seq2seq(target, p, 12) for p in prompts]
    for graphs in (False, True):  # (one pair, its reference and self-checks, for both)
        for drafter in (ModelDrafter(draft), NoDrafter()):
            engine = BatchSpeculativeGenerator(target, drafter, batch_size=3, num_speculative_tokens=3,
                                               max_new_tokens=12, cuda_graphs="on")
            for kv in engine.slots.values():
                assert isinstance(kv, SlotKV)
                graphed(kv, graphs)
            out = engine.generate_many([(p, 0) for p in prompts])
            assert [o.tokens for o in out] == reference, (family, type(drafter).__name__, graphs)
            assert (engine.slots[id(target)].passes.captures > 0) == graphs
            for kv in engine.slots.values():  # with graphs, rows entered through their encoder's graphs
                pre = kv._prefiller
                assert (pre is not None and not pre.passes.uncaptured and pre.passes.captures > 0) == graphs, family
                assert (pre is not None and pre.passes.prompt_graphs("encode")) == (graphs and family != "led")
                assert kv.min_width == (2 if family == "led" else 1)


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_encoder_decoder_rows_enter_slots_together_through_graphs(family, fake_graphs, monkeypatch):
    """With graphs, new rows' encoder pass and cross-attention keys/values replay a graph per
    padded prompt width and row count, the rows admitted together in one pass (no padded cache is
    made), BART's width kept within its position table; a draft sharing the target's encoder
    replays only the cross-attention of the target's outputs, or runs its own encoder where it
    prefills another way (its slots busy)."""
    from specdec_core.loading import share_encoder
    from tests.family_models import V, family_model
    from tests.test_batch_families import hf_greedy as hf_greedy_seq2seq
    from tests.test_shared_encoder import same_encoder_draft

    table = {"max_position_embeddings": 100} if family == "bart" else {}  # (BART's holds 128; T5's are relative)
    target = family_model(family, seed=1, **table)
    draft = same_encoder_draft(target)
    assert share_encoder(target, draft)
    g = torch.Generator().manual_seed(5)
    lengths = (5, 12, 70, 3, 9, 33)
    prompts = [torch.randint(3, V - 6, (n,), generator=g).tolist() for n in lengths]
    widths = {8, 16, 4, 64} | ({100} if family == "bart" else {128})  # 70 tokens: 128 past BART's 100 positions
    reference = [hf_greedy_seq2seq(target, p, 10) for p in prompts]

    def no_padded_cache(*args, **kwargs):
        raise AssertionError("a padded cache encoded rows")

    # (built first: its self-checks at load run a padded batch of their own)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, num_speculative_tokens=3,
                                       max_new_tokens=10, cuda_graphs="on")
    admissions = []
    encode_rows = SlotKV.encode_rows
    with monkeypatch.context() as patch:
        patch.setattr(BatchKV, "encode", no_padded_cache)
        patch.setattr(SlotKV, "encode_rows", lambda self, p, *a: admissions.append((self, len(p)))
                      or encode_rows(self, p, *a))
        tkv, dkv = (graphed(engine.slots[id(m)], True) for m in (target, draft))
        assert [o.tokens for o in engine.generate_many([(p, 0) for p in prompts])] == reference
    target_rows = [n for who, n in admissions if who is tkv._prefiller]
    assert target_rows[0] == 3 and sum(target_rows) == len(prompts)  # the first three in one pass
    kept = tkv._prefiller.passes.kept
    assert {key[0] for key in kept} == {"encode", "cross"} and {key[1] for key in kept} <= widths
    assert ("encode", max(widths), 3) in kept  # three rows, BART's width within its table
    assert {key[0] for key in dkv._prefiller.passes.kept} == {"cross"}  # the draft never ran its encoder
    assert tkv.prefills_in_graphs and dkv.prefills_in_graphs
    assert dkv.acquire()  # another call holds the draft's slots: it prefills a padded cache, encoding itself
    try:
        assert [o.tokens for o in engine.generate_many([(p, 0) for p in prompts])] == reference
    finally:
        dkv.release()


def test_encoder_outputs_of_a_growing_cache_are_not_captured_per_length(models, prompts, fake_graphs):
    """A draft given another decoder's encoder outputs at the prompt's own length (the target's
    growing cache, when its static decoder is busy) takes them eagerly: graphs are per padded
    width, never one per prompt length. Its logits are those of the draft alone."""
    target, _ = models["t5"]
    prompt = prompts[1]
    assert len(prompt) not in {4, 8, 16, 32, 64}
    alone = one_row(target, prompt)
    decoder = SlotKV(target, 1, graphs=True)
    assert decoder.acquire()
    decoder.start(prompt, alone.encoded)
    assert not decoder.passes.kept
    start = [target.config.decoder_start_token_id]
    reference = feed_to(alone, start, 1)
    assert_logits_close(feed_to(decoder, start, 1), reference)
    decoder.release()
    assert decoder.acquire()
    decoder.start(prompt)  # its own encoder: padded, a graph
    assert {key for key in decoder.passes.kept if isinstance(key, tuple)} == {("encode", 32), ("cross", 32)}
    assert decoder.encoded["encoder_outputs"].last_hidden_state.shape[1] == 32
    assert_logits_close(feed_to(decoder, start, 1), reference)
    decoder.release()


def test_an_encoder_that_cannot_be_captured_runs_eagerly_under_the_cross_attention_graphs(monkeypatch, caplog):
    """BART's encoder in float16 checks its outputs on the host, which a graph cannot capture: the
    encoder then runs eagerly over the padded prompt, the cross-attention pass keeps its graphs,
    and rows still enter slots one by one, exactly (a refused encoder capture, in float32)."""
    from tests.family_models import V, family_model
    from tests.test_batch_families import hf_greedy as hf_greedy_seq2seq

    monkeypatch.setattr(PassGraphs, "_record", trace)
    half = family_model("bart", seed=1).to(torch.float16)
    decoder = SlotKV(half, 1, graphs=True)
    assert decoder.acquire()
    prompt = list(range(3, 14))
    with caplog.at_level("WARNING"):
        decoder.start(prompt)
    assert decoder.passes.uncaptured == {"encode"} and set(decoder.passes.kept) == {("cross", 16)}
    assert "no CUDA graph of the encoder over 16 tokens" in caplog.text
    start = [half.config.decoder_start_token_id]
    expected = feed_to(one_row(half, prompt), start, 1)  # (float32 logits of a float16 model)
    torch.testing.assert_close(feed_to(decoder, start, 1), expected, rtol=0.0,
                               atol=logit_tolerance(expected.to(torch.float16)))
    decoder.release()

    original = PassGraphs._record

    def no_encoder(self, run, static):
        if getattr(run, "__name__", "") == "_encoder":
            raise RuntimeError("operation not permitted when stream is capturing (a stand-in)")
        return original(self, run, static)

    monkeypatch.setattr(PassGraphs, "_record", no_encoder)
    target, draft = family_model("bart", seed=1), family_model("bart", seed=2)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, V - 6, (n,), generator=g).tolist() for n in (5, 12, 3, 9)]
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=2, num_speculative_tokens=3,
                                       max_new_tokens=10, cuda_graphs="on")
    kvs = [graphed(kv, True) for kv in engine.slots.values()]
    assert [o.tokens for o in engine.generate_many([(p, 0) for p in prompts])] == \
        [hf_greedy_seq2seq(target, p, 10) for p in prompts]
    for kv in kvs:
        assert kv.prefills_in_graphs and kv._prefiller.passes.uncaptured == {"encode"}
        assert {key[0] for key in kv._prefiller.passes.kept if isinstance(key, tuple)} == {"cross"}


def test_position_hooks_hold_the_model_and_leave_it_as_it_was(models):
    """An encoder-decoder's per-row position hooks change the model for every caller: one hooked
    pass of a model at a time (another thread waits), and after a pass that fails the model has
    its own `compute_bias` again."""
    import threading

    from specdec_core.decoder import decoder_position_modules, hooked

    target, _ = models["t5"]
    biases = decoder_position_modules(target)[1]
    assert biases
    patch = {m: (lambda *a, **k: None) for m in biases}
    entered = threading.Event()

    def other():
        with hooked(target, patch, {}):
            entered.set()

    with hooked(target, patch, {}):
        assert all(vars(m)["compute_bias"] is patch[m] for m in biases)
        thread = threading.Thread(target=other)
        thread.start()
        assert not entered.wait(0.5)  # held: it waits for this pass
    thread.join()
    assert entered.is_set()
    with pytest.raises(RuntimeError, match="a pass failed"), hooked(target, patch, {}):
        raise RuntimeError("a pass failed")
    assert all("compute_bias" not in vars(m) for m in biases)


def test_time_limits_do_not_count_capturing_and_compiling(models, prompts, fake_graphs, monkeypatch):
    """A first item that pays for new graphs (and compiles) is not timed out for it, at batch 1
    and in slots: here every capture takes 100 s of a fake clock, and the limit is 50 s."""
    import time

    from specdec_core.rows import ItemTimeout

    now = [0.0]

    def clock() -> float:
        now[0] += 1e-6
        return now[0]

    original = PassGraphs._capture

    def slow_capture(self, run, inp):
        now[0] += 100.0
        return original(self, run, inp)

    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(PassGraphs, "_capture", slow_capture)
    target, draft = models["llama"]
    drafter = ModelDrafter(draft, cuda_graphs="on")
    single = SpeculativeGenerator(target, drafter, num_speculative_tokens=3, max_new_tokens=8, cuda_graphs="on")
    batch = BatchSpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs="on"), batch_size=2,
                                      num_speculative_tokens=3, max_new_tokens=8, cuda_graphs="on")
    for kv in (single.static, drafter.static, *batch.slots.values()):
        kv.passes.on = True
    out = single.generate(prompts[0], max_seconds=50)
    assert out.tokens == hf_greedy(target, prompts[0], 8) and out.stats.latency_s > 100  # its wall time
    assert single.static.passes.capture_s >= 100  # it did capture
    rows = batch.generate_many([(p, 0) for p in prompts[:3]], max_seconds=50)
    assert [o.tokens for o in rows] == [hf_greedy(target, p, 8) for p in prompts[:3]]
    assert batch.slots[id(target)].passes.capture_s >= 100
    opened = drafter.open

    def slow_open(*args):  # an item whose own work takes 100 s: that still counts
        now[0] += 100.0
        return opened(*args)

    monkeypatch.setattr(drafter, "open", slow_open)
    with pytest.raises(ItemTimeout):
        single.generate(prompts[1], max_seconds=50)


def test_prefill_widths():
    """A graphed prefill pads to a power of two up to 512 tokens, then to a multiple of 512."""
    assert [prefill_width(n) for n in (1, 2, 5, 16, 17, 300, 512, 513, 1100, 4096)] == \
        [1, 2, 8, 16, 32, 512, 512, 1024, 1536, 4096]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_prefills_replay_one_graph_per_padded_width(models, prompts, kind, fake_graphs):
    """With graphs, a prompt's prefill (and the part of a wide feed before the positions whose
    logits are asked for) runs padded to its width's graph; prompts of other lengths in the same
    width replay it; the logits after it are those of a growing cache; the pads leave no trace."""
    target, _ = models[kind]
    static = SlotKV(target, 1, graphs=True)
    g = torch.Generator().manual_seed(0)
    for ids in (prompts[5], prompts[6], prompts[1]):  # 24, 27 and 17 tokens before the newest: all pad to 32
        assert static.acquire()
        static.start(ids)
        feed_to(static, ids[:-1], 0)
        dynamic = one_row(target, ids)
        feed_to(dynamic, ids[:-1], 0)
        extra = torch.randint(5, 300, (3,), generator=g).tolist()
        assert_logits_close(feed_to(static, ids + extra, 4), feed_to(dynamic, ids + extra, 4))
        static.release()
    assert static.passes.kept["prefill", 32].graph.replays == 1 + 3  # its check
    captured = static.passes.captures
    # A wide feed whose last logits are asked for (a draft's first step): its head is a prefill.
    long = prompts[4] + prompts[6]
    assert static.acquire()
    static.start(long)
    assert_logits_close(feed_to(static, long, 1), feed_to(one_row(target, long), long, 1))
    assert static.length(0) == len(long) and ("prefill", 128) in static.passes.kept
    static.rollback(0, 0)
    assert static.draft_greedy([prompts[5]], 3) == [hf_greedy(target, prompts[5], 3)]
    static.release()
    assert static.passes.captures == captured + 3  # the 128-token prefill, a 1-token pass, a chain after 1 token


@pytest.mark.parametrize("graph_prefills", [True, False], ids=["prefill-graphs", "padded-prefills"])
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_rows_admitted_together_prefill_through_graphs(models, prompts, kind, graph_prefills, fake_graphs,
                                                       monkeypatch):
    """Slots with graphs take new rows through a static cache's prefill graphs, a graph per padded
    width and row count (no padded batch cache is made for them), and copy them into their slots,
    growing the slots beside live rows: the first rows enter together in one pass, rows that
    finish at different rounds are refilled as they finish, each prefill a replay, a one-token
    prompt prefills nothing, and greedy output equals `generate()`; with prefill graphs off (the
    GPU bench's comparison), rows enter through a padded cache again."""
    monkeypatch.setattr("specdec_core.graphs.CAPACITY_STEP", 8)  # slots grow as longer rows come in
    target, draft = models[kind]
    padded = []
    forward = BatchKV.forward
    monkeypatch.setattr(BatchKV, "forward", lambda self, *a, **k: padded.append(self) or forward(self, *a, **k))
    items = [prompts[i] for i in (0, 1, 3, 4, 5, 6, 2)]
    prefilled = []
    prefill = SlotKV.prefill_rows
    monkeypatch.setattr(SlotKV, "prefill_rows", lambda self, feeds, bases: prefilled.append(
        (self, [len(f) for f in feeds])) or prefill(self, feeds, bases))
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, chain=True), batch_size=2,
                                       num_speculative_tokens=3, max_new_tokens=12, cuda_graphs="on",
                                       settings=PassSettings(graph_prefills=graph_prefills))
    padded.clear()  # (the engine's self-checks at load, on a model's first engine, run a padded batch)
    kvs = [graphed(kv, True) for kv in engine.slots.values()]
    out = engine.generate_many([(p, 0) for p in items])
    assert [o.tokens for o in out] == [hf_greedy(target, p, 12) for p in items]
    if not graph_prefills:
        assert padded and all(kv._prefiller is None for kv in kvs)
        return
    assert not padded
    for kv in kvs:
        pre = kv._prefiller
        passes = [ns for who, ns in prefilled if who is pre]
        assert sorted(sum(passes, [])) == [3, 12, 17, 24, 27, 47]  # the 1-token prompt: none
        assert len(passes[0]) == 2  # the first two rows in one pass
        # (each growth of the prefills' cache drops its graphs: those since the last one)
        assert {key[:2] for key in pre.passes.kept} <= {("prefill", w) for w in (4, 16, 32, 64)}
        assert {len(key) for key in pre.passes.kept} <= {2, 3}  # (one row, or several: their count)
        assert pre.passes.captures > 0 and kv.passes.capture_s >= pre.passes.capture_s


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_rows_admitted_together_beyond_a_count_prefill_in_a_padded_pass(kind, models, prompts, fake_graphs,
                                                                         monkeypatch):
    """With `PassSettings.graph_prefill_rows` (the GPU bench's "eager prefills of 4+ rows"), rows admitted
    together beyond that many enter through a padded eager pass, fewer through one-row graphs:
    both in one job, and greedy output equals `generate()`."""
    from tests.test_batch_families import hf_greedy as hf_greedy_any

    target, draft = models[kind]
    items = [prompts[i] for i in (0, 3, 1, 4, 5, 6, 2)]
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, chain=True), batch_size=3,
                                       num_speculative_tokens=3, max_new_tokens=10, cuda_graphs="on",
                                       settings=PassSettings(graph_prefill_rows=1))
    kvs = [graphed(kv, True) for kv in engine.slots.values()]
    entered = []  # the target's admissions: (how, rows)
    for name, how in (("prefill", "graphs"), ("merge", "padded"), ("place", "padded")):
        own = getattr(SlotKV, name)

        def watched(self, *args, own=own, how=how, **kwargs):
            if self is kvs[0]:
                rows = len(args[0]) if how == "graphs" else sum(kv.rows for kv in args if isinstance(kv, BatchKV))
                entered.append((how, rows))
            return own(self, *args, **kwargs)
        monkeypatch.setattr(SlotKV, name, watched)
    out = engine.generate_many([(p, 0) for p in items])
    assert [o.tokens for o in out] == [hf_greedy_any(target, p, 10) for p in items]
    assert entered[0] == ("padded", 3)  # the first 3 rows at once
    assert ("graphs", 1) in entered and all(how == "graphs" for how, n in entered if n == 1)


def test_a_chain_never_positions_a_row_past_the_models_limit(models, prompts, fake_graphs):
    """Every row steps through the whole chain, a row with fewer drafts left past them: beside a
    row whose prompt and new tokens fill GPT-2's 256 learned positions, those extra steps stay
    inside its position table (they indexed past it: an error on a CPU, a device assert on a GPU)."""
    from tests.tiny_models import perturbed_copy

    target, _ = models["gpt2"]
    draft = perturbed_copy(target, 0.5, seed=3)  # agrees less: rows finish rounds with drafts left
    n = 10
    full = torch.randint(5, 300, (target.config.n_positions - n,), generator=torch.Generator().manual_seed(0))
    rows = [prompts[1], full.tolist(), prompts[0], prompts[4]]
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, chain=True), batch_size=2, num_speculative_tokens=6,
                                       max_new_tokens=n, cuda_graphs="on")
    for kv in engine.slots.values():
        graphed(kv, True)
    out = engine.generate_many([(p, 0) for p in rows])
    assert [o.tokens for o in out] == [hf_greedy(target, p, n) for p in rows]
    assert any(isinstance(key, tuple) for key in engine.slots[id(draft)].passes.kept)  # chained rounds ran


def test_adaptive_costs_are_timed_after_a_one_token_prompt(models):
    """Costs are timed on max(ks) tokens after the first item's prompt, the prompt repeated as often
    as that takes: a one-token prompt with gamma 6 ran out of tokens and failed the item."""
    target, draft = models["llama"]
    gen = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=6, max_new_tokens=8,
                               gamma_policy=AdaptiveGamma(max_gamma=6))
    assert gen.generate([5]).tokens == hf_greedy(target, [5], 8)


@pytest.mark.parametrize("engine", ["one", "padded", "slots", "slots-chained"])
def test_adaptive_costs_are_timed_inside_the_models_positions(models, prompts, engine, fake_graphs):
    """The adaptive policy times gamma + 1 tokens after a prompt: a prompt that, with its few
    new tokens, fills GPT-2's 256 learned positions is timed on fewer, and decodes as
    `generate()` does (the timing indexed past the position table)."""
    target, draft = models["gpt2"]
    n, gamma = 3, 8
    full = torch.randint(5, 300, (target.config.n_positions - n,), generator=torch.Generator().manual_seed(0))
    rows = [full.tolist(), prompts[0]]
    policy = AdaptiveGamma(max_gamma=gamma)
    if engine == "one":
        gen = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=gamma, max_new_tokens=n,
                                   gamma_policy=policy)
        out = [gen.generate(p).tokens for p in rows]
    else:
        slots = engine.startswith("slots")
        gen = BatchSpeculativeGenerator(target, ModelDrafter(draft, chain=engine == "slots-chained"), batch_size=2,
                                        num_speculative_tokens=gamma, max_new_tokens=n, gamma_policy=policy,
                                        cuda_graphs="on" if slots else "off")
        assert all(gen.slots.values()) == slots
        for kv in gen.slots.values():
            graphed(kv, True)
        out = [o.tokens for o in gen.generate_many([(p, 0) for p in rows])]
        if engine == "slots-chained":
            assert any(isinstance(key, tuple) for key in gen.slots[id(draft)].passes.kept)
    assert out == [hf_greedy(target, p, n) for p in rows]
    assert policy.costs is not None


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_many_new_rows_enter_in_few_graphed_passes(kind, models, prompts, fake_graphs, monkeypatch, caplog):
    """More new rows than one prefill pass takes (`ADMIT_ROWS`, here 4): they enter in passes of
    at most that many, padded to 1 or 4 rows with dummy rows in the prefills' scratch rows, and
    every row's greedy output equals `generate()`, decoder-only and encoder-decoder."""
    from specdec_core import slot_kv
    from tests.test_batch_families import hf_greedy as hf_greedy_any

    monkeypatch.setattr(slot_kv, "ADMIT_ROWS", 4)
    target, draft = models[kind]
    items = [prompts[i % len(prompts)] for i in range(11)]
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, chain=True), batch_size=7,
                                       num_speculative_tokens=3, max_new_tokens=10, cuda_graphs="on")
    kvs = [graphed(kv, True) for kv in engine.slots.values()]
    passes = []  # the target's prefill passes: rows in each
    name = "encode_rows" if target.config.is_encoder_decoder else "prefill_rows"
    own = getattr(SlotKV, name)

    def watched(self, rows, *args):
        if self is kvs[0]._prefiller:
            passes.append(len(rows))
        return own(self, rows, *args)

    monkeypatch.setattr(SlotKV, name, watched)
    with caplog.at_level(logging.INFO, logger="specdec_core.batch_engine"):
        out = engine.generate_many([(p, 0) for p in items])
    assert [o.tokens for o in out] == [hf_greedy_any(target, p, 10) for p in items]
    rows, passes_in_all = engine.admitted
    assert rows == len(items) and passes_in_all < len(items)  # the log says so, per call
    assert f"{rows} rows admitted in {passes_in_all} prefill passes of the target" in caplog.text
    # The first 7 rows in two passes (4 and 3), each row encoded or prefilled once (a decoder-only
    # one-token prompt prefills nothing).
    takes = [1 if target.config.is_encoder_decoder or len(p) > 1 else 0 for p in items]
    assert passes[:2] == [sum(takes[:4]), sum(takes[4:7])] and all(n <= 4 for n in passes)
    assert sum(passes) == sum(takes)
    assert kvs[0]._prefiller.buffer_rows == 4
    assert {key[2] for key in kvs[0]._prefiller.passes.kept if len(key) == 3} <= {4}


def test_costs_are_timed_after_every_width_is_captured(models, prompts, fake_graphs, monkeypatch):
    """A width's first pass over graphed (or compiled) caches captures (or compiles): one-off work,
    seconds against a pass's milliseconds on a GPU. The cost timers run each width once first, at
    batch 1 and batched, so that no timed pass captures (v(k) would read as hundreds of steps, and
    adaptive gamma would never draft)."""
    from specdec_core.gamma import Costs

    target, draft = models["llama"]
    caches: list = []
    timed: list[int] = []  # captures during each timed target pass
    real = Costs.measure.__func__

    def measure(cls, target_step, draft_step, ks, reps):
        def watched(k: int) -> float:
            before = sum(kv.passes.captures for kv in caches)
            seconds = target_step(k)
            timed.append(sum(kv.passes.captures for kv in caches) - before)
            return seconds

        return real(cls, watched, draft_step, ks, reps)

    monkeypatch.setattr(Costs, "measure", classmethod(measure))
    gen = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=3, cuda_graphs="on")
    caches[:] = [graphed(gen.static, True)]
    gen.measure_costs(prompts[0])
    batch = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=2, num_speculative_tokens=3,
                                      max_new_tokens=4, cuda_graphs="on", gamma_policy=AdaptiveGamma())
    caches[:] = [graphed(kv, True) for kv in batch.slots.values()]
    batch.generate_many([(p, 0) for p in prompts[:2]])
    # (batch 1 and batched) x 2 reps x (a 1-token and a k-token pass for k = 2..4, a 1-token pass before a draft step)
    assert len(timed) == 2 * 2 * (2 * 3 + 1)
    assert not any(timed) and all(kv.passes.captures for kv in caches)
