"""Results that survive a dying job: chunk files committed while it runs, and the one reader
that every consumer of a prefix (resume, report) goes through.

A prefix's files:
- `PREFIX-SSSSS-of-NNNNN.parquet`, `PREFIX-failed-SSSSS-of-NNNNN.parquet`: the final output,
  written exactly once by Beam's file sink when the job finishes;
- `PREFIX-chunk-<uid>-<n>.parquet`, `PREFIX-failed-chunk-<uid>-<n>.parquet` (uid: 32 hex digits): rows committed
  while the job runs. Their names never match the glob `PREFIX-*-of-NNNNN.parquet` that
  Beam's sink deletes before renaming its shards. A finished job deletes them once its final
  output is committed; a killed job leaves them, and they are its results.

A retried bundle can commit the same ids twice, so readers keep one row per id, and a
result row wins over a failed row for the same id. The exception is `DuplicateId`: every
input row of a duplicated id is its own failed row, kept once per distinct prompt.
"""

from __future__ import annotations

import errno
import glob
import io
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem
from apache_beam.metrics import Metrics

from transforms.schema import plain_type

_LOG = logging.getLogger(__name__)
NAMESPACE = "specdec"


T = TypeVar("T")
# Beam's shard names: SSSSS-of-NNNNN (so that "gens-2024-..." or "gens-v2-..." is not a shard of "gens").
SHARD = "[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]"


# A chunk's name after PREFIX-chunk-: its committing thread's uuid4 hex and the chunk's number (five digits, more past
# 99,999: a glob cannot say "digits only" there), where PREFIX-chunk-* took another prefix's files for this one's
# (`gens-chunk-1-00000-of-00001.parquet` for `gens`); only a prefix named like a chunk file is still taken.
CHUNK = "[0-9a-f]" * 32 + "-[0-9][0-9][0-9][0-9][0-9]*.parquet"


def result_patterns(prefix: str) -> list[str]:
    """Globs of the files holding result rows: final shards and chunks."""
    return [f"{prefix}-{SHARD}.parquet", f"{prefix}-chunk-{CHUNK}"]


def failed_patterns(prefix: str) -> list[str]:
    return [f"{prefix}-failed-{SHARD}.parquet", f"{prefix}-failed-chunk-{CHUNK}"]


def sink_deletes(prefix: str) -> list[str]:
    """The files Beam's Parquet sink deletes when the job's final shards are written: every
    PREFIX-*-of-NNNNN.parquet, whatever stands for the star (another prefix's shards too)."""
    return match([f"{prefix}-*-of-*.parquet"])


def chunk_patterns(prefix: str) -> list[str]:
    return [result_patterns(prefix)[1], failed_patterns(prefix)[1]]


def absolute(path: str) -> str:
    """A local path made absolute (`~` expanded: `--output=~/x` reaches us as it is, and made a
    folder named ~), a remote location as it is: Beam's local filesystem matches absolute paths
    only (a bare `gens-*` or `*.parquet` matches nothing, `./gens-*` does)."""
    return path if FileSystems.get_scheme(path) else os.path.abspath(os.path.expanduser(path))


def match(patterns: Iterable[str]) -> list[str]:
    """The files matching any of the globs, local or remote, sorted, each once."""
    patterns = [absolute(p) for p in patterns]
    found = {m.path for r in FileSystems.match(patterns) for m in r.metadata_list}
    return sorted(found)


def output_files(prefix: str) -> list[str]:
    """Every result or failed file, final or chunk, already under a prefix."""
    return match(result_patterns(prefix) + failed_patterns(prefix))


def beam_temp_dirs(prefix: str, start: str = "beam-temp-") -> list[str]:
    """The folders where this prefix's two Parquet sinks (results, failed rows) stage their shards
    before renaming them, `beam-temp-BASENAME[-failed]-<uuid1 hex>` beside the prefix: a finished
    job deletes its own, a killed one leaves them (another prefix's, `gens-v2`'s, are not matched).
    With `start=ASIDE`: the folders of earlier files `set_aside` where a launcher was killed."""
    folder, base = FileSystems.split(prefix)
    own = re.compile(rf"{re.escape(start)}{re.escape(base)}(-failed)?-[0-9a-f]{{32}}")
    if isinstance(FileSystems.get_filesystem(prefix), LocalFileSystem):  # empty folders too
        found = glob.glob(os.path.join(glob.escape(folder), f"{start}*"))
    else:  # object stores have no folders: the objects' parents
        found = {FileSystems.split(f)[0] for f in match([FileSystems.join(folder, f"{start}*/*")])}
    return sorted(f for f in found if own.fullmatch(FileSystems.split(f)[1]))


def delete_dirs(dirs: list[str]) -> None:
    """Delete folders with what they hold (on an object store: every object under them)."""
    if dirs:
        local = isinstance(FileSystems.get_filesystem(dirs[0]), LocalFileSystem)
        FileSystems.delete([d if local else f"{d.rstrip('/')}/" for d in dirs])


ASIDE = ".overwritten-"  # + BASENAME-<hex>: `set_aside`'s folders


def aside_folder(prefix: str) -> str:
    """Where `--overwrite` moves a prefix's earlier output files: `.overwritten-BASENAME-<hex>` beside
    it, where no reader or sink of the prefix looks."""
    folder, base = FileSystems.split(prefix)
    return FileSystems.join(folder, f"{ASIDE}{base}-{uuid.uuid4().hex}")


def set_aside(files: list[str], aside: str) -> None:
    """Move the files into the folder. The launcher deletes it when the job has finished; a job that
    did not finish puts the files back (`put_back`) where it committed nothing, and keeps the folder
    otherwise."""
    FileSystems.mkdirs(aside)  # (object stores have no folders: nothing to make)
    FileSystems.rename(files, [FileSystems.join(aside, FileSystems.split(f)[1]) for f in files])


def put_back(aside: str, files: list[str]) -> None:
    """The files `set_aside` moved back under their names: all, or those it had moved when it was
    stopped (moving thousands of chunks on gs:// takes a while)."""
    moved = set(match([FileSystems.join(aside, "*")]))
    back = [(src, f) for f in files if (src := FileSystems.join(aside, FileSystems.split(f)[1])) in moved]
    if back:
        FileSystems.rename([src for src, _ in back], [f for _, f in back])
    delete_dirs([aside])


def _partial(name: str, uid: str) -> str:
    """The hidden file `write_parquet_file` writes before renaming it to `name`."""
    return f".{name}.{uid}.tmp"


def write_parquet_file(path: str, table: pa.Table) -> None:
    """Write a complete Parquet file under `path`, never a partial one.

    Local: a hidden temporary file in the same directory, then os.replace (atomic on POSIX).
    Object stores (gs://): an object becomes visible only when its upload completes.
    """
    buf = io.BytesIO()
    pq.write_table(table, buf)
    data = buf.getvalue()
    if isinstance(FileSystems.get_filesystem(path), LocalFileSystem):
        directory, name = os.path.split(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, _partial(name, uuid.uuid4().hex))
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    else:
        f = FileSystems.create(path)
        f.write(data)
        f.close()  # only a completed upload creates the object; on an error above, nothing appears


DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}  # a write that no retry would make


class CommitChunks(beam.DoFn):
    """Passes rows through unchanged, and commits them to chunk files as it goes.

    Rows are buffered and written as one Parquet file at least every `every_s` seconds (a
    background timer, so a row finished before a long item does not wait for it) and at the
    end of every bundle. every_s == 0 commits each row as it comes. One DoFn instance is one
    worker thread: its files are named by a random id per instance and a counter.
    """

    def __init__(self, chunk_prefix: str, schema: pa.Schema, every_s: float):
        self.chunk_prefix, self.schema, self.every_s = chunk_prefix, schema, every_s
        self.rows_committed = Metrics.counter(NAMESPACE, "rows_committed")
        self.chunks_committed = Metrics.counter(NAMESPACE, "chunks_committed")

    def setup(self) -> None:
        self._uid = uuid.uuid4().hex
        self._count = 0
        self._lock = threading.Lock()
        self._buffer: list[dict] = []
        self._uncounted = (0, 0)  # (rows, chunks) the timer committed: Beam counts a metric on a bundle's thread only
        self._full: OSError | None = None

    def start_bundle(self) -> None:
        self._full = None  # (one DoFn serves many bundles: a disk that was full may have room again)
        self._stop = threading.Event()
        self._timer = None
        if self.every_s > 0:
            self._timer = threading.Thread(target=self._tick, name="specdec-commit", daemon=True)
            self._timer.start()

    def _tick(self) -> None:
        while not self._stop.wait(min(self.every_s, threading.TIMEOUT_MAX)):  # (inf: at bundle ends only)
            try:
                self._flush()
            except Exception as e:  # the bundle's own final flush retries, and fails the bundle if it must
                if isinstance(e, OSError) and e.errno in DISK_FULL:  # the next row fails the bundle instead: no
                    self._full = e                                     # more work that cannot be kept
                    return
                _LOG.warning("committing a chunk of finished rows failed; will retry", exc_info=True)

    def _flush(self) -> None:
        with self._lock:
            rows, self._buffer = self._buffer, []
            n, self._count = self._count, self._count + (1 if rows else 0)
        if not rows:
            return
        path = f"{self.chunk_prefix}-{self._uid}-{n:05d}.parquet"
        try:
            write_parquet_file(path, pa.Table.from_pylist(rows, schema=self.schema))
        except Exception:
            with self._lock:
                self._buffer[:0] = rows  # keep them for the next attempt
            raise
        with self._lock:
            self._uncounted = (self._uncounted[0] + len(rows), self._uncounted[1] + 1)

    def _count_commits(self) -> None:
        with self._lock:
            (rows, chunks), self._uncounted = self._uncounted, (0, 0)
        if chunks:
            self.rows_committed.inc(rows)
            self.chunks_committed.inc(chunks)

    def process(self, row: dict) -> Iterator[dict]:
        if self._full is not None:
            raise self._full
        with self._lock:
            self._buffer.append(row)
        if self.every_s <= 0:
            self._flush()
        self._count_commits()
        yield row

    def finish_bundle(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
        self._flush()
        self._count_commits()

    def teardown(self) -> None:
        if getattr(self, "_stop", None) is not None:
            self._stop.set()  # a failed bundle never reached finish_bundle: stop its timer,
            if self._timer is not None:  # and let a commit it has in flight end (if that fails, its rows are
                self._timer.join()       # back in the buffer for the flush below)
        if getattr(self, "_buffer", None):  # a failed or interrupted bundle's finished rows: kept if they can be
            try:
                self._flush()
            except Exception as e:
                _LOG.warning("committing the last finished rows failed: %s", one_line(e))


class CommitRows(beam.PTransform):
    """(results, failed, ...) -> the same, committed to PREFIX-chunk-* / PREFIX-failed-chunk-* files
    on the way (each collection of failed rows in its own step: see GenerateRows).

    Give it the generate step's accelerator hint: a step in another environment is not fused
    with the model's, and on Dataflow batch an unfused step runs only after the whole
    generate stage has finished, which would commit nothing before the end.
    """

    def __init__(self, prefix: str, schema: pa.Schema, failed: pa.Schema, every_s: float,
                 accelerator: str | None = None):
        super().__init__()
        self.prefix, self.schema, self.failed, self.every_s = prefix, schema, failed, every_s
        if accelerator:
            self.with_resource_hints(accelerator=accelerator)

    def expand(self, pcolls: tuple[beam.PCollection, ...]) -> tuple[beam.PCollection, ...]:
        results, *failed = pcolls
        return (
            results | "Results" >> beam.ParDo(CommitChunks(f"{self.prefix}-chunk", self.schema, self.every_s)),
            *(rows | f"Failed{i}" >> beam.ParDo(CommitChunks(f"{self.prefix}-failed-chunk", self.failed, self.every_s))
              for i, rows in enumerate(failed)),
        )


def delete_chunks(prefix: str) -> int:
    """Remove a finished job's chunk files: its final shards hold every row by now. Locally also
    the hidden partial chunks (`write_parquet_file`'s) of a worker killed between write and rename."""
    paths = match(chunk_patterns(prefix))
    if isinstance(FileSystems.get_filesystem(prefix), LocalFileSystem):
        for pattern in chunk_patterns(prefix):
            folder, name = os.path.split(absolute(pattern))
            for path in glob.glob(os.path.join(folder, _partial(name, "[0-9a-f]" * 32))):
                os.remove(path)
    if paths:
        FileSystems.delete(paths)
    return len(paths)


def one_line(e: BaseException) -> str:
    """An error's text on one line (pyarrow's thrift errors hold line breaks)."""
    return " ".join(str(e).split())


class UnreadableFile(ValueError):
    """A file under a prefix that is not whole Parquet (an interrupted copy of a run's files): named, to be removed."""


def _read(paths: list[str], skip: Collection[str] = ()) -> pa.Table | None:
    """The files' rows in `paths`' order, but the columns in `skip`, read in parallel: a killed long
    job leaves tens of thousands of chunk files, each a round trip on gs://."""
    def read(path: str) -> pa.Table:
        try:
            with FileSystems.open(path) as f:
                parquet = pq.ParquetFile(f)
                columns = [n for n in parquet.schema_arrow.names if n not in skip]
                return _plain(parquet.read(columns=columns).replace_schema_metadata(None))
        except (OSError, pa.ArrowInvalid) as e:
            raise UnreadableFile(f"{path} is not a readable Parquet file ({one_line(e)})") from e

    tables = each_file(read, paths)
    return pa.concat_tables(tables, promote_options="permissive") if tables else None


def each_file(read: Callable[[str], T], paths: list[str]) -> list[T]:
    """`read(path)` of every path, in order, 16 files at a time: on gs:// each file is a round trip."""
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(paths)))) as pool:
        return list(pool.map(read, paths))


def _plain(table: pa.Table) -> pa.Table:
    """Dictionary-encoded columns (an input's pandas categorical, passed through as it was) as their
    values' type, and ids as their `plain_type` (a resumed run's, written from an input of another
    tool, matched, grouped and joined with the first run's). Other columns of two runs' layouts
    (string, large_string) meet in `_read`'s permissive concatenation: a large_string column can
    hold more than a string column's 2 GiB."""
    for i, field in enumerate(table.schema):
        typ = plain_type(field.type) if field.name == "id" else field.type
        typ = typ.value_type if pa.types.is_dictionary(typ) else typ
        if typ != field.type:
            table = table.set_column(i, field.name, table.column(i).cast(typ))
    return table


def _first_per_key(table: pa.Table, keys: list[str]) -> pa.Table:
    """One row per key (null is a key value like any other), the first one in file order; the
    table as it is where every key is once (no copy of a large run's texts)."""
    index = pa.array(range(table.num_rows), pa.int64())
    first = table.select(keys).append_column("_i", index).group_by(keys, use_threads=False).aggregate(
        [("_i", "min")])["_i_min"]
    if len(first) == table.num_rows:
        return table
    return table.take(np.sort(first.to_numpy()))


def _failed_once(failed: pa.Table) -> pa.Table:
    """One failed row per id, except that an id duplicated in the input keeps one DuplicateId
    row per input row (each numbered in its message): those rows are the input's own, not a
    retry's copies."""
    dup = pc.equal(failed["error_type"], "DuplicateId").fill_null(False)
    dups = failed.filter(dup)
    # A run before the numbering wrote one row per id and prompt: where a later run numbered the
    # same id's rows, those stand for it (a resumed run reads both).
    numbered = pc.match_substring_regex(dups["error_message"], r" \(row \d+ of \d+\)$").fill_null(False)
    superseded = pc.and_(pc.invert(numbered), pc.is_in(dups["id"], value_set=dups.filter(numbered)["id"],
                                                       skip_nulls=False))
    return pa.concat_tables([_first_per_key(failed.filter(pc.invert(dup)), ["id"]),
                             _first_per_key(dups.filter(pc.invert(superseded)), ["id", "prompt", "error_message"])])


def read_outputs(prefixes: str | Iterable[str], skip: Collection[str] = ()) -> tuple[pa.Table | None, pa.Table | None]:
    """(result rows, failed rows) of one or more prefixes, final shards and chunks alike,
    each id once: the first row of an id wins, and an id with a result row has no failed row
    (DuplicateId rows: one per input row). Final shards are read before chunks. None
    where there is no such file. `skip`: result columns not read (a report without a baseline
    or references reads no generation: most of a large run's bytes)."""
    prefixes = [prefixes] if isinstance(prefixes, str) else list(prefixes)
    results = _read(match(p for prefix in prefixes for p in result_patterns(prefix)[:1])
                    + match(p for prefix in prefixes for p in result_patterns(prefix)[1:]), skip)
    failed = _read(match(p for prefix in prefixes for p in failed_patterns(prefix)[:1])
                   + match(p for prefix in prefixes for p in failed_patterns(prefix)[1:]))
    if results is not None:
        results = _first_per_key(results, ["id"])
    if failed is not None:
        failed = _failed_once(failed)
        if results is not None:
            failed = failed.filter(pc.invert(pc.is_in(failed["id"], value_set=results["id"], skip_nulls=False)))
    return results, failed
