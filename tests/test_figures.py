"""The figures a user reads, each against its definition: the report's distributions and comparisons, tune's
recommendation and its reason, the costs the adaptive policy reads, the quality shares."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.report.stats import Distribution, compare, run_stats, sections
from pipeline.tune import tuner as tune
from pipeline.tune.command import parse
from pipeline.tune.model import Candidate, SampleRun
from specdec_core.gamma import Costs
from tests.test_report import BASE, RUN, result_table

# --------------------------------------------------------------------------------------------
# pipeline.report


def test_distribution_is_p10_p50_p90_min_max_of_the_non_nan_values():
    d = Distribution.of(np.array([*range(101), np.nan], dtype=float))
    assert (d.n, d.mean, d.p10, d.p50, d.p90, d.min, d.max) == (101, 50.0, 10.0, 50.0, 90.0, 0.0, 100.0)
    assert d.text(".0f") == "mean 50, p10 10, p50 50, p90 90, min 0, max 100 over 101 items"


def test_an_item_as_fast_as_its_baseline_is_not_slower():
    run = result_table([dict(RUN[0], latency_s=0.3), *RUN[1:]])  # a: 0.3 s, as its baseline
    c = compare(run, result_table(BASE))
    assert c.slower_items == 1  # d only
    assert dict(sections(run_stats(run), c)[3][1])["items slower than the baseline"] == "1 of 4"


def test_report_rows_of_prompt_tokens_ttft_and_step_times():
    rows = [dict(r, ttft_s=t) for r, t in zip(RUN, [0.01, 0.02, 0.03, 0.04], strict=True)]
    run = result_table(rows)
    parts = dict(sections(run_stats(run), compare(run, result_table(BASE))))
    assert dict(parts["Run"])["prompt tokens"] == "37"
    assert dict(parts["Speed"])["time to first token"].startswith("mean 0.025 s, p10 0.013 s, p50 0.025 s, ")
    spec = dict(parts["Speculation"])
    assert spec["mean draft step"] == "1.00 ms" and spec["mean target verify pass"] == "20.00 ms"
    assert dict(parts["Against the baseline"])["baseline target step"] == "10.00 ms"


# --------------------------------------------------------------------------------------------
# pipeline.tune: the recommendation from stand-in measurements


def _row_setting(cand, gamma, batch, new, secs, policy="fixed", measured=None):
    run = SampleRun(new_tokens=new, total_s=secs, decode_s=secs, drafted=30 if cand.drafter != "none" else 0,
                    accepted=20, rejections=5, outputs=[[1]] * 4)
    return tune.Setting(cand, gamma, policy, batch, run=run, measured=measured)


def _fake_tune(monkeypatch, batched_draft_tps: float):
    alone = Candidate("target alone", "none")
    draft = Candidate("draft d", "model", "/m/d", costs=Costs(c=0.1, v={2: 1.1, 3: 1.2, 4: 1.3}), a=0.8)

    class FakeTuner:
        def __init__(self, args):
            self.args, self.candidates = args, [alone, draft]
            self.sampling, self.n, self.input_rows, self.skipped = SimpleNamespace(greedy=True), 4, 100, {}
            self.ids, self.target = [[1, 2], [3], [4], [5]], SimpleNamespace(device="cpu")
            self.engine, self.why_no_batch, self.batches = {"torch_compile": False}, None, [2]

        def measure_costs(self):
            pass

        def batch1(self):
            bases = [_row_setting(alone, 0, 1, 40, 4.0), _row_setting(alone, 0, 1, 40, 2.0)]  # 80 tokens in 6 s
            return bases, [_row_setting(draft, 2, 1, 40, 1.0, measured=2.5)]  # 40 tokens/s

        def throughput(self, chosen, reference):
            assert chosen.candidate is draft
            return [_row_setting(draft, 2, 2, 40, 40 / batched_draft_tps).row(3, reference),
                    _row_setting(alone, 0, 2, 40, 40 / 25).row(3, reference)]

    monkeypatch.setattr(tune, "Tuner", FakeTuner)
    return tune.tune(parse(["--input", "in.parquet", "--target_model", "/m/t", "--max_gamma", "3"]))


def test_tune_recommends_the_batch1_setting_when_no_batch_beats_it(monkeypatch):
    res = _fake_tune(monkeypatch, batched_draft_tps=30.0)
    rec = res["recommended"]
    assert (rec["drafter"], rec["num_speculative_tokens"], rec["batch_size"]) == ("model", 2, 1)
    assert rec["tokens_per_s"] == pytest.approx(40.0) and rec["speedup_batch1"] == 2.5
    assert res["runs"][0]["tokens_per_s"] == pytest.approx(80 / 6)  # both target-alone runs together
    assert res["job_estimate"]["seconds"] == pytest.approx(100 * 1.0 / 4)
    assert res["job_estimate"]["seconds_target_alone_batch1"] == pytest.approx(100 * 3.0 / 4)  # mean of its runs


def test_tune_recommends_a_faster_batch_and_says_why(monkeypatch):
    res = _fake_tune(monkeypatch, batched_draft_tps=100.0)
    rec = res["recommended"]
    assert (rec["drafter"], rec["batch_size"]) == ("model", 2) and "--batch_size 2" in rec["flags"]
    assert rec["speedup_batch1"] == 2.5  # the batch-1 run's, which the batched rows do not measure
    assert rec["reason"] == ("the fastest measured setting: 100.0 tokens/s per worker, against 13.3 for the target "
                             "alone at batch 1 and 25.0 at its best batch size (B=2)")


def test_the_reason_for_the_target_alone_names_a_tie_as_beating():
    alone1 = {"drafter": "none", "batch_size": 1, "tokens_per_s": 10.0, "candidate": "target alone"}
    alone4 = {**alone1, "batch_size": 4, "tokens_per_s": 30.0}
    alone8 = {**alone1, "batch_size": 8, "tokens_per_s": 20.0}
    spec = {"drafter": "model", "batch_size": 4, "tokens_per_s": 30.0, "candidate": "draft d"}
    slow = {**spec, "batch_size": 1, "tokens_per_s": 12.0}
    best = {**spec, "batch_size": 1}
    why = tune._reason(alone4, best, [slow, alone1, alone8, alone4, spec], alone1)
    assert why.startswith("the target alone batched (B=4, 30.0 tokens/s per worker) beats the best speculative "
                          "setting (draft d, B=4, 30.0 tokens/s)"), why
    only1 = tune._reason(slow, best, [slow, alone1], alone1)
    assert only1 == ("the fastest measured setting: 12.0 tokens/s per worker, against 10.0 for the target alone "
                     "at batch 1")


# --------------------------------------------------------------------------------------------
# specdec_core.gamma: the costs the adaptive policy reads


def test_costs_measure_takes_medians_over_three_reps_relative_to_the_step_just_before():
    # per rep: 1-token pass, 2-token pass, 1-token pass, draft step
    times = iter([2.0, 2.0, 1.0, 0.1,   1.0, 1.5, 1.0, 0.1,   1.0, 4.0, 1.0, 0.7])
    costs = Costs.measure(lambda k: next(times), lambda: next(times), ks=(2,), reps=3)
    assert costs.v == {2: pytest.approx(1.5)}  # ratios 1.0, 1.5, 4.0: their median, not their mean
    assert costs.c == pytest.approx(0.1) and costs.step_s == pytest.approx(1.0)


def test_costs_between_one_and_the_first_measured_block_and_past_the_last():
    assert Costs(c=0.0, v={3: 1.5}).verify(2) == pytest.approx(1.25)  # from v(1) = 1
    assert Costs(c=0.1, v={2: 1.2, 5: 1.8}).verify(7) == pytest.approx(1.8 * 1.1)  # +5% a token past the last
    assert Costs(c=0.1).verify(3) == 2.0  # nothing measured: the CPU default


def test_best_gamma_is_the_batch_rule_for_one_row_at_every_acceptance():
    from specdec_core.gamma import batch_gamma

    costs = Costs(c=0.1, v={2: 1.3, 3: 1.4, 4: 1.5, 5: 1.6, 6: 1.7, 7: 1.8, 8: 1.9, 9: 2.0})
    for a in np.arange(0.0, 1.0, 0.01):
        a = round(float(a), 3)
        assert costs.best_gamma(a, 8) == batch_gamma(costs, [a], 8), a


def test_latency_percentiles_are_p50_p95_p99():
    s = run_stats(result_table(RUN))
    want = np.percentile([0.10, 0.20, 0.15, 0.30], [50, 95, 99])
    assert (s.summary.latency_p50_s, s.summary.latency_p95_s, s.summary.latency_p99_s) == pytest.approx(tuple(want))
    assert dict(sections(s)[2][1])["latency p50 / p95 / p99"] == "0.175 s / 0.285 s / 0.297 s"


def test_batch_sizes_up_to_the_sample_size_are_measured(monkeypatch, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2, 3, 4], "prompt": ["a", "b", "c", "d"]}), tmp_path / "p.parquet")
    text = SimpleNamespace(engine=SimpleNamespace(target=SimpleNamespace(device="cpu")), encode=lambda s: [ord(s)])
    monkeypatch.setattr(tune, "load", lambda args: (text, {}, [Candidate("target alone", "none")]))
    monkeypatch.setattr(tune, "pad_id_of", lambda target: 0)
    monkeypatch.setattr(tune, "batch_refusal", lambda target, pad: None)
    monkeypatch.setattr(tune, "engine_options", lambda args, device: {})
    t = tune.Tuner(parse(["--input", str(tmp_path / "p.parquet"), "--target_model", "/m/t", "--sample", "4",
                          "--batch_sizes", "1,2,4,8"]))
    assert t.n == 4 and t.batches == [2, 4]  # B = the sample: one full batch


def test_batch1_tries_adaptive_with_the_fastest_draft_and_floors_the_overhead_at_zero():
    alone = Candidate("target alone", "none")
    fast = Candidate("draft fast", "model", "/m/f", costs=Costs(c=0.1, v={k: 1.2 for k in range(2, 6)}))
    slow = Candidate("draft slow", "model", "/m/s", costs=Costs(c=0.1, v={k: 1.2 for k in range(2, 6)}))
    t = tune.Tuner.__new__(tune.Tuner)
    t.args = parse(["--input", "x", "--target_model", "/m/t", "--max_gamma", "4", "--verify", "0"])
    t.candidates, t.alone, t.g0, t.per_run = [alone, fast, slow], alone, 3, 10
    t.sampling, t.progress = SimpleNamespace(greedy=True), tune.Progress(100)
    phases = []

    def phase(settings):
        phases.append(settings)
        for x in settings:  # 3 drafting rounds in 0.001 s: faster than their passes, a negative fit
            x.run = SampleRun(new_tokens=12, total_s=0.01, decode_s=0.001, accepted=8, rejections=2,
                              drafts_per_round=[3, 3, 3])
            x.measured = {"draft fast": 1.6, "draft slow": 1.2}.get(x.candidate.name, 1.0)
        return 0.01

    t.phase = phase
    _, runs = t.batch1()
    assert fast.overhead == slow.overhead == 0.0
    (adaptive,) = [x for x in runs if x.policy == "adaptive"]
    assert adaptive.candidate is fast and adaptive.gamma == 4


def test_admission_passes_are_rounded_where_a_shared_pass_lost_rows():
    # three rows entered in one prefill pass, two of them are in the results: 2/3 of a pass, said as 1
    admits = dict(admit_s=0.02, admitted_with=3, admit_passes=1)
    a = run_stats(result_table([{**r, **admits} for r in RUN[:2]])).admissions
    assert (a.rows, a.passes) == (2, 1)


def test_the_recommended_ngram_flags_keep_non_default_sizes_and_batch_sizes_are_distinct_and_sorted():
    from pipeline.tune.command import run_argv

    args = parse(["--input", "x", "--target_model", "/m/t", "--ngram_min_size", "2", "--batch_sizes", "8,2,2,4"])
    argv = run_argv(args, "ngram", None, 3, "fixed", 4)
    assert argv[argv.index("--ngram_min_size") + 1] == "2" and argv[argv.index("--ngram_max_size") + 1] == "3"
    assert args.batch_sizes == [2, 4, 8]


# --------------------------------------------------------------------------------------------
# pipeline.quality


def test_an_output_half_repeating_itself_is_degenerate_at_the_threshold():
    from pipeline.quality import is_degenerate, looping_share, repeated_ngram_share, score_generations

    words, chars = "one two one two one two", "ctctctctxyzwvuqr"
    assert repeated_ngram_share(words) == 0.5 and looping_share(words) == 0.0
    assert looping_share(chars) == 0.5 and repeated_ngram_share(chars) == 0.0
    assert is_degenerate(words) and is_degenerate(chars)
    assert score_generations([words, chars, "Return the value of x."])["degenerate_share"] == pytest.approx(2 / 3)


def test_quality_shares_and_references_left_out():
    import pyarrow as pa

    from pipeline.quality import looping_share, repeated_ngram_share, rouge_unread_share, score_generations

    assert looping_share("hahaha, he said to them") == 0.0  # a piece three times: not yet a loop
    assert repeated_ngram_share("a b c a b c") == pytest.approx(0.25)  # abc, bca, cab, abc
    q = score_generations(["one two one two one two", "Return the value of x."], ["nothing alike", None])
    assert q["repeated_3gram_share"] == pytest.approx(0.25)  # the mean over outputs: 0.5 and 0
    assert q["rouge1"] == 0.0
    q = score_generations(["Return x.", "Open it."], ["Return x.", None])
    assert q["rouge1"] == pytest.approx(1.0)  # the row with a null reference is left out, not scored as 0
    assert rouge_unread_share(pa.array(["abc", "\u0661\u0662\u0663"])) == pytest.approx(0.5)  # Arabic-Indic digits


def test_a_missing_generation_is_not_identical_to_its_baseline():
    c = compare(result_table([dict(RUN[0], generation=None), *RUN[1:]]), result_table(BASE))
    assert c.identical == 2 and c.first_differences == ["a", "c"]


def test_new_tokens_per_item():
    d = run_stats(result_table(RUN)).new_tokens_items
    assert (d.mean, d.min, d.max) == (7.0, 4.0, 10.0)
