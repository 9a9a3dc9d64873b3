"""A model split over devices with a hand-built device map (no `accelerate`), and copies of the
pair in processes of their own, on the CPU: the split's layout and hooks, outputs identical to
the unsplit model at batch 1 and in a batch, and a router over two spawned copies."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from specdec_core import device_map as dm
from specdec_core.loading import load_model
from specdec_core.placement import Copy
from specdec_core.text import GeneratorSpec, TextGenerator
from tests.tiny_models import make_model

PROMPTS = ["The quick brown fox", "def add(a, b):\n", "Hello world!", "Summarize: the committee met"]


def test_blocks_go_over_the_devices_in_order_and_balanced(tokenizer):
    model = make_model("llama", tokenizer, seed=1, layers=6)
    device_map = dm.build_device_map(model, ["a", "b"])
    layers = [device_map[f"model.layers.{i}"] for i in range(6)]
    assert layers == sorted(layers) and set(layers) == {"a", "b"}  # contiguous, both used
    for name in ("model.embed_tokens", "model.norm", "model.rotary_emb", "lm_head"):
        assert device_map[name] == "a"  # ids in and logits out on the first device
    # bytes beside the first device's share (the draft) push layers to the second
    heavy = dm.build_device_map(model, ["a", "b"], first_extra=10**9)
    assert all(heavy[f"model.layers.{i}"] == "b" for i in range(6))
    t5 = make_model("t5", tokenizer, seed=1, layers=3)
    t5_map = dm.build_device_map(t5, ["a", "b", "c"])
    order = [t5_map[f"encoder.block.{i}"] for i in range(3)] + [t5_map[f"decoder.block.{i}"] for i in range(3)]
    assert order == sorted(order) and set(order) == {"a", "b", "c"}  # the encoder's blocks first
    assert t5_map["shared"] == t5_map["lm_head"] == "a"


def test_every_placed_module_takes_its_inputs_on_its_device(tokenizer, monkeypatch):
    """On one CPU the devices cannot differ, so the hooks' moves are recorded instead."""
    model = make_model("llama", tokenizer, seed=1, layers=4)
    device_map = dm.build_device_map(model, ["cpu", "cpu"])
    dm.dispatch(model, device_map)
    hooked = {name for name in device_map if hasattr(model.get_submodule(name), dm.HOOK_ATTR)}
    assert {f"model.layers.{i}" for i in range(4)} | {"model.embed_tokens", "lm_head", "model.norm"} <= hooked
    moves = []
    real = dm._moved

    def spy(value, device):
        if isinstance(value, dict) and "position_embeddings" in value:
            moves.append(device)
        return real(value, device)

    monkeypatch.setattr(dm, "_moved", spy)
    with torch.no_grad():
        model(torch.tensor([[5, 6, 7]]))
    assert len(moves) == 4  # each decoder layer's keyword arguments went through its hook


def _spec(target, draft, **kw) -> GeneratorSpec:
    return GeneratorSpec(str(target), str(draft), max_new_tokens=10, device="cpu", gamma_policy="fixed",
                         cpu_kernels="stock", **kw)


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_a_split_target_gives_the_unsplit_output(saved_pairs, kind):
    target, draft = saved_pairs[kind]
    whole = TextGenerator.load(_spec(target, draft, batch_size=3))
    split = TextGenerator.load(_spec(target, draft, batch_size=3, devices=("cpu", "cpu")))
    model = split.engine.target
    assert any(hasattr(m, dm.HOOK_ATTR) for m in model.modules())
    for prompt in PROMPTS:
        assert split.generate(prompt, 7)["token_ids"] == whole.generate(prompt, 7)["token_ids"]
    items = [(p, i) for i, p in enumerate(PROMPTS)]
    got, want = split.generate_batch(items), whole.generate_batch(items)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in want]


def test_load_model_splits_only_over_several_devices(saved_pairs):
    target, _ = saved_pairs["gpt2"]
    one = load_model(str(target), torch.device("cpu"), torch.float32, devices=("cpu",))
    assert not any(hasattr(m, dm.HOOK_ATTR) for m in one.modules())
    two = load_model(str(target), torch.device("cpu"), torch.float32, devices=("cpu", "cpu"))
    assert sum(hasattr(m, dm.HOOK_ATTR) for m in two.modules()) >= 2


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_copies_in_their_own_processes_serve_every_call(saved_pairs, tmp_path, monkeypatch):
    """The multi-GPU layout on CPU "GPUs": two spawned processes, each a copy, every call answered
    as the pair alone answers it, both copies used."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # MultiProcessShared's address files
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    from transforms.copies import start_copies, stop_copies

    target, draft = saved_pairs["llama"]
    spec = _spec(target, draft)
    copies = [Copy(("cpu",)), Copy(("cpu",))]
    tag = f"test-copies-{tmp_path.name}"
    try:
        router = start_copies(spec, copies, tag)
        alone = TextGenerator.load(dataclasses.replace(spec, devices=("cpu",)))
        out: dict[int, dict] = {}
        prompts = PROMPTS * 2
        threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, router.generate(prompts[i], i)))
                   for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, prompt in enumerate(prompts):
            assert out[i]["token_ids"] == alone.generate(prompt, i)["token_ids"]
        assert all(n > 0 for n in router.served), router.served
    finally:
        stop_copies(copies, tag)
