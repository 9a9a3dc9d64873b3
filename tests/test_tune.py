"""`pipeline.tune`: the prediction arithmetic on hand-made costs, and the CLI end to end on tiny
models (no timing assertions: which setting wins on a shared machine is not a test's business,
except where the outcome is forced, as with a draft that never agrees)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.bench.pairs import TINY_SYNTH, build_synthetic_pair, synthetic_prompts
from pipeline.flags import check_pipeline_flags
from pipeline.tune import tuner as tune
from pipeline.tune.model import (
    PAY_MARGIN,
    Candidate,
    SampleRun,
    best_setting,
    fit_overhead,
    pick_to_verify,
    predict,
    relative_error,
)
from specdec_core.gamma import Costs, expected_tokens
from tests.tiny_models import not_utf8

DOCS_TUNE = Path(__file__).resolve().parents[1] / "docs" / "tune.md"

# --------------------------------------------------------------------------------------------
# Arithmetic


def test_predict_is_the_papers_formula_with_measured_costs():
    costs = Costs(c=0.1, v={2: 1.2, 3: 1.3, 4: 1.5, 5: 1.6})
    # E(0.8, 3) = (1 - 0.8^4) / 0.2 = 2.952; cost 3 * 0.1 + v(4) = 1.8
    assert predict(costs, 0.8, 3) == pytest.approx(2.952 / 1.8)
    assert predict(costs, 0.8, 3) == pytest.approx(costs.speedup(0.8, 3))
    # The paper's own setting (v = 1): (1 - a^(g+1)) / ((1 - a)(g c + 1)).
    paper = Costs(c=0.05, v={k: 1.0 for k in range(2, 10)})
    assert predict(paper, 0.7, 4) == pytest.approx((1 - 0.7**5) / (0.3 * (4 * 0.05 + 1)))
    assert predict(costs, 0.8, 0) == 1.0


def test_predict_with_coverage_and_overhead():
    costs = Costs(c=0.0, v={2: 1.5, 3: 1.5})
    # Half the rounds draft (2 tokens each): (0.5 E + 0.5) / (0.5 (v(3) + o) + 0.5).
    e = expected_tokens(0.5, 2)  # 1.75
    assert predict(costs, 0.5, 2, coverage=0.5, overhead=0.25) == pytest.approx((0.5 * e + 0.5) / (0.5 * 1.75 + 0.5))
    # No drafting rounds at all: the target alone.
    assert predict(costs, 0.9, 2, coverage=0.0, overhead=3.0) == pytest.approx(1.0)


def test_fit_overhead_recovers_the_per_round_cost():
    costs = Costs(c=0.2, v={5: 1.6})
    base = 0.01  # s per target step
    o = 0.3
    rounds = [4, 4, 4, 0]  # three drafting rounds, one plain step
    decode_s = base * (3 * (4 * 0.2 + 1.6 + o) + 1)
    assert fit_overhead(costs, rounds, decode_s, base) == pytest.approx(o)
    assert fit_overhead(costs, [0, 0], 1.0, base) == 0.0  # nothing drafted: nothing to fit


def test_sample_run_acceptance_and_coverage():
    run = SampleRun(new_tokens=10, total_s=2.0, decode_s=1.0, accepted=6, rejections=2, drafts_per_round=[3, 0, 3, 2])
    assert run.acceptance == pytest.approx(0.75)  # geometric: 6 / (6 + 2)
    assert run.coverage == pytest.approx(0.75)
    assert run.tokens_per_s == pytest.approx(5.0)


def test_verify_picks_the_best_unmeasured_settings_that_pay():
    costs = Costs(c=0.1, v={k: 1.2 for k in range(2, 6)})
    good = Candidate("good", "model", "g", costs=costs, a=0.9)
    bad = Candidate("bad", "model", "b", costs=costs, a=0.05)
    picked = pick_to_verify([Candidate("target alone", "none"), good, bad], 4, {("good", 4)}, 2)
    assert [c.name for c, _ in picked] == ["good", "good"]
    gammas = [g for _, g in picked]
    assert 4 not in gammas  # already measured
    expect = sorted(range(1, 4), key=lambda g: -predict(costs, 0.9, g))[:2]
    assert gammas == expect
    assert pick_to_verify([bad], 4, set(), 3) == []  # predicted not to pay: not run


def test_best_setting_needs_a_margin_over_the_target_alone():
    alone = {"drafter": "none", "measured": 1.0}
    barely = {"drafter": "model", "measured": PAY_MARGIN - 0.01}
    clear = {"drafter": "model", "measured": 1.5}
    assert best_setting([alone, barely], "measured") is alone
    assert best_setting([alone, barely, clear], "measured") is clear
    idle = {"drafter": "ngram", "measured": 2.6, "drafted_tokens": 0}  # proposed nothing: noise, not a speed-up
    assert best_setting([alone, idle], "measured") is alone
    assert best_setting([alone, idle, {**clear, "drafted_tokens": 12}], "measured")["measured"] == 1.5
    assert relative_error(1.1, 1.0) == pytest.approx(0.1)


# --------------------------------------------------------------------------------------------
# The command line


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tune")
    dirs = build_synthetic_pair(TINY_SYNTH, root / "cache")
    prompts = [text for _, text in synthetic_prompts(TINY_SYNTH, 10, 16)]
    # two unusable rows: an empty prompt, and one that is not valid UTF-8
    table = pa.table({"id": list(range(12)), "prompt": not_utf8([*prompts[:2], b"\xff", prompts[2], "", *prompts[3:]])})
    pq.write_table(table, root / "prompts.parquet")
    return {**dirs, "input": root / "prompts.parquet", "root": root}


def _args(tiny, *extra: str) -> list[str]:
    return ["--input", str(tiny["input"]), "--target_model", str(tiny["target"]), "--sample", "4",
            "--max_new_tokens", "8", "--max_gamma", "3", "--verify", "1", "--batch_sizes", "1,2", *extra]


def test_cli_end_to_end_with_two_drafts(tiny, capsys):
    out = tiny["root"] / "tune.json"
    assert tune.main(_args(tiny, "--draft_model", str(tiny["draft"]), "--draft_model", str(tiny["bad_draft"]),
                           "--output_json", str(out))) == 0
    printed = capsys.readouterr().out
    assert "python -m pipeline.run" in printed and "draft bad_draft" in printed
    assert "4 prompts of the input (mean " in printed
    assert "; 2 unusable rows skipped: InvalidUtf8 x1, EmptyPrompt x1)" in printed
    res = json.loads(out.read_text())
    assert set(res) >= {"settings", "sample", "candidates", "runs", "throughput", "recommended", "job_estimate",
                        "prediction_error"}
    rec = res["recommended"]
    assert set(rec) >= {"drafter", "draft_model", "num_speculative_tokens", "gamma_policy", "batch_size", "flags"}
    assert rec["drafter"] in ("model", "ngram", "none")
    assert rec["draft_model"] != str(tiny["bad_draft"])  # it never agrees: never worth it
    assert (rec["num_speculative_tokens"] is None) == (rec["drafter"] == "none")
    assert rec["batch_size"] in (1, 2)
    # The flags are pipeline.run's own, and valid for it.
    flags = rec["flags"].split()[3:]
    check_pipeline_flags(flags)
    assert flags[flags.index("--batch_size") + 1] == str(rec["batch_size"])
    # The sample: the first 4 usable rows (the unusable ones are skipped), 12 rows in the input.
    assert res["sample"] == {**res["sample"], "prompts": 4, "input_rows": 12,
                             "skipped": {"InvalidUtf8": 1, "EmptyPrompt": 1}}
    names = {c["name"]: c for c in res["candidates"]}
    assert set(names) == {"draft draft", "draft bad_draft", "n-gram lookup"}
    assert names["draft bad_draft"]["a"] < names["draft draft"]["a"]
    assert all(len(c["predictions"]) == 3 for c in names.values())
    # Every candidate ran at gamma 3 (its first run) next to the target alone; greedy output is
    # the target's own, whatever the drafter.
    runs = res["runs"]
    assert runs[0]["candidate"] == "target alone" and runs[0]["measured"] == 1.0
    assert {r["candidate"] for r in runs} >= set(names)
    assert all(r["equal_to_target"] == 4 for r in runs), [(r["candidate"], r["equal_to_target"]) for r in runs]
    assert all(r["measured"] > 0 for r in runs)
    assert {r["batch_size"] for r in res["throughput"]} == {1, 2}
    # At B=2: the target alone, and the chosen draft at its batch-1 setting and at fixed gammas 2 and 1.
    at1 = [(r["gamma"], r["gamma_policy"]) for r in res["throughput"]
           if r["batch_size"] == 1 and r["drafter"] != "none"]
    at2 = [(r["drafter"], r["gamma"], r["gamma_policy"]) for r in res["throughput"] if r["batch_size"] == 2]
    assert ("none", None, "fixed") in at2
    if at1:
        drafted = {(g, p) for d, g, p in at2 if d != "none"}
        assert drafted == {*at1, (2, "fixed"), (1, "fixed")} and len(at2) == len(drafted) + 1, at2
    assert res["job_estimate"]["rows"] == 12 and res["job_estimate"]["seconds"] > 0
    # On a CPU nothing is compiled (the job's --torch_compile auto compiles where passes are CUDA graphs).
    assert res["settings"]["cuda_graphs"] == "auto" and res["settings"]["compiled"] is False
    assert "compiled" not in printed
    # docs/tune.md names every key of the file, and no key it does not have
    table = DOCS_TUNE.read_text().split("## `--output_json`")[1].split("\n## ")[0]
    documented = {}
    for line in table.splitlines()[4:]:
        if line.startswith("| `"):
            key, text = line.split(" | ")[0][3:-1], line.split(" | ")[1]
            documented[key] = set(re.findall(r"`([a-z_0-9]+)`", text)) - {"pipeline", "run"}
    assert set(documented) == set(res), set(documented) ^ set(res)
    documented["throughput"] = documented["throughput"] or documented["runs"]  # ("the same rows")
    for key, nested in (("settings", res["settings"]), ("sample", res["sample"]), ("runs", runs[0]),
                        ("throughput", runs[0]), ("candidates", res["candidates"][0] | res["candidates"][0][
                            "predictions"][0]), ("prediction_error", res["prediction_error"][0]),
                        ("recommended", rec), ("job_estimate", res["job_estimate"])):
        assert documented[key] == set(nested), (key, documented[key] ^ set(nested))


def test_a_draft_that_cannot_pay_is_recommended_against(tiny, capsys):
    out = tiny["root"] / "bad.json"
    assert tune.main(_args(tiny, "--draft_model", str(tiny["bad_draft"]), "--no_ngram",
                           "--batch_sizes", "1", "--output_json", str(out))) == 0
    res = json.loads(out.read_text())
    (cand,) = res["candidates"]
    assert cand["a"] < 0.2  # a random draft: its argmax is the target's about 1 time in the vocabulary size
    rec = res["recommended"]
    assert rec["drafter"] == "none" and rec["draft_model"] is None and rec["num_speculative_tokens"] is None
    assert "--drafter none" in rec["flags"] and "--num_speculative_tokens" not in rec["flags"]
    assert "no candidate drafter beat the target alone" in rec["reason"]


def test_encoder_decoder_targets_tune_batch_sizes_too(saved_pairs, tmp_path, capsys):
    target, draft = saved_pairs["t5"]
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "prompt": ["The quick brown fox", "Hello world!", "def add(a, b):"]}),
                   path)
    out = tmp_path / "t5.json"
    assert tune.main(["--input", str(path), "--target_model", str(target), "--draft_model", str(draft),
                      "--sample", "3", "--max_new_tokens", "6", "--max_gamma", "2", "--verify", "0",
                      "--batch_sizes", "1,2", "--output_json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["batching"] is None
    assert {r["batch_size"] for r in res["throughput"]} == {1, 2}
    assert res["recommended"]["batch_size"] in (1, 2)


@pytest.mark.parametrize("extra, culprit", [
    (["--sample", "0"], "--sample"),
    (["--batch_sizes", "1,x"], "--batch_sizes"),
    (["--batch_sizes", ""], "--batch_sizes '': expected comma-separated integers"),
    (["--max_gamma", "0"], "--max_gamma"),
    (["--sampel", "3"], "--sampel"),
    (["--temperature", "-1"], "--temperature"),
    (["--prompt_column", "text"], "--prompt_column"),
    (["--draft_model", "/nonexistent/draft"], "--draft_model"),
    (["--torch_compile", "on", "--cuda_graphs", "off"], "--torch_compile"),
    (["--cuda_graphs", "sometimes"], "--cuda_graphs"),
    (["--ngram_max_size", "0"], "--ngram_max_size"),
    (["--output_json", "{input}/tune.json"], "--output_json"),  # (written after all the measuring)
    (["--output_json", "{input}"], "a Parquet file's name"),  # (the job's own input, written over)
    (["--output_json", ""], "--output_json '': names no file"),
    (["--output_json", "-"], "--output_json '-': this writes a file, not standard output"),
    (["--draft_model", ""], "--draft_model '': names no draft"),  # (measured as no draft, then a traceback)
    (["--output_json", "gs://"], "--output_json 'gs://': not a Cloud Storage path"),  # (a traceback after the work)
])
def test_bad_settings_are_one_line_errors(tiny, capsys, extra, culprit):
    extra = [e.format(input=tiny["input"]) for e in extra]  # (a file: no directory can be made there)
    try:
        code = tune.main(_args(tiny, *extra))
    except SystemExit as e:
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and culprit in err[0], err


def test_the_recommended_command_keeps_the_sampling_flags_as_given():
    """The job runs with the values tune measured (`:g` kept 6 digits: 0.123456789 ran as 0.123457)."""
    from pipeline.tune.command import parse, run_argv

    args = parse(["--input", "p.parquet", "--target_model", "t", "--temperature", "0.123456789", "--top_p",
                  "0.9999999", "--top_k", "40"])
    argv = run_argv(args, "none", None, 1, "auto", 1)
    got = {flag: argv[argv.index(flag) + 1] for flag in ("--temperature", "--top_p", "--top_k")}
    assert got == {"--temperature": "0.123456789", "--top_p": "0.9999999", "--top_k": "40"}
    # a draft's dtype goes with a model draft only (the job warns of it with another drafter: no effect)
    args = parse(["--input", "p.parquet", "--target_model", "t", "--draft_model", "d", "--draft_dtype", "int8"])
    drafters = (("model", "d"), ("ngram", None), ("none", None))
    assert [("--draft_dtype" in run_argv(args, d, m, 3, "fixed", 1)) for d, m in drafters] == [True, False, False]


def test_bad_input_is_a_one_line_error(tiny, tmp_path, capsys):
    assert tune.main(["--input", str(tmp_path / "none-*.parquet"), "--target_model", str(tiny["target"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matches no files" in err[0]


def test_the_sample_measures_distinct_prompts(tmp_path):
    """A prompt already in the sample is skipped, whatever its id (the same row twice, or the same
    prompt under another id): it measured nothing new and weighted one prompt twice."""
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": ["a", "a", "a", "b", "c", "d", "e"],
                             "prompt": ["x y", "x y", "x y", "x y", "z w", "", "q"]}), path)

    def encode(value):
        if not value:
            raise tune.PromptError("empty")
        return [ord(c) for c in value]

    ids, rows, skipped = tune.read_sample(str(path), "prompt", 3, encode)
    assert [bytes(x).decode() for x in ids] == ["x y", "z w", "q"] and rows == 7
    assert skipped == {"DuplicatePrompt": 3, "PromptError": 1}


def test_batched_times_leave_out_graph_captures(monkeypatch):
    """A batched setting's time leaves out what its engine spent capturing graphs (on a GPU, at
    its first rounds): a job's worker pays that once, not per sample. A stand-in engine and clock."""
    from types import SimpleNamespace

    clock = [100.0]
    kv = SimpleNamespace(passes=SimpleNamespace(capture_s=1.0))

    class Engine:
        def __init__(self, *args, **kwargs):
            self.slots = {1: kv, 2: None}

        def generate_many(self, items):
            clock[0] += 10.0
            kv.passes.capture_s += 4.0  # captured while decoding
            stats = SimpleNamespace(draft_tokens=0, accepted_tokens=0, rejections=0)
            return [SimpleNamespace(tokens=[1, 2, 3], stats=stats) for _ in items]

    monkeypatch.setattr(tune, "BatchSpeculativeGenerator", Engine)
    monkeypatch.setattr(tune.time, "perf_counter", lambda: clock[0])
    run = tune.run_batched(None, None, [[5], [6]], 3, 2, SimpleNamespace(max_new_tokens=3), None)
    assert (run.total_s, run.decode_s, run.new_tokens) == (6.0, 6.0, 6)


def test_batched_adaptive_is_timed_as_a_warm_worker_runs_it(monkeypatch):
    """Batched, the adaptive policy runs as the job builds it (no batch-1 costs: the engine times its own at its
    width) and is timed after the first 2B prompts (two waves) on the same engine, off the clock, as a job's
    worker runs its later batches. A stand-in engine and clock."""
    from types import SimpleNamespace

    from specdec_core.gamma import AdaptiveGamma

    clock, calls = [100.0], []

    class Engine:
        def __init__(self, *args, gamma_policy=None, **kwargs):
            self.slots, self.policy = {}, gamma_policy

        def generate_many(self, items):
            calls.append((self, len(items), getattr(self.policy, "costs", None)))
            clock[0] += 5.0 * len(items)
            stats = SimpleNamespace(draft_tokens=0, accepted_tokens=0, rejections=0)
            return [SimpleNamespace(tokens=[1, 2, 3], stats=stats) for _ in items]

    monkeypatch.setattr(tune, "BatchSpeculativeGenerator", Engine)
    monkeypatch.setattr(tune.time, "perf_counter", lambda: clock[0])
    cand = SimpleNamespace(costs=Costs(c=0.1))
    assert tune.Tuner.policy_of(tune.Setting(cand, 4, "adaptive")).costs is cand.costs  # batch 1: its costs
    policy = tune.Tuner.policy_of(tune.Setting(cand, 4, "adaptive", batch_size=2))
    assert isinstance(policy, AdaptiveGamma) and policy.costs is None
    ids = [[5], [6], [7], [8], [9]]
    run = tune.run_batched(None, None, ids, 4, 2, SimpleNamespace(max_new_tokens=3), None, policy)
    (warm, *wave), (timed, *call) = calls
    assert timed is warm and wave == [4, None] and call == [5, None] and run.total_s == 25.0
    calls.clear()
    tune.run_batched(None, None, [[5], [6], [7]], 4, 2, SimpleNamespace(max_new_tokens=3), None, None)
    assert [c[1] for c in calls] == [3]  # a fixed gamma: no wave first


def test_the_progress_plan_counts_an_adaptive_engines_warm_up(monkeypatch):
    """Its first waves are work done (off the clock, not out of the plan): the ETA counts them before and after."""
    from types import SimpleNamespace

    t = tune.Tuner.__new__(tune.Tuner)  # (only the sample's size and the tokens per prompt)
    t.n, t.args = 5, SimpleNamespace(max_new_tokens=3)
    cand = SimpleNamespace(costs=Costs(c=0.1))
    assert t.warm_tokens(tune.Setting(cand, 4, "adaptive", batch_size=2)) == 2 * 2 * 3
    assert t.warm_tokens(tune.Setting(cand, 4, "adaptive", batch_size=4)) == 5 * 3  # at most the sample
    assert t.warm_tokens(tune.Setting(cand, 4, "fixed", batch_size=2)) == 0
    # A batched run counts its warm-up as done (a stand-in run of 15 tokens after the warm-up's 12).
    monkeypatch.setattr(tune, "run_batched", lambda *args: tune.SampleRun(new_tokens=15, total_s=1.0, decode_s=1.0))
    t.target, t.ids, t.sampling, t.engine, t.progress = None, [], None, None, tune.Progress(27)
    t.batched(tune.Setting(SimpleNamespace(costs=Costs(c=0.1), drafter="none", name="target alone"), 4, "adaptive",
                           batch_size=2))
    assert t.progress.done == t.progress.planned == 27


@pytest.mark.slow
@pytest.mark.dynamo  # the flags reaching every engine: compiles through dynamo alone (conftest)
def test_tune_runs_the_passes_as_the_job_would(tiny, monkeypatch, capsys):
    """The job's --cuda_graphs and --torch_compile reach every engine and draft tune builds (here
    static caches compiled on the CPU, as `--cuda_graphs on` allows), and its recommendation
    carries them; greedy outputs stay the target's own."""
    seen = []
    for name in ("SpeculativeGenerator", "BatchSpeculativeGenerator"):
        real = getattr(tune, name)

        def spy(*args, real=real, **kwargs):
            seen.append((real.__name__, kwargs.get("cuda_graphs"), kwargs.get("torch_compile")))
            return real(*args, **kwargs)

        monkeypatch.setattr(tune, name, spy)
    out = tiny["root"] / "compiled.json"
    assert tune.main(["--input", str(tiny["input"]), "--target_model", str(tiny["target"]), "--draft_model",
                      str(tiny["draft"]), "--no_ngram", "--sample", "2", "--max_new_tokens", "4", "--max_gamma", "1",
                      "--verify", "0", "--batch_sizes", "2", "--cuda_graphs", "on", "--torch_compile",
                      "--output_json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert {name for name, _, _ in seen} == {"SpeculativeGenerator", "BatchSpeculativeGenerator"}
    assert all(mode == "on" and compiled is True for _, mode, compiled in seen), seen
    assert res["settings"]["cuda_graphs"] == "on" and res["settings"]["compiled"] is True
    assert all(r["equal_to_target"] == 2 for r in res["runs"])
    flags = res["recommended"]["flags"].split()[3:]
    check_pipeline_flags(flags)
    assert flags[flags.index("--cuda_graphs") + 1] == "on" and flags[flags.index("--torch_compile") + 1] == "on"
    assert "The passes were compiled (torch.compile)" in capsys.readouterr().out


def test_batch_one_times_leave_out_graph_captures_and_compiles():
    """A batch-1 item's one-off work (captures and compiles on its first passes of each width) is
    left out of tune's times: out of the prefill's share and the decode's each."""
    from types import SimpleNamespace

    from specdec_core.rows import ItemStats

    run = tune.SampleRun(new_tokens=0, total_s=0.0, decode_s=0.0)
    stats = ItemStats(new_tokens=5, latency_s=10.0, prefill_s=3.0, setup_s=4.0, prefill_setup_s=1.0)
    tune._add(run, SimpleNamespace(stats=stats, tokens=[1] * 5))
    assert (run.total_s, run.decode_s, run.new_tokens) == (6.0, 4.0, 5)


def test_models_the_self_checks_refuse_are_said_not_crashed_on(tmp_path, capsys):
    """A target whose multi-token passes are not its one-token ones (FSMT) cannot be verified:
    tune stops in one line. One whose rows in a padded batch get other logits (MPT's ALiBi comes from
    the mask) is measured at batch 1 only, saying why."""
    from tests.family_models import save_family

    src = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": [1, 2], "prompt": ["hello there", "the quick brown fox"]}), src)
    fsmt, mpt = save_family("fsmt", tmp_path / "fsmt"), save_family("mpt", tmp_path / "mpt")
    capsys.readouterr()
    assert tune.main(["--input", str(src), "--target_model", str(fsmt), "--sample", "2", "--max_new_tokens", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "over several tokens in one pass" in err[0] and "--drafter none" in err[0], err
    out = tmp_path / "mpt.json"
    assert tune.main(["--input", str(src), "--target_model", str(mpt), "--sample", "2", "--max_new_tokens", "4",
                      "--max_gamma", "2", "--verify", "0", "--batch_sizes", "2", "--output_json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert "other logits in a padded batch" in res["batching"], res["batching"]
    assert {r["batch_size"] for r in res["throughput"]} == {1}


def test_the_target_alone_on_one_prompt_is_said_plainly(tiny, capsys, monkeypatch, tmp_path):
    """No drafter to tune and a sample of one prompt: no empty "target v(k) =" line, and the
    batching line says why nothing was batched (it read "no size in 2..1"). `--output_json=~/x`
    (no shell to expand it) is written to $HOME/x, the file it was checked as (not ./~/x)."""
    monkeypatch.setenv("HOME", str(tiny["root"]))
    monkeypatch.chdir(tmp_path)
    out = tiny["root"] / "alone.json"
    assert tune.main(["--input", str(tiny["input"]), "--target_model", str(tiny["target"]), "--no_ngram",
                      "--sample", "1", "--max_new_tokens", "4", "--verify", "0", "--output_json=~/alone.json"]) == 0
    assert not (tmp_path / "~").exists()
    printed = capsys.readouterr().out
    assert "target v(k) = not measured (no drafter to verify)" in printed
    assert json.loads(out.read_text())["batching"] == "a sample of one prompt batches nothing"


def test_an_int8_draft_is_measured_and_recommended_at_batch_size_1_only(tiny, capsys):
    """pipeline.run refuses `--draft_dtype int8` with `--batch_size` above 1 for a draft of the target's tokenizer:
    tune measured it batched, and could recommend a command the job refuses."""
    out = tiny["root"] / "int8.json"
    assert tune.main(_args(tiny, "--draft_model", str(tiny["draft"]), "--no_ngram", "--draft_dtype", "int8",
                           "--output_json", str(out))) == 0
    res = json.loads(out.read_text())
    assert {r["batch_size"] for r in res["throughput"]} == {1} and res["recommended"]["batch_size"] == 1
    assert res["batching"] == ("the draft is int8 (--draft_dtype int8: dynamic quantization scales a pass's rows "
                               "together): pipeline.run decodes it at --batch_size 1 only")
