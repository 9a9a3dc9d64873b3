"""The README's main command, end to end, on the committed pair (few prompts in CI)."""

import json
import re
import shutil

import pyarrow.parquet as pq
import pytest

from pipeline import demo
from pipeline.demo.assets import ASSETS


@pytest.mark.slow
def test_tiny_demo_runs_three_jobs_and_judges_them(tmp_path, capsys):
    assert demo.main(["--tiny", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    prompts = pq.read_table(tmp_path / "prompts.parquet")
    assert prompts.num_rows == 4 and "reference" in prompts.schema.names
    for name in ("model_draft", "prompt_lookup", "target_alone"):
        results = pq.read_table(next((tmp_path / "out" / name).glob("gens-00000-of-*.parquet")))
        assert sorted(results["id"].to_pylist()) == sorted(prompts["id"].to_pylist())
        assert results["reference"].to_pylist()  # the reference column travels with the results
    for label in ("mean acceptance", "tokens per target step", "latency p50 / p95", "tokens/s",
                  "draft/target step cost c", "chrF vs references", "exact matches", "speed-up vs target alone",
                  "reference:", "generated:"):
        assert label in out
    assert re.search(r"outputs identical to target alone\s+4/4\s+4/4\s+4/4\n", out), out
    assert "greedy outputs identical across drafters: yes" in out
    page = tmp_path / "out" / "model_draft" / "report.html"
    assert f"report page of the model-draft run: {page}" in out and page.stat().st_size > 1000


def test_damaged_pair_stops_the_demo_in_one_line(tmp_path, capsys):
    pair = tmp_path / "pair"
    shutil.copytree(ASSETS, pair)
    (pair / "target" / "model.safetensors").write_bytes(b"not weights")
    assert demo.main(["--tiny", "--pair", str(pair), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: demo pair file ") and "model.safetensors" in err[0]


def test_pair_below_its_gate_stops_the_demo_in_one_line(tmp_path, capsys):
    """`--retrain` never puts a pair below its gate in place (tests/test_demo_models.py); a pair
    whose manifest says it missed its gate stops the demo before any work, naming the missed bars."""
    pair = tmp_path / "pair"
    shutil.copytree(ASSETS, pair)
    manifest = json.loads((pair / "MANIFEST.json").read_text())
    manifest.update(gate_passed=False, gate_missed="the demo pair misses its quality gate: exact matches 10% < 80%")
    (pair / "MANIFEST.json").write_text(json.dumps(manifest))
    assert demo.main(["--tiny", "--pair", str(pair), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {pair}: ") and "exact matches 10% < 80%" in err[0]
    assert not (tmp_path / "w").exists()


def test_unwritable_workdir_is_a_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert demo.main(["--tiny", "--workdir", str(blocker / "demo")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and str(blocker) in err[-1]


def test_an_empty_workdir_is_a_one_line_error(capsys):
    """`--workdir ''` wrote prompts.parquet and out/ into the working folder."""
    with pytest.raises(SystemExit) as e:
        demo.main(["--tiny", "--workdir", ""])
    assert e.value.code == 2
    assert "error: --workdir '': names no folder" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [("--prompts", "-3"), ("--prompts", "0"), ("--max_new_tokens", "0"),
                                         ("--num_speculative_tokens", "0"), ("--threads", "0")])
def test_a_count_below_one_is_a_one_line_error(tmp_path, capsys, flag, value):
    """-3 prompts ran 37, 0 of anything ran the default, 0 threads raised in torch."""
    with pytest.raises(SystemExit) as e:
        demo.main(["--tiny", "--workdir", str(tmp_path / "demo"), flag, value])
    assert e.value.code == 2
    assert f"argument {flag}: must be an integer >= 1, got '{value}'" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()
