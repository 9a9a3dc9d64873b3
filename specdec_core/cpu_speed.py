"""Preparing a loaded model for fast batch-1 inference on CPU.

Speculative decoding on CPU pays for verification: a k-token target pass runs the linear
layers as GEMMs, and the default fp32 path (MKL sgemm) re-packs each weight matrix on every
call, so k=4..8 tokens cost about twice one token (measured v(k) ~ 2). oneDNN can pack each
weight ONCE into its blocked layout; multi-token passes then stream the weights at close to
the one-token (GEMV) rate. `prepare_for_cpu` swaps every `nn.Linear` for a `PrepackedLinear`
that keeps the dense weight for inputs of 1-3 rows (where the default GEMV/small GEMM is
already at the memory-bandwidth limit) and a oneDNN-packed copy for 4 rows and more.
The packing is chosen for `pack_rows` input rows: oneDNN picks its blocked layout from that
hint, and a layout packed for 1 row runs 5-row inputs about 1.3x slower.
Measured on a 1024x2816 fp32 linear (2-core Xeon, quiet, microseconds per call at k = 1/4/5/8
rows; benchmarks/linear_paths.py), 1 thread: default 813/1586/1637/2113, packed for 1 row
856/1153/1193/1369, packed for 8 rows 888/906/926/1053 (v(5) 1.14); 2 threads: default
551/908/934/1157, packed for 8 rows 586/603/622/677. MKL-packed (torch.ops.mkl._mkl_linear) is
the same as default.

Exactness: both paths compute the same fp32 products; they differ from the default kernels
only by summation order (max |d logit| ~ 1e-5 on a 300M model), the same order of difference
that already exists between a 1-token and a k-token pass with stock kernels. Greedy equality
is a property of the engine (it takes the target's argmax of whichever pass it ran) and is
checked by the tests and by `python -m pipeline.bench` on every run.

`quantize_draft` makes a DRAFT cheaper (int8 dynamic linears). Never use it on a target: the
draft's numerics only change which tokens get proposed, never what is accepted.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F
from torch import nn

_LOG = logging.getLogger(__name__)


def prepack_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class PrepackedLinear(nn.Module):
    """y = x W^T + b with W packed once for oneDNN; one-row inputs keep the dense GEMV path."""

    def __init__(self, linear: nn.Linear, threshold_rows: int = 4, pack_rows: int = 8):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # shared with the original module: no copy
        self.bias = linear.bias
        self.threshold_rows = threshold_rows
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), pack_rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows < self.threshold_rows or x.dtype != torch.float32 or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, prepacked=oneDNN"


def prepare_for_cpu(model: nn.Module, *, prepack: bool = True, threshold_rows: int = 4,
                    pack_rows: int = 8, min_weight: int = 1_000_000) -> nn.Module:
    """Make `model` (fp32, on CPU, eval) faster for batch-1 decoding, in place; returns it.

    A no-op for models on other devices or dtypes, or where oneDNN is missing. Idempotent.
    Only linears with at least `min_weight` weights are packed: small ones stay in cache, where
    the default kernels are as fast (a 384x1024 model ran slower prepacked).
    The model stays a normal Hugging Face model (generate(), caches, logits_to_keep all work);
    only saving it afterwards is not supported.
    """
    params = list(model.parameters())
    if not params or params[0].device.type != "cpu" or params[0].dtype != torch.float32:
        return model
    if not prepack or not prepack_available():
        _LOG.info("prepare_for_cpu: oneDNN prepacking unavailable, model left as is")
        return model
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.numel() >= min_weight:
                setattr(parent, name, PrepackedLinear(child, threshold_rows, pack_rows))
                count += 1
    _LOG.info("prepare_for_cpu: %d linear layers prepacked for oneDNN", count)
    return model


def quantize_draft(model: nn.Module) -> nn.Module:
    """int8 dynamic quantisation of a draft's linear layers (exactness is unaffected: only the
    proposals change). Returns a new module; falls back to the input if unsupported."""
    try:
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    except Exception as e:  # noqa: BLE001 (quantisation backends vary by build)
        _LOG.warning("quantize_draft: int8 dynamic quantisation unavailable (%s); draft left in fp32", e)
        return model


DRAFT_DTYPES = ("same", "float32", "bfloat16", "int8")


def draft_in_dtype(model: nn.Module, name: str) -> nn.Module:
    """The draft in the dtype `--draft_dtype` names ("same": as loaded; "int8": dynamic int8
    linears, CPU only). Only the draft: its numerics change what is proposed, never what the
    target accepts, so greedy output stays identical and sampling exact. Returns a new module
    for int8 (the loaded one is left alone), the same module cast in place otherwise."""
    if name == "same":
        return model
    if name not in DRAFT_DTYPES:
        raise ValueError(f"--draft_dtype {name!r}: expected one of {', '.join(DRAFT_DTYPES)}")
    if name == "int8":
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise ValueError(f"--draft_dtype int8 is dynamic quantization, CPU only (the draft is on {device})")
        return quantize_draft(model.float())
    return model.to(getattr(torch, name))


def recommended_threads() -> int:
    """Threads for batch-1 decoding: all cores this process may use (decoding is bandwidth bound)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover (non-Linux)
        return max(1, os.cpu_count() or 1)
