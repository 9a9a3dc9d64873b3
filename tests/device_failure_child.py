"""Run by tests/test_pipeline.py in a process of its own: `pipeline.run` whose engines meet an
error that CUDA keeps for every later call (a stand-in: `torch.AcceleratorError`, as an illegal
memory access raises), or whose every copy of the pair is gone (`pair`), which must end the
worker process instead of failing every row."""

import os
import sys

import torch

from pipeline.run import main
from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.engine import SpeculativeGenerator
from transforms.copies import PairGone


def broken(*args, **kwargs):
    if os.environ.get("STANDIN") == "pair":
        raise PairGone("every copy of the pair is gone (2 of 2)")
    raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered (a stand-in)")


SpeculativeGenerator.generate = broken
BatchSpeculativeGenerator.generate_many = broken
sys.exit(main(sys.argv[1:]))
