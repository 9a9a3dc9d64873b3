"""Long jobs (issue 11): durable chunks, resume, duplicate ids, item time limit, output safety,
provenance, remote code, strict flags. Local FnApiRunner jobs on tiny models."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.run import main
from tests.test_pipeline import GOOD, write_prompts
from transforms.durable import read_outputs

ROOT = Path(__file__).resolve().parents[1]
# Columns of when and with which rows an item ran, which differ between runs of the same items.
TIMING = {"latency_s", "ttft_s", "tokens_per_s", "prefill_s", "draft_s", "verify_s", "admit_s", "admitted_with",
          "admit_passes"}


def _args(src, out, target, draft, *extra):
    args = ["--input", str(src), "--output", str(out), "--target_model", str(target), "--max_new_tokens", "8"]
    return args + (["--draft_model", str(draft)] if draft else ["--drafter", "none"]) + list(extra)


def _files(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.glob(f"{out.name}-*.parquet"))


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def _same(table: pa.Table) -> list[dict]:
    rows = table.select([c for c in table.column_names if c not in TIMING]).to_pylist()
    return sorted(rows, key=lambda r: str(r["id"]))


# -- 1 + 6: a finished job: final shards only, each with its provenance ---------------------------

def test_finished_job_keeps_final_shards_only_and_every_file_carries_provenance(tmp_path, saved_pairs):
    target, draft = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": f"g{i}", "prompt": p} for i, p in enumerate(GOOD)]
                        + [{"id": "bad", "prompt": ""}])
    out = tmp_path / "run" / "gens"
    assert main(_args(src, out, target, draft, "--temperature", "0.7", "--top_k", "20", "--seed", "5",
                      "--commit_every_s", "0")) == 0
    # the chunks committed during the run are gone once the final output is committed
    assert _files(out) == ["gens-00000-of-00001.parquet", "gens-failed-00000-of-00001.parquet"]
    for name in _files(out):
        record = json.loads(pq.read_metadata(out.parent / name).metadata[b"specdec_run"])
        assert record["target_model"] == str(target) and record["draft_model"] == str(draft)
        assert (record["drafter"], record["num_speculative_tokens"], record["gamma_policy"]) == ("model", 4, "fixed")
        assert (record["max_new_tokens"], record["temperature"], record["top_k"], record["top_p"],
                record["seed"]) == (8, 0.7, 20, None, 5)
        assert set(record["versions"]) == {"specdec-beam", "torch", "transformers", "apache-beam"}
        assert all(record["versions"].values())


# -- 3: duplicate ids ------------------------------------------------------------------------

def test_every_row_of_a_duplicated_id_fails_as_duplicate_id(tmp_path, saved_pairs):
    target, _ = saved_pairs["llama"]
    rows = [{"id": "a", "prompt": "Hello world!"}, {"id": "b", "prompt": "for i in"},
            {"id": "b", "prompt": "def add(a, b):"}, {"id": None, "prompt": "The quick"},
            {"id": None, "prompt": "brown fox"}, {"id": "c", "prompt": ""},
            {"id": "d", "prompt": "same"}, {"id": "d", "prompt": "same"},  # (two rows still: each is the input's)
            {"id": "e", "prompt": None}, {"id": "e", "prompt": "x"}]
    src = write_prompts(tmp_path / "p.parquet", rows)
    out = tmp_path / "run" / "gens"
    assert main(_args(src, out, target, None)) == 0
    results, failed = read_outputs(str(out))
    assert results["id"].to_pylist() == ["a"]
    errors = sorted(((r["id"] or "", r["prompt"], r["error_type"]) for r in failed.to_pylist()),
                    key=lambda e: (e[0], e[1] or "", e[2]))
    assert errors == [("", "The quick", "DuplicateId"), ("", "brown fox", "DuplicateId"),
                      ("b", "def add(a, b):", "DuplicateId"), ("b", "for i in", "DuplicateId"),
                      ("c", "", "EmptyPrompt"), ("d", "same", "DuplicateId"), ("d", "same", "DuplicateId"),
                      ("e", None, "DuplicateId"), ("e", "x", "DuplicateId")]
    assert sorted(failed.filter(pa.compute.equal(failed["id"], "b"))["error_message"].to_pylist()) == [
        "id 'b' occurs 2 times in the input (row 1 of 2)", "id 'b' occurs 2 times in the input (row 2 of 2)"]
    # a retried bundle commits the same rows again: still one per input row
    chunk = out.parent / f"gens-failed-chunk-{1:032x}-00000.parquet"
    pq.write_table(pq.read_table(next(out.parent.glob("gens-failed-0*.parquet"))), chunk)
    assert read_outputs(str(out))[1].num_rows == failed.num_rows


def test_a_duplicated_ids_rows_are_numbered_alike_in_any_order_and_a_done_id_is_skipped_whole():
    """A retry may group an id's rows in another order: their DuplicateId rows must be the same rows (readers keep
    one per id, prompt and message). An id an earlier run finished is skipped, however often the input holds it."""
    from transforms.ids import _Select

    rows = [{"id": "b", "prompt": "for i in"}, {"id": "b", "prompt": None}, {"id": "b", "prompt": "def add"}]
    select = _Select("prompt")
    numbered = [[out.value for out in select.process(("b", {"rows": order}))] for order in (rows, rows[::-1])]
    assert numbered[0] == numbered[1] and len(numbered[0]) == 3
    assert list(select.process(("b", {"rows": rows, "done": [None]}))) == []


def test_every_resume_prefix_is_read(tmp_path):
    """Ids done under any of the --resume_from prefixes (a job resumed twice), in final shards or
    chunks, are not generated again."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    from transforms.ids import SelectRows

    prefixes = []
    for name, ids in (("one", ["a"]), ("two", ["b"])):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"id": ids, "generation": ids}), tmp_path / name / "gens-00000-of-00001.parquet")
        prefixes.append(str(tmp_path / name / "gens"))
    # a killed run's prefix holds only its chunks: their ids are done too
    (tmp_path / "killed").mkdir()
    pq.write_table(pa.table({"id": ["c"], "generation": ["c"]}),
                   tmp_path / "killed" / f"gens-chunk-{1:032x}-00000.parquet")
    prefixes.append(str(tmp_path / "killed" / "gens"))
    # (the job's own required flags, which Beam parses for every options class imported: none is read here)
    with beam.Pipeline(options=PipelineOptions(["--input", "unread", "--output", "unread", "--target_model", "unread"])
                       ) as p:
        rows, _ = (p | beam.Create([{"id": i, "prompt": i} for i in "abcd"])
                   | SelectRows("id", "prompt", resume_from=prefixes))
        assert_that(rows | beam.Map(lambda row: row["id"]), equal_to(["d"]))


def test_rows_that_are_not_utf8_are_committed_before_any_generation(tmp_path, saved_pairs, monkeypatch):
    """Rows whose id is not valid UTF-8 are found as the input is read, before the grouping by id
    that every row to generate waits for: their failed chunk is on disk when the first row is
    generated (a Flatten before their commit ran it in a stage of its own, after generation)."""
    import glob

    from specdec_core import text
    from tests.tiny_models import not_utf8

    target, _ = saved_pairs["llama"]
    src = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": not_utf8(["a", b"bad-\xff", "b", "b"]),
                             "prompt": ["Hello world!", "caf", "for i in", "The quick"]}), src)
    out = tmp_path / "run" / "gens"
    seen: list[set[str]] = []
    generate = text.TextGenerator.generate

    def watched(self, prompt, seed=0):
        if not seen:
            chunks = glob.glob(f"{out}-failed-chunk-*.parquet")
            seen.append({e for path in chunks for e in pq.read_table(path)["error_type"].to_pylist()})
        return generate(self, prompt, seed)

    monkeypatch.setattr(text.TextGenerator, "generate", watched)
    assert main(_args(src, out, target, None, "--commit_every_s", "0")) == 0
    assert "InvalidUtf8" in seen[0]
    results, failed = read_outputs(str(out))
    assert results["id"].to_pylist() == ["a"]
    assert sorted(failed["error_type"].to_pylist()) == ["DuplicateId", "DuplicateId", "InvalidUtf8"]


@pytest.mark.parametrize("batch_size", [1, 2])
def test_rows_failed_in_generation_are_committed_while_the_job_runs(tmp_path, saved_pairs, monkeypatch, batch_size):
    """A row that fails in generation (batch 1: raised into RunInference's dead letter; batched: a
    per-row marker) is on disk as the next rows are generated, not only when all generation ends
    (a Flatten of the two kinds before their commit put it in a stage of its own, after generation)."""
    import glob

    from specdec_core import text
    from transforms.model_handler import LIST_FACTOR

    target, _ = saved_pairs["llama"]
    n = 1 + (len(GOOD) if batch_size == 1 else LIST_FACTOR * batch_size)  # (two calls at least)
    src = write_prompts(tmp_path / "p.parquet", [{"id": f"r{i}", "prompt": GOOD[i % len(GOOD)]} for i in range(n)])
    out = tmp_path / "run" / "gens"
    name = "generate" if batch_size == 1 else "generate_batch"
    original, seen = getattr(text.TextGenerator, name), []

    def first_call_fails(self, *args):
        seen.append({e for path in glob.glob(f"{out}-failed-chunk-*.parquet")
                     for e in pq.read_table(path)["error_type"].to_pylist()})
        if len(seen) > 1:
            return original(self, *args)
        if batch_size == 1:
            raise RuntimeError("boom")
        return [{"error_type": "Boom", "error_message": "boom"} for _ in args[0]]

    monkeypatch.setattr(text.TextGenerator, name, first_call_fails)
    assert main(_args(src, out, target, None, "--commit_every_s", "0", "--batch_size", str(batch_size))) == 0
    kind = "RuntimeError" if batch_size == 1 else "Boom"
    assert len(seen) > 1 and all(kind in s for s in seen[1:]), seen
    results, failed = read_outputs(str(out))
    assert results.num_rows + failed.num_rows == n and set(failed["error_type"].to_pylist()) == {kind}


# -- 4: per-item time limit -------------------------------------------------------------------

def test_items_past_the_time_limit_fail_and_the_job_goes_on(tmp_path, saved_pairs):
    target, draft = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": f"g{i}", "prompt": p} for i, p in enumerate(GOOD)])
    out = tmp_path / "run" / "gens"
    # 1 µs: every item passes its deadline after its first round
    assert main(_args(src, out, target, draft, "--max_item_seconds", "0.000001")) == 0
    results, failed = read_outputs(str(out))
    assert results.num_rows == 0 and failed.num_rows == len(GOOD)
    assert set(failed["error_type"].to_pylist()) == {"ItemTimeout"}
    assert "longer than" in failed["error_message"][0].as_py()


def test_engine_deadline_is_checked_between_rounds(models):
    from specdec_core.drafters import ModelDrafter
    from specdec_core.engine import SpeculativeGenerator
    from specdec_core.rows import ItemTimeout

    target, draft = models["llama"]
    engine = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=3, max_new_tokens=10)
    plain = engine.generate([5, 6, 7, 8], seed=1)
    assert engine.generate([5, 6, 7, 8], seed=1, max_seconds=3600).tokens == plain.tokens
    with pytest.raises(ItemTimeout, match="0 new tokens"):
        engine.generate([5, 6, 7, 8], seed=1, max_seconds=0)
    from specdec_core.text import ItemTimeout as exported

    assert exported is ItemTimeout  # error_type comes from the class name: "ItemTimeout"


# -- 5: output safety -------------------------------------------------------------------------

def test_a_full_disk_is_one_line_whether_the_error_is_an_oserror_or_a_workers_text(tmp_path):
    """In process the error is the OSError itself; a multi-process or remote runner's holds the worker's traceback
    as text (`RuntimeError: OSError: [Errno 28] ...`), which showed Beam's traceback with no line of ours."""
    import errno

    from pipeline.options import SpecDecOptions
    from pipeline.run import _why_it_stopped

    out = tmp_path / "gens"
    opts = SpecDecOptions(["--input", str(tmp_path / "p.parquet"), "--output", str(out), "--target_model", "t"])
    (tmp_path / f"gens-chunk-{'a' * 32}-00000.parquet").write_bytes(b"")
    went_on = (f"finished rows are committed in 1 chunk file under {out}: continue with --resume_from {out} and a "
               "new --output")
    chunk = str(tmp_path / f"gens-chunk-{'a' * 32}-00001.parquet.tmp")
    for error, line in (
            (OSError(errno.ENOSPC, "No space left on device", chunk),
             f"cannot write {chunk} (No space left on device)"),
            (RuntimeError("Traceback (most recent call last):\n  File \"durable.py\", line 163, in write_parquet_file\n"
                          "OSError: [Errno 28] No space left on device [while running 'Commit/Results']"),
             f"cannot write {out} (No space left on device)"),
            (RuntimeError(f"OSError: [Errno {errno.EROFS}] Read-only file system: '{chunk}' [while running 'Commit']"),
             f"cannot write {chunk} (Read-only file system)")):
        assert _why_it_stopped(opts, error, []) == (f"{line}: {went_on}", 1, True)
    assert _why_it_stopped(opts, RuntimeError("OSError: [Errno 2] No such file or directory: 'x'"), [])[0] is None
    # pyarrow's own wording, in the commit: its reason is the errno's
    arrow = ('  File "durable.py", line 163, in write_parquet_file\nOSError: [Errno 28] Error writing bytes to file. '
             'Detail: [errno 28] No space left on device')
    said = _why_it_stopped(opts, RuntimeError(arrow), [])[0]
    assert said == f"cannot write {out} (No space left on device): {went_on}"
    # a worker's disk full elsewhere (weights downloading): not the output's, so not said to be
    download = ('  File "huggingface_hub/file_download.py", line 420, in http_get\n    temp_file.write(chunk)\n'
                'OSError: [Errno 28] No space left on device')
    assert _why_it_stopped(opts, RuntimeError(download), [])[0] is None


def _earlier_run(tmp_path: Path, shard: str) -> tuple[Path, Path]:
    """An input of one prompt, and an output prefix where an earlier run left a chunk and the shard `shard`."""
    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "Hello world!"}])
    out = tmp_path / "run" / "gens"
    out.parent.mkdir()
    for name in (f"gens-chunk-{1:032x}-00000.parquet", shard):
        pq.write_table(pa.table({"id": ["old"], "generation": ["x"]}), out.parent / name)
    return src, out


def test_existing_output_stops_the_job_unless_overwrite(tmp_path, saved_pairs, capsys):
    target, _ = saved_pairs["llama"]
    # what a killed earlier run left: one chunk, and a stale shard of another shard count
    src, out = _earlier_run(tmp_path, "gens-00001-of-00002.parquet")
    (out.parent / "gens-notes.txt").write_text("not ours")
    capsys.readouterr()
    assert main(_args(src, out, target, None)) == 2
    err = _one_line_error(capsys)
    assert "--output" in err and "--overwrite" in err and "2 output files" in err
    assert len(_files(out)) == 2  # untouched

    assert main(_args(src, out, target, None, "--overwrite")) == 0
    assert _files(out) == ["gens-00000-of-00001.parquet", "gens-failed-00000-of-00001.parquet"]
    assert read_outputs(str(out))[0]["id"].to_pylist() == ["a"]
    assert (out.parent / "gens-notes.txt").exists()


@pytest.mark.parametrize("accepted", [True, False])
def test_overwrite_by_a_launcher_that_does_not_wait_deletes_the_earlier_files_once_it_has_submitted(
        tmp_path, saved_pairs, monkeypatch, accepted):
    """A Flex Template launcher returns once the job is submitted and cannot put files back: the earlier run's files
    are out of the prefix before it submits (or a job that dies would leave its chunks beside them, read as one run),
    and deleted once the job is accepted; a submission that fails (permissions, quota) puts them back, where they
    were deleted before it."""
    target, _ = saved_pairs["llama"]
    src, out = _earlier_run(tmp_path, "gens-00000-of-00001.parquet")
    earlier, submitted = _files(out), []

    def submit(self, *args, **kwargs):
        submitted.append(_files(out))
        if not accepted:
            raise RuntimeError("the service refused the job (a stand-in)")

    monkeypatch.setattr(beam.Pipeline, "run", submit)
    if accepted:
        assert main(_args(src, out, target, None, "--overwrite"), wait=False) == 0
    else:
        with pytest.raises(RuntimeError, match="refused"):
            main(_args(src, out, target, None, "--overwrite"), wait=False)
    assert submitted == [[]] and _files(out) == ([] if accepted else earlier)
    assert not list(out.parent.glob(".overwritten-*"))


@pytest.mark.parametrize("committed", [0, 2])
def test_ctrl_c_keeps_the_earlier_files_and_says_how_to_continue(tmp_path, saved_pairs, capsys, monkeypatch,
                                                                committed):
    """Ctrl-C (or any failure) under --overwrite deleted the earlier run's files with the job unfinished. They are
    put back where the job committed nothing, and kept aside beside its chunks otherwise (read as one run they
    would mix); the screen shows one line saying how to continue, not Beam's traceback, status 130."""
    from specdec_core.text import TextGenerator

    target, _ = saved_pairs["llama"]
    src, out = _earlier_run(tmp_path, "gens-00000-of-00001.parquet")
    write_prompts(src, [{"id": f"r{i}", "prompt": GOOD[i]} for i in range(4)])
    earlier = {p.name: p.read_bytes() for p in out.parent.glob("gens-*.parquet")}
    generate, calls = TextGenerator.generate, []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > committed:
            raise KeyboardInterrupt
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(TextGenerator, "generate", interrupted)
    capsys.readouterr()
    assert main(_args(src, out, target, None, "--overwrite", "--commit_every_s", "0")) == 130
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err, err
    if committed:
        assert line == (f"error: interrupted: finished rows are committed in {committed} chunk files under {out}: "
                        f"continue with --resume_from {out} and a new --output")
        assert len(read_outputs(str(out))[0]) == committed
        [aside] = out.parent.glob(".overwritten-gens-*")
        assert {p.name: p.read_bytes() for p in aside.iterdir()} == earlier
    else:
        assert line == "error: interrupted: no row was committed"
        assert {p.name: p.read_bytes() for p in out.parent.glob("gens-*.parquet")} == earlier
        assert not list(out.parent.glob(".*"))
    assert not list(out.parent.glob("beam-temp-*"))


def test_beams_traceback_of_an_interrupted_bundle_is_not_logged_above_the_line(caplog):
    """Beam logs a failed bundle's traceback at ERROR (28 lines over Ctrl-C's one); other failures' stay."""
    import logging

    from pipeline.logs import setup_logging

    setup_logging()
    beam_log = logging.getLogger("apache_beam.runners.common")
    for error in (KeyboardInterrupt(), ValueError("a real failure")):
        try:
            raise error
        except BaseException:
            beam_log.error("%r [while running 'Generate']", error, exc_info=True)
    assert [r.getMessage() for r in caplog.records] == ["ValueError('a real failure') [while running 'Generate']"]


DATAFLOW = ["--runner=DataflowRunner", "--project=acme-prod", "--region=us-central1", "--temp_location=gs://acme-b/t",
            "--staging_location=gs://acme-b/s"]


def _on_dataflow(monkeypatch, run) -> None:
    """Jobs "submitted" to Dataflow by `run` (beam.Pipeline.run), past preflight and GCS."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    from pipeline import run as launcher

    monkeypatch.setattr(GoogleCloudOptions, "_warn_if_soft_delete_policy_enabled", lambda self, name: None)  # (GCS)
    monkeypatch.setattr(launcher, "preflight", lambda opts: pa.schema([("id", pa.string()), ("prompt", pa.string())]))
    monkeypatch.setattr(beam.Pipeline, "run", run)


class _Submitted:
    """A Dataflow job still running when its launcher's wait ends with `error`."""

    def __init__(self, error: BaseException, staging: Path):
        self.error, self.staging = error, staging

    def job_id(self) -> str:
        return "2026-12-06_01_02_03-123"

    def wait_until_finish(self):
        self.staging.mkdir()
        raise self.error


@pytest.mark.parametrize("error", [KeyboardInterrupt(), AssertionError("Job did not reach to a terminal state")])
def test_a_dataflow_launcher_that_stops_waiting_leaves_the_running_job_its_files(tmp_path, saved_pairs, capsys,
                                                                                 monkeypatch, error):
    """Ctrl-C, or a status poll that failed, stops a Dataflow launcher's wait, not the job: nothing under the prefix
    is touched (putting the earlier files back, or deleting the staging folders, under a job still writing there
    would mix or break its output). Ctrl-C's line says the job goes on and how to cancel it; another error is
    raised as it is."""
    target, _ = saved_pairs["llama"]
    src, out = _earlier_run(tmp_path, "gens-00000-of-00001.parquet")
    staging = out.parent / "beam-temp-gens-0123"
    _on_dataflow(monkeypatch, lambda self, *a, **k: _Submitted(error, staging))
    capsys.readouterr()
    if isinstance(error, KeyboardInterrupt):
        assert main(_args(src, out, target, None, "--overwrite", *DATAFLOW)) == 130
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            "error: interrupted: the launcher stopped waiting, the Dataflow job goes on: to stop it, cancel "
            "2026-12-06_01_02_03-123 (`gcloud dataflow jobs cancel`)")
    else:
        with pytest.raises(AssertionError, match="terminal state"):
            main(_args(src, out, target, None, "--overwrite", *DATAFLOW))
    [aside] = out.parent.glob(".overwritten-gens-*")
    assert len(list(aside.iterdir())) == 2 and _files(out) == [] and staging.exists()


def test_ctrl_c_while_a_dataflow_job_is_submitted_puts_the_earlier_files_back(tmp_path, saved_pairs, capsys,
                                                                                monkeypatch):
    """Before p.run() returns there is no job (staging takes minutes): as locally, nothing was committed."""
    target, _ = saved_pairs["llama"]
    src, out = _earlier_run(tmp_path, "gens-00000-of-00001.parquet")

    def staging(self, *a, **k):
        raise KeyboardInterrupt

    _on_dataflow(monkeypatch, staging)
    capsys.readouterr()
    assert main(_args(src, out, target, None, "--overwrite", *DATAFLOW)) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: interrupted: no row was committed"
    assert len(_files(out)) == 2


def test_the_earlier_files_are_put_back_when_looking_for_a_damaged_file_is_interrupted(tmp_path, saved_pairs,
                                                                                       monkeypatch):
    """Re-reading every input (minutes on a large gs:// input) may be stopped by a second Ctrl-C, or fail."""
    from pipeline import run

    target, _ = saved_pairs["llama"]
    src, out = _earlier_run(tmp_path, "gens-00000-of-00001.parquet")

    def failed_read(self, *a, **k):
        raise RuntimeError('File "/x/apache_beam/io/parquetio.py", line 1, in read_records')

    def reread(opts, e):
        raise KeyboardInterrupt

    monkeypatch.setattr(beam.Pipeline, "run", failed_read)
    monkeypatch.setattr(run, "_damaged_files", reread)
    with pytest.raises(KeyboardInterrupt):
        main(_args(src, out, target, None, "--overwrite"))
    assert len(_files(out)) == 2


def test_the_line_after_ctrl_c_of_a_resumed_run_names_every_prefix_to_resume_from(tmp_path):
    """Resuming from this run's prefix alone would decode again every row the earlier prefixes hold."""
    from pipeline.run import _how_to_continue, parse_options

    out = tmp_path / "run2" / "gens"
    out.parent.mkdir()
    pq.write_table(pa.table({"id": ["x"]}), out.parent / f"gens-chunk-{1:032x}-00000.parquet")
    opts = parse_options(["--input", "x.parquet", "--output", str(out), "--target_model", "t", "--resume_from",
                          str(tmp_path / "run1" / "gens")])
    line = _how_to_continue(opts, [])
    assert line.endswith(f"continue with --resume_from {tmp_path}/run1/gens,{out} and a new --output")


def test_ctrl_c_while_the_earlier_files_are_set_aside_puts_back_those_moved(tmp_path, saved_pairs, capsys,
                                                                           monkeypatch):
    """Moving thousands of chunks aside takes a while on gs://: a Ctrl-C midway left some files in the hidden folder,
    unsaid, and the rest under the prefix."""
    from apache_beam.io.filesystems import FileSystems

    target, _ = saved_pairs["llama"]
    src, out = _earlier_run(tmp_path, "gens-00000-of-00001.parquet")
    earlier = {p.name: p.read_bytes() for p in out.parent.glob("gens-*.parquet")}
    rename, calls = FileSystems.rename, []

    def stopped_midway(sources, destinations):
        calls.append(sources)
        rename(sources[:1], destinations[:1])
        if len(calls) == 1:
            raise KeyboardInterrupt
        rename(sources[1:], destinations[1:])

    monkeypatch.setattr(FileSystems, "rename", staticmethod(stopped_midway))
    capsys.readouterr()
    assert main(_args(src, out, target, None, "--overwrite")) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: interrupted: no row was committed"
    assert {p.name: p.read_bytes() for p in out.parent.glob("gens-*.parquet")} == earlier
    assert not list(out.parent.glob(".*")) and len(calls) == 2


def test_a_load_that_fails_otherwise_than_refused_leaves_the_earlier_files(tmp_path, saved_pairs, monkeypatch):
    """Weights deleted between the launch checks and a worker's load: the job fails with its error, as before,
    and --overwrite's earlier files are back where they were."""
    from transforms.model_handler import SpecDecModelHandler

    target, _ = saved_pairs["llama"]
    src, out = _earlier_run(tmp_path, "gens-00000-of-00001.parquet")
    earlier = {p.name: p.read_bytes() for p in out.parent.glob("gens-*.parquet")}

    def gone(self):
        raise OSError(f"no file named model.safetensors in {target}")

    monkeypatch.setattr(SpecDecModelHandler, "load_model", gone)
    with pytest.raises(Exception, match="no file named model.safetensors"):
        main(_args(src, out, target, None, "--overwrite"))
    assert {p.name: p.read_bytes() for p in out.parent.glob("gens-*.parquet")} == earlier


@pytest.mark.parametrize("other", ["gens-v2", "gens-chunk-1"])
def test_an_output_prefix_that_would_delete_another_prefixs_files_stops_the_job(tmp_path, saved_pairs, capsys, other):
    """Beam's sink deletes every PREFIX-*-of-NNNNN.parquet once it has written: "gens" would take
    "gens-v2"'s shards with it. Refused, with --overwrite too; nothing is touched. "gens-chunk-1"'s
    files were taken for gens's own chunks: read, and deleted by --overwrite."""
    target, _ = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "Hello world!"}])
    out = tmp_path / "run" / "gens"
    out.parent.mkdir()
    names = [f"{other}-00000-of-00001.parquet", f"{other}-failed-00000-of-00001.parquet"]
    for name in names:
        pq.write_table(pa.table({"id": ["v2"], "generation": ["kept"]}), out.parent / name)
    assert read_outputs(str(out)) == (None, None)
    capsys.readouterr()
    for extra in ((), ("--overwrite",)):
        assert main(_args(src, out, target, None, *extra)) == 2
        err = _one_line_error(capsys)
        assert f"{names[0]} is not this prefix's" in err, err
    assert sorted(p.name for p in out.parent.iterdir()) == names
    assert main(_args(src, out.parent / "gens-v3", target, None)) == 0  # a prefix no file starts with


def test_an_output_or_resume_prefix_naming_the_input_stops_the_job(tmp_path, saved_pairs, capsys):
    """Prompt shards named as `pipeline.prepare` names them are an output prefix's file names: --overwrite deleted
    the input, and resuming from it skipped every row (none done). Both refused; the input is untouched."""
    target, _ = saved_pairs["llama"]
    src = write_prompts(tmp_path / "prompts-00000-of-00001.parquet", [{"id": "a", "prompt": "Hello world!"}])
    capsys.readouterr()
    for extra in ((), ("--overwrite",)):
        assert main(_args(str(tmp_path / "prompts-*.parquet"), tmp_path / "prompts", target, None, *extra)) == 2
        assert f"the input file {src} is named as this prefix's output" in _one_line_error(capsys)
    assert main(_args(src, tmp_path / "run" / "gens", target, None, "--resume_from", str(tmp_path / "prompts"))) == 2
    assert "holds no generations (no 'generation' column)" in _one_line_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts-00000-of-00001.parquet"]


# -- 2: resume (the kill-and-resume test is below) ----------------------------------------------

def test_bad_resume_prefixes_stop_before_any_work(tmp_path, saved_pairs, capsys):
    target, _ = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "Hello world!"}])
    ints = tmp_path / "ints" / "gens"
    ints.parent.mkdir()
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "generation": ["x"]}),
                   ints.parent / "gens-00000-of-00001.parquet")
    # a chunk cut short (an interrupted copy of a killed run's files), alone or after a whole shard: the job
    # failed reading its ids after the work had begun (alone: a traceback), the file not named
    cut = [tmp_path / "cut" / "gens", tmp_path / "cut2" / "gens"]
    for prefix in cut:
        prefix.parent.mkdir()
        pq.write_table(pa.table({"id": ["b"], "generation": ["x"]}), f"{prefix}-chunk-{1:032x}-00000.parquet")
        Path(f"{prefix}-chunk-{1:032x}-00000.parquet").write_bytes(
            Path(f"{prefix}-chunk-{1:032x}-00000.parquet").read_bytes()[:100])
    pq.write_table(pa.table({"id": ["c"], "generation": ["x"]}), f"{cut[1]}-00000-of-00001.parquet")
    out = tmp_path / "run" / "gens"
    (tmp_path / "link").symlink_to(tmp_path / "run")
    capsys.readouterr()
    for resume, needle in [(tmp_path / "typo" / "gens", "no output files"), (ints, "ids are int64"),
                           *[(prefix, f"{prefix}-chunk-{1:032x}-00000.parquet is not a readable Parquet file")
                             for prefix in cut],
                           (out, "is the --output prefix"),
                           # the same prefix spelled otherwise: with --overwrite it deleted the run it resumed
                           (f"{out.parent}/./gens", "is the --output prefix"),
                           (os.path.relpath(out), "is the --output prefix"),
                           (f"{ints}-failed", "cannot end in -failed or -chunk"),
                           (f"{ints}-chunk", "cannot end in -failed or -chunk"),
                           (f"{tmp_path}/link/gens", "is the --output prefix"),  # a link to out's folder
                           (f"{tmp_path}/*/gens", "cannot hold *, ?, [ or ,")]:
        assert main(_args(src, out, target, None, "--resume_from", str(resume), "--overwrite")) == 2
        assert needle in _one_line_error(capsys), resume
    # another run's failed shards are this prefix's results: --overwrite deleted them
    assert main(_args(src, f"{ints}-failed", target, None, "--overwrite")) == 2
    assert "cannot end in -failed or -chunk" in _one_line_error(capsys)
    assert main(_args(src, tmp_path / "out[1]" / "gens", target, None)) == 2  # all its work, then a traceback
    assert "cannot hold *, ?, [ or ," in _one_line_error(capsys)
    for extra, needle in [(["--commit_every_s", "-1"], "--commit_every_s must be >= 0"),
                          (["--max_item_seconds", "0"], "--max_item_seconds must be > 0"),
                          (["--max_item_seconds", "abc"], "--max_item_seconds: invalid float value: 'abc'")]:
        assert main(_args(src, out, target, None, *extra)) == 2
        assert needle in _one_line_error(capsys)
    assert not out.parent.exists()


@pytest.mark.slow
def test_resuming_with_other_generation_flags_stops_before_any_work(tmp_path, saved_pairs, capsys, caplog):
    """The resumed run's rows and the new job's are read as one output: another length, or sampled
    rows beside greedy ones, would mix there unseen. The drafter may change (it changes no text);
    sampling flags count only where a run samples."""
    target, draft = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "Hello world!"},
                                                  {"id": "b", "prompt": "The quick brown fox"}])
    first = tmp_path / "first" / "gens"
    assert main(_args(src, first, target, None, "--top_k", "5")) == 0
    assert "--top_k 5: sampling settings, and --temperature 0 decodes greedily: no effect" in caplog.text
    capsys.readouterr()
    for extra, needle in [(["--max_new_tokens", "9"], "its run had --max_new_tokens 8, this job 9"),
                          (["--temperature", "0.7"], "its run had --temperature 0.0, this job 0.7"),
                          (["--stop", "x"], "its run had --stop None, this job ['x']"),
                          (["--dtype", "bfloat16"], "its run had --dtype 'float32', this job 'bfloat16'"),
                          # (the GPUs where `auto` would run are unknown: its own line, not a dtype's)
                          (["--accelerator", "bogus"], "--accelerator 'bogus': names no GPU type")]:
        assert main(_args(src, tmp_path / "next" / "gens", target, None, "--resume_from", str(first), *extra)) == 2
        assert needle in _one_line_error(capsys), extra
    # greedy: top_k and the seed change nothing; a model draft changes no text; `auto` runs as float32 here
    assert main(_args(src, tmp_path / "next" / "gens", target, draft, "--resume_from", str(first),
                      "--seed", "3", "--dtype", "float32")) == 0
    # sampled: the seed's sample depends on the drafts it was drawn against; stop strings in any order
    sampled = tmp_path / "sampled" / "gens"
    assert main(_args(src, sampled, target, None, "--temperature", "1", "--stop", "xyz", "--stop", "qq")) == 0
    capsys.readouterr()
    assert main(_args(src, tmp_path / "s2" / "gens", target, draft, "--temperature", "1", "--stop", "xyz",
                      "--stop", "qq", "--resume_from", str(sampled))) == 2
    assert "its run had --drafter 'none', this job 'model'" in _one_line_error(capsys)
    assert main(_args(src, tmp_path / "s3" / "gens", target, None, "--temperature", "1", "--stop", "qq",
                      "--stop", "xyz", "--gamma_policy", "auto", "--resume_from", str(sampled))) == 0
    # the draft's numbers decide its drafts too (`auto` keeps a sampled job's draft as loaded: `same`)
    assert main(_args(src, tmp_path / "s4" / "gens", target, None, "--temperature", "1", "--stop", "qq",
                      "--stop", "xyz", "--draft_dtype", "bfloat16", "--resume_from", str(sampled))) == 2
    assert "its run had --draft_dtype 'same', this job 'bfloat16'" in _one_line_error(capsys)



def test_dtype_auto_counts_as_the_dtype_it_runs_in_on_a_named_device():
    """`--dtype auto` is float32 on a CPU and bfloat16 on CUDA (`loading.resolve_dtype`): a resume that names the
    dtype its run had is not refused, and runs on named devices of other dtypes are told apart; under
    `--device auto` the device is not known at launch, so the flag is compared as given."""
    from pipeline.provenance import generation_differences

    def differs(earlier: tuple[str, str], now: tuple[str, str]) -> list:
        return generation_differences(dict(zip(("dtype", "device"), earlier, strict=True)),
                                      dict(zip(("dtype", "device"), now, strict=True)))

    assert differs(("auto", "cpu"), ("float32", "cpu")) == []
    assert differs(("auto", "cuda:1"), ("bfloat16", "cuda")) == []
    assert differs(("auto", "cpu"), ("auto", "cuda")) == [("dtype", "float32", "bfloat16")]
    assert differs(("auto", "auto"), ("float32", "cpu")) == [("dtype", "auto", "float32")]
    assert differs(("auto", "auto"), ("auto", "cpu")) == [("dtype", "auto", "float32")]
    # under --device auto, the one kind of device the run record's placement names
    on = {"cpu": {"gpus": "none", "copies": [["cpu"]]}, "gpus": {"gpus": "2 x L4", "copies": [["cuda:0"], ["cuda:1"]]},
          "unknown": {"gpus": "unknown at launch", "copies": "one per GPU of each worker"}}
    assert generation_differences({"dtype": "auto", "device": "auto", "placement": on["cpu"]},
                                  {"dtype": "float32", "device": "cpu"}) == []
    assert generation_differences({"dtype": "auto", "device": "auto", "placement": on["gpus"]},
                                  {"dtype": "auto", "device": "auto", "placement": on["cpu"]}) == [
        ("dtype", "bfloat16", "float32")]
    assert generation_differences({"dtype": "auto", "device": "auto", "placement": on["unknown"]},
                                  {"dtype": "auto", "device": "auto", "placement": on["unknown"]}) == []


def test_flags_that_leave_the_text_as_it_was_are_no_generation_difference():
    """A resume is refused only for flags on which the two runs' texts differ: `auto` gamma and draft
    dtype run fixed and the draft's own when sampling, stop strings match in any order, n-gram sizes
    never change a greedy text; and where either run samples, its sampling flags count."""
    from pipeline.provenance import generation_differences

    sampled = {"temperature": 0.7}
    assert generation_differences({**sampled, "gamma_policy": "fixed"}, {**sampled, "gamma_policy": "auto"}) == []
    assert generation_differences({**sampled, "draft_dtype": "same"}, {**sampled, "draft_dtype": "auto"}) == []
    assert generation_differences({"stop": ["a", "b"]}, {"stop": ["b", "a"]}) == []
    assert generation_differences({"temperature": 0.0, "drafter": "ngram", "ngram_max_size": 3},
                                  {"temperature": 0.0, "drafter": "ngram", "ngram_max_size": 4}) == []
    assert generation_differences({"temperature": 0.0, "top_k": None}, {"temperature": 0.7, "top_k": 50}) == [
        ("temperature", 0.0, 0.7), ("top_k", None, 50)]


def test_a_resume_is_compared_by_what_decides_its_rows_not_by_how_it_was_written(tmp_path, saved_pairs):
    """Ids of another string layout (the run's input written by pandas 3 or Polars: large_string) match as values;
    a run on --device cpu resumed with the same flags, or naming the dtype its `auto` ran in, is no other run."""
    from pipeline.errors import JobConfigError
    from pipeline.options import SpecDecOptions
    from pipeline.preflight import _check_resume
    from pipeline.provenance import run_record, with_provenance

    target, _ = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "Hello world!"}])
    first = tmp_path / "first" / "gens"
    first.parent.mkdir()
    schema = with_provenance(pa.schema([("id", pa.large_string()), ("generation", pa.string())]),
                             run_record(SpecDecOptions(_args(src, first, target, None, "--device", "cpu"))))
    pq.write_table(pa.table({"id": pa.array(["a"], pa.large_string()), "generation": ["x"]}, schema=schema),
                   f"{first}-00000-of-00001.parquet")
    given = pa.schema([("id", pa.string()), ("prompt", pa.string())])

    def resume(*extra):
        _check_resume(SpecDecOptions(_args(src, tmp_path / "next" / "gens", target, None, "--resume_from", str(first),
                                           *extra)), given)

    resume("--device", "cpu")
    resume("--device", "cpu", "--dtype", "float32")
    with pytest.raises(JobConfigError, match="its run had --dtype 'float32', this job 'bfloat16'"):
        resume("--device", "cpu", "--dtype", "bfloat16")
    with pytest.raises(JobConfigError, match="its ids are large_string, the input's 'id' column is int64"):
        _check_resume(SpecDecOptions(_args(src, tmp_path / "next" / "gens", target, None, "--device", "cpu",
                                           "--resume_from", str(first))), pa.schema([("id", pa.int64())]))

    # a run on two GPUs (--device auto, its plan from the fit check) resumed with its flags, as preflight orders the
    # checks: the fit's plan first; the same run resumed on this CPU is told which dtype to name
    from pipeline.fit import check_fit

    gpus = ["--accelerator", "type:nvidia-l4;count:2;install-nvidia-driver", "--device_map", "auto"]
    opts = SpecDecOptions(_args(src, first, target, None, *gpus))
    check_fit(opts)
    schema = with_provenance(schema.remove_metadata(), run_record(opts))
    assert json.loads(schema.metadata[b"specdec_run"])["placement"]["copies"] == [["cuda:0"], ["cuda:1"]]
    pq.write_table(pa.table({"id": pa.array(["a"], pa.large_string()), "generation": ["x"]}, schema=schema),
                   f"{first}-00000-of-00001.parquet")
    opts = SpecDecOptions(_args(src, tmp_path / "next" / "gens", target, None, "--resume_from", str(first), *gpus))
    check_fit(opts)
    _check_resume(opts, given)
    with pytest.raises(JobConfigError, match=r"its run had --dtype 'bfloat16', this job 'float32' \(--dtype auto is "
                                             r"the device's dtype: name the run's\)"):
        resume("--device", "cpu")


SLOW_RUN = textwrap.dedent("""
    import sys, time
    from specdec_core import text
    generate = text.TextGenerator.generate
    def slow(self, prompt, seed=0):  # the same output, a quarter of a second later
        time.sleep(0.25)
        return generate(self, prompt, seed)
    text.TextGenerator.generate = slow
    from pipeline.run import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.slow
def test_killed_job_resumes_into_one_clean_run(tmp_path, saved_pairs, caplog):
    target, draft = saved_pairs["llama"]
    words = "the quick brown fox jumps over lazy dog and then some more words".split()
    rows = [{"id": f"p{i:02d}", "prompt": " ".join(words[i % 7: i % 7 + 3 + i % 4]), "topic": f"t{i}"}
            for i in range(24)]
    rows += [{"id": "empty", "prompt": ""}]  # fails in every run
    src = write_prompts(tmp_path / "p.parquet", rows)
    extra = ["--passthrough_columns", "topic", "--num_speculative_tokens", "3"]

    # run 1: killed (SIGKILL) once a few chunks are committed
    first = tmp_path / "first" / "gens"
    # (TMPDIR: Beam's temporary folder, which a killed job cannot remove, goes with the test's)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_RUN, *_args(src, first, target, draft, *extra,
                                                                    "--commit_every_s", "0.2")],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if len(list(first.parent.glob("gens-chunk-*.parquet"))) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
    assert not list(first.parent.glob("gens-*-of-*.parquet"))  # it never finished
    done, _ = read_outputs(str(first))
    done_ids = set(done["id"].to_pylist())
    assert 0 < len(done_ids) < 24
    assert b"specdec_run" in pq.read_metadata(next(first.parent.glob("gens-chunk-*.parquet"))).metadata

    # run 2: resumed into a new prefix
    second = tmp_path / "second" / "gens"
    assert main(_args(src, second, target, draft, *extra, "--resume_from", str(first))) == 0
    res2, failed2 = read_outputs(str(second))
    all_ids = {r["id"] for r in rows}
    assert set(res2["id"].to_pylist()) | set(failed2["id"].to_pylist()) == all_ids - done_ids
    assert failed2["id"].to_pylist() == ["empty"]  # only-failed ids are tried again
    assert (f"done: {res2.num_rows} result rows, 1 failed row ({len(done_ids)} skipped rows: done in --resume_from); "
            "results in") in caplog.text

    # the union of the two runs is one clean run, row for row, no id twice
    clean = tmp_path / "clean" / "gens"
    assert main(_args(src, clean, target, draft, *extra)) == 0
    union, union_failed = read_outputs([str(first), str(second)])
    expected, expected_failed = read_outputs(str(clean))
    assert _same(union) == _same(expected) and union.num_rows == 24
    assert _same(union_failed) == _same(expected_failed)
    raw = [i for prefix in (first, second) for f in prefix.parent.glob("gens-*.parquet")
           if "failed" not in f.name for i in pq.read_table(f)["id"].to_pylist()]
    assert sorted(raw) == sorted(set(raw))  # no id generated by both runs


# -- 7: no code from a model directory runs ------------------------------------------------------

def _remote_code_model(tmp_path: Path, source: Path) -> tuple[Path, Path]:
    import shutil

    model, sentinel = tmp_path / "custom-model", tmp_path / "SENTINEL"
    shutil.copytree(source, model)
    (model / "custom_llama.py").write_text(textwrap.dedent(f"""
        from pathlib import Path
        Path({str(sentinel)!r}).write_text("imported")
        from transformers import LlamaConfig, LlamaForCausalLM
        class CustomConfig(LlamaConfig):
            model_type = "custom_llama"
        class CustomModel(LlamaForCausalLM):
            config_class = CustomConfig
    """))
    config = json.loads((model / "config.json").read_text())
    config["model_type"] = "custom_llama"  # unknown to transformers: only the model's own code loads it
    config["auto_map"] = {"AutoConfig": "custom_llama.CustomConfig",
                          "AutoModelForCausalLM": "custom_llama.CustomModel"}
    (model / "config.json").write_text(json.dumps(config))
    return model, sentinel


def test_a_model_that_needs_its_own_code_is_refused_and_never_imported(tmp_path, saved_pairs, capsys):
    target, draft = saved_pairs["llama"]
    model, sentinel = _remote_code_model(tmp_path, Path(target))
    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "Hello world!"}])
    out = tmp_path / "run" / "gens"
    capsys.readouterr()
    for args in (_args(src, out, model, draft), _args(src, out, target, model)):
        assert main(args) == 2
        err = _one_line_error(capsys)
        assert "needs its own Python code" in err and "--trust_remote_code" in err
    assert not sentinel.exists()
    assert not out.parent.exists()
    from pipeline.model_checks import check_config_files

    check_config_files("--target_model", str(model), trust=True)  # allowed with the flag (and still not imported)
    assert not sentinel.exists()


def test_trust_remote_code_reaches_from_pretrained(tmp_path, saved_pairs, monkeypatch):
    import torch
    import transformers.dynamic_module_utils as dynamic

    from specdec_core.loading import load_model

    target, _ = saved_pairs["llama"]
    model, sentinel = _remote_code_model(tmp_path, Path(target))
    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_model(str(model), torch.device("cpu"), torch.float32)
    assert not sentinel.exists()
    loaded = load_model(str(model), torch.device("cpu"), torch.float32, trust_remote_code=True)
    assert type(loaded).__name__ == "CustomModel" and sentinel.exists()


# -- 8: strict flags -------------------------------------------------------------------------

def test_mistyped_flags_stop_every_entry_point_in_one_line(tmp_path, saved_pairs, capsys):
    target, draft = saved_pairs["llama"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": "a", "prompt": "Hello world!"}])
    out = tmp_path / "run" / "gens"
    base = ["--input", src, "--output", str(out), "--target_model", str(target), "--draft_model", str(draft)]
    capsys.readouterr()
    cases = [
        (["--max_new_token", "3", "--temprature", "0.7"],
         "unknown flag --max_new_token (did you mean --max_new_tokens?)"),
        (["--temprature=0.7"], "unknown flag --temprature=0.7 (did you mean --temperature?)"),
        (["--max_new_tokens", "many"], "argument --max_new_tokens: invalid int value: 'many'"),
        (["--drafter", "big"], "argument --drafter: invalid choice: 'big'"),
        (["stray"], "unexpected argument stray"),
        # (pipeline.tune takes several drafts; a job kept the last one without a word)
        (["--draft_model", str(target)], "--draft_model is given 2 times: a job runs one draft"),
    ]
    for extra, needle in cases:
        assert main(base + extra) == 2, extra
        assert needle in _one_line_error(capsys)
    assert main(["--output", str(out)]) == 2
    assert "required: --input" in _one_line_error(capsys)
    # (a mistyped required flag was reported as missing, the typo never named)
    assert main(["--input", src, "--output", str(out), "--target-model", str(target), "--drafter", "ngram"]) == 2
    assert "unknown flag --target-model (did you mean --target_model?)" in _one_line_error(capsys)

    from tests.test_templates import load_template_main

    template = load_template_main()
    assert template.run([f"--{a[2:]}={b}" for a, b in zip(base[::2], base[1::2], strict=True)]
                        + ["--sdk_container_image=img", "--temprature=0.7", "--large_model=true"]) == 2
    assert "did you mean --temperature?" in _one_line_error(capsys)
    assert not out.parent.exists()

    from pipeline import demo, prepare
    from pipeline.bench import cross, throughput
    from pipeline.bench import speed as bench
    from pipeline.demo import models
    from pipeline.report import summary as report

    for entry, argv, needle in [
        (prepare.main, ["--dataset", "x", "--template", "{t}", "--output", "o", "--num_shard", "2"],
         "unknown flag --num_shard (did you mean --num_shards?)"),
        (prepare.main, ["--datase", "x", "--template", "{t}", "--output", "o"],
         "unknown flag --datase (did you mean --dataset?)"),
        (prepare.main, ["--template", "{t}", "--output", "o"], "the following arguments are required: --dataset"),
        (report.main, [str(out), "--hlep"], "unknown flag --hlep (did you mean --help?)"),
        (demo.main, ["--tiny", "--max_new_token", "3"],
         "unknown flag --max_new_token (did you mean --max_new_tokens?)"),
        (bench.parse, ["--quick", "--gama", "3"], "unknown flag --gama (did you mean --gamma?)"),
        (bench.parse, ["--gamma", "three"], "argument --gamma: must be an integer >= 1, got 'three'"),
        (throughput.parse, ["--siz", "tiny"], "unknown flag --siz (did you mean --size?)"),
        (cross.main, ["--quik"], "unknown flag --quik (did you mean --quick?)"),
        (cross.main, ["--prompts", "0"], "argument --prompts: must be an integer >= 1, got '0'"),
        (cross.main, ["--batch_sizes", "4,1"], "--batch_sizes '4,1': expected comma-separated integers > 1"),
        (cross.main, ["--batch_sizes", "4,²"], "--batch_sizes '4,²': expected comma-separated integers > 1"),
        (models.main, ["--retrai"], "unknown flag --retrai (did you mean --retrain?)"),
        # (a traceback in torch.set_num_threads; 0 ran torch's default)
        (cross.main, ["--threads", "-1"], "argument --threads: must be an integer >= 1, got '-1'"),
        (models.main, ["--threads", "0"], "argument --threads: must be an integer >= 1, got '0'"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            entry(argv)
        assert exit_info.value.code == 2, entry
        assert needle in _one_line_error(capsys)
    with pytest.raises(SystemExit) as exit_info:  # (the pass that finds typos must not make --help's flags optional)
        prepare.main(["--help"])
    assert exit_info.value.code == 0 and "] --dataset DATASET [" in capsys.readouterr().out


def test_beam_and_runner_flags_still_pass(tmp_path):
    from pipeline.flags import check_pipeline_flags
    from tests.test_dataflow_dryrun import GPU_JOB

    check_pipeline_flags(GPU_JOB + ["--experiments=use_runner_v2", "--number_of_worker_harness_threads=1",
                                    "--direct_num_workers", "2", "--direct_running_mode", "multi_threading",
                                    "--resume_from", "gs://b/r1/gens", "--resume_from=gs://b/r2/gens",
                                    "--overwrite", "--trust_remote_code", "--max_item_seconds", "30",
                                    "--commit_every_s", "10", "--labels", "team=ml", "--save_main_session"])
