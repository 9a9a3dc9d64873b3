"""How a cache's passes run: replayed as CUDA graphs, compiled, or eagerly, at the edge of the cache.

A static cache (`slot_kv.SlotKV`) exposes plain pass functions over packed inputs; `PassGraphs` runs them
and owns everything about graphs and compiling: one graph per key (a pass kind and its shape), captured from one
side stream into one pool and checked by a replay, inputs copied in, cuBLAS workspaces cleared, `torch.compile`,
and what it cost (`capture_s`). A cache's buffers moving invalidates its graphs (`drop`; docs/how-it-works.md).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from dataclasses import dataclass

import torch

from specdec_core.pass_settings import PassSettings

log = logging.getLogger(__name__)

# One compiled code object serves every cache and (dynamic) width, but each capacity growth recompiles.
COMPILE_LIMIT = 64
PROMPT_KINDS = ("prefill", "encode", "cross")  # prompts' passes, graphed at padded widths

# The shapes passes are keyed by: a cache grows by whole steps, prompts pad to a few widths and row counts.
CAPACITY_STEP = 512  # columns; a cache grows to the next multiple of this when an item needs more
MAX_GRAPH_WIDTH = 16  # widest decode pass captured: a verify pass is gamma + 1 tokens
# Graphed prefills are padded to a few widths (`prefill_width`); wider than MAX_PREFILL_GRAPH, eager at their own.
PREFILL_STEP = 512
MAX_PREFILL_GRAPH = 4096


def capacity_for(n: int) -> int:
    """Columns a static buffer allocates to hold n: the next multiple of `CAPACITY_STEP`."""
    return -(-n // CAPACITY_STEP) * CAPACITY_STEP


def prefill_width(n: int) -> int:
    """The width a graphed prefill of n tokens is padded to: at most twice the work, 17 widths up to 4096."""
    if n <= PREFILL_STEP:
        return 1 << max(n - 1, 0).bit_length()
    return -(-n // PREFILL_STEP) * PREFILL_STEP


def admission_rows(rows: int, most: int) -> int:
    """The rows (one graph each) of a pass admitting `rows` new ones: 1, 4 or 16, at most `most`, dummies filling in."""
    return min(next(r for r in (1, 4, 16, rows) if r >= rows), most)


class CaptureFailed(RuntimeError):
    """`--cuda_graphs on` and a pass no graph can capture (a host read in forward: DBRX's, JetMoE's expert routing)."""


def _same(replayed: torch.Tensor, eager: torch.Tensor) -> bool:
    """Equal tokens, or logits up to another kernel's rounding: 800 ulps of the largest, at most 10% of it (in
    bfloat16 800 ulps are 6 times the largest, which would pass any finite logits)."""
    if not eager.is_floating_point():
        return torch.equal(replayed, eager)
    tol = min(800 * torch.finfo(eager.dtype).eps, 0.1) * float(eager.abs().max())
    return bool(torch.allclose(replayed.float(), eager.float(), rtol=0.0, atol=tol))


@dataclass
class Graph:
    graph: torch.cuda.CUDAGraph
    inp: torch.Tensor  # a pass's (rows, w + 2): each row's tokens, first position and real token count
    out: torch.Tensor  # what a replay leaves: a pass's logits (rows, w, V), or a draft chain's tokens (rows, k)


def clear_cublas_workspaces() -> None:
    """Drop cuBLAS's cached workspaces, as torch.compile's graphs do around each recording, so a capture allocates its
    own in the graph's pool: a graph holding a workspace PyTorch later frees faults on replay (docs/how-it-works.md)."""
    torch._C._cuda_clearCublasWorkspaces()


class PassGraphs:
    """The graphs and compiled passes of one cache's model on one device."""

    def __init__(self, name: str, device: torch.device, settings: PassSettings, graphs: bool, strict: bool,
                 compile: bool, compile_prefills: bool):
        """graphs: off for good after a decode pass fails to capture (`strict`: raise `CaptureFailed`). compile: decode
        passes (compile_prefills: prompts' prefills) go through `torch.compile` before capture; a failed compile is
        logged and passes run uncompiled, strict or not (it is on by default: a worker that cannot compile decodes)."""
        self.name, self.device, self.settings = name, device, settings
        self.on, self.strict = graphs, strict
        self.compiles, self.compile_prefills = compile, compile_prefills
        self.kept: dict[int | tuple, Graph] = {}
        self.uncaptured: set[str] = set()  # prompts' pass kinds whose capture failed: they run eagerly
        self.capture_s = 0.0  # seconds spent capturing graphs (and compiling passes run without one)
        self.captures = 0
        self._compiled: dict[str, object] = {}  # per pass kind ("decode", "prefill"): its compiled function
        self._pool = None  # one memory pool for all graphs: one pass runs at a time, outputs stay held
        self._stream: torch.cuda.Stream | None = None  # the side stream every warm-up and capture runs on

    def prompt_graphs(self, kind: str) -> bool:
        """Whether prompts' passes of this kind ("prefill", "encode", "cross") replay graphs."""
        return self.on and self.settings.graph_prefills and kind not in self.uncaptured and (
            kind != "encode" or self.settings.graph_encoder)

    def drop(self, *keep: str) -> None:
        """Drop every graph but prompts' passes of the kinds `keep`: the others hold addresses of buffers that moved."""
        self.kept = {key: g for key, g in self.kept.items() if isinstance(key, tuple) and key[0] in keep}

    # -- compiled passes ---------------------------------------------------------------------------

    def compiling(self, kind: str) -> bool:
        """Whether passes of this kind ("decode", "prefill") go through torch.compile."""
        return self.compiles if kind == "decode" else self.compile_prefills

    def compiled(self, kind: str, fn, inp: torch.Tensor, *args) -> torch.Tensor | None:
        """`fn(inp, *args)` through `torch.compile`, one function per kind, the width (dim 1) dynamic so one serves
        every width, and a prefill's rows (dim 0): 16 and 4 new rows share a compile (dynamo compiles 1 row apart);
        None after a compile fails, which turns compiling off."""
        if kind not in self._compiled:
            self._compiled[kind] = torch.compile(fn)
        try:
            torch._dynamo.maybe_mark_dynamic(inp, (0, 1) if kind == "prefill" else 1)
            with torch._dynamo.config.patch(recompile_limit=COMPILE_LIMIT):
                return self._compiled[kind](inp, *args)
        except torch.OutOfMemoryError:  # the pass's own failure, not the compiler's
            raise
        except Exception as e:  # e.g. no compiler for inductor's kernels on this machine
            log.warning("%s: torch.compile failed (%s: %s); its passes run uncompiled from now on",
                        self.name, type(e).__name__, str(e)[:200])
            self.compiles = self.compile_prefills = False
            self._compiled.clear()
            return None

    # -- graphs ------------------------------------------------------------------------------------

    def run(self, key: int | tuple, inp: torch.Tensor, run, what: str, graphed: bool, fallback=None) -> torch.Tensor:
        """`run(inputs on the device)`: replayed through `key`'s graph (captured if new) when graphs are on and the pass
        is `graphed`, else eagerly. A prompt's pass (`PROMPT_KINDS`) that cannot be captured (a long prompt out of
        memory, a host read) turns off only that kind's graphs, even if `strict`, and runs `fallback` (or `run`)."""
        if not (self.on and graphed):
            if not self.compiles:
                return run(self.to_device(inp))
            from torch._dynamo.utils import counters

            compiled, t0 = counters["stats"]["unique_graphs"], time.perf_counter()
            out = run(self.to_device(inp))
            # Counted as a capture (dynamo's count is per process, but an engine runs one item at a time).
            if counters["stats"]["unique_graphs"] != compiled:
                self.capture_s += time.perf_counter() - t0
                log.info("%s: %s compiled (%.2f s with captures and compiles so far)", self.name, what, self.capture_s)
            return out
        prompt = isinstance(key, tuple) and key[0] in PROMPT_KINDS
        # A graph is captured and replayed on its model's own GPU.
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            g = self.kept.get(key)
            if g is None:
                t0 = time.perf_counter()
                try:
                    g = self.kept[key] = self._capture(run, inp)
                except Exception as e:  # e.g. a model whose forward waits on a value from the device
                    if self.strict and not prompt:  # each row's error, for such a model: say which flag insists
                        raise CaptureFailed(f"--cuda_graphs on: {what} of {self.name} cannot be captured as a "
                                            f"CUDA graph ({type(e).__name__}: {str(e)[:200]}); --cuda_graphs auto "
                                            "runs such passes eagerly") from e
                    log.warning("%s: no CUDA graph of %s (%s: %s); %s run eagerly from now on", self.name, what,
                                type(e).__name__, str(e)[:200], "such passes of prompts" if prompt else "its passes")
                    if prompt:
                        self.uncaptured.add(key[0])
                        return (fallback or run)(self.to_device(inp))
                    self.on = False
                    self.kept.clear()
                    return run(self.to_device(inp))
                self.capture_s += time.perf_counter() - t0
                self.captures += 1
                log.info("%s: CUDA graph of %s captured (%d so far, %.2f s in all)", self.name, what,
                         self.captures, self.capture_s)
            self.to_device(inp, g.inp)
            g.graph.replay()
            return g.out

    def to_device(self, inp: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
        """A pass's packed host inputs on the device, or copied `into` a graph's input; with `pinned_inputs` from pinned
        memory, not waiting for queued GPU work. Safe: PyTorch's pinned allocator reuses a block only after its copy
        ran, and the stream orders the copy after the passes before it."""
        fast = self.settings.pinned_inputs and self.device.type == "cuda" and inp.device.type == "cpu"
        if fast:
            inp = inp.pin_memory()
        if into is None:
            return inp.to(self.device, non_blocking=fast)
        return into.copy_(inp, non_blocking=fast)

    def _capture(self, run, inp: torch.Tensor) -> Graph:
        """A graph of `run` over a static copy of `inp` (valid inputs: warm-ups write where the pass would), checked by
        a replay against the eager pass: a capture that recorded the wrong work fails here, not in outputs later."""
        static = inp.to(self.device, copy=True)  # (an input already on the device stays its caller's)
        with self._side_stream():  # warm-up off the capture stream, as torch.cuda.graphs asks
            for _ in range(2):
                expected = run(static).clone()
        graph, out = self._record(run, static)
        out.fill_(torch.nan if out.is_floating_point() else -1)  # what a replay that did nothing would leave
        graph.replay()
        if not _same(out, expected):
            raise RuntimeError("a replay of the captured pass differs from the pass run eagerly")
        return Graph(graph, static, out)

    def _side(self) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        return self._stream

    @contextlib.contextmanager
    def _side_stream(self):
        if self.device.type != "cuda":
            yield
            return
        side, main = self._side(), torch.cuda.current_stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            yield
        main.wait_stream(side)

    def _record(self, run, static: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """`run(static)` captured into this cache's one pool from its one side stream (as sharing a pool asks), and the
        output tensor its replays write."""
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        previous, collecting = torch.cuda.current_stream(self.device), gc.isenabled()
        clear_cublas_workspaces()
        gc.disable()  # a graph collected (a dropped engine's, in a cycle) is destroyed, which would end the capture
        try:
            with torch.cuda.graph(graph, pool=self._pool, stream=self._side()):
                out = run(static)
        finally:
            if collecting:
                gc.enable()
            torch.cuda.set_stream(previous)  # a capture that failed would leave its stream current
            clear_cublas_workspaces()
        return graph, out
