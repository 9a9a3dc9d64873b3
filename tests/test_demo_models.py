"""The demo's summarization data, its committed T5 pair (checked by hash) and the recipe's quality gate."""

import shutil
import textwrap

import pytest

from pipeline import demo_data
from pipeline import demo_models as dm


def test_split_is_deterministic_and_disjoint():
    files = demo_data.stdlib_files()
    train, held = demo_data.split_files(files)
    assert files and train and held
    assert not set(train) & set(held) and len(train) + len(held) == len(files)
    assert demo_data.split_files(files) == (train, held)


def test_functions_are_code_without_docstring_and_first_paragraph(tmp_path):
    (tmp_path / "m.py").write_text(textwrap.dedent('''
        class A:
            @property
            def size(self, unit="b"):
                """Return the size in
                bytes of the file.

                More details that are not the summary.
                """
                return self._size

        def only_doc():
            """No body: skipped."""

        def undocumented():
            x = 1
            return x
        '''))
    (ex,) = demo_data.functions(tmp_path, "m.py")
    assert ex["summary"] == "Return the size in bytes of the file."
    assert ex["code"] == '@property\ndef size(self, unit="b"):\n    return self._size\n'
    assert ex["name"] == "size" and ex["file"] == "m.py" and ex["params"] == ["self", "unit"]
    (plain,) = demo_data.functions(tmp_path, "m.py", undocumented=True)
    assert plain["summary"] is None and plain["code"] == "def undocumented():\n    x = 1\n    return x\n"


def test_weak_labels_are_the_names_that_say_something():
    assert dm.name_sentence("_make_image") == "Make image."
    assert dm.name_sentence("getUserName") == "Get user name."
    for says_little in ("__init__", "close", "test_make_image", "setUp", "coro2"):
        assert dm.name_sentence(says_little) is None


def test_prompt_leads_with_the_names_in_words():
    """Identifiers tokenize as `_user`, summaries say ` user`: the head line gives the model the
    names as the words a summary uses, and the code follows unchanged."""
    ex = {"name": "get_userName", "params": ["self", "user_id", "kwargs"], "code": "def get_userName(self):\n"}
    assert dm.prompt_head(ex) == "summarize: get user name | user id, kwargs"
    assert dm.prompt_text(ex, dm.NAMES) == "summarize: get user name | user id, kwargs\ndef get_userName(self):\n"
    assert dm.prompt_head({"name": "walk", "params": ["cls"]}) == "summarize: walk"
    assert dm.prompt_text(ex, dm.FULL) == "summarize: def get_userName(self):\n"  # the committed pair's format


def test_copy_school_renames_functions_and_marks_spans():
    """Copy school's examples can only be solved by copying: a renamed function's label is its new
    name, which replaces the old one everywhere in its code; a marked span's label is what lies
    between the markers."""
    fn = {"name": "get_size", "params": ["self"], "line": 1, "file": "m.py",
          "code": "def get_size(self):\n    return self.get_size_of(get_size)\n"}
    (ex,) = dm.renamed_functions([fn], ["alpha", "beta"], 1, seed=0, code_of=str)
    words = ex["name"].split("_")
    assert 2 <= len(words) <= 4 and set(words) <= {"alpha", "beta"}
    assert ex["summary"] == " ".join([words[0].capitalize(), *words[1:]]) + "."
    assert ex["code"] == f"def {ex['name']}(self):\n    return self.get_size_of({ex['name']})\n"
    assert dm.prompt_head(ex) == "summarize: " + " ".join(words)

    tokenizer = dm.train_tokenizer(["def f(x):\n    return x + 1\n"] * 20, 300)
    open_, close = tokenizer.convert_tokens_to_ids([dm.SENTINELS[6], dm.SENTINELS[7]])
    ids = dm.code_ids(tokenizer, ["def f(x):\n    return x + 1\n" * 30])
    for src, label in dm.marked_spans(tokenizer, ids, 20, seed=0):
        a, b = src.index(open_), src.index(close)
        assert label == src[a + 1:b] + [1] and 2 <= b - a - 1 <= 6 and src[-1] == 1


def test_split_identifiers_writes_compound_names_as_words():
    code = "def get_user_name(self, user_id=None):\n    self._size = getUserId(HTTPConnection, x)\n"
    assert demo_data.split_identifiers(code) == (
        "def get user name(self, user id=None):\n    self.size = get user id(HTTPConnection, x)\n")


def test_committed_pair_is_verified_t5_sharing_one_tokenizer():
    from transformers import AutoConfig, AutoTokenizer

    manifest = dm.verify_assets()
    target, draft = dm.demo_pair_dirs()
    configs = [AutoConfig.from_pretrained(d) for d in (target, draft)]
    assert all(c.model_type == "t5" and c.is_encoder_decoder for c in configs)
    assert AutoTokenizer.from_pretrained(target).get_vocab() == AutoTokenizer.from_pretrained(draft).get_vocab()
    # The manifest tells the truth about the gate (measured on the saved fp16 weights), and the
    # bars issue 10 sets hold: acceptance >= 0.6 on outputs that neither loop nor all say the same.
    gate, quality = dm.QualityGate(**manifest["gate"]), manifest["quality"]
    if manifest["gate_passed"]:
        dm.check_gate(gate, quality)
    else:
        with pytest.raises(dm.DemoQualityError):
            dm.check_gate(gate, quality)
    assert quality["acceptance"] >= 0.6 and quality["degenerate_share"] <= 0.05 and quality["distinct_share"] >= 0.5
    rows = dm.demo_prompt_rows()
    assert len(rows) >= 40 and all(r["prompt"] and r["reference"] for r in rows)
    assert all(demo_data.is_heldout(r["source_file"]) for r in rows)
    # The committed pair is what the recipe in this repository makes: a recipe edited since would
    # no longer rebuild it (retrain, or leave FULL as it was).
    recipe = {"full": dm.FULL, "names": dm.NAMES}[manifest["recipe"]]
    assert manifest["recipe_hash"] == recipe.hash()
    assert all(r["prompt"].startswith(dm.TASK_PREFIX) and f"def {r['function']}" in r["prompt"] for r in rows)


@pytest.fixture
def pair_copy(tmp_path):
    dest = tmp_path / "pair"
    shutil.copytree(dm.ASSETS, dest)
    return dest


def test_damaged_weights_are_a_one_line_error(pair_copy):
    weights = pair_copy / "target" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(dm.DemoSetupError) as e:
        dm.demo_pair_dirs(pair_copy)
    message = str(e.value)
    assert "\n" not in message and str(weights) in message and "SHA-256" in message and "--retrain" in message


def test_missing_file_is_a_one_line_error(pair_copy):
    (pair_copy / "draft" / "config.json").unlink()
    with pytest.raises(dm.DemoSetupError, match="is missing"):
        dm.demo_pair_dirs(pair_copy)


def test_two_recipes_at_once_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        dm.main(["--retrain", "--names", "--weak"])
    assert e.value.code == 2 and "not allowed with argument --names" in capsys.readouterr().err


def test_gate_names_every_shortfall():
    gate = dm.QualityGate(min_acceptance=0.6, min_rouge_l=0.2, max_degenerate_share=0.05)
    dm.check_gate(gate, {"acceptance": 0.7, "rougeL": 0.3, "degenerate_share": 0.0})
    with pytest.raises(dm.DemoQualityError) as e:
        dm.check_gate(gate, {"acceptance": 0.41, "rougeL": 0.05, "degenerate_share": 0.5})
    message = str(e.value)
    assert "acceptance 0.410 < 0.6" in message and "ROUGE-L 0.050 < 0.2" in message and "50%" in message


@pytest.mark.slow
def test_recipe_builds_a_pair_and_the_gate_catches_a_weak_one(tmp_path):
    """The CI-sized recipe runs end to end into a verified directory; the real gate then refuses
    what a few training steps make (degenerate, no overlap with the references)."""
    manifest = dm.retrain(tmp_path / "pair", dm.TINY)
    assert dm.verify_assets(tmp_path / "pair") == manifest
    target, draft = dm.demo_pair_dirs(tmp_path / "pair")
    rows = dm.demo_prompt_rows(tmp_path / "pair")
    measured = dm.evaluate_pair(target, draft, rows, max_new_tokens=12)
    with pytest.raises(dm.DemoQualityError, match="misses its quality gate"):
        dm.check_gate(dm.FULL.gate, measured)
    # A failed gate leaves an existing pair untouched.
    weak = dm.Recipe(**{**dm.TINY.__dict__, "gate": dm.FULL.gate})
    with pytest.raises(dm.DemoQualityError):
        dm.retrain(tmp_path / "pair", weak)
    assert dm.verify_assets(tmp_path / "pair") == manifest


@pytest.mark.slow
def test_names_recipe_options_run_end_to_end(tmp_path):
    """The names-in-words options at CI size: the demo prompts it writes are in its training
    format (names in words, then the code with its identifiers split)."""
    import dataclasses

    recipe = dataclasses.replace(dm.TINY, name="tiny-names", name_head=True, split_identifiers=True,
                                 pretraining="infill", name_labels=0.5,
                                 copy_school=dm.TrainSpec(steps=3, batch_size=8, lr=1e-3, extra_frac=0.3))
    manifest = dm.retrain(tmp_path / "pair", recipe)
    assert manifest["recipe_hash"] == recipe.hash() != dm.TINY.hash()
    for r in dm.demo_prompt_rows(tmp_path / "pair"):
        head, code = r["prompt"].split("\n", 1)
        assert head.startswith(dm.TASK_PREFIX + demo_data.identifier_words(r["function"]))
        assert code == demo_data.split_identifiers(code) and "_" not in code.split("(", 1)[0]
    # `target_from` keeps that target (the same file, bit for bit) and trains only the draft: the
    # very draft the whole recipe trained on it.
    again = dm.retrain(tmp_path / "pair2", recipe, target_from=tmp_path / "pair")
    for weights in ("target/model.safetensors", "draft/model.safetensors"):
        assert again["files"][weights] == manifest["files"][weights]
    assert again["target"]["reused_from"] == "pair" and again["draft"]["steps"] == recipe.draft_train.steps
