"""The static-cache decoder (the CUDA-graph path, run eagerly here): the same logits as the growing
cache through passes, rollbacks and growth, and greedy output equal to `generate()`."""

import pytest
import torch

from specdec_core import plan
from specdec_core.batch_kv import feed_to, one_row
from specdec_core.decoder import initial_decoder_ids
from specdec_core.drafters import ModelDrafter, NgramDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.graphs import MAX_GRAPH_WIDTH, PassGraphs
from specdec_core.plan import graph_support, slot_kv_for
from specdec_core.slot_kv import SlotKV
from tests.numerics import assert_logits_close
from tests.test_engine_greedy import PROMPTS, reference


@pytest.mark.parametrize("kind", ["llama", "gpt2", "t5", "bart"])
def test_logits_equal_the_growing_cache_through_rollbacks_and_growth(kind, models, tokenizer, monkeypatch):
    """Two items in turn: the decoder's cache grows several times, and an encoder-decoder's
    cross-attention buffers grow for the second item's longer prompt; positions (and T5's
    relative biases) come from each pass's start."""
    monkeypatch.setattr("specdec_core.graphs.CAPACITY_STEP", 8)
    target, _ = models[kind]
    static = SlotKV(target, 1)
    g = torch.Generator().manual_seed(0)
    for prompt in (PROMPTS[0], PROMPTS[2] + PROMPTS[1]):
        ids = tokenizer(prompt).input_ids
        assert static.acquire()
        static.start(ids)  # (decoder-only: its slot, empty)
        dynamic = one_row(target, ids)
        seq = initial_decoder_ids(target, ids)
        if len(seq) > 1:
            feed_to(static, seq[:-1], 0)
            feed_to(dynamic, seq[:-1], 0)
        for step in range(12):
            extra = torch.randint(5, 300, (step % 5,), generator=g).tolist()
            feed = seq + extra
            assert_logits_close(feed_to(static, feed, len(extra) + 1), feed_to(dynamic, feed, len(extra) + 1))
            keep = len(seq) + (step % 3 if extra else 0)
            static.rollback(0, keep)
            dynamic.rollback(0, keep)
            seq = feed[:keep] + [int(torch.randint(5, 300, (1,), generator=g))]
        static.release()
    assert static.capacity >= len(seq) and static.capacity % 8 == 0
    if static.encdec:
        assert static.enc_capacity >= len(ids) and static.enc_capacity % 8 == 0
        assert int((static.enc_mask == 0).sum()) == len(ids)  # the last item's encoder columns visible


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_a_widened_pass_gives_the_logits_of_the_pass_asked_for(kind, models, tokenizer, monkeypatch):
    """`min_width` pads a narrower pass (LED's decoder builds no mask for one token): for a model
    that masks every pass, the real tokens' logits are those of the unwidened pass, whichever
    positions are kept (the compiled passes keep every one: 0), with room made for its pad."""
    monkeypatch.setattr("specdec_core.graphs.CAPACITY_STEP", 8)
    target, _ = models[kind]
    ids = tokenizer(PROMPTS[0]).input_ids
    seq = initial_decoder_ids(target, ids) + [17, 42, 7]
    for keep in (0, 1):
        got = []
        for width in (1, 2):
            static = SlotKV(target, 1, graphs=False, min_width=width)
            assert static.acquire()
            static.start(ids)
            feed_to(static, seq[:-1], 1)
            inp = static._inputs([seq[-1:]], [static.length(0)], 0)
            static._fit(static.length(0) + 1, static.length(0))
            with torch.inference_mode():
                got.append(static._packed_pass(inp.to(static.device), keep))
        assert got[0].shape == got[1].shape, (kind, keep)
        assert_logits_close(got[1][0].float(), got[0][0].float())
        assert static.capacity >= static.length(0) + 2  # room for the widened pass's pad


@pytest.mark.parametrize("kind", ["llama", "gpt2", "t5", "bart"])
def test_greedy_through_static_caches_equals_generate(kind, models, tokenizer):
    target, draft = models[kind]
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        ref = reference(target, ids, 24)
        for drafter in (ModelDrafter(draft, cuda_graphs="on"), NgramDrafter(), NoDrafter()):
            for gamma in (1, 4):
                gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=gamma, max_new_tokens=24,
                                           cuda_graphs="on")
                assert gen.static is not None
                assert gen.generate(ids).tokens == ref, (kind, type(drafter).__name__, gamma, prompt)
                assert gen.static.acquire(), "the item gave its static decoder back"
                gen.static.release()


def test_sampling_through_static_caches_follows_the_seed(models, tokenizer):
    from specdec_core.processing import SamplingSettings

    target, draft = models["llama"]
    ids = tokenizer(PROMPTS[0]).input_ids
    settings = SamplingSettings(temperature=1.0)
    outs = []
    for mode in ("on", "off"):
        gen = SpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs=mode), max_new_tokens=20,
                                   sampling=settings, cuda_graphs=mode)
        outs.append([gen.generate(ids, seed=s).tokens for s in range(5)])
    assert outs[0] == outs[1]


def test_busy_static_decoder_falls_back_to_a_growing_cache(models, tokenizer):
    target, draft = models["llama"]
    ids = tokenizer(PROMPTS[1]).input_ids
    gen = SpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs="on"), max_new_tokens=12, cuda_graphs="on")
    assert gen.static.acquire()  # another item (thread) holds it
    try:
        assert gen.generate(ids).tokens == reference(target, ids, 12)
        assert gen.static.lengths == [0] and not gen.static.slot_of  # untouched
    finally:
        gen.static.release()


def test_which_models_take_the_static_path(models):
    assert graph_support(models["llama"][0]) is None and graph_support(models["t5"][0], batched=True) is None
    assert slot_kv_for(models["llama"][0], "auto") is None  # CPU: no graphs to gain
    assert slot_kv_for(models["llama"][0], "off") is None
    assert slot_kv_for(models["bart"][0], "on").encdec
    with pytest.raises(ValueError, match="cuda_graphs must be one of"):
        slot_kv_for(models["llama"][0], "always")


def test_adaptive_gamma_times_the_static_passes_and_stays_exact(models, tokenizer):
    from specdec_core.gamma import AdaptiveGamma

    target, draft = models["llama"]
    ids = tokenizer(PROMPTS[2]).input_ids
    policy = AdaptiveGamma(max_gamma=4)
    gen = SpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs="on"), num_speculative_tokens=4,
                               max_new_tokens=16, gamma_policy=policy, cuda_graphs="on")
    assert gen.generate(ids).tokens == reference(target, ids, 16)
    assert policy.costs is not None and policy.costs.c > 0
    assert gen.static.acquire()  # the timing gave it back too
    gen.static.release()


def test_an_item_that_fails_gives_its_static_decoders_back(models, tokenizer):
    from specdec_core.rows import ItemTimeout

    target, draft = models["llama"]
    drafter = ModelDrafter(draft, cuda_graphs="on")
    gen = SpeculativeGenerator(target, drafter, max_new_tokens=12, cuda_graphs="on")
    with pytest.raises(ItemTimeout):
        gen.generate(tokenizer(PROMPTS[0]).input_ids, max_seconds=-1.0)
    for static in (gen.static, drafter.static):
        assert static.acquire()
        static.release()


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_draft_chained_on_the_device_drafts_what_steps_draft(kind, models, tokenizer):
    """A round's greedy drafts as one chain (read back once) are the per-step drafts: same
    output, same rounds, same acceptance, also after a prompt wider than a graph (whose first
    chain keeps only its last position's logits)."""
    target, draft = models[kind]
    wide = " ".join(PROMPTS) * 2
    assert len(tokenizer(wide).input_ids) > MAX_GRAPH_WIDTH
    for prompt in [*PROMPTS, wide]:
        ids = tokenizer(prompt).input_ids
        ref = reference(target, ids, 24)
        for gamma in (1, 3, 5):
            outs = []
            for chain in (True, False):
                drafter = ModelDrafter(draft, cuda_graphs="on", chain=chain)
                gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=gamma, max_new_tokens=24,
                                           cuda_graphs="on")
                outs.append(gen.generate(ids))
            chained, stepped = outs
            assert chained.tokens == stepped.tokens == ref, (kind, gamma, prompt)
            assert (chained.stats.verify_steps, chained.stats.accepted_tokens, chained.stats.drafts) == (
                stepped.stats.verify_steps, stepped.stats.accepted_tokens, stepped.stats.drafts)


def test_a_chain_is_used_only_for_plain_greedy_picks(models, tokenizer, monkeypatch):
    from specdec_core.processing import SamplingSettings

    target, draft = models["llama"]
    ids = tokenizer(PROMPTS[0]).input_ids
    calls = []
    original = SlotKV.draft_greedy
    monkeypatch.setattr(SlotKV, "draft_greedy", lambda self, *a: calls.append(1) or original(self, *a))
    drafter = ModelDrafter(draft, cuda_graphs="on", chain=True)
    SpeculativeGenerator(target, drafter, max_new_tokens=12, cuda_graphs="on").generate(ids)
    assert calls
    calls.clear()
    SpeculativeGenerator(target, drafter, max_new_tokens=12, cuda_graphs="on",
                         sampling=SamplingSettings(temperature=1.0)).generate(ids)
    saved = target.generation_config.repetition_penalty
    target.generation_config.repetition_penalty = 1.2
    try:
        out = SpeculativeGenerator(target, drafter, max_new_tokens=12, cuda_graphs="on").generate(ids)
        assert out.tokens == reference(target, ids, 12)
    finally:
        target.generation_config.repetition_penalty = saved
    assert not calls


def test_a_chain_stops_at_the_drafts_end_token(models, tokenizer):
    target, draft = models["gpt2"]
    ids = tokenizer(PROMPTS[1]).input_ids
    ref = reference(target, ids, 20)
    saved = target.generation_config.eos_token_id, draft.generation_config.eos_token_id
    target.generation_config.eos_token_id = draft.generation_config.eos_token_id = ref[6]
    try:
        drafter = ModelDrafter(draft, cuda_graphs="on", chain=True)
        out = SpeculativeGenerator(target, drafter, num_speculative_tokens=5, max_new_tokens=20,
                                   cuda_graphs="on").generate(ids)
        expected = reference(target, ids, 20)
    finally:
        target.generation_config.eos_token_id, draft.generation_config.eos_token_id = saved
    assert out.tokens == expected and out.tokens[-1] == ref[6] and out.stats.finish_reason == "eos"


def test_a_draft_sharing_the_targets_encoder_takes_its_outputs(models, tokenizer):
    """A draft running the target's own encoder module gets the target's encoder outputs: one
    encoder pass per item for both static decoders."""
    import copy

    from specdec_core.loading import share_encoder

    target, _ = models["t5"]
    draft = copy.deepcopy(target)
    draft.decoder.block = draft.decoder.block[:1]  # a draft cut from the target's first decoder layer
    draft.config.num_decoder_layers = 1
    assert share_encoder(target, draft)
    runs = []
    gen = SpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs="on"), num_speculative_tokens=3,
                               max_new_tokens=12, cuda_graphs="on")  # (its self-checks at load encode too)
    hook = target.get_encoder().register_forward_hook(lambda *a: runs.append(1))
    try:
        ids = tokenizer(PROMPTS[2]).input_ids
        out = gen.generate(ids)
    finally:
        hook.remove()
    assert out.tokens == reference(target, ids, 12) and out.stats.draft_tokens > 0
    assert len(runs) == 1


@pytest.mark.slow
@pytest.mark.parametrize("family", ["t5", "mt5", "umt5", "bart", "pegasus", "marian", "m2m100", "mbart", "led", "mvp"])
def test_every_seq2seq_family_through_static_caches_equals_generate(family, monkeypatch):
    """Each family's own positions (learned, sinusoidal, looked up at the device's position; LED's
    and MVP's own embeddings count them with a host `arange`, and M2M100/NLLB's from the ids, with
    a host check of its table: either would stop a capture), relative biases (T5: first layer;
    UMT5: every layer), start tokens and forced tokens, LED's one-token passes widened to two (its
    decoder reads no mask for one token; its encoder, which reads its global attention on the
    host, runs eagerly), eagerly and through traced graph replays (the decoder's start position is
    a device tensor, which a capture must not freeze)."""
    from tests.family_models import V, family_model
    from tests.graph_stand_in import trace
    from tests.test_batch_families import hf_greedy

    monkeypatch.setattr(PassGraphs, "_record", trace)
    target, draft = family_model(family, seed=1), family_model(family, seed=2)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, V - 6, (n,), generator=g).tolist() for n in (5, 12, 3)]
    refs = [hf_greedy(target, ids, 12) for ids in prompts]
    for graphs in (False, True):
        for drafter in (ModelDrafter(draft, cuda_graphs="on"), NoDrafter()):
            gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=3, max_new_tokens=12,
                                       cuda_graphs="on")
            for static in (gen.static, getattr(drafter, "static", None)):
                if static is not None:
                    static.passes.on = graphs
            for ids, ref in zip(prompts, refs, strict=True):
                assert gen.generate(ids).tokens == ref, (family, type(drafter).__name__, ids, graphs)
            assert (gen.static.passes.captures > 0) == graphs
            assert gen.static.min_width == (2 if family == "led" else 1)


@pytest.mark.parametrize("family", ["mistral", "gemma3"])
def test_sliding_window_families_through_static_caches_equal_generate(family, monkeypatch):
    """Rows longer than the window (6 tokens): each sliding layer's mask hides the columns a
    window or more behind the query (every layer's one mask: Mistral; Gemma 3's sliding layers
    only, a mask per layer type), eagerly and through traced graph replays, with a draft and
    without. Without the window in the masks every case here differs from `generate()`. (The
    other sliding-window families, in slots: tests/test_slot_kv.py.)"""
    from tests.family_models import WINDOW, V, family_model
    from tests.graph_stand_in import trace
    from tests.test_batch_families import hf_greedy

    monkeypatch.setattr(PassGraphs, "_record", trace)
    target, draft = family_model(family, seed=1), family_model(family, seed=2)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, V - 6, (n,), generator=g).tolist() for n in (5, 12, 3)]
    refs = [hf_greedy(target, ids, 16) for ids in prompts]
    for graphs in (False, True):
        for drafter in (ModelDrafter(draft, cuda_graphs="on"), NoDrafter()):
            gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=3, max_new_tokens=16,
                                       cuda_graphs="on")
            assert gen.static.window == WINDOW
            for static in (gen.static, getattr(drafter, "static", None)):
                if static is not None:
                    static.passes.on = graphs
            assert [gen.generate(ids).tokens for ids in prompts] == refs, (family, type(drafter).__name__, graphs)
            assert (gen.static.passes.captures > 0) == graphs


def test_layers_other_than_full_or_sliding_attention_are_refused(models):
    """Chunked (Llama 4), linear (Qwen3-Next) or state-space layers keep no columns a 4D mask can
    hide; sliding-window layers, hybrid or not, do."""
    from tests.family_models import family_model

    assert graph_support(family_model("gemma2", seed=1)) is None
    config = models["llama"][0].config.__class__.from_dict(models["llama"][0].config.to_dict())
    config.layer_types = ["full_attention", "chunked_attention"]
    assert plan.config_support(config) == "has chunked_attention layers"


def test_m2m100_positions_are_counted_as_generate_feeds_them():
    """M2M100/NLLB's positions over static caches: each token's as the module gives it fed alone
    after its row's earlier tokens (as `generate()` feeds them), a pad id included (it keeps the
    padding position and moves no later token), past the module's own table (from this cache's
    copy) and without the module's own forward running."""
    from tests.family_models import family_model

    model = family_model("m2m100", seed=1)
    embed = model.get_decoder().embed_positions
    static = SlotKV(model, 1)
    static._grow(600, 0)  # past the module's table (130 rows)
    assert embed.weights.shape[0] < 600 < static._table[embed].shape[0]
    pad = embed.padding_idx
    ids = torch.tensor([[5, pad, 7, 9], [4, 4, pad, 8]])
    static.positions = torch.tensor([[3, 4, 5, 6], [590, 591, 592, 593]])
    with static._by_row():
        out = model.get_decoder().embed_positions(ids, None, torch.tensor(0))
    for r in range(2):
        for i in range(4):
            start = int(static.positions[r, i])
            alone = embed(ids[r:r + 1, i:i + 1], None, start)  # the module itself, its table grown
            torch.testing.assert_close(out[r, i], alone[0, 0], rtol=0, atol=0)
    assert "forward" not in vars(embed)  # its own forward again


def test_models_whose_positions_wait_on_the_host_are_refused(models):
    """Dynamic-NTK RoPE recomputes its frequencies from a length read on the host inside a pass,
    which a capture cannot. (M2M100/NLLB's position table check is sidestepped: its positions are
    looked up on the device, `decoder.table_by_row`.)"""
    from tests.family_models import family_model

    assert graph_support(family_model("m2m100", seed=1), batched=True) is None
    config = models["llama"][0].config.__class__.from_dict(models["llama"][0].config.to_dict())
    config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    assert "dynamic" in plan.config_support(config)


def test_an_encoder_decoder_pass_waits_while_another_thread_hooks_its_model(models, tokenizer):
    """A static cache's pass changes the model's decoder modules for every caller (position
    embeddings, relative biases) while it runs: the same model's other decoder passes in other
    threads (a growing cache's, a padded batch's, another static cache's) wait for it
    (`decoder.pass_lock`), then decode as they would alone."""
    from specdec_core.batch_kv import BatchKV

    target = models["t5"][0]
    ids = tokenizer(PROMPTS[0]).input_ids

    def encoded(cache):
        cache.start(ids) if isinstance(cache, SlotKV) else cache.encode([ids] * cache.rows)
        return cache

    passes = {"growing": lambda: feed_to(one_row(target, ids), [0], 1),
              "padded": lambda: encoded(BatchKV(target, 2)).forward([[0], [0]])[0],
              "static": lambda: feed_to(encoded(SlotKV(target, 1)), [0], 1)}
    for name, run in passes.items():
        alone = run()
        waited, out = _run_while_the_model_is_hooked(target, run)
        assert waited, name
        torch.testing.assert_close(out, alone, rtol=0, atol=0)


def _run_while_the_model_is_hooked(model, run):
    """(whether `run` in a thread of its own waited while another thread held the model's pass
    lock, its result once that thread let go)."""
    import threading

    from specdec_core.decoder import pass_lock

    holding, release, done = threading.Event(), threading.Event(), threading.Event()
    out = []

    def hook_holder():
        with pass_lock(model):
            holding.set()
            release.wait(60)

    def decode():
        out.append(run())
        done.set()

    holder = threading.Thread(target=hook_holder)
    holder.start()
    assert holding.wait(60)
    worker = threading.Thread(target=decode)
    worker.start()
    waited = not done.wait(0.5)
    release.set()
    holder.join(60)
    worker.join(60)
    assert done.is_set()
    return waited, out[0]


def test_windows_and_layer_kinds_as_the_models_use_them():
    """Which mask a static cache builds: none past the causal one where no layer slides (Qwen2
    with every layer under `max_window_layers`), one sliding mask where every layer slides
    (Mistral, which ignores `layer_types`), one per kind where kinds mix (Qwen2 past
    `max_window_layers`); a multimodal model's from its text config."""
    from transformers import MistralConfig, Qwen2Config

    from specdec_core.decoder import mixed_layer_types, sliding_window
    from tests.family_models import multimodal_gemma3

    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)
    mistral = MistralConfig(**small, sliding_window=6)
    assert (sliding_window(mistral), mixed_layer_types(mistral)) == (6, None)
    qwen_full = Qwen2Config(**small, use_sliding_window=True, sliding_window=6, max_window_layers=2)
    assert (sliding_window(qwen_full), mixed_layer_types(qwen_full)) == (None, None)
    qwen_mixed = Qwen2Config(**small, use_sliding_window=True, sliding_window=6, max_window_layers=1)
    assert (sliding_window(qwen_mixed), mixed_layer_types(qwen_mixed)) == (6, ["full_attention", "sliding_attention"])
    gemma = multimodal_gemma3(seed=1).config
    assert (sliding_window(gemma), mixed_layer_types(gemma)) == (6, ["sliding_attention", "full_attention"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_replay_that_recorded_other_work_is_told_apart_in_every_dtype(dtype):
    """The check of a captured graph's first replay against the pass run eagerly: rounding passes,
    other logits (a capture reading a wrong buffer) do not, in bfloat16 too (its allowance of 800
    units in the last place was 6 times the largest logit)."""
    from specdec_core.graphs import _same

    gen = torch.Generator().manual_seed(0)
    eager = (torch.randn(4, 300, generator=gen) * 8).to(dtype)
    assert _same(eager.clone(), eager)
    assert _same((eager.float() * (1 + 4 * torch.finfo(dtype).eps)).to(dtype), eager)  # a few units of rounding
    assert not _same((torch.randn(4, 300, generator=gen) * 8).to(dtype), eager)
    assert not _same(torch.zeros_like(eager), eager)


def test_no_garbage_is_collected_while_a_graph_is_captured(monkeypatch):
    """Collecting an old graph (a dropped engine's, in a reference cycle) destroys it, which a capture forbids: on the
    H200 a BART capture then failed at its next kernel and graphs went off. The collector stays off while a graph
    is captured, and comes back on after, the capture failed or not."""
    import gc

    from specdec_core import graphs
    from specdec_core.pass_settings import DEFAULT

    seen = []

    class Capture:  # torch.cuda.graph on a CPU: notes whether the collector could run inside it
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            seen.append(gc.isenabled())

        def __exit__(self, *exc):
            return False

    for name, stand_in in {"graph": Capture, "CUDAGraph": lambda: None, "graph_pool_handle": lambda: None,
                           "current_stream": lambda device: None, "set_stream": lambda stream: None}.items():
        monkeypatch.setattr(torch.cuda, name, stand_in)
    monkeypatch.setattr(graphs, "clear_cublas_workspaces", lambda: None)
    passes = PassGraphs("m", torch.device("cpu"), DEFAULT, graphs=True, strict=False, compile=False,
                        compile_prefills=False)
    monkeypatch.setattr(passes, "_side", lambda: None)
    assert gc.isenabled()
    assert torch.equal(passes._record(lambda x: x + 1, torch.zeros(2))[1], torch.ones(2))
    with pytest.raises(ZeroDivisionError):
        passes._record(lambda x: 1 / 0, torch.zeros(2))
    assert seen == [False, False] and gc.isenabled()
