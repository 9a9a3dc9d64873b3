"""Durable chunks and the one reader of a prefix (transforms/durable.py), without running a job."""

from __future__ import annotations

import glob
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from transforms.durable import CommitChunks, delete_chunks, output_files, read_outputs, write_parquet_file

SCHEMA = pa.schema([("id", pa.string()), ("generation", pa.string())])
FAILED = pa.schema([("id", pa.string()), ("prompt", pa.string()), ("error_type", pa.string()),
                    ("error_message", pa.string())])


def _write(path, rows, schema):
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), str(path))


def _failed(i, error="EmptyPrompt"):
    return {"id": i, "prompt": "", "error_type": error, "error_message": "m"}


def test_reader_counts_each_id_once_and_results_win_over_failed(tmp_path):
    prefix = str(tmp_path / "gens")
    _write(f"{prefix}-00000-of-00001.parquet", [{"id": "a", "generation": "A"}], SCHEMA)
    # a chunk of a retried bundle: "a" again, and "b"
    _write(f"{prefix}-chunk-{1:032x}-00000.parquet", [{"id": "a", "generation": "A"}, {"id": "b", "generation": "B"}],
           SCHEMA)
    _write(f"{prefix}-chunk-{2:032x}-00000.parquet", [{"id": "b", "generation": "B"}, {"id": None, "generation": "N"}],
           SCHEMA)
    # "b" failed in one attempt and succeeded in another; "c" only failed, twice
    _write(f"{prefix}-failed-chunk-{3:032x}-00000.parquet", [_failed("b"), _failed("c"), _failed("c")], FAILED)
    _write(f"{prefix}-failed-00000-of-00001.parquet", [_failed("d")], FAILED)
    # another prefix sharing the directory is not read
    _write(str(tmp_path / "other-00000-of-00001.parquet"), [{"id": "z", "generation": "Z"}], SCHEMA)
    # an unfinished temporary file of a chunk is never read
    (tmp_path / ".gens-chunk-u4-00000.parquet.123.tmp").write_bytes(b"PAR1 partial")

    results, failed = read_outputs(prefix)
    assert results.to_pylist() == [{"id": "a", "generation": "A"}, {"id": "b", "generation": "B"},
                                   {"id": None, "generation": "N"}]
    assert sorted(failed["id"].to_pylist()) == ["c", "d"]
    assert len(output_files(prefix)) == 5
    # the null id is an id like any other: its result row wins over its failed row too
    _write(f"{prefix}-failed-chunk-{4:032x}-00000.parquet", [_failed(None)], FAILED)
    assert sorted(read_outputs(prefix)[1]["id"].to_pylist()) == ["c", "d"]
    # several prefixes read as one run
    _write(str(tmp_path / f"more-chunk-{5:032x}-00000.parquet"), [{"id": "e", "generation": "E"}], SCHEMA)
    both, _ = read_outputs([prefix, str(tmp_path / "more")])
    assert both["id"].to_pylist() == ["a", "b", None, "e"]
    # a report without a baseline or references reads no generation
    stats, failed = read_outputs(prefix, skip=("generation",))
    assert stats.to_pylist() == [{"id": "a"}, {"id": "b"}, {"id": None}]
    assert sorted(failed["id"].to_pylist()) == ["c", "d"]


def test_the_final_shards_row_of_an_id_wins_over_a_chunks_and_the_first_prefixs_over_a_later_ones(tmp_path):
    """A retried bundle's chunk copy of an id, with other statistics, must not replace the final
    shard's row; of two prefixes (a resumed run's), the first one's row stands."""
    stats = pa.schema([("id", pa.string()), ("latency_s", pa.float64())])
    first, later = str(tmp_path / "first"), str(tmp_path / "later")
    # the chunk's name sorts before the final shard's: only the reader's order puts the shard first
    _write(f"{first}-chunk-{1:032x}-00000.parquet", [{"id": "a", "latency_s": 9.0}, {"id": "c", "latency_s": 3.0}],
           stats)
    _write(f"{first}-00000-of-00001.parquet", [{"id": "b", "latency_s": 2.0}, {"id": "a", "latency_s": 1.0}], stats)
    _write(f"{later}-00000-of-00001.parquet", [{"id": "b", "latency_s": 8.0}, {"id": "d", "latency_s": 4.0}], stats)
    results, _ = read_outputs(first)
    assert results.to_pylist() == [{"id": "b", "latency_s": 2.0}, {"id": "a", "latency_s": 1.0},
                                   {"id": "c", "latency_s": 3.0}]
    # every prefix's final shards, in the prefixes' order, then their chunks
    both, _ = read_outputs([first, later])
    assert both.to_pylist() == [{"id": "b", "latency_s": 2.0}, {"id": "a", "latency_s": 1.0},
                                {"id": "d", "latency_s": 4.0}, {"id": "c", "latency_s": 3.0}]


def test_numbered_duplicate_id_rows_stand_for_an_older_runs_unnumbered_ones(tmp_path):
    """An id twice in the input, failed by a run before DuplicateId rows were numbered and by a
    run resumed from it: two rows, as the input has (three before); an id only the older run
    failed keeps its rows; identical numbered rows stay one per input row."""
    def dup(i, prompt, message):
        return {"id": i, "prompt": prompt, "error_type": "DuplicateId", "error_message": message}

    old, new = str(tmp_path / "old"), str(tmp_path / "new")
    _write(f"{old}-failed-00000-of-00001.parquet", [dup("b", "p", "id 'b' occurs 2 times in the input"),
                                                   dup(None, "q", "id None occurs 2 times in the input"),
                                                   dup(None, "r", "id None occurs 2 times in the input")], FAILED)
    _write(f"{new}-failed-00000-of-00001.parquet",
           [dup("b", "p", "id 'b' occurs 2 times in the input (row 1 of 2)"),
            dup("b", "p", "id 'b' occurs 2 times in the input (row 2 of 2)")], FAILED)
    _, failed = read_outputs([old, new])
    assert sorted((r["id"] or "", r["error_message"][-12:]) for r in failed.to_pylist()) == [
        ("", "in the input"), ("", "in the input"), ("b", "(row 1 of 2)"), ("b", "(row 2 of 2)")]


def test_ids_dictionary_encoded_as_the_input_was_are_read_as_their_values(tmp_path):
    """A job passes a dictionary-encoded id column (a pandas categorical) through as it is: the
    reader (and so `pipeline.report`) takes it as its values."""
    prefix = str(tmp_path / "gens")
    ids = pa.array(["a", "b"]).dictionary_encode()
    pq.write_table(pa.table({"id": ids, "generation": ["A", "B"]}), f"{prefix}-00000-of-00001.parquet")
    pq.write_table(pa.table({"id": pa.array(["b", "c"]).dictionary_encode(), "prompt": ["", ""],
                             "error_type": ["EmptyPrompt"] * 2, "error_message": ["m"] * 2}),
                   f"{prefix}-failed-00000-of-00001.parquet")
    results, failed = read_outputs(prefix)
    assert results.schema.field("id").type == pa.string() and results["id"].to_pylist() == ["a", "b"]
    assert failed["id"].to_pylist() == ["c"]


def test_a_resumed_runs_ids_of_another_string_layout_are_read_beside_the_first_runs(tmp_path):
    """A run resumed from an input that pandas 3 or Polars wrote (large_string ids, where pyarrow
    writes string) is accepted by preflight: the two runs are read together, as one type."""
    first, second = str(tmp_path / "a" / "gens"), str(tmp_path / "b" / "gens")
    for prefix, ids, typ in ((first, ["a", "b"], pa.string()), (second, ["c"], pa.large_string())):
        (tmp_path / prefix.split("/")[-2]).mkdir()
        topic = pa.array(ids) if prefix == first else pa.array(ids).dictionary_encode()  # (a categorical column)
        pq.write_table(pa.table({"id": pa.array(ids, typ), "generation": ids, "note": pa.array(ids, typ),
                                 "refs": pa.array([[i] for i in ids], pa.list_(typ)), "topic": topic}),
                       f"{prefix}-00000-of-00001.parquet")
    pq.write_table(pa.table({"id": pa.array(["d"], pa.large_string()), "prompt": [""], "error_type": ["EmptyPrompt"],
                             "error_message": ["m"]}), f"{second}-failed-00000-of-00001.parquet")
    pq.write_table(pa.table({"id": pa.array(["e"]), "prompt": [""], "error_type": ["EmptyPrompt"],
                             "error_message": ["m"]}), f"{first}-failed-00000-of-00001.parquet")
    results, failed = read_outputs([first, second])
    assert results["id"].to_pylist() == ["a", "b", "c"] and results.schema.field("id").type == pa.string()
    assert results["note"].to_pylist() == ["a", "b", "c"]  # (large_string: a column may hold more than 2 GiB)
    assert results["topic"].to_pylist() == ["a", "b", "c"] and results.schema.field("topic").type == pa.string()
    assert failed["id"].to_pylist() == ["e", "d"]


def test_reader_of_an_empty_prefix(tmp_path):
    assert read_outputs(str(tmp_path / "nothing")) == (None, None)


def test_chunk_names_never_match_the_final_glob_beam_deletes(tmp_path):
    """WriteToParquet's pre_finalize deletes PREFIX-*-of-NNNNN.parquet before renaming its shards."""
    from apache_beam.io.parquetio import _ParquetSink

    prefix = str(tmp_path / "gens")
    for name in (f"gens-chunk-{1:032x}-00000.parquet", f"gens-failed-chunk-{1:032x}-00007.parquet"):
        _write(tmp_path / name, [], SCHEMA)
    sinks = {suffix: _ParquetSink(prefix + suffix, SCHEMA, codec="none", use_deprecated_int96_timestamps=False,
                                  use_compliant_nested_type=False, file_name_suffix=".parquet", num_shards=0,
                                  shard_name_template=None, mime_type="application/x-parquet",
                                  triggering_frequency=None)
             for suffix in ("", "-failed")}
    for sink in sinks.values():
        for shards in (1, 2, 10, 12345):
            assert glob.glob(sink._get_final_name_glob(shards)) == []
    # the results' glob does match a failed shard: why WriteResults writes the failed rows last
    _write(tmp_path / "gens-failed-00000-of-00001.parquet", [], SCHEMA)
    assert [p.rsplit("/", 1)[1] for p in glob.glob(sinks[""]._get_final_name_glob(1))] == [
        "gens-failed-00000-of-00001.parquet"]


def test_a_failed_write_leaves_no_file_under_its_name(tmp_path, monkeypatch):
    import os

    path = tmp_path / "gens-chunk-x-00000.parquet"

    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        write_parquet_file(str(path), pa.Table.from_pylist([{"id": "a", "generation": "A"}], schema=SCHEMA))
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    write_parquet_file(str(path), pa.Table.from_pylist([{"id": "a", "generation": "A"}], schema=SCHEMA))
    assert pq.read_table(path)["id"].to_pylist() == ["a"]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_finished_job_removes_the_partial_chunks_of_a_worker_killed_mid_write(tmp_path, monkeypatch):
    """A SIGKILL between a chunk's write and its rename leaves the hidden temporary file; the job's end
    (`delete_chunks`) removes it with the chunks, and leaves another prefix's alone."""
    import os

    def killed(src, dst):
        raise KeyboardInterrupt  # (as if the process died here: the temporary file stays)

    table = pa.Table.from_pylist([{"id": "a", "generation": "A"}], schema=SCHEMA)
    monkeypatch.setattr(os, "replace", killed)
    monkeypatch.setattr(os, "remove", lambda path: None)
    for name in (f"gens-chunk-{1:032x}-00000.parquet", f"gens-failed-chunk-{2:032x}-00001.parquet",
                 f"gens2-chunk-{3:032x}-00000.parquet"):
        with pytest.raises(KeyboardInterrupt):
            write_parquet_file(str(tmp_path / name), table)
    monkeypatch.undo()
    write_parquet_file(str(tmp_path / f"gens-chunk-{4:032x}-00000.parquet"), table)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == 4 and sum(n.startswith(".") and n.endswith(".tmp") for n in left) == 3
    assert delete_chunks(str(tmp_path / "gens")) == 1
    assert [n for n in os.listdir(tmp_path)] == [n for n in left if n.startswith(".gens2-chunk-")]


def _wait_for(pattern, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := glob.glob(pattern):
            return found
        time.sleep(0.02)
    return []


def test_commit_chunks_commits_while_the_bundle_is_still_running(tmp_path):
    prefix = str(tmp_path / "gens-chunk")
    meta = SCHEMA.with_metadata({"specdec_run": '{"x": 1}'})
    fn = CommitChunks(prefix, meta, every_s=0.05)
    fn.setup()
    fn.start_bundle()
    assert list(fn.process({"id": "a", "generation": "A"})) == [{"id": "a", "generation": "A"}]
    # the next item is still generating: the finished one is committed by the timer anyway
    first = _wait_for(f"{prefix}-*.parquet")
    assert len(first) == 1 and pq.read_table(first[0])["id"].to_pylist() == ["a"]
    list(fn.process({"id": "b", "generation": "B"}))
    fn.finish_bundle()
    files = sorted(glob.glob(f"{prefix}-*.parquet"))
    assert sorted(i for f in files for i in pq.read_table(f)["id"].to_pylist()) == ["a", "b"]
    assert all(pq.read_metadata(f).metadata[b"specdec_run"] == b'{"x": 1}' for f in files)


def test_the_commit_counters_count_what_the_timer_commits(tmp_path):
    """rows_committed and chunks_committed (what reached the output, in the job's metrics) count the timer's commits
    too: Beam keeps a counter's increments only on the thread that runs the bundle."""
    import apache_beam as beam
    from apache_beam.metrics.metric import MetricsFilter

    prefix = str(tmp_path / "gens-chunk")

    def slow(i):
        time.sleep(0.1)  # (the timer commits between rows)
        return {"id": str(i), "generation": "g"}

    from apache_beam.options.pipeline_options import PipelineOptions

    # (the job's own required flags, which Beam parses for every options class imported: none is read here)
    p = beam.Pipeline(options=PipelineOptions(["--runner", "DirectRunner", "--input", "unread", "--output", "unread",
                                               "--target_model", "unread"]))
    _ = p | beam.Create(range(6)) | beam.Map(slow) | beam.ParDo(CommitChunks(prefix, SCHEMA, every_s=0.03))
    result = p.run()
    result.wait_until_finish()
    files = glob.glob(f"{prefix}-*.parquet")
    counted = {c.key.metric.name: c.committed for c in result.metrics().query(MetricsFilter())["counters"]}
    assert len(files) > 1  # (the timer committed during the bundle)
    assert counted["rows_committed"] == sum(pq.read_metadata(f).num_rows for f in files) == 6
    assert counted["chunks_committed"] == len(files)


def test_commit_every_zero_commits_each_row_as_it_comes(tmp_path):
    prefix = str(tmp_path / "gens-chunk")
    fn = CommitChunks(prefix, SCHEMA, every_s=0)
    fn.setup()
    fn.start_bundle()
    for i in range(3):
        list(fn.process({"id": str(i), "generation": "g"}))
        assert len(glob.glob(f"{prefix}-*.parquet")) == i + 1
    fn.finish_bundle()
    files = glob.glob(f"{prefix}-*.parquet")
    assert sorted(pq.read_table(f)["id"][0].as_py() for f in files) == ["0", "1", "2"]


@pytest.mark.parametrize("every_s", [float("inf"), 1e10])
def test_commit_every_past_what_a_timer_can_wait_commits_at_the_bundles_end(tmp_path, every_s):
    """A timer of more seconds than a thread can wait failed in its thread (OverflowError): such
    a setting commits at the end of every bundle only."""
    prefix = str(tmp_path / "gens-chunk")
    fn = CommitChunks(prefix, SCHEMA, every_s=every_s)
    fn.setup()
    failures = []
    threading.excepthook, hook = (lambda args: failures.append(args.exc_value)), threading.excepthook
    try:
        fn.start_bundle()
        list(fn.process({"id": "a", "generation": "A"}))
        time.sleep(0.1)
        assert not glob.glob(f"{prefix}-*.parquet")
        fn.finish_bundle()
    finally:
        threading.excepthook = hook
    assert failures == [] and len(glob.glob(f"{prefix}-*.parquet")) == 1


def test_rows_of_a_commit_that_failed_are_committed_by_the_next(tmp_path, monkeypatch):
    """A timer's commit that fails (a transient storage error) keeps its rows for the next commit: a job killed
    later still has them."""
    from transforms import durable

    prefix = str(tmp_path / "gens-chunk")
    fn = CommitChunks(prefix, SCHEMA, every_s=float("inf"))
    fn.setup()
    fn.start_bundle()
    list(fn.process({"id": "a", "generation": "A"}))
    def broken(path, table):
        raise OSError("transient")

    write = durable.write_parquet_file
    monkeypatch.setattr(durable, "write_parquet_file", broken)
    with pytest.raises(OSError, match="transient"):
        fn._flush()
    monkeypatch.setattr(durable, "write_parquet_file", write)
    list(fn.process({"id": "b", "generation": "B"}))
    fn.finish_bundle()
    assert sorted(i for f in glob.glob(f"{prefix}-*.parquet") for i in pq.read_table(f)["id"].to_pylist()) == ["a", "b"]


def test_a_bundle_that_never_finished_commits_its_finished_rows_at_teardown(tmp_path):
    """Ctrl-C or a failed bundle never reaches finish_bundle: the rows it had finished (buffered for the
    timer's next commit) were lost, and a resume decoded them again."""
    prefix = str(tmp_path / "gens-chunk")
    fn = CommitChunks(prefix, SCHEMA, every_s=60)
    fn.setup()
    fn.start_bundle()
    for i in "abc":
        list(fn.process({"id": i, "generation": i.upper()}))
    assert not glob.glob(f"{prefix}-*.parquet")
    fn.teardown()
    ids = [i for f in glob.glob(f"{prefix}-*.parquet") for i in pq.read_table(f)["id"].to_pylist()]
    assert sorted(ids) == list("abc")


def test_a_timer_commit_that_fails_during_teardown_leaves_its_rows_to_teardown(tmp_path, monkeypatch):
    """Teardown found the buffer empty while the timer was writing its rows, and returned: when that write failed,
    its rows went back into a buffer nothing flushed again. Teardown now waits for the timer's commit."""
    import threading

    from transforms import durable

    prefix = str(tmp_path / "gens-chunk")
    write, writing, release = durable.write_parquet_file, threading.Event(), threading.Event()

    def first_fails(path, table):
        if not release.is_set():
            writing.set()
            release.wait()
            raise OSError("transient")
        write(path, table)

    monkeypatch.setattr(durable, "write_parquet_file", first_fails)
    fn = CommitChunks(prefix, SCHEMA, every_s=0.01)
    fn.setup()
    fn.start_bundle()
    list(fn.process({"id": "a", "generation": "A"}))
    assert writing.wait(60)  # the timer has taken the row and is writing it
    teardown = threading.Thread(target=fn.teardown)
    teardown.start()
    release.set()
    teardown.join(60)
    fn._timer.join(60)
    assert [i for f in glob.glob(f"{prefix}-*.parquet") for i in pq.read_table(f)["id"].to_pylist()] == ["a"]


def _chunks_on_a_full_disk(tmp_path, monkeypatch, full_writes: float) -> CommitChunks:
    """A bundle's CommitChunks whose timer found the disk full (its first `full_writes` writes fail so)."""
    import errno

    from transforms import durable

    write, calls = durable.write_parquet_file, []

    def full(path, table):
        calls.append(path)
        if len(calls) <= full_writes:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        write(path, table)

    monkeypatch.setattr(durable, "write_parquet_file", full)
    fn = CommitChunks(str(tmp_path / "gens-chunk"), SCHEMA, every_s=0.01)
    fn.setup()
    fn.start_bundle()
    list(fn.process({"id": "a", "generation": "A"}))
    _wait_until(lambda: fn._full is not None)
    return fn


def test_a_full_disk_fails_the_next_row_instead_of_decoding_what_cannot_be_kept(tmp_path, monkeypatch):
    """A commit that fails for want of room (or a read-only or over-quota disk) is not retried every second while
    the job decodes its whole input and fails only at the end: the next row fails the bundle with it."""
    fn = _chunks_on_a_full_disk(tmp_path, monkeypatch, float("inf"))
    with pytest.raises(OSError, match="No space left"):
        list(fn.process({"id": "b", "generation": "B"}))
    fn._stop.set()


def test_a_full_disk_that_has_room_again_fails_no_later_bundle(tmp_path, monkeypatch):
    """One DoFn serves many bundles: a timer's commit that found the disk full, then a bundle-end commit that found
    room, must not fail the next bundle's first row with the old error."""
    fn = _chunks_on_a_full_disk(tmp_path, monkeypatch, 1)
    fn.finish_bundle()
    fn.start_bundle()
    list(fn.process({"id": "b", "generation": "B"}))
    fn.finish_bundle()
    ids = [i for f in glob.glob(str(tmp_path / "gens-chunk-*.parquet")) for i in pq.read_table(f)["id"].to_pylist()]
    assert sorted(ids) == ["a", "b"]


def _wait_until(done, timeout=30.0):
    end = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_a_failed_call_of_several_rows_fails_each_row():
    """A batched RunInference call that raises is one dead letter of all its rows: each becomes a failed row."""
    import traceback

    from transforms.results import failed_rows

    error = RuntimeError("boom")
    batch = [({"id": f"r{i}", "prompt": f"p{i}"}, i) for i in range(3)]
    rows = failed_rows((batch, (RuntimeError, repr(error), traceback.format_exception(error))), "id", "prompt")
    assert [(r["id"], r["prompt"], r["error_type"], r["error_message"]) for r in rows] == [
        (f"r{i}", f"p{i}", "RuntimeError", "boom") for i in range(3)]


def test_a_failed_rows_message_is_the_exceptions_even_with_notes():
    """RunInference's dead letter carries the traceback's lines: the message is the one of the
    "Type: message" line, not a note added after it (`add_note`), nor a module-named type's."""
    import traceback

    from transforms.results import failed_rows

    class OwnError(RuntimeError):
        pass

    for error, note in ((RuntimeError("CUDA out of memory"), "while compiling the verify graph"),
                        (OwnError("CUDA out of memory"), None)):
        if note:
            error.add_note(note)
        trace = traceback.format_exception(error)
        [row] = failed_rows(([({"id": "a", "prompt": "p"}, 7)], (type(error), repr(error), trace)), "id", "prompt")
        assert (row["error_type"], row["error_message"]) == (type(error).__name__, "CUDA out of memory")


def test_a_failed_rows_message_is_the_raised_exceptions_whole_message():
    """Not the message of the exception it was raised from (of the same type: its line comes first
    in the traceback), cut at no ": " inside it, and not a note after a module-named type's line."""
    import traceback

    from specdec_core.text import PromptTooLong
    from transforms.results import failed_rows

    def message(error):
        trace = traceback.format_exception(error)
        [row] = failed_rows(([({"id": "a", "prompt": "p"}, 0)], (type(error), repr(error), trace)), "id", "prompt")
        return row["error_type"], row["error_message"]

    try:
        try:
            raise RuntimeError("inner cause")
        except RuntimeError as cause:
            raise RuntimeError("outer error") from cause
    except RuntimeError as error:
        chained = error
    assert message(chained) == ("RuntimeError", "outer error")
    assert message(ValueError("chat template: roles must alternate")) == ("ValueError",
                                                                           "chat template: roles must alternate")
    # the traceback names this type with its module: "specdec_core.text.PromptTooLong: ..."
    too_long = PromptTooLong("prompt has 300 tokens")
    too_long.add_note("while decoding row 7")
    assert message(too_long) == ("PromptTooLong", "prompt has 300 tokens")


def test_a_failed_rows_prompt_is_a_conversations_readable_json_and_an_empty_prompt_is_kept():
    from transforms.results import prompt_text

    assert prompt_text([{"role": "user", "content": "café 日本"}]) == '[{"role": "user", "content": "café 日本"}]'
    # an empty prompt (EmptyPrompt's rows) is the prompt, not a missing one
    assert prompt_text("") == ""


def test_the_failed_rows_are_written_after_the_results_and_the_chunks_deleted_after_both(tmp_path):
    """The results' sink deletes PREFIX-*-of-NNNNN.parquet, the failed shards too, and the chunks hold rows until the
    final files do: the order is in the graph (side inputs), not in the order a local runner happens to run steps."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.portability.api import beam_runner_api_pb2

    from transforms.results import WriteResults

    # (the job's own required flags, which Beam parses for every options class imported: none is read here)
    p = beam.Pipeline(options=PipelineOptions(["--input", "unread", "--output", "unread", "--target_model", "unread"]))
    results = p | "Results" >> beam.Create([{"id": "a", "generation": "A"}])
    failed = p | "Failed" >> beam.Create([_failed("b")])
    _ = (results, failed) | "Write" >> WriteResults(str(tmp_path / "gens"), SCHEMA, FAILED)
    parts = p.to_runner_api().components.transforms.values()
    producer = {pcoll: t.unique_name for t in parts if not t.subtransforms for pcoll in t.outputs.values()}

    def waits_for(step: str) -> set[str]:
        t = next(t for t in parts if t.unique_name.startswith(f"Write/{step}") and not t.subtransforms)
        side = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload).side_inputs
        return {producer[t.inputs[name]].split("/")[1] for name in side}

    assert waits_for("AfterResults") == {"WriteResults"} and waits_for("DropChunks") == {"WriteFailed"}
