"""Run by tests/test_cuda.py in a process of its own (an illegal memory access leaves CUDA unusable
in the process that made it): decode, clear cuBLAS's workspaces and give their memory back to the
driver as CUDA graph trees (torch.compile's "reduce-overhead") do when they record, decode again
through the same graphs. Prints "same" when both decodes agree. `control` keeps the engine from
clearing around its own captures, to show that the check can fail on this machine."""

import sys

import torch

from pipeline.bench.gpu import SHAPES, build_pair
from specdec_core.drafters import ModelDrafter
from specdec_core.engine import SpeculativeGenerator

clear = torch._C._cuda_clearCublasWorkspaces
if sys.argv[1:] == ["control"]:
    torch._C._cuda_clearCublasWorkspaces = lambda: None
target, draft = build_pair(SHAPES["tinyllama-1.1b"], torch.device("cuda"), torch.bfloat16)
engine = SpeculativeGenerator(target, ModelDrafter(draft, chain=True), num_speculative_tokens=4, max_new_tokens=32)
prompt = list(range(5, 133))
first = engine.generate(prompt).tokens
clear()
torch.cuda.empty_cache()
again = engine.generate(prompt).tokens
torch.cuda.synchronize()
print("same" if first == again else "differ", engine.static.passes.captures, "captures")
