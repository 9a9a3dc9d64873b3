"""The README's main command, end to end, on the committed pair (few prompts in CI)."""

import re

import pyarrow.parquet as pq
import pytest

from pipeline import demo


@pytest.mark.slow
def test_tiny_demo_runs_three_jobs_and_judges_them(tmp_path, capsys):
    assert demo.main(["--tiny", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    prompts = pq.read_table(tmp_path / "prompts.parquet")
    assert prompts.num_rows == 6 and "reference" in prompts.schema.names
    for name in ("model_draft", "prompt_lookup", "target_alone"):
        results = pq.read_table(next((tmp_path / "out" / name).glob("gens-00000-of-*.parquet")))
        assert sorted(results["id"].to_pylist()) == sorted(prompts["id"].to_pylist())
        assert results["reference"].to_pylist()  # the reference column travels with the results
    for label in ("mean acceptance", "tokens per target step", "latency p50 / p95", "tokens/s",
                  "ROUGE-1 / 2 / L", "degenerate outputs", "distinct outputs", "speed-up vs target alone",
                  "reference:", "restating each function's name"):
        assert label in out
    assert re.search(r"outputs identical to target alone\s+6/6\s+6/6\s+6/6\n", out), out
    assert "greedy outputs identical across drafters: yes" in out


def test_damaged_pair_stops_the_demo_in_one_line(tmp_path, capsys):
    import shutil

    from pipeline.demo_models import ASSETS

    pair = tmp_path / "pair"
    shutil.copytree(ASSETS, pair)
    (pair / "target" / "model.safetensors").write_bytes(b"not weights")
    assert demo.main(["--tiny", "--pair", str(pair), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: demo pair file ") and "model.safetensors" in err[0]


def test_unwritable_workdir_is_a_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert demo.main(["--tiny", "--workdir", str(blocker / "demo")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and str(blocker) in err[-1]
