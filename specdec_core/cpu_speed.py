"""Preparing a loaded model for fast batch-1 inference on CPU.

The stock fp32 path re-packs each weight on every call, so a k-token verify pass costs about twice one token.
`prepare_for_cpu` swaps every large `nn.Linear` for a `PrepackedLinear`: the dense weight for few rows, a copy
packed once for oneDNN (laid out for `pack_rows` rows) from `threshold_rows` rows on, the crossover timed on the
model's own linears at load (`packed_from_rows`). A draft (never a target) may also get bf16 linears
(`Bf16Linear`) or int8 ones (`quantize_draft`). Packed and stock paths differ only by summation order
(docs/performance.md, "What the engine does for speed").
"""

from __future__ import annotations

import logging
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

_LOG = logging.getLogger(__name__)


def prepack_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def bf16_native() -> bool:
    """Whether this CPU does bf16 natively (AVX512-BF16, AMX); emulated bf16 is slower than fp32."""
    try:
        return prepack_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


class PrepackedLinear(nn.Module):
    """y = x W^T + b, W packed once for oneDNN; below `threshold_rows` rows the stock kernels are as fast."""

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
        if rows < self.threshold_rows or x.dtype != self.weight.dtype or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, prepacked=oneDNN"


def _replace_linears(model: nn.Module, min_weight: int, make) -> list[nn.Module]:
    """Swap every plain `nn.Linear` of at least `min_weight` weights for `make(linear)`, in place."""
    made = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.numel() >= min_weight:
                made.append(make(child))
                setattr(parent, name, made[-1])
    return made


def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def packed_from_rows(linears: list[PrepackedLinear], max_rows: int = 4, reps: int = 5, margin: float = 0.85,
                     timer=_median_time, sample_bytes: int = 256 << 20) -> int:
    """The fewest input rows from which packed weights are 1/margin faster than stock on this CPU, else `max_rows`.
    Timed on the model's own linears, so weights stream from memory as in a forward; only the first `sample_bytes`
    (more than L3), so it takes under a second at any size. The margin keeps noise from flipping the choice."""
    if not linears:
        return max_rows
    with torch.no_grad():
        weights, size = [], 0
        for lin in linears:
            if size >= sample_bytes:
                break
            weights.append((lin.weight.detach(), lin.packed))
            size += lin.weight.numel() * lin.weight.element_size()

        def run(xs: dict, packed: bool) -> None:
            for w, pw in weights:
                if packed:
                    torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], pw, None, "none", [], "")
                else:
                    F.linear(xs[w.shape[1]], w)

        for rows in range(1, max_rows):
            xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w, _ in weights}
            run(xs, False), run(xs, True)  # warm-up
            t_stock = timer(lambda xs=xs: run(xs, False), reps)
            t_packed = timer(lambda xs=xs: run(xs, True), reps)
            _LOG.info("prepare_for_cpu: %d rows: stock %.2f ms, packed %.2f ms", rows, 1e3 * t_stock, 1e3 * t_packed)
            if t_packed < margin * t_stock:
                return rows
    return max_rows


def prepare_for_cpu(model: nn.Module, *, threshold_rows: int | None = None, pack_rows: int = 8,
                    min_weight: int = 1_000_000) -> nn.Module:
    """Make `model` (fp32 or bf16, CPU, eval) faster for batch-1 decoding, in place and idempotently; returns it.
    fp32: only linears of at least `min_weight` weights (small ones stay in cache, where stock kernels are as fast),
    used from `threshold_rows` rows (None: timed). bf16 (needs native bf16): every linear, packed for one row, used
    at every row count (stock bf16 was slower at every shape). Still an HF model, but saving it is not supported."""
    params = list(model.parameters())
    if not params or params[0].device.type != "cpu" or params[0].dtype not in (torch.float32, torch.bfloat16):
        return model
    if not prepack_available():
        _LOG.info("prepare_for_cpu: oneDNN prepacking unavailable, model left as is")
        return model
    if params[0].dtype == torch.bfloat16:
        if not bf16_native():
            _LOG.info("prepare_for_cpu: no native bf16 on this CPU, bf16 model left as is")
            return model
        threshold_rows, pack_rows, min_weight = 1, 1, 0
    packed = _replace_linears(model, min_weight, lambda lin: PrepackedLinear(lin, threshold_rows or 4, pack_rows))
    if threshold_rows is None:
        threshold_rows = packed_from_rows(packed)
        for lin in packed:
            lin.threshold_rows = threshold_rows
    _LOG.info("prepare_for_cpu: %d linear layers prepacked for oneDNN, used from %s input rows", len(packed),
              threshold_rows)
    return model


class Bf16Linear(nn.Module):
    """A draft's fp32 linear with a bf16 oneDNN-packed copy of its weight: half the bytes per step, fp32 in and out."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # kept (shared) so ties and HF's accessors still see a weight
        with torch.no_grad():
            self.bias16 = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().to(torch.bfloat16), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), self.packed, self.bias16, "none", [], "")
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights=bf16 (oneDNN)"


BF16_MIN_WEIGHT = 1_000_000  # smaller linears are faster in fp32, casts included (docs/performance.md)


def bf16_linears(model: nn.Module, min_weight: int = BF16_MIN_WEIGHT) -> int:
    """Swap a CPU draft's large fp32 linears for `Bf16Linear` in place (native bf16 only); returns how many."""
    params = list(model.parameters())
    if (not params or params[0].device.type != "cpu" or params[0].dtype != torch.float32
            or not bf16_native()):
        return 0
    count = len(_replace_linears(model, min_weight, Bf16Linear))
    _LOG.info("bf16_linears: %d linear layers of the draft hold bf16 weights", count)
    return count


def quantize_draft(model: nn.Module) -> nn.Module:
    """A draft with int8 dynamic linears (only proposals change): a new module, or the input if unsupported."""
    try:
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    except Exception as e:  # noqa: BLE001 (quantisation backends vary by build)
        _LOG.warning("quantize_draft: int8 dynamic quantisation unavailable (%s); draft left in fp32", e)
        return model


DRAFT_DTYPES = ("auto", "same", "float32", "bfloat16", "int8")


def draft_in_dtype(model: nn.Module, name: str, sampled: bool = False) -> nn.Module:
    """The draft in the dtype `--draft_dtype` names (docs/flags.md): a new module for int8, else changed in place.
    Its numerics change what is proposed, never what is accepted, but which sample a seed gives: `auto` leaves a
    `sampled` job's draft as loaded (bf16 linears only on some CPUs would give other samples there)."""
    if name == "auto" and not sampled:
        bf16_linears(model)
    if name in ("auto", "same"):
        return model
    if name not in DRAFT_DTYPES:
        raise ValueError(f"--draft_dtype {name!r}: expected one of {', '.join(DRAFT_DTYPES)}")
    if name == "int8":
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise ValueError(f"--draft_dtype int8 is dynamic quantization, CPU only (the draft is on {device})")
        return quantize_draft(model.float())
    return model.to(getattr(torch, name))


def packed_threshold(model: nn.Module) -> int | None:
    """The row count from which `model`'s packed linears are used (None: nothing packed)."""
    return next((m.threshold_rows for m in model.modules() if isinstance(m, PrepackedLinear)), None)
