"""Several prompts per verify pass for every family users pair (`BatchSpeculativeGenerator`).

Encoder-decoder families (T5, mT5, UMT5, BART, Pegasus, Marian, M2M100/NLLB, mBART) and
sliding-window families (Mistral, Phi-3, Gemma 2, Gemma 3 text, StarCoder2), tiny random
models in each family's real special-token layout (tests/family_models.py). Greedy: every row
equals that prompt decoded alone and the target's own `generate()`, with rows that finish at
different rounds and prompts admitted as others leave. Sampled: every row equals the batch-1
sample of its seed (fixed gamma). Sliding-window generations run past the window, and the
window changes the output (the same weights with a window no row reaches decode otherwise).
"""

import logging

import pytest
import torch
from transformers import DynamicCache, EncoderDecoderCache

from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.batch_kv import BatchKV, feed_to, one_row
from specdec_core.decoder import initial_decoder_ids
from specdec_core.drafters import ModelDrafter, NgramDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.plan import unbatchable
from specdec_core.processing import SamplingSettings
from tests.family_models import SEQ2SEQ_FAMILIES, WINDOW, WINDOW_FAMILIES, V, family_model, with_window
from tests.numerics import assert_logits_close
from tests.tiny_models import perturbed_copy

FAMILIES = SEQ2SEQ_FAMILIES + WINDOW_FAMILIES
LENGTHS = (5, 9, 3, 12, 7, 4, 10)  # prompt lengths: rows of different lengths in one batch
GAMMA = 3


def new_tokens(family: str) -> int:
    return 12 if family in SEQ2SEQ_FAMILIES else 4 * WINDOW  # past the window, several times


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, V - 6, (n,), generator=gen).tolist() for n in LENGTHS]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """family -> (target, partly agreeing draft), saved and loaded back as users' directories are."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for family in FAMILIES:
        target = family_model(family, seed=1)
        draft = perturbed_copy(target, 0.15, seed=2)
        draft.generation_config = target.generation_config
        loaded = []
        for name, model in (("target", target), ("draft", draft)):
            model.save_pretrained(root / f"{family}-{name}")
            loaded.append(type(model).from_pretrained(root / f"{family}-{name}").eval())
        out[family] = tuple(loaded)
    return out


def hf_greedy(model, ids, n):
    """The target alone: `generate()` (a T5 decoder deeper than its encoder needs lazy caches)."""
    extra = {"cache": EncoderDecoderCache(DynamicCache(), DynamicCache())} if model.config.is_encoder_decoder else {}
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, **extra)
    return out[0, 1 if model.config.is_encoder_decoder else len(ids):].tolist()


def make_drafter(name, draft):
    return {"model": lambda: ModelDrafter(draft), "ngram": lambda: NgramDrafter(), "none": NoDrafter}[name]()


def eos_mid_output(outputs: list[list[int]], forced: set[int]) -> int:
    """A token that some outputs (not all) emit after their first tokens: as an extra EOS id it
    ends those rows early, so rows finish at different rounds."""
    for out in outputs:
        for token in out[2:]:
            if token not in forced and not all(token in o for o in outputs):
                return token
    raise AssertionError("no token to end some rows early")


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_rows_equal_batch_one_and_generate(pairs, prompts, family):
    target, draft = pairs[family]
    n = new_tokens(family)
    gc = target.generation_config
    saved = gc.eos_token_id
    before = [hf_greedy(target, p, n) for p in prompts]
    forced = {gc.forced_bos_token_id, gc.forced_eos_token_id}
    gc.eos_token_id = [*(saved if isinstance(saved, list) else [saved]), eos_mid_output(before, forced)]
    try:
        single = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=GAMMA, max_new_tokens=n)
        alone = [single.generate(p) for p in prompts]
        engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, num_speculative_tokens=GAMMA,
                                           max_new_tokens=n)
        batched = engine.generate_many([(p, 0) for p in prompts])
        reference = [hf_greedy(target, p, n) for p in prompts]
    finally:
        gc.eos_token_id = saved
    for i, (a, b, ref) in enumerate(zip(alone, batched, reference, strict=True)):
        assert b.tokens == a.tokens == ref, f"prompt {i}"
        assert b.stats.verify_steps == a.stats.verify_steps and b.stats.accepted_tokens == a.stats.accepted_tokens
        assert b.stats.finish_reason == a.stats.finish_reason
    assert len({len(b.tokens) for b in batched}) > 1  # rows finished at different rounds
    assert 0 < sum(b.stats.accepted_tokens for b in batched) < sum(b.stats.draft_tokens for b in batched)
    if family in WINDOW_FAMILIES:  # generations past the window, and the window matters
        longest = max(len(p) + len(b.tokens) for p, b in zip(prompts, batched, strict=True))
        assert longest > 2 * WINDOW
        unwindowed = with_window(target, 1000)
        assert any(hf_greedy(unwindowed, p, n) != ref for p, ref in zip(prompts, before, strict=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_sampled_rows_equal_the_batch_one_sample_of_their_seed(pairs, prompts, family):
    target, draft = pairs[family]
    n = new_tokens(family)
    sampling = SamplingSettings(temperature=1.0, top_k=20)
    single = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=GAMMA, max_new_tokens=n,
                                  sampling=sampling)
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, num_speculative_tokens=GAMMA,
                                       max_new_tokens=n, sampling=sampling)
    items = [(p, 50 + i) for i, p in enumerate(prompts)]
    batched = engine.generate_many(items)
    alone = [single.generate(p, s) for p, s in items]
    assert [b.tokens for b in batched] == [a.tokens for a in alone]
    assert [b.stats.accepted_tokens for b in batched] == [a.stats.accepted_tokens for a in alone]
    assert len({tuple(b.tokens) for b in batched}) > 1


@pytest.mark.parametrize("family", ["t5", "bart", "mistral", "gemma2"])
@pytest.mark.parametrize("drafter", ["ngram", "none"])
def test_drafters_without_a_model_batch_every_family(pairs, prompts, family, drafter):
    target, draft = pairs[family]
    n = new_tokens(family)
    engine = BatchSpeculativeGenerator(target, make_drafter(drafter, draft), batch_size=4,
                                       num_speculative_tokens=GAMMA, max_new_tokens=n)
    out = engine.generate_many([(p, 0) for p in prompts])
    assert [o.tokens for o in out] == [hf_greedy(target, p, n) for p in prompts]


def _alone_logits(model, prompt, decoder_ids, m):
    """Logits of the last m decoder tokens, the row alone, recomputed from scratch."""
    with torch.inference_mode():
        if model.config.is_encoder_decoder:
            out = model(input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([decoder_ids]))
        else:
            out = model(input_ids=torch.tensor([decoder_ids]))
    return out.logits[0, -m:].float()


@pytest.mark.parametrize("family", ["t5", "umt5", "bart", "pegasus", "marian", "m2m100", "mistral", "gemma2",
                                    "gemma3"])
def test_row_logits_by_true_positions(pairs, prompts, family):
    """Holes (rejected drafts), rows of different lengths, a row placed over a finished one,
    merging, compaction and dropping: each row's logits stay those of the row alone. Without the
    per-row positions (position embeddings, relative biases, window masks) they do not."""
    target, _ = pairs[family]
    encdec = target.config.is_encoder_decoder
    rows = [0, 2, 3]
    # (prompt, decoder tokens so far): an encoder-decoder row starts at its decoder start token.
    state = [(prompts[i], initial_decoder_ids(target, prompts[i])) for i in rows]

    def fresh(items):
        kv = BatchKV(target, len(items), 0)
        if encdec:
            kv.encode([p for p, _ in items])
        else:
            kv.forward([d[:-1] for _, d in items], logits=False)
        return kv

    kv = fresh(state)
    gen = torch.Generator().manual_seed(1)
    for step in range(8):
        blocks = [torch.randint(3, V - 6, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen).tolist()
                  for _ in state]
        feeds = [d[kv.length(b):] + blk for b, ((_, d), blk) in enumerate(zip(state, blocks, strict=True))]
        logits = kv.forward(feeds)
        for b, (p, d) in enumerate(state):
            full = d + blocks[b]
            assert_logits_close(logits[b, : len(feeds[b])], _alone_logits(target, p, full, len(feeds[b])))
            keep = len(d) + len(blocks[b]) // 2  # reject the second half of the block: holes
            kv.rollback(b, keep)
            state[b] = (p, full[: keep + 1])
        if step == 1:  # a finished row's place taken by a new prompt (a longer encoder input)
            item = (prompts[1] + prompts[6], initial_decoder_ids(target, prompts[1] + prompts[6]))
            kv.place([1], fresh([item]))
            state[1] = item
        if step == 3:  # a new row merged in, then a row leaving
            item = (prompts[4], initial_decoder_ids(target, prompts[4]))
            kv.merge(fresh([item]))
            state.append(item)
            order = kv.drop([0])
            state = [state[i] for i in order]
        if step == 5:
            kv.merge()  # (nothing to append: the holes dropped)
    assert max(kv.length(b) for b in range(kv.rows)) > WINDOW  # the windows were reached


def _fed_one_at_a_time(model, prompt, decoder_ids):
    """Logits of every decoder token fed one at a time over a growing cache, as `generate()` feeds them."""
    cache, out, logits = EncoderDecoderCache(DynamicCache(), DynamicCache()), None, []
    with torch.inference_mode():
        for token in decoder_ids:
            given = {"encoder_outputs": out.encoder_last_hidden_state} if out else {"input_ids": torch.tensor([prompt])}
            if out:
                given["encoder_outputs"] = (given["encoder_outputs"],)
            out = model(**given, decoder_input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
            logits.append(out.logits[0, -1].float())
    return torch.stack(logits)


def test_a_pad_id_inside_a_pass_moves_no_later_position(pairs, prompts):
    """M2M100/NLLB counts decoder positions from the ids, a pad id keeping the padding position.
    `generate()` feeds one token at a time, so a pad in an output moves no later token; a pass of
    several (a verify pass over drafts holding the pad, or one after an output's pad) must count
    as it does: at batch 1 (growing cache) and batched (padded rows, aligned and with holes).
    Counted over the whole pass, as the module does, the tokens after a pad sit one back."""
    target = pairs["m2m100"][0]
    pad = target.config.pad_token_id
    start = initial_decoder_ids(target, [])
    seqs = [start + [11, pad, 13, 14, pad, 20], start + [pad, 12, 15, 16, 17, pad]]
    refs = [_fed_one_at_a_time(target, p, s) for p, s in zip(prompts[:2], seqs, strict=True)]
    for prompt, seq, ref in zip(prompts[:2], seqs, refs, strict=True):
        dec = one_row(target, prompt)
        assert_logits_close(feed_to(dec, seq, len(seq)), ref)
        dec.rollback(0, 2)  # the next pass starts at a pad (row 1) or just before one (row 0)
        assert_logits_close(feed_to(dec, seq, len(seq) - 2), ref[2:])
    kv = BatchKV(target, 2, pad)
    kv.encode(prompts[:2])
    first = kv.forward([seqs[0][:4], seqs[1][:3]])  # rows aligned: no holes yet
    kv.rollback(0, 3)  # a hole in row 0: rows at their own positions
    second = kv.forward([seqs[0][3:], seqs[1][3:]])
    for b, ref in enumerate(refs):
        assert_logits_close(torch.cat([first[b][:3], second[b][: len(seqs[b]) - 3]]), ref)  # (row 0's fourth fed again)


def test_the_encoder_and_cross_attention_run_once_per_prompt(pairs, prompts):
    """Each prompt is encoded once per model, and its cross-attention keys/values are computed
    once (when it enters), not on every pass; a draft sharing the target's encoder module reuses
    the target's encoder outputs."""
    target, own = pairs["t5"]
    shared = family_model("t5", seed=3, num_decoder_layers=1)
    shared.encoder = target.encoder  # a 1-layer decoder on the target's encoder
    shared.shared = target.shared
    shared.generation_config = target.generation_config
    n = new_tokens("t5")
    reference = [hf_greedy(target, p, n) for p in prompts]
    for draft, encodes in ((own, 2 * len(prompts)), (shared, len(prompts))):
        counts = {"encoded": 0, "cross": 0}
        engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3,
                                           num_speculative_tokens=GAMMA, max_new_tokens=n)

        def count(key, counts=counts):
            def hook(module, args, output):
                rows = output if isinstance(output, torch.Tensor) else output.last_hidden_state
                counts[key] += rows.shape[0]  # rows through this module
            return hook
        handles = [target.encoder.register_forward_hook(count("encoded")),
                   target.decoder.block[0].layer[1].EncDecAttention.k.register_forward_hook(count("cross"))]
        if draft is own:
            handles.append(own.encoder.register_forward_hook(count("encoded")))
        try:
            out = engine.generate_many([(p, 0) for p in prompts])
        finally:
            for h in handles:
                h.remove()
        assert [o.tokens for o in out] == reference
        assert counts == {"encoded": encodes, "cross": len(prompts)}
        assert sum(o.stats.verify_steps for o in out) > len(prompts)  # many passes, one cross computation


def test_a_window_no_row_reaches_is_logged_and_masks_stay_plain(pairs, prompts, caplog, monkeypatch):
    target, draft = pairs["mistral"]
    built = []
    window_masks = BatchKV._window_masks

    def spy(self, *args):
        built.append(1)
        return window_masks(self, *args)
    monkeypatch.setattr(BatchKV, "_window_masks", spy)
    wide = with_window(target, 64)
    engine = BatchSpeculativeGenerator(wide, ModelDrafter(with_window(draft, 64)), batch_size=3,
                                       num_speculative_tokens=GAMMA, max_new_tokens=8)
    with caplog.at_level(logging.INFO, logger="specdec_core.batch_engine"):
        out = engine.generate_many([(p, 0) for p in prompts])
    assert "never reached" in caplog.text and not built
    assert [o.tokens for o in out] == [hf_greedy(wide, p, 8) for p in prompts]
    caplog.clear()
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=3, num_speculative_tokens=GAMMA,
                                       max_new_tokens=16)
    with caplog.at_level(logging.INFO, logger="specdec_core.batch_engine"):
        engine.generate_many([(p, 0) for p in prompts])
        shortest = min(prompts, key=len)  # rows of another length, the same outcome: not logged again
        assert len(shortest) < max(map(len, prompts))
        engine.generate_many([(shortest, 0)])
    assert caplog.text.count("can be reached") == 2 and built  # (the target's and the draft's)
    assert len(engine._noted) == 2  # (a line per length a worker met, kept: its log and memory grew)


def test_layers_that_are_not_attention_are_still_refused(pairs):
    target, _ = pairs["mistral"]
    config = type(target.config).from_dict({**target.config.to_dict(),
                                            "layer_types": ["chunked_attention", "full_attention"]})
    assert unbatchable(config) == "has chunked_attention layers"
    for family in FAMILIES:
        assert unbatchable(pairs[family][0].config) is None
    saved = target.config.layer_types if hasattr(target.config, "layer_types") else None
    target.config.layer_types = ["chunked_attention", "full_attention"]
    try:
        with pytest.raises(ValueError, match="chunked_attention.*use batch_size 1"):
            BatchSpeculativeGenerator(target, NoDrafter(), batch_size=2)
        with pytest.raises(ValueError, match="chunked_attention layers: decode it with SpeculativeGenerator"):
            BatchSpeculativeGenerator(target, NoDrafter(), batch_size=1)
    finally:
        target.config.layer_types = saved


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_prompts_encoded_in_several_passes_decode_as_alone(pairs, prompts, family):
    """A small prefill budget splits each admission's encoding into several passes (merged, or
    placed over finished rows); a draft sharing the target's encoder takes each pass's outputs."""
    target, _ = pairs[family]
    draft = family_model(family, seed=4, **({"num_decoder_layers": 1} if family == "t5" else {"decoder_layers": 1}))
    if family == "t5":
        draft.encoder = target.get_encoder()
    else:
        draft.model.encoder = target.get_encoder()
    draft.generation_config = target.generation_config
    assert draft.get_encoder() is target.get_encoder()
    n = new_tokens(family)
    calls = []
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=4, num_speculative_tokens=GAMMA,
                                       max_new_tokens=n, prefill_tokens=20)  # (its self-checks at load encode too)
    hook = target.get_encoder().register_forward_hook(lambda m, a, k, o: calls.append(k["input_ids"].shape),
                                                      with_kwargs=True)
    try:
        out = engine.generate_many([(p, 0) for p in prompts])
    finally:
        hook.remove()
    assert [o.tokens for o in out] == [hf_greedy(target, p, n) for p in prompts]
    assert sum(rows for rows, _ in calls) == len(prompts) and len(calls) > 2  # once per prompt, several passes
    assert all(rows * width <= max(20, width) for rows, width in calls)


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_short_rows_with_holes_wider_than_the_window(pairs, family):
    """Rows whose tokens are all within the window, but whose columns (holes included) span more
    than it: the model's own window would hide some of their tokens; per-row masks do not."""
    target, _ = pairs[family]
    rows = [[5, 9], [7], [11, 12]]
    kv = BatchKV(target, len(rows), 0)
    kv.forward([r[:-1] for r in rows], logits=False)
    for _ in range(3):  # 4 columns per pass, 1 token kept: holes
        feeds = [r[kv.length(b):] + [20, 21, 22] for b, r in enumerate(rows)]
        logits = kv.forward(feeds)
        for b, r in enumerate(rows):
            assert_logits_close(logits[b, : len(feeds[b])], _alone_logits(target, [], r + [20, 21, 22], len(feeds[b])))
            kv.rollback(b, len(r))
            r.append(20)
    assert kv.width > WINDOW > max(kv.length(b) for b in range(kv.rows))


@pytest.mark.parametrize("family", ["bart", "pegasus", "marian", "mbart", "led"])
def test_rows_up_to_the_end_of_the_decoders_position_table(family):
    """Rows that decode to the last position an encoder-decoder's position table holds, with
    drafts (a pass's pads reach past it: without the cap, an index error on a CPU and a device
    assert on a GPU), equal `generate()`. LED's one-token passes over holes are widened to two
    tokens (`padded_width`), whose pad at the last position reaches past it too."""
    n = 24  # positions in the decoder's table; every row decodes to its end
    key = "max_decoder_position_embeddings" if family == "led" else "max_position_embeddings"
    target = family_model(family, seed=1, **{key: n})
    target.generation_config.min_new_tokens = n - 1  # no row ends early: each reaches the table's end
    draft = perturbed_copy(target, 0.3, seed=2)
    draft.generation_config = target.generation_config
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, V - 6, (k,), generator=gen).tolist() for k in (5, 9, 3, 12, 7, 6)]
    with torch.inference_mode():
        refs = [target.generate(torch.tensor([p]), do_sample=False, num_beams=1, max_new_tokens=n - 1)[0, 1:].tolist()
                for p in prompts]
    assert {len(r) for r in refs} == {n - 1}
    engine = BatchSpeculativeGenerator(target, ModelDrafter(draft, cuda_graphs="off"), batch_size=3,
                                       num_speculative_tokens=4, max_new_tokens=n - 1, cuda_graphs="off")
    gens = engine.generate_many([(p, 0) for p in prompts])
    assert [g.tokens for g in gens] == refs
    assert sum(g.stats.accepted_tokens for g in gens) > 0


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_the_decoder_starts_where_generate_starts_it(pairs, prompts, family):
    """generate() starts the decoder from the generation config's start token, else its bos token, never from the
    model config's; a generation_config.json without the start token decoded from the config's (BART: 2, not its
    bos 0), every output other than generate()'s. A config with neither (T5's has no bos) starts from the model
    config's, where generate() stops."""
    import copy

    target, draft = (copy.deepcopy(m) for m in pairs[family])
    gc = copy.deepcopy(target.generation_config)
    gc.decoder_start_token_id = None
    target.generation_config = draft.generation_config = gc
    start = [gc.bos_token_id] if gc.bos_token_id is not None else [target.config.decoder_start_token_id]
    assert initial_decoder_ids(target, prompts[0]) == start
    if family == "bart":
        assert start != [target.config.decoder_start_token_id]
        n = new_tokens(family)
        reference = [hf_greedy(target, p, n) for p in prompts[:3]]
        alone = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=GAMMA, max_new_tokens=n)
        assert [alone.generate(p).tokens for p in prompts[:3]] == reference
        batch = BatchSpeculativeGenerator(target, ModelDrafter(draft), batch_size=2, num_speculative_tokens=GAMMA,
                                          max_new_tokens=n)
        assert [o.tokens for o in batch.generate_many([(p, 0) for p in prompts[:3]])] == reference
