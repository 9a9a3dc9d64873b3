"""Torch's thread count for a program's run: what the CPU programs (demo, bench, tune) set and give back."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch

P = ParamSpec("P")
R = TypeVar("R")


def recommended_threads() -> int:
    """Threads for batch-1 decoding: all cores this process may use (decoding is bandwidth bound)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover (non-Linux)
        return max(1, os.cpu_count() or 1)


def keeps_torch_threads(main: Callable[P, R]) -> Callable[P, R]:
    """For a program's `main`, which sets torch's thread count for its run: a caller in the same
    process (a test, a notebook) gets its own count back, not the program's."""

    @functools.wraps(main)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        threads = torch.get_num_threads()
        try:
            return main(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return run
