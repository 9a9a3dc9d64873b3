"""The demo's task generator, tokenizer, committed pair (hash-checked, at its gate) and recipe."""

import copy
import dataclasses
import datetime
import functools
import random
import shutil

import pytest
import torch

from pipeline.demo import assets, data, recipes
from pipeline.demo import models as dm


def test_references_come_from_num2words_and_cldr():
    rng = random.Random(0)
    assert data.words(4312) == "viertausenddreihundertzwölf"
    en, de = data.amount(random.Random(1), 9999)
    assert en[0] in "$€£" and de.split()[-1] in ("Cent", "Pence")
    assert data.time(_Fixed([1, 5]), 0) == ("at 1:05", "um ein Uhr fünf")
    assert data.time(_Fixed([14, 0]), 0) == ("at 14:00", "um vierzehn Uhr")
    for _ in range(50):  # the weekday in the prompt is the date's own, and translated
        en, de = data.date(rng, 0)
        day, rest = en.removeprefix("on ").split(", ", 1)
        when = datetime.datetime.strptime(rest, "%B %d, %Y").date()
        assert day == when.strftime("%A")
        assert de.startswith(f"am {data._cldr()['days_de'][when.weekday()]}, dem ")
    en, de = data.example(random.Random(3), 4)
    assert en.startswith(data.TASK_PREFIX) and en.count(data.SEPARATOR) == de.count(data.SEPARATOR) == 3
    assert not any(ch.isdigit() for ch in de)


class _Fixed(random.Random):
    """randrange/randint answer from a list: to pin one item."""

    def __init__(self, values):
        super().__init__(0)
        self.values = list(values)

    def randrange(self, *a):
        return self.values.pop(0)


def test_tokenizer_round_trips_with_one_digit_per_token():
    tok = dm.train_tokenizer(data.tokenizer_corpus(300, 1), 320)
    rng = random.Random(5)
    for _ in range(20):
        for text in data.example(rng, 3):
            ids = tok(text)["input_ids"]
            assert ids[-1] == 1 and tok.decode(ids, skip_special_tokens=True) == text
            pieces = [tok.decode([i]) for i in ids]
            assert all(sum(ch.isdigit() for ch in p) <= 1 for p in pieces)


def test_training_never_sees_an_evaluation_prompt():
    """One-item prompts repeat (a time is one of 1,440): the demo's and the probe's prompts are
    redrawn out of every training batch. Times only, 1,920 draws: without the rule, some of the 8
    evaluation times come up (the chance that none does is under 1e-4)."""
    recipe = dataclasses.replace(recipes.TINY, kinds=("time",), prompt_items=(1, 1),
                                 train=dataclasses.replace(recipes.TINY.train, batch_size=64, max_items=1))
    held_out = dm.evaluation_prompts(recipe)
    assert len(held_out) == 8 and all(r["prompt"] in held_out for r in dm.demo_prompts(recipe))
    tok = dm.train_tokenizer(data.tokenizer_corpus(300, 1, exclude=held_out), 320)
    seen = set()
    for step in range(1, 31):
        x, _, y = dm.batch_at(recipe, tok, step)
        assert len(x) == len(y) == 64
        seen.update(tok.batch_decode(x, skip_special_tokens=True))
    assert len(seen) > 700 and not seen & held_out


@pytest.mark.parametrize("encoder_layers", [1, 0])
def test_early_exit_logits_are_the_cut_drafts_own(encoder_layers):
    spec = recipes.ModelSpec(d_model=32, d_ff=64, heads=2, encoder_layers=encoder_layers, decoder_layers=3)
    target = dm.make_model(spec, 50, 0).eval()
    draft = dm.cut_draft(target, 1)
    assert dm.spec_of(draft.config) == dataclasses.replace(spec, decoder_layers=1)
    x = torch.randint(3, 50, (2, 7))
    y = torch.randint(3, 50, (2, 5))
    kwargs = {"input_ids": x, "decoder_input_ids": y} if encoder_layers else {"input_ids": torch.cat([x, y], 1)}
    with torch.inference_mode():
        out = target(**kwargs, output_hidden_states=True)
        exit_logits = dm.early_exit_logits(target, dm.decoder_states(target, out)[1])
        assert torch.allclose(exit_logits, draft(**kwargs).logits, atol=1e-5)


def test_a_decoder_only_target_is_labelled_on_its_output_only():
    x, mask, y = dm.teacher_forced(False, [[5, 6, 1], [7, 1]], [[8, 9, 1], [4, 1]])
    assert x.tolist() == [[5, 6, 1, 8, 9, 1], [7, 1, 4, 1, 0, 0]]
    assert mask.tolist() == [[1] * 6, [1, 1, 1, 1, 0, 0]]
    assert y.tolist() == [[-100, -100, -100, 8, 9, 1], [-100, -100, 4, 1, -100, -100]]
    x, mask, y = dm.teacher_forced(True, [[5, 6, 1], [7, 1]], [[8, 9, 1], [4, 1]])
    assert x.tolist() == [[5, 6, 1], [7, 1, 0]] and y.tolist() == [[8, 9, 1], [4, 1, -100]]


def test_committed_pair_is_verified_and_at_its_gate():
    from transformers import AutoConfig

    manifest = assets.verify_assets()
    target, draft = assets.demo_pair_dirs()
    t, d = (AutoConfig.from_pretrained(p) for p in (target, draft))
    assert t.model_type == d.model_type and dm.spec_of(d).decoder_layers < dm.spec_of(t).decoder_layers
    assert (target / "tokenizer.json").read_bytes() == (draft / "tokenizer.json").read_bytes()
    gate, quality = recipes.QualityGate(**manifest["gate"]), manifest["quality"]
    if manifest["gate_passed"]:
        dm.check_gate(gate, quality)
    else:
        with pytest.raises(dm.DemoQualityError):
            dm.check_gate(gate, quality)
    # The committed pair is what the recipe in this repository makes (an edited recipe no longer
    # passes for it: rebuild), on the prompts that recipe writes.
    recipe = recipes.RECIPES[manifest["recipe"]]
    assert manifest["recipe_hash"] == recipe.hash()
    assert assets.demo_prompt_rows() == dm.demo_prompts(recipe)
    files = [p for p in assets.ASSETS.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 25e6


@pytest.fixture
def pair_copy(tmp_path):
    dest = tmp_path / "pair"
    shutil.copytree(assets.ASSETS, dest)
    return dest


def test_damaged_weights_are_a_one_line_error(pair_copy):
    weights = pair_copy / "target" / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    weights.write_bytes(bytes(blob))
    with pytest.raises(assets.DemoSetupError) as e:
        assets.demo_pair_dirs(pair_copy)
    message = str(e.value)
    assert "\n" not in message and str(weights) in message and "SHA-256" in message and "--retrain" in message


def test_missing_file_is_a_one_line_error(pair_copy):
    (pair_copy / "draft" / "config.json").unlink()
    with pytest.raises(assets.DemoSetupError, match="is missing"):
        assets.demo_pair_dirs(pair_copy)


def test_gate_names_every_shortfall():
    gate = recipes.QualityGate()
    good = {"exact": 0.9, "chrf": 95.0, "acceptance": 0.8, "speedup": 1.6, "identical": 1.0}
    dm.check_gate(gate, good)
    with pytest.raises(dm.DemoQualityError) as e:
        dm.check_gate(gate, {**good, "exact": 0.5, "speedup": 1.2})
    message = str(e.value)
    assert "exact matches 50% < 80%" in message and "speed-up 1.20x < 1.5x" in message and "chrF" not in message


def _tokenizer_made_once(monkeypatch):
    """The builds below share a seed, kinds and vocabulary, hence their 40,000-text corpus and its
    tokenizer: 5 to 6 s of the 6 to 7 s a tiny build takes on a 2-core CPU. The first build makes them
    as the recipe does; the others get the same (a copy of the tokenizer, so no build changes
    another's), their files byte for byte those of a build without this."""
    made = {}
    real = dm.train_tokenizer

    def train_tokenizer(texts, vocab_size, digits="single"):
        key = (tuple(texts), vocab_size, digits)
        if key not in made:
            made[key] = real(texts, vocab_size, digits)
        return copy.deepcopy(made[key])

    monkeypatch.setattr(data, "tokenizer_corpus", functools.cache(data.tokenizer_corpus))
    monkeypatch.setattr(dm, "train_tokenizer", train_tokenizer)


@pytest.mark.slow
def test_recipe_builds_a_pair_and_the_gate_refuses_a_weak_one(tmp_path, capsys, monkeypatch):
    """The CI-sized recipe runs end to end into a verified directory; with the real gate, what a
    few steps make is kept aside as DIR.rejected, nothing is written, and the command exits 2
    with one line naming the missed bars."""
    _tokenizer_made_once(monkeypatch)
    manifest = dm.retrain(tmp_path / "pair", recipes.TINY, workdir=tmp_path / "work")
    assert assets.verify_assets(tmp_path / "pair") == manifest and manifest["gate_passed"]
    assert [h["step"] for h in manifest["target"]["history"]] == [3, 6]
    # A rerun with the same workdir resumes from its checkpoint (the last step): the same target.
    again = dm.retrain(tmp_path / "pair2", recipes.TINY, workdir=tmp_path / "work")
    assert again["files"]["target/model.safetensors"] == manifest["files"]["target/model.safetensors"]
    assert again["target"]["final_loss"] is None  # no step ran: a fresh run makes the same weights too

    decoder = dm.retrain(tmp_path / "decoder", recipes.TINY_DECODER)  # a decoder-only pair, the same way
    assert assets.verify_assets(tmp_path / "decoder") == decoder and decoder["gate_passed"]
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(tmp_path / "decoder" / "draft").num_hidden_layers == 1

    # With the real gate (through the command, which says it in one line): kept aside, nothing written.
    strict = dataclasses.replace(recipes.TINY, gate=recipes.FULL.gate)
    recipes.RECIPES["tiny-strict"] = dataclasses.replace(strict, name="tiny-strict")
    try:
        rc = dm.main(["--retrain", "--recipe", "tiny-strict", "--out", str(tmp_path / "cli"), "--threads", "1"])
    finally:
        del recipes.RECIPES["tiny-strict"]
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and errors[0].startswith("error: the demo pair misses its quality gate")
    assert "exact matches" in errors[0] and "cli.rejected" in errors[0]
    assert not (tmp_path / "cli").exists() and (tmp_path / "cli.rejected" / "MANIFEST.json").is_file()
