"""Where a worker's pairs go (one per GPU, or split), what a pair needs, and the fit check that
refuses a pair before any work: all on fake GPU lists, so it runs on any CPU."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import LlamaConfig

from pipeline.fit import GPU_MIB, MIB, check_fit, parse_accelerator, worker_gpus
from pipeline.options import SpecDecOptions
from pipeline.provenance import run_record
from pipeline.run import main
from specdec_core import placement
from specdec_core.placement import GIB, Copy, Footprint, Gpu, fit_problem, plan_copies
from specdec_core.text import GeneratorSpec
from tests.tiny_models import build_chat_tokenizer, not_utf8
from transforms.copies import PairGone, PairRouter
from transforms.model_handler import SpecDecModelHandler

L4 = GPU_MIB["nvidia-l4"] * MIB
A100 = GPU_MIB["nvidia-tesla-a100"] * MIB


def gpus(n: int, size: int = L4) -> list[Gpu]:
    return [Gpu(f"cuda:{i}", size) for i in range(n)]


def need(weights_gib: float, kv_gib: float = 0.0, block_gib: float = 0.5, draft_gib: float = 0.0) -> Footprint:
    return Footprint(int(weights_gib * GIB), int(draft_gib * GIB), int(kv_gib * GIB), 0, int(block_gib * GIB),
                     int(weights_gib * GIB / 2))


# --- the plan ------------------------------------------------------------------------------


def test_a_four_gpu_worker_runs_four_pairs():
    copies = plan_copies("cuda", "none", gpus(4))
    assert copies == [Copy((f"cuda:{i}",)) for i in range(4)]
    assert plan_copies("auto", "none", gpus(4)) == copies  # auto takes the GPUs when there are some


def test_one_gpu_cpu_and_errors():
    assert plan_copies("cuda:2", "none", gpus(4)) == [Copy(("cuda:2",))]
    assert plan_copies("cpu", "none", gpus(4)) == [Copy(("cpu",))]
    assert plan_copies("auto", "none", []) == [Copy(("cpu",))]
    with pytest.raises(ValueError, match=r"^--device cuda:4: this machine has 4 GPU\(s\)"):
        plan_copies("cuda:4", "none", gpus(4))
    with pytest.raises(ValueError, match="^--device cuda: CUDA is not available"):
        plan_copies("cuda", "none", [])
    with pytest.raises(ValueError, match="^--device_map 'balanced'"):
        plan_copies("cuda", "balanced", gpus(2))


def test_device_map_auto_splits_over_the_fewest_gpus_that_hold_the_weights():
    eight = gpus(8, A100)
    # 100 GiB of weights: four 40 GB A100s per copy (35 GiB usable each, weights at most 80% of it),
    # two copies on eight
    big = need(100)
    assert plan_copies("cuda", "auto", eight, big) == [Copy(tuple(f"cuda:{i}" for i in range(j, j + 4)))
                                                      for j in (0, 4)]
    # an 8B fits one GPU: as many copies as GPUs, nothing split
    assert plan_copies("cuda", "auto", eight, need(15)) == [Copy((f"cuda:{i}",)) for i in range(8)]
    # three GPUs, two per copy: one copy, the third GPU idles
    assert plan_copies("cuda", "auto", gpus(3), need(30)) == [Copy(("cuda:0", "cuda:1"))]
    # unknown need: one copy over every GPU; one GPU: splits nothing
    assert plan_copies("cuda", "auto", gpus(4)) == [Copy(tuple(f"cuda:{i}" for i in range(4)))]
    assert plan_copies("cuda", "auto", gpus(1), big) == [Copy(("cuda:0",))]
    assert plan_copies("cuda:1", "auto", gpus(4), big) == [Copy(("cuda:1",))]


def test_describe_plan_names_every_copy():
    assert placement.describe_plan(plan_copies("cuda", "none", gpus(2))) == \
        "2 copies of the pair: copy 0 on cuda:0, copy 1 on cuda:1"
    assert placement.describe_plan([Copy(("cuda:0", "cuda:1"))]) == "1 copy of the pair: copy 0 on cuda:0+cuda:1"


# --- what a pair needs ---------------------------------------------------------------------


def test_parameter_count_and_kv_bytes_match_a_real_model(models):
    target = models["llama"][0]
    params, block = placement.parameter_count(target.config)
    assert params == sum(p.numel() for p in target.parameters())
    assert block == sum(p.numel() for p in target.model.layers[0].parameters())
    ids = torch.arange(3, 20)[None]
    with torch.no_grad():
        cache = target(ids, use_cache=True).past_key_values
    measured = sum(layer.keys.numel() * 4 + layer.values.numel() * 4 for layer in cache.layers)
    assert placement.kv_bytes(target.config, 1, ids.shape[1], 0, torch.float32) == measured
    assert placement.kv_bytes(target.config, 8, 10, 7, torch.bfloat16) == measured // 2 * 8


@pytest.mark.parametrize("family", ["gemma3n", "gemma4"])
def test_kv_bytes_count_only_layers_with_their_own_cache_at_their_own_shapes(family):
    """Gemma 3n's and Gemma 4's last layers reuse earlier layers' keys and values (no cache of
    their own); Gemma 4's full-attention layers have a head dim of their own (a per-layer config,
    whose global head_dim raises on access)."""
    from tests.family_models import family_model

    target = family_model(family, seed=1, window=None)
    params, _ = placement.parameter_count(target.config)
    assert params == sum(p.numel() for p in target.parameters())
    ids = torch.arange(3, 20)[None]
    with torch.no_grad():
        cache = target(ids, use_cache=True).past_key_values
    held = [layer for layer in cache.layers if getattr(layer, "keys", None) is not None]
    assert len(held) == 2 < len(cache.layers)
    measured = sum(layer.keys.numel() * 4 + layer.values.numel() * 4 for layer in held)
    assert placement.kv_bytes(target.config, 1, ids.shape[1], 0, torch.float32) == measured


def test_a_llama_8b_config_is_8b_parameters():
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256)
    f = placement.footprint(cfg, None, torch.bfloat16, rows=16, prompt_tokens=1000, new_tokens=256)
    assert f.target_params == 8_030_261_248
    assert f.target_weights == 2 * f.target_params
    assert f.target_kv == 16 * (1000 + 256) * 2 * 32 * 8 * 128 * 2  # rows x tokens x K,V x layers x heads x dim x bf16


# --- the fit check -------------------------------------------------------------------------


def test_fit_problem_names_the_flag_with_the_numbers():
    one_l4, two_l4 = gpus(1), gpus(2)
    ok = need(15, kv_gib=2)
    assert fit_problem(ok, one_l4, plan_copies("cuda", "none", one_l4), batch_size=8, device_map="none",
                       tokens=900) is None
    big = need(30, kv_gib=2)
    msg = fit_problem(big, one_l4, plan_copies("cuda", "none", one_l4), batch_size=8, device_map="none", tokens=900)
    assert msg.startswith("--target_model: the pair needs 32.0 GiB") and "for 8 row(s) of 900 tokens" in msg
    msg = fit_problem(big, two_l4, plan_copies("cuda", "none", two_l4), batch_size=8, device_map="none", tokens=900)
    assert msg.startswith("--device_map: ") and "pass --device_map auto" in msg
    split = plan_copies("cuda", "auto", two_l4, big)
    assert split == [Copy(("cuda:0", "cuda:1"))]
    assert fit_problem(big, two_l4, split, batch_size=8, device_map="auto", tokens=900) is None
    kv = need(15, kv_gib=10)
    msg = fit_problem(kv, one_l4, plan_copies("cuda", "none", one_l4), batch_size=16, device_map="none", tokens=900)
    assert msg.startswith("--batch_size 16: ") and "use --batch_size 6 or less" in msg
    assert "\n" not in msg
    # The prefills' cache is there once, whatever the batch: the advice then fits.
    prefilled = replace(kv, target_kv=kv.target_kv + 2 * GIB, prefill=2 * GIB)
    msg = fit_problem(prefilled, one_l4, plan_copies("cuda", "none", one_l4), batch_size=16, device_map="none",
                      tokens=900)
    assert "use --batch_size 3 or less" in msg
    assert fit_problem(replace(prefilled, target_kv=int(10 / 16 * 3 * GIB) + 2 * GIB), one_l4,
                       plan_copies("cuda", "none", one_l4), batch_size=3, device_map="none", tokens=900) is None
    # Not one row fits: the length is the culprit, not the batch.
    long = need(15, kv_gib=9)
    msg = fit_problem(long, one_l4, plan_copies("cuda", "none", one_l4), batch_size=1, device_map="none",
                      tokens=60000)
    assert msg.startswith("--max_new_tokens: ") and "not one row of 60000 tokens" in msg
    msg = fit_problem(long, gpus(2), plan_copies("cuda", "none", gpus(2)), batch_size=1, device_map="none",
                      tokens=60000)
    assert msg.startswith("--max_new_tokens: ") and msg.endswith("or pass --device_map auto")


def test_worker_gpus_from_the_accelerator_settings():
    assert parse_accelerator("type:nvidia-l4;count:4;install-nvidia-driver") == ("nvidia-l4", 4)
    assert parse_accelerator("install-nvidia-driver") is None
    assert parse_accelerator("type:nvidia-l4; count:2") == ("nvidia-l4", 2)  # (a space was read as 1 GPU)
    with pytest.raises(ValueError, match="count:0 in 'type:nvidia-l4;count:0': expected a whole number"):
        parse_accelerator("type:nvidia-l4;count:0")
    base = ["--input=x", "--output=y", "--target_model=t", "--runner=DataflowRunner"]
    worker = worker_gpus(SpecDecOptions(
        [*base, "--dataflow_service_options=worker_accelerator=type:nvidia-l4;count:4;install-nvidia-driver"]))
    assert worker.gpus == gpus(4) and worker.source == "4 x nvidia-l4 (22.5 GiB each)"
    assert worker_gpus(SpecDecOptions([*base, "--accelerator=type:nvidia-tesla-a100;count:8"])).gpus == gpus(8, A100)
    assert worker_gpus(SpecDecOptions(  # (an experiment: the older way, and gcloud's --additional-experiments)
        [*base, "--experiments=worker_accelerator=type:nvidia-l4;count:2"])).gpus == gpus(2)
    assert worker_gpus(SpecDecOptions(  # (right fitting's hint, its machine type in it)
        [*base, "--accelerator=type:nvidia-l4;count:1;machine_type:g2-standard-8"])).gpus == gpus(1)
    hint = "--resource_hints=accelerator=type:nvidia-l4;count:"  # (Beam's own hint for every step: the last one)
    assert worker_gpus(SpecDecOptions([*base, f"{hint}1", f"{hint}2"])).gpus == gpus(2)
    assert worker_gpus(SpecDecOptions(  # (the generate step keeps its own, --accelerator's: Beam keeps the inner)
        [*base, f"{hint}2", "--accelerator=type:nvidia-l4;count:1"])).gpus == gpus(1)
    assert worker_gpus(SpecDecOptions(base)) is None  # a Dataflow job that names no accelerator
    assert worker_gpus(SpecDecOptions([*base, "--accelerator=type:nvidia-new;count:2"])) is None


def test_provenance_names_the_device_of_every_copy():
    opts = SpecDecOptions(["--input=x", "--output=y", "--target_model=t", "--runner=DataflowRunner",
                           "--device=cuda", "--accelerator=type:nvidia-l4;count:4;install-nvidia-driver"])
    record = run_record(opts)
    assert record["device_map"] == "none"
    assert record["placement"] == {"gpus": "4 x nvidia-l4 (22.5 GiB each)",
                                   "copies": [["cuda:0"], ["cuda:1"], ["cuda:2"], ["cuda:3"]]}
    json.dumps(record, default=str)


def _big_target(tmp_path, tokenizer, layers=32):
    """A model directory with a Llama-8B config and a shard index without shards: enough for
    preflight, which reads the config and sees that weights are named."""
    path = tmp_path / "llama-8b"
    LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256).save_pretrained(path)
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {}}))
    tokenizer.save_pretrained(path)
    return path


def test_a_pair_that_cannot_fit_is_refused_before_any_work(tmp_path, tokenizer, capsys, monkeypatch):
    target = _big_target(tmp_path, tokenizer)
    prompts = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": [1, 2], "prompt": ["short", "a longer prompt " * 50]}), prompts)
    started = []
    monkeypatch.setattr("pipeline.run.build_pipeline", lambda *a: started.append(1))
    base = ["--input", str(prompts), "--output", str(tmp_path / "out"), "--target_model", str(target),
            "--drafter", "none", "--device", "cuda", "--dtype", "bfloat16"]
    assert main([*base, "--accelerator", "type:nvidia-tesla-t4;count:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: --target_model: the pair needs 15.")
    assert "8.03B parameters" in err and "(1 x nvidia-tesla-t4 (15.0 GiB each))" in err
    # two T4s: the same pair fits split, which the message says
    assert main([*base, "--accelerator", "type:nvidia-tesla-t4;count:2"]) == 2
    assert capsys.readouterr().err.startswith("error: --device_map: ")
    # one L4 holds the weights, but not the KV cache of 256 rows
    assert main([*base, "--accelerator", "type:nvidia-l4;count:1", "--batch_size", "256"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --batch_size 256: ")
    assert re.search(r"KV cache [\d.]+ GiB for 256 row\(s\) of \d+ tokens", err)
    assert "no draft model" in err
    assert started == []


def test_a_cuda_error_loses_the_device_only_if_a_kernel_then_fails_too(monkeypatch):
    error = torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    cpu = [torch.device("cpu")]
    placement.check_device(error, cpu)  # a CPU always works: one row's error
    placement.check_device(ValueError("bad row"), cpu)
    monkeypatch.setattr(placement, "device_works", lambda devices: False)
    with pytest.raises(placement.DeviceLost, match="illegal memory access") as lost:
        placement.check_device(error, cpu)
    assert lost.value.__cause__ is error
    placement.check_device(torch.cuda.OutOfMemoryError("CUDA out of memory"), cpu)  # never a lost device


def test_a_copy_whose_gpu_is_lost_ends_its_process(monkeypatch):
    """Its routers then see it gone and send its calls to the other copies."""
    from transforms import worker_exit
    from transforms.copies import Served

    class Lost:
        def generate(self, prompt, seed=0):
            raise placement.DeviceLost("cuda:1 fails every call since AcceleratorError: ...")

    exits = []
    monkeypatch.setattr(worker_exit.os, "_exit", exits.append)
    with pytest.raises(placement.DeviceLost):
        Served(Lost()).generate("p")
    assert exits == [worker_exit.WORKER_LOST]


def test_only_errors_that_cuda_keeps_count_as_a_failed_device():
    assert placement.device_failed(torch.AcceleratorError("CUDA error: device-side assert triggered"))
    assert placement.device_failed(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not placement.device_failed(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert not placement.device_failed(RuntimeError("CUDA error: out of memory"))
    assert not placement.device_failed(ValueError("prompt is empty"))


def test_the_fit_check_reads_the_longest_prompt_in_tokens(tmp_path, tokenizer):
    target = _big_target(tmp_path, tokenizer, layers=2)
    prompts = tmp_path / "p.parquet"
    # the longest in bytes is not valid UTF-8: the job fails its row, the check passes over it
    pq.write_table(pa.table({"id": list(range(41)),
                             "prompt": not_utf8([f"p {i}" for i in range(39)] + ["word " * 60, b"\xff" * 900])}),
                   prompts)
    opts = SpecDecOptions(["--input", str(prompts), "--output", "o", "--target_model", str(target),
                           "--drafter", "none", "--device", "cuda", "--runner=DataflowRunner",
                           "--accelerator", "type:nvidia-l4;count:2"])
    from pipeline.fit import longest_prompt_tokens

    tokens, how = longest_prompt_tokens(opts)
    assert tokens == len(tokenizer("word " * 60)["input_ids"]) and how == "tokens of the longest prompt"
    assert check_fit(opts) == [Copy(("cuda:0",)), Copy(("cuda:1",))]


def test_the_batch_size_the_fit_check_names_fits_and_one_more_does_not(tmp_path, tokenizer):
    """Batched with graphs, new rows are prefilled together through a cache of up to 16 rows: a
    smaller batch prefills fewer. Counted as fixed, the advice was too small, or "lower
    --max_new_tokens" where four rows fit."""
    target = _big_target(tmp_path, tokenizer)
    prompts = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": [1, 2], "prompt": ["short", "word " * 1500]}), prompts)

    def fit(batch_size: int) -> str | None:
        opts = SpecDecOptions(["--input", str(prompts), "--output", "o", "--target_model", str(target),
                               "--drafter", "none", "--device", "cuda", "--dtype", "bfloat16",
                               "--runner=DataflowRunner", "--accelerator", "type:nvidia-l4;count:1",
                               "--batch_size", str(batch_size)])
        try:
            check_fit(opts)
        except ValueError as e:
            return str(e)
        return None

    advice = fit(16)
    assert advice.startswith("--batch_size 16: "), advice
    largest = int(re.search(r"use --batch_size (\d+) or less", advice).group(1))
    assert largest >= 2 and fit(largest) is None
    assert fit(largest + 1).startswith(f"--batch_size {largest + 1}: ")


@pytest.mark.parametrize("system", ["", "Be brief."])
def test_the_fit_check_encodes_conversations_as_the_job_does(tmp_path, system):
    """--system_prompt first, '' too (an empty system message: a template's default one suppressed);
    an empty conversation, whose row the job fails, is passed over (it raised IndexError here)."""
    tokenizer = build_chat_tokenizer()
    target = _big_target(tmp_path, tokenizer, layers=2)
    messages = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    user = [{"role": "user", "content": "hello there"}]
    pq.write_table(pa.table({"id": [1, 2], "prompt": pa.array([[], user], messages)}), tmp_path / "p.parquet")
    opts = SpecDecOptions(["--input", str(tmp_path / "p.parquet"), "--output", "o", "--target_model", str(target),
                           "--drafter", "none", "--system_prompt", system])
    from pipeline.fit import longest_prompt_tokens

    ids = tokenizer.apply_chat_template([{"role": "system", "content": system}, *user], add_generation_prompt=True,
                                        tokenize=True, return_dict=True)["input_ids"]
    assert longest_prompt_tokens(opts) == (len(ids), "tokens of the longest prompt")


def test_a_local_job_without_a_gpu_logs_that_it_runs_on_the_cpu(monkeypatch, caplog):
    """--device auto on a machine without a GPU runs one copy on the CPU: said in the log, and
    so is a --device_map auto that has nothing to split; --device cuda is refused."""
    import pipeline.fit as fit

    monkeypatch.setattr(fit.placement, "visible_gpus", lambda: [])
    opts = SpecDecOptions(["--input=x", "--output=y", "--target_model=t", "--drafter=none", "--device_map=auto"])
    with caplog.at_level(logging.INFO, logger="pipeline.fit"):
        assert check_fit(opts) is None
    assert ("worker GPUs: no GPU on this machine; 1 copy of the pair: copy 0 on cpu "
            "(--device_map auto: nothing to split)") in caplog.text
    with pytest.raises(ValueError, match="--device cuda: CUDA is not available"):
        check_fit(SpecDecOptions(["--input=x", "--output=y", "--target_model=t", "--drafter=none", "--device=cuda"]))


def test_the_fit_check_reads_a_bounded_share_of_a_large_input(tmp_path, tokenizer, monkeypatch):
    import pipeline.fit

    target = _big_target(tmp_path, tokenizer, layers=2)
    for i, prompt in enumerate(["a b", "a b c", "word " * 60]):
        pq.write_table(pa.table({"id": [i], "prompt": [prompt]}), tmp_path / f"p-{i}.parquet")
    opts = SpecDecOptions(["--input", str(tmp_path / "p-*.parquet"), "--output", "o", "--target_model", str(target),
                           "--drafter", "none"])
    monkeypatch.setattr(pipeline.fit, "SCAN_BYTES", sum((tmp_path / f"p-{i}.parquet").stat().st_size for i in (0, 1)))
    tokens, how = pipeline.fit.longest_prompt_tokens(opts)
    assert tokens == len(tokenizer("a b c")["input_ids"])
    assert how.startswith("tokens of the longest prompt; the first 2 of 3 input files")


# --- the handler on a worker with several GPUs ---------------------------------------------


def test_the_handler_starts_one_copy_per_gpu(monkeypatch):
    started = {}
    monkeypatch.setattr(placement, "visible_gpus", lambda: gpus(4))
    monkeypatch.setattr("transforms.copies.start_copies",
                        lambda spec, copies, tag: started.update(spec=spec, copies=copies, tag=tag) or "router")
    handler = SpecDecModelHandler(GeneratorSpec("t", drafter="none", device="cuda"), large_model=True)
    assert handler.copies() == [Copy((f"cuda:{i}",)) for i in range(4)]
    assert handler.share_model_across_processes() is False  # the copies are shared by transforms/copies.py
    assert handler.load_model() == "router"
    assert len(started["copies"]) == 4 and started["tag"] == handler.job_tag
    # --large_model on one GPU: one copy in a process of its own, as each of several (not Beam's sharing, whose
    # host is an SDK process: its end would fail every other process's rows)
    one = SpecDecModelHandler(GeneratorSpec("t", drafter="none", device="cuda:1"), large_model=True)
    assert one.copies() == [Copy(("cuda:1",))] and one.share_model_across_processes() is False
    assert one.load_model() == "router" and started["copies"] == [Copy(("cuda:1",))]
    # a worker plans its own copies: the launcher's plan, pickled with the handler, is another process's
    handler._copies = (-1, [Copy(("cuda:0",))])
    assert len(handler.copies()) == 4
    # two GPUs are two copies too; and two jobs on one machine never share each other's copies
    monkeypatch.setattr(placement, "visible_gpus", lambda: gpus(2))
    two = SpecDecModelHandler(GeneratorSpec("t", drafter="none", device="cuda"), large_model=True)
    assert two.load_model() == "router" and len(started["copies"]) == 2 and two.job_tag != handler.job_tag
    from transforms.copies import copy_tag

    assert copy_tag(two.job_tag, 0, Copy(("cuda:0",))) != copy_tag(handler.job_tag, 0, Copy(("cuda:0",)))


def test_each_copy_loads_on_its_own_devices(monkeypatch):
    import transforms.copies as copies

    loaders = []

    class Recorded:
        def __init__(self, loader, **kwargs):
            loaders.append(loader)

        def acquire(self):
            return object()

    monkeypatch.setattr(copies, "MultiProcessShared", Recorded)
    copies.start_copies(GeneratorSpec("t", drafter="none", device="cuda"), [Copy(("cuda:0",)), Copy(("cuda:1",))],
                        "job")
    assert [loader.spec.devices for loader in loaders] == [("cuda:0",), ("cuda:1",)]


class _Slow:
    def __init__(self, name):
        self.name = name

    def generate(self, prompt, seed=0):
        time.sleep(0.05)
        return {"copy": self.name, "prompt": prompt}


def test_the_router_keeps_every_copy_busy():
    router = PairRouter([_Slow(0), _Slow(1), _Slow(2), _Slow(3)], ["cuda:0", "cuda:1", "cuda:2", "cuda:3"],
                        first=6)
    out = []
    threads = [threading.Thread(target=lambda i=i: out.append(router.generate(f"p{i}"))) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o["prompt"] for o in out) == sorted(f"p{i}" for i in range(8))
    assert router.served == [2, 2, 2, 2]
    assert router._busy == [0, 0, 0, 0]


def test_the_router_stops_sending_calls_to_a_copy_whose_process_is_gone():
    """A copy whose process died answers at once (ConnectionRefusedError), so least-busy routing
    sent it most calls, each a failed row; it is now left out, its calls served by the others."""
    class Gone:
        def generate(self, prompt, seed=0):
            raise ConnectionRefusedError(111, "Connection refused")

    router = PairRouter([_Slow(0), Gone(), _Slow(2)], ["cuda:0", "cuda:1", "cuda:2"], first=1)
    out = [router.generate(f"p{i}") for i in range(6)]
    assert [o["prompt"] for o in out] == [f"p{i}" for i in range(6)] and router.dead == {1}
    assert router.served[1] == 1 and router._busy == [0, 0, 0]
    class Cut:  # a copy whose process died in the middle of a call: its connection closes
        def generate(self, prompt, seed=0):
            raise EOFError

    router = PairRouter([Cut(), _Slow(1)], ["cuda:0", "cuda:1"])
    assert [router.generate(f"p{i}")["copy"] for i in range(3)] == [1, 1, 1] and router.dead == {0}
    alone = PairRouter([Gone()], ["cuda:0"])  # the last one gone, and every call after: the worker ends
    for _ in range(2):
        with pytest.raises(PairGone, match=r"every copy of the pair is gone \(1 of 1\)"):
            alone.generate("p")


def test_the_router_starts_again_a_copy_that_served_and_then_went():
    """A copy's process ends with the SDK process that spawned it (or its lost GPU): a copy that had
    served is started again (by this process) and the call goes to it; one that went before serving
    any, or whose new start fails, is left out."""
    class Once:  # serves, then its process is gone
        calls = 0

        def generate(self, prompt, seed=0):
            Once.calls += 1
            if Once.calls > 1:
                raise EOFError
            return {"copy": "first", "prompt": prompt}

    started = []

    def restart(k):
        started.append(k)
        return _Slow(f"again{len(started)}")

    router = PairRouter([Once()], ["cuda:0"], restart=restart)
    assert [router.generate(f"p{i}")["copy"] for i in range(3)] == ["first", "again1", "again1"]
    assert started == [0] and not router.dead and router._busy == [0]

    class Gone:
        def generate(self, prompt, seed=0):
            raise ConnectionRefusedError(111, "Connection refused")

    started.clear()
    router = PairRouter([Gone(), _Slow(1)], ["cuda:0", "cuda:1"], restart=restart)  # never served: not again
    assert router.generate("p")["copy"] == 1 and router.dead == {0} and started == []

    def fails(k):
        raise RuntimeError("Shared Server Process died unexpectedly with exit code 1")

    Once.calls = 0
    router = PairRouter([Once()], ["cuda:0"], restart=fails)
    assert router.generate("p")["copy"] == "first"
    with pytest.raises(PairGone):
        router.generate("p")
    assert router.dead == {0}


def test_static_caches_are_counted_in_their_allocation_steps(tmp_path, tokenizer, saved_pairs):
    """With CUDA graphs a decoder-only row's cache is allocated in steps of 512 columns."""
    from pipeline.fit import graph_bytes, launcher_config, row_tokens
    from specdec_core.graphs import CAPACITY_STEP

    target = _big_target(tmp_path, tokenizer, layers=2)
    config = launcher_config(str(target), False)
    base = ["--input", "p", "--output", "o", "--target_model", str(target), "--drafter", "none",
            "--max_new_tokens", "100", "--num_speculative_tokens", "4"]
    assert row_tokens(SpecDecOptions([*base, "--cuda_graphs", "off"]), config, 30) == 135
    assert row_tokens(SpecDecOptions(base), config, 30) == CAPACITY_STEP
    assert row_tokens(SpecDecOptions(base), config, 600) == 2 * CAPACITY_STEP
    assert row_tokens(SpecDecOptions([*base, "--device_map", "auto"]), config, 30) == 135  # split: eager
    # An encoder-decoder's cross-attention and self-attention buffers grow in steps each.
    t5 = launcher_config(str(saved_pairs["t5"][0]), False)
    assert row_tokens(SpecDecOptions([*base, "--batch_size", "4"]), t5, 10) == 2 * CAPACITY_STEP
    assert row_tokens(SpecDecOptions([*base, "--cuda_graphs", "off"]), t5, 10) == 115
    # 507 new tokens and a round's 5 fill 512 output columns; a one-token pass widened to two
    # (LED's) writes one more, so the output buffer takes a second step
    def edge(new_tokens: int) -> int:
        return row_tokens(SpecDecOptions([*base[:-4], "--max_new_tokens", str(new_tokens),
                                          "--num_speculative_tokens", "4"]), t5, 10)
    assert (edge(506), edge(507)) == (2 * CAPACITY_STEP, 3 * CAPACITY_STEP)
    # The graphs' logits: every verify width 1..gamma+1, in the model's dtype, plus a float32 copy.
    vocab = config.vocab_size
    assert graph_bytes(SpecDecOptions([*base, "--batch_size", "4"]), config, 4, torch.bfloat16) == \
        4 * vocab * (15 * 2 + 5 * 4)
    assert graph_bytes(SpecDecOptions([*base, "--cuda_graphs", "off"]), config, 4, torch.bfloat16) == 0
    # Batched, new rows are prefilled together (up to 16 a pass) through a cache of the longest
    # prompt's padded width.
    from pipeline.fit import prefill_bytes, weights_need
    from specdec_core.placement import kv_bytes

    batched = SpecDecOptions([*base, "--batch_size", "4"])
    assert prefill_bytes(batched, config, 600, torch.bfloat16) == kv_bytes(config, 4, 1024, 0, torch.bfloat16)
    wide = SpecDecOptions([*base, "--batch_size", "64"])
    assert prefill_bytes(wide, config, 600, torch.bfloat16) == kv_bytes(config, 16, 1024, 0, torch.bfloat16)
    assert prefill_bytes(SpecDecOptions(base), config, 600, torch.bfloat16) == 0  # batch 1: no second cache
    assert prefill_bytes(SpecDecOptions([*base, "--batch_size", "4", "--cuda_graphs", "off"]), config, 600,
                         torch.bfloat16) == 0
    # An encoder-decoder's prefill cache: its cross-attention columns, 600 padded to 1024.
    assert prefill_bytes(batched, t5, 600, torch.bfloat16) == kv_bytes(t5, 4, 1024, 0, torch.bfloat16)
    # Four rows of 600 + 105 columns in 1024, and four prefill rows of 600 padded to 1024 (bfloat16 for a GPU).
    assert weights_need(batched, config, rows=4, prompt_tokens=600).target_kv == \
        kv_bytes(config, 8, 1024, 0, torch.bfloat16)


def test_a_gs_model_of_its_own_code_skips_the_fit_check(monkeypatch, caplog):
    """The launcher reads a gs:// model's config.json alone: a config class of the model's own code
    (auto_map) cannot be built there, so the check is skipped, said so, instead of a refused job."""
    import io

    import pipeline.fit as fit

    config = {"model_type": "mygpt2", "auto_map": {"AutoConfig": "configuration_mygpt2.MyGPT2Config"}}
    monkeypatch.setattr(fit.FileSystems, "open", lambda path: io.BytesIO(json.dumps(config).encode()))
    monkeypatch.setattr(fit, "longest_prompt_tokens", lambda opts: (10, "test"))
    opts = SpecDecOptions(["--input=x", "--output=y", "--target_model=gs://b/custom", "--drafter=none",
                           "--device=cuda", "--trust_remote_code", "--accelerator=type:nvidia-l4;count:1"])
    with caplog.at_level(logging.INFO, logger="pipeline.fit"):
        assert check_fit(opts) is None
    assert "fit check skipped: gs://b/custom's config is its own code (auto_map)" in caplog.text
    config["auto_map"] = None  # an unknown model type without code of its own is still an error
    with pytest.raises(ValueError, match="mygpt2"):
        check_fit(opts)
