"""`python -m pipeline.prepare`: a dataset -> Parquet prompt shards, through a task template.

The dataset is anything Hugging Face `datasets` loads: a hub id (e.g. `cnn_dailymail` with
`--config 3.0.0`), or local data files (`.parquet`, `.json`/`.jsonl`, `.csv`, `.txt`, globs
allowed). Each row becomes {id, prompt, *kept fields}, with
prompt = template.format(**row), e.g. --template 'summarize: {article}'.

For instruct models, --user_template (and optionally --system_template) write the prompt as a
conversation instead: a list of {role, content} structs, which `pipeline.run` puts through the
target tokenizer's chat template, e.g.
--system_template 'You summarize news.' --user_template 'Summarize:\n{article}'.
"""

from __future__ import annotations

import argparse
import string
import sys

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from pipeline.flags import ArgumentParser

_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".txt": "text"}


def load(dataset: str, config: str | None, split: str):
    import datasets

    suffix = next((s for s in _BUILDERS if dataset.split("*")[0].endswith(s) or dataset.endswith(s)), None)
    if suffix:
        return datasets.load_dataset(_BUILDERS[suffix], data_files=dataset, split=split)
    return datasets.load_dataset(dataset, config, split=split)


def template_fields(template: str) -> list[str]:
    return [field for _, field, _, _ in string.Formatter().parse(template) if field]


def check_templates(template: str | None, user_template: str | None, system_template: str | None) -> None:
    if (template is None) == (user_template is None):
        raise ValueError("give either --template (text prompts) or --user_template (conversations)")
    if system_template is not None and user_template is None:
        raise ValueError("--system_template needs --user_template")


MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])


def _conversation(row: dict, system_template: str | None, user_template: str) -> list[dict[str, str]]:
    system = [{"role": "system", "content": system_template.format(**row)}] if system_template is not None else []
    return [*system, {"role": "user", "content": user_template.format(**row)}]


def prepare(dataset, template: str | None, id_field: str | None, keep: list[str], split: str, limit: int | None,
            *, user_template: str | None = None, system_template: str | None = None) -> pa.Table:
    """Text prompts from `template`, or conversations from `user_template` (+ `system_template`)."""
    check_templates(template, user_template, system_template)
    templates = [t for t in (template, system_template, user_template) if t is not None]
    missing = [f for f in [f for t in templates for f in template_fields(t)] + keep + ([id_field] if id_field else [])
               if f not in dataset.column_names]
    if missing:
        raise ValueError(f"field {missing[0]!r} is not in the dataset (fields: {', '.join(dataset.column_names)})")
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    rows = dataset.to_list()
    ids = [str(r[id_field]) for r in rows] if id_field else [f"{split}-{i}" for i in range(len(rows))]
    if template is not None:
        prompts = pa.array([template.format(**r) for r in rows], pa.string())
    else:
        prompts = pa.array([_conversation(r, system_template, user_template) for r in rows], pa.list_(MESSAGE))
    columns = {"id": pa.array(ids, pa.string()), "prompt": prompts}
    table = pa.table(columns)
    for field in keep:
        table = table.append_column(field, dataset.data.column(field).combine_chunks())
    return table


def write_shards(table: pa.Table, prefix: str, num_shards: int) -> list[str]:
    """PREFIX-SSSSS-of-NNNNN.parquet, local or gs:// (through Beam's filesystems)."""
    paths = []
    per = -(-table.num_rows // num_shards) if table.num_rows else 0
    for i in range(num_shards):
        path = f"{prefix}-{i:05d}-of-{num_shards:05d}.parquet"
        with FileSystems.create(path) as f:
            pq.write_table(table.slice(i * per, per), f)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, help="hub id or local data files (.parquet/.jsonl/.csv/.txt)")
    p.add_argument("--config", default=None, help="dataset configuration name (hub datasets)")
    p.add_argument("--split", default="train")
    p.add_argument("--template", default=None, help="prompt template over the row's fields, e.g. 'summarize: {text}'")
    p.add_argument("--user_template", default=None,
                   help="instead of --template: write conversations (list of {role, content}), this the user message")
    p.add_argument("--system_template", default=None,
                   help="with --user_template: a system message first (fields allowed, like the other templates)")
    p.add_argument("--id_field", default=None, help="field holding a row id (default: SPLIT-INDEX)")
    p.add_argument("--keep_fields", default="", help="comma-separated fields copied next to the prompt")
    p.add_argument("--limit", type=int, default=None, help="take only the first N rows")
    p.add_argument("--num_shards", type=int, default=1)
    p.add_argument("--output", required=True, help="output prefix, local or gs://")
    args = p.parse_args(argv)
    keep = [f.strip() for f in args.keep_fields.split(",") if f.strip()]
    try:
        check_templates(args.template, args.user_template, args.system_template)  # before loading anything
        table = prepare(load(args.dataset, args.config, args.split), args.template, args.id_field, keep,
                        args.split, args.limit, user_template=args.user_template,
                        system_template=args.system_template)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in write_shards(table, args.output, max(1, args.num_shards)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
