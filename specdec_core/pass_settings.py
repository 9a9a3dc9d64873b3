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
    # An encoder-decoder's encoder passes too (the plan turns them off for an encoder that takes no 4D mask).
    graph_encoder: bool = True
    # Prompts' prefills (one logit kept) compiled too; None: in the batch engine's slots (faster there), not at batch 1.
    compile_prefills: bool | None = None
    # Rows admitted together beyond this many prefill in padded eager passes, not graphs (None: never).
    graph_prefill_rows: int | None = None
    # Freed slots wait until this many are free (or every waiting prompt fits) before new rows enter, in fewer prefill
    # passes; 1: at once (on a CPU, waiting cost more rounds than it saved in prefills).
    admit_together: int = 1
    # Passes' inputs copied to the GPU from pinned memory without waiting for it (CUDA only).
    pinned_inputs: bool = False
    # Let PyTorch choose cuDNN attention on CUDA (the engines leave it out: `attention`).
    cudnn_attention: bool = False


DEFAULT = PassSettings()
