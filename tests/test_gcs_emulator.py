"""The whole job with every location on gs://, against a local GCS emulator: no network, no credentials.

Input prompts, output prefix, target and draft are all gs:// paths; the models reach the workers
through transforms.model_cache.localize. The outputs must equal a run on local paths.

Runs in one process (in_memory FnApiRunner): the emulator settings and the credential short-circuit
in tests/gcs_emulator.py (without it Beam spends ~25 s looking for Application Default Credentials
before it connects anonymously) only reach this process.
"""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.run import main
from tests import gcs_emulator

pytestmark = pytest.mark.slow

BUCKET = "specdec-e2e"
PROMPTS = ["The quick brown fox", "def add(a, b):", "Hello world! How are", "Speculative decoding drafts",
           "for i in range(10):", "Summarize: the committee"]
# columns that must be identical between two runs (timings differ)
SAME = ["id", "generation", "new_tokens", "draft_tokens", "accepted_tokens", "verify_steps", "finish_reason",
        "seed", "source"]


@pytest.fixture(scope="module")
def gcs():
    with gcs_emulator.running() as emu:
        emu.bucket(BUCKET)
        yield emu


def _prompts(path: Path) -> Path:
    table = pa.table({
        "id": [f"p{i}" for i in range(len(PROMPTS))] + ["empty"],
        "prompt": PROMPTS + [""],
        "source": ["test"] * (len(PROMPTS) + 1),
    })
    pq.write_table(table, path, row_group_size=3)
    return path


def _read_local(prefix: Path, failed: bool = False) -> pa.Table:
    pattern = f"{prefix.name}-failed-*-of-*.parquet" if failed else f"{prefix.name}-[0-9]*-of-*.parquet"
    files = sorted(prefix.parent.glob(pattern))
    assert files, pattern
    return pa.concat_tables(pq.read_table(f) for f in files)


def _read_gcs(gcs, prefix: str, failed: bool = False) -> pa.Table:
    names = [n for n in gcs.list(prefix) if n.endswith(".parquet") and ("-failed-" in n) == failed]
    assert names, prefix
    return pa.concat_tables(pq.read_table(io.BytesIO(gcs.download(n))) for n in names)


def _rows(table: pa.Table) -> list[dict]:
    rows = table.select([c for c in SAME if c in table.column_names]).to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def test_job_on_gcs_equals_local_run(gcs, saved_pairs, tmp_path, monkeypatch):
    target, draft = saved_pairs["llama"]
    prompts = _prompts(tmp_path / "prompts.parquet")
    gcs.upload_file(prompts, f"gs://{BUCKET}/in/prompts-00000.parquet")
    gcs.upload_dir(target, f"gs://{BUCKET}/models/target")
    gcs.upload_dir(draft, f"gs://{BUCKET}/models/draft")
    cache = tmp_path / "model-cache"
    monkeypatch.setenv("SPECDEC_MODEL_CACHE", str(cache))

    common = ["--max_new_tokens=8", "--num_speculative_tokens=3", "--passthrough_columns=source"]
    assert main([
        f"--input=gs://{BUCKET}/in/prompts-*.parquet",
        f"--output=gs://{BUCKET}/out/gens",
        f"--target_model=gs://{BUCKET}/models/target",
        f"--draft_model=gs://{BUCKET}/models/draft",
        *common,
    ]) == 0
    local_prefix = tmp_path / "local" / "gens"
    local_prefix.parent.mkdir()
    assert main([f"--input={prompts}", f"--output={local_prefix}", f"--target_model={target}",
                 f"--draft_model={draft}", *common]) == 0

    remote, local = _read_gcs(gcs, f"gs://{BUCKET}/out/gens"), _read_local(local_prefix)
    assert remote.num_rows == len(PROMPTS)
    assert _rows(remote) == _rows(local)
    assert sum(remote.column("accepted_tokens").to_pylist()) > 0  # the draft really drafted
    assert remote.schema.field("new_tokens").type == pa.int32()
    failed = _read_gcs(gcs, f"gs://{BUCKET}/out/gens", failed=True)
    assert failed.column("id").to_pylist() == ["empty"]
    assert failed.to_pylist() == _read_local(local_prefix, failed=True).to_pylist()
    # only the committed outputs are left: no beam-temp-* leftovers
    assert all("beam-temp" not in n for n in gcs.list(f"gs://{BUCKET}/out/"))
    # both models came through the per-machine cache, complete
    cached = sorted(p.name.rsplit("-", 1)[0] for p in cache.iterdir() if p.is_dir())
    assert cached == ["draft", "target"]
    for d in (p for p in cache.iterdir() if p.is_dir()):
        assert (d / "config.json").exists() and (d / ".specdec-cache-complete.json").exists()


def test_bad_gcs_locations_fail_fast_with_one_line(gcs, capsys):
    code = main([
        f"--input=gs://{BUCKET}/nothing-here/*.parquet",
        f"--output=gs://{BUCKET}/out2/gens",
        f"--target_model=gs://{BUCKET}/models/target",
        "--drafter=none",
    ])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: --input") and "matches no files" in err and "\n" not in err


def test_a_gcs_model_without_weights_stops_before_any_work(gcs, saved_pairs, tmp_path, capsys):
    """A gs:// directory of a model's JSON files alone (an upload that stopped short) failed on
    every worker's load."""
    target, _ = saved_pairs["llama"]
    gcs.upload_file(_prompts(tmp_path / "prompts.parquet"), f"gs://{BUCKET}/noweights/in/prompts.parquet")
    for name in ("config.json", "tokenizer.json"):
        gcs.upload_file(target / name, f"gs://{BUCKET}/noweights/target/{name}")
    code = main([f"--input=gs://{BUCKET}/noweights/in/*.parquet", f"--output=gs://{BUCKET}/noweights/out/gens",
                 f"--target_model=gs://{BUCKET}/noweights/target", "--drafter=none"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith(f"error: --target_model 'gs://{BUCKET}/noweights/target': no weights there"), err


def test_a_gcs_model_without_a_tokenizer_stops_before_any_work(gcs, saved_pairs, tmp_path, capsys):
    """A gs:// target of no tokenizer's files (an upload of the weights and configs alone) failed every worker's load
    (a T5's or BART's, before that load refused it: empty generations), as does such a --tokenizer."""
    target, _ = saved_pairs["t5"]
    gcs.upload_file(_prompts(tmp_path / "prompts.parquet"), f"gs://{BUCKET}/notok/in/prompts.parquet")
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        gcs.upload_file(target / name, f"gs://{BUCKET}/notok/target/{name}")
    base = [f"--input=gs://{BUCKET}/notok/in/*.parquet", f"--output=gs://{BUCKET}/notok/out/gens", "--drafter=none"]
    for flags, needle in [([f"--target_model=gs://{BUCKET}/notok/target"], f"--target_model 'gs://{BUCKET}/notok/"
                           "target': no tokenizer there (tokenizer.json, "),
                          ([f"--target_model={target}", f"--tokenizer=gs://{BUCKET}/notok/target"],
                           f"--tokenizer 'gs://{BUCKET}/notok/target': no tokenizer there (")]:
        assert main(base + flags) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {needle}") and "\n" not in err, err


def test_a_gcs_model_whose_generation_config_is_cut_short_stops_before_any_work(gcs, saved_pairs, tmp_path, capsys):
    """transformers skips a generation_config.json it cannot parse, and the job would decode past the model's end
    tokens: a gs:// model's JSON configs are read at launch as a local one's are."""
    target, _ = saved_pairs["llama"]
    gcs.upload_file(_prompts(tmp_path / "prompts.parquet"), f"gs://{BUCKET}/cut/in/prompts.parquet")
    for f in target.iterdir():
        gcs.upload_file(f, f"gs://{BUCKET}/cut/target/{f.name}")
    cut = tmp_path / "generation_config.json"
    cut.write_bytes((target / "generation_config.json").read_bytes()[:20])
    gcs.upload_file(cut, f"gs://{BUCKET}/cut/target/generation_config.json")
    code = main([f"--input=gs://{BUCKET}/cut/in/*.parquet", f"--output=gs://{BUCKET}/cut/out/gens",
                 f"--target_model=gs://{BUCKET}/cut/target", "--drafter=none"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith(f"error: --target_model 'gs://{BUCKET}/cut/target': cannot read generation_config.json"), err


def test_chunks_resume_and_output_safety_on_gcs(gcs, saved_pairs, tmp_path, monkeypatch, capsys):
    """A killed run's chunk on gs:// is read back, a resumed job skips its ids, and a second job
    into the same gs:// prefix stops before any work."""
    from transforms.durable import output_files, read_outputs, write_parquet_file

    target, _ = saved_pairs["llama"]
    gcs.upload_file(_prompts(tmp_path / "prompts.parquet"), f"gs://{BUCKET}/resume/in/prompts.parquet")
    gcs.upload_dir(target, f"gs://{BUCKET}/resume/target")
    monkeypatch.setenv("SPECDEC_MODEL_CACHE", str(tmp_path / "model-cache"))
    killed = f"gs://{BUCKET}/resume/killed/gens"
    chunk = pa.table({"id": ["p0", "p1"], "generation": ["x", "y"]})
    write_parquet_file(f"{killed}-chunk-{0xabc:032x}-00000.parquet", chunk)
    write_parquet_file(f"{killed}-chunk-{0xdef:032x}-00000.parquet", chunk.slice(1))  # a retried bundle's copy
    assert read_outputs(killed)[0]["id"].to_pylist() == ["p0", "p1"]

    out = f"gs://{BUCKET}/resume/second/gens"
    args = [f"--input=gs://{BUCKET}/resume/in/*.parquet", f"--output={out}",
            f"--target_model=gs://{BUCKET}/resume/target", "--drafter=none", "--max_new_tokens=4"]
    assert main([*args, f"--resume_from={killed}"]) == 0
    results, failed = read_outputs(out)
    assert sorted(results["id"].to_pylist()) == [f"p{i}" for i in range(2, len(PROMPTS))]
    assert failed["id"].to_pylist() == ["empty"]
    assert not [n for n in gcs.list(out) if "-chunk-" in n]  # the finished job dropped its chunks
    assert len(output_files(out)) == 2

    # a killed run's staging folder on gs:// (objects under it), found as --overwrite deletes it
    from transforms.durable import beam_temp_dirs, delete_dirs
    staged = f"{out}".rsplit("/", 1)[0] + "/beam-temp-gens-" + "ab" * 16
    write_parquet_file(f"{staged}/shard.parquet", chunk)
    write_parquet_file(f"{staged.replace('gens-', 'gens-v2-')}/shard.parquet", chunk)
    assert beam_temp_dirs(out) == [staged]
    delete_dirs([staged])
    assert beam_temp_dirs(out) == [] and gcs.list(staged.replace("gens-", "gens-v2-"))

    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --output '{out}' already holds 2 output files") and "\n" not in err

    # --overwrite's earlier files set aside on gs:// (copied, deleted) and put back, as a refused load does
    from transforms.durable import aside_folder, put_back, set_aside
    earlier = output_files(out)
    aside = aside_folder(out)
    set_aside(earlier, aside)
    assert output_files(out) == [] and len(gcs.list(aside)) == 2
    put_back(aside, earlier)
    assert output_files(out) == earlier and not gcs.list(aside)
