"""Which scaled-dot-product attention kernels the engines let a model use on a GPU.

cuDNN attention builds an execution plan for every new (query length, key length) shape, and decoding meets new
shapes all the time, so the engines run their passes with it switched off; every other backend stays allowed, in
PyTorch's own order, and only the kernel's rounding changes (docs/performance.md, "On a GPU").
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
