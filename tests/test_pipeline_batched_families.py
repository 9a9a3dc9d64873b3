"""End-to-end jobs with --batch_size > 1 on an encoder-decoder pair (the Beam job on the
in-process runner), and the refusals: layers that are not attention, a model its self-check refuses."""

import json
import shutil

from pipeline.run import main
from specdec_core.batch_engine import BatchSpeculativeGenerator
from tests.test_pipeline import GOOD, greedy_reference, run_job, write_prompts


def test_batched_t5_job_equals_target_generate(tmp_path, saved_pairs, monkeypatch):
    target, draft = saved_pairs["t5"]
    lists = []
    generate_many = BatchSpeculativeGenerator.generate_many

    def spy(self, items, *args, **kwargs):
        lists.append(len(items))
        return generate_many(self, items, *args, **kwargs)
    monkeypatch.setattr(BatchSpeculativeGenerator, "generate_many", spy)
    results, failed = run_job(tmp_path, target, draft, "--batch_size", "4")
    assert failed.num_rows == 0
    got = dict(zip(results["id"].to_pylist(), results["generation"].to_pylist(), strict=True))
    for i, prompt in enumerate(GOOD):
        assert got[f"g{i}"] == greedy_reference(target, prompt, 12), prompt
    assert sum(lists) == len(GOOD) and max(lists) > 1, lists
    assert min(results["verify_steps"].to_pylist()) >= 1


def test_batching_a_model_with_other_layers_stops_before_any_work(tmp_path, saved_pairs, capsys):
    target, draft = saved_pairs["llama"]
    odd = tmp_path / "chunked"
    shutil.copytree(target, odd)
    config = json.loads((odd / "config.json").read_text())
    config["layer_types"] = ["chunked_attention"] * config["num_hidden_layers"]
    (odd / "config.json").write_text(json.dumps(config))
    src = write_prompts(tmp_path / "p.parquet", [{"id": "1", "prompt": "hi"}])
    capsys.readouterr()
    assert main(["--input", src, "--output", str(tmp_path / "out/gens"), "--target_model", str(odd),
                 "--draft_model", str(draft), "--batch_size", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "chunked_attention" in err and "\n" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_model_its_self_check_refuses_stops_the_job_in_one_line(tmp_path, capsys):
    """A model whose rows in a padded batch would not get their own logits (FSMT's decoder) is
    refused when the worker loads it: no row is decoded, and the job ends with one line that says
    why (exit 2), after Beam's own log of the error."""
    from tests.family_models import save_family

    save_family("fsmt", tmp_path / "fsmt")
    src = write_prompts(tmp_path / "p.parquet", [{"id": "1", "prompt": "hi"}, {"id": "2", "prompt": "the fox"}])
    capsys.readouterr()
    assert main(["--input", src, "--output", str(tmp_path / "out/gens"), "--target_model", str(tmp_path / "fsmt"),
                 "--drafter", "none", "--batch_size", "2", "--max_new_tokens", "4"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: batch_size > 1: FSMTForConditionalGeneration gives other logits in a padded batch")
    assert "while running" not in last and not list((tmp_path / "out").glob("gens-0*.parquet"))
    assert not list((tmp_path / "out").glob("beam-temp-*"))  # (the sinks' staging folders: nothing was written)


def test_overwrite_deletes_nothing_when_a_workers_load_refuses_the_job(tmp_path, capsys):
    """--overwrite sets the earlier run's files aside and puts them back, as they were, when the
    model is refused as a worker loads it (they were deleted before the job began); a job that runs
    deletes them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.family_models import save_family

    save_family("fsmt", tmp_path / "fsmt")
    src = write_prompts(tmp_path / "p.parquet", [{"id": "1", "prompt": "hi"}, {"id": "2", "prompt": ""}])
    out = tmp_path / "out"
    out.mkdir()
    earlier = {"gens-00000-of-00001.parquet": "x", f"gens-failed-chunk-{1:032x}-00000.parquet": "y"}
    for name, text in earlier.items():
        pq.write_table(pa.table({"id": ["old"], "generation": [text]}), out / name)
    before = {name: (out / name).read_bytes() for name in earlier}
    args = ["--input", src, "--output", str(out / "gens"), "--target_model", str(tmp_path / "fsmt"),
            "--drafter", "none", "--max_new_tokens", "4", "--overwrite"]
    assert main(args + ["--batch_size", "2"]) == 2
    assert "FSMTForConditionalGeneration gives other logits" in capsys.readouterr().err.strip().splitlines()[-1]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # (the empty prompt's failed row: not kept)
    assert main(args) == 0
    assert sorted(p.name for p in out.iterdir()) == ["gens-00000-of-00001.parquet",
                                                     "gens-failed-00000-of-00001.parquet"]
