"""Smoke test of `python -m pipeline.bench` in --quick mode with tiny models, and its parts:
the synthetic pair, the draft dtypes, the sampling configurations."""

import csv
from argparse import Namespace

import pytest
import torch

from pipeline.bench import configs as bench_configs
from pipeline.bench import measure as bench_measure
from pipeline.bench import pairs as bench_pairs
from pipeline.bench import report as bench_report
from pipeline.bench import speed as bench
from tests.numerics import assert_logits_close


@pytest.mark.slow
def test_bench_quick_tiny_writes_report(tmp_path, monkeypatch):
    import tempfile

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where the Beam job's folder goes, and must not stay
    out = tmp_path / "BENCHMARKS.md"
    kept = "<!-- by-hand:begin -->\n## A run by hand\nkept\n<!-- by-hand:end -->"
    out.write_text(f"# Old report\n\nby hand\n\n<!-- bench:begin -->\nstale table\n<!-- bench:end -->\n\n{kept}\n")
    # (one thread, as the test's worker has: two would contend with the other worker's on 2 cores)
    rc = bench.main(["--tiny", "--out", str(out), "--cache_dir", str(tmp_path / "cache"), "--prompts", "2",
                     "--max_new_tokens", "12", "--threads", "1"])
    assert rc == 0  # every greedy output identical to the target alone
    text = out.read_text()
    assert "stale table" not in text and kept in text and "by hand" in text  # its own section replaced, in place
    assert text.index("by hand") < text.index("<!-- bench:begin -->") < text.index(kept)
    for needle in ("ours: target alone", "HF greedy", "ours: model adaptive", "HF assisted g=4",
                   "HF prompt lookup g=4", "ours: ngram g=4", "v(5)", "Beam job vs bare engine loop",
                   "analytic bound", "torch 2.", "Draft dtypes", "| auto |", "| bfloat16 |", "| int8 |",
                   "The `auto` draft (the job's default) in both loops",
                   "Sampling against greedy", "| T=1 | HF assisted g=4 |", "| T=0.7, top-p 0.9 | ours: model g=4 |",
                   "acceptance a ", "Raw rows: `benchmarks/results.csv`"):  # (where they are, from the report)
        assert needle in text, needle
    assert not list(temp.iterdir())  # the Beam job's prompts and outputs are removed
    rows = list(csv.DictReader(open(tmp_path / "benchmarks" / "results.csv")))
    greedy = [r for r in rows if ", T=" not in r["config"]]
    sampled = [r for r in rows if ", T=" in r["config"]]
    assert greedy and all(r["equal"] == "True" for r in greedy)
    assert sampled and all(r["equal"] == "" for r in sampled)  # random draws: no identity check
    assert {r["config"] for r in rows} >= {"ours: target alone", "HF assisted g=4", "ours: model adaptive",
                                           "ours: model g=4, int8 draft", "ours: model g=4, bfloat16 draft",
                                           "ours: model g=4, auto draft", "HF assisted g=4, auto draft",
                                           "HF assisted g=4, T=1", "ours: model g=4, T=0.7, top-p 0.9"}


def test_report_says_from_how_many_rows_packed_weights_were_used():
    assert "packed weights used from 1 input rows, as timed at load" in bench_report._packed_note(
        {"packed_from_rows": 1})
    assert bench_report._packed_note({"packed_from_rows": None}) == ""  # nothing packed (tiny models)


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


def test_draft_dtypes_change_only_the_proposals(models, tokenizer):
    """bf16 and int8 drafts (dynamic int8 linears) beside the fp32 target: greedy output stays the
    target's, token for token; the int8 draft really has quantized linears."""
    from specdec_core.drafters import ModelDrafter
    from specdec_core.engine import SpeculativeGenerator

    target, draft = models["llama"]
    variants = bench_pairs.draft_variants(draft, draft, ["float32", "bfloat16", "int8"])
    assert variants["float32"] is draft
    assert next(variants["bfloat16"].parameters()).dtype == torch.bfloat16
    assert next(draft.parameters()).dtype == torch.float32  # the original is left alone
    assert any("quantized.dynamic" in type(m).__module__ for m in variants["int8"].modules())
    ids = tokenizer("def add(a, b):\n    return").input_ids
    ref = SpeculativeGenerator(target, None, max_new_tokens=16).generate(ids).tokens
    for dtype, d in variants.items():
        out = SpeculativeGenerator(target, ModelDrafter(d), num_speculative_tokens=3, max_new_tokens=16).generate(ids)
        assert out.tokens == ref, dtype
        assert out.stats.draft_tokens > 0
    with pytest.raises(ValueError, match="unknown draft dtype"):
        bench_pairs.draft_variants(draft, draft, ["float16"])


def test_draft_dtypes_flag_is_checked(capsys):
    assert bench.parse(["--tiny"]).draft_dtypes == ["float32", "auto", "bfloat16", "int8"]
    assert bench.parse(["--tiny", "--draft_dtypes", "float32"]).draft_dtypes == ["float32"]
    with pytest.raises(SystemExit) as exit_info:
        bench.parse(["--tiny", "--draft_dtypes", "float32,fp8"])
    assert exit_info.value.code == 2
    assert "--draft_dtypes: unknown dtype 'fp8'" in capsys.readouterr().err


def test_sampling_rows_run_ours_and_hf_assisted_sampling(models, tokenizer):
    """Every sampled configuration (ours and HF, target alone and assisted, both settings) runs on
    a tiny pair, reports its drafts, and gets no identity verdict; speed-ups are against the
    same setting's target alone."""
    target, draft = models["llama"]
    args = Namespace(gamma=2, max_new_tokens=6)
    configs = bench_configs.sampling_configs(target, draft, target, draft, args)
    assert [c.sampling for c in configs] == ["T=1"] * 4 + ["T=0.7, top-p 0.9"] * 4
    ids = tokenizer("def add(a, b):\n    return").input_ids
    rows = bench_measure.run_interleaved("tiny", configs, [("code", "")], [ids], target, reference=None)
    assert len(rows) == len(configs) and all(r["equal"] is None for r in rows)
    summ = bench_report.summarize({"rows": rows, "costs": {"prepacked": _costs(), "stock": _costs()},
                                   "configs": configs})
    by = {s["config"]: s for s in summ}
    for st in ("T=1", "T=0.7, top-p 0.9"):
        assert by[f"ours: target alone, {st}"]["speedup"] == 1.0
        assert by[f"ours: model g=2, {st}"]["baseline"] == f"ours: target alone, {st}"
        assert by[f"HF assisted g=2, {st}"]["baseline"] == f"HF sample, {st}"
        assert by[f"ours: model g=2, {st}"]["acceptance"] is not None
        assert by[f"HF assisted g=2, {st}"]["alpha"] is not None
        assert all(by[n]["equal"] is None for n in by)


def test_hf_sampling_uses_our_processors(models):
    """HF's default top-k (50) is switched off so HF samples from the same distribution as ours:
    with a seed fixed, two HF draws agree, and top_k=0 reaches generate()."""
    from specdec_core.processing import SamplingSettings

    target, _ = models["llama"]
    calls = []
    orig = target.generate

    def spy(*a, **kw):
        calls.append(kw)
        return orig(*a, **kw)

    target.generate = spy
    try:
        toks, _ = bench_configs.hf(target, 5, sampling=SamplingSettings(temperature=0.7, top_p=0.9))([5, 6, 7])
    finally:
        del target.generate
    assert len(toks) == 5
    assert calls[0]["do_sample"] is True and calls[0]["top_k"] == 0 and calls[0]["top_p"] == 0.9


def _costs():
    from specdec_core.gamma import Costs

    return Costs(c=0.1, v={2: 1.1, 3: 1.2})


def test_a_report_section_is_replaced_in_place_or_appended(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    b, e = bench_report.BEGIN, bench_report.END
    bench_report.replace_section(out, f"{b}\none\n{e}\n", b, e)  # a new file
    assert out.read_text() == f"# Benchmarks\n\n{b}\none\n{e}\n"
    out.write_text(f"# Benchmarks\nhead\n{b}\nold\n{e}\n<!-- a:begin -->\nkept\n<!-- a:end -->\n")
    bench_report.replace_section(out, f"{b}\nnew\n{e}", b, e)
    assert out.read_text() == f"# Benchmarks\nhead\n{b}\nnew\n{e}\n<!-- a:begin -->\nkept\n<!-- a:end -->\n"


def test_the_speedup_plot_is_drawn_from_the_committed_results(tmp_path):
    points = bench_report.speedup_points()
    gpu = {(p["new_tokens"], p["batch"]): round(p["speedup"], 2) for p in points if p["kind"] == "GPU"}
    assert gpu[(32, 32)] == 1.41 and gpu[(128, 32)] == 1.72 and gpu[(32, 64)] == 0.92 and gpu[(32, 128)] == 0.71
    assert {p["kind"] for p in points} == {"GPU", "CPU"}
    bench_report.write_plot(points, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_smoke_run_or_a_typo_leaves_the_committed_report_alone(capsys):
    """`--pairs synthtic` measured nothing, then rewrote BENCHMARKS.md and the raw rows with exit 0;
    `--quick` (the command the docs give first) wrote over them too."""
    with pytest.raises(SystemExit):
        bench.parse(["--quick", "--pairs", "synthtic"])
    assert "--pairs: unknown pair 'synthtic' (choose from synthetic, bad_draft)" in capsys.readouterr().err
    for flag in ("--prompts", "--gamma", "--threads"):  # (0 prompts ran 3, --gamma 0 failed once the pair loaded)
        with pytest.raises(SystemExit):
            bench.parse(["--quick", flag, "0"])
        assert f"argument {flag}: must be an integer >= 1, got '0'" in capsys.readouterr().err
    assert bench.parse(["--quick"]).out == "bench-quick/BENCHMARKS.md"
    assert bench.parse(["--tiny"]).out == "bench-quick/BENCHMARKS.md"
    assert bench.parse([]).out == "BENCHMARKS.md"
    assert bench.parse(["--quick", "--out", "x.md"]).out == "x.md"


def test_the_speedup_plot_refuses_a_missing_or_foreign_table_in_one_line(tmp_path, capsys):
    """`pipeline.bench.report` raised tracebacks: a missing --csv, a Parquet file as --csv, --out '' (after the
    plotting)."""
    foreign = tmp_path / "x.parquet"
    foreign.write_bytes(b"PAR1\xbc\xff\x00PAR1")
    for argv, said in ((["--csv", str(tmp_path / "none.csv")], "no such file"),
                       (["--csv", str(foreign)], "not a table of speed-up points (UnicodeDecodeError"),
                       (["--out", ""], "--out '': names no file"),
                       (["--gpu_results", str(tmp_path)], f"--gpu_results '{tmp_path}': a file there is no")):
        (tmp_path / "gpu-x.json").write_text("{bad")
        with pytest.raises(SystemExit):
            bench_report.main([*argv, "--out", str(tmp_path / "plot.png")] if argv[0] != "--out" else argv)
        assert said in capsys.readouterr().err
    assert not (tmp_path / "plot.png").exists()
