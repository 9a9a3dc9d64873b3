from __future__ import annotations

import functools
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never reach a model hub

import pytest
import torch

from tests.tiny_models import build_tokenizer, make_model, perturbed_copy, save_pair

torch.set_num_threads(1)  # tiny models: one thread is fastest, and CI has 2 cores


def _process_state() -> dict[str, object]:
    """What one test could change for every test after it in the same worker process."""
    return {
        "torch threads": torch.get_num_threads(),
        "default dtype": torch.get_default_dtype(),
        "grad mode": torch.is_grad_enabled(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
        "mkldnn": torch.backends.mkldnn.enabled,
        # torch.compile notes a constant of its own in the environment, once per process
        "environment": {k: v for k, v in os.environ.items()
                        if k != "PYTEST_CURRENT_TEST" and not k.startswith("_TORCHINDUCTOR_")},
    }


@pytest.fixture(autouse=True)
def _leaves_the_process_as_it_found_it():
    """Fails a test that changes process-wide state and restores it: on 2 cores a second torch thread
    left by a program's main() called in-process slowed the next tests in that worker several times,
    and changed their rounding."""
    before = _process_state()
    yield
    after = _process_state()
    changed = [k for k in before if before[k] != after[k]]
    if not changed:
        return
    torch.set_num_threads(before["torch threads"])
    torch.set_default_dtype(before["default dtype"])
    torch.set_grad_enabled(before["grad mode"])
    torch.use_deterministic_algorithms(before["deterministic algorithms"])
    torch.set_float32_matmul_precision(before["float32 matmul precision"])
    torch.backends.mkldnn.enabled = before["mkldnn"]
    env = before["environment"]
    if env != after["environment"]:
        diff = sorted(k for k in env.keys() | after["environment"].keys() if env.get(k) != after["environment"].get(k))
        for k in diff:
            if k in env:
                os.environ[k] = env[k]
            else:
                os.environ.pop(k, None)
        changed[changed.index("environment")] = f"environment ({', '.join(diff)})"
    pytest.fail(f"the test changed process-wide state it did not restore: {'; '.join(changed)}")


@pytest.fixture(autouse=True)
def _compiles_through_aot_eager(request):
    """`torch.compile` through dynamo and AOT autograd only (backend "aot_eager"), except in tests
    marked `inductor` or `dynamo`: what our code meets in a compile (tracing through the hooks, guards,
    recompiles, functionalized in-place writes to the buffers) is all there, and a tiny model's
    cold inductor compile (C++ codegen, g++) cost 2-3x the rest of its test on 2 cores. The tests
    marked `inductor` keep the real backend's numbers: Llama at batch 1 and batched, and the CUDA tests.
    Those marked `dynamo` (backend "eager") check what a family brings to a compile, its hooks and
    per-row positions traced by dynamo; AOT autograd's part, the writes into the buffers, is the same
    code for every family, and took half of such a test's time."""
    if request.node.get_closest_marker("inductor") is not None:
        yield
        return
    backend = "eager" if request.node.get_closest_marker("dynamo") is not None else "aot_eager"
    real = torch.compile  # (not monkeypatch: its undoing of a test's own patches must come before the guard's check)
    torch.compile = functools.partial(real, backend=backend)
    try:
        yield
    finally:
        torch.compile = real


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def models(tokenizer):
    """kind -> (target, partly agreeing draft), in memory."""
    out = {}
    for kind in ("llama", "gpt2", "t5", "bart"):
        target = make_model(kind, tokenizer, seed=1)
        out[kind] = target, perturbed_copy(target, 0.05, seed=2)
    return out


@pytest.fixture(scope="session")
def saved_pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """kind -> (target dir, draft dir), saved as ordinary Hugging Face directories."""
    root = tmp_path_factory.mktemp("models")
    return {kind: save_pair(root, kind, noise=0.05) for kind in ("llama", "gpt2", "t5", "bart")}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first, in their own order, then the rest: with one worker per core, the run
    ends on many short tests instead of one worker finishing a long one alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
