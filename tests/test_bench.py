"""Smoke test of `python -m pipeline.bench` in --quick mode with tiny models."""

import csv

import pytest

from pipeline import bench
from tests.numerics import assert_logits_close


@pytest.mark.slow
def test_bench_quick_tiny_writes_report(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    rc = bench.main(["--tiny", "--out", str(out), "--cache_dir", str(tmp_path / "cache"), "--prompts", "2",
                     "--max_new_tokens", "12"])
    assert rc == 0  # every greedy output identical to the target alone
    text = out.read_text()
    for needle in ("ours: target alone", "HF greedy", "ours: model adaptive", "HF assisted g=4",
                   "HF prompt lookup g=4", "ours: ngram g=4", "v(5)", "Beam job vs bare engine loop",
                   "analytic bound", "torch 2."):
        assert needle in text, needle
    rows = list(csv.DictReader(open(tmp_path / "benchmarks" / "results.csv")))
    assert rows and all(r["equal"] == "True" for r in rows)
    assert {r["config"] for r in rows} >= {"ours: target alone", "HF assisted g=4", "ours: model adaptive"}


def test_synthetic_pair_early_exit_draft_shares_the_target_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    dirs = bench.build_synthetic_pair(bench.TINY_SYNTH, tmp_path)
    target = AutoModelForCausalLM.from_pretrained(dirs["target"])
    draft = AutoModelForCausalLM.from_pretrained(dirs["draft"])
    t, d = target.state_dict(), draft.state_dict()
    assert d.keys() < t.keys()
    assert all((t[k] == v).all() for k, v in d.items())
    prompts = bench.synthetic_prompts(bench.TINY_SYNTH, 4, 14)
    assert [k for k, _ in prompts] == ["repetitive", "random"] * 2


def test_prepared_model_keeps_greedy_exact(models, tokenizer):
    """oneDNN-prepacked linears (forced on for tiny layers) change neither logits beyond fp32
    rounding nor greedy output, for 1-row and multi-row passes alike."""
    import copy

    import torch

    from specdec_core.cpu_speed import PrepackedLinear, prepack_available, prepare_for_cpu
    from specdec_core.drafters import ModelDrafter, NoDrafter
    from specdec_core.engine import SpeculativeGenerator

    if not prepack_available():
        pytest.skip("oneDNN not available in this torch build")
    target, draft = models["llama"]
    fast = prepare_for_cpu(copy.deepcopy(target), min_weight=0, threshold_rows=2)
    assert any(isinstance(m, PrepackedLinear) for m in fast.modules())
    ids = torch.tensor([tokenizer("def add(a, b):\n    return").input_ids])
    with torch.inference_mode():
        assert_logits_close(fast(ids).logits, target(ids).logits)
    ref = target.generate(ids, do_sample=False, max_new_tokens=20)[0, ids.shape[1]:].tolist()
    for drafter in (NoDrafter(), ModelDrafter(draft)):
        out = SpeculativeGenerator(fast, drafter, num_speculative_tokens=4, max_new_tokens=20).generate(
            ids[0].tolist())
        assert out.tokens == ref
