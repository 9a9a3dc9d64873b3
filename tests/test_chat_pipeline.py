"""Instruct jobs end to end: --chat_template / --system_prompt / --stop and conversation columns,
against the tokenizer's own apply_chat_template plus target.generate()."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from pipeline.run import main
from specdec_core.loading import load_model, resolve_device
from tests.test_pipeline import read, write_prompts
from tests.tiny_models import save_chat_pair

MAX_NEW = 16
TEXTS = ["Hello world!", "Summarize: the committee met on Tuesday", "def add(a, b):", "for i in range(10):"]


@pytest.fixture(scope="module")
def chat_pair(tmp_path_factory):
    return save_chat_pair(tmp_path_factory.mktemp("chat"))


def reference(target_dir, messages, stops=None):
    """What the tokenizer's chat template plus generate() give, cut before the stop string."""
    tok = AutoTokenizer.from_pretrained(target_dir)
    model = load_model(str(target_dir), resolve_device("cpu"), torch.float32)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    kwargs = {"stop_strings": stops, "tokenizer": tok} if stops else {}
    new = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=MAX_NEW, **kwargs)[0, len(ids):]
    text = tok.decode(new, skip_special_tokens=True)
    hit = [text.find(s) for s in stops or [] if s in text]
    return (text[: min(hit)] if hit else text), len(new), bool(hit)


def run(tmp_path, target, draft, src, *extra, name="run"):
    out = tmp_path / name / "gens"
    args = ["--input", src, "--output", str(out), "--target_model", str(target), "--draft_model", str(draft),
            "--max_new_tokens", str(MAX_NEW), "--num_speculative_tokens", "4", *extra]
    assert main(args) == 0
    return read(f"{out}-0*.parquet"), read(f"{out}-failed-*.parquet")


def test_chat_template_system_prompt_and_stop_equal_apply_chat_template_plus_generate(tmp_path, chat_pair):
    target, draft = chat_pair
    system = "You are terse."
    plain, _, _ = reference(target, [{"role": "system", "content": system}, {"role": "user", "content": TEXTS[0]}])
    stop = next(plain[i : i + 2] for i in range(3, len(plain) - 1) if plain[i : i + 2].isascii()
                and plain[i : i + 2].isprintable())
    src = write_prompts(tmp_path / "p.parquet", [{"id": f"t{i}", "prompt": t} for i, t in enumerate(TEXTS)])
    results, failed = run(tmp_path, target, draft, src, "--chat_template", "--system_prompt", system,
                          "--stop", stop, "--stop", "zzz-never")
    assert failed.num_rows == 0
    rows = {r["id"]: r for r in results.to_pylist()}
    reasons = set()
    for i, text in enumerate(TEXTS):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        expected, n, stopped = reference(target, messages, [stop, "zzz-never"])
        row = rows[f"t{i}"]
        assert row["generation"] == expected and row["new_tokens"] == n, (text, stop)
        assert stop not in row["generation"]
        assert (row["finish_reason"] == "stop") == stopped
        reasons.add(row["finish_reason"])
    assert "stop" in reasons


CONVERSATIONS = {
    "one-turn": [{"role": "user", "content": TEXTS[1]}],
    "multi-turn": [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": TEXTS[2]},
                   {"role": "assistant", "content": "ok"}, {"role": "user", "content": TEXTS[3]}],
}
BAD_CONVERSATIONS = {
    "empty": ([], "EmptyConversation"),
    "null": (None, "NullPrompt"),
    "bad-role": ([{"role": "bot", "content": "hi"}], "UnknownRole"),
    "no-content": ([{"role": "user", "content": None}], "InvalidMessage"),
    "opens-with-assistant": ([{"role": "assistant", "content": "hi"}], "ChatTemplateError"),
    "control-chars": ([{"role": "user", "content": "a\x00b"}], "InvalidCharacters"),
}


@pytest.mark.parametrize("batch_size", [1, 3])
def test_conversation_column_goes_through_the_template_without_the_flag(tmp_path, chat_pair, batch_size):
    target, draft = chat_pair
    rows = [{"id": k, "prompt": v} for k, v in CONVERSATIONS.items()]
    rows += [{"id": k, "prompt": v} for k, (v, _) in BAD_CONVERSATIONS.items()]
    table = pa.Table.from_pylist(rows)
    assert pa.types.is_list(table.schema.field("prompt").type)
    pq.write_table(table, tmp_path / "conv.parquet")
    results, failed = run(tmp_path, target, draft, str(tmp_path / "conv.parquet"), "--batch_size", str(batch_size))
    assert results.num_rows + failed.num_rows == len(rows)
    got = {r["id"]: r for r in results.to_pylist()}
    assert set(got) == set(CONVERSATIONS)
    for key, messages in CONVERSATIONS.items():
        expected, n, _ = reference(target, messages)
        assert got[key]["generation"] == expected and got[key]["new_tokens"] == n, key
    errors = {r["id"]: r for r in failed.to_pylist()}
    assert {k: r["error_type"] for k, r in errors.items()} == {k: e for k, (_, e) in BAD_CONVERSATIONS.items()}
    assert "role 'bot'" in errors["bad-role"]["error_message"]
    assert "has no content" in errors["no-content"]["error_message"]
    assert json.loads(errors["bad-role"]["prompt"]) == [{"role": "bot", "content": "hi"}]  # the row, as JSON text
    assert errors["null"]["prompt"] is None


def test_instruct_settings_that_cannot_work_stop_before_any_work(tmp_path, chat_pair, saved_pairs, capsys):
    target, draft = chat_pair
    plain_target, plain_draft = saved_pairs["llama"]  # a tokenizer without a chat template
    text = write_prompts(tmp_path / "t.parquet", [{"id": "1", "prompt": "hi"}])
    conv = write_prompts(tmp_path / "c.parquet", [{"id": "1", "prompt": [{"role": "user", "content": "hi"}]}])
    strings = write_prompts(tmp_path / "s.parquet", [{"id": "1", "prompt": ["hi", "there"]}])
    out = ["--output", str(tmp_path / "out/gens")]

    def args(src, t, d, *extra):
        return ["--input", src, *out, "--target_model", str(t), "--draft_model", str(d), *extra]

    cases = {
        "--chat_template, but the tokenizer of": args(text, plain_target, plain_draft, "--chat_template"),
        "holds conversations, but the tokenizer of": args(conv, plain_target, plain_draft),
        "--system_prompt needs --chat_template": args(text, target, draft, "--system_prompt", "Be brief."),
        "--stop '': a stop string must be non-empty": args(text, target, draft, "--stop", ""),
        "--stop '\ufffd!': a stop string must be non-empty text without U+FFFD": args(text, target, draft, "--stop",
                                                                                  "\ufffd!"),
        "expected text, or a conversation": args(strings, target, draft),
    }
    capsys.readouterr()
    for needle, argv in cases.items():
        assert main(argv) == 2, needle
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and needle in err and "\n" not in err, err
    assert not (tmp_path / "out").exists()


def test_max_new_tokens_leaves_room_for_what_the_chat_template_writes(tmp_path, chat_pair, capsys):
    """Through a chat template every prompt has the template's tokens around it (and --system_prompt
    on text rows): preflight counted one token, so a --max_new_tokens that only an empty prompt
    could fit passed and failed every row as PromptTooLong. It stops the job in one line; one token
    less runs. A conversation column counts the fewest the template writes (its rows may bring a
    shorter system message than --system_prompt)."""
    from transformers import AutoConfig

    from specdec_core.loading import positions

    target, draft = chat_pair
    tok = AutoTokenizer.from_pretrained(target)
    limit = positions(AutoConfig.from_pretrained(target))

    def template(*messages):
        return len(tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"])

    user, system = {"role": "user", "content": ""}, {"role": "system", "content": "Be brief."}
    text = write_prompts(tmp_path / "t.parquet", [{"id": "1", "prompt": "hi"}])
    conv = write_prompts(tmp_path / "c.parquet", [{"id": "1", "prompt": [{"role": "user", "content": "hi"}]}])
    cases = [(text, ["--chat_template", "--system_prompt", "Be brief."], template(system, user)),
             (conv, ["--system_prompt", "Be brief."], min(template(user), template({**system, "content": ""}, user)))]
    for i, (src, extra, fewest) in enumerate(cases):
        assert fewest > 1 + tok.num_special_tokens_to_add()
        argv = ["--input", src, "--output", str(tmp_path / f"out{i}" / "gens"), "--target_model", str(target),
                "--draft_model", str(draft), *extra]
        capsys.readouterr()
        assert main([*argv, "--max_new_tokens", str(limit - fewest + 1)]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"error: --max_new_tokens {limit - fewest + 1}: --target_model {str(target)!r} can hold at most "
            f"{limit - fewest} new tokens (its decoder's {limit} positions, less the shortest prompt's {fewest} "
            "tokens through the chat template); every row would fail")
        assert not (tmp_path / f"out{i}").exists()
        assert main([*argv, "--max_new_tokens", str(limit - fewest)]) == 0  # ("hi" itself fails as too long)
        failed = read(f"{tmp_path}/out{i}/gens-failed-*.parquet").to_pylist()
        assert [r["error_type"] for r in failed] == ["PromptTooLong"]


def test_dataset_to_instruct_results_with_prepare_and_run(tmp_path, chat_pair):
    """The instruct recipe of docs/instruct-models.md: prepare writes conversations, run applies the chat template."""
    from pipeline import prepare

    target, draft = chat_pair
    src = tmp_path / "docs.jsonl"
    src.write_text("\n".join(json.dumps({"doc": f"d{i}", "article": t}) for i, t in enumerate(TEXTS)))
    assert prepare.main(["--dataset", str(src), "--id_field", "doc", "--system_template", "You summarize.",
                         "--user_template", "Summarize:\n{article}", "--output", str(tmp_path / "prompts")]) == 0
    results, failed = run(tmp_path, target, draft, str(tmp_path / "prompts-*.parquet"), "--stop", "\n\n")
    assert failed.num_rows == 0 and results.num_rows == len(TEXTS)
    for row in results.to_pylist():
        article = TEXTS[int(row["id"][1:])]
        messages = [{"role": "system", "content": "You summarize."},
                    {"role": "user", "content": f"Summarize:\n{article}"}]
        expected, n, _ = reference(target, messages, ["\n\n"])
        assert (row["generation"], row["new_tokens"]) == (expected, n)
