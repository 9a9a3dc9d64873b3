"""`python -m pipeline.prepare`: a dataset -> Parquet prompt shards, through a task template.

The dataset is anything Hugging Face `datasets` loads: a hub id (e.g. `cnn_dailymail` with
`--config 3.0.0`), or local data files of one format (`.parquet`, `.json`/`.jsonl`, `.csv`,
`.txt`, compressed too): a file, a glob or a folder. Each row becomes {id, prompt, *kept
fields}, with prompt = template.format(**row), e.g. --template 'summarize: {article}'.

For instruct models, --user_template (and optionally --system_template) write the prompt as a
conversation instead: a list of {role, content} structs, which `pipeline.run` puts through the
target tokenizer's chat template, e.g.
--system_template 'You summarize news.' --user_template 'Summarize:\n{article}'.
"""

from __future__ import annotations

import argparse
import csv
import os
import string
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from pipeline.flags import ArgumentParser, positive_int
from pipeline.paths import check_prefix
from transforms.durable import SHARD, match
from transforms.schema import id_type_problem

_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".txt": "text"}
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst")  # (datasets reads these by their suffix)
_FORMATS = f".parquet, .json, .jsonl, .csv, .txt, or those compressed: {', '.join(_COMPRESSED)}"


class DatasetError(ValueError):
    """A --dataset this tool refuses before `datasets` reads it (its message names the flag)."""


def _builder(path: str) -> str | None:
    """The `datasets` builder of a data file, by its suffix (any case, compressed or not)."""
    name = path.lower()
    name = next((name[: -len(z)] for z in _COMPRESSED if name.endswith(z)), name)
    return next((b for suffix, b in _BUILDERS.items() if name.endswith(suffix)), None)


def _files_in(folder: str) -> list[str]:
    """A local folder's files as `datasets` reads a folder: hidden ones, and those under a hidden or
    `__` folder, left out."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
        found += [os.path.join(root, name) for name in names if not name.startswith(".")]
    return sorted(found)


def _declares_configs(folder: str) -> bool:
    """A folder laid out as a hub dataset, whose README's YAML header names its configs and their
    files: `datasets` reads those, whatever else the folder holds."""
    try:
        with open(os.path.join(folder, "README.md"), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return False
    return text.startswith("---") and "\nconfigs:" in text.split("\n---", 1)[0]


def _one_builder(dataset: str, files: list[str]) -> str:
    """The one format of the data files a --dataset names: `datasets` reads a folder's most common
    format only, so a folder of a .jsonl and two .txt notes gave the notes as the dataset. A file
    a glob matches is read by the format's reader, so it must be of that format (a folder's other
    files, a README, are left out before, as `datasets` leaves them)."""
    kinds: dict[str, list[str]] = {}
    for path in files:
        if builder := _builder(path):
            kinds.setdefault(builder, []).append(os.path.basename(path))
        else:
            raise DatasetError(f"--dataset {dataset!r} matches {path}, which is of no format it reads ({_FORMATS})")
    if not kinds:
        raise DatasetError(f"--dataset {dataset!r}: no file of a format it reads ({_FORMATS})")
    if len(kinds) > 1:
        held = "; ".join(f"{b}: {', '.join(names[:2])}" + (", ..." if len(names) > 2 else "")
                         for b, names in sorted(kinds.items()))
        raise DatasetError(f"--dataset {dataset!r} holds files of several formats ({held}): name the data "
                           "files with a glob, as 'DIR/*.jsonl'")
    return next(iter(kinds))


def _data_files(dataset: str) -> bool:
    """Whether --dataset names data files (a path Beam's file systems read, a glob, a local file)
    rather than a hub id (or an `hf://` path, which `datasets` reads)."""
    if "://" in dataset:
        return not dataset.startswith("hf://")
    return any(c in dataset for c in "*?[") or _builder(dataset) is not None or os.path.isfile(dataset)


def load(dataset: str, config: str | None, split: str):
    """Data files of one format, named by suffix: a file or a glob through `datasets`' builder for
    that format, a folder through `datasets`' own folder reading (splits from file names); a hub
    id, and a folder laid out as a hub dataset (configs in its README), as `datasets` reads them."""
    import datasets

    folder = os.path.isdir(dataset)
    if folder and not _declares_configs(dataset):
        files = [f for f in _files_in(dataset) if _builder(f)]
    elif not folder and _data_files(dataset):
        files = match([dataset])
        if not files:  # (datasets' own error for it: "StopIteration")
            raise FileNotFoundError(f"--dataset {dataset!r} matches no files")
    else:
        return datasets.load_dataset(dataset, config, split=split)
    if config is not None:  # (it was left out without a word)
        raise DatasetError(f"--config {config!r}: a configuration of a hub dataset (or of a folder whose README names "
                           f"its configs); {dataset!r} is data files, which have none")
    builder = _one_builder(dataset, files)
    if folder:
        _check_splits_cover(dataset, files)
    if all("://" not in f and os.path.getsize(f) == 0 for f in files):
        raise DatasetError(f"--dataset {dataset!r}: its data files are empty")
    path, data_files = (dataset, None) if folder else (builder, dataset)  # (a folder: datasets' folder reading)
    if builder == "text":  # (a byte order mark, which Windows editors write, was the first prompt's first character)
        return datasets.load_dataset(path, data_files=data_files, split=split, encoding="utf-8-sig")
    if builder != "csv":
        return datasets.load_dataset(path, data_files=data_files, split=split)
    # CSV has no types: every column read as the text in the file, so that ids keep their digits
    # ("007"; pandas would make 7, or 1.0 in a column with a gap) and "NA" stays "NA".
    headers = [_csv_start(dataset, f) for f in files]  # (each file's first row checked)
    features = datasets.Features({c: datasets.Value("string") for c in headers[0]})
    return datasets.load_dataset(path, data_files=data_files, split=split, features=features, keep_default_na=False)


def _check_splits_cover(folder: str, files: list[str]) -> None:
    """`datasets` splits a folder by its file names and reads no file that matches none of its splits' patterns
    (`extra.jsonl` beside `train.jsonl`): its rows would be left out of every split without a word."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    splits = DataFilesDict.from_patterns(get_data_patterns(folder), base_path=folder)
    read = {os.path.realpath(f) for found in splits.values() for f in found}
    if left := [f for f in files if os.path.realpath(f) not in read]:
        made = ", ".join(map(str, splits))
        raise DatasetError(f"--dataset {folder!r}: {os.path.relpath(left[0], folder)} (of {len(left)} such files) is "
                           f"in none of the splits its file names make ({made}): name the data files with a glob, as "
                           "'DIR/*.jsonl'")


def _csv_start(dataset: str, path: str) -> list[str]:
    """A CSV file's header, checked against its first row: a first row with more fields than the
    header (a trailing comma) has pandas take its first field as the rows' index, shifting every
    column without a word (a later such row is pandas' own error)."""
    with FileSystems.open(path) as f:  # (decompressed by its suffix)
        header, first = (next(csv.reader([f.readline().decode("utf-8-sig")]), []) for _ in range(2))
    if len(first) > len(header):
        raise DatasetError(f"--dataset {dataset!r}: {path}'s first row has {len(first)} fields, its header "
                           f"{len(header)} (a trailing comma?): pandas would shift every column by one")
    return header


def template_fields(template: str) -> list[str]:
    """The fields a template reads, those inside a format spec too (`{text:>{width}}`)."""
    fields = []
    for _, field, spec, _ in string.Formatter().parse(template):
        fields += ([field] if field is not None else []) + (template_fields(spec) if spec else [])
    return fields


def check_templates(template: str | None, user_template: str | None, system_template: str | None) -> None:
    if (template is None) == (user_template is None):
        raise ValueError("give either --template (text prompts) or --user_template (conversations)")
    if system_template is not None and user_template is None:
        raise ValueError("--system_template needs --user_template")
    for flag, text in (("--template", template), ("--user_template", user_template),
                       ("--system_template", system_template)):
        if text is not None and not text.strip() and flag != "--system_template":  # (every row then failed)
            raise ValueError(f"{flag} {text!r}: writes no text: every prompt would be empty")
        try:
            fields = template_fields(text) if text is not None else []
        except ValueError as e:
            raise ValueError(f"{flag}: {e} (a literal brace is written {{{{ or }}}})") from e
        # A field by position, or an attribute or item of one, is not a column of the row.
        bad = [f for f in fields if f == "" or f.isdigit() or "." in f or "[" in f]
        if bad:
            raise ValueError(f"{flag}: {{{bad[0]}}} names no field (fields are named, as in {{article}}; "
                             "a literal brace is written {{ or }})")


def check_fields(id_field: str | None, keep: list[str]) -> None:
    twice = [f for i, f in enumerate(keep) if f in keep[:i]]
    if twice:
        raise ValueError(f"--keep_fields names {twice[0]!r} twice")
    taken = [f for f in keep if f in ("id", "prompt")]
    if taken:
        raise ValueError(f"--keep_fields {taken[0]!r}: the output's own column of that name (--id_field gives the id)")


BATCH_ROWS = 10_000  # rows formatted at a time
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])


def _prompt(row: dict, fields: set[str], template: str | None, system_template: str | None,
            user_template: str | None) -> str | list[dict[str, str]] | None:
    """The row's prompt; None where a field the templates read is null (pipeline.run then fails
    the row as NullPrompt: reported, never a prompt that reads "None")."""
    if any(row[f] is None for f in fields):
        return None
    if template is not None:
        return template.format(**row)
    system = [{"role": "system", "content": system_template.format(**row)}] if system_template is not None else []
    return [*system, {"role": "user", "content": user_template.format(**row)}]


def _check_column(flag: str, name: str, column: pa.Array, nested: bool) -> None:
    """A column of values of several types (read from JSON as JSON text), or a nested id, would
    reach pipeline.run as something else than the data held, or not key rows at all (a date or a decimal id)."""
    if isinstance(column.type, pa.BaseExtensionType):  # (datasets reads such a JSON field as JSON text)
        seen = list(dict.fromkeys(v for v in column.storage.to_pylist() if v is not None))[:2]
        raise ValueError(f"{flag} {name!r} holds values of several types (such as {' and '.join(seen)}): "
                         "make them one type in the data")
    if not nested and (problem := id_type_problem(column.type)):  # (as pipeline.run would refuse it)
        raise ValueError(f"{flag} {name!r} {problem}")


def prepare(dataset, template: str | None, id_field: str | None, keep: list[str], split: str, limit: int | None,
            *, user_template: str | None = None, system_template: str | None = None) -> pa.Table:
    """Text prompts from `template`, or conversations from `user_template` (+ `system_template`);
    ids copied from `id_field` as they are (type and nulls kept), or SPLIT-INDEX."""
    check_templates(template, user_template, system_template)
    check_fields(id_field, keep)
    templates = [t for t in (template, system_template, user_template) if t is not None]
    fields = {f for t in templates for f in template_fields(t)}
    missing = [f for f in sorted(fields) + keep + ([id_field] if id_field else []) if f not in dataset.column_names]
    if missing:
        raise ValueError(f"field {missing[0]!r} is not in the dataset (fields: {', '.join(dataset.column_names)})")
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    arrow = dataset.with_format("arrow")[:]  # (the selected rows)
    typ = pa.string() if template is not None else pa.list_(MESSAGE)
    read = dataset.select_columns(sorted(fields))
    chunks = []
    for start in range(0, len(dataset), BATCH_ROWS):  # from the fields the templates read, never all rows at once
        end = min(start + BATCH_ROWS, len(dataset))
        rows = read.select(range(start, end)).to_list() if fields else [{}] * (end - start)  # (no columns: no rows)
        try:
            prompts = [_prompt(r, fields, template, system_template, user_template) for r in rows]
        except (TypeError, ValueError, IndexError) as e:  # e.g. {n:03d} over a text field
            raise ValueError(f"the template does not format every row ({type(e).__name__}: {e})") from e
        chunks.append(pa.array(prompts, typ))
    for field in keep:
        _check_column("--keep_fields", field, arrow.column(field).combine_chunks(), nested=True)
    if id_field:
        ids = arrow.column(id_field).combine_chunks()
        _check_column("--id_field", id_field, ids, nested=False)
        counts = pc.value_counts(ids)
        twice = counts.filter(pc.greater(counts.field("counts"), 1))
        if len(twice):
            first = twice[0].as_py()
            raise ValueError(f"--id_field {id_field!r} is not unique: {first['values']!r} is the id of "
                             f"{first['counts']} rows (leave --id_field out for SPLIT-INDEX ids)")
    else:
        ids = pa.array([f"{split}-{i}" for i in range(len(dataset))], pa.string())
    table = pa.table({"id": ids, "prompt": pa.chunked_array(chunks, typ)})
    for field in keep:
        table = table.append_column(field, arrow.column(field).combine_chunks())
    return table


def earlier_shards(prefix: str, overwrite: bool) -> list[str]:
    """The shards already under the prefix (of any count), which stop the run unless `overwrite`: checked before the
    dataset loads (a hub dataset downloads first), and again as the shards are written."""
    old = match([f"{prefix}-{SHARD}.parquet"])
    if old and not overwrite:
        raise FileExistsError(f"--output {prefix!r} already holds {len(old)} shards (e.g. {old[0]}): "
                              "use a new prefix, or pass --overwrite to delete them")
    return old


def write_shards(table: pa.Table, prefix: str, num_shards: int, overwrite: bool = False) -> list[str]:
    """PREFIX-SSSSS-of-NNNNN.parquet, local or gs:// (through Beam's filesystems), rows spread as
    evenly as they go. Shards already under the prefix (of any count) stop it unless `overwrite`:
    a job reading PREFIX-* would read the old and the new rows together."""
    if old := earlier_shards(prefix, overwrite):
        FileSystems.delete(old)
    paths = []
    n = table.num_rows
    for i in range(num_shards):
        path = f"{prefix}-{i:05d}-of-{num_shards:05d}.parquet"
        start, end = i * n // num_shards, (i + 1) * n // num_shards
        with FileSystems.create(path) as f:
            pq.write_table(table.slice(start, end - start), f)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m pipeline.prepare", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True,
                   help="hub id, or local data files of one format (.parquet/.json/.jsonl/.csv/.txt): a file, a glob "
                   "or a folder")
    p.add_argument("--config", default=None, help="dataset configuration name (hub datasets)")
    p.add_argument("--split", default="train")
    p.add_argument("--template", default=None, help="prompt template over the row's fields, e.g. 'summarize: {text}'")
    p.add_argument("--user_template", default=None,
                   help="instead of --template: write conversations (list of {role, content}), this the user message")
    p.add_argument("--system_template", default=None,
                   help="with --user_template: a system message first (fields allowed, like the other templates)")
    p.add_argument("--id_field", default=None, help="field holding a row id (default: SPLIT-INDEX)")
    p.add_argument("--keep_fields", default="", help="comma-separated fields copied next to the prompt")
    p.add_argument("--limit", type=positive_int, default=None, help="take only the first N rows")
    p.add_argument("--num_shards", type=positive_int, default=1)
    p.add_argument("--output", required=True, help="output prefix, local or gs://")
    p.add_argument("--overwrite", action="store_true", help="delete the shards already under --output first")
    args = p.parse_args(argv)
    keep = [f.strip() for f in args.keep_fields.split(",") if f.strip()]
    try:
        check_prefix("--output", args.output, "prompts")  # (a folder's: it wrote FOLDER/-00000-of-00001.parquet)
        check_templates(args.template, args.user_template, args.system_template)  # before loading anything
        check_fields(args.id_field, keep)
        earlier_shards(args.output, args.overwrite)
        try:
            dataset = load(args.dataset, args.config, args.split)
        except (FileNotFoundError, DatasetError):
            raise
        except Exception as e:  # a bad line, a split it lacks, no rows: datasets' own errors (the cause says where)
            why = "; ".join(f"{type(x).__name__}: {(str(x).splitlines() or [''])[0]}"
                            for x in (e, e.__cause__) if x is not None)
            raise ValueError(f"--dataset {args.dataset!r}: cannot load it ({why})") from e
        table = prepare(dataset, args.template, args.id_field, keep, args.split, args.limit,
                        user_template=args.user_template, system_template=args.system_template)
        paths = write_shards(table, args.output, args.num_shards, args.overwrite)
    except (ValueError, FileNotFoundError, FileExistsError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    nulls = table.num_rows - pc.count(table["prompt"]).as_py()
    if nulls:
        print(f"{nulls} of {table.num_rows} rows have a null field the template reads: their prompt is null, "
              "and pipeline.run fails them as NullPrompt", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
