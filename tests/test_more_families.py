"""Families beyond the ones the engine tests run: decoder-only layouts with their own position
schemes (RoPE variants, learned positions with an offset, ALiBi built from the mask), and
encoder-decoder ones (long-document summarizers, FSMT, dialogue and code models, a mixture of
experts). Greedy output equals `generate()` (one beam) at batch 1 and batched, eagerly and over
static caches (the passes CUDA graphs replay on a GPU, here run eagerly), wherever the engines
take the model; where they do not, the config checks or the self-checks (a few passes against
the model's own cache, before any item) refuse it with the reason, and `--cuda_graphs auto` runs
it eagerly (or `--batch_size 1` is asked for)."""

import pytest
import torch

from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.drafters import ModelDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.plan import batch_refusal, padded_width, slot_kv_for
from specdec_core.processing import SamplingSettings
from tests.family_models import (
    DECODER_FAMILIES,
    MORE_SEQ2SEQ,
    SEQ2SEQ_FAMILIES,
    WINDOW_FAMILIES,
    V,
    family_model,
)
from tests.test_batch_families import hf_greedy
from tests.tiny_models import perturbed_copy

FAMILIES = DECODER_FAMILIES + MORE_SEQ2SEQ
# What refuses each family that is not taken everywhere, and why: (drafts verified in one pass,
# static caches at batch 1, static caches in slots, eager padded batches); None = taken (and exact).
REFUSED = {
    "bloom": (None, "takes no position_ids", "takes no position_ids", None),
    "falcon-alibi": (None, "ALiBi", "ALiBi", None),
    # its decoder's passes of several tokens are not those tokens one at a time: only the target alone
    # (a bare assert in its attention fails over static caches: the reason says where)
    "fsmt": ("over several tokens in one pass", r"fails over static caches \(AssertionError at modeling_fsmt\.py:",
             r"fails over static caches \(AssertionError at modeling_fsmt\.py:", "other logits in a padded batch"),
    # a position embedding that computes one position set for the whole batch
    "pegasus_x": (None, None, "computes one set of positions for all rows", None),
    # state-space layers: no key/value cache to roll back, so no engine decodes it
    "mamba": ("fails over a growing key/value cache", "linear_attention", "linear_attention", "linear_attention"),
    # recurrent layers whose state stays in the model, which a pass over a cache never resets (the
    # target alone gave other tokens from the second on)
    "recurrent_gemma": ("other logits over a growing key/value cache than in one pass without one",
                        "linear_attention", "linear_attention", "linear_attention"),
    # batch 1 only (its decoder's sliding window kept over static caches too)
    "t5gemma": (None, None, "fails in slots", "other logits in a padded batch"),
    # ALiBi from the mask, as Falcon's and BLOOM's
    "mpt": (None, "ALiBi", "ALiBi", "other logits in a padded batch"),
    # attention within chunks of positions: batch 1 eagerly
    "llama4_text": (None, "chunked_attention", "chunked_attention", "chunked_attention"),
    # local layers whose window counts cache columns: batch 1 eagerly (past the window here)
    "gpt_neo": (None, "local_attention", "local_attention", "local_attention"),
    # its router reads the last row of a 4D mask as every token's padding: rows of a batch mix
    "nllb_moe": (None, "other logits over static caches", "other logits over static caches",
                 "other logits in a padded batch"),
}
RUNS_NOWHERE = {"mamba", "recurrent_gemma"}
# expert routing that reads values on the host (`nonzero`): no graph captures their passes, which
# run eagerly over static caches here (`test_passes_that_read_values_on_the_host_run_eagerly...`)
READS_ON_HOST = {"switch"}
NONE = (None, None, None, None)


def _pair_and_prompts(family: str):
    target = family_model(family, seed=1, window=None)
    draft = perturbed_copy(target, 0.1, seed=2)
    draft.generation_config = target.generation_config
    gen = torch.Generator().manual_seed(0)
    return target, draft, [torch.randint(3, V, (n,), generator=gen).tolist() for n in (5, 9, 3, 12, 7)]


def _modes(family: str) -> tuple[str, str | None]:
    """--cuda_graphs for the batch-1 and the batched engine (None: no batching)."""
    _, b1, slots, eager = REFUSED.get(family, NONE)
    return ("off" if b1 else "on"), (None if eager else "off" if slots or b1 else "on")


@pytest.mark.parametrize("family", FAMILIES)
def test_refusals_name_the_reason(family):
    target, draft, _ = _pair_and_prompts(family)
    verify, b1, slots, eager = REFUSED.get(family, NONE)
    for expected, make in ((verify, lambda: SpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs="off"),
                                                                 cuda_graphs="off")),
                           (b1, lambda: slot_kv_for(target, "on")),
                           (slots, lambda: slot_kv_for(target, "on", 3)),
                           (eager, lambda: BatchSpeculativeGenerator(target, None, batch_size=2, cuda_graphs="off"))):
        if expected is None:
            assert make() is not None
        else:
            with pytest.raises(ValueError, match=expected):
                make()
    if family in RUNS_NOWHERE:  # the target alone too (it loaded, and gave other tokens)
        with pytest.raises(ValueError, match=verify):
            SpeculativeGenerator(target, NoDrafter(), cuda_graphs="off")


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in RUNS_NOWHERE])
def test_greedy_equals_generate_at_batch_one_and_batched(family, monkeypatch):
    """Eagerly, and over static caches through recorded graph replays (tests/graph_stand_in.py,
    the stand-in for CUDA graphs, which fails where a capture would: a value read on the host): every
    decode pass of a family the engines take is captured, none falls back to eager (only an
    encoder runs eagerly where the plan says so, as LED's, LongT5's, PEGASUS-X's and T5Gemma's)."""
    from specdec_core.graphs import PassGraphs
    from tests.graph_stand_in import trace

    monkeypatch.setattr(PassGraphs, "_record", trace)
    target, draft, prompts = _pair_and_prompts(family)
    skip = 1 if target.config.is_encoder_decoder else None
    with torch.inference_mode():
        refs = [target.generate(torch.tensor([p]), do_sample=False, num_beams=1, max_new_tokens=16
                                )[0, skip or len(p):].tolist() for p in prompts]
    single_mode, batched_mode = _modes(family)
    verified = REFUSED.get(family, NONE)[0] is None

    def graphed(*caches) -> list:
        caches = [c for c in caches if c is not None and family not in READS_ON_HOST]
        for cache in caches:
            cache.passes.on = True  # (strict: a pass that cannot be captured fails the test)
        return caches

    def captured(cache) -> bool:
        prefiller = getattr(cache, "_prefiller", None) or cache
        return cache.passes.on and cache.passes.captures > 0 and prefiller.passes.uncaptured <= {"encode"}

    for mode in {"off", single_mode}:
        drafter = ModelDrafter(draft, cuda_graphs=mode) if verified else NoDrafter()
        single = SpeculativeGenerator(target, drafter, num_speculative_tokens=3, max_new_tokens=16, cuda_graphs=mode)
        assert (single.static is not None) == (mode == "on")
        caches = graphed(single.static, getattr(drafter, "static", None))
        outs = [single.generate(p) for p in prompts]
        assert [o.tokens for o in outs] == refs, (family, mode, "batch 1")
        assert all(captured(c) for c in caches), (family, "batch 1")
        # the draft's tokens really went through verify
        assert sum(o.stats.accepted_tokens for o in outs) > 0 or not verified
    for mode in {"off", batched_mode} - {None} if batched_mode else ():
        engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs=mode), batch_size=3,
                                           num_speculative_tokens=3, max_new_tokens=16, cuda_graphs=mode)
        assert (engine.slots[id(target)] is not None) == (mode == "on")
        caches = graphed(*engine.slots.values())
        assert [g.tokens for g in engine.generate_many([(p, 0) for p in prompts])] == refs, (family, mode, "batched")
        assert all(captured(c) for c in caches), (family, "batched")


@pytest.mark.parametrize("family", [f for f in FAMILIES if _modes(f)[1]])
def test_sampled_rows_equal_the_batch_one_sample_of_their_seed(family):
    """Sampled: each batched row is the batch-1 sample of its seed (the batch-1 engine's own
    distribution is tested statistically elsewhere), eagerly and over static caches where taken."""
    target, draft, prompts = _pair_and_prompts(family)
    sampling = SamplingSettings(temperature=1.0, top_k=20)
    items = [(p, 50 + i) for i, p in enumerate(prompts)]
    single_mode, batched_mode = _modes(family)
    single = SpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs=single_mode), num_speculative_tokens=3,
                                  max_new_tokens=12, sampling=sampling, cuda_graphs=single_mode)
    alone = [single.generate(p, seed).tokens for p, seed in items]
    assert len({tuple(a) for a in alone}) > 1
    for mode in {"off", batched_mode}:
        engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs=mode), batch_size=3,
                                           num_speculative_tokens=3, max_new_tokens=12, sampling=sampling,
                                           cuda_graphs=mode)
        assert [g.tokens for g in engine.generate_many(items)] == alone, (family, mode)


def test_a_hybrid_model_is_refused_for_its_layer_kinds_not_an_internal_error():
    """Hybrids of attention and state-space, linear-attention or convolution layers (Mamba, LFM2)
    fail over a growing key/value cache with errors of their own code (an IndexError): the reason
    leads with the layer kinds that explain it."""
    import transformers

    config = transformers.Lfm2Config(vocab_size=V, hidden_size=32, intermediate_size=64, block_ff_dim=64,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     layer_types=["conv", "full_attention"], pad_token_id=0, bos_token_id=1,
                                     eos_token_id=2)
    torch.manual_seed(0)
    for target, kinds in ((transformers.Lfm2ForCausalLM(config).eval(), "conv"),
                          (family_model("mamba", seed=1), "linear_attention")):
        with pytest.raises(ValueError, match=f"{type(target).__name__} has {kinds} layers, whose state a key/value "
                                             "cache cannot roll back: it fails over a growing key/value cache"):
            SpeculativeGenerator(target, NoDrafter(), cuda_graphs="off")


def test_a_padded_batch_widens_one_token_passes_only_for_a_decoder_that_needs_it():
    """LED's decoder builds no mask for a 1-token pass, so over a padded batch's holes its rows
    would attend to other tokens' keys: its passes over holes are widened to 2 tokens (the extra
    one a pad, then a hole), which the self-check finds exact; every other family keeps 1."""
    from specdec_core.self_check import rows_disagreement

    led = family_model("led", seed=1)
    assert "other logits in a padded batch" in rows_disagreement(led, 0, slots=False, min_width=1)
    assert padded_width(led) == 2 and batch_refusal(led) is None
    assert [padded_width(family_model(f, seed=1)) for f in ("bart", "t5", "pegasus_x")] == [1, 1, 1]
    assert padded_width(family_model("fsmt", seed=1)) is None  # not a mask: refused at any width


def test_on_a_gpu_auto_runs_what_the_self_checks_refuse_eagerly(monkeypatch, caplog):
    """With `--cuda_graphs auto` on a GPU (here a CPU said to be one), a model that the self-checks
    refuse decodes eagerly, and the log says why (FSMT's passes fail over static caches); LED's
    one-token passes are widened to two, at batch 1 and in slots."""
    import logging

    from specdec_core import plan

    def on_a_gpu(model, mode, batched=False):
        return mode != "off" and plan.graph_support(model, batched) is None

    monkeypatch.setattr(plan, "wants_static", on_a_gpu)  # (slot_kv_for's choice goes through it too)
    led, fsmt = family_model("led", seed=1), family_model("fsmt", seed=1)
    with caplog.at_level(logging.WARNING, logger="specdec_core"):
        assert slot_kv_for(fsmt, "auto") is None
        assert slot_kv_for(fsmt, "auto", 3) is None
        assert slot_kv_for(led, "auto").min_width == slot_kv_for(led, "auto", 3).min_width == 2
    said = [r.getMessage() for r in caplog.records]
    assert any("no static caches for FSMTForConditionalGeneration: it fails over static caches"
               in m for m in said), said
    assert any("no static caches for FSMTForConditionalGeneration batches: it fails" in m
               for m in said), said
    assert not any("LED" in m for m in said), said
    assert slot_kv_for(family_model("bart", seed=1), "on").min_width == 1


@pytest.mark.parametrize("family", ["dbrx", "jetmoe", "switch"])
def test_passes_that_read_values_on_the_host_run_eagerly_unless_graphs_are_insisted_on(family, monkeypatch):
    """DBRX's, JetMoE's and Switch's expert routing reads values on the host (`nonzero`, `tolist`), which no
    capture can hold: through the graph stand-in their passes fall back to eager, exact, at batch 1
    and batched, as `auto` does on a GPU; `on` fails the row saying so. (The stand-in once traced
    JetMoE's `tolist` and froze its routing: other tokens.)"""
    from specdec_core.graphs import CaptureFailed, PassGraphs
    from tests.graph_stand_in import trace

    monkeypatch.setattr(PassGraphs, "_record", trace)
    target, draft, prompts = _pair_and_prompts(family)
    with torch.inference_mode():
        refs = [target.generate(torch.tensor([p]), do_sample=False, num_beams=1, max_new_tokens=12)[
            0, 1 if target.config.is_encoder_decoder else len(p):].tolist() for p in prompts]
    single = SpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs="on"), num_speculative_tokens=3,
                                  max_new_tokens=12, cuda_graphs="on")
    batched = BatchSpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs="on"), batch_size=3,
                                        num_speculative_tokens=3, max_new_tokens=12, cuda_graphs="on")
    caches = [single.static, single.drafter.static, *batched.slots.values()]
    for kv in caches:
        kv.passes.on, kv.passes.strict = True, False  # as `auto` makes them on a GPU
    assert [single.generate(p).tokens for p in prompts] == refs
    assert [g.tokens for g in batched.generate_many([(p, 0) for p in prompts])] == refs
    assert not any(kv.passes.on for kv in caches)  # every model's passes fell back to eager
    single.static.passes.on, single.static.passes.strict = True, True
    with pytest.raises(CaptureFailed, match=f"of {type(target).__name__} cannot be captured"):
        single.generate(prompts[0])


def test_an_encoder_that_takes_no_4d_mask_is_encoded_eagerly_under_graphs(monkeypatch, caplog):
    """Switch's encoder reads its mask as 2D (`mask[:, None, None, :]`): its graphed pass, over the
    static caches' 4D mask, passed the replay check (a replay equals the same pass run eagerly) and
    encoded wrongly: other tokens from the first. A self-check runs the encoder both ways on padded
    prompts; the plan then encodes prompts eagerly, at batch 1 and in slots, while the decoder's
    passes stay graphed. (A Switch without expert layers: with them, host reads keep passes eager.)"""
    import logging

    from specdec_core.graphs import PassGraphs
    from tests.graph_stand_in import trace

    monkeypatch.setattr(PassGraphs, "_record", trace)
    target = family_model("switch", seed=1, window=None, encoder_sparse_step=0, decoder_sparse_step=0)
    _, _, prompts = _pair_and_prompts("bart")
    with torch.inference_mode():
        refs = [target.generate(torch.tensor([p]), do_sample=False, num_beams=1, max_new_tokens=12)[0, 1:].tolist()
                for p in prompts]
    with caplog.at_level(logging.INFO, logger="specdec_core"):
        single = SpeculativeGenerator(target, NoDrafter(), max_new_tokens=12, cuda_graphs="on")
        batched = BatchSpeculativeGenerator(target, NoDrafter(), batch_size=3, max_new_tokens=12, cuda_graphs="on")
        caches = [single.static, batched.slots[id(target)]]
        for kv in caches:
            kv.passes.on = True
        assert [single.generate(p).tokens for p in prompts] == refs
        assert [g.tokens for g in batched.generate_many([(p, 0) for p in prompts])] == refs
    for kv in caches:
        prefiller = getattr(kv, "_prefiller", None) or kv
        assert kv.passes.on and kv.passes.captures > 0 and not prefiller.passes.uncaptured
        assert not any(isinstance(key, tuple) and key[0] == "encode" for key in prefiller.passes.kept)
        assert any(isinstance(key, tuple) and key[0] == "cross" for key in prefiller.passes.kept)
    assert "SwitchTransformersForConditionalGeneration's prompts are encoded eagerly" in caplog.text
    assert "fails under a 4D mask" in caplog.text


@pytest.mark.parametrize("family", ["bert2bert", "roberta2roberta"])
def test_an_encoder_decoder_model_of_two_halves_fails_rows_past_their_positions(family):
    """`EncoderDecoderModel` (bert2bert, roberta2roberta) keeps its positions in its two halves'
    configs: rows past them failed with an internal error from the embeddings (a 129-token prompt
    at once, 129 new tokens after 128), not as PromptTooLong; within them it decodes as
    `generate()`. RoBERTa's table of 130 rows holds 128 positions (it counts from its pad id + 1)."""
    from specdec_core.loading import context_limit
    from specdec_core.text import PromptTooLong, TextGenerator

    class Digits:  # "5 6 7" -> [5, 6, 7]
        chat_template = None

        def __call__(self, text, verbose=False):
            return {"input_ids": [int(x) for x in text.split()]}

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    target = family_model(family, seed=1)
    assert context_limit(target) == context_limit(target, encoder=True) == 128
    prompt = [5 + i % 100 for i in range(128)]
    with torch.inference_mode():
        ref = target.generate(torch.tensor([prompt]), do_sample=False, num_beams=1, max_new_tokens=8)[0, 1:].tolist()
    for new, length, fails in ((8, 128, None), (8, 129, "encoder's 128-position"), (129, 7, "decoder's 128-position")):
        gen = TextGenerator(target, Digits(), NoDrafter(), max_new_tokens=new, cuda_graphs="off")
        if fails is None:
            assert gen.generate(" ".join(map(str, prompt)))["token_ids"] == ref
        else:
            with pytest.raises(PromptTooLong, match=fails):
                gen.generate(" ".join(["5"] * length))


def test_the_self_checks_tolerate_rounding_not_a_broken_contract():
    """1e-3 of the largest logit in float32, 10% in 16-bit types."""
    from specdec_core.self_check import logits_differ

    want = torch.tensor([[4.0, -2.0, 1.0]])
    assert logits_differ(want + 3e-3, want) is None and logits_differ(want + 5e-3, want) is not None
    # a bfloat16 model's (the engines' logits come back as float32 either way)
    bf16 = torch.bfloat16
    assert logits_differ(want + 0.3, want, bf16) is None and logits_differ(want + 0.5, want, bf16) is not None
    assert logits_differ(want[:, :2], want) is not None  # another shape: never the same logits


@pytest.mark.parametrize("family", ["qwen2", "bart"])
def test_a_config_whose_end_token_is_a_list_decodes_exactly(family):
    """Llama 3.1's config.json holds `eos_token_id` as a list (the self-checks' probe failed on it: a TypeError at
    load); every end token ends a row, at batch 1 and batched, as in `generate()`."""
    target = family_model(family, seed=1)
    ends = [target.config.eos_token_id, 7]
    target.config.eos_token_id = target.generation_config.eos_token_id = ends
    draft = perturbed_copy(target, 0.05, seed=2)
    draft.generation_config = target.generation_config
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 90, (n,), generator=gen).tolist() for n in (5, 9, 3)]
    want = [hf_greedy(target, p, 16) for p in prompts]
    one = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=3, max_new_tokens=16)
    assert [one.generate(p).tokens for p in prompts] == want
    batched = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=2, num_speculative_tokens=3,
                                        max_new_tokens=16)
    assert [g.tokens for g in batched.generate_many([(p, 0) for p in prompts])] == want


def test_a_models_checks_run_anew_on_the_probe_its_new_special_ids_pick():
    """The checks' probe leaves out a config's special ids: a pad id set in place after a first check picks other
    probe tokens, which are checked against their own references (before, the old ones: a false refusal)."""
    from specdec_core.self_check import probe_ids

    model = family_model("qwen2", seed=1)
    assert batch_refusal(model, 0) is None
    model.config.pad_token_id = pad = probe_ids(model, 1)[0]
    assert probe_ids(model, 1)[0] != pad
    assert batch_refusal(model, pad) is None


@pytest.mark.parametrize("family", SEQ2SEQ_FAMILIES + WINDOW_FAMILIES + FAMILIES)
def test_the_self_checks_answer_the_same_in_bfloat16(family):
    """bfloat16, which GPU jobs run in, rounds about 65,000 times more coarsely than float32: the
    self-checks still accept every family the engines take (no false alarm, which would cost a
    GPU its graphs) and refuse the same ones."""
    assert (wrong := self_checks_wrong(family, family_model(family, seed=1).to(torch.bfloat16))) is None, wrong


def self_checks_wrong(family: str, model) -> str | None:
    """The self-checks' answers for this model of `family` (verify passes, static caches, slots,
    padded batches), or None when each refuses exactly what `REFUSED` says it should."""
    from specdec_core import self_check

    verify, b1, slots, eager = REFUSED.get(family, NONE)
    def at_some_width(check) -> str | None:  # (static caches widen 1-token passes where that helps)
        return None if self_check.narrowest_width(check) else check(1)

    answers = (self_check.verify_disagreement(model), at_some_width(lambda w: self_check.static_disagreement(model, w)),
               at_some_width(lambda w: self_check.rows_disagreement(model, 0, slots=True, min_width=w)),
               batch_refusal(model, 0))
    expected = (verify, b1, b1 or slots, eager)
    return None if [a is not None for a in answers] == [e is not None for e in expected] else f"{family}: {answers}"


def test_a_model_whose_passes_of_several_tokens_fail_is_refused_with_its_reason():
    """One-token passes work, a pass of several tokens over its cache raises (an inconsistent config
    of a latent-attention family did): a refusal naming the error and `--drafter none`, as for a
    model whose such passes give other logits (a RuntimeError came out of the engine before)."""
    from specdec_core.drafters import NgramDrafter

    model = family_model("qwen2", seed=1)
    forward = model.forward

    def several_tokens_fail(*args, **kwargs):
        ids, cache = kwargs.get("input_ids"), kwargs.get("cache", kwargs.get("past_key_values"))
        if ids is not None and ids.shape[-1] > 1 and cache is not None and cache.get_seq_length() > 0:
            raise RuntimeError("The size of tensor a (4) must match the size of tensor b (8)")
        return forward(*args, **kwargs)

    model.forward = several_tokens_fail
    with pytest.raises(ValueError, match=r"fails over several tokens in one pass \(RuntimeError: The size of tensor a "
                       r".*: a draft's tokens cannot be verified in one pass \(use the target alone: --drafter none\)"):
        SpeculativeGenerator(model, NgramDrafter(), max_new_tokens=8)
    prompt = [5, 9, 14, 22]  # the target alone never passes several tokens over its cache: it decodes
    assert SpeculativeGenerator(model, NoDrafter(), max_new_tokens=6).generate(prompt).tokens == hf_greedy(
        model, prompt, 6)
