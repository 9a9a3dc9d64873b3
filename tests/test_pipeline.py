"""End-to-end DirectRunner jobs from Parquet to Parquet."""

import glob
import json
import logging
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from pipeline.run import main
from tests.tiny_models import not_utf8

GOOD = ["The quick brown fox", "def add(a, b):\n", "Summarize: the committee met", "Hello world!", "for i in",
        "Translate English to German: the house"]
BAD = {"null": None, "empty": "", "blank": "   \n", "control": "abc\x00def", "long": "word " * 400}


def write_prompts(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def read(pattern):
    files = sorted(glob.glob(pattern))
    assert files, pattern
    return pa.concat_tables([pq.read_table(f) for f in files])


def run_job(tmp_path, target, draft, *extra, prompts=None, name="run"):
    src = prompts or write_prompts(tmp_path / "prompts.parquet",
                                   [{"id": f"g{i}", "prompt": p, "topic": "x"} for i, p in enumerate(GOOD)])
    out = tmp_path / name / "gens"
    args = ["--input", src, "--output", str(out), "--target_model", str(target), "--max_new_tokens", "12"]
    args += ["--draft_model", str(draft)] if draft else []
    assert main(args + list(extra)) == 0
    return read(f"{out}-0*.parquet"), read(f"{out}-failed-*.parquet")


def greedy_reference(target_dir, prompt, n):
    tok = AutoTokenizer.from_pretrained(target_dir)
    from specdec_core.loading import load_model, resolve_device

    model = load_model(str(target_dir), resolve_device("cpu"), torch.float32)
    ids = tok(prompt).input_ids
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n)[0].tolist()
    new = out[1:] if model.config.is_encoder_decoder else out[len(ids):]
    return tok.decode(new, skip_special_tokens=True)


def test_every_row_ends_as_one_result_or_one_failed_row(tmp_path, saved_pairs, caplog):
    caplog.set_level(logging.INFO, logger="pipeline.run")
    target, draft = saved_pairs["llama"]
    rows = [{"id": f"g{i}", "prompt": p, "topic": "t"} for i, p in enumerate(GOOD)]
    rows += [{"id": name, "prompt": value, "topic": "t"} for name, value in BAD.items()]
    src = write_prompts(tmp_path / "a.parquet", rows)
    # A second shard whose prompt column has the wrong type.
    write_prompts(tmp_path / "b.parquet", [{"id": "int", "prompt": 42, "topic": "t"}])
    results, failed = run_job(tmp_path, target, draft, "--passthrough_columns", "topic",
                              prompts=str(tmp_path / "*.parquet"))
    assert src
    assert results.num_rows + failed.num_rows == len(rows) + 1
    assert sorted(results["id"].to_pylist()) == sorted(f"g{i}" for i in range(len(GOOD)))
    errors = dict(zip(failed["id"].to_pylist(), failed["error_type"].to_pylist(), strict=True))
    assert errors == {"null": "NullPrompt", "empty": "EmptyPrompt", "blank": "EmptyPrompt",
                      "control": "InvalidCharacters", "long": "PromptTooLong", "int": "InvalidPromptType"}
    assert all(failed["error_message"].to_pylist())
    assert failed.schema.names == ["id", "prompt", "error_type", "error_message"]
    expected = ["id", "generation", "new_tokens", "draft_tokens", "accepted_tokens", "acceptance_rate",
                "verify_steps", "latency_s", "ttft_s", "tokens_per_s", "finish_reason", "seed", "prompt_tokens",
                "draft_steps", "prefill_s", "draft_s", "verify_s", "admit_s", "admitted_with", "admit_passes",
                "rejections", "topic"]
    assert results.schema.names == expected
    assert results.schema.field("new_tokens").type == pa.int32()
    # a round ends at a rejected draft, at most once: the paper's a = accepted / (accepted + rejections)
    rows = results.to_pylist()
    assert all(r["rejections"] <= min(r["verify_steps"], r["draft_tokens"] - r["accepted_tokens"]) for r in rows)
    assert sum(r["rejections"] for r in rows) > 0
    assert results["topic"].to_pylist() == ["t"] * len(GOOD)
    # the last line counts them; the files are compressed
    assert f"done: {len(GOOD)} result rows, 6 failed rows; results in" in caplog.text
    for f in glob.glob(str(tmp_path / "run" / "gens-*.parquet")):
        assert pq.ParquetFile(f).metadata.row_group(0).column(0).compression == "SNAPPY", f


@pytest.mark.parametrize("batch_size", ["1", "2"])
def test_a_value_that_is_not_utf8_fails_its_row_not_the_job(tmp_path, saved_pairs, batch_size):
    """... and a valid id it shares with another row fails both as DuplicateId (the readable copy
    was generated: the bad one had failed before the grouping by id)."""
    target, draft = saved_pairs["llama"]
    src = tmp_path / "corrupt.parquet"
    pq.write_table(pa.table({  # (the bad id's U+FFFD form is another row's valid id: no DuplicateId)
        "id": not_utf8(["g0", "g1", "bad-prompt", b"bad-id-\xff", "bad-topic", "bad-id-\ufffd", "dup", "dup"]),
        "prompt": not_utf8([GOOD[0], GOOD[1], b"caf\xe9 au lait", GOOD[2], GOOD[3], GOOD[4], GOOD[0], GOOD[1]]),
        "topic": not_utf8(["t", "t", "t", "t", b"\xc3", "t", "t", b"\xff"]),
    }), src)
    results, failed = run_job(tmp_path, target, draft, "--passthrough_columns", "topic", "--batch_size",
                              batch_size, prompts=str(src))
    assert sorted(results["id"].to_pylist()) == ["bad-id-\ufffd", "g0", "g1"]
    dups = [row for row in failed.to_pylist() if row["id"] == "dup"]
    assert [row["error_type"] for row in dups] == ["DuplicateId"] * 2
    assert sorted(row["prompt"] for row in dups) == sorted(GOOD[:2])
    by_id = {row["id"]: row for row in failed.to_pylist() if row["id"] != "dup"}
    assert set(by_id) == {"bad-prompt", "bad-id-\ufffd", "bad-topic"}
    assert {row["error_type"] for row in by_id.values()} == {"InvalidUtf8"}
    assert "'prompt'" in by_id["bad-prompt"]["error_message"]
    assert by_id["bad-prompt"]["prompt"] == "caf\ufffd au lait"
    assert "'id'" in by_id["bad-id-\ufffd"]["error_message"] and by_id["bad-id-\ufffd"]["prompt"] == GOOD[2]
    assert "'topic'" in by_id["bad-topic"]["error_message"] and by_id["bad-topic"]["prompt"] == GOOD[3]


@pytest.mark.slow
# (each batch path once: a process of its own costs seconds)
@pytest.mark.parametrize(("batch_size", "standin", "needle"), [("4", "device", "illegal memory access"),
                                                               ("1", "pair", "every copy of the pair is gone")])
def test_a_device_error_that_cuda_keeps_ends_the_worker_not_every_row(tmp_path, saved_pairs, batch_size, standin,
                                                                      needle):
    """An illegal memory access or a device-side assert leaves the GPU failing every later call of
    the process: failing rows there would drain the whole input into failed rows in seconds. The
    worker process ends instead (Dataflow restarts it and retries its rows), no row failed for it."""
    import os
    import subprocess
    import sys

    target, draft = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": f"g{i}", "prompt": p} for i, p in enumerate(GOOD)])
    out = tmp_path / "out" / "gens"
    # (TMPDIR: Beam's temporary folder, which a process that ends this way cannot remove, goes with the test's)
    child = subprocess.run([sys.executable, "-m", "tests.device_failure_child", "--input", src, "--output", str(out),
                            "--target_model", str(target), "--draft_model", str(draft), "--max_new_tokens", "4",
                            "--batch_size", batch_size], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "STANDIN": standin, "TMPDIR": str(tmp_path)})
    assert child.returncode == 75, child.stderr[-2000:]
    assert needle in child.stderr and "this worker process ends" in child.stderr
    assert not glob.glob(f"{out}-failed*")


@pytest.mark.parametrize("batch_size", ["1", "4"])
def test_a_device_error_after_which_the_device_runs_fails_its_rows_only(tmp_path, saved_pairs, batch_size,
                                                                        monkeypatch):
    """A CUDA error after which the device still runs a kernel (the probe passes) fails its rows,
    and the job goes on. (In this process: the worker does not end.)"""
    from specdec_core import placement
    from specdec_core.batch_engine import BatchSpeculativeGenerator
    from specdec_core.engine import SpeculativeGenerator

    def broken(*args, **kwargs):
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered (a stand-in)")

    monkeypatch.setattr(SpeculativeGenerator, "generate", broken)
    monkeypatch.setattr(BatchSpeculativeGenerator, "generate_many", broken)
    monkeypatch.setattr(placement, "device_works", lambda devices: True)
    target, draft = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": f"g{i}", "prompt": p} for i, p in enumerate(GOOD)])
    out = tmp_path / "out" / "gens"
    assert main(["--input", src, "--output", str(out), "--target_model", str(target), "--draft_model", str(draft),
                 "--max_new_tokens", "4", "--batch_size", batch_size]) == 0
    failed = read(f"{out}-failed-*.parquet")
    assert failed.num_rows == len(GOOD)
    assert set(failed["error_type"].to_pylist()) == {"AcceleratorError"}


def test_valid_tables_read_as_beam_reads_them():
    """The rows Beam's own ReadFromParquet made (before the job converted tables itself)."""
    import datetime
    import decimal

    from apache_beam.io.parquetio import _ArrowTableToRowDictionaries

    from transforms.prompts import table_rows

    table = pa.table({
        "id": [1, 2], "prompt": pa.array(["a", None], pa.large_string()),
        "messages": [[{"role": "user", "content": "x"}], []],
        "at": pa.array([datetime.datetime(2026, 1, 1), None], pa.timestamp("us", tz="UTC")),
        "amount": pa.array([decimal.Decimal("1.50"), None], pa.decimal128(5, 2)),
        "kind": pa.array(["x", "y"]).dictionary_encode(),
        "tags": pa.array([[("k", 1)], None], pa.map_(pa.string(), pa.int64())),
    })
    assert table_rows(table, "prompt") == list(_ArrowTableToRowDictionaries().process(table))


def test_a_bad_value_of_a_dictionary_encoded_column_is_shown_as_its_text():
    """A failed row shows the U+FFFD form of a bad value in a dictionary-encoded column (a pandas
    categorical) as in a plain one, not a null."""
    from specdec_core.text import NotUtf8
    from transforms.prompts import table_rows

    table = pa.table({"id": ["a", "b"], "prompt": ["hi", "there"],
                      "topic": not_utf8(["t", b"caf\xe9"]).dictionary_encode()})
    rows = table_rows(table, "prompt")
    assert rows[0] == {"id": "a", "prompt": "hi", "topic": "t"}
    assert rows[1]["topic"] == "caf\ufffd" and isinstance(rows[1]["prompt"], NotUtf8)
    # ... and in a large_string column (pandas 3, Polars)
    large = pa.table({"id": ["a"], "prompt": ["hi"], "topic": pa.array([b"caf\xe9"], pa.large_binary()).view(
        pa.large_string())})
    assert table_rows(large, "prompt")[0]["topic"] == "caf\ufffd"


@pytest.mark.parametrize(("kind", "graphs"), [("gpt2", "auto"), ("bart", "auto"), ("gpt2", "on"), ("bart", "on")])
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_greedy_job_output_equals_target_generate(tmp_path, saved_pairs, kind, drafter, graphs):
    """graphs "on": static caches (without a GPU, eagerly), for a decoder-only and an encoder-decoder pair."""
    target, draft = saved_pairs[kind]
    results, failed = run_job(tmp_path, target, draft if drafter == "model" else None, "--drafter", drafter,
                              "--cuda_graphs", graphs)
    assert failed.num_rows == 0
    by_id = dict(zip(results["id"].to_pylist(), results.to_pylist(), strict=True))
    for i, prompt in enumerate(GOOD):
        row = by_id[f"g{i}"]
        assert row["generation"] == greedy_reference(target, prompt, 12)
        assert 1 <= row["new_tokens"] <= 12 and row["accepted_tokens"] <= row["draft_tokens"]
        assert row["verify_steps"] <= row["new_tokens"]
        assert row["tokens_per_s"] == pytest.approx(row["new_tokens"] / row["latency_s"])


@pytest.mark.slow
@pytest.mark.dynamo
@pytest.mark.parametrize("batch_size", ["1", "2"])
def test_a_compiled_job_decodes_what_generate_does(tmp_path, saved_pairs, batch_size):
    """--torch_compile on (what auto does on a GPU; here through dynamo alone, over static
    caches without graphs): the job's passes compiled and its draft's steps chained, through Beam."""
    target, draft = saved_pairs["gpt2"]
    results, failed = run_job(tmp_path, target, draft, "--cuda_graphs", "on", "--torch_compile", "--batch_size",
                              batch_size)
    assert failed.num_rows == 0
    by_id = dict(zip(results["id"].to_pylist(), results["generation"].to_pylist(), strict=True))
    assert [by_id[f"g{i}"] for i in range(len(GOOD))] == [greedy_reference(target, p, 12) for p in GOOD]


def test_baseline_runs_target_alone_with_no_drafts(tmp_path, saved_pairs):
    target, _ = saved_pairs["llama"]
    results, _ = run_job(tmp_path, target, None, "--drafter", "none")
    assert set(results["draft_tokens"].to_pylist()) == {0}
    assert results["acceptance_rate"].null_count == results.num_rows
    assert results["verify_steps"].to_pylist() == results["new_tokens"].to_pylist()


def test_sampling_is_reproducible_from_seed_and_id(tmp_path, saved_pairs):
    target, draft = saved_pairs["llama"]
    sample = ["--temperature", "1.0", "--top_k", "50"]
    a, _ = run_job(tmp_path, target, draft, *sample, name="a")
    b, _ = run_job(tmp_path, target, draft, *sample, name="b")
    c, _ = run_job(tmp_path, target, draft, *sample, "--seed", "1", name="c")

    def gens(t):
        return dict(zip(t["id"].to_pylist(), t["generation"].to_pylist(), strict=True))

    assert gens(a) == gens(b)
    assert gens(a) != gens(c)


@pytest.mark.parametrize(("ids", "batch_size"), [(["doc-a", "doc-b", "doc-c", "bad"], "1"), ([10, 11, 12, 13], "2")])
def test_an_id_column_named_seed_keeps_its_ids(tmp_path, saved_pairs, ids, batch_size):
    """Each row's seed travels beside the row, not in it: an input column named "seed" (here the id) is still the
    id in the output, and each row samples with the seed its id gives, whatever the id column is called."""
    target, _ = saved_pairs["llama"]
    prompts = GOOD[:3] + [""]
    runs = {}
    for column in ("seed", "id"):
        src = write_prompts(tmp_path / f"{column}.parquet",
                            [{column: i, "prompt": p} for i, p in zip(ids, prompts, strict=True)])
        runs[column] = run_job(tmp_path, target, None, "--drafter", "none", "--id_column", column, "--temperature",
                               "1.0", "--batch_size", batch_size, prompts=src, name=column)
    for results, failed in runs.values():
        assert sorted(results["id"].to_pylist()) == ids[:3] and failed["id"].to_pylist() == ids[3:]
    by_id = {column: sorted(zip(r["id"].to_pylist(), r["seed"].to_pylist(), r["generation"].to_pylist(),
                                strict=True)) for column, (r, _) in runs.items()}
    assert by_id["seed"] == by_id["id"]
    from specdec_core.loading import item_seed

    assert [s for _, s, _ in by_id["id"]] == [item_seed(0, i) for i in sorted(ids[:3])]  # each its id's own


def test_max_new_tokens_leaves_room_for_the_tokens_every_prompt_has(tmp_path, saved_pairs, capsys):
    """A tokenizer that adds a BOS gives every prompt two tokens at least: --max_new_tokens one short
    of the target's 256 positions failed every row as PromptTooLong after preflight let it through;
    it stops the job in one line, and one token less runs."""
    from tokenizers.processors import TemplateProcessing

    target, _ = saved_pairs["llama"]
    tok = AutoTokenizer.from_pretrained(target)
    tok._tokenizer.post_processor = TemplateProcessing(single=f"{tok.bos_token} $A",
                                                       special_tokens=[(tok.bos_token, tok.bos_token_id)])
    tok.save_pretrained(tmp_path / "tok")
    assert len(ids := AutoTokenizer.from_pretrained(tmp_path / "tok")("a")["input_ids"]) == 2
    assert ids[0] == tok.bos_token_id
    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "a"}])
    base = ["--input", src, "--output", str(tmp_path / "out" / "gens"), "--target_model", str(target),
            "--tokenizer", str(tmp_path / "tok"), "--drafter", "none"]
    assert main([*base, "--max_new_tokens", "255"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --max_new_tokens 255: --target_model {str(target)!r} can hold at most 254 new tokens (its decoder's "
        "256 positions, less the shortest prompt's 2 tokens); every row would fail")
    assert main([*base, "--max_new_tokens", "254"]) == 0
    assert not glob.glob(f"{tmp_path}/out/gens-failed-*.parquet") or read(
        f"{tmp_path}/out/gens-failed-*.parquet").num_rows == 0


def test_checkpoints_half_copied_stop_the_job_in_one_line(tmp_path, saved_pairs, capsys):
    """What an interrupted download or copy leaves passed the checks and failed every worker's load
    in a traceback (exit 1): a shard an index lists, missing; a .bin cut short; a draft folder with
    tokenizer_config.json and no tokenizer.json (an uncaught error in the checks themselves)."""
    from transformers import AutoModelForCausalLM

    target, draft = saved_pairs["llama"]
    model = AutoModelForCausalLM.from_pretrained(target)
    sharded, binary, partial = (tmp_path / name for name in ("sharded", "bin", "partial"))
    model.save_pretrained(sharded, max_shard_size="100KB")
    shutil.copytree(target, binary)
    (binary / "model.safetensors").unlink()
    torch.save(model.state_dict(), binary / "pytorch_model.bin")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 2
    for whole in (sharded, binary):  # (whole, they load)
        shutil.copytree(whole, tmp_path / f"whole-{whole.name}")
    resaved = tmp_path / "whole-resaved"  # (saved whole over a sharded save: the old index stays, never read)
    model.save_pretrained(resaved, max_shard_size="100KB")
    model.save_pretrained(resaved)
    assert (resaved / "model.safetensors.index.json").exists() and not list(resaved.glob("model-*"))
    shards[1].unlink()
    with open(binary / "pytorch_model.bin", "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    shutil.copytree(draft, partial)
    (partial / "tokenizer.json").unlink()
    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "a"}])
    base = ["--input", src, "--output", str(tmp_path / "out" / "gens"), "--target_model", str(target)]
    cases = {
        f"--draft_model '{sharded}': {shards[1].name}, listed in model.safetensors.index.json, is missing": [
            "--draft_model", str(sharded)],
        f"--draft_model '{binary}': pytorch_model.bin is damaged or cut short (ValueError: not a whole zip": [
            "--draft_model", str(binary)],
        f"--draft_model '{partial}': cannot load its tokenizer (": ["--draft_model", str(partial)],
    }
    for needle, extra in cases.items():
        assert main([*base, *extra]) == 2, needle
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"error: {needle}"), err
    assert not (tmp_path / "out").exists()
    for name in ("sharded", "bin", "resaved"):
        assert main([*base[:2], "--output", str(tmp_path / name / "gens"), "--target_model",
                     str(tmp_path / f"whole-{name}"), "--tokenizer", str(target), "--drafter", "none",
                     "--max_new_tokens", "2"]) == 0


def test_a_checkpoint_of_another_dtype_than_auto_is_said(tmp_path, saved_pairs, caplog):
    """--dtype auto decodes a float16 checkpoint in float32 on a CPU, where a plain from_pretrained
    keeps float16 (and greedy outputs can differ): the job says so; a float32 one says nothing."""
    from transformers import AutoModelForCausalLM

    target, _ = saved_pairs["llama"]
    half = tmp_path / "half"
    AutoModelForCausalLM.from_pretrained(target).to(torch.float16).save_pretrained(half)
    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "Hello"}])
    for name, model in (("half", half), ("full", target)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pipeline.preflight"):
            assert main(["--input", src, "--output", str(tmp_path / name / "gens"), "--target_model", str(model),
                         "--tokenizer", str(target), "--drafter", "none", "--max_new_tokens", "2"]) == 0
        said = [r.getMessage() for r in caplog.records if "its checkpoint is" in r.getMessage()]
        assert said == ([f"--target_model {half}: its checkpoint is float16; --dtype auto decodes it in float32 on a "
                         "CPU, bfloat16 on CUDA (outputs equal its generate() in that dtype; --dtype float16 keeps "
                         "the checkpoint's)"] if name == "half" else [])


def test_the_target_as_its_own_draft_is_said(tmp_path, saved_pairs, caplog):
    """The target's folder as --draft_model (in any spelling) ran without a word, slower than
    the target alone: every draft is kept and each costs a target pass."""
    target, _ = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "Hello"}])
    with caplog.at_level(logging.WARNING, logger="pipeline.preflight"):
        assert main(["--input", src, "--output", str(tmp_path / "out" / "gens"), "--target_model", str(target),
                     "--draft_model", f"{target}/../{target.name}/", "--max_new_tokens", "2"]) == 0
    assert [r.getMessage() for r in caplog.records if "is the target itself" in r.getMessage()] == [
        f"--draft_model {target}/../{target.name}/ is the target itself: every draft is kept, and each costs a pass "
        "of the target (--drafter none or ngram is faster)"]


def test_paths_with_a_tilde_no_shell_expanded(tmp_path, saved_pairs, monkeypatch):
    """`--output=~/x` reaches the job as it is (a shell expands ~ only at a word's start): it wrote
    a folder named ~ in the working directory; model paths the same way failed their checks."""
    target, _ = saved_pairs["llama"]
    home = tmp_path / "home"
    shutil.copytree(target, home / "models" / "t")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "Hello"}])
    assert main(["--input", src, "--output=~/out/gens", "--target_model=~/models/t", "--drafter", "none",
                 "--max_new_tokens", "2"]) == 0
    assert read(f"{home}/out/gens-0*.parquet")["id"].to_pylist() == ["a"]
    assert not (tmp_path / "~").exists()


def test_a_hub_id_not_in_the_local_cache_is_asked_of_the_hub_once(tmp_path, saved_pairs, monkeypatch, capsys):
    """Offline without HF_HUB_OFFLINE, a mistyped hub id waited ~25 s for the hub client's retries
    (and printed their warning) before the job's one line: the hub is asked once first (`model_info`),
    for a model and for a --tokenizer; without a hub to ask, the local hub cache decides (here it
    has neither). A repo the hub says is not there is refused as such."""
    import httpx2
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import RepositoryNotFoundError

    asked = []

    def unreachable(repo_id, **kwargs):
        asked.append(repo_id)
        if repo_id == "no/repo":
            request = httpx2.Request("GET", f"https://huggingface.co/api/models/{repo_id}")
            raise RepositoryNotFoundError("404 Client Error", response=httpx2.Response(404, request=request))
        raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    target, _ = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "a"}])
    base = ["--input", src, "--output", str(tmp_path / "out" / "gens"), "--drafter", "none"]
    assert main([*base, "--target_model", "no/such-model"]) == 2
    assert main([*base, "--target_model", str(target), "--tokenizer", "no/such-tok"]) == 2
    assert main([*base, "--target_model", "no/repo"]) == 2
    assert asked == ["no/such-model", "no/such-tok", "no/repo"]
    assert capsys.readouterr().err.strip().splitlines()[-3:] == [
        "error: --target_model 'no/such-model': no local directory of that name, and no hub model of that id loads "
        "(ConnectionError)",
        "error: --tokenizer 'no/such-tok': no local directory of that name, and no hub tokenizer of that id loads "
        "(ConnectionError)",
        "error: --target_model 'no/repo': no local directory of that name, and no hub model of that id loads "
        "(RepositoryNotFoundError)"]


def test_bad_settings_stop_before_any_work_in_one_line(tmp_path, saved_pairs, capsys, caplog):
    target, draft = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": "1", "prompt": "hi"}])
    numbers = write_prompts(tmp_path / "n.parquet", [{"id": "1", "prompt": 7}])
    doubled = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["1"]), pa.array(["hi"]), pa.array(["2"])],
                                        names=["id", "prompt", "id"]), doubled)
    dynamic_rope = tmp_path / "dynamic-rope"
    shutil.copytree(target, dynamic_rope)
    config = json.loads((dynamic_rope / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    (dynamic_rope / "config.json").write_text(json.dumps(config))
    no_weights = tmp_path / "no-weights"  # a model's JSON files alone: every worker's load failed
    no_weights.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(target / name, no_weights / name)
    cut, unknown, no_tokenizer, cut_json, bom_json, list_json = (tmp_path / name for name in (
        "cut", "unknown-type", "no-tokenizer", "cut-generation-config", "bom-generation-config", "list-json"))
    for copy in (cut, unknown, no_tokenizer, cut_json, bom_json, list_json):  # (each failed every worker's load, in a
        shutil.copytree(target, copy)  # traceback after the job began; cut and BOM configs: past their end tokens)
    (cut_json / "generation_config.json").write_text('{"eos_token_id": [2, 29], "max_le')
    (bom_json / "generation_config.json").write_bytes(b'\xef\xbb\xbf{"eos_token_id": [2, 29]}')  # (json takes it)
    (list_json / "tokenizer_config.json").write_text("[]")  # (transformers raised a TypeError)
    with open(cut / "model.safetensors", "r+b") as f:  # a copy cut short
        f.truncate(f.seek(0, 2) * 9 // 10)
    (unknown / "config.json").write_text(json.dumps({**json.loads((target / "config.json").read_text()),
                                                     "model_type": "llamazzz"}))  # a transformers too old for it
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tokenizer / name).unlink()
    # A config alone, from which transformers builds an empty tokenizer (T5's, BART's): it ran, every output empty.
    bare = {family: tmp_path / f"{family}-no-tokenizer" for family in ("t5", "bart")}
    for family, folder in bare.items():
        shutil.copytree(saved_pairs[family][0], folder)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).unlink()
    config_only = tmp_path / "t5-tokenizer-config-only"  # (a copy that took *.json: its spiece.model left behind)
    shutil.copytree(saved_pairs["t5"][0], config_only)
    (config_only / "tokenizer.json").unlink()
    (config_only / "tokenizer_config.json").write_text('{"tokenizer_class": "T5Tokenizer", "eos_token": "</s>"}')
    list_ids = tmp_path / "list-ids.parquet"  # ran, then no report or resume could group its output
    pq.write_table(pa.table({"id": [[1], [2]], "prompt": ["a", "b"]}), list_ids)
    bart_target, t5_draft = saved_pairs["bart"][0], saved_pairs["t5"][1]  # one tokenizer, other start tokens
    base = ["--input", src, "--output", str(tmp_path / "out/gens"), "--target_model", str(target)]
    cases = {
        f"--target_model '{no_weights}': no weights there": base[:4] + ["--target_model", str(no_weights),
                                                                        "--drafter", "none"],
        f"--draft_model '{no_weights}': no weights there": base + ["--draft_model", str(no_weights)],
        f"--draft_model '{cut}': model.safetensors is damaged or cut short": base + ["--draft_model", str(cut)],
        f"--target_model '{unknown}': transformers cannot read its config (ValueError: The checkpoint you are trying "
        "to load has model type `llamazzz`": base[:4] + ["--target_model", str(unknown), "--drafter", "none"],
        f"--target_model '{cut_json}': cannot read generation_config.json (": base[:4] + [
            "--target_model", str(cut_json), "--drafter", "none"],
        f"--target_model '{bom_json}': cannot read generation_config.json (Unexpected UTF-8 BOM": base[:4] + [
            "--target_model", str(bom_json), "--drafter", "none"],
        f"--target_model '{list_json}': cannot read tokenizer_config.json (a JSON list, not an object)": base[:4] + [
            "--target_model", str(list_json), "--drafter", "none"],
        f"--target_model '{no_tokenizer}': no tokenizer there (tokenizer.json, ": base[:4] + [
            "--target_model", str(no_tokenizer), "--drafter", "ngram"],
        **{f"--target_model '{folder}': no tokenizer there (tokenizer.json, ": base[:4] + [
            "--target_model", str(folder), "--drafter", "none"] for folder in bare.values()},
        f"--target_model '{config_only}': cannot load a tokenizer (ModelRefused: '{config_only}' holds none of its "
        "tokenizer's vocabulary files (spiece.model, tokenizer.json))": base[:4] + [
            "--target_model", str(config_only), "--drafter", "none"],
        f"--draft_model '{config_only}': cannot load its tokenizer (ModelRefused: ": base[:4] + [
            "--target_model", str(saved_pairs["t5"][0]), "--draft_model", str(config_only)],
        "--id_column 'id' is list<element: int64>, which cannot key rows": ["--input", str(list_ids)] + base[2:] + [
            "--drafter", "none"],
        "--prompt_column 'text'": base + ["--draft_model", str(draft), "--prompt_column", "text"],
        "--id_column 'key'": base + ["--draft_model", str(draft), "--id_column", "key"],
        "matches no files": ["--input", str(tmp_path / "nope-*.parquet")] + base[2:] + ["--draft_model", str(draft)],
        "--draft_model '/does/not/exist'": base + ["--draft_model", "/does/not/exist"],
        "needs --draft_model": base,
        "the target is encoder-decoder but the draft is causal": base[:4] + [
            "--target_model", str(saved_pairs["t5"][0]), "--draft_model", str(draft)],
        "--max_new_tokens must be >= 1": base + ["--draft_model", str(draft), "--max_new_tokens", "0"],
        # 256 positions: a prompt of one token leaves room for 255 new ones
        "--max_new_tokens 256: --target_model": base + ["--draft_model", str(draft), "--max_new_tokens", "256"],
        "--cuda_graphs on: --target_model": base[:4] + [  # its RoPE reads a length on the host
            "--target_model", str(dynamic_rope), "--draft_model", str(draft), "--cuda_graphs", "on"],
        "--cuda_graphs: invalid choice": base + ["--draft_model", str(draft), "--cuda_graphs", "always"],
        "--device 'tpu': expected auto, cpu, cuda or cuda:N": base + ["--draft_model", str(draft), "--device", "tpu"],
        "--prompt_column 'prompt' is int64: expected text": ["--input", numbers] + base[2:] + [
            "--draft_model", str(draft)],
        "the input has 2 columns named 'id'": ["--input", str(doubled)] + base[2:] + ["--draft_model", str(draft)],
        "error: --temperature must be a finite number >= 0, got nan": base + [
            "--drafter", "none", "--temperature", "nan"],
        "error: --top_p must be in (0, 1], got 1.5": base + [
            "--drafter", "none", "--temperature", "1", "--top_p", "1.5"],
        "error: --top_k must be >= 1 (none: no top-k), got 0": base + [  # (Hugging Face's 0 for none)
            "--drafter", "none", "--temperature", "1", "--top_k", "0"],
        "--ngram_min_size 1 and --ngram_max_size 0": base + ["--drafter", "ngram", "--ngram_max_size", "0"],
        # (the draft was ignored: a job that looked speculative ran without it)
        f"--draft_model '{draft}' with --drafter ngram, which uses no draft model: drop --draft_model, or use "
        "--drafter model": base + ["--draft_model", str(draft), "--drafter", "ngram"],
        f"--draft_model '{draft}' with --drafter none, which uses no draft model": base + [
            "--drafter", "none", "--draft_model", str(draft)],
        # a name, not a path: a hub id that does not resolve (it failed every row on the workers)
        "--tokenizer 'nosuch_tok': no local directory of that name, and no hub tokenizer of that id loads": base + [
            "--drafter", "ngram", "--tokenizer", "nosuch_tok"],
        "--tokenizer 'my_tok': no local directory": base + ["--draft_model", str(draft), "--tokenizer", "my_tok"],
        # (said "no such directory" of a file that is there; and to pass --tokenizer DIR to one who had)
        f"--tokenizer '{target}/tokenizer.json': a file: pass the folder that holds the tokenizer's files": base + [
            "--drafter", "none", "--tokenizer", f"{target}/tokenizer.json"],
        f"--tokenizer '{no_tokenizer}': no tokenizer there (tokenizer.json, tokenizer_config.json, vocab.json, "
        "tokenizer.model, spiece.model, sentencepiece.bpe.model): pass a folder that has one": base + [
            "--drafter", "none", "--tokenizer", str(no_tokenizer)],
        "--target_model 'no/such-model': no local directory of that name, and no hub model": base[:4] + [
            "--target_model", "no/such-model", "--drafter", "none"],
        f"--draft_model '{t5_draft}': decoder start tokens differ: target 2, draft 0": base[:4] + [
            "--target_model", str(bart_target), "--draft_model", str(t5_draft)],
        # (an int8 draft's rows were refused when the workers loaded it, naming neither the draft nor its dtype)
        "--draft_dtype int8 with --batch_size 2: dynamic quantization scales a pass's rows together": base + [
            "--draft_model", str(draft), "--draft_dtype", "int8", "--batch_size", "2"],
        # (a comma split the prefix where several are read: report and resume found no files)
        "a prefix cannot hold *, ?, [ or ,": base[:2] + ["--output", str(tmp_path / "out/run,v2")] + base[4:] + [
            "--drafter", "none"],
        # (it wrote out/run1-*.parquet, beside the folder)
        f"--output '{tmp_path / 'out/run1'}/': a prefix names files": base[:2] + [
            "--output", str(tmp_path / "out/run1") + "/"] + base[4:] + ["--drafter", "none"],
        # (malformed gs:// paths met Beam's and the storage client's credential retries: tracebacks, or two minutes)
        "--output 'gs://bucket': names a bucket, not files in it": base[:2] + ["--output", "gs://bucket"] + base[4:] + [
            "--drafter", "none"],
        "--input 'gs:///x/*.parquet': not a Cloud Storage path (gs://BUCKET/OBJECT": [
            "--input", "gs:///x/*.parquet"] + base[2:] + ["--drafter", "none"],
        "--target_model 'gs://bu@cket/m': not a Cloud Storage path": base[:4] + [
            "--target_model", "gs://bu@cket/m", "--drafter", "none"],
        # (it wrote out/p.parquet-00000-of-00001.parquet)
        f"--output '{tmp_path}/out/p.parquet': a prefix, not a file's name": base[:2] + [
            "--output", f"{tmp_path}/out/p.parquet"] + base[4:] + ["--drafter", "none"],
        # (the fit check was skipped and the job ran; Dataflow refuses such a hint)
        "--accelerator 'bogus': names no GPU type": base + ["--drafter", "none", "--accelerator", "bogus"],
        "--accelerator: count:0 in 'type:nvidia-l4;count:0': expected a whole number of GPUs": base + [
            "--drafter", "none", "--accelerator", "type:nvidia-l4;count:0"],
        # (both wrote beside the folder they name: '' as the working folder's, a folder as its name's files)
        "--output '': names no files: say DIR/gens": base[:2] + ["--output", ""] + base[4:] + ["--drafter", "none"],
        f"--output '{tmp_path}': a prefix names files (PREFIX-00000-of-00001.parquet), not a folder: say "
        f"{tmp_path}/gens for": base[:2] + ["--output", str(tmp_path)] + base[4:] + ["--drafter", "none"],
        # (it ran, then every row's write failed in a traceback: "Not a directory")
        f"--output '{src}/run/gens': {src} is a file, where the output's folder must be": base[:2] + [
            "--output", f"{src}/run/gens"] + base[4:] + ["--drafter", "none"],
        "--output 'gs://bucket/run1/': a prefix names files (PREFIX-00000-of-00001.parquet), not a folder: say "
        "gs://bucket/run1/gens": base[:2] + ["--output", "gs://bucket/run1/"] + base[4:] + ["--drafter", "none"],
    }
    capsys.readouterr()
    for needle, args in cases.items():
        caplog.clear()
        assert main(args) == 2, needle
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and needle in err and "\n" not in err, err
        # (transformers writes to the stderr it found at import: its lines are seen here as records)
        assert not [r.getMessage() for r in caplog.records if r.name.startswith("transformers")], needle
    assert not (tmp_path / "out").exists()


def test_input_files_that_cannot_make_one_output_stop_before_any_work(tmp_path, saved_pairs, capsys):
    """Every input file's footer is read first: a later shard without a column the job reads,
    with ids or passed-through values of another type (the output has one schema), or not
    Parquet at all, failed the whole job after its work; ids Beam cannot encode deterministically,
    and a column passed through twice (an unreadable output), too."""
    target, _ = saved_pairs["llama"]
    first = [{"id": "1", "prompt": "hi", "ref": "a"}]

    def job(name, rows=None, *extra, raw=None):
        folder = tmp_path / name
        folder.mkdir()
        write_prompts(folder / "a.parquet", first)
        if raw is not None:
            (folder / "b.parquet").write_bytes(raw)
        elif rows is not None:
            pq.write_table(rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows), folder / "b.parquet")
        return main(["--input", str(folder / "*.parquet"), "--output", str(folder / "out/gens"),
                     "--target_model", str(target), "--drafter", "none", "--max_new_tokens", "2", *extra])

    capsys.readouterr()
    for needle, args in {
        "b.parquet has no 'id' column (--id_column)": ("no-id", [{"prompt": "x", "ref": "b"}]),
        "b.parquet's 'id' column (--id_column) is int64": ("int-id", [{"id": 2, "prompt": "x", "ref": "b"}]),
        "b.parquet's 'ref' column (--passthrough_columns) is int64": (
            "int-ref", [{"id": "2", "prompt": "x", "ref": 3}], "--passthrough_columns", "ref"),
        "b.parquet has no 'prompt' column": ("no-prompt", [{"id": "2", "ref": "b"}]),
        "--passthrough_columns names 'ref' twice": ("twice", None, "--passthrough_columns", "ref,ref"),
    }.items():
        assert job(*args) == 2, needle
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and needle in err and "\n" not in err, err
    assert job("not-parquet", None, raw=b"id,prompt\n2,x\n") == 2
    assert "b.parquet is not a readable Parquet file" in capsys.readouterr().err
    assert not any((tmp_path / name / "out").exists() for name in ("no-id", "int-id", "int-ref", "not-parquet"))

    stamped = tmp_path / "stamped.parquet"
    pq.write_table(pa.table({"id": pa.array([0], pa.timestamp("s")), "prompt": ["hi"]}), stamped)
    assert main(["--input", str(stamped), "--output", str(tmp_path / "s/gens"), "--target_model", str(target),
                 "--drafter", "none"]) == 2
    assert "--id_column 'id' is timestamp[ms], which Beam cannot encode" in capsys.readouterr().err

    # Files written by other tools: large strings (pandas 3, Polars), categoricals, a column of
    # nulls only; their values go into the first file's columns as they are.
    other = pa.table({"id": pa.array(["2", "3"], pa.large_string()),
                      "prompt": pa.array(["hi", "there"]).dictionary_encode(),
                      "ref": pa.array([None, None], pa.null())})
    assert job("other-writers", other, "--passthrough_columns", "ref") == 0
    results = read(str(tmp_path / "other-writers/out/gens-0*.parquet"))
    assert sorted(results["id"].to_pylist()) == ["1", "2", "3"]
    assert dict(zip(results["id"].to_pylist(), results["ref"].to_pylist(), strict=True)) == {"1": "a", "2": None,
                                                                                              "3": None}
    # ... and as the first (or only) file, whose column types are checked as their values' (a categorical prompt
    # is text)
    from pipeline.options import SpecDecOptions
    from pipeline.preflight import preflight

    pq.write_table(other.drop_columns(["ref"]), tmp_path / "other-alone.parquet")
    preflight(SpecDecOptions(["--input", str(tmp_path / "other-alone.parquet"), "--output",
                              str(tmp_path / "other-alone" / "gens"), "--target_model", str(target), "--drafter",
                              "none"]))


def _damage(path, row_group: int, column: int) -> None:
    """32 bytes of a data page of a column overwritten, the footer as it was."""
    data = bytearray(path.read_bytes())
    page = pq.ParquetFile(path).metadata.row_group(row_group).column(column).data_page_offset
    data[page:page + 32] = bytes(b ^ 0xA5 for b in data[page:page + 32])
    path.write_bytes(bytes(data))


def test_an_input_file_damaged_inside_is_named_in_one_line(tmp_path, saved_pairs, capsys):
    """Preflight reads footers only; a file whose data pages are damaged (a bad copy, a disk) failed the
    job with Beam's traceback, which names no file. The job ends in one line naming it, not the whole one;
    an earlier run's file that --resume_from reads, too."""
    target, _ = saved_pairs["llama"]
    write_prompts(tmp_path / "a.parquet", [{"id": f"a{i}", "prompt": GOOD[0]} for i in range(3)])
    pq.write_table(pa.Table.from_pylist([{"id": f"b{i}", "prompt": f"{GOOD[2]} {i}"} for i in range(300)]),
                   tmp_path / "b.parquet", row_group_size=100)
    _damage(tmp_path / "b.parquet", 1, 1)  # (the prompts)
    earlier = tmp_path / "out" / "gens-00000-of-00001.parquet"  # an earlier run's, put back: no row was decoded
    earlier.parent.mkdir()
    write_prompts(earlier, [{"id": "old", "generation": "kept"}])
    capsys.readouterr()
    args = ["--target_model", str(target), "--drafter", "none", "--max_new_tokens", "2"]
    assert main(["--input", str(tmp_path / "*.parquet"), "--output", str(tmp_path / "out/gens"), *args,
                 "--overwrite"]) == 1
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: --input: 1 of its files cannot be read") and "Traceback" not in err, err
    assert f"{tmp_path / 'b.parquet'} (row group 1 of 3: " in line and "a.parquet" not in line
    assert sorted(p.name for p in earlier.parent.iterdir()) == [earlier.name]
    assert pq.read_table(earlier).to_pylist() == [{"id": "old", "generation": "kept"}]

    done = tmp_path / "done" / "gens-00000-of-00001.parquet"
    done.parent.mkdir()
    pq.write_table(pa.Table.from_pylist([{"id": f"a{i}", "generation": "x"} for i in range(300)]), done,
                   row_group_size=100)
    _damage(done, 2, 0)  # (the ids, which a resumed run reads)
    assert main(["--input", str(tmp_path / "a.parquet"), "--output", str(tmp_path / "resumed/gens"), *args,
                 "--resume_from", str(done.parent / "gens")]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"error: --resume_from: 1 of its files cannot be read past their footers: {done} "
                           "(row group 2 of 3: "), line


def test_a_gs_model_that_cannot_be_reached_stops_the_job_in_one_line(tmp_path, monkeypatch, capsys):
    """No credentials, no network or no bucket: the storage client's error (here raised at once; for real after its
    retries) becomes one line naming the flag, before any other check reads the model directory."""
    from apache_beam.io.filesystems import FileSystems

    real = FileSystems.exists

    def storage(unreachable: str):
        def exists(path: str) -> bool:
            if path.startswith(unreachable):
                raise OSError("Timeout of 120.0s exceeded,\nlast exception: storage.googleapis.com is not resolved")
            return False if path.startswith("gs://") else real(path)

        return staticmethod(exists)

    src = write_prompts(tmp_path / "p.parquet", [{"id": "1", "prompt": "hi"}])
    capsys.readouterr()
    for flag, path in (("--target_model", "gs://models/t"), ("--draft_model", "gs://models/d")):
        monkeypatch.setattr(FileSystems, "exists", storage(path))
        assert main(["--input", src, "--output", str(tmp_path / "out/gens"), "--target_model", "gs://models/t",
                     "--draft_model", "gs://models/d"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{flag} {path!r}: cannot reach it (OSError: Timeout of 120.0s" in err[0], err


@pytest.mark.slow
def test_a_refusal_after_the_pairs_check_is_one_line_on_stderr(tmp_path, saved_pairs):
    """The command as a user runs it: the drafting mode, logged by the pair's check, is logged only
    once every check passed (it came first on stderr, two lines)."""
    import subprocess
    import sys

    target, draft = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": "1", "prompt": GOOD[0]}])
    child = subprocess.run([sys.executable, "-m", "pipeline.run", "--input", src, "--output", str(tmp_path / "gens"),
                            "--target_model", str(target), "--draft_model", str(draft), "--chat_template"],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 2
    assert child.stderr.strip().splitlines() == [child.stderr.strip()] and "has no chat template" in child.stderr


@pytest.mark.slow
def test_the_job_says_what_it_deletes_and_where_its_results_are(tmp_path, saved_pairs):
    """As a user runs it: the job's own lines (--overwrite's deletions, the placement, where the
    results are) reach stderr (they went to the root logger, which stays at WARNING); --overwrite
    deletes a killed run's staging folders of this prefix, not another prefix's."""
    import subprocess
    import sys

    target, _ = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": "1", "prompt": GOOD[0]}])
    (tmp_path / "gens-00000-of-00001.parquet").write_bytes(b"an earlier run's")
    hexes = "0123456789abcdef" * 2
    killed = [tmp_path / f"beam-temp-gens-{hexes}", tmp_path / f"beam-temp-gens-failed-{hexes[::-1]}"]
    (killed[0] / "sub").mkdir(parents=True)
    (killed[0] / "sub" / "shard.parquet").write_bytes(b"a killed run's")
    killed[1].mkdir()  # created, nothing written yet
    killed.append(tmp_path / f".overwritten-gens-{hexes}")  # set aside by an --overwrite launcher killed mid-job
    killed[2].mkdir()
    (killed[2] / "gens-00000-of-00001.parquet").write_bytes(b"a run before it")
    other = tmp_path / f"beam-temp-gens-v2-{hexes}"  # another prefix's (gens-v2), perhaps running
    other.mkdir()
    (tmp_path / f".overwritten-gens-v2-{hexes}").mkdir()
    child = subprocess.run([sys.executable, "-m", "pipeline.run", "--input", src, "--output", str(tmp_path / "gens"),
                            "--target_model", str(target), "--drafter", "none", "--max_new_tokens", "2",
                            "--overwrite"], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    for said in ("--overwrite: moved 1 earlier output files", "--overwrite: deleting 3 folders of unfinished "
                 "writes", "placement on each worker", "--overwrite: deleting the 1 earlier output files in",
                 "done: 1 result row, 0 failed rows; results in"):
        assert said in child.stderr, said
    assert [p.name for p in tmp_path.glob(".overwritten-*")] == [f".overwritten-gens-v2-{hexes}"]  # (this run's: gone)
    assert not any(k.exists() for k in killed) and other.is_dir()
    assert sorted(p.name for p in tmp_path.glob("beam-temp-*")) == [other.name]  # the job's own: gone when it ends


def test_bare_relative_paths_work_as_paths_with_a_folder(tmp_path, saved_pairs, monkeypatch, capsys):
    """`--input 'p-*.parquet' --output gens` from the files' folder: Beam matches only absolute
    local paths, so the input matched nothing, the finished job kept its chunks, the report found
    no files, and a second job into `gens` was not refused (its rows mixed with the first's)."""
    from pipeline.report.summary import main as report
    from pipeline.tune.tuner import read_sample
    from transforms.durable import read_outputs

    target, _ = saved_pairs["llama"]
    monkeypatch.chdir(tmp_path)
    for i in range(2):
        write_prompts(tmp_path / f"p-{i}.parquet", [{"id": str(i), "prompt": GOOD[i]}])
    args = ["--input", "p-*.parquet", "--output", "gens", "--target_model", str(target), "--drafter", "none",
            "--max_new_tokens", "2"]
    assert main(args) == 0
    assert sorted(p.name for p in tmp_path.glob("gens-*")) == ["gens-00000-of-00001.parquet",
                                                                 "gens-failed-00000-of-00001.parquet"]
    assert sorted(read_outputs("gens")[0]["id"].to_pylist()) == ["0", "1"]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --output ") and "already holds 2 output files" in err
    assert report(["gens"]) == 0
    assert main(["--input", "p-1.parquet", "--output", "again", "--resume_from", "gens", *args[4:]]) == 0
    assert read_outputs("again")[0].num_rows == 0  # its one id was done
    assert len(read_sample("p-*.parquet", "prompt", 5, lambda t: [len(t), ord(t[0])])[0]) == 2  # (both files)


def test_file_order_and_string_layouts_do_not_decide_whether_a_job_runs(tmp_path, saved_pairs):
    """A passed-through column of nulls only in the first file takes a later file's type (it was
    refused, while the same files named the other way round ran); an earlier run's string ids
    resume an input whose ids are large strings (pandas 3, Polars)."""
    target, _ = saved_pairs["llama"]
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.table({"id": ["1"], "prompt": ["hi"], "ref": pa.array([None], pa.null())}), folder / "a.parquet")
    pq.write_table(pa.table({"id": ["2"], "prompt": ["there"], "ref": ["b"]}), folder / "b.parquet")
    common = ["--target_model", str(target), "--drafter", "none", "--max_new_tokens", "2"]
    assert main(["--input", str(folder / "*.parquet"), "--output", str(tmp_path / "one/gens"),
                 "--passthrough_columns", "ref", *common]) == 0
    results = read(str(tmp_path / "one/gens-0*.parquet"))
    assert results.schema.field("ref").type == pa.string()
    assert dict(zip(results["id"].to_pylist(), results["ref"].to_pylist(), strict=True)) == {"1": None, "2": "b"}
    large = tmp_path / "large.parquet"
    pq.write_table(pa.table({"id": pa.array(["1", "2", "3"], pa.large_string()), "prompt": ["hi", "there", "x"]}),
                   large)
    assert main(["--input", str(large), "--output", str(tmp_path / "two/gens"),
                 "--resume_from", str(tmp_path / "one/gens"), *common]) == 0
    assert read(str(tmp_path / "two/gens-0*.parquet"))["id"].to_pylist() == ["3"]
    # ids of nulls only in the first file and times in the next: refused as times are, whatever the order
    stamped = tmp_path / "stamped"
    stamped.mkdir()
    pq.write_table(pa.table({"id": pa.array([None], pa.null()), "prompt": ["hi"]}), stamped / "a.parquet")
    pq.write_table(pa.table({"id": pa.array([0], pa.timestamp("s")), "prompt": ["x"]}), stamped / "b.parquet")
    assert main(["--input", str(stamped / "*.parquet"), "--output", str(tmp_path / "three/gens"), *common]) == 2


def test_plain_direct_runner_does_not_try_to_download_prism(tmp_path, saved_pairs, caplog):
    target, draft = saved_pairs["llama"]
    with caplog.at_level(logging.INFO):
        results, _ = run_job(tmp_path, target, draft, "--runner", "DirectRunner")
    assert results.num_rows == len(GOOD)
    assert "prism" not in caplog.text.lower()


def test_progress_is_reported_as_beam_metrics(tmp_path, saved_pairs):
    import apache_beam as beam
    from apache_beam.metrics import MetricsFilter

    from pipeline.preflight import preflight
    from pipeline.run import build_pipeline, parse_options

    target, draft = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": str(i), "prompt": p} for i, p in enumerate(GOOD)])
    opts = parse_options(["--input", src, "--output", str(tmp_path / "o/gens"), "--target_model", str(target),
                          "--draft_model", str(draft), "--max_new_tokens", "8"])
    p = beam.Pipeline(options=opts)
    build_pipeline(p, opts, preflight(opts))
    result = p.run()
    result.wait_until_finish()
    counters = {c.key.metric.name: c.committed
                for c in result.metrics().query(MetricsFilter().with_namespace("specdec"))["counters"]}
    assert counters["prompts_generated"] == len(GOOD)
    assert counters["new_tokens"] == 8 * len(GOOD)
    assert 0 <= counters["accepted_tokens"] <= counters["draft_tokens"]


def test_the_last_line_counts_rows_only_as_the_runner_reports_them():
    """Counters summed over steps (committed, else attempted); none reported: no counts, rather than zeros."""
    from types import SimpleNamespace as NS

    from pipeline.run import _counts

    def result(*counters):
        found = [NS(key=NS(metric=NS(name=n)), committed=c, attempted=a) for n, c, a in counters]
        return NS(metrics=lambda: NS(query=lambda _: {"counters": found}))

    assert _counts(result()) == _counts(result(("prompts_generated", 3, 3))) == ""
    assert _counts(result(("result_rows", 2, 2), ("result_rows", None, 1), ("failed_rows", 1, 1))) == \
        "3 result rows, 1 failed row; "
    assert _counts(result(("failed_rows", 0, 0), ("rows_skipped_done", 4, 4))) == \
        "0 result rows, 0 failed rows (4 skipped rows: done in --resume_from); "


def test_progress_log_says_its_rate_is_per_prompt(caplog):
    """The progress line's rate is each prompt's own (summed latencies): batched prompts decode
    side by side, so it is not the job's throughput, and the line says so."""
    from transforms.model_handler import _Progress

    progress = _Progress(every_s=0)
    row = {"new_tokens": 8, "draft_tokens": 4, "accepted_tokens": 3, "verify_steps": 2, "latency_s": 2.0}
    with caplog.at_level(logging.INFO, logger="transforms.model_handler"):
        progress.record(row)
        progress.record(row)
    assert ("specdec: 1 prompt done in this thread, 8 new tokens, acceptance 0.75, 4.0 new tokens/s per prompt"
            in caplog.text)
    assert "specdec: 2 prompts done in this thread, 16 new tokens" in caplog.text


def test_hub_ids_resolve_from_the_local_hugging_face_cache(tmp_path, saved_pairs, monkeypatch):
    """Hub ids go through transformers' own resolution; offline, from a populated HF cache."""
    import shutil

    target, draft = saved_pairs["gpt2"]
    cache = tmp_path / "hub"
    for repo, src in (("acme/tiny-target", target), ("acme/tiny-draft", draft)):
        snap = cache / f"models--{repo.replace('/', '--')}" / "snapshots" / ("0" * 40)
        shutil.copytree(src, snap)
        (snap.parent.parent / "refs").mkdir()
        (snap.parent.parent / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    results, failed = run_job(tmp_path, "acme/tiny-target", "acme/tiny-draft")
    assert results.num_rows == len(GOOD) and failed.num_rows == 0
    local, _ = run_job(tmp_path, target, draft, name="local")
    assert sorted(results["generation"].to_pylist()) == sorted(local["generation"].to_pylist())
