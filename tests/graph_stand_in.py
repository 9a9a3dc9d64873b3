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
capture of a tiny model on proxies and code generation: most of the family tests' time. The
recorded ops are then written out as one straight-line Python function (a line per op, the
recording's tensors bound by name), so that a replay calls the ops and nothing else: rebuilding
each op's arguments through pytree at every replay took a third of the family tests' time. An op's
arguments are flattened by `_leaves` (ATen's are lists, tuples and values), not by pytree, which
took most of a recording's time.
"""

from __future__ import annotations

import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


def _leaves(x, out: list) -> list:
    """`x`'s values in order, into `out`: lists and tuples (and dicts' values) opened, anything else a value."""
    if isinstance(x, (list, tuple)):
        for e in x:
            _leaves(e, out)
    elif type(x) is dict:
        for e in x.values():
            _leaves(e, out)
    else:
        out.append(x)
    return out


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
        arguments = [self.leaf(x) for x in _leaves((args, kwargs), [])]
        out = func(*args, **kwargs)
        flat = [out] if isinstance(out, torch.Tensor) else _leaves(out, [])
        made = []  # (where in the flattened result, result number)
        for i, t in enumerate(flat):
            if isinstance(t, torch.Tensor):
                self.where[id(t)] = (_RESULT, self.results)
                self.alive.append(t)
                made.append((i, self.results))
                self.results += 1
        shape = "tensor" if isinstance(out, torch.Tensor) else (
            "flat" if type(out) in (tuple, list) and len(flat) == len(out) else "tree")
        self.ops.append((func, arguments, (args, kwargs), shape, made))
        return out


def _spelled(x, codes) -> str:
    """Python code for an op's argument `x`, its values taken from the iterator `codes` in `_leaves`'s order."""
    if isinstance(x, (list, tuple)):
        inner = "".join(_spelled(e, codes) + ", " for e in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner})"
    if type(x) is dict:
        return "{" + "".join(f"{k!r}: {_spelled(v, codes)}, " for k, v in x.items()) + "}"
    return next(codes)


def _replay_code(ops: list[tuple], result: tuple[int, object]) -> tuple[str, dict]:
    """The recorded ops as the source of `_replay(static)` and the names it reads (ops, constants)."""
    names: dict[str, object] = {"_leaves": _leaves}

    def bound(x) -> str:
        name = f"c{len(names)}"
        names[name] = x
        return name

    def named(kind: int, x) -> str:  # (a recorded argument: the input, an earlier result, or a constant)
        return "static" if kind == _INPUT else f"r{x}" if kind == _RESULT else bound(x)

    lines = ["def _replay(static):"]
    for func, arguments, (args, kwargs), shape, made in ops:
        codes = iter([named(kind, x) for kind, x in arguments])
        call = (f"{bound(func)}(" + "".join(_spelled(a, codes) + ", " for a in args)
                + "".join(f"{k}={_spelled(v, codes)}, " for k, v in kwargs.items()) + ")")
        if shape == "tensor":
            lines.append(f"    r{made[0][1]} = {call}")
            continue
        lines.append(f"    _o = {call}" if shape == "flat" else f"    _o = _leaves({call}, [])")
        lines.extend(f"    r{n} = _o[{i}]" for i, n in made)
    lines.append(f"    return {named(*result)}")
    return "\n".join(lines) + "\n", names


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
        source, names = _replay_code(recorder.ops, recorder.leaf(result))
        exec(compile(source, "<graph stand-in replay>", "exec"), names)
        self._replay = names["_replay"]
        self.out = self._run().clone()
        self.replays = 0

    def _run(self) -> torch.Tensor:
        return self._replay(self.static)

    def replay(self) -> None:
        self.out.copy_(self._run())
        self.replays += 1


def trace(self, run, static):
    """`PassGraphs._record` on a CPU: (graph, the tensor its replays write)."""
    graph = TracedGraph(run, static)
    return graph, graph.out
