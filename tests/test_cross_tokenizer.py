"""Cross-tokenizer drafting: exact (greedy identity, sampled distribution), at batch 1 and with
several rows per verify pass, aligned (an oracle draft's proposals are accepted), and cheap to keep
in step (the draft's cache is not re-run)."""

from __future__ import annotations

import logging

import pytest
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.cross_tokenizer import CrossTokenizerDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.processing import SamplingSettings
from specdec_core.text import GeneratorSpec, TextGenerator
from tests.cross_models import byte_level, oracle_lm, sentencepiece_style
from tests.test_engine_sampling import (
    N_NEW,
    chi2_pvalue,
    counted,
    draw,
    engines,
    exact_distribution,
    rejected_some,
    tiny,
)
from tests.tiny_models import make_model

PROMPTS = [
    "Speculative decoding",
    "def add(a, b):\n    return",
    "naïve café — 日本語 😀 and",
    "tabs\tand   runs   of\n\n\nwhitespace",
]
REFERENCE = (" drafts a few tokens   with a small model — naïve café 日本語 😀\n\n\tand verifies them"
             " with a large one.")


@pytest.fixture(scope="module")
def toks():
    return {"byte-420": byte_level(420), "byte-300": byte_level(300), "sp": sentencepiece_style()}


PAIRS = [("byte-420", "byte-300"), ("byte-420", "sp"), ("sp", "byte-300")]


@pytest.mark.parametrize(("target_name", "draft_name"), PAIRS)
def test_greedy_identity_with_random_models(toks, target_name, draft_name):
    """Random models: drafts are mostly rejected and the target's output is full of odd bytes
    (incomplete characters, control characters): still token for token the target's, at batch 1
    and with rows of other prompt lengths in one verify pass (each row's draft session its own)."""
    ttok, dtok = toks[target_name], toks[draft_name]
    target, draft = make_model("llama", ttok, seed=1), make_model("gpt2", dtok, seed=2)
    alone = SpeculativeGenerator(target, None, max_new_tokens=30)
    cross = SpeculativeGenerator(target, CrossTokenizerDrafter(draft, ttok, dtok), num_speculative_tokens=3,
                                 max_new_tokens=30)
    ids = [ttok(prompt)["input_ids"] for prompt in PROMPTS]
    reference = [alone.generate(i).tokens for i in ids]
    outs = [cross.generate(i) for i in ids]
    assert [o.tokens for o in outs] == reference
    assert all(o.stats.draft_steps > 0 for o in outs)
    batched = BatchSpeculativeGenerator(target, CrossTokenizerDrafter(draft, ttok, dtok), batch_size=3,
                                        num_speculative_tokens=3, max_new_tokens=30)
    rows = batched.generate_many([(i, 0) for i in ids])
    assert [r.tokens for r in rows] == reference
    assert [r.stats.draft_steps for r in rows] == [o.stats.draft_steps for o in outs]


@pytest.mark.parametrize(("target_name", "draft_name"), PAIRS)
@pytest.mark.parametrize("wrong_every", [0, 4])
def test_oracle_draft_is_aligned_and_exact(toks, target_name, draft_name, wrong_every):
    """A target and a draft that both write REFERENCE (whitespace runs, accents, CJK, an emoji:
    byte-level and byte-fallback tokens), each in its own tokens: the draft's proposals, re-encoded
    into target tokens, are accepted, and the output is the target's."""
    ttok, dtok = toks[target_name], toks[draft_name]
    prompt = PROMPTS[0]
    ids = ttok(prompt)["input_ids"]
    target = oracle_lm(ttok, prompt + REFERENCE, seed=1)
    alone = SpeculativeGenerator(target, None, max_new_tokens=80).generate(ids)
    assert ttok.decode(ids + alone.tokens, skip_special_tokens=True) == prompt + REFERENCE
    draft = oracle_lm(dtok, prompt + REFERENCE, wrong_every=wrong_every)
    out = SpeculativeGenerator(target, CrossTokenizerDrafter(draft, ttok, dtok), num_speculative_tokens=4,
                               max_new_tokens=80).generate(ids)
    assert out.tokens == alone.tokens
    s = out.stats
    # Stats in target tokens: accepted <= drafted, and every new token is an accepted draft or a
    # round's own token (the last round may end at an accepted EOS).
    assert s.accepted_tokens <= s.draft_tokens
    assert s.accepted_tokens + s.verify_steps - 1 <= s.new_tokens <= s.accepted_tokens + s.verify_steps
    if wrong_every == 0:
        assert s.acceptance_rate > 0.85, s
        assert s.verify_steps < len(alone.tokens) / 2.5
    else:
        assert 0.2 < s.acceptance_rate < 1.0, s


def test_draft_text_ending_inside_a_target_token_is_not_proposed(toks):
    """The draft is stopped after a few of its own tokens, so its text often ends inside a target
    token (the target has "model", the draft has "m" "od" "el"): the proposals are the
    reference's own target tokens, never a cut piece of one. (Where the committed tokens end
    inside a word the target would have merged, the continuation's own encoding is proposed: it
    spells the right text, in tokens the target may not choose.)"""
    ttok, dtok = toks["byte-420"], toks["byte-300"]
    full = ttok(PROMPTS[0] + REFERENCE)["input_ids"]
    draft = oracle_lm(dtok, PROMPTS[0] + REFERENCE)
    n_prompt = len(ttok(PROMPTS[0])["input_ids"])
    reference = ttok.decode(full)
    proposed = exact = cuts = 0
    for steps in (2, 4, 6):
        drafter = CrossTokenizerDrafter(draft, ttok, dtok, max_draft_steps=steps)
        for cut in range(n_prompt, len(full) - 4):
            session = drafter.start(full[:n_prompt], full[:n_prompt], None)
            props = session.propose(full[:cut], 4).tokens
            assert reference.startswith(ttok.decode(full[:cut] + props).rstrip("\ufffd")), (steps, cut)
            exact += props == full[cut : cut + len(props)]
            proposed += len(props)
            cuts += 1
    assert proposed > len(full)  # most cuts get proposals
    assert exact >= 0.9 * cuts


def test_draft_cache_follows_without_rerunning_its_prefix(toks):
    """Each round feeds the draft only the tokens past what its cache still holds: over a whole
    generation the draft is fed about its prompt once plus a few tokens per round, far fewer
    than re-running its prefix each round would cost."""
    ttok, dtok = toks["byte-420"], toks["byte-300"]
    prompt = "Speculative decoding drafts a few tokens with a small model and verifies them with a large one."
    reference = prompt + REFERENCE
    ids = ttok(prompt)["input_ids"]
    target = oracle_lm(ttok, reference, seed=1)
    draft = oracle_lm(dtok, reference, wrong_every=5)
    drafter = CrossTokenizerDrafter(draft, ttok, dtok)
    sessions = []
    start = drafter.start
    drafter.start = lambda *a: sessions.append(start(*a)) or sessions[-1]
    out = SpeculativeGenerator(target, drafter, num_speculative_tokens=4, max_new_tokens=80).generate(ids)
    session = sessions[0]
    draft_prompt = len(dtok(prompt)["input_ids"])
    rounds = out.stats.verify_steps
    assert session.full_syncs == 0
    # Prompt once, each drafting step one token, plus a few re-fed tokens per round (the model counts what it is fed).
    assert draft.fed <= draft_prompt + session.steps + 3 * rounds
    assert draft.fed < rounds * draft_prompt / 3


def _char_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.mark.slow
def test_sampling_matches_target_distribution():
    """Chi-square on a 6-token target vocabulary ("a", "b", "c", "ab", "ba", "ca") with a draft
    over 3 characters: the cross-tokenizer proposals, verified with the deterministic-proposal
    rule, give exactly the target's distribution."""
    ttok = _char_tokenizer({"a": 0, "b": 1, "c": 2, "ab": 3, "ba": 4, "ca": 5},
                           [("a", "b"), ("b", "a"), ("c", "a")])
    dtok = _char_tokenizer({"a": 0, "b": 1, "c": 2}, [])
    target = tiny("llama", seed=0, std=0.8)
    torch.manual_seed(3)
    draft = make_model("llama", dtok, seed=3, layers=1, hidden=32, init_std=0.8)
    sampling = SamplingSettings(temperature=1.0)
    outs = draw(engines(target, lambda: CrossTokenizerDrafter(draft, ttok, dtok), num_speculative_tokens=2,
                        max_new_tokens=N_NEW, sampling=sampling))
    counts = counted(outs)
    assert chi2_pvalue(counts, exact_distribution(target, sampling)) > 1e-3
    # Power: the same samples reject a nearby model's distribution.
    other = tiny("llama", seed=1, std=0.8)
    assert chi2_pvalue(counts, exact_distribution(other, sampling)) < 1e-6
    assert rejected_some(outs)


def test_text_generator_decides_cross_tokenizer_and_logs_it(tmp_path, toks, caplog):
    ttok, dtok = toks["byte-420"], toks["sp"]
    for name, tok, seed in (("target", ttok, 1), ("draft", dtok, 2)):
        make_model("llama", tok, seed=seed).save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    spec = GeneratorSpec(str(tmp_path / "target"), str(tmp_path / "draft"), max_new_tokens=12)
    with caplog.at_level(logging.INFO, logger="specdec_core.text"):
        gen = TextGenerator.load(spec)
    assert isinstance(gen.engine.drafter, CrossTokenizerDrafter)
    assert "cross-tokenizer drafting" in caplog.text
    alone = TextGenerator.load(GeneratorSpec(str(tmp_path / "target"), drafter="none", max_new_tokens=12))
    # The adaptive gamma times this drafter too (one target token proposed per draft "step").
    adaptive = TextGenerator.load(GeneratorSpec(str(tmp_path / "target"), str(tmp_path / "draft"),
                                                max_new_tokens=12, gamma_policy="adaptive"))
    expected = [alone.generate(prompt)["token_ids"] for prompt in PROMPTS]
    for prompt, tokens in zip(PROMPTS, expected, strict=True):
        assert gen.generate(prompt)["token_ids"] == tokens
        assert adaptive.generate(prompt)["token_ids"] == tokens
    assert adaptive.engine.gamma_policy.costs.c > 0.01  # timed as a model, not as a free lookup
    # Batched too, its costs timed at the batch's width: each row's drafting, one row after another.
    batched = TextGenerator.load(GeneratorSpec(str(tmp_path / "target"), str(tmp_path / "draft"), max_new_tokens=12,
                                               gamma_policy="adaptive", batch_size=2))
    assert isinstance(batched.batch_engine.drafter, CrossTokenizerDrafter)
    assert [r["token_ids"] for r in batched.generate_batch([(p, 0) for p in PROMPTS])] == expected
    assert batched.batch_engine.gamma_policy.costs.c > 0.01  # not a free lookup's
    # An int8 draft batches too: each row drafts in its own one-row session.
    int8 = TextGenerator.load(GeneratorSpec(str(tmp_path / "target"), str(tmp_path / "draft"), max_new_tokens=12,
                                            draft_dtype="int8", batch_size=2))
    rows = int8.generate_batch([(p, 0) for p in PROMPTS])
    assert [r["token_ids"] for r in rows] == expected
    assert sum(r["draft_tokens"] for r in rows) > 0


def test_same_tokenizer_pair_still_uses_the_model_drafter(saved_pairs, caplog):
    from specdec_core.drafters import ModelDrafter

    target, draft = saved_pairs["llama"]
    with caplog.at_level(logging.INFO, logger="specdec_core.text"):
        gen = TextGenerator.load(GeneratorSpec(str(target), str(draft), max_new_tokens=4))
    assert type(gen.engine.drafter) is ModelDrafter
    assert "same-tokenizer drafting" in caplog.text


def test_encoder_decoder_pair_with_different_tokenizers(toks):
    """Falls out of the design: the draft encodes the prompt's text with its own tokenizer."""
    ttok, dtok = toks["byte-420"], toks["byte-300"]
    target, draft = make_model("bart", ttok, seed=1), make_model("bart", dtok, seed=2)
    alone = SpeculativeGenerator(target, None, max_new_tokens=20)
    cross = SpeculativeGenerator(target, CrossTokenizerDrafter(draft, ttok, dtok), num_speculative_tokens=3,
                                 max_new_tokens=20)
    for prompt in PROMPTS[:2]:
        ids = ttok(prompt)["input_ids"]
        out = cross.generate(ids)
        assert out.tokens == alone.generate(ids).tokens
        assert out.stats.draft_steps > 0
    batched = BatchSpeculativeGenerator(target, CrossTokenizerDrafter(draft, ttok, dtok), batch_size=2,
                                        num_speculative_tokens=3, max_new_tokens=20)
    ids = [ttok(p)["input_ids"] for p in PROMPTS]
    assert [r.tokens for r in batched.generate_many([(i, 0) for i in ids])] == [alone.generate(i).tokens for i in ids]
    # A prompt longer in the draft's tokens than its encoder's positions: the draft reads what its
    # encoder takes (its index ran past the positions: the row failed).
    config = make_model("bart", dtok, seed=2).config
    config.max_position_embeddings = 24
    torch.manual_seed(2)
    short = type(draft)(config).eval()
    long_prompt = "naïve café, 日本語のテキスト " * 3
    ids = ttok(long_prompt)["input_ids"]
    assert len(dtok(long_prompt)["input_ids"]) > 24
    out = SpeculativeGenerator(target, CrossTokenizerDrafter(short, ttok, dtok), num_speculative_tokens=3,
                               max_new_tokens=20).generate(ids)
    assert out.tokens == alone.generate(ids).tokens and out.stats.draft_steps > 0
    # A prompt of special tokens only has no text for the draft's encoder (an empty input: the row failed)
    ids = ttok("</s>")["input_ids"]
    assert dtok(ttok.decode(ids, skip_special_tokens=True))["input_ids"] == []
    assert cross.generate(ids).tokens == alone.generate(ids).tokens
    assert batched.generate_many([(ids, 0), (ttok(PROMPTS[0])["input_ids"], 0)])[0].tokens == alone.generate(ids).tokens


@pytest.fixture(scope="module")
def cross_pair(tmp_path_factory, toks):
    root = tmp_path_factory.mktemp("cross")
    for name, tok, seed in (("target", toks["byte-420"], 1), ("draft", toks["sp"], 2)):
        make_model("llama", tok, seed=seed).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root / "target", root / "draft"


def test_preflight_decides_and_logs_the_mode(tmp_path, cross_pair, saved_pairs, caplog):
    from pipeline.preflight import preflight
    from pipeline.run import parse_options
    from tests.test_pipeline import write_prompts

    src = write_prompts(tmp_path / "p.parquet", [{"id": "1", "prompt": "hi"}])

    def opts(target, draft, *extra):
        return parse_options(["--input", src, "--output", str(tmp_path / "o/gens"), "--target_model", str(target),
                              "--draft_model", str(draft), *extra])

    with caplog.at_level(logging.INFO, logger="pipeline.preflight"):
        preflight(opts(*cross_pair))
        assert "cross-tokenizer drafting" in caplog.text
        caplog.clear()
        preflight(opts(*saved_pairs["llama"]))
        assert "same-tokenizer drafting" in caplog.text
        caplog.clear()
        preflight(opts(*cross_pair, "--batch_size", "2"))  # rows drafted each in its own session, verified together
        assert "cross-tokenizer drafting" in caplog.text
        # Nor does its int8 draft meet a batch: one row per draft pass (a same-tokenizer one is refused).
        preflight(opts(*cross_pair, "--batch_size", "2", "--draft_dtype", "int8"))


def test_a_model_with_fewer_rows_than_its_tokenizer_is_refused_before_any_work(tmp_path, toks, cross_pair, capsys):
    """bart-large-cnn's layout (50,264 rows, 50,265 tokens): re-encoded text may hold any token, so a cross-tokenizer
    pair with such a target is refused, in one line before any work (the workers' load refused it in a traceback)."""
    from pipeline.run import main
    from tests.test_pipeline import write_prompts

    tok = toks["byte-420"]
    short = make_model("llama", tok, seed=1)
    short.resize_token_embeddings(len(tok) - 20)
    short.save_pretrained(tmp_path / "short")
    tok.save_pretrained(tmp_path / "short")
    src = write_prompts(tmp_path / "p.parquet", [{"id": "1", "prompt": "hi"}])
    capsys.readouterr()
    assert main(["--input", src, "--output", str(tmp_path / "o/gens"), "--target_model", str(tmp_path / "short"),
                 "--draft_model", str(cross_pair[1])]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --draft_model") and "\n" not in err, err
    assert f"the target's output layer has {len(tok) - 20} rows for a {len(tok)}-token vocabulary" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_beam_job_with_a_cross_tokenizer_pair_writes_the_targets_rows(tmp_path, cross_pair):
    """pipeline.run on a tiny Parquet (DirectRunner): the cross-tokenizer pair writes exactly the
    rows the target alone writes, one row at a time and batched."""
    from tests.test_pipeline import GOOD, run_job, write_prompts

    prompts = GOOD + PROMPTS
    src = write_prompts(tmp_path / "p.parquet", [{"id": f"g{i}", "prompt": p} for i, p in enumerate(prompts)])
    target, draft = cross_pair
    cross, failed = run_job(tmp_path, target, draft, prompts=src, name="cross")
    batched, failed_batched = run_job(tmp_path, target, draft, "--batch_size", "3", prompts=src, name="batched")
    alone, _ = run_job(tmp_path, target, None, "--drafter", "none", prompts=src, name="alone")
    assert failed.num_rows == failed_batched.num_rows == 0 and cross.num_rows == len(prompts)

    def rows(t):
        return {r["id"]: (r["generation"], r["new_tokens"], r["finish_reason"]) for r in t.to_pylist()}

    assert rows(cross) == rows(batched) == rows(alone)
    assert sum(cross["draft_tokens"].to_pylist()) > 0
    assert batched.sort_by("id")["draft_tokens"].to_pylist() == cross.sort_by("id")["draft_tokens"].to_pylist()


def test_tune_takes_a_cross_tokenizer_draft_and_batches_it(tmp_path, cross_pair, monkeypatch):
    """pipeline.tune loads a draft with another tokenizer as the job does, keeps the target's
    greedy output, and, when that draft is its batch-1 choice, measures it at the batch sizes asked
    for too."""
    import json

    from pipeline.tune import tuner as tune
    from tests.test_pipeline import write_prompts

    real = tune.best_setting

    def draft_wins_at_batch_1(rows, key):  # the random draft rarely wins on its own merits
        return next(r for r in rows if r["drafter"] == "model") if key == "measured" else real(rows, key)

    monkeypatch.setattr(tune, "best_setting", draft_wins_at_batch_1)

    src = write_prompts(tmp_path / "p.parquet", [{"id": str(i), "prompt": p} for i, p in enumerate(PROMPTS)])
    target, draft = cross_pair
    out = tmp_path / "tune.json"
    assert tune.main(["--input", src, "--target_model", str(target), "--draft_model", str(draft), "--no_ngram",
                      "--sample", "3", "--max_new_tokens", "8", "--max_gamma", "2", "--verify", "0",
                      "--batch_sizes", "1,2", "--output_json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert all(r["equal_to_target"] == 3 for r in res["runs"])
    assert {r["batch_size"] for r in res["throughput"] if r["drafter"] == "model"} == {1, 2}
    assert all(r["equal_to_target"] == 3 for r in res["throughput"])
