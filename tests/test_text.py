"""Prompt checks, pair checks and loading from saved directories."""

import dataclasses
import re
import shutil

import pytest
import torch

from specdec_core.loading import IncompatiblePairError, item_seed
from specdec_core.text import (
    EmptyPrompt,
    GeneratorSpec,
    InvalidCharacters,
    InvalidPromptType,
    InvalidUtf8,
    NotUtf8,
    NullPrompt,
    PromptError,
    PromptTooLong,
    TextGenerator,
    check_prompt,
)
from tests.tiny_models import build_tokenizer, make_model


@pytest.mark.parametrize(
    ("value", "error"),
    [(None, NullPrompt), (3, InvalidPromptType), (b"bytes", InvalidPromptType), ("", EmptyPrompt),
     ("  \n\t", EmptyPrompt), ("a\x00b", InvalidCharacters), ("bell\x07", InvalidCharacters),
     ("a\ud800b", InvalidCharacters),  # (a lone surrogate: the tokenizer would raise a TypeError)
     (NotUtf8(("prompt",), "caf\ufffd"), InvalidUtf8)],  # (the pipeline fails these rows first; the API too)
)
def test_bad_prompts_raise_a_named_error(value, error):
    with pytest.raises(error):
        check_prompt(value)


def test_ordinary_text_passes():
    assert check_prompt("tabs\tand\nnewlines ok, ünïcødé too") == "tabs\tand\nnewlines ok, ünïcødé too"
    # whitespace among the control characters: a scraped page's form feeds and NEL (they failed the row)
    for text in ("page one\x0cpage two", "line\x85next", "v\x0btab", "record\x1eseparated"):
        assert check_prompt(text) == text


def test_item_seed_depends_on_seed_and_id_only():
    assert item_seed(0, "a") == item_seed(0, "a")
    assert len({item_seed(0, "a"), item_seed(1, "a"), item_seed(0, "b"), item_seed(0, 1)}) == 4
    assert 0 <= item_seed(123, "x") < 2**63


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_text_generator_from_saved_dirs_equals_generate(kind, saved_pairs):
    target_dir, draft_dir = saved_pairs[kind]
    gen = TextGenerator.load(GeneratorSpec(str(target_dir), str(draft_dir), max_new_tokens=12))
    out = gen.generate("The quick brown", seed=5)
    ids = gen.tokenizer("The quick brown").input_ids
    ref = gen.engine.target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12)[0].tolist()
    ref = ref[1:] if kind == "t5" else ref[len(ids):]
    assert out["token_ids"] == ref
    assert out["generation"] == gen.tokenizer.decode(ref, skip_special_tokens=True)
    assert out["new_tokens"] == 12 and out["seed"] == 5 and out["finish_reason"] == "length"
    assert out["verify_steps"] <= 12 and out["draft_tokens"] >= out["accepted_tokens"]


def test_a_batched_generator_makes_static_caches_for_its_batches_only(saved_pairs):
    """--batch_size > 1 with static caches (--cuda_graphs on: eagerly on a CPU): the batch engine's
    slots for the target and the draft, and no one-item static cache for either, which a batched
    worker never decodes through (each would be self-checked at load). Outputs equal batch 1's."""
    target_dir, draft_dir = saved_pairs["llama"]
    spec = GeneratorSpec(str(target_dir), str(draft_dir), max_new_tokens=8, cuda_graphs="on")
    batched = TextGenerator.load(dataclasses.replace(spec, batch_size=2))
    assert batched.engine.static is None and batched.engine.drafter.static is None
    assert len(batched.batch_engine.slots) == 2 and None not in batched.batch_engine.slots.values()
    one = TextGenerator.load(spec)
    assert one.engine.static is not None and one.engine.drafter.static is not None
    prompts = ["The quick brown", "Summarize: the committee met on"]
    assert ([o["token_ids"] for o in batched.generate_batch([(p, 0) for p in prompts])]
            == [one.generate(p)["token_ids"] for p in prompts])


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_failed_call_checks_the_device_while_it_holds_the_engine(saved_pairs, monkeypatch, batch_size):
    """The device check after a call raised launches a kernel and synchronizes: under the engine's lock, which another
    thread's graph capture holds (a capture forbids other threads' launches), at batch 1 and batched; the row's own
    error is then kept, and a batched call retried in halves."""
    from specdec_core import text

    target_dir, draft_dir = saved_pairs["llama"]
    gen = TextGenerator.load(GeneratorSpec(str(target_dir), str(draft_dir), max_new_tokens=4, batch_size=batch_size))
    engine = gen.batch_engine if batch_size > 1 else gen.engine
    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(engine, "generate_many" if batch_size > 1 else "generate", broken)
    held = []
    monkeypatch.setattr(text, "check_device", lambda e, devices: held.append(gen._lock.locked()))
    if batch_size > 1:
        rows = gen.generate_batch([("The quick brown", 0), ("Hello", 0)])
        assert [r["error_type"] for r in rows] == ["RuntimeError"] * 2
    else:
        with pytest.raises(RuntimeError, match="launch failure"):
            gen.generate("The quick brown")
    assert held and all(held), held


def test_prompt_longer_than_context_fails_the_row(saved_pairs, caplog):
    from transformers.utils import logging as hf_logging

    target_dir, draft_dir = saved_pairs["llama"]  # 256 positions
    gen = TextGenerator.load(GeneratorSpec(str(target_dir), str(draft_dir), max_new_tokens=16))
    hf_logging.enable_propagation()
    try:
        with pytest.raises(PromptTooLong, match="256-position context"):
            gen.generate("word " * 300)
    finally:
        hf_logging.disable_propagation()
    # past the tokenizer's 512 tokens too: its warning ("will result in indexing errors") misleads
    assert "indexing errors" not in caplog.text


def test_a_prompt_that_leaves_no_room_for_max_new_tokens_fails_the_row(saved_pairs):
    """The prompt and max_new_tokens must fit the context together: the prompt alone fitting is not enough."""
    target_dir, draft_dir = saved_pairs["llama"]  # 256 positions
    gen = TextGenerator.load(GeneratorSpec(str(target_dir), str(draft_dir), max_new_tokens=16))
    by_length = {len(gen.tokenizer(" a" * n, verbose=False)["input_ids"]): " a" * n for n in range(200, 260)}
    assert len(gen.encode(by_length[240])) == 240  # (" a" is one token: every length is there)
    with pytest.raises(PromptTooLong, match="with max_new_tokens=16"):
        gen.encode(by_length[241])


def test_a_draft_of_fewer_positions_drafts_while_a_row_fits_them(saved_pairs, tmp_path):
    """A draft of the target's tokenizer with fewer positions (64 here, the target's 256) drafts
    while a row fits them and leaves the rest to the target: rows past them decode as the target
    alone does (they failed as PromptTooLong), and only rows past the target's own fail."""
    import json
    import shutil

    target_dir, draft_dir = saved_pairs["llama"]
    short = tmp_path / "short-draft"
    shutil.copytree(draft_dir, short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    gen = TextGenerator.load(GeneratorSpec(str(target_dir), str(short), max_new_tokens=16,
                                           num_speculative_tokens=4, gamma_policy="fixed"))
    alone = TextGenerator.load(GeneratorSpec(str(target_dir), drafter="none", max_new_tokens=16))
    seen = []
    for words in (10, 18, 25):  # ends before, across and after the draft's 64 positions
        prompt = "word " * words
        out, want = gen.generate(prompt), alone.generate(prompt)
        assert out["token_ids"] == want["token_ids"]
        drafted = out["prompt_tokens"] < 64 - 1  # room for a draft in the first round
        assert (out["draft_tokens"] > 0) == drafted, (out["prompt_tokens"], out["draft_tokens"])
        seen.append(out["prompt_tokens"])
    assert min(seen) + 16 < 64 < max(seen)
    with pytest.raises(PromptTooLong, match="exceeds the model's 256-position context"):
        gen.generate("word " * 300)


def test_an_encoder_decoder_prompt_is_held_to_its_encoders_positions(tmp_path):
    """LED reads 16384-token documents and writes at most 1024 tokens: a prompt longer than the
    decoder's table but within the encoder's is decoded, one past the encoder's fails its row,
    and more new tokens than the decoder's table fail too (each with the limit named)."""
    from tests.family_models import save_family

    led = save_family("led", tmp_path / "led", max_encoder_position_embeddings=128,
                      max_decoder_position_embeddings=24)
    gen = TextGenerator.load(GeneratorSpec(str(led), drafter="none", max_new_tokens=8))
    assert len(gen.tokenizer("word " * 12).input_ids) > 24
    assert gen.generate("word " * 12, seed=0)["new_tokens"] > 0
    with pytest.raises(PromptTooLong, match="encoder's 128-position context"):
        gen.generate("word " * 50)
    gen = TextGenerator.load(GeneratorSpec(str(led), drafter="none", max_new_tokens=30))
    with pytest.raises(PromptTooLong, match="max_new_tokens=30 exceeds the decoder's 24-position context"):
        gen.generate("word")
    assert TextGenerator.load(GeneratorSpec(str(led), drafter="none", max_new_tokens=24)).encode("word")  # all 24


def test_draft_with_another_vocabulary_drafts_across_tokenizers(saved_pairs, tmp_path):
    from specdec_core.cross_tokenizer import CrossTokenizerDrafter

    target_dir, _ = saved_pairs["llama"]
    other_tok = build_tokenizer(vocab_size=300)
    other = make_model("llama", other_tok, seed=3)
    other.save_pretrained(tmp_path / "other")
    other_tok.save_pretrained(tmp_path / "other")
    gen = TextGenerator.load(GeneratorSpec(str(target_dir), str(tmp_path / "other")))
    assert isinstance(gen.engine.drafter, CrossTokenizerDrafter)


def test_causal_draft_for_seq2seq_target_is_refused(saved_pairs):
    with pytest.raises(IncompatiblePairError, match="encoder-decoder"):
        TextGenerator.load(GeneratorSpec(str(saved_pairs["t5"][0]), str(saved_pairs["llama"][1])))


def test_a_draft_with_more_output_rows_than_the_target_is_refused(saved_pairs, tmp_path):
    """One tokenizer: a draft padded to more rows could propose a token the target cannot embed
    (fewer rows, as Qwen2.5-0.5B's under 7B's, are fine)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir, draft_dir = saved_pairs["llama"]
    draft = AutoModelForCausalLM.from_pretrained(draft_dir)
    draft.resize_token_embeddings(draft.config.vocab_size + 64)
    draft.save_pretrained(tmp_path / "wide")
    AutoTokenizer.from_pretrained(draft_dir).save_pretrained(tmp_path / "wide")
    with pytest.raises(IncompatiblePairError, match=r"the draft's output layer has \d+ rows, the target's \d+"):
        TextGenerator.load(GeneratorSpec(str(target_dir), str(tmp_path / "wide")))
    # and the job's preflight, before any work (on Dataflow a load's refusal comes from every worker)
    from pipeline.errors import JobConfigError
    from pipeline.options import SpecDecOptions
    from pipeline.preflight import preflight
    from tests.test_pipeline import write_prompts

    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "Hello"}])
    with pytest.raises(JobConfigError, match=r"the draft's output layer has \d+ rows, the target's \d+"):
        preflight(SpecDecOptions(["--input", str(src), "--output", str(tmp_path / "out" / "gens"),
                                  "--target_model", str(target_dir), "--draft_model", str(tmp_path / "wide")]))


@pytest.mark.parametrize("drafter", ["model", "none"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_prompt_holding_a_token_the_target_does_not_embed_fails_alone(saved_pairs, tmp_path, drafter, batch_size):
    """A tokenizer with tokens beyond the models' embeddings (bart-large-cnn's <mask>; tokens
    added without resizing): the pair loads (a model draft's pair was refused), a prompt holding
    such a token fails as TokenNotEmbedded (it failed with IndexError), the others equal the target
    alone's `generate()`."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(saved_pairs["llama"][0])
    tok.add_special_tokens({"additional_special_tokens": ["<|a|>"]})
    target_dir, draft_dir = tmp_path / "target", tmp_path / "draft"  # both with that tokenizer, as such pairs come
    for src, dest in zip(saved_pairs["llama"], (target_dir, draft_dir), strict=True):
        shutil.copytree(src, dest)
        tok.save_pretrained(dest)
    rows = AutoConfig.from_pretrained(target_dir).vocab_size
    assert rows < len(tok)
    gen = TextGenerator.load(GeneratorSpec(str(target_dir), str(draft_dir) if drafter == "model" else None,
                                           drafter=drafter, max_new_tokens=6, batch_size=batch_size))
    prompts = ["hello world", "hello <|a|> world", "the quick fox"]
    if batch_size > 1:
        out = gen.generate_batch([(p, 0) for p in prompts])
    else:
        out = []
        for p in prompts:
            try:
                out.append(gen.generate(p))
            except PromptError as e:
                out.append({"error_type": type(e).__name__, "error_message": str(e)})
    assert out[1]["error_type"] == "TokenNotEmbedded"
    assert f"token {rows} ('<|a|>')" in out[1]["error_message"] and f"{rows} rows" in out[1]["error_message"]
    model = AutoModelForCausalLM.from_pretrained(target_dir)
    for i in (0, 2):
        ids = tok(["hello world", "", "the quick fox"][i], return_tensors="pt").input_ids
        want = model.generate(ids, do_sample=False, max_new_tokens=6)[0, ids.shape[1]:].tolist()
        assert out[i]["token_ids"] == want
    # The target embeds the token and its draft not: the prompt decodes as the target alone's (the draft reads the
    # token as its last row, a worse guess); it failed as TokenNotEmbedded, naming the draft.
    model.resize_token_embeddings(len(tok))
    model.save_pretrained(target_dir)
    gen = TextGenerator.load(GeneratorSpec(str(target_dir), str(draft_dir) if drafter == "model" else None,
                                           drafter=drafter, max_new_tokens=6, batch_size=batch_size))
    out = gen.generate_batch([(prompts[1], 0)])[0] if batch_size > 1 else gen.generate(prompts[1])
    ids = tok(prompts[1], return_tensors="pt").input_ids
    assert out["token_ids"] == model.generate(ids, do_sample=False, max_new_tokens=6)[0, ids.shape[1]:].tolist()


def test_a_model_without_findable_input_embeddings_still_loads(saved_pairs, monkeypatch):
    """The prompt-id check reads the embeddings' rows where transformers finds them; a target
    where it cannot (some remote-code models raise) still decodes alone, its prompts unchecked."""
    from transformers import LlamaForCausalLM

    def missing(self):
        raise NotImplementedError

    monkeypatch.setattr(LlamaForCausalLM, "get_input_embeddings", missing)
    target_dir, _ = saved_pairs["llama"]
    gen = TextGenerator.load(GeneratorSpec(str(target_dir), None, drafter="none", max_new_tokens=4))
    assert gen.embedded is None and len(gen.generate("hello world")["token_ids"]) == 4


def test_draft_dir_without_tokenizer_uses_the_targets(saved_pairs, tmp_path):
    target_dir, draft_dir = saved_pairs["gpt2"]
    bare = tmp_path / "bare-draft"
    shutil.copytree(draft_dir, bare)
    for f in bare.glob("tokenizer*"):
        f.unlink()
    gen = TextGenerator.load(GeneratorSpec(str(target_dir), str(bare), max_new_tokens=4))
    assert gen.generate("Hello")["new_tokens"] == 4


def test_beam_search_in_a_generation_config_is_said_at_load(saved_pairs, tmp_path, caplog):
    """A checkpoint whose generation config asks for beam search (translation and summarization
    models often do): the job decodes greedily (or samples) and the log says so, once, at load."""
    import json
    import logging

    target_dir, draft_dir = saved_pairs["bart"]
    beams = tmp_path / "beams"
    shutil.copytree(target_dir, beams)
    config = json.loads((beams / "generation_config.json").read_text())
    (beams / "generation_config.json").write_text(json.dumps({**config, "num_beams": 4, "min_length": 3}))
    with caplog.at_level(logging.WARNING, logger="specdec_core"):
        TextGenerator.load(GeneratorSpec(str(beams), str(draft_dir), max_new_tokens=6))
    said = [r.getMessage() for r in caplog.records if "num_beams=4" in r.getMessage()]
    assert len(said) == 1 and "min_length" not in said[0] and "one beam" in said[0], said  # min_length is applied


def test_a_generation_config_that_samples_is_said_at_load_with_the_flags_that_sample_as_it_does(saved_pairs, tmp_path,
                                                                                              caplog):
    """Chat checkpoints often ship do_sample=True: their generate() samples by default, the job decodes greedily
    unless told. The log names the flags that give generate()'s default sampling (its top-k of 50 included)."""
    import json
    import logging

    from transformers import GenerationConfig

    from specdec_core.processing import config_sampling

    target_dir, draft_dir = saved_pairs["llama"]
    sampling = tmp_path / "sampling"
    shutil.copytree(target_dir, sampling)
    config = json.loads((sampling / "generation_config.json").read_text())
    (sampling / "generation_config.json").write_text(json.dumps({**config, "do_sample": True, "temperature": 0.6,
                                                                 "top_p": 0.9}))
    said = {}
    for temperature in (0.0, 0.7):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="specdec_core"):
            TextGenerator.load(GeneratorSpec(str(sampling), str(draft_dir), max_new_tokens=4, temperature=temperature))
        said[temperature] = [r.getMessage() for r in caplog.records if "config samples" in r.getMessage()]
    assert len(said[0.0]) == 1 and "(--temperature 0.6 --top_k 50 --top_p 0.9 samples as" in said[0.0][0], said
    assert said[0.7] == []  # (the job samples as told)
    assert GenerationConfig._get_default_generation_params()["top_k"] == 50  # generate()'s, where a config is silent
    assert config_sampling(GenerationConfig(do_sample=True, top_k=0, top_p=1.0)) == "--temperature 1.0"
    assert config_sampling(GenerationConfig(temperature=0.6, top_p=0.9)) == ""  # (greedy: no do_sample)


def test_spec_validation():
    with pytest.raises(ValueError, match="needs --draft_model"):
        GeneratorSpec("t", drafter="model")
    with pytest.raises(ValueError, match="--drafter"):
        GeneratorSpec("t", drafter="beam")
    with pytest.raises(ValueError, match="adaptive needs --temperature 0"):
        GeneratorSpec("t", drafter="none", temperature=0.7, gamma_policy="adaptive")
    with pytest.raises(ValueError, match="top_p"):
        GeneratorSpec("t", drafter="none", temperature=1.0, top_p=1.5)
    with pytest.raises(ValueError, match="--draft_dtype 'fp8'"):
        GeneratorSpec("t", "d", draft_dtype="fp8")
    with pytest.raises(ValueError, match="int8 is dynamic quantization, CPU only"):
        GeneratorSpec("t", "d", draft_dtype="int8", device="cuda")
    with pytest.raises(ValueError, match="need 1 <= --ngram_min_size <= --ngram_max_size"):
        GeneratorSpec("t", drafter="ngram", ngram_min_size=3, ngram_max_size=2)
    GeneratorSpec("t", drafter="ngram", ngram_min_size=2, ngram_max_size=2)  # (one size: allowed)


@pytest.mark.parametrize("draft_dtype", ["int8", "bfloat16"])
def test_draft_dtype_changes_the_draft_only(draft_dtype, saved_pairs):
    """--draft_dtype: the draft is quantized (or cast), the target is not, and the greedy output
    is still the target's own."""
    target_dir, draft_dir = saved_pairs["llama"]
    gen = TextGenerator.load(GeneratorSpec(str(target_dir), str(draft_dir), max_new_tokens=12,
                                           draft_dtype=draft_dtype))
    draft = gen.engine.drafter.model
    if draft_dtype == "int8":
        assert any("quantized.dynamic" in type(m).__module__ for m in draft.modules())
    else:
        assert next(draft.parameters()).dtype == torch.bfloat16
    assert next(gen.engine.target.parameters()).dtype == torch.float32
    out = gen.generate("The quick brown", seed=5)
    ids = gen.tokenizer("The quick brown").input_ids
    ref = gen.engine.target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12)[0, len(ids):]
    assert out["token_ids"] == ref.tolist()
    assert out["draft_tokens"] > 0


@pytest.mark.parametrize(
    ("value", "error", "needle"),
    [([], "EmptyConversation", "no messages"),
     ([{"role": "user", "content": "  "}], "EmptyConversation", "empty"),
     ([{"role": "bot", "content": "hi"}], "UnknownRole", "role 'bot'"),
     ([{"role": "user"}], "InvalidMessage", "has no content"),
     ([{"role": "user", "content": 3}], "InvalidMessage", "content is int"),
     (["hi"], "InvalidMessage", "message 1 is str"),
     ([{"role": "user", "content": "a\x07"}], "InvalidCharacters", "message 1 (user)")],
)
def test_bad_conversations_raise_a_named_error(value, error, needle):
    from specdec_core import text

    with pytest.raises(getattr(text, error), match=re.escape(needle)):
        text.check_conversation(value)


def test_a_conversation_with_an_empty_message_among_others_passes():
    from specdec_core.text import check_conversation

    messages = [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}]
    assert check_conversation(messages) == messages


def test_chat_prompt_ids_are_apply_chat_template_s(tmp_path):
    """Text prompts with the flag, conversations without it; the system prompt goes first unless the
    conversation brings its own; the saved list of end tokens survives loading."""
    from tests.tiny_models import save_chat_pair

    target, draft = save_chat_pair(tmp_path)
    gen = TextGenerator.load(GeneratorSpec(str(target), str(draft), max_new_tokens=8, chat_template=True,
                                           system_prompt="Be brief."))
    tok = gen.tokenizer

    def hf(messages):
        return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"]

    system = {"role": "system", "content": "Be brief."}
    assert gen.encode("Hello") == hf([system, {"role": "user", "content": "Hello"}])
    own = [{"role": "system", "content": "Be long."}, {"role": "user", "content": "Hi"}]
    assert gen.encode(own) == hf(own)
    empty = TextGenerator.load(GeneratorSpec(str(target), str(draft), max_new_tokens=8, chat_template=True,
                                             system_prompt=""))  # an empty system message, put first all the same
    assert empty.encode("Hello") == hf([{"role": "system", "content": ""}, {"role": "user", "content": "Hello"}])
    plain = TextGenerator.load(GeneratorSpec(str(target), str(draft), max_new_tokens=8))
    assert plain.encode("Hello") == tok("Hello").input_ids  # raw text without the flag
    assert plain.encode([{"role": "user", "content": "Hi"}]) == hf([{"role": "user", "content": "Hi"}])
    assert plain.engine.eos == {tok.eos_token_id, tok.convert_tokens_to_ids("<|end|>")}
    ids = hf([{"role": "user", "content": "Hi"}])
    ref = plain.engine.target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=8)[0, len(ids):].tolist()
    assert plain.generate([{"role": "user", "content": "Hi"}])["token_ids"] == ref


def test_chat_template_flag_needs_a_template(saved_pairs):
    target_dir, draft_dir = saved_pairs["llama"]
    with pytest.raises(ValueError, match="has no chat template"):
        TextGenerator.load(GeneratorSpec(str(target_dir), str(draft_dir), chat_template=True))
