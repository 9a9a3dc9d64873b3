"""How many tokens to draft in each round.

A policy starts one state per item (so nothing leaks between Beam elements); the engine
asks it for k before each round and reports how many drafts were accepted after it.
"""

from __future__ import annotations

from typing import Protocol


class GammaState(Protocol):
    def next(self) -> int: ...

    def update(self, drafted: int, accepted: int) -> None: ...


class GammaPolicy(Protocol):
    def start(self, gamma: int) -> GammaState: ...


class _Fixed:
    def __init__(self, gamma: int):
        self.gamma = gamma

    def next(self) -> int:
        return self.gamma

    def update(self, drafted: int, accepted: int) -> None:
        pass


class FixedGamma:
    """Always draft the configured number of tokens (the paper's setting)."""

    def start(self, gamma: int) -> GammaState:
        return _Fixed(gamma)


fixed_gamma = FixedGamma()
