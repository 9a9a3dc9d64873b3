"""Stop strings: the check itself, then greedy identity with `target.generate(stop_strings=...)`
on a chat-templated prompt, stops completed inside accepted blocks and across blocks, sampling,
and chat models' lists of end tokens."""

import random

import pytest
import torch

from specdec_core.drafters import ModelDrafter, NgramDrafter, NoDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.processing import SamplingSettings
from specdec_core.stopping import StopStrings, check_stop_strings, cut_at_stop
from tests.tiny_models import build_chat_tokenizer, make_model, perturbed_copy

MAX_NEW = 40


@pytest.fixture(scope="module")
def chat():
    tok = build_chat_tokenizer()
    target = make_model("llama", tok, seed=1)
    return tok, target, perturbed_copy(target, 0.05, seed=2)


def brute_force_cut(tok, tokens, stops):
    """Index of the first token whose prefix's decoded text holds a stop string (the definition)."""
    for k in range(len(tokens)):
        if any(s in tok.decode(tokens[: k + 1], skip_special_tokens=True) for s in stops):
            return k
    return None


def chat_ids(tok, text):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                   tokenize=True, return_dict=True)["input_ids"]


def hf_generate(target, tok, ids, stops=None):
    kwargs = {"stop_strings": stops, "tokenizer": tok} if stops else {}
    out = target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=MAX_NEW, **kwargs)
    return out[0, len(ids):].tolist()


# --- the check --------------------------------------------------------------------------------


def test_check_finds_the_completing_token_across_calls_and_overhangs():
    tok = build_chat_tokenizer()
    ids = tok("The quick brown fox jumps over the lazy dog.", add_special_tokens=False).input_ids
    pieces = [tok.decode([i]) for i in ids]
    text = "".join(pieces)
    # "fox jumps" ends inside some token; the token holding its last character completes it.
    end = text.index("fox jumps") + len("fox jumps")
    completing = next(k for k in range(len(ids)) if len("".join(pieces[: k + 1])) >= end)
    check = StopStrings(tok, ["fox jumps"])
    # Fed in rounds of 3 tokens, as the engine would: the index is within the round that completes it.
    found = None
    for start in range(0, len(ids), 3):
        hit = check(ids[start : start + 3])
        if hit is not None:
            found = start + hit
            break
    assert found == completing
    assert cut_at_stop(tok.decode(ids[: found + 1]), ["fox jumps"]) == (text[: end - len("fox jumps")], True)


def test_multibyte_character_split_over_byte_pieces():
    tok = build_chat_tokenizer()
    ids = tok("caf\u00e9 ok", add_special_tokens=False).input_ids
    k = brute_force_cut(tok, ids, ["\u00e9"])
    assert k is not None and "\ufffd" in tok.decode(ids[:k])  # the character is really split: "é" is 2 bytes
    assert StopStrings(tok, ["\u00e9"])(ids) == k


def test_special_tokens_are_not_text():
    tok = build_chat_tokenizer()
    end = tok.convert_tokens_to_ids("<|end|>")
    assert StopStrings(tok, ["<|end|>"])([end, end]) is None  # end tokens are the eos list's job


def test_the_text_checked_is_the_text_decoded():
    """What `decode(skip_special_tokens=True)` skips is what the check skips: tokens added as special that are not
    in `all_special_ids` (Llama 3's reserved ones) hold no text, so the window reaches past them; a plain token
    named as the pad ("!") is text. A window's first WordPiece token decodes with its "##", which the text lacks."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tests.tiny_models import CORPUS

    tok = build_chat_tokenizer()
    tok.add_tokens([AddedToken("<|reserved_0|>", special=True)])
    reserved = tok.convert_tokens_to_ids("<|reserved_0|>")
    assert reserved not in tok.all_special_ids
    ids = tok("a", add_special_tokens=False).input_ids + [reserved] * 10 + tok("b", add_special_tokens=False).input_ids
    assert StopStrings(tok, ["ab"])(ids) == brute_force_cut(tok, ids, ["ab"]) == len(ids) - 1  # (missed before)
    tok.pad_token = "!"
    ids = tok("Hello world!", add_special_tokens=False).input_ids
    assert StopStrings(tok, ["!"])(ids) == brute_force_cut(tok, ids, ["!"]) == len(ids) - 1  # (missed before)
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer, wordpiece.pre_tokenizer = normalizers.BertNormalizer(), pre_tokenizers.BertPreTokenizer()
    wordpiece.decoder = decoders.WordPiece(prefix="##")
    wordpiece.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]"]))
    bert = PreTrainedTokenizerFast(tokenizer_object=wordpiece, unk_token="[UNK]")
    ids = bert("speculative decoding", add_special_tokens=False).input_ids
    assert "##" in bert.decode(ids[-1:]) and brute_force_cut(bert, ids, ["#"]) is None
    assert StopStrings(bert, ["#"])(ids) is None  # (a false stop before)


def test_a_stop_starting_with_a_space_that_a_metaspace_decoder_strips():
    """The tail decoded to look for a stop starts before the stop's first token: decoded from there, SentencePiece's
    Metaspace drops the leading space of `" 7"`."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel({"[UNK]": 0, "▁": 1, "7": 2, "a": 3, "▁a": 4}, unk_token="[UNK]"))
    t.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]")
    ids = [4, 3, 4, 1, 2]  # "aa a 7"
    assert " 7" in tok.decode(ids) and tok.decode(ids[-2:]) == "7"
    assert StopStrings(tok, [" 7"])(ids) == 4


def test_agrees_with_the_definition_on_random_byte_soup():
    """Random ids decode to broken UTF-8 and odd merges: the windowed check must still agree."""
    tok = build_chat_tokenizer()
    rng = random.Random(0)
    checked = 0
    for trial in range(100):
        ids = [rng.randrange(4, 320) for _ in range(60)]
        text = tok.decode(ids, skip_special_tokens=True)
        a = rng.randrange(0, len(text) - 8)
        stop = text[a : a + rng.randrange(1, 8)]
        if "\ufffd" in stop or not stop:
            continue
        check = StopStrings(tok, [stop, "never-seen-zz"])
        got = None
        for start in range(0, len(ids), 5):
            hit = check(ids[start : start + 5])
            if hit is not None:
                got = start + hit
                break
        assert got == brute_force_cut(tok, ids, [stop]), (trial, stop)
        checked += 1
    assert checked > 40


def test_decoding_stays_in_a_tail_window(monkeypatch):
    tok = build_chat_tokenizer()
    ids = tok(" ".join(["the lazy dog"] * 200), add_special_tokens=False).input_ids
    check = StopStrings(tok, ["not here", "zz"])
    seen = []
    original = type(tok).decode
    monkeypatch.setattr(type(tok), "decode", lambda self, t, **kw: seen.append(len(t)) or original(self, t, **kw))
    assert check(ids) is None
    assert len(seen) == len(ids) and max(seen) <= len("not here") + 4


def test_a_stop_right_after_a_four_byte_character_in_byte_fallback_pieces():
    """A SentencePiece tokenizer's byte fallback spells an emoji in four pieces: the tail window the check decodes
    must reach back past all of them."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel({"[UNK]": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}, unk_token="[UNK]"))
    t.decoder = decoders.ByteFallback()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]")
    ids = [1 + b for b in "a😀é".encode()]
    assert tok.decode(ids) == "a😀é"
    assert StopStrings(tok, ["é"])(ids) == len(ids) - 1


def test_the_text_is_cut_at_the_earliest_stop():
    assert cut_at_stop("xab", ["ab", "b"]) == cut_at_stop("xab", ["b", "ab"]) == ("x", True)
    assert cut_at_stop("\nrest", ["\n"]) == ("", True)  # a stop at the very start leaves no text


def test_a_stop_after_an_end_token_in_the_same_round_is_not_checked():
    """The end token ends the row (`eos`): a stop string the drafts complete after it is never part of the output."""
    from specdec_core.rows import cut_at_end

    seen = []

    def check(tokens):
        seen.extend(tokens)
        return tokens.index(9) if 9 in tokens else None

    assert cut_at_end([5, 2, 9], 10, {2}, check) == ([5, 2], "eos")
    assert seen == [5, 2]


def test_empty_stop_string_is_refused():
    with pytest.raises(ValueError, match="non-empty"):
        check_stop_strings(["ok", ""])


def test_a_stop_string_holding_the_replacement_character_is_refused():
    """A window that starts inside a character decodes it to U+FFFD: such a stop would match text the output
    does not hold ("é" is two byte-level tokens; a window from its second holds "\ufffd")."""
    with pytest.raises(ValueError, match="U\\+FFFD"):
        check_stop_strings(["ok", "\ufffdor"])
    with pytest.raises(ValueError, match="U\\+FFFD"):
        StopStrings(build_chat_tokenizer(), ["\ufffd"])


# --- the engine -------------------------------------------------------------------------------


def stop_candidates(tok, ref):
    """(stop, index of its completing token) for ASCII stops taken from the reference output:
    single tokens and multi-token spans, each first occurring where it was taken."""
    out = []
    for a in range(2, len(ref) - 1):
        for b in (a + 1, a + 2, a + 3):
            s = tok.decode(ref[a:b], skip_special_tokens=True).strip()
            if len(s) < 2 or not s.isascii() or not s.isprintable():
                continue
            k = brute_force_cut(tok, ref, [s])
            if k is not None and k >= 2:
                out.append((s, k))
    return out


@pytest.mark.slow
def test_greedy_with_stop_strings_equals_target_generate(chat):
    """Chat-templated prompts; stops completed inside an accepted block (self-draft: rounds of 5
    accepted tokens) or at its end; every drafter."""
    tok, target, draft = chat
    inside = 0
    for text in ["Hello world!", "Summarize: the committee met on Tuesday", "def add(a, b):"]:
        ids = chat_ids(tok, text)
        ref = hf_generate(target, tok, ids)
        gen = SpeculativeGenerator(target, ModelDrafter(target), num_speculative_tokens=4, max_new_tokens=MAX_NEW)
        assert gen.generate(ids).tokens == ref  # the chat prompt alone
        for stop, k in stop_candidates(tok, ref)[::3][:6]:
            expected = hf_generate(target, tok, ids, [stop])
            assert expected == ref[: k + 1], (stop, k)  # HF stops on the same token as the definition
            inside += k % 5 != 4
            for drafter in (ModelDrafter(target), ModelDrafter(draft), NgramDrafter(), NoDrafter()):
                for gamma in (1, 4):
                    g = SpeculativeGenerator(target, drafter, num_speculative_tokens=gamma, max_new_tokens=MAX_NEW)
                    out = g.generate(ids, finish_check=StopStrings(tok, [stop]))
                    assert out.tokens == expected, (text, stop, type(drafter).__name__, gamma)
                    assert out.stats.finish_reason == "stop" and out.stats.new_tokens == k + 1
    assert inside >= 3  # stops completed with accepted drafts after them in the same round


def test_stop_spanning_two_blocks(chat):
    """A multi-token stop whose first token is in one round and its last in the next."""
    tok, target, _ = chat
    ids = chat_ids(tok, "Hello world!")
    ref = hf_generate(target, tok, ids)
    cases = 0
    for boundary in (5, 10, 15):  # self-draft with gamma 4: rounds end after tokens 4, 9, 14, ...
        stop = tok.decode(ref[boundary - 2 : boundary + 1], skip_special_tokens=True)
        k = brute_force_cut(tok, ref, [stop])
        if "\ufffd" in stop or k != boundary:
            continue
        out = SpeculativeGenerator(target, ModelDrafter(target), num_speculative_tokens=4,
                                   max_new_tokens=MAX_NEW).generate(ids, finish_check=StopStrings(tok, [stop]))
        assert out.tokens == ref[: boundary + 1] and out.stats.verify_steps == boundary // 5 + 1
        assert out.stats.finish_reason == "stop"
        cases += 1
    assert cases


def test_sampling_with_a_stop_is_the_unstopped_sample_cut(chat):
    """Same seed: the stopped sample is the unstopped one cut at the stop (the stop only ends the
    item, it draws nothing), so its distribution is the target's cut at the same place."""
    tok, target, draft = chat
    ids = chat_ids(tok, "Hello world!")
    sampling = SamplingSettings(temperature=1.0)
    gen = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=4, max_new_tokens=MAX_NEW,
                               sampling=sampling)
    stopped = 0
    for seed in range(12):
        full = gen.generate(ids, seed).tokens
        text = tok.decode(full, skip_special_tokens=True)
        stop = next((text[i : i + 2] for i in range(len(text) // 2, len(text) - 1)
                     if text[i : i + 2].isascii() and text[i : i + 2].isprintable()), None)
        if stop is None:
            continue
        k = brute_force_cut(tok, full, [stop])
        out = gen.generate(ids, seed, StopStrings(tok, [stop]))
        assert out.tokens == full[: k + 1] and out.stats.finish_reason == "stop"
        stopped += 1
    assert stopped >= 6


def test_eos_list_of_a_chat_model(chat):
    """generation_config.eos_token_id as a list: the engine stops at whichever comes first, as generate()."""
    tok, target, draft = chat
    ids = chat_ids(tok, "Hello world!")
    ref = hf_generate(target, tok, ids)
    fresh = next(i for i in range(3, 20) if ref[i] not in ref[:i])
    old = target.generation_config.eos_token_id
    target.generation_config.eos_token_id = [tok.eos_token_id, ref[fresh]]
    try:
        expected = hf_generate(target, tok, ids)
        assert expected == ref[: fresh + 1]
        for drafter in (ModelDrafter(target), ModelDrafter(draft), NgramDrafter()):
            out = SpeculativeGenerator(target, drafter, num_speculative_tokens=4, max_new_tokens=MAX_NEW).generate(ids)
            assert out.tokens == expected and out.stats.finish_reason == "eos"
    finally:
        target.generation_config.eos_token_id = old


class PairStop:
    """A token-level stand-in for a two-token stop string on a 6-token vocabulary: ends the item
    at the first `a` followed by `b`, or at the first `c` (so stops span rounds and end them early)."""

    def __init__(self, a=1, b=0, c=4):
        self.a, self.b, self.c, self.prev = a, b, c, None

    def __call__(self, tokens):
        for i, t in enumerate(tokens):
            if t == self.c or (self.prev == self.a and t == self.b):
                return i
            self.prev = t
        return None


@pytest.mark.slow
def test_sampling_with_a_stop_follows_the_target_cut_at_the_stop():
    """Chi-square against the target's exact distribution pushed through the same cut."""
    from tests.test_engine_sampling import N_NEW, chi2_pvalue, counted, draw, engines, exact_distribution, tiny

    def cut(cont):
        k = PairStop()(list(cont))
        return tuple(cont if k is None else cont[: k + 1])

    def pushed(probs):
        out = {}
        for cont, p in probs.items():
            out[cut(cont)] = out.get(cut(cont), 0.0) + p
        return out

    sampling = SamplingSettings(temperature=1.0)
    target = tiny("llama", seed=0, std=0.8)
    draft = perturbed_copy(target, noise=0.8, seed=1)
    outs = draw(engines(target, lambda: ModelDrafter(draft), num_speculative_tokens=2, max_new_tokens=N_NEW,
                        sampling=sampling), PairStop)
    assert {o.stats.finish_reason for o in outs} <= {"stop", "length"}
    counts = counted(outs)
    assert sum(n for c, n in counts.items() if len(c) < N_NEW) > len(outs) // 5  # stops really happened
    assert chi2_pvalue(counts, pushed(exact_distribution(target, sampling))) > 1e-3
    assert chi2_pvalue(counts, pushed(exact_distribution(draft, sampling))) < 1e-6  # power
