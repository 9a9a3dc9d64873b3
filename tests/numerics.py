"""How close two computations of the same logits must be, on any CPU or GPU.

A k-token forward pass and k one-token passes compute the same function in a different order:
GEMM against GEMV, other blocking, other SIMD widths (AVX2, AVX-512, AMX, CUDA). Float addition
is not associative, so the results differ by rounding that grows with the size of the numbers
added up, not with the size of each logit: a logit near 0 carries the error of its whole dot
product. On a 2-core AMD EPYC (AVX2) the tiny test models' block and single-step logits, of
magnitude 10-20, differed by about 2e-4; on an AVX-512 Xeon by about 1e-6.

So the tolerance is relative to the largest logit compared (elementwise rtol alone would fail on
logits near zero): `rel` of the scale in absolute terms, with rtol 0. The thread count changes the
order too: T5's unscaled attention carries large hidden states, and its block and single-step
logits differed by 960 units in the last place of the largest logit with two or eight torch
threads on the EPYC (570 with one). For float32, 2500 units (3e-4 of the scale) leave more than
twice that for any CPU and thread count, and are still three orders of magnitude below what a
real bug does (a wrong position, mask or cache entry moves logits by O(1) of their scale).
Lower-precision dtypes get the same number of units in the last place.
"""

from __future__ import annotations

import torch

ULPS = 2500  # of the largest logit: see above


def logit_tolerance(reference: torch.Tensor) -> float:
    """Absolute tolerance for logits of `reference`'s dtype and magnitude."""
    eps = torch.finfo(reference.dtype).eps
    return ULPS * eps * float(reference.abs().max())


def assert_logits_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """The same logits computed in another order: equal up to rounding at their own scale."""
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=logit_tolerance(expected))
