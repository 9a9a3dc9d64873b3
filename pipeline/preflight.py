"""Checks that stop a bad job before any work, each with one line naming the culprit."""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import FileSystem
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem
from apache_beam.options.pipeline_options import DirectOptions, TestOptions

from pipeline.errors import JobConfigError
from pipeline.model_checks import (
    check_config_files,
    check_model_path,
    check_reachable,
    check_tokenizer_path,
    local_model_configs,
    quiet_transformers,
    read_generation_config,
    said,
    target_tokenizer,
)
from pipeline.paths import check_gs_path, check_local_folder, check_prefix, one_spelling, same_prefix
from transforms.durable import (
    each_file,
    match,
    one_line,
    output_files,
    result_patterns,
    sink_deletes,
)
from transforms.schema import id_type_problem, plain_type, result_schema

if TYPE_CHECKING:  # (the options import torch)
    from transformers import PreTrainedTokenizerBase

    from pipeline.options import SpecDecOptions

log = logging.getLogger(__name__)


def input_schemas(pattern: str) -> list[tuple[str, pa.Schema]]:
    """Each input file with its Parquet schema (one shard of another layout would otherwise fail
    the job after its work)."""
    try:
        files = match([pattern])
    except Exception as e:  # Beam raises BeamIOError for unreachable locations
        raise JobConfigError(f"--input {pattern!r}: cannot list files ({e})") from e
    if not files:
        raise JobConfigError(f"--input {pattern!r} matches no files")
    _check_whole_shard_sets(pattern, files)
    return list(zip(files, parquet_schemas("--input", files), strict=True))


def _check_whole_shard_sets(pattern: str, files: list[str]) -> None:
    """Shards named NAME-SSSSS-of-NNNNN.parquet (prepare's, Beam's, the hub's datasets') come in whole
    sets: a shard the pattern would match that is not there (a write or copy interrupted after some
    shards) stops the job, which would decode part of the data without a word. A pattern that names
    some shards of a set (`prompts-0000[0-2]-of-00008.parquet`) is taken as it is."""
    sets: dict[tuple[str, str], set[int]] = {}
    for path in files:
        if found := re.fullmatch(r"(.+)-(\d{5,})-of-(\d{5,})\.parquet", path):
            sets.setdefault((found[1], found[3]), set()).add(int(found[2]))
    for (name, total), present in sets.items():
        missing = [shard for i in range(int(total)) if i not in present
                   and fnmatch.fnmatchcase(shard := f"{name}-{i:0{len(total)}d}-of-{total}.parquet", pattern)]
        if missing:
            raise JobConfigError(f"--input {pattern!r}: {len(missing)} of the {int(total)} shards of "
                                 f"{name}-*-of-{total}.parquet are missing (e.g. {missing[0]}): an interrupted "
                                 "write or copy? Write them, or name the shards to read")


def parquet_schemas(flag: str, files: list[str]) -> list[pa.Schema]:
    """The files' Parquet schemas (footers only, read in parallel): a file that is not whole Parquet
    (cut short by an interrupted copy, or not Parquet at all) is named here, not in a traceback of the job."""
    def read(path: str) -> pa.Schema:
        try:
            with FileSystems.open(path) as f:
                return pq.read_schema(f)
        except Exception as e:
            raise JobConfigError(f"{flag}: {path} is not a readable Parquet file ({one_line(e)})") from e

    return each_file(read, files)


def damaged_files(opts: SpecDecOptions) -> tuple[str, list[str]]:
    """(flag, each of its files whose data the job cannot read, with where and why), read as Beam's
    Parquet source reads them (row group by row group, the job's columns): preflight reads footers
    only, and a file damaged inside fails the job's read step with an error that names no file.
    The input first, then the --resume_from prefixes' results (their ids)."""
    def damaged(path: str, columns: list[str]) -> str | None:
        where = "its footer"
        try:
            with FileSystems.open(path) as f:
                parquet = pq.ParquetFile(f)
                for i in range(parquet.num_row_groups):
                    where = f"row group {i} of {parquet.num_row_groups}"
                    parquet.read_row_group(i, columns=columns)
        except Exception as e:
            return f"{path} ({where}: {type(e).__name__}: {one_line(e)})"
        return None

    reads = [("--input", [opts.input], opts.input_columns())]
    reads += [("--resume_from", result_patterns(prefix), ["id"]) for prefix in opts.resume_prefixes()]
    for flag, patterns, columns in reads:
        if found := [f for f in each_file(lambda path, c=columns: damaged(path, c), match(patterns)) if f]:
            return flag, found
    return "", []


def _columns_read(opts: SpecDecOptions) -> list[tuple[str, str]]:
    """(flag, column) of every input column the job reads."""
    return [("--prompt_column", opts.prompt_column), ("--id_column", opts.id_column)] + [
        ("--passthrough_columns", c) for c in opts.passthrough()]


def _check_columns(opts: SpecDecOptions, path: str, schema: pa.Schema) -> None:
    """path, schema: the input's first file's."""
    names = schema.names
    for flag, col in _columns_read(opts):
        if col not in names:
            raise JobConfigError(f"{flag} {col!r} is not a column of the input (columns of {path}: "
                                 f"{', '.join(names)})")
    twice = [c for i, c in enumerate(opts.passthrough()) if c in opts.passthrough()[:i]]
    if twice:
        raise JobConfigError(f"--passthrough_columns names {twice[0]!r} twice")
    ambiguous = [c for _, c in _columns_read(opts) if names.count(c) > 1]
    if ambiguous:
        raise JobConfigError(f"the input has {names.count(ambiguous[0])} columns named {ambiguous[0]!r}")
    taken = set(result_schema(schema, opts.id_column, []).names)
    clash = [c for c in opts.passthrough() if c in taken]
    if clash:
        raise JobConfigError(f"--passthrough_columns {clash[0]!r} clashes with an output column of that name")


def _check_id_type(opts: SpecDecOptions, schema: pa.Schema) -> None:
    """schema: the input's, each column of the first file's type with values (`_check_shards`)."""
    if problem := id_type_problem(schema.field(opts.id_column).type):
        raise JobConfigError(f"--id_column {opts.id_column!r} {problem}")


def _writable_as(later: pa.DataType, first: pa.DataType) -> bool:
    """Whether a later file's values go into an output column of the first file's type."""
    return pa.types.is_null(later) or plain_type(later) == plain_type(first)


def _check_shards(opts: SpecDecOptions, shards: list[tuple[str, pa.Schema]]) -> pa.Schema:
    """Every input file has the columns the job reads, its ids and passed-through columns of one
    type (the output files have one schema): the first file's, or for a column of nulls only there,
    the first file's that holds values. Prompts keep the first file's type: a later file's prompts
    of another type fail as rows, each with its reason (the first file's stop the job:
    `conversation_column`). Returns the first file's schema with those types."""
    (where, first), typed = shards[0], {}
    for flag, col in _columns_read(opts):
        if flag == "--prompt_column":  # (the first file's: a later file's prompts fail as rows)
            continue
        typed[col] = next(((path, schema.field(col).type) for path, schema in shards
                           if col in schema.names and not pa.types.is_null(schema.field(col).type)),
                          (where, first.field(col).type))
    for path, schema in shards[1:]:
        for flag, col in _columns_read(opts):
            if col not in schema.names:
                raise JobConfigError(f"--input: {path} has no {col!r} column ({flag}), which {where} has")
            if flag == "--prompt_column":
                continue
            source, typ = typed[col]
            if not _writable_as(schema.field(col).type, typ):
                raise JobConfigError(f"--input: {path}'s {col!r} column ({flag}) is {schema.field(col).type}, "
                                     f"{source}'s is {typ}")
    for col, (_, typ) in typed.items():
        first = first.set(first.get_field_index(col), first.field(col).with_type(typ))
    return first


def conversation_column(schema: pa.Schema, column: str) -> bool:
    """Whether the prompt column holds conversations: a list of structs with `role` and `content`.

    A column of anything else (numbers, bytes, other lists) is a job-level mistake (every row would
    fail), so it stops the job; a column of nulls only passes (each row fails on its own).
    """
    typ = plain_type(schema.field(column).type)  # (a pandas categorical column: dictionary-encoded text)
    if pa.types.is_string(typ) or pa.types.is_null(typ):
        return False
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        value = typ.value_type
        if pa.types.is_struct(value) and {"role", "content"} <= {value.field(i).name for i in range(value.num_fields)}:
            return True
    raise JobConfigError(f"--prompt_column {column!r} is {typ}: expected text, or a conversation "
                         "(a list of {role, content} structs)")


def _has_chat_template(opts: SpecDecOptions, tokenizer: PreTrainedTokenizerBase | None) -> bool:
    path = opts.tokenizer or opts.target_model
    if tokenizer is None:  # (gs://)
        base = path.rstrip("/")
        if any(FileSystems.exists(f"{base}/{name}") for name in ("chat_template.jinja", "chat_template.json")):
            return True
        try:
            with FileSystems.open(f"{base}/tokenizer_config.json") as f:
                return bool(json.load(f).get("chat_template"))
        except Exception:
            return False
    return bool(tokenizer.chat_template)


def _check_chat(opts: SpecDecOptions, schema: pa.Schema, tokenizer: PreTrainedTokenizerBase | None) -> None:
    conversations = conversation_column(schema, opts.prompt_column)
    if opts.system_prompt is not None and not (opts.chat_template or conversations):
        raise JobConfigError("--system_prompt needs --chat_template (or a conversation prompt column)")
    if opts.chat_template or conversations:
        if not _has_chat_template(opts, tokenizer):
            path = opts.tokenizer or opts.target_model
            why = ("--chat_template" if opts.chat_template
                   else f"--prompt_column {opts.prompt_column!r} holds conversations")
            raise JobConfigError(f"{why}, but the tokenizer of {path!r} has no chat template")


def _check_pair(opts: SpecDecOptions, tokenizer: PreTrainedTokenizerBase | None,
                configs: list) -> tuple[bool, str] | None:
    """Kind check, and the drafting mode where both models and the tokenizer are local (gs:// ones
    are checked on load): whether it is cross-tokenizer (each row drafted in its own session), and
    the mode in words; None when not checked here."""
    paths = [opts.target_model, opts.draft_model]
    if any(p.startswith("gs://") for p in paths) or tokenizer is None:
        return None
    from specdec_core.loading import (
        CROSS_TOKENIZER,
        IncompatiblePairError,
        check_compatible,
        describe_mode,
        draft_tokenizer_for,
    )

    try:
        with quiet_transformers():
            draft_tokenizer = draft_tokenizer_for(opts.draft_model, tokenizer, opts.trust_remote_code)
    except Exception as e:  # (a partial copy: tokenizer_config.json without its tokenizer.json)
        raise JobConfigError(f"--draft_model {opts.draft_model!r}: cannot load its tokenizer ({said(e)})") from e
    try:
        mode = check_compatible(*(c[2] for c in configs), tokenizer, draft_tokenizer,
                                tuple(map(read_generation_config, paths)))
    except IncompatiblePairError as e:
        raise JobConfigError(f"--draft_model {opts.draft_model!r}: {e}") from e
    return mode == CROSS_TOKENIZER, describe_mode(mode, tokenizer, draft_tokenizer)


def is_dry_run(opts: SpecDecOptions) -> bool:
    """DataflowRunner --dry_run builds the job and submits nothing, so it writes nothing either."""
    return bool(opts.view_as(TestOptions).dry_run)


def _check_not_in_input(opts: SpecDecOptions) -> None:
    """Output files that --input's pattern matches: the run goes well (it reads its input before it writes), but every
    later run of that --input reads them as prompt files, and stops on their columns."""
    def real(path: str, folder: str) -> str:  # (a local folder's symbolic links resolved, as the matched files are)
        return path if FileSystems.get_scheme(path) else os.path.realpath(folder) + path[len(folder):]

    fixed = os.path.dirname(re.split(r"[*?\[]", opts.input)[0])  # (the folder before the pattern's first wildcard)
    pattern = re.compile(FileSystem.translate_pattern(real(opts.input, fixed)))
    output = real(opts.output, os.path.dirname(opts.output))
    names = [f"{output}-00000-of-00001.parquet", f"{output}-failed-00000-of-00001.parquet",
             f"{output}-chunk-{'0' * 32}-00000.parquet"]
    if matched := next((n for n in names if pattern.match(n)), None):
        raise JobConfigError(f"--output {opts.output!r}: --input {opts.input!r} matches its files (such as "
                             f"{os.path.basename(matched)}): a later run of that --input would read them as prompts; "
                             "write the output outside the input's pattern")


def _check_output(opts: SpecDecOptions, inputs: list[str]) -> None:
    check_prefix("--output", opts.output)
    if is_dry_run(opts):
        return
    check_local_folder("--output", opts.output)
    try:
        existing = output_files(opts.output)
        doomed = sink_deletes(opts.output)
    except Exception as e:
        raise JobConfigError(f"--output {opts.output!r}: cannot list files there ({e})") from e
    if clash := sorted({one_spelling(f) for f in existing + doomed} & {one_spelling(f) for f in inputs}):
        raise JobConfigError(f"--output {opts.output!r}: the input file {clash[0]} is named as this prefix's "
                             "output, which the job deletes (Beam's writer, or --overwrite): use another prefix")
    _check_not_in_input(opts)
    foreign = sorted(set(doomed) - set(existing))
    if foreign:  # --overwrite or not: it deletes this prefix's files, never another's
        raise JobConfigError(f"--output {opts.output!r}: Beam's writer deletes every "
                             f"{os.path.basename(opts.output)}-*-of-*.parquet when it finishes, and {foreign[0]} "
                             "is not this prefix's: use a prefix that no other file name starts with")
    if existing and not opts.overwrite:
        raise JobConfigError(f"--output {opts.output!r} already holds {len(existing)} output files (results or "
                             f"failed rows, e.g. {existing[0]}): use a new prefix, or pass --overwrite to delete them")


def _check_resume(opts: SpecDecOptions, schema: pa.Schema) -> None:
    """Each earlier prefix must hold files (a typo would silently regenerate everything) whose id
    type is the input's (otherwise no id would ever match)."""
    id_type = schema.field(opts.id_column).type
    for prefix in opts.resume_prefixes():
        check_prefix("--resume_from", prefix, written=False)
        if same_prefix(prefix, opts.output):
            raise JobConfigError(f"--resume_from {prefix!r} is the --output prefix: resume into a new prefix")
        try:
            results = match(result_patterns(prefix))
            anything = results or output_files(prefix)
        except Exception as e:
            raise JobConfigError(f"--resume_from {prefix!r}: cannot list files there ({e})") from e
        if not anything:
            raise JobConfigError(f"--resume_from {prefix!r}: no output files of an earlier run there")
        if results:
            # Every local file's footer (the job reads their ids; an interrupted copy leaves a file cut short), one
            # remote one (an object store never shows a partial object, and a long job leaves thousands of chunks).
            local = isinstance(FileSystems.get_filesystem(prefix), LocalFileSystem)
            found = parquet_schemas(f"--resume_from {prefix!r}", results if local else results[:1])[0]
            if "generation" not in found.names:  # (prompt shards of the same name: every row skipped, none done)
                raise JobConfigError(f"--resume_from {prefix!r}: {results[0]} holds no generations (no "
                                     "'generation' column): not an output of an earlier run")
            if plain_type(found.field("id").type) != plain_type(id_type):  # (ids match as Python values)
                raise JobConfigError(f"--resume_from {prefix!r}: its ids are {found.field('id').type}, the "
                                     f"input's {opts.id_column!r} column is {id_type}")
            _check_same_generation(opts, prefix, found)


def _check_same_generation(opts: SpecDecOptions, prefix: str, schema: pa.Schema) -> None:
    """A resumed run's rows and this job's are read as one output: rows of other generation flags
    (another length, greedy beside sampled) would mix in it unseen."""
    from pipeline.provenance import (
        GENERATION_FLAGS,
        NGRAM_FLAGS,
        SAMPLING_FLAGS,
        generation_differences,
        placement_record,
        record_in,
    )

    record = record_in(schema.metadata)
    if record is None:  # (files written before runs carried their flags)
        return
    now = {k: json.loads(json.dumps(getattr(opts, k), default=str))
           for k in GENERATION_FLAGS + SAMPLING_FLAGS + NGRAM_FLAGS + ("device",)}
    now["placement"] = placement_record(opts)  # (where --device auto runs, as the run record will say: after the fit)
    for key, theirs, ours in generation_differences(record, now)[:1]:
        auto = " (--dtype auto is the device's dtype: name the run's)" if key == "dtype" and "auto" in (
            record.get("dtype"), opts.dtype) and theirs != "auto" else ""
        raise JobConfigError(f"--resume_from {prefix!r}: its run had --{key} {theirs!r}, this job {ours!r}{auto}; "
                             "resume with the generation flags of the run it continues")


def _check_batching(opts: SpecDecOptions, configs: list, per_row_draft: bool) -> None:
    """--batch_size > 1 decodes every attention model, decoder-only or encoder-decoder, full or
    sliding-window; models with other layer kinds (chunked, linear or state-space layers) are
    refused. A draft with another tokenizer (`per_row_draft`) drafts each row in its own one-row
    session, so neither its layers nor its int8 linears meet a batch."""
    if opts.batch_size == 1:
        return
    if opts.drafter == "model" and opts.draft_dtype == "int8" and not per_row_draft:
        raise JobConfigError(f"--draft_dtype int8 with --batch_size {opts.batch_size}: dynamic quantization scales a "
                             "pass's rows together, so a padded batch's rows would not get their own logits (use "
                             "--batch_size 1, or --draft_dtype auto)")
    from specdec_core.plan import unbatchable

    for flag, path, config in configs:
        why = None if per_row_draft and flag == "--draft_model" else unbatchable(config)
        if why:
            raise JobConfigError(f"--batch_size {opts.batch_size}: {flag} {path!r} {why}; batching needs "
                                 "attention layers, full or sliding-window (use --batch_size 1)")


def _fewest_prompt_tokens(opts: SpecDecOptions, conversations: bool, tokenizer: PreTrainedTokenizerBase | None) -> int:
    """A lower bound on every row's prompt tokens under a causal target: one token and the special
    tokens the tokenizer adds (a BOS); through a chat template, what the template writes around an
    empty user message (with --system_prompt where every row gets it: a text column), fewest over
    the shapes a conversation can start with."""
    if tokenizer is None:
        return 1
    fewest = 1 + tokenizer.num_special_tokens_to_add()
    if not (opts.chat_template or conversations):
        return fewest
    user = [{"role": "user", "content": ""}]
    if opts.system_prompt is not None and not conversations:
        shapes = [[{"role": "system", "content": opts.system_prompt}, *user]]
    else:  # (a conversation may bring its own, shorter, system message)
        shapes = [user, [{"role": "system", "content": ""}, *user]]
    counts = []
    for messages in shapes:
        try:
            counts.append(len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                            return_dict=True)["input_ids"]))
        except Exception:  # (a template that refuses the shape refuses such rows, each its own)
            continue
    return min(counts) if counts else 1


def _check_context(opts: SpecDecOptions, schema: pa.Schema, tokenizer: PreTrainedTokenizerBase | None,
                   configs: list) -> None:
    """--max_new_tokens past what a local target's decoder can position would fail every row
    (`PromptTooLong`): a causal decoder holds the prompt (`_fewest_prompt_tokens` of it at least)
    and the output. (A draft with fewer positions drafts while a row fits them, then the target
    goes on alone.)"""
    from specdec_core.loading import positions

    found = next((c for c in configs if c[0] == "--target_model"), None)
    if found is None:
        return
    flag, path, config = found
    limit = positions(config)
    if limit is None:
        return
    conversations = conversation_column(schema, opts.prompt_column)
    shortest = 0 if config.is_encoder_decoder else _fewest_prompt_tokens(opts, conversations, tokenizer)
    chat = " through the chat template" if opts.chat_template or conversations else ""
    if opts.max_new_tokens > limit - shortest:
        raise JobConfigError(f"--max_new_tokens {opts.max_new_tokens}: {flag} {path!r} can hold at most "
                             f"{limit - shortest} new tokens (its decoder's {limit} positions"
                             + (f", less the shortest prompt's {shortest} tokens{chat}" if shortest > 1 else "")
                             + "); every row would fail")


def _check_cuda_graphs(opts: SpecDecOptions, configs: list) -> None:
    """--cuda_graphs on insists on static caches: refuse a split model, or one whose config rules
    them out."""
    if opts.cuda_graphs != "on":
        return
    from specdec_core.plan import config_support

    if opts.device_map == "auto":
        raise JobConfigError("--cuda_graphs on: a model split by --device_map auto runs eagerly (use --cuda_graphs "
                             "auto or off)")
    for flag, path, config in configs:
        why = config_support(config)
        if why:
            raise JobConfigError(f"--cuda_graphs on: {flag} {path!r} {why} (use --cuda_graphs auto or off)")


def preflight(opts: SpecDecOptions) -> pa.Schema:
    """Validate settings, input, output and models; return the input's Parquet schema."""
    try:
        opts.generator_spec()
    except ValueError as e:  # (the engine's sampling settings are named as their flags are)
        raise JobConfigError(f"--{e}" if str(e).startswith(("temperature ", "top_k ", "top_p ")) else str(e)) from e
    if opts.draft_model and opts.drafter != "model":  # (it was ignored: a job that looked speculative ran without it)
        raise JobConfigError(f"--draft_model {opts.draft_model!r} with --drafter {opts.drafter}, which uses no draft "
                             "model: drop --draft_model, or use --drafter model")
    for flag, value in [("--num_speculative_tokens", opts.num_speculative_tokens),
                        ("--max_new_tokens", opts.max_new_tokens)]:
        if value < 1:
            raise JobConfigError(f"{flag} must be >= 1, got {value}")
    if not opts.commit_every_s >= 0:
        raise JobConfigError(f"--commit_every_s must be >= 0, got {opts.commit_every_s}")
    if (workers := opts.view_as(DirectOptions).direct_num_workers) < 0:  # (Beam's local runner: an IndexError)
        raise JobConfigError(f"--direct_num_workers must be >= 0 (0: one per CPU), got {workers}")
    from pipeline.fit import accelerator_hints, worker_accelerators

    if (hints := accelerator_hints(opts)) and (given := worker_accelerators(opts)):  # (Google's right-fitting
        # guide: "don't use the worker_accelerator service option")
        raise JobConfigError(f"{hints[0][0]} with {given[0]}: Dataflow's right fitting (the accelerator hint) is "
                             "not to be combined with worker_accelerator: give one")
    for flag, path, names_object in [("--input", opts.input, True), ("--output", opts.output, True),
                                     *(("--resume_from", p, True) for p in opts.resume_prefixes()),
                                     ("--target_model", opts.target_model, False),
                                     ("--draft_model", opts.draft_model or "", False),
                                     ("--tokenizer", opts.tokenizer or "", False)]:  # (before any storage call)
        check_gs_path(flag, path, names_object)
    shards = input_schemas(opts.input)
    _check_columns(opts, *shards[0])
    schema = _check_shards(opts, shards)
    _check_id_type(opts, schema)
    trust = opts.trust_remote_code
    models = [("--target_model", opts.target_model)] + (
        [("--draft_model", opts.draft_model)] if opts.drafter == "model" else [])
    if opts.tokenizer:
        models.append(("--tokenizer", opts.tokenizer))
    for flag, path in models:  # before anything that hands a model directory to transformers
        check_reachable(flag, path)
        check_config_files(flag, path, trust)
    check_model_path("--target_model", opts.target_model, trust)
    if opts.tokenizer:
        check_tokenizer_path(opts.tokenizer, trust)
    if opts.drafter == "model":
        check_model_path("--draft_model", opts.draft_model, trust)
    tokenizer = target_tokenizer(opts)  # loaded here for the checks below (None on gs://: the workers load it)
    configs = list(local_model_configs(opts))  # (flag, path, config) of the local models, read once
    pair = _check_pair(opts, tokenizer, configs) if opts.drafter == "model" else None
    _check_chat(opts, schema, tokenizer)
    _check_output(opts, [path for path, _ in shards])
    _check_batching(opts, configs, per_row_draft=pair is not None and pair[0])
    _check_context(opts, schema, tokenizer, configs)
    _check_cuda_graphs(opts, configs)
    _check_fit(opts)
    _check_resume(opts, schema)  # (after the fit, whose plan says where --device auto runs)
    if pair:  # (logged once every check passed: a refused job prints its one line only)
        log.info("--draft_model %s: %s", opts.draft_model, pair[1])
    if opts.drafter == "model" and one_spelling(opts.draft_model) == one_spelling(opts.target_model):
        log.warning("--draft_model %s is the target itself: every draft is kept, and each costs a pass of the "
                    "target (--drafter none or ngram is faster)", opts.draft_model)
    unused = [f"--{n} {v}" for n, v in (("top_k", opts.top_k), ("top_p", opts.top_p)) if v is not None]
    if unused and opts.temperature == 0:  # (as generate() warns of them without do_sample)
        log.warning("%s: sampling settings, and --temperature 0 decodes greedily: no effect", ", ".join(unused))
    from pipeline.options import spec_default

    others = [(f"--{n} {getattr(opts, n)}", drafter) for n, drafter in (
        ("ngram_min_size", "ngram"), ("ngram_max_size", "ngram"), ("draft_dtype", "model"))
        if getattr(opts, n) != spec_default(n) and opts.drafter != drafter]
    for flag, drafter in others:  # (as the sampling settings under greedy)
        log.warning("%s: a setting of --drafter %s, and this job runs --drafter %s: no effect", flag, drafter,
                    opts.drafter)
    _say_dtype(opts, configs)
    return schema


def _say_dtype(opts: SpecDecOptions, configs: list) -> None:
    """`--dtype auto` is the device's dtype (float32 on a CPU, bfloat16 on CUDA), not the checkpoint's,
    as a plain `from_pretrained` gives it: said where they differ, since greedy outputs follow the dtype."""
    found = next((c for c in configs if c[0] == "--target_model"), None)
    saved = str(getattr(found[2], "dtype", None) if found else None).removeprefix("torch.")
    if opts.dtype != "auto" or saved not in ("float16", "bfloat16") or (saved, opts.device[:4]) == ("bfloat16", "cuda"):
        return
    log.info("--target_model %s: its checkpoint is %s; --dtype auto decodes it in float32 on a CPU, bfloat16 on CUDA "
             "(outputs equal its generate() in that dtype; --dtype %s keeps the checkpoint's)", found[1], saved, saved)


def _check_fit(opts: SpecDecOptions) -> None:
    """A pair that cannot fit the worker's GPUs (pipeline/fit.py) stops the job here."""
    from pipeline.fit import check_fit

    try:
        check_fit(opts)
    except JobConfigError:
        raise
    except ValueError as e:
        raise JobConfigError(str(e)) from e
