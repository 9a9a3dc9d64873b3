"""Launch-time checks, each held against its breaking: a bad setting stops the job before any work in one line
naming its flag; a good one is never refused."""

from __future__ import annotations

import apache_beam as beam
import pytest

from pipeline.errors import JobConfigError
from pipeline.run import main
from tests.test_cross_tokenizer import cross_pair, toks  # noqa: F401  (fixtures)
from tests.test_long_jobs import _args, _one_line_error
from tests.test_pipeline import write_prompts


@pytest.fixture
def no_work(monkeypatch):
    """Jobs that get past preflight are recorded, not run (a mutant's job would decode)."""
    started = []
    monkeypatch.setattr(beam.Pipeline, "run", lambda self, *a, **k: started.append(self))
    return started


@pytest.fixture
def src(tmp_path):
    return write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "Hello world!", "ref": "r"}])


@pytest.mark.parametrize(("extra", "needle"), [
    (["--num_speculative_tokens", "0"], "--num_speculative_tokens must be >= 1, got 0"),
    (["--commit_every_s", "nan"], "--commit_every_s must be >= 0, got nan"),
    (["--direct_num_workers", "-1"], "--direct_num_workers must be >= 0 (0: one per CPU), got -1"),  # (IndexError)
])
def test_numeric_settings_out_of_range_stop_the_job(tmp_path, saved_pairs, capsys, no_work, src, extra, needle):
    target, draft = saved_pairs["llama"]
    capsys.readouterr()
    assert main(_args(src, tmp_path / "run" / "gens", target, draft, *extra), wait=False) == 2
    assert needle in _one_line_error(capsys)
    assert not no_work and not (tmp_path / "run").exists()


@pytest.mark.parametrize(("runner", "needle"), [
    (["--runner", "DirectRuner"], "Unexpected pipeline runner: DirectRuner. Valid values are "),
    (["--runner", "DataflowRunner"], "Pipeline has validations errors: Missing GCS path option: temp_location."),
    (["--runner", "acme.runners.FastRunner"], "--runner 'acme.runners.FastRunner': No module named 'acme'"),
])
def test_beams_own_option_errors_stop_the_job_in_one_line_before_the_models_are_read(tmp_path, saved_pairs, capsys,
                                                                                      no_work, src, monkeypatch,
                                                                                      runner, needle):
    """Beam checks its options as the Pipeline is made: a mistyped runner, or Dataflow without its project, region
    and buckets, ended the job after both models were read, in a traceback of 17 lines and status 1."""
    from pipeline import run as launcher

    read = []
    monkeypatch.setattr(launcher, "preflight", lambda opts: read.append(opts))
    target, _ = saved_pairs["llama"]
    capsys.readouterr()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # (the folder a Pipeline makes: removed)
    (tmp_path / "tmp").mkdir()
    assert main(_args(src, tmp_path / "run" / "gens", target, None, *runner), wait=False) == 2
    assert needle in _one_line_error(capsys)
    assert not read and not no_work
    monkeypatch.setattr(launcher, "preflight", lambda opts: (_ for _ in ()).throw(JobConfigError("a stand-in")))
    assert main(_args(src, tmp_path / "run" / "gens", target, None), wait=False) == 2
    assert not list((tmp_path / "tmp").iterdir())


def test_an_output_the_input_pattern_matches_stops_the_job(tmp_path, saved_pairs, capsys, no_work):
    """`--input 'data/*.parquet' --output data/gens` ran, and every later run of that input read its result files
    as prompt files: it stopped on their columns, naming none of them."""
    target, _ = saved_pairs["llama"]
    data = tmp_path / "data"
    data.mkdir()
    write_prompts(data / "prompts.parquet", [{"id": "a", "prompt": "Hello world!"}])
    capsys.readouterr()
    assert main(_args(str(data / "*.parquet"), data / "gens", target, None), wait=False) == 2
    assert _one_line_error(capsys).endswith(
        f"--output '{data}/gens': --input '{data}/*.parquet' matches its files (such as gens-00000-of-00001.parquet): "
        "a later run of that --input would read them as prompts; write the output outside the input's pattern")
    (tmp_path / "link").symlink_to(data)  # (the same folder by another path)
    assert main(_args(str(tmp_path / "link" / "*.parquet"), data / "gens", target, None), wait=False) == 2
    assert "a later run of that --input would read them as prompts" in _one_line_error(capsys)
    assert main(_args(str(data / "prompts*.parquet"), data / "gens", target, None), wait=False) == 0
    assert main(_args(str(data / "*.parquet"), tmp_path / "out" / "gens", target, None), wait=False) == 0
    assert len(no_work) == 2
    # an earlier run's output already there (written before this check): the refusal names the file it read
    write_prompts(data / "gens-00000-of-00001.parquet", [{"id": "a", "generation": "x", "new_tokens": 1}])
    (data / "prompts.parquet").unlink()
    assert main(_args(str(data / "*.parquet"), tmp_path / "out2" / "gens", target, None), wait=False) == 2
    assert f"(columns of {data}/gens-00000-of-00001.parquet: id, generation, new_tokens)" in _one_line_error(capsys)


def test_a_passed_through_column_named_as_an_output_column_stops_the_job(tmp_path, saved_pairs, capsys, no_work):
    target, _ = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "hi", "generation": "theirs"}])
    capsys.readouterr()
    assert main(_args(src, tmp_path / "run" / "gens", target, None, "--passthrough_columns", "generation"),
                wait=False) == 2
    assert "--passthrough_columns 'generation' clashes with an output column" in _one_line_error(capsys)
    assert not no_work


def test_decimal_ids_stop_the_job(tmp_path, saved_pairs, capsys, no_work):
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    target, _ = saved_pairs["llama"]
    src = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": pa.array([decimal.Decimal("1.50")], pa.decimal128(5, 2)), "prompt": ["hi"]}), src)
    capsys.readouterr()
    assert main(_args(src, tmp_path / "run" / "gens", target, None), wait=False) == 2
    assert "--id_column 'id' is decimal128(5, 2), which Beam cannot encode" in _one_line_error(capsys)
    assert not no_work


def test_a_prompt_column_of_nulls_only_starts_the_job(tmp_path, saved_pairs, capsys, no_work):
    """Each row fails on its own (no prompt); the job is not refused."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target, _ = saved_pairs["llama"]
    src = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": ["a"], "prompt": pa.array([None], pa.null())}), src)
    assert main(_args(src, tmp_path / "run" / "gens", target, None), wait=False) == 0, capsys.readouterr().err
    assert len(no_work) == 1


@pytest.fixture(scope="module")
def chat_pair(tmp_path_factory):
    from tests.tiny_models import save_chat_pair

    return save_chat_pair(tmp_path_factory.mktemp("chat"))


def test_a_conversation_column_of_large_lists_starts_the_job(tmp_path, chat_pair, capsys, no_work):
    """Polars and pandas (pyarrow large types) write conversations as large lists: conversations still."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target, draft = chat_pair
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    src = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a"], "prompt": pa.array([[{"role": "user", "content": "hi"}]],
                                                              pa.large_list(message))}), src)
    assert main(_args(src, tmp_path / "run" / "gens", target, draft), wait=False) == 0, capsys.readouterr().err
    assert len(no_work) == 1


def test_an_empty_system_prompt_without_a_chat_template_stops_the_job(tmp_path, chat_pair, capsys, no_work, src):
    target, draft = chat_pair
    capsys.readouterr()
    assert main(_args(src, tmp_path / "run" / "gens", target, draft, "--system_prompt", ""), wait=False) == 2
    assert "--system_prompt needs --chat_template" in _one_line_error(capsys)
    assert not no_work


def test_an_output_folder_this_process_cannot_write_stops_the_job(tmp_path, saved_pairs, capsys, no_work, src,
                                                                   monkeypatch):
    import os

    target, _ = saved_pairs["llama"]
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access  # (as root every folder is writable: the folder is made unwritable for this process alone)
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if str(p) == str(locked) and mode & os.W_OK
                        else real(p, mode, *a, **k))
    capsys.readouterr()
    assert main(_args(src, locked / "run" / "gens", target, None), wait=False) == 2
    assert f"--output '{locked}/run/gens': this process cannot write in {locked}" in _one_line_error(capsys)
    assert not no_work


def test_a_dry_run_does_not_refuse_an_output_that_holds_files(tmp_path, saved_pairs, src):
    """--dry_run writes nothing, so an output prefix that already holds a run's files is no reason to stop it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.errors import JobConfigError
    from pipeline.options import SpecDecOptions
    from pipeline.preflight import preflight

    target, _ = saved_pairs["llama"]
    out = tmp_path / "run" / "gens"
    out.parent.mkdir()
    pq.write_table(pa.table({"id": ["old"], "generation": ["x"]}), f"{out}-00000-of-00001.parquet")
    argv = ["--input", str(src), "--output", str(out), "--target_model", str(target), "--drafter", "none"]
    with pytest.raises(JobConfigError, match="already holds 1 output files"):
        preflight(SpecDecOptions(argv))
    preflight(SpecDecOptions([*argv, "--dry_run=True"]))


def test_a_cross_tokenizer_drafts_layers_do_not_refuse_a_batch(tmp_path, cross_pair, src):  # noqa: F811
    """A draft with another tokenizer drafts each row in its own one-row session: layers that cannot batch (here
    chunked attention) do not stop a --batch_size 2 job; the same layers in the target do."""
    import json
    import shutil

    from pipeline.errors import JobConfigError
    from pipeline.preflight import preflight
    from pipeline.run import parse_options

    target, draft = cross_pair
    chunked = tmp_path / "chunked-draft"
    shutil.copytree(draft, chunked)
    config = json.loads((chunked / "config.json").read_text())
    config["layer_types"] = ["chunked_attention"] * config["num_hidden_layers"]
    (chunked / "config.json").write_text(json.dumps(config))

    def opts(t, d):
        return parse_options(["--input", src, "--output", str(tmp_path / "o/gens"), "--target_model", str(t),
                              "--draft_model", str(d), "--batch_size", "2"])

    preflight(opts(target, chunked))
    with pytest.raises(JobConfigError, match="--batch_size 2: --target_model .* has chunked_attention layers"):
        preflight(opts(chunked, target))


def test_an_encoder_decoders_new_tokens_may_take_every_decoder_position(tmp_path, saved_pairs, capsys, no_work, src):
    """Its prompt is in the encoder: --max_new_tokens up to the decoder's positions runs, one more is refused."""
    from transformers import AutoConfig

    from specdec_core.loading import positions

    target, _ = saved_pairs["bart"]
    limit = positions(AutoConfig.from_pretrained(target))
    assert limit
    argv = ["--input", src, "--output", str(tmp_path / "run" / "gens"), "--target_model", str(target),
            "--drafter", "none", "--max_new_tokens"]
    capsys.readouterr()
    assert main([*argv, str(limit + 1)], wait=False) == 2
    assert f"--max_new_tokens {limit + 1}: --target_model {str(target)!r} can hold at most {limit} new tokens" in (
        _one_line_error(capsys))
    assert main([*argv, str(limit)], wait=False) == 0, capsys.readouterr().err
    assert len(no_work) == 1


def test_cuda_graphs_on_with_a_split_model_stops_the_job(tmp_path, saved_pairs, capsys, no_work, src):
    target, draft = saved_pairs["llama"]
    capsys.readouterr()
    assert main(_args(src, tmp_path / "run" / "gens", target, draft, "--cuda_graphs", "on", "--device_map", "auto"),
                wait=False) == 2
    assert "--cuda_graphs on: a model split by --device_map auto runs eagerly" in _one_line_error(capsys)
    assert not no_work


def test_cuda_graphs_auto_runs_a_model_that_graphs_cannot_take(tmp_path, saved_pairs, capsys, no_work, src):
    """--cuda_graphs auto decodes such a model eagerly; only --cuda_graphs on refuses it."""
    import json
    import shutil

    target, _ = saved_pairs["llama"]
    dynamic_rope = tmp_path / "dynamic-rope"  # (its RoPE reads a length on the host)
    shutil.copytree(target, dynamic_rope)
    config = json.loads((dynamic_rope / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    (dynamic_rope / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(_args(src, tmp_path / "run" / "gens", dynamic_rope, None, "--cuda_graphs", "auto"), wait=False) == 0, (
        capsys.readouterr().err)
    assert len(no_work) == 1


def test_a_draft_given_twice_as_flag_equals_value_stops_the_job(tmp_path, saved_pairs, capsys, no_work, src):
    target, draft = saved_pairs["llama"]
    argv = ["--input", src, "--output", str(tmp_path / "run" / "gens"), "--target_model", str(target),
            f"--draft_model={draft}", f"--draft_model={target}"]
    capsys.readouterr()
    assert main(argv, wait=False) == 2
    assert "--draft_model is given 2 times" in _one_line_error(capsys)
    assert not no_work


def test_a_mistyped_flag_is_named_before_a_stray_argument():
    """A glob the shell expanded (`--input a.parquet b.parquet`) beside a typo: the typo is what is named."""
    from pipeline.flags import FlagError, check_pipeline_flags

    with pytest.raises(FlagError, match=r"^unknown flag --temprature \(did you mean --temperature\?\)$"):
        check_pipeline_flags(["--input", "a.parquet", "b.parquet", "--output", "o", "--target_model", "t",
                              "--temprature", "0.5"])


@pytest.mark.parametrize("none", ["none", "None", ""])
def test_none_lifts_a_limit_as_the_help_says(none):
    from pipeline.flags import check_pipeline_flags
    from pipeline.run import parse_options

    argv = ["--input", "a.parquet", "--output", "o", "--target_model", "t", "--drafter", "none",
            "--top_k", none, "--top_p", none, "--max_item_seconds", none]
    check_pipeline_flags(argv)
    opts = parse_options(argv)
    assert (opts.top_k, opts.top_p, opts.max_item_seconds) == (None, None, None)


def test_resuming_a_run_whose_every_row_failed_starts_the_job(tmp_path, saved_pairs, capsys, no_work, src):
    """Its failed rows are tried again; it is an earlier run's output, not a typo."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target, _ = saved_pairs["llama"]
    earlier = tmp_path / "earlier" / "gens"
    earlier.parent.mkdir()
    pq.write_table(pa.table({"id": ["a"], "error_type": ["PromptTooLong"], "error": ["x"]}),
                   f"{earlier}-failed-00000-of-00001.parquet")
    assert main(_args(src, tmp_path / "run" / "gens", target, None, "--resume_from", str(earlier)),
                wait=False) == 0, capsys.readouterr().err
    assert len(no_work) == 1


def test_a_cpu_job_is_not_fitted_to_the_gpus_of_its_accelerator(tmp_path, saved_pairs, capsys, no_work, src, caplog):
    import logging

    from pipeline.fit import check_fit
    from pipeline.run import parse_options

    target, _ = saved_pairs["llama"]
    argv = _args(src, tmp_path / "run" / "gens", target, None, "--device", "cpu", "--accelerator",
                 "type:nvidia-tesla-p4;count:1")
    with caplog.at_level(logging.INFO, logger="pipeline.fit"):
        assert check_fit(parse_options(argv)) is None
    assert "worker GPUs" not in caplog.text
    assert main(argv, wait=False) == 0, capsys.readouterr().err
    assert len(no_work) == 1


def test_a_tokenizer_folder_with_a_broken_config_is_named_as_the_tokenizer(tmp_path, saved_pairs, capsys, no_work,
                                                                           src):
    import shutil

    target, _ = saved_pairs["llama"]
    tok = tmp_path / "tok"
    shutil.copytree(target, tok)
    (tok / "tokenizer_config.json").write_text("[]")  # (transformers raised a TypeError)
    capsys.readouterr()
    assert main(_args(src, tmp_path / "run" / "gens", target, None, "--tokenizer", str(tok)), wait=False) == 2
    assert f"--tokenizer '{tok}': cannot read tokenizer_config.json (a JSON list, not an object)" in (
        _one_line_error(capsys))
    assert not no_work


def test_an_int8_draft_one_row_at_a_time_starts_the_job(tmp_path, saved_pairs, capsys, no_work, src):
    target, draft = saved_pairs["llama"]
    assert main(_args(src, tmp_path / "run" / "gens", target, draft, "--draft_dtype", "int8", "--device", "cpu"),
                wait=False) == 0, capsys.readouterr().err
    assert len(no_work) == 1


def test_a_passed_through_column_missing_or_doubled_stops_the_job(tmp_path, saved_pairs, capsys, no_work, src):
    import pyarrow as pa
    import pyarrow.parquet as pq

    target, _ = saved_pairs["llama"]
    doubled = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["1"]), pa.array(["hi"]), pa.array(["a"]), pa.array(["b"])],
                                        names=["id", "prompt", "ref", "ref"]), doubled)
    capsys.readouterr()
    for data, needle in [(src, "--passthrough_columns 'nosuch' is not a column of the input"),
                         (doubled, "the input has 2 columns named 'ref'")]:
        column = "nosuch" if data == src else "ref"
        assert main(_args(data, tmp_path / "run" / "gens", target, None, "--passthrough_columns", column),
                    wait=False) == 2
        assert needle in _one_line_error(capsys)
    assert not no_work


def test_an_incomplete_set_of_shards_stops_the_job_unless_the_pattern_names_some(tmp_path, saved_pairs, capsys,
                                                                                   no_work):
    """prepare (or a copy) interrupted after 2 of 4 shards: `prompts-*.parquet` decoded half the data without a
    word. A pattern naming some shards, and a whole set, run."""
    target, _ = saved_pairs["llama"]
    for i in (0, 1):
        write_prompts(tmp_path / f"prompts-{i:05d}-of-00004.parquet", [{"id": f"a{i}", "prompt": "Hello world!"}])
    capsys.readouterr()
    assert main(_args(tmp_path / "prompts-*.parquet", tmp_path / "run" / "gens", target, None), wait=False) == 2
    assert (f"2 of the 4 shards of {tmp_path}/prompts-*-of-00004.parquet are missing (e.g. {tmp_path}/"
            "prompts-00002-of-00004.parquet)") in _one_line_error(capsys)
    assert not no_work
    assert main(_args(tmp_path / "prompts-0000[01]-of-00004.parquet", tmp_path / "some" / "gens", target, None),
                wait=False) == 0
    for i in (2, 3):
        write_prompts(tmp_path / f"prompts-{i:05d}-of-00004.parquet", [{"id": f"a{i}", "prompt": "Hello world!"}])
    assert main(_args(tmp_path / "prompts-*.parquet", tmp_path / "all" / "gens", target, None), wait=False) == 0
    assert len(no_work) == 2


def test_a_setting_of_another_drafter_is_said_to_do_nothing(tmp_path, saved_pairs, no_work, src, caplog):
    """`--ngram_min_size 0` with the model drafter, `--draft_dtype int8` with none: ran without a word (the
    job runs: its setting changes nothing, as the sampling settings under greedy decoding)."""
    target, draft = saved_pairs["llama"]
    for drafter, extra, said in [("model", ["--ngram_min_size", "0"], "--ngram_min_size 0: a setting of --drafter "
                                  "ngram, and this job runs --drafter model: no effect"),
                                 ("none", ["--draft_dtype", "int8"], "--draft_dtype int8: a setting of --drafter "
                                  "model, and this job runs --drafter none: no effect")]:
        caplog.clear()
        argv = _args(src, tmp_path / drafter / "gens", target, draft if drafter == "model" else None,
                     "--drafter", drafter, *extra)
        assert main(argv, wait=False) == 0
        assert said in caplog.text
    assert len(no_work) == 2
