from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never reach a model hub

import pytest
import torch

from tests.tiny_models import build_tokenizer, make_model, perturbed_copy, save_pair

torch.set_num_threads(1)  # tiny models: one thread is fastest, and CI has 2 cores


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
