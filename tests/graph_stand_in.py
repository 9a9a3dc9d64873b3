"""A stand-in for CUDA graphs on a CPU: what the engines rely on in a capture, checked without a GPU.

A capture records the kernels of one pass and a replay runs them again over the same addresses;
Python does not run in a replay. So the stand-in records the pass's ATen ops once (a
`TorchDispatchMode`: the ops a graph would hold, with the tensors they read from attributes
frozen as a capture freezes their addresses) and a replay runs only the recorded ops over the
static input, leaving its result in the same output tensor every time. Python branches are
frozen at the recording, a caller that forgets an input or keeps an output past the next replay
goes wrong here as on a GPU, and reading a tensor's value on the host (`item`, `tolist`) fails as
it does in a capture.

It replaced `make_fx`, which builds an FX graph of the same ops and spent about 0.25 s per
capture of a tiny model on proxies and code generation: most of the family tests' time.
"""

from __future__ import annotations

import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

_INPUT, _RESULT, _CONSTANT = 0, 1, 2
_recording = threading.local()
_tolist = torch.Tensor.tolist


def _tolist_unless_recording(self):
    """`tolist()` reads values without an ATen op a recording sees (JetMoE routes by
    `gates.sum(0).tolist()`); a capture fails on it, and so does the stand-in."""
    if getattr(_recording, "on", False):
        raise RuntimeError("a tensor's values read on the host (tolist) while capturing")
    return _tolist(self)


torch.Tensor.tolist = _tolist_unless_recording


_HOST_READS = {torch.ops.aten.is_nonzero, torch.ops.aten.equal}  # (bool(tensor), torch.equal)
_INDEXING = {torch.ops.aten.index, torch.ops.aten.index_put, torch.ops.aten.index_put_,
             torch.ops.aten._index_put_impl_}


def _reads_values(func, args) -> bool:
    """An op whose result's shape or value the host must read from the device (`item`, `nonzero`,
    indexing by a boolean mask, `unique`, ...): a CUDA graph capture fails on it. Indexing by
    integer tensors is fine in a capture."""
    if func.overloadpacket in _HOST_READS:
        return True
    if func.overloadpacket in _INDEXING:
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1])
    return torch.Tag.dynamic_output_shape in func.tags or torch.Tag.data_dependent_output in func.tags


class _Recorder(TorchDispatchMode):
    """Runs each op and notes it, its tensor arguments as the input, an earlier op's result, or a
    constant (a tensor the pass did not make: weights, cache buffers, tables)."""

    def __init__(self, static: torch.Tensor):
        super().__init__()
        self.static = static
        self.ops: list[tuple] = []
        self.where: dict[int, tuple[int, object]] = {}
        self.alive: list[torch.Tensor] = []  # (keeps every id seen unique while recording)
        self.results = 0

    def leaf(self, x) -> tuple[int, object]:
        if isinstance(x, torch.Tensor):
            if x is self.static:
                return self.where.get(id(x), (_INPUT, None))
            return self.where.get(id(x), (_CONSTANT, x))
        return _CONSTANT, x

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _reads_values(func, args):
            raise RuntimeError(f"{func} reads a tensor's values on the host while capturing")
        leaves, spec = tree_flatten((args, kwargs))
        self.ops.append((func, [self.leaf(x) for x in leaves], spec))
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.where[id(t)] = (_RESULT, self.results)
                self.alive.append(t)
                self.results += 1
        return out


class TracedGraph:
    """One recorded pass (`graphs.PassGraphs._record`'s stand-in): `replay()` writes its result
    into `out`."""

    def __init__(self, run, static: torch.Tensor):
        self.static = static
        recorder = _Recorder(static)
        _recording.on = True
        try:
            with recorder:
                result = run(static)
        finally:
            _recording.on = False
        self.ops = recorder.ops
        self.result = recorder.leaf(result)
        self.out = self._run().clone()
        self.replays = 0

    def _run(self) -> torch.Tensor:
        results: list[torch.Tensor] = []

        def value(kind: int, x):
            return self.static if kind == _INPUT else results[x] if kind == _RESULT else x

        for func, leaves, spec in self.ops:
            args, kwargs = tree_unflatten([value(kind, x) for kind, x in leaves], spec)
            results.extend(t for t in tree_flatten(func(*args, **kwargs))[0] if isinstance(t, torch.Tensor))
        return value(*self.result)

    def replay(self) -> None:
        self.out.copy_(self._run())
        self.replays += 1


def trace(self, run, static):
    """`PassGraphs._record` on a CPU: (graph, the tensor its replays write)."""
    graph = TracedGraph(run, static)
    return graph, graph.out
