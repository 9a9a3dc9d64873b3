"""`pipeline.bench.throughput` on tiny models: it writes its section and our outputs match HF's."""

from types import SimpleNamespace

import pytest

from pipeline.bench import throughput as bench_throughput
from specdec_core.drafters import ModelDrafter


def test_throughput_section_is_written_and_replaced(tmp_path):
    out = tmp_path / "BENCH.md"
    out.write_text("# Report\n\nearlier text\n")
    args = ["--size", "tiny", "--cache_dir", str(tmp_path / "cache"), "--out", str(out), "--prompts", "4",
            "--prompt_tokens", "12", "--max_new_tokens", "6", "--batches", "1,3", "--gammas", "2,adaptive",
            "--drafters", "model,bad,none", "--reps", "1", "--threads", "1"]
    assert bench_throughput.main(args) == 0
    assert bench_throughput.main(args) == 0  # a second run replaces the section
    text = out.read_text()
    assert text.startswith("# Report\n\nearlier text\n")
    assert text.count(bench_throughput.BEGIN) == text.count(bench_throughput.END) == 1
    rows = [line for line in text.splitlines() if line.startswith("| ours")]
    assert len(rows) == 10  # model and the disagreeing draft (gamma 2 and adaptive), none; at B=1 and B=3
    assert sum("adaptive gamma (at most 4)" in line for line in rows) == 4
    assert sum("drafter model that never agrees" in line for line in rows) == 4
    assert all(line.rstrip(" |").endswith("4/4") for line in rows), rows  # greedy equal to HF, per prompt
    # The share of the time spent admitting rows, for the batched engine (B=3) only.
    admitting = [line.split("|")[-3].strip() for line in rows]
    assert all(a == "–" for line, a in zip(rows, admitting, strict=True) if "| 1 |" in line), admitting
    batched = [a for line, a in zip(rows, admitting, strict=True) if "| 3 |" in line]
    assert batched and all(a.endswith("%") and 0 < int(a[:-1]) < 100 for a in batched), batched


def test_adaptive_is_timed_as_a_warm_worker_runs_it(models, tokenizer):
    """A job's worker keeps its engine and policy across batches, so the bench times adaptive gamma on an engine that
    has decoded two waves of the first prompts at the timed call's own settings: its costs known, its admissions
    counted apart."""
    target, draft = models["llama"]
    core, calls = bench_throughput.engine_modules(), []

    class Recording(core.batch_engine.BatchSpeculativeGenerator):
        def generate_many(self, items, *args, **kwargs):
            calls.append((self, len(items), self.max_new_tokens, getattr(self.gamma_policy, "costs", None) is not None))
            return super().generate_many(items, *args, **kwargs)

    core = SimpleNamespace(**vars(core) | {"batch_engine": SimpleNamespace(BatchSpeculativeGenerator=Recording)})
    prompts = [tokenizer(f"prompt number {i} of the bench")["input_ids"] for i in range(5)]
    outs, secs, stats = bench_throughput.ours_batched(target, ModelDrafter(draft), prompts, 2, "adaptive", 6,
                                                      core=core)
    (warm, *warm_up), (timed, *call) = calls
    assert timed is warm and warm_up == [4, 6, False] and call == [5, 6, True]  # one engine: two waves, then the call
    assert 0 < stats["admitting"] * secs < timed.admit_s  # the wave's admissions left out
    plain, _, _ = bench_throughput.ours_batched(target, ModelDrafter(draft), prompts, 2, 2, 6, core=core)
    assert outs == plain and [list(c[1:]) for c in calls[2:]] == [[5, 6, False]]  # a fixed gamma needs no warm-up


def test_plain_batching_with_hf_static_cache_is_a_baseline(tmp_path):
    out = tmp_path / "new" / "BENCH.md"  # (a folder that does not exist yet: it lost a whole run, writing last)
    args = ["--size", "tiny", "--cache_dir", str(tmp_path / "cache"), "--out", str(out), "--prompts", "3",
            "--prompt_tokens", "12", "--max_new_tokens", "5", "--batches", "2,3", "--gammas", "2",
            "--drafters", "model", "--hf_kernels", "stock", "--hf_cache", "dynamic,static", "--reps", "1",
            "--threads", "1"]
    assert bench_throughput.main(args) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| HF generate")]
    static = [line for line in rows if "static cache" in line]
    assert len(rows) == 4 and len(static) == 2, rows
    # Without B=1 among the batches the prompts are still decoded alone, untimed, as the reference.
    ours = [line for line in out.read_text().splitlines() if line.startswith("| ours")]
    assert all(line.rstrip(" |").endswith("3/3") for line in rows + ours), rows + ours


@pytest.mark.parametrize("flag, value, says", [("--hf_cache", "dynamic,statc", "is not one of"),
                                               ("--hf_kernels", "stok", "is not one of"),
                                               ("--drafters", "model,ngrm", "is not one of"),
                                               ("--gammas", "2,adaptve", "is neither a gamma >= 1 nor adaptive"),
                                               # (a traceback, or a division by zero once every config was measured)
                                               ("--batches", "1,0", "is not a batch size >= 1"),
                                               ("--batches", "1,x", "is not a batch size >= 1"),
                                               ("--batches", "1,²", "is not a batch size >= 1"),  # (isdigit)
                                               ("--gammas", "2,²", "is neither a gamma >= 1 nor adaptive"),
                                               ("--prompts", "0", "must be an integer >= 1, got '0'"),
                                               ("--reps", "0", "must be an integer >= 1, got '0'")])
def test_a_mistyped_setting_stops_before_any_work(tmp_path, capsys, flag, value, says):
    with pytest.raises(SystemExit) as e:
        bench_throughput.main(["--size", "tiny", "--cache_dir", str(tmp_path / "cache"), flag, value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag}: {value.split(',')[-1]} {says}" in err or f"argument {flag}: {says}" in err, err
    assert not (tmp_path / "cache").exists()  # stopped before building the pair
    with pytest.raises(SystemExit):  # (only the llama pair has a draft that never agrees)
        bench_throughput.main(["--pair", "t5", "--size", "tiny", "--cache_dir", str(tmp_path / "cache"),
                               "--drafters", "bad"])
    assert "--drafters bad: only the llama pair has a draft that never agrees" in capsys.readouterr().err


@pytest.mark.parametrize("pair", ["t5", "mistral"])
def test_encoder_decoder_and_sliding_window_pairs_get_their_own_section(tmp_path, pair):
    out = tmp_path / "BENCH.md"
    out.write_text(f"# Report\n\n{bench_throughput.BEGIN}\nthe llama section\n{bench_throughput.END}\n")
    args = ["--pair", pair, "--size", "tiny", "--cache_dir", str(tmp_path / "cache"), "--out", str(out),
            "--prompts", "3", "--prompt_tokens", "12", "--max_new_tokens", "5", "--batches", "1,3", "--gammas", "2",
            "--drafters", "model,none", "--hf_kernels", "stock", "--hf_cache", "dynamic", "--reps", "1",
            "--threads", "1"]
    assert bench_throughput.main(args) == 0
    text = out.read_text()
    begin, end = bench_throughput.markers(pair)
    assert "the llama section" in text and text.count(begin) == text.count(end) == 1
    rows = [line for line in text.splitlines() if line.startswith("| ours")]
    assert len(rows) == 4 and all(line.rstrip(" |").endswith("3/3") for line in rows), rows


def test_the_demo_pair_runs_to_its_end_tokens_with_adaptive_capped_as_a_job_caps_it(tmp_path, monkeypatch):
    """The trained pair's rows end at its end token: HF's too (its pads after it dropped), so every output equals the
    target's alone and tokens/s counts the tokens made, not the budget; adaptive's cap is the job's gamma."""
    import specdec_core.gamma

    caps = []

    class Recording(specdec_core.gamma.AdaptiveGamma):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            caps.append(self.max_gamma)

    monkeypatch.setattr(specdec_core.gamma, "AdaptiveGamma", Recording)
    out = tmp_path / "BENCH.md"
    args = ["--pair", "demo", "--out", str(out), "--prompts", "3", "--max_new_tokens", "200", "--batches", "1,3",
            "--gammas", "adaptive", "--adaptive_max", "8", "--drafters", "model,none", "--hf_kernels", "stock",
            "--hf_cache", "dynamic", "--reps", "1", "--threads", "1"]
    assert bench_throughput.main(args) == 0
    text = out.read_text()
    begin, end = bench_throughput.markers("demo")
    assert text.count(begin) == text.count(end) == 1 and "3 of its prompts, up to 200 new tokens each" in text
    rows = [line for line in text.splitlines() if line.startswith(("| ours", "| HF"))]
    assert len(rows) == 6 and all(line.rstrip(" |").endswith("3/3") for line in rows), rows
    assert sum("adaptive gamma (at most 8)" in line for line in rows) == 2 and set(caps) == {8}
    assert "## Throughput per worker: a trained pair (`pipeline.bench.throughput --pair demo`)" in text
    # HF batched: rows that end early keep their end token, not the pads the batch ran on with.
    import torch
    from transformers import AutoTokenizer

    from pipeline.demo.assets import ASSETS, demo_prompt_rows
    from specdec_core.loading import load_model

    target = load_model(str(ASSETS / "target"), torch.device("cpu"), torch.float32)
    ids = [AutoTokenizer.from_pretrained(ASSETS / "target")(r["prompt"])["input_ids"] for r in demo_prompt_rows()[:3]]
    eos = {target.generation_config.eos_token_id}
    alone, _ = bench_throughput.hf_batched(target, ids, 1, 200, eos=eos)
    together, _ = bench_throughput.hf_batched(target, ids, 3, 200, eos=eos)
    assert together == alone and all(o[-1] in eos and not eos & set(o[:-1]) and len(o) < 200 for o in alone), alone
    # tokens/s over the tokens made (each row to its end), not rows x budget
    rows = bench_throughput.run(ASSETS / "target", None, [r["prompt"] for r in demo_prompt_rows()[:3]], [3], [1],
                                200, ["none"], ["stock"], 1, ("dynamic",))
    made = sum(len(o) for o in alone)
    assert all(abs(r["tokens_per_s"] * r["seconds"] - made) < 1e-6 for r in rows), (rows, made)
