"""`python -m pipeline.report PREFIX`: the summary of a finished run, from its output files alone."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipeline.flags import ArgumentParser
from transforms.durable import read_outputs


def read_results(prefix: str) -> tuple[pa.Table, pa.Table | None]:
    """A run's rows, each id once: final shards, and the chunks a running or killed job
    committed (transforms/durable.py reads both)."""
    results, failed = read_outputs(prefix)
    if results is None:
        raise FileNotFoundError(f"no result files {prefix}-SSSSS-of-NNNNN.parquet or {prefix}-chunk-*.parquet")
    return results, failed


@dataclass
class Summary:
    prompts: int
    failed: int
    new_tokens: int
    acceptance: float | None  # accepted / drafted over the whole run
    tokens_per_step: float  # new tokens per target forward pass
    latency_p50_s: float
    latency_p95_s: float
    tokens_per_s: float  # new tokens / generation time, summed over items
    total_latency_s: float
    draft_target_cost: float | None  # mean draft step / mean target verify pass

    def rows(self) -> list[tuple[str, str]]:
        def f(x, fmt):
            return "n/a" if x is None else format(x, fmt)

        return [
            ("prompts", f"{self.prompts} ({self.failed} failed)"),
            ("new tokens", f"{self.new_tokens}"),
            ("mean acceptance", f(self.acceptance, ".3f")),
            ("tokens per target step", f"{self.tokens_per_step:.2f}"),
            ("latency p50 / p95", f"{self.latency_p50_s:.3f} s / {self.latency_p95_s:.3f} s"),
            ("tokens/s", f"{self.tokens_per_s:.1f}"),
            ("draft/target step cost c", f(self.draft_target_cost, ".3f")),
        ]


def summarize(results: pa.Table, failed: pa.Table | None = None) -> Summary:
    col = {name: np.asarray(results[name].to_numpy(zero_copy_only=False)) for name in results.schema.names
           if name not in ("id", "generation", "finish_reason")}
    drafted, accepted = int(col["draft_tokens"].sum()), int(col["accepted_tokens"].sum())
    steps, draft_steps = int(col["verify_steps"].sum()), int(col["draft_steps"].sum())
    latency = col["latency_s"].astype(float)
    new = int(col["new_tokens"].sum())
    cost = None
    if draft_steps and steps:
        cost = (col["draft_s"].sum() / draft_steps) / (col["verify_s"].sum() / steps)
    return Summary(
        prompts=results.num_rows + (failed.num_rows if failed is not None else 0),
        failed=failed.num_rows if failed is not None else 0,
        new_tokens=new,
        acceptance=accepted / drafted if drafted else None,
        tokens_per_step=new / steps if steps else 0.0,
        latency_p50_s=float(np.percentile(latency, 50)) if len(latency) else 0.0,
        latency_p95_s=float(np.percentile(latency, 95)) if len(latency) else 0.0,
        tokens_per_s=new / latency.sum() if latency.sum() > 0 else 0.0,
        total_latency_s=float(latency.sum()),
        draft_target_cost=cost,
    )


def format_table(columns: dict[str, Summary]) -> str:
    names = list(columns)
    labels = [label for label, _ in next(iter(columns.values())).rows()]
    cells = {n: dict(s.rows()) for n, s in columns.items()}
    width = max(map(len, labels))
    widths = {n: max(len(n), *(len(v) for v in cells[n].values())) for n in names}
    lines = ["  ".join([" " * width] + [n.rjust(widths[n]) for n in names])]
    lines += ["  ".join([label.ljust(width)] + [cells[n][label].rjust(widths[n]) for n in names]) for label in labels]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("prefix", help="the --output prefix of a finished run")
    args = parser.parse_args(argv)
    try:
        results, failed = read_results(args.prefix)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table({args.prefix: summarize(results, failed)}))
    if failed is not None and failed.num_rows:
        counts = failed.group_by("error_type").aggregate([("id", "count")]).to_pylist()
        print("failed rows: " + ", ".join(f"{r['error_type']} {r['id_count']}" for r in counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
