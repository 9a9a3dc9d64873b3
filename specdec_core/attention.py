"""Which scaled-dot-product attention kernels the engines let a model use on a GPU.

PyTorch's cuDNN attention (its choice for bf16 on Hopper GPUs) builds an execution plan for
every new (query length, key length) shape before it caches it. Decoding meets new shapes all
the time: every step a longer cache, and in a speculative job verify passes of 1..gamma+1 tokens
over caches that grow by however much each round accepted, draft passes of one or two tokens,
prompts of every length. On an H200 in bf16 our engine took 78 ms per token with cuDNN attention
and 22 without, 53 and 8.9 with the draft, against 26 for Hugging Face `generate`
(docs/performance.md). Flash and
memory-efficient attention need no plan, so the engines run their passes with cuDNN attention
switched off; every other backend stays allowed, in PyTorch's own order. Only the kernel changes:
the numbers are the same softmax(QK^T)V, rounded by another kernel.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

_WITHOUT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_kernels(device: torch.device, cudnn: bool = False) -> contextlib.AbstractContextManager:
    """A context for a generation's model passes on `device`: on CUDA, attention without cuDNN
    (unless `cudnn`: `PassSettings.cudnn_attention`); elsewhere nothing changes."""
    if device.type != "cuda" or cudnn:
        return contextlib.nullcontext()
    return sdpa_kernel(_WITHOUT_CUDNN)
