"""Which scaled-dot-product attention kernels the engines let a model use on a GPU.

PyTorch's cuDNN attention builds an execution plan for every new (query length, key length)
shape and caches it. Plain decoding meets few shapes (one token over a cache that grows by
one), but a speculative job meets new ones all the time: verify passes of 1..gamma+1 tokens
over caches that grow by however much each round accepted, draft passes of one or two tokens,
every prompt its own length. On an H200 in bf16 that made the draft a net loss
(docs/performance.md has the figures). Flash and memory-efficient attention need no plan, so
the engines' passes run with cuDNN attention switched off; every other backend stays allowed,
in PyTorch's own order. Only attention's kernel choice changes: the numbers are the same
softmax(QK^T)V, rounded by another kernel.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# The engines' choice; the GPU benchmark sets it to True to measure what cuDNN attention costs.
CUDNN_ATTENTION = False

_WITHOUT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_kernels(device: torch.device) -> contextlib.AbstractContextManager:
    """A context for a generation's model passes on `device`: on CUDA, attention without cuDNN
    (unless `CUDNN_ATTENTION`); elsewhere nothing changes."""
    if device.type != "cuda" or CUDNN_ATTENTION:
        return contextlib.nullcontext()
    return sdpa_kernel(_WITHOUT_CUDNN)
