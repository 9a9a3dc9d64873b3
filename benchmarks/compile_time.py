"""What `--torch_compile` costs a worker once per model: the seconds of each pass width's first
compiled pass over a static cache (a 1-token pass, then wider ones, which share one compile), for
the GPU bench's TinyLlama-shaped target and its 2-layer draft, built on this CPU in fp32. Inductor
writes its CPU code here (a GPU compiles Triton kernels instead). With COLD=1 inductor's on-disk
cache starts empty; without it, a run after a first one finds what that run compiled. Cited in
docs/performance.md.

    COLD=1 python benchmarks/compile_time.py
    python benchmarks/compile_time.py
"""

import os
import sys
import tempfile
import time
from pathlib import Path

if os.environ.get("COLD"):
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.bench.gpu import SHAPES, build_pair  # noqa: E402
from specdec_core.static_decoder import StaticDecoder  # noqa: E402


def main() -> None:
    target, draft = build_pair(SHAPES["tinyllama-1.1b"], torch.device("cpu"), torch.float32)
    for name, model in (("draft", draft), ("target", target)):
        decoder = StaticDecoder(model, graphs=False, compile=True)
        decoder.acquire()
        tokens = list(range(5, 133))
        decoder.forward(tokens, 1)  # the first pass allocates the buffers, uncompiled
        for w in (1, 3, 5):  # 5 reuses the compile of 3
            tokens += [7] * w
            t0 = time.perf_counter()
            decoder.forward(tokens, 1)
            print(f"{name}: first {w}-token pass {time.perf_counter() - t0:.1f} s", flush=True)
        decoder.release()


if __name__ == "__main__":
    main()
