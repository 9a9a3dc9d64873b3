"""Dataset -> prompt shards -> a job that reads them."""

import json

import pyarrow.parquet as pq

from pipeline import prepare


def test_jsonl_dataset_becomes_prompt_shards(tmp_path, capsys):
    src = tmp_path / "docs.jsonl"
    docs = [{"doc": f"d{i}", "article": f"Text number {i}.", "lang": "en"} for i in range(7)]
    src.write_text("\n".join(json.dumps(d) for d in docs))
    rc = prepare.main(["--dataset", str(src), "--template", "summarize: {article}", "--id_field", "doc",
                       "--keep_fields", "lang", "--num_shards", "3", "--output", str(tmp_path / "p/prompts")])
    assert rc == 0
    files = sorted((tmp_path / "p").glob("prompts-*-of-00003.parquet"))
    assert len(files) == 3
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    assert rows == [{"id": f"d{i}", "prompt": f"summarize: Text number {i}.", "lang": "en"} for i in range(7)]


def test_unknown_template_field_is_one_line_error(tmp_path, capsys):
    src = tmp_path / "docs.csv"
    src.write_text("text\nhello\n")
    assert prepare.main(["--dataset", str(src), "--template", "{article}", "--output", str(tmp_path / "x")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after datasets' own progress bar
    assert last.startswith("error: field 'article' is not in the dataset")


def test_generated_ids_and_limit(tmp_path):
    src = tmp_path / "t.txt"
    src.write_text("one\ntwo\nthree\n")
    assert prepare.main(["--dataset", str(src), "--template", "continue: {text}", "--limit", "2",
                         "--output", str(tmp_path / "o")]) == 0
    rows = pq.read_table(tmp_path / "o-00000-of-00001.parquet").to_pylist()
    assert rows == [{"id": "train-0", "prompt": "continue: one"}, {"id": "train-1", "prompt": "continue: two"}]


def test_conversation_prompts_for_instruct_models(tmp_path):
    """--system_template/--user_template write a list of {role, content} structs: the input shape that
    pipeline.run puts through the chat template."""
    import pyarrow as pa

    src = tmp_path / "docs.jsonl"
    src.write_text("\n".join(json.dumps({"article": f"Text {i}.", "lang": "fr"}) for i in range(2)))
    rc = prepare.main(["--dataset", str(src), "--system_template", "Answer in {lang}.",
                       "--user_template", "Summarize:\n{article}", "--output", str(tmp_path / "c")])
    assert rc == 0
    table = pq.read_table(tmp_path / "c-00000-of-00001.parquet")
    assert table.schema.field("prompt").type == pa.list_(prepare.MESSAGE)
    assert table.to_pylist()[1] == {"id": "train-1", "prompt": [
        {"role": "system", "content": "Answer in fr."}, {"role": "user", "content": "Summarize:\nText 1."}]}
    assert prepare.main(["--dataset", str(src), "--user_template", "{article}", "--output", str(tmp_path / "u")]) == 0
    assert pq.read_table(tmp_path / "u-00000-of-00001.parquet")["prompt"].to_pylist()[0] == [
        {"role": "user", "content": "Text 0."}]


def test_template_flags_that_do_not_fit_together(tmp_path, capsys):
    src = tmp_path / "t.txt"
    src.write_text("one\n")
    out = ["--output", str(tmp_path / "x")]
    cases = {"give either --template": ["--template", "{text}", "--user_template", "{text}"],
             "give either --template ": [],
             "--system_template needs --user_template": ["--template", "{text}", "--system_template", "Hi."]}
    for needle, flags in cases.items():
        assert prepare.main(["--dataset", str(src), *flags, *out]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"error: {needle.strip()}")
    assert not list(tmp_path.glob("x-*"))
