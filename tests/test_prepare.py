"""Dataset -> prompt shards -> a job that reads them."""

import datetime
import json

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import prepare


def test_jsonl_dataset_becomes_prompt_shards(tmp_path, capsys):
    src = tmp_path / "docs.jsonl"
    docs = [{"doc": f"d{i}", "article": f"Text number {i}.", "lang": "en", "ref": f"r{i}"} for i in range(7)]
    src.write_text("\n".join(json.dumps(d) for d in docs))
    rc = prepare.main(["--dataset", str(src), "--template", "summarize: {article}", "--id_field", "doc",
                       "--keep_fields", "lang,ref", "--num_shards", "3", "--output", str(tmp_path / "p/prompts")])
    assert rc == 0
    files = sorted((tmp_path / "p").glob("prompts-*-of-00003.parquet"))
    assert len(files) == 3
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    assert rows == [{"id": f"d{i}", "prompt": f"summarize: Text number {i}.", "lang": "en", "ref": f"r{i}"}
                    for i in range(7)]


def test_unknown_template_field_is_one_line_error(tmp_path, capsys):
    src = tmp_path / "docs.csv"
    src.write_text("text\nhello\n")
    assert prepare.main(["--dataset", str(src), "--template", "{article}", "--output", str(tmp_path / "x")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after datasets' own progress bar
    assert last.startswith("error: field 'article' is not in the dataset")


def test_generated_ids_and_limit(tmp_path):
    src = tmp_path / "t.txt"
    src.write_text("\ufeffone\ntwo\nthree\n")  # (a byte order mark, read as CSV's is: not the first prompt's)
    assert prepare.main(["--dataset", str(src), "--template", "continue: {text}", "--limit", "2",
                         "--output", str(tmp_path / "o")]) == 0
    rows = pq.read_table(tmp_path / "o-00000-of-00001.parquet").to_pylist()
    assert rows == [{"id": "train-0", "prompt": "continue: one"}, {"id": "train-1", "prompt": "continue: two"}]
    for limit in ("3", "10"):  # a limit at or past the dataset's rows takes them all
        assert prepare.main(["--dataset", str(src), "--template", "continue: {text}", "--limit", limit,
                             "--output", str(tmp_path / f"all{limit}")]) == 0
        assert pq.read_table(tmp_path / f"all{limit}-00000-of-00001.parquet").num_rows == 3


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


def test_ids_and_fields_are_kept_as_they_are(tmp_path, capsys):
    """CSV cells are text (ids keep their digits, "NA" stays "NA"); a null id stays null (one is an
    id like any other); a null field that the template reads makes a null prompt, which the job
    fails as NullPrompt, never a prompt reading "None"; rows spread evenly over the shards."""
    src = tmp_path / "a.csv"
    src.write_text("doc,article\n007,hello\n010,NA\n3,x\n")
    assert prepare.main(["--dataset", str(src), "--template", "s: {article}", "--id_field", "doc",
                         "--num_shards", "2", "--output", str(tmp_path / "c")]) == 0
    shards = [pq.read_table(tmp_path / f"c-0000{i}-of-00002.parquet").to_pylist() for i in range(2)]
    assert shards == [[{"id": "007", "prompt": "s: hello"}],
                      [{"id": "010", "prompt": "s: NA"}, {"id": "3", "prompt": "s: x"}]]
    src = tmp_path / "n.jsonl"
    src.write_text('{"doc": null, "article": "x", "k": 1}\n{"doc": 5, "article": null, "k": 2}\n')
    capsys.readouterr()
    assert prepare.main(["--dataset", str(src), "--template", "s: {article}", "--id_field", "doc",
                         "--keep_fields", "k", "--output", str(tmp_path / "n")]) == 0
    table = pq.read_table(tmp_path / "n-00000-of-00001.parquet")
    assert table.to_pylist() == [{"id": None, "prompt": "s: x", "k": 1}, {"id": 5, "prompt": None, "k": 2}]
    assert "1 of 2 rows have a null field the template reads" in capsys.readouterr().err


def test_settings_that_would_lose_or_mix_rows_are_one_line_errors(tmp_path, capsys):
    src = tmp_path / "d.jsonl"
    src.write_text('{"doc": "a", "t": "x"}\n{"doc": "a", "t": "y"}\n')
    (tmp_path / "empty.jsonl").write_text("")
    (bad := tmp_path / "bad.jsonl").write_text('{"t": "a"}\nnot json\n{"t": "c"}\n')
    # values of several types in one field (read as JSON text: a pyarrow traceback, or "two" kept
    # as '"two"'), and an object as an id
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"doc": 1, "t": "x", "k": 1, "o": {"a": 1}}\n{"doc": "b", "t": "y", "k": "two", "o": {"a": 2}}\n')
    dated = tmp_path / "dated.parquet"  # (an id pipeline.run refuses: refused before any shard is written)
    pq.write_table(pa.table({"d": [datetime.date(2020, 1, 1)], "t": ["x"]}), dated)
    (split := tmp_path / "split").mkdir()  # (datasets reads train.jsonl alone: extra.jsonl's rows were left out)
    for name in ("train.jsonl", "extra.jsonl"):
        (split / name).write_text('{"t": "x"}\n')
    out = str(tmp_path / "o")
    cases = {
        "--id_field 'doc' is not unique: 'a' is the id of 2 rows": ["--id_field", "doc"],
        "--template: {} names no field": ["--template", "s: {}"],
        "field 'zz' is not in the dataset": ["--template", "{t:{zz}}"],  # (a bare "error: 'zz'")
        "--template: Single '}' encountered": ["--template", "s: }"],
        "--keep_fields names 't' twice": ["--keep_fields", "t,t"],
        "--keep_fields 'id': the output's own column": ["--keep_fields", "id"],
        "argument --num_shards: must be an integer >= 1, got '0'": ["--num_shards", "0"],
        "argument --limit: must be an integer >= 1, got '0'": ["--limit", "0"],  # (it wrote one empty shard)
        f"--output '{tmp_path}/': a prefix names files (PREFIX-00000-of-00001.parquet), not a folder": [
            "--output", f"{tmp_path}/"],
        f"--output '{tmp_path}': a prefix names files": ["--output", str(tmp_path)],  # (it wrote beside the folder)
        "--output '': names no files: say DIR/prompts": ["--output", ""],  # (it wrote ./-00000-of-00001.parquet)
        f"--dataset '{tmp_path}/empty.jsonl': its data files are empty": ["--dataset", str(tmp_path / "empty.jsonl")],
        # (datasets' cause, which says where, was left out)
        "cannot load it (DatasetGenerationError: An error occurred while generating the dataset; ArrowInvalid: JSON "
        "parse error: Invalid value. in row 1)": ["--dataset", str(bad)],
        "cannot load it (ValueError: Unknown split \"test\". Should be one of ['train'].)": ["--split", "test"],
        f"--dataset '{tmp_path}/nothing-*.jsonl' matches no files": ["--dataset", str(tmp_path / "nothing-*.jsonl")],
        f"--dataset '{tmp_path}/none.csv' matches no files": ["--dataset", str(tmp_path / "none.csv")],
        "--id_field 'doc' holds values of several types (such as 1 and \"b\")": [
            "--dataset", str(mixed), "--id_field", "doc"],
        "--keep_fields 'k' holds values of several types": ["--dataset", str(mixed), "--keep_fields", "k"],
        "--id_field 'o' is struct<a: int64>, which cannot key rows": ["--dataset", str(mixed), "--id_field", "o"],
        "--template '': writes no text: every prompt would be empty": ["--template", ""],  # (every row failed)
        "--config 'x': a configuration of a hub dataset": ["--config", "x"],  # (left out without a word)
        "extra.jsonl (of 1 such files) is in none of the splits its file names make (train)": [
            "--dataset", str(split)],
        "--id_field 'd' is date32[day], which Beam cannot encode deterministically": [
            "--dataset", str(dated), "--id_field", "d"],
    }
    for needle, extra in cases.items():
        flags = {"--dataset": str(src), "--template": "{t}", "--output": out}
        flags |= dict(zip(extra[::2], extra[1::2], strict=True))
        try:
            status = prepare.main([a for pair in flags.items() for a in pair])
        except SystemExit as e:  # (argparse's refusals of a flag's type)
            status = e.code
        assert status == 2, needle
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("error: ") and needle in last, last
    assert not list(tmp_path.glob("o-*"))
    # Shards already under the prefix (of another count) would be read with the new ones.
    assert prepare.main(["--dataset", str(src), "--template", "{t}", "--num_shards", "2", "--output", out]) == 0
    assert prepare.main(["--dataset", str(src), "--template", "{t}", "--output", out]) == 2
    assert "already holds 2 shards" in capsys.readouterr().err
    # before the dataset loads (a hub dataset downloads first): a missing one is not what is said
    assert prepare.main(["--dataset", str(tmp_path / "none.csv"), "--template", "{t}", "--output", out]) == 2
    assert "already holds 2 shards" in capsys.readouterr().err
    assert prepare.main(["--dataset", str(src), "--template", "{t}", "--output", out, "--overwrite"]) == 0
    assert sorted(p.name for p in tmp_path.glob("o-*")) == ["o-00000-of-00001.parquet"]


def test_names_globs_and_neighbours_a_user_may_have(tmp_path, monkeypatch):
    """Column names with spaces or dashes are fields (str.format takes them); a bare relative glob
    finds its CSV; another prefix starting with this one ("o-v2" beside "o") is neither counted
    as this prefix's shards nor deleted by --overwrite."""
    (tmp_path / "q.csv").write_text("Question Text,question-id\nwhat?,q1\n")
    monkeypatch.chdir(tmp_path)
    assert prepare.main(["--dataset", "*.csv", "--template", "Q: {Question Text}", "--id_field", "question-id",
                         "--output", "o-v2"]) == 0
    assert prepare.main(["--dataset", "*.csv", "--template", "Q: {Question Text}", "--output", "o"]) == 0
    assert prepare.main(["--dataset", "*.csv", "--template", "Q: {Question Text}", "--output", "o",
                         "--overwrite"]) == 0
    assert sorted(p.name for p in tmp_path.glob("o-*")) == ["o-00000-of-00001.parquet", "o-v2-00000-of-00001.parquet"]
    assert pq.read_table(tmp_path / "o-v2-00000-of-00001.parquet").to_pylist() == [{"id": "q1", "prompt": "Q: what?"}]
    assert prepare.main(["--dataset", "*.csv", "--template", "Q: {Question Text.upper}", "--output", "x"]) == 2


def test_folders_suffixes_and_trailing_commas_read_every_row(tmp_path, capsys):
    """A folder is read in its one format: `datasets` read a folder's most common one only, so a
    .jsonl beside two .txt notes gave the notes as the dataset (exit 0); a folder of CSVs lost
    the text reading a .csv gets (ids "007" became 7). A folder laid out as a hub dataset (configs
    in its README) is read as `datasets` reads it, --config included. Compressed and upper-case
    suffixes and a glob without one are data files, not hub ids; a CSV whose first row has a
    trailing comma shifted every column (pandas took its first field as an index)."""
    import gzip

    def prompts(dataset, *extra):
        out = tmp_path / "out" / "p"
        assert prepare.main(["--dataset", str(dataset), "--template", "{t}", "--output", str(out), "--overwrite",
                             *extra]) == 0
        return pq.read_table(f"{out}-00000-of-00001.parquet").to_pylist()

    def refused(dataset):
        assert prepare.main(["--dataset", str(dataset), "--template", "{t}", "--output", str(tmp_path / "x")]) == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "data.jsonl").write_text('{"t": "one"}\n{"t": "two"}\n')
    (notes / "_NOTES.txt").write_text("see README\n")
    (notes / "_LICENSE.txt").write_text("MIT\n")
    assert refused(notes) == (
        f"error: --dataset '{notes}' holds files of several formats (json: data.jsonl; text: _LICENSE.txt, "
        "_NOTES.txt): name the data files with a glob, as 'DIR/*.jsonl'")
    assert [r["prompt"] for r in prompts(f"{notes}/*.jsonl")] == ["one", "two"]
    for name in ("_NOTES.txt", "_LICENSE.txt"):
        (notes / name).rename(notes / f".{name}")  # (hidden: datasets leaves them out)
    (notes / "README.md").write_text("# not data\n")
    assert [r["prompt"] for r in prompts(notes)] == ["one", "two"]
    (notes / "other.jsonl").write_text('{"t": "B"}\n')
    (notes / "README.md").write_text("---\nconfigs:\n- config_name: a\n  data_files: data.jsonl\n- config_name: b\n"
                                     "  data_files: other.jsonl\n---\n")
    assert [r["prompt"] for r in prompts(notes, "--config", "b")] == ["B"]
    csvs = tmp_path / "csvs"
    csvs.mkdir()
    (csvs / "a.csv").write_text("id,t\n007,NA\n")
    with gzip.open(csvs / "b.csv.gz", "wt") as f:
        f.write("id,t\n008,x\n")
    assert prompts(csvs, "--id_field", "id") == [{"id": "007", "prompt": "NA"}, {"id": "008", "prompt": "x"}]
    (csvs / "c.csv").write_text("id,t\n009,y,\n")
    assert refused(csvs) == (f"error: --dataset '{csvs}': {csvs}/c.csv's first row has 3 fields, its header 2 (a "
                             "trailing comma?): pandas would shift every column by one")
    with gzip.open(tmp_path / "z.jsonl.gz", "wt") as f:
        f.write('{"t": "zipped"}\n')
    (tmp_path / "U.JSONL").write_text('{"t": "upper"}\n')
    (tmp_path / "part-1.jsonl").write_text('{"t": "globbed"}\n')
    assert [r["prompt"] for r in prompts(tmp_path / "z.jsonl.gz")] == ["zipped"]
    assert [r["prompt"] for r in prompts(tmp_path / "U.JSONL")] == ["upper"]
    assert [r["prompt"] for r in prompts(f"{tmp_path}/part*")] == ["globbed"]
    (tmp_path / "part-0").write_text("x")  # (no suffix: the json reader would fail on it, or a text one read it)
    assert f"matches {tmp_path}/part-0, which is of no format it reads" in refused(f"{tmp_path}/part*")


def test_a_large_dataset_is_never_held_whole_as_python_objects(tmp_path, monkeypatch):
    """Prompts are formatted batch by batch from the fields the templates read (Python allocations
    traced, not time): the whole dataset as Python dicts took 13 KB a row of 2 KB articles."""
    import tracemalloc

    import datasets

    monkeypatch.setattr(prepare, "BATCH_ROWS", 500)
    n, body = 4_000, "x" * 2_000
    data = datasets.Dataset.from_dict({"doc": [f"d{i}" for i in range(n)], "title": [f"T{i}" for i in range(n)],
                                       "article": [body] * n})
    for template, held in (("title: {title}", None), ("summarize: {article}", 500 * len(body))):
        tracemalloc.start()
        try:
            table = prepare.prepare(data, template, "doc", [], "train", None)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        last = template.format(title=f"T{n - 1}", article=body)
        assert table.num_rows == n and table["prompt"][n - 1].as_py() == last
        # the unread articles never become Python strings; the read ones a batch at a time
        assert peak < (held or 0) * 3 + 2_000_000, (template, peak)
    assert prepare.prepare(data.select([]), "title: {title}", None, [], "train", None).num_rows == 0
    assert prepare.prepare(data.select(range(3)), "no fields", None, [], "train", None)["prompt"].to_pylist() == \
        ["no fields"] * 3
