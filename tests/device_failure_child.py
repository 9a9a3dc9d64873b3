"""Run by tests/test_pipeline.py in a process of its own: `pipeline.run` whose engines meet a CUDA
error (a stand-in: `torch.AcceleratorError`, as an illegal memory access raises), after which the
device fails every call (`STANDIN=device`: the probe fails too), or whose every copy of the pair is
gone (`pair`): either ends the process."""

import os
import sys

import torch

from pipeline.run import main
from specdec_core import placement
from specdec_core.batch_engine import BatchSpeculativeGenerator
from specdec_core.engine import SpeculativeGenerator
from transforms.copies import PairGone

STANDIN = os.environ["STANDIN"]


def broken(*args, **kwargs):
    if STANDIN == "pair":
        raise PairGone("every copy of the pair is gone (2 of 2)")
    raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered (a stand-in)")


SpeculativeGenerator.generate = broken
BatchSpeculativeGenerator.generate_many = broken
placement.device_works = lambda devices: STANDIN != "device"
sys.exit(main(sys.argv[1:]))
