"""pipeline.bench.cross end to end on a tiny random cross-tokenizer pair (no training): every
method runs, outputs are compared with the target alone, and the table reports it."""

import argparse

from pipeline.bench import cross as bench_cross
from tests.cross_models import byte_level
from tests.tiny_models import make_model


def test_bench_cross_runs_every_method_and_checks_identity(monkeypatch, tmp_path):
    ttok, dtok = byte_level(420), byte_level(300)
    pair = [make_model("gpt2", ttok, seed=1), ttok, make_model("gpt2", dtok, seed=2), dtok]
    monkeypatch.setattr(bench_cross, "load_pair", lambda cache_dir: pair)
    args = argparse.Namespace(threads=0, cache_dir=str(tmp_path), gamma=3, max_new_tokens=8, prompts=3,
                              batch_sizes=[2], repeats=2)
    result = bench_cross.run(args)
    rows = result["rows"]
    assert set(rows) == {"target alone (ours)", "target alone (HF generate)", "ours: cross-tokenizer g=3",
                         "HF universal assisted g=3", "target alone (ours), B=2", "ours: cross-tokenizer g=3, B=2",
                         "ours: cross-tokenizer adaptive g<=3, B=2"}
    assert result["prompts"] == 3
    for name, r in rows.items():
        assert not r["errors"], (name, r["errors"])
        assert r["tokens"] > 0 and r["passes"] > 0
    ours = rows["ours: cross-tokenizer g=3"]
    assert ours["same"] == ours["compared"] == 3 and ours["drafted"] > 0
    batched = rows["ours: cross-tokenizer g=3, B=2"]  # all prompts twice per repeat (ABC CBA), 2 rows at a time
    assert batched["same"] == batched["compared"] == 12 and batched["drafted"] == 4 * ours["drafted"]
    assert rows["target alone (ours), B=2"]["same"] == rows["ours: cross-tokenizer adaptive g<=3, B=2"]["same"] == 12
    text = bench_cross.table(result)
    assert "| ours: cross-tokenizer g=3 |" in text and "3/3" in text and "| ours: cross-tokenizer g=3, B=2 |" in text


def test_pipeline_bench_cross_writes_its_section_once(monkeypatch, tmp_path):
    """`pipeline.bench --cross` puts the cross-tokenizer table in the report, and a second run
    replaces it rather than appending another."""
    from pipeline.bench import speed as bench

    ttok, dtok = byte_level(420), byte_level(300)
    pair = [make_model("gpt2", ttok, seed=1), ttok, make_model("gpt2", dtok, seed=2), dtok]
    monkeypatch.setattr(bench_cross, "load_pair", lambda cache_dir: pair)
    out = tmp_path / "BENCH.md"
    out.write_text("# Benchmarks\n\nbefore\n")
    args = bench.parse(["--tiny", "--cross", "--prompts", "2", "--max_new_tokens", "6", "--gamma", "2"])
    for _ in range(2):
        bench.cross_section(out, tmp_path, args, ["--tiny", "--cross"])
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nbefore\n")
    assert text.count("## Cross-tokenizer pair in this run") == 1
    assert "| ours: cross-tokenizer g=2 |" in text and "2/2" in text
