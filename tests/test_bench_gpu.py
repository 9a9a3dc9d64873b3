"""The GPU benchmark's whole path, run on a CPU at a tiny size (its CUDA figures come from a GPU)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.bench import gpu
from tests.test_templates import _lock

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--device", "cpu", "--dtype", "float32", "--shape", "tiny", "--prompts", "2", "--warmup", "1",
        "--batch_prompts", "5", "--batch_sizes", "2,4", "--min_len", "4", "--max_len", "12", "--max_new_tokens", "10"]


@pytest.mark.slow
def test_every_section_runs_and_every_output_is_the_targets(tmp_path):
    result = gpu.main([*TINY, "--torch_compile", "--out", str(tmp_path)])
    assert result["graph_fallbacks"] == []  # the static decoders' warnings are collected here
    rows = result["single"]["rows"]
    assert {"HF generate", "HF assisted", "ours, draft", "ours, draft, eager", "ours, draft, eager, cuDNN attention",
            "ours, target alone", "ours, draft, chained", "ours, draft, chained, compiled",
            "ours, target alone, compiled"} <= set(rows)
    assert all(r["identical_to_hf"] == 2 and r["tokens"] == 20 for r in rows.values())  # fp32: exact
    assert rows["ours, draft"]["drafted"] > 0
    for b in ("2", "4"):
        batch = result["batched"]["by_batch_size"][b]
        assert all(r["identical_to_hf"] == 5 and r["tokens"] == 50 for r in batch.values())
    assert "ours, draft, eager, cuDNN attention" not in result["batched"]["by_batch_size"]["2"]
    assert {"ours, draft, eager", "ours, target alone, eager", "ours, draft, chained, eager prefills",
            "ours, target alone, eager prefills"} <= set(result["batched"]["by_batch_size"]["2"])
    assert "ours, draft, eager" not in result["batched"]["by_batch_size"]["4"]  # eager at the first B only
    assert "ours, draft, chained, compiled" in result["batched"]["by_batch_size"]["4"]
    batch = result["batched"]["by_batch_size"]["4"]
    # --gamma 4 (fewer where a row's budget ends), and `--gamma_policy adaptive`'s choices
    assert 3 < batch["ours, draft, chained, compiled"]["drafts_per_round"] <= 4
    assert 0 <= batch["ours, draft, chained, compiled, adaptive gamma"]["drafts_per_round"] <= 4
    assert batch["ours, target alone, compiled"]["drafts_per_round"] == 0
    assert set(result["profile"]) == {"CUDA graphs", "CUDA graphs, chained", "CUDA graphs, chained, compiled", "eager"}
    saved = json.loads((tmp_path / "gpu-tiny-float32.json").read_text())
    assert saved["single"]["rows"].keys() == rows.keys()
    md = (tmp_path / "gpu-tiny-float32.md").read_text()
    assert "| ours, draft |" in md and "| in admissions | drafts per round |" in md
    assert "| 4 | ours, target alone, compiled |" in md


def test_prompts_are_distinct_and_of_varied_lengths():
    prompts = gpu.distinct_prompts(50, 8, 40, 300, seed=1)
    assert len({tuple(p) for p in prompts}) == 50
    assert len({len(p) for p in prompts}) > 10 and all(8 <= len(p) <= 40 for p in prompts)


def test_saved_job_inputs_load_as_a_pair(tmp_path):
    gpu.main([*TINY, "--save", str(tmp_path / "job")])
    import torch

    from specdec_core.loading import load_model, load_tokenizer

    target = load_model(str(tmp_path / "job" / "target"), torch.device("cpu"), torch.float32)
    tok = load_tokenizer(str(tmp_path / "job" / "draft"))
    table = pq.read_table(tmp_path / "job" / "prompts.parquet")
    assert table.num_rows == 5 and target.config.num_hidden_layers == 3
    assert len(tok(table.column("prompt")[0].as_py()).input_ids) >= 4


def test_a_bad_setting_stops_in_one_line(capsys):
    with pytest.raises(SystemExit):
        gpu.parse_args(["--sections", "single,nope"])
    assert "unknown nope" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # not taken for --report
        gpu.parse_args(["--repor", "x.json"])
    assert "unrecognized arguments: --repor" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a batch of 128 rows out of 64 prompts ran 64 rows together
        gpu.parse_args(["--batch_prompts", "64", "--batch_sizes", "32,128"])
    assert "--batch_sizes 128: more rows than --batch_prompts 64" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # (a ValueError traceback)
        gpu.parse_args(["--batch_sizes", "8,x"])
    assert "--batch_sizes '8,x': expected comma-separated integers >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu.parse_args(["--report", "/nonexistent/gpu.json"])
    assert "--report /nonexistent/gpu.json: no such file" in capsys.readouterr().err
    # (each failed in a traceback once the pair was built; --prompts 0 after writing its result file)
    for argv, said in ((["--prompts", "0"], "--prompts must be >= 1, got 0"),
                       (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
                       (["--gamma", "0"], "--gamma must be >= 1, got 0"),
                       (["--device", "bogus"], "--device 'bogus': "), (["--include", "("], "--include '(': ")):
        with pytest.raises(SystemExit):
            gpu.parse_args(argv)
        assert said in capsys.readouterr().err


def test_figures_are_saved_as_they_are_made(tmp_path):
    """A run cut short keeps what it measured: the single section is written after each prompt,
    the batched one after each configuration, each marked partial until its section ends; the
    configurations that compile run last, so a run cut short while compiling keeps the others, and
    HF's compiled `generate()` right after ours with the defaults, before ours' other variants."""
    args = gpu.parse_args([*TINY, "--batched_before", "--torch_compile", "--hf_compile", "--include",
                           "chained|draft, eager, cuDNN|static cache"])
    target, draft = gpu.build_pair(gpu.SHAPES["tiny"], gpu.torch.device("cpu"), gpu.torch.float32)
    single, batched = [], []
    gpu.run_single(target, draft, args, single.append)
    gpu.run_batched(target, draft, args, batched.append)
    compiled, hf_compiled = "ours, draft, chained, compiled", "HF generate, static cache + compile"
    assert [p["prompts"] for p in single] == [1, 2, 2, 2, 2, 2, 2, 2]  # 4 groups: see below
    assert [compiled in p["rows"] for p in single] == [False, False, True, True, True, True, True, True]
    assert [hf_compiled in p["rows"] for p in single] == [False, False, False, False, True, True, True, True]
    assert [f"{compiled}, compiled prefills" in p["rows"] for p in single] == [False] * 6 + [True, True]
    assert single[-1]["rows"][compiled]["prompts"] == 2 and single[-1]["rows"][compiled]["identical_to_hf"] == 2
    at_two = [list(p["by_batch_size"]["2"]) for p in batched if p["batch_size_partial"] == 2]
    # compiling runs last: ours with the defaults, HF's, ours' other variants, and the adaptive gamma (it compiles a
    # chained draft per gamma it picks)
    order = at_two[-1]
    assert at_two[0] == ["HF generate"] and order[-1] == f"{compiled}, adaptive gamma"
    assert order.index(compiled) + 1 == order.index(hf_compiled) == order.index(f"{compiled}, uncompiled prefills") - 1
    assert {compiled, f"{compiled}, uncompiled prefills", f"{compiled}, eager prefills of 4+ rows",
            f"{compiled}, eager prefills of 16+ rows", f"{compiled}, admitted a quarter at a time"} <= set(at_two[-1])
    assert batched[-1]["by_batch_size"]["4"][f"{compiled}, admitted a quarter at a time"]["identical_to_hf"] == 5
    assert "ours, draft, eager, cuDNN attention" in at_two[-1]
    assert batched[-1]["by_batch_size"]["4"][compiled]["identical_to_hf"] == 5
    ours_row, hf_row = batched[-1]["by_batch_size"]["4"][compiled], batched[-1]["by_batch_size"]["4"]["HF generate"]
    assert 0 < ours_row["admit_s"] < ours_row["seconds"] and "admit_s" not in hf_row  # ours' time in prefills
    cut = {"shape": "tiny", "dtype": "float32", "device_name": "cpu", "torch": "", "cuda": None, "transformers": "",
           "gamma": 4, "max_new_tokens": 10, "min_len": 4, "max_len": 12, "single": single[0], "single_partial": True}
    assert "(cut short in: single)" in gpu.markdown(cut)
    cut["graph_fallbacks"] = ["LlamaForCausalLM: no CUDA graph of a 2-token pass (RuntimeError: x)"]
    assert "- LlamaForCausalLM: no CUDA graph of a 2-token pass" in gpu.markdown(cut)
    assert "gamma 4, 10 new tokens, prompts of" in gpu.markdown(cut)
    # a file of batched figures only: the batch-1 length (a flag's default there) is no figure's
    batched_only = {k: v for k, v in cut.items() if k not in ("single", "single_partial")}
    assert "gamma 4, prompts of" in gpu.markdown(batched_only)


def test_an_encoder_decoder_pair_runs_the_same_way(tmp_path):
    argv = [a if a != "tiny" else "tiny-t5" for a in TINY]
    result = gpu.main([*argv, "--sections", "single,batched", "--out", str(tmp_path)])
    assert all(r["identical_to_hf"] == 2 and r["tokens"] == 20 for r in result["single"]["rows"].values())
    assert result["single"]["rows"]["ours, draft"]["drafted"] > 0
    assert all(r["identical_to_hf"] == 5 for r in result["batched"]["by_batch_size"]["4"].values())


def test_a_sliding_window_pair_passes_its_window_and_runs_the_same_way(tmp_path):
    """The `window` step's pair: a Mistral, the draft an early exit of the target, most rows (4-24
    prompt tokens, 10 new) past its window. (Here the passes run eagerly; their masks over static
    caches: tests/test_static_decoder.py and tests/test_slot_kv.py.)"""
    target, draft = gpu.build_pair(gpu.SHAPES["tiny-mistral"], gpu.torch.device("cpu"), gpu.torch.float32)
    assert type(target).__name__ == "MistralForCausalLM" and target.config.sliding_window == 16
    assert draft.config.num_hidden_layers == 1 and draft.config.sliding_window == 16
    argv = [a if a != "tiny" else "tiny-mistral" for a in TINY]
    result = gpu.main([*argv, "--sections", "single,batched", "--max_len", "24", "--out", str(tmp_path)])
    assert all(r["identical_to_hf"] == 2 for r in result["single"]["rows"].values())
    assert all(r["identical_to_hf"] == 5 for r in result["batched"]["by_batch_size"]["4"].values())


@pytest.mark.slow
def test_a_batched_call_is_profiled_with_its_time_in_admissions(tmp_path):
    """Ours, and HF's compiled `generate()` over the same prompts for comparison, with the time
    of its prefills (the same calls for one new token); on a GPU each profile also lists its
    costliest kernels (none on a CPU: shown here from a made-up profile)."""
    result = gpu.main([*TINY, "--sections", "profile_batched", "--hf_compile", "--out", str(tmp_path)])
    prof = result["profile_batched"]
    hf = "B=2, HF generate, static cache + compile"
    assert list(prof) == [hf, "B=2, target alone", "B=2, draft, chained"]
    assert all(p["tokens"] == 40 for p in prof.values())  # 4 x 10
    assert all(0 < p["admit_s"] < p["unprofiled_wall_s"] for p in prof.values())  # (HF's: its prefills alone)
    assert all(p["top_gpu_kernels"] == [] for p in prof.values())  # (no CUDA activity on a CPU)
    md = (tmp_path / "gpu-tiny-float32.md").read_text()
    assert "| B=2, draft, chained | 40 |" in md and f"| {hf} | 40 |" in md and "in prefills" in md
    prof[hf]["top_gpu_kernels"] = [("ampere_bf16_s16816gemm", 88, 12.5)]
    assert "| `ampere_bf16_s16816gemm` | 88 | 12.5 |" in gpu.markdown(result)


def test_a_failed_test_is_reported_as_it_fails(tmp_path):
    """The GPU script's plugin writes each failure's reason at once (a run cut off by its time
    limit never reaches pytest's summary), and nothing for a test that passes."""
    (tmp_path / "test_x.py").write_text("import logging\n\n\ndef test_ok():\n    pass\n\n\n"
                                          "def test_bad():\n    logging.warning('a capture failed')\n"
                                          "    assert 1 + 1 == 3, 'sum'\n")
    failures = tmp_path / "failures.txt"
    env = {**os.environ, "FAILURES_FILE": str(failures), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.failures_now",
                           str(tmp_path / "test_x.py")], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout
    text = failures.read_text()
    assert "test_x.py::test_bad (call)" in text and "AssertionError: sum" in text and "a capture failed" in text
    assert "test_ok" not in text


@pytest.mark.slow
def test_the_gpu_scripts_test_steps_run(tmp_path):
    """benchmarks/gpu/run.sh's two test steps as the GPU machine runs them (its pytest options and
    plugin), here where every CUDA test skips: a broken invocation would cost a device call."""
    env = {**os.environ, "OUT": str(tmp_path), "DEVICE": "cpu", "PYTHON": sys.executable,
           "STEPS": "tests tests-compiled"}
    subprocess.run(["bash", str(ROOT / "benchmarks/gpu/run.sh")], env=env, cwd=ROOT, check=True, timeout=300)
    log = (tmp_path / "log.txt").read_text()
    assert "== tests: exit 0" in log and "== tests-compiled: exit 0" in log, log[-2000:]
    assert log.count(" deselected / ") == 2  # each step runs its part of tests/test_cuda.py


def test_the_gpu_machines_wheels_are_pinned_in_the_lock():
    """benchmarks/gpu/wheels.sh downloads each package at the lock's version: a lock refresh that
    drops one (a dependency Beam no longer has) shows here, not when a device call is being prepared."""
    script = (ROOT / "benchmarks/gpu/wheels.sh").read_text()
    names = re.search(r'packages="([^"]+)"', script).group(1).split()
    assert {"transformers", "apache-beam"} <= set(names) and not {"pymongo", "dnspython"} & set(names)
    assert [name for name in names if name not in _lock()] == []


def test_a_pass_that_falls_back_to_eager_is_reported_beside_the_figures(tmp_path, monkeypatch):
    """A figure labelled "graphs" must be one: a capture that fails (here on a CPU, which has no CUDA graphs) and
    leaves a pass eager is listed in the result and its page, from the logger the graphs module writes to."""
    import torch

    from specdec_core.graphs import PassGraphs
    from specdec_core.pass_settings import DEFAULT

    def profile(target, draft, args, partial) -> dict:
        passes = PassGraphs("TinyLM", torch.device("cpu"), DEFAULT, graphs=True, strict=False, compile=False,
                            compile_prefills=False)
        assert torch.equal(passes.run(3, torch.ones(1, 4), lambda x: 2 * x, "a 3-token pass", graphed=True),
                           2 * torch.ones(1, 4))  # (eager, after the failed capture)
        return {}

    monkeypatch.setattr(gpu, "run_profile", profile)
    result = gpu.main([*TINY, "--sections", "profile", "--out", str(tmp_path)])
    assert len(result["graph_fallbacks"]) == 1 and "TinyLM: no CUDA graph of a 3-token pass" in \
        result["graph_fallbacks"][0]
    assert "- TinyLM: no CUDA graph of a 3-token pass" in gpu.markdown(result)


def test_the_gpu_bench_imports_no_beam():
    """`pipeline.bench.gpu` parses its own flags with plain argparse and runs where Beam is not installed
    (docs/flags.md): none of its modules may pull Beam in."""
    code = "import sys, pipeline.bench.gpu; print('apache_beam' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
