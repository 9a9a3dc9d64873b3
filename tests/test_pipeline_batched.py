"""End-to-end jobs with --batch_size > 1: same outputs as batch 1, bad rows still fail alone."""

import pytest

from pipeline.run import main
from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.slot_kv import SlotKV
from tests.test_pipeline import BAD, GOOD, greedy_reference, run_job, write_prompts


@pytest.mark.parametrize("graphs", ["auto", "on"])  # on a CPU: a padded cache, or fixed slots (eagerly)
def test_batched_job_equals_target_generate_and_fails_bad_rows_alone(tmp_path, saved_pairs, monkeypatch, graphs):
    target, draft = saved_pairs["llama"]
    lists = []  # the batched engine really ran (in this process: Beam's in-process runner)
    generate_many = BatchSpeculativeGenerator.generate_many

    def spy(self, items, *args, **kwargs):
        lists.append(len(items))
        assert isinstance(self.slots[id(self.target)], SlotKV) == (graphs == "on")
        return generate_many(self, items, *args, **kwargs)
    monkeypatch.setattr(BatchSpeculativeGenerator, "generate_many", spy)
    rows = [{"id": f"g{i}", "prompt": p, "topic": "t"} for i, p in enumerate(GOOD)]
    rows.insert(2, {"id": "empty", "prompt": BAD["empty"], "topic": "t"})
    rows.insert(4, {"id": "long", "prompt": BAD["long"], "topic": "t"})
    src = write_prompts(tmp_path / "p.parquet", rows)
    results, failed = run_job(tmp_path, target, draft, "--batch_size", "3", "--passthrough_columns", "topic",
                              "--cuda_graphs", graphs, prompts=src)
    assert sorted(results["id"].to_pylist()) == sorted(f"g{i}" for i in range(len(GOOD)))
    got = dict(zip(results["id"].to_pylist(), results["generation"].to_pylist(), strict=True))
    for i, prompt in enumerate(GOOD):
        assert got[f"g{i}"] == greedy_reference(target, prompt, 12), prompt
    reasons = dict(zip(failed["id"].to_pylist(), failed["error_type"].to_pylist(), strict=True))
    assert reasons == {"empty": "EmptyPrompt", "long": "PromptTooLong"}
    assert all(failed["error_message"].to_pylist())
    assert set(results["topic"].to_pylist()) == {"t"}
    assert min(results["verify_steps"].to_pylist()) >= 1
    assert sum(lists) == len(GOOD) and max(lists) > 1, lists


def test_a_row_that_makes_its_batched_call_raise_fails_alone(tmp_path, saved_pairs, monkeypatch):
    """A batched call that raises is decoded again in halves: the row that raises alone fails with
    its error, a bad prompt beside it keeps its own reason, the others are generated as alone
    (they all failed under the one error before)."""
    target, draft = saved_pairs["llama"]
    from transformers import AutoTokenizer

    generate_many = BatchSpeculativeGenerator.generate_many
    poison = AutoTokenizer.from_pretrained(target)(GOOD[1])["input_ids"]  # (as a row that runs out of memory)

    def raising(self, items, *args, **kwargs):
        if any(ids == poison for ids, _ in items):
            raise RuntimeError("CUDA out of memory (a stand-in)")
        return generate_many(self, items, *args, **kwargs)
    monkeypatch.setattr(BatchSpeculativeGenerator, "generate_many", raising)
    rows = [{"id": f"g{i}", "prompt": p} for i, p in enumerate(GOOD)]
    rows.insert(1, {"id": "empty", "prompt": BAD["empty"]})
    src = write_prompts(tmp_path / "p.parquet", rows)
    results, failed = run_job(tmp_path, target, draft, "--batch_size", "4", prompts=src)
    got = dict(zip(results["id"].to_pylist(), results["generation"].to_pylist(), strict=True))
    assert got == {f"g{i}": greedy_reference(target, p, 12) for i, p in enumerate(GOOD) if i != 1}
    reasons = {r["id"]: (r["error_type"], r["error_message"]) for r in failed.to_pylist()}
    assert reasons == {"g1": ("RuntimeError", "CUDA out of memory (a stand-in)"),
                       "empty": ("EmptyPrompt", reasons["empty"][1])}


def test_batched_sampling_equals_batch_one_sampling(tmp_path, saved_pairs):
    target, draft = saved_pairs["llama"]
    sample = ["--temperature", "1.0", "--top_k", "50"]
    a, _ = run_job(tmp_path, target, draft, *sample, name="one")
    b, _ = run_job(tmp_path, target, draft, *sample, "--batch_size", "4", name="four")

    def gens(t):
        return dict(zip(t["id"].to_pylist(), t["generation"].to_pylist(), strict=True))

    assert gens(a) == gens(b)


@pytest.mark.parametrize(("args", "needle"), [(["--batch_size", "0"], "--batch_size must be >= 1")])
def test_bad_batch_settings_stop_before_any_work(tmp_path, saved_pairs, capsys, args, needle):
    target, draft = saved_pairs["bart"]
    src = write_prompts(tmp_path / "p.parquet", [{"id": "1", "prompt": "hi"}])
    capsys.readouterr()
    assert main(["--input", src, "--output", str(tmp_path / "out/gens"), "--target_model", str(target),
                 "--draft_model", str(draft)] + args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and "\n" not in err, err
    assert not (tmp_path / "out").exists()
