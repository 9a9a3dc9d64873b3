"""The copies of the pair on one worker machine, one per GPU (or per group of GPUs for a split
pair; one with `--large_model` on one GPU), each in a process of its own, shared by every SDK
process of the machine.

Each copy is a `MultiProcessShared` object keyed by the job and the copy (so by GPU), created with
`spawn_process=True`: the first SDK process that asks starts a dedicated process that loads the
pair on that copy's devices, and every SDK process reaches it through a proxy (methods only,
plain data in and out). Why not RunInference's `model_copies`: Beam
builds those copies in whichever SDK process sets up first, all in that one process (so their
Python decoding loops share one GIL), and its loader is not told which copy it builds, so it
could not pick a GPU. A `PairRouter` in each SDK process sends each call to the copy with the
fewest calls in flight from that process, starting at a different copy in each process.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Sequence

from apache_beam.utils.multi_process_shared import MultiProcessShared

from specdec_core.placement import Copy, DeviceLost
from specdec_core.text import GeneratorSpec, TextGenerator
from transforms.worker_exit import end_worker

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LoadCopy:
    """The constructor a copy's process runs: the pair on this copy's devices. Plain data, so it
    pickles into a spawned process."""

    spec: GeneratorSpec
    index: int
    count: int

    def __call__(self) -> Served:
        from transforms.model_cache import localize

        # A spawned process has no log handler of its own (Beam sets the level only): its lines to stderr.
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")

        local = {f: localize(getattr(self.spec, f)) for f in ("target_model", "draft_model", "tokenizer")
                 if getattr(self.spec, f)}
        generator = TextGenerator.load(dataclasses.replace(self.spec, **local))
        logging.getLogger(__name__).info("specdec: copy %d of %d of the pair loaded on %s (process %d)",
                                         self.index, self.count, "+".join(self.spec.devices), os.getpid())
        return Served(generator)


class Served:
    """What a copy's process serves: its generator, the process ended once its GPU is lost
    (`DeviceLost`), so that the routers see it gone and send its calls to the other copies."""

    def __init__(self, generator: TextGenerator):
        self.generator = generator

    def generate(self, prompt: object, seed: int = 0) -> dict:
        return self._serve(self.generator.generate, prompt, seed)

    def generate_batch(self, items: list[tuple[object, int]]) -> list[dict]:
        return self._serve(self.generator.generate_batch, items)

    @staticmethod
    def _serve(method: Callable, *args: object):
        try:
            return method(*args)
        except DeviceLost as e:
            end_worker(e)
            raise


class PairGone(ConnectionError):
    """Every copy of the pair this process routes to has died: no row can be decoded here."""


class PairRouter:
    """The copies of one machine, seen from one SDK process: `generate` and `generate_batch` as
    on a TextGenerator, each call served by one copy. A copy whose process is gone (its GPU lost,
    or the SDK process that started it ended: a spawned copy ends with its parent) is started
    again through `restart` if it had served a call since it started; one lost before serving any
    is left out, and the call goes to another copy."""

    def __init__(self, copies: Sequence[object], devices: Sequence[str], first: int = 0,
                 restart: Callable[[int], object] | None = None):
        self.copies = list(copies)
        self.devices = list(devices)
        self.restart = restart
        self._busy = [0] * len(self.copies)
        self._next = first % max(1, len(self.copies))
        self._lock = threading.Lock()
        self._restarting = threading.Lock()  # (one restart at a time; the calls that lost that copy wait for it)
        self.served = [0] * len(self.copies)  # calls per copy, from this process
        self._proven = [False] * len(self.copies)  # served a call since it (re)started
        self.dead: set[int] = set()  # copies whose process is gone (a dead copy answers at once, so
        # least-busy routing would send it most calls)

    def _take(self) -> tuple[int, object]:
        with self._lock:
            n = len(self.copies)
            order = [(self._next + i) % n for i in range(n) if (self._next + i) % n not in self.dead]
            if not order:
                raise PairGone(f"every copy of the pair is gone ({n} of {n})")
            k = min(order, key=lambda i: self._busy[i])  # least busy; ties: round-robin
            self._next = (k + 1) % n
            self._busy[k] += 1
            self.served[k] += 1
            return k, self.copies[k]

    def _call(self, method: str, *args: object) -> object:
        while True:
            k, copy = self._take()
            try:
                out = getattr(copy, method)(*args)
                self._proven[k] = True
                return out
            except (ConnectionError, EOFError) as e:  # the copy's process is gone: the call goes again
                self._lost(k, copy, e)
            finally:
                with self._lock:
                    self._busy[k] -= 1

    def _lost(self, k: int, copy: object, e: BaseException) -> None:
        """Copy k (this handle of it) is gone: started again, or left out."""
        with self._restarting:
            if self.copies[k] is not copy or k in self.dead:  # another call of this process saw it first
                return
            if self.restart is not None and self._proven[k]:
                log.warning("copy %d of the pair (%s) is gone (%s: %s): starting it again", k, self.devices[k],
                            type(e).__name__, e)
                try:
                    self.copies[k], self._proven[k] = self.restart(k), False
                    return
                except Exception as again:  # (a GPU that is really gone: its load fails)
                    e = again
            with self._lock:
                self.dead.add(k)
                alive = len(self.copies) - len(self.dead)
            log.warning("copy %d of the pair (%s) is gone (%s: %s); %d left", k, self.devices[k],
                        type(e).__name__, e, alive)  # (none left: the next `_take` raises PairGone)

    def generate(self, prompt: object, seed: int = 0) -> dict:
        return self._call("generate", prompt, seed)  # type: ignore[return-value]

    def generate_batch(self, items: list[tuple[object, int]]) -> list[dict]:
        return self._call("generate_batch", items)  # type: ignore[return-value]


def copy_tag(job_tag: str, index: int, copy: Copy) -> str:
    """The machine-wide key of one copy: the job's tag, the copy and its devices."""
    return f"{job_tag}-copy{index}-{copy.describe().replace(':', '')}"


def start_copies(spec: GeneratorSpec, copies: Sequence[Copy], job_tag: str) -> PairRouter:
    """A router over the machine's copies, each started (by the first process that asks) in a
    process of its own."""

    def acquire(i: int) -> object:  # (a copy whose process is gone is started again by the process that asks)
        loader = LoadCopy(dataclasses.replace(spec, devices=copies[i].devices), i, len(copies))
        return MultiProcessShared(loader, tag=copy_tag(job_tag, i, copies[i]), always_proxy=True,
                                  spawn_process=True).acquire()

    return PairRouter([acquire(i) for i in range(len(copies))], [c.describe() for c in copies], first=os.getpid(),
                      restart=acquire)


def stop_copies(copies: Sequence[Copy], job_tag: str) -> None:
    """End the copies' processes (tests; on a worker they end with the process that started them)."""
    for i, copy in enumerate(copies):
        try:
            MultiProcessShared(dict, tag=copy_tag(job_tag, i, copy), always_proxy=True,
                               spawn_process=True).unsafe_hard_delete()
        except Exception as e:  # already gone
            log.debug("copy %d: %s", i, e)
