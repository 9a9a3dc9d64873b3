"""A model split over devices by accelerate (a balanced device map, then its dispatch hooks), and
copies of the pair in processes of their own, on the CPU: the map's layout, the hooks on every
block, outputs identical to the unsplit model at batch 1 and in a batch, and a router over two
spawned copies."""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest
import torch

from specdec_core.loading import balanced_map, load_model
from specdec_core.placement import Copy
from specdec_core.plan import graph_support
from specdec_core.text import GeneratorSpec, TextGenerator
from tests.tiny_models import make_model

PROMPTS = ["The quick brown fox", "def add(a, b):\n", "Hello world!", "Summarize: the committee met"]
ROOMY = 10**12  # bytes a device may hold: no limit for these models


def _bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _on(device_map: dict, name: str):
    """The device of module `name` under a map (whose keys may be the modules holding it)."""
    return device_map[max((k for k in device_map if k in ("", name) or name.startswith(k + ".")), key=len)]


def test_blocks_go_over_the_devices_in_order_and_balanced(tokenizer):
    model = make_model("llama", tokenizer, seed=1, layers=6)
    device_map = balanced_map(model, [ROOMY, ROOMY])
    layers = [_on(device_map, f"model.layers.{i}") for i in range(6)]
    assert layers == [0, 0, 0, 1, 1, 1]  # contiguous, about equal bytes on each
    assert device_map["model.embed_tokens"] == 0  # ids in on the first device
    # bytes beside the first device's share (the draft) push layers to the second
    draft = balanced_map(model, [ROOMY, ROOMY], first_extra=2 * _bytes(model.model.layers[0]))
    assert [_on(draft, f"model.layers.{i}") for i in range(6)] == [0, 1, 1, 1, 1, 1]
    heavy = balanced_map(model, [ROOMY, ROOMY], first_extra=10**9)  # more than a share: the embeddings alone
    assert heavy["model.embed_tokens"] == 0 and all(_on(heavy, f"model.layers.{i}") == 1 for i in range(6))
    # a first device that cannot hold the embeddings beside the draft, or devices too small: refused
    with pytest.raises(ValueError, match="input embeddings do not fit the first device"):
        balanced_map(model, [ROOMY, ROOMY], first_extra=ROOMY)
    with pytest.raises(ValueError, match="does not fit 2 device"):
        balanced_map(model, [_bytes(model) // 4] * 2)
    t5 = make_model("t5", tokenizer, seed=1, layers=3)
    t5_map = balanced_map(t5, [ROOMY] * 3)
    order = [_on(t5_map, f"{half}.block.{i}") for half in ("encoder", "decoder") for i in range(3)]
    assert order == sorted(order) and set(order) == {0, 1, 2}  # the encoder's blocks first
    assert t5_map["shared"] == t5_map["lm_head"] == 0  # tied weights together, on the first


def test_every_block_takes_its_inputs_through_accelerate_hooks(saved_pairs, monkeypatch):
    """On one CPU the devices cannot differ, so the hooks' work is recorded instead: each decoder
    layer's inputs go to its device through its own hook, and the logits come back to the ids'."""
    from accelerate.hooks import AlignDevicesHook

    target, _ = saved_pairs["llama"]
    model = load_model(str(target), torch.device("cpu"), torch.float32, devices=("cpu", "cpu"))
    assert set(model.hf_device_map.values()) == {"cpu"} and "model.layers.0" in model.hf_device_map
    hooked = []
    real = AlignDevicesHook.pre_forward

    def spy(self, module, *args, **kwargs):
        hooked.append((module, str(self.execution_device)))
        return real(self, module, *args, **kwargs)

    monkeypatch.setattr(AlignDevicesHook, "pre_forward", spy)
    with torch.no_grad():
        logits = model(torch.tensor([[5, 6, 7]])).logits
    for layer in model.model.layers:  # each decoder layer's arguments went through its hook
        assert (layer, "cpu") in hooked
    assert hooked[0][0] is model  # the root's hook, which brings the outputs back
    assert logits.device == model.device
    assert graph_support(model) == "is split over several devices (a graph replays on one)"


def _spec(target, draft, **kw) -> GeneratorSpec:
    return GeneratorSpec(str(target), str(draft), max_new_tokens=10, device="cpu", gamma_policy="fixed",
                         cpu_kernels="stock", **kw)


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_a_split_target_gives_the_unsplit_output(saved_pairs, kind):
    target, draft = saved_pairs[kind]
    whole = TextGenerator.load(_spec(target, draft, batch_size=3))
    split = TextGenerator.load(_spec(target, draft, batch_size=3, devices=("cpu", "cpu")))
    model = split.engine.target
    assert hasattr(model, "_hf_hook") and len(model.hf_device_map) > 1
    for prompt in PROMPTS:
        assert split.generate(prompt, 7)["token_ids"] == whole.generate(prompt, 7)["token_ids"]
    items = [(p, i) for i, p in enumerate(PROMPTS)]
    got, want = split.generate_batch(items), whole.generate_batch(items)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in want]


def test_load_model_splits_only_over_several_devices(saved_pairs):
    target, _ = saved_pairs["gpt2"]
    one = load_model(str(target), torch.device("cpu"), torch.float32, devices=("cpu",))
    assert not hasattr(one, "hf_device_map") and not any(hasattr(m, "_hf_hook") for m in one.modules())
    two = load_model(str(target), torch.device("cpu"), torch.float32, devices=("cpu", "cpu"))
    assert sum(hasattr(m, "_hf_hook") for m in two.modules()) >= 2


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
    tag = f"test-copies-{os.getpid()}"  # (one per session: Beam keeps its files in the temp folder of its import)
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


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_copy_whose_process_went_after_serving_is_started_again(saved_pairs, tmp_path, monkeypatch):
    """A spawned copy ends with the SDK process that started it (Beam's pact), or with its lost GPU: a router
    whose calls it had served starts it again itself and the call is answered as before (where every other
    process's rows would fail with PairGone)."""
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # MultiProcessShared's address files
    monkeypatch.setattr(tempfile, "tempdir", None)
    from apache_beam.utils.multi_process_shared import MultiProcessShared

    from transforms.copies import copy_tag, start_copies, stop_copies

    target, draft = saved_pairs["llama"]
    copies, tag = [Copy(("cpu",))], f"test-restart-{os.getpid()}"
    try:
        router = start_copies(_spec(target, draft), copies, tag)
        first, handle = router.generate(PROMPTS[0], 1), router.copies[0]
        try:  # the copy's process ends as on its parent's end: its address removed, then os._exit
            MultiProcessShared(dict, tag=copy_tag(tag, 0, copies[0]), always_proxy=True).unsafe_hard_delete()
        except (ConnectionError, EOFError):
            pass
        assert router.generate(PROMPTS[0], 1)["token_ids"] == first["token_ids"]
        assert router.copies[0] is not handle and not router.dead
    finally:
        stop_copies(copies, tag)
