"""Several SDK worker processes, as on a Dataflow VM: the pair is loaded once per process (or once
per machine with --large_model) and the outputs equal a one-worker run, prompt by prompt.

FnApiRunner multi_processing starts real `sdk_worker_main` subprocesses; the number of model loads
is read back from RunInference's `load_model_latency_milli_secs` distribution (one update per load),
which the workers report to the runner. With --large_model each process's load is a router over
the machine's copy, which loads in a process of its own, once: its log line (on the inherited
stderr) is counted.
"""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.metrics.metric import MetricsFilter

from pipeline.options import SpecDecOptions
from pipeline.preflight import preflight
from pipeline.run import LOCAL_RUNNER, build_pipeline

pytestmark = pytest.mark.slow

N_PROMPTS = 12
COMPARED = ["id", "generation", "new_tokens", "draft_tokens", "accepted_tokens", "verify_steps",
            "finish_reason", "seed"]


def _run(argv: list[str]) -> tuple[list[dict], int, int]:
    """(result rows by id, model loads, inferences) of one job."""
    opts = SpecDecOptions(argv)
    p = beam.Pipeline(options=opts)
    build_pipeline(p, opts, preflight(opts))
    result = p.run()
    result.wait_until_finish()
    metrics = result.metrics().query(MetricsFilter().with_name("load_model_latency_milli_secs"))
    loads = sum(d.committed.count for d in metrics["distributions"])
    counters = result.metrics().query(MetricsFilter().with_name("num_inferences"))["counters"]
    inferences = sum(c.committed for c in counters)
    prefix = Path(opts.output)
    files = sorted(prefix.parent.glob(f"{prefix.name}-[0-9]*-of-*.parquet"))
    rows = pa.concat_tables(pq.read_table(f) for f in files).select(COMPARED).to_pylist()
    return sorted(rows, key=lambda r: r["id"]), loads, inferences


@pytest.mark.timeout(300)
def test_two_worker_processes_equal_one(saved_pairs, tmp_path, monkeypatch, capfd):
    # MultiProcessShared (large_model) leaves <tag>.address/.lock files in the temp dir: keep them here
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    target, draft = saved_pairs["gpt2"]
    prompts = tmp_path / "prompts.parquet"
    words = ["The quick brown fox", "def add(a, b):", "Hello world!", "Speculative decoding", "for i in",
             "Summarize: the committee"]
    pq.write_table(pa.table({"id": list(range(N_PROMPTS)),
                             "prompt": [f"{words[i % len(words)]} {i}" for i in range(N_PROMPTS)]}), prompts)

    def argv(name: str, *extra: str) -> list[str]:
        return [f"--runner={LOCAL_RUNNER}", f"--input={prompts}", f"--output={tmp_path / name / 'gens'}",
                f"--target_model={target}", f"--draft_model={draft}", "--max_new_tokens=6",
                # fixed gamma: the drafting statistics are then deterministic too, so whole rows compare
                "--gamma_policy=fixed", *extra]

    multi = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]

    one, one_loads, one_n = _run(argv("one"))
    two, two_loads, two_n = _run(argv("two", *multi))
    capfd.readouterr()
    shared, shared_loads, shared_n = _run(argv("shared", *multi, "--large_model"))

    assert len(one) == N_PROMPTS and one_n == two_n == shared_n == N_PROMPTS
    assert one_loads == 1
    assert two_loads == 2  # once per worker process (Beam's Shared within a process)
    assert shared_loads == 2  # a router per worker process ...
    assert capfd.readouterr().err.count("copy 0 of 1 of the pair loaded on cpu") == 1  # ... over one copy
    assert two == one
    assert shared == one
