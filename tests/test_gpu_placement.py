"""On a GPU machine: one copy of the pair per GPU (here N = the GPUs present, 1 on a one-GPU
machine), `--device_map auto` on one GPU (splits nothing, still runs), and a real split over two
devices (the GPU and the CPU, which accelerate offloads to), every output equal to the pair on one
device. Skipped on a CPU."""

from __future__ import annotations

import dataclasses
import glob

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from specdec_core.placement import Copy, visible_gpus
from specdec_core.text import GeneratorSpec, TextGenerator
from transforms.model_handler import SpecDecModelHandler

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = ["The quick brown fox", "def add(a, b):\n", "Hello world!", "Summarize: the committee met"]


def _spec(target, draft, **kw) -> GeneratorSpec:
    # fp32: on a GPU, token for token the same in a k-token pass as in k 1-token passes
    return GeneratorSpec(str(target), str(draft), max_new_tokens=10, device="cuda", dtype="float32",
                         gamma_policy="fixed", **kw)


def test_one_copy_per_gpu_in_processes_of_their_own(saved_pairs, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    from transforms.copies import start_copies, stop_copies

    target, draft = saved_pairs["llama"]
    spec = _spec(target, draft)
    handler = SpecDecModelHandler(spec, large_model=True)
    copies = handler.copies()
    assert copies == [Copy((g.name,)) for g in visible_gpus()]
    tag = f"gpu-copies-{tmp_path.name}"
    try:
        router = start_copies(spec, copies, tag)  # the multi-GPU path, with N = the GPUs here
        alone = TextGenerator.load(dataclasses.replace(spec, devices=("cuda:0",)))
        for i, prompt in enumerate(PROMPTS):
            assert router.generate(prompt, i)["token_ids"] == alone.generate(prompt, i)["token_ids"]
        assert sum(router.served) == len(PROMPTS)
    finally:
        stop_copies(copies, tag)


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_a_target_split_over_the_gpu_and_the_cpu(saved_pairs, kind):
    """Two real devices through accelerate's hooks: the GPU's modules run there, the CPU's are
    offloaded (their weights brought to the GPU for each pass), the logits come out on the GPU."""
    target, draft = saved_pairs[kind]
    whole = TextGenerator.load(_spec(target, draft, batch_size=3, devices=("cuda:0",)))
    split = TextGenerator.load(_spec(target, draft, batch_size=3, devices=("cuda:0", "cpu")))
    assert set(split.engine.target.hf_device_map.values()) == {"cuda:0", "cpu"}
    assert split.engine.target.device == torch.device("cuda", 0)
    for i, prompt in enumerate(PROMPTS):
        assert split.generate(prompt, i)["token_ids"] == whole.generate(prompt, i)["token_ids"]
    items = [(p, i) for i, p in enumerate(PROMPTS)]
    got, want = split.generate_batch(items), whole.generate_batch(items)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in want]


def test_device_map_auto_on_one_gpu_splits_nothing_and_runs(saved_pairs, tmp_path):
    from pipeline.run import main

    target, draft = saved_pairs["llama"]
    src = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": list(range(len(PROMPTS))), "prompt": PROMPTS}), src)
    out = tmp_path / "out" / "gens"
    assert main(["--input", str(src), "--output", str(out), "--target_model", str(target), "--draft_model",
                 str(draft), "--max_new_tokens", "10", "--device", "cuda", "--device_map", "auto",
                 "--dtype", "float32", "--gamma_policy", "fixed"]) == 0
    rows = pa.concat_tables(pq.read_table(f) for f in sorted(glob.glob(f"{out}-0*.parquet"))).to_pylist()
    alone = TextGenerator.load(_spec(target, draft, devices=("cuda:0",)))
    assert len(rows) == len(PROMPTS)
    for row in rows:
        assert row["generation"] == alone.generate(PROMPTS[row["id"]], row["seed"])["generation"]


def test_a_split_models_hidden_states_reach_the_cpu_whole():
    """A module's inputs moved to the CPU as accelerate's hooks move them (`AlignDevicesHook`, a
    blocking copy) hold what the GPU wrote: the copy waits for the GPU's queued work (a non-blocking
    copy to the CPU returns before its data lands)."""
    from accelerate.utils import send_to_device

    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda._sleep(50_000_000)  # the GPU busy, the next kernel queued behind it
    x.add_(1)
    assert bool((send_to_device(x, torch.device("cpu")) == 1).all())
