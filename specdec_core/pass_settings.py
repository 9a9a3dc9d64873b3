"""How the passes over static caches run, beyond `--cuda_graphs` and `--torch_compile`.

One frozen object, given to an engine (and a model drafter, which owns its cache at batch 1),
which hands it to the caches it makes; nothing sets these on live objects. The job runs the
defaults; the GPU bench builds the other variants to measure them beside the defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PassSettings:
    # With graphs, prompts prefill through graphs of padded widths; False: eagerly at their width.
    graph_prefills: bool = True
    # Prompts' prefill passes (one logit kept) through torch.compile too, at a dynamic width.
    # None: with the compiled passes in the batch engine's slots (at B = 32 on an H200 its new
    # rows' prefills ran 1.33x faster compiled), not at batch 1 (not measured there).
    compile_prefills: bool | None = None
    # Rows admitted together beyond this many prefill in padded eager passes instead of
    # graphs (None: never).
    graph_prefill_rows: int | None = None
    # Passes' inputs copied to the GPU from pinned memory without waiting for it (CUDA only).
    pinned_inputs: bool = False
    # Let PyTorch choose cuDNN attention on CUDA (the engines leave it out: `attention`).
    cudnn_attention: bool = False


DEFAULT = PassSettings()
