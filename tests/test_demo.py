"""The README's main command, end to end in its reduced (--tiny) size."""

import pyarrow.parquet as pq
import pytest

from pipeline import demo


@pytest.mark.slow
def test_tiny_demo_runs_both_jobs_and_reports(tmp_path, capsys):
    assert demo.main(["--tiny", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    prompts = pq.read_table(tmp_path / "prompts.parquet")
    assert prompts.num_rows == 6
    for name in ("speculative", "baseline"):
        results = pq.read_table(next((tmp_path / "out" / name).glob("gens-00000-of-*.parquet")))
        assert sorted(results["id"].to_pylist()) == sorted(prompts["id"].to_pylist())
        assert (tmp_path / "out" / name / "gens-failed-00000-of-00001.parquet").exists()
    for label in ("mean acceptance", "tokens per target step", "latency p50 / p95", "tokens/s",
                  "speed-up (target-alone / speculative latency)"):
        assert label in out
    assert "greedy outputs identical                       yes: 6/6 rows" in out
    assert (tmp_path / "models" / "target" / "config.json").exists()
    assert (tmp_path / "models" / "draft" / "config.json").exists()


def test_unwritable_workdir_is_a_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert demo.main(["--tiny", "--workdir", str(blocker / "demo")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and str(blocker) in err[-1]
