"""The numbers of `pipeline.report`, computed from a run's output tables alone.

Everything here follows from the result and failed rows (docs/outputs.md): no logs, no job
metadata. Each figure is defined once, so that the printed summary, the HTML page and the demo
agree. Per-item distributions are kept next to the run-wide figures because a mean hides
exactly what a user wants to find: the prompts where speculation did not help.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import quality
from transforms.schema import STATS

PERCENTILES = (50, 95, 99)


def column(table: pa.Table, name: str, dtype=float) -> np.ndarray:
    """A numeric column as a numpy array (nulls as NaN)."""
    values = table[name].to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=dtype)


def geometric_acceptance(accepted: int, rejections: int) -> float | None:
    """The paper's per-token acceptance a, estimated from rounds (n drafts accepted, then a rejection unless all
    were kept); accepted / drafted underestimates it (drafts after a round's first rejection are never judged)."""
    total = accepted + rejections
    return accepted / total if total else None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


@dataclass
class Distribution:
    """Mean and percentiles of per-item values (NaN-free)."""

    n: int
    mean: float | None
    p10: float | None
    p50: float | None
    p90: float | None
    min: float | None
    max: float | None

    @classmethod
    def of(cls, values: np.ndarray) -> Distribution:
        v = np.asarray(values, dtype=float)
        v = v[~np.isnan(v)]
        if not len(v):
            return cls(0, None, None, None, None, None, None)
        p10, p50, p90 = (float(x) for x in np.percentile(v, [10, 50, 90]))
        return cls(len(v), float(v.mean()), p10, p50, p90, float(v.min()), float(v.max()))

    def text(self, fmt: str = ".3f", unit: str = "") -> str:
        if not self.n:
            return "n/a"
        f = lambda x: f"{format(x, fmt)}{unit}"  # noqa: E731
        return (f"mean {f(self.mean)}, p10 {f(self.p10)}, p50 {f(self.p50)}, p90 {f(self.p90)}, "
                f"min {f(self.min)}, max {f(self.max)} over {self.n} items")


@dataclass
class Summary:
    """The run-wide figures the demo prints side by side (`format_table`)."""

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
    latency_p99_s: float = 0.0

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
    latency = column(results, "latency_s")
    new = int(column(results, "new_tokens", np.int64).sum())
    steps = int(column(results, "verify_steps", np.int64).sum())
    drafted = int(column(results, "draft_tokens", np.int64).sum())
    accepted = int(column(results, "accepted_tokens", np.int64).sum())
    p50, p95, p99 = (float(x) for x in np.percentile(latency, PERCENTILES)) if len(latency) else (0.0,) * 3
    n_failed = failed.num_rows if failed is not None else 0
    draft_step, verify_pass = _step_costs(results)
    return Summary(
        prompts=results.num_rows + n_failed,
        failed=n_failed,
        new_tokens=new,
        acceptance=_ratio(accepted, drafted),
        tokens_per_step=new / steps if steps else 0.0,
        latency_p50_s=p50,
        latency_p95_s=p95,
        latency_p99_s=p99,
        tokens_per_s=new / latency.sum() if latency.sum() > 0 else 0.0,
        total_latency_s=float(latency.sum()),
        draft_target_cost=_ratio(draft_step, verify_pass) if draft_step is not None and verify_pass else None,
    )


def _step_costs(results: pa.Table) -> tuple[float | None, float | None]:
    """(mean draft step, mean target verify pass) in seconds, None where there were none."""
    draft_steps = column(results, "draft_steps", np.int64).sum()
    verify_steps = column(results, "verify_steps", np.int64).sum()
    draft = _ratio(float(column(results, "draft_s").sum()), float(draft_steps))
    verify = _ratio(float(column(results, "verify_s").sum()), float(verify_steps))
    return draft, verify


def format_table(columns: dict[str, Summary]) -> str:
    return format_rows({name: s.rows() for name, s in columns.items()})


def format_rows(columns: dict[str, list[tuple[str, str]]]) -> str:
    """Columns of (label, value) rows, all with the same labels, side by side."""
    names = list(columns)
    labels = [label for label, _ in next(iter(columns.values()))]
    cells = {n: dict(rows) for n, rows in columns.items()}
    width = max(map(len, labels))
    widths = {n: max(len(n), *(len(v) for v in cells[n].values())) for n in names}
    lines = ["  ".join([" " * width] + [n.rjust(widths[n]) for n in names])]
    lines += ["  ".join([label.ljust(width)] + [cells[n][label].rjust(widths[n]) for n in names]) for label in labels]
    return "\n".join(lines)


@dataclass
class Admissions:
    """How the rows entered their batches (columns `admit_s`, `admitted_with`, `admit_passes`)."""

    rows: int
    passes: int  # the target's prefill passes that took them in
    share: float | None  # summed admit_s / summed latency_s: the rows' time spent waiting on admissions

    @classmethod
    def of(cls, results: pa.Table) -> Admissions | None:
        """None for files written before these columns."""
        if not {"admit_s", "admitted_with", "admit_passes"} <= set(results.schema.names):
            return None
        passes = column(results, "admit_passes") / np.maximum(column(results, "admitted_with"), 1)
        return cls(results.num_rows, round(float(passes.sum())),
                   _ratio(float(column(results, "admit_s").sum()), float(column(results, "latency_s").sum())))


@dataclass
class RunStats:
    """Everything `pipeline.report` says about one run, with the per-item values the plots draw."""

    summary: Summary
    results: int
    failures_by_type: dict[str, int]
    prompt_tokens: int
    drafted: int
    accepted: int
    finish_reasons: dict[str, int]
    acceptance_items: Distribution
    tokens_per_step_items: Distribution
    new_tokens_items: Distribution
    ttft: Distribution
    draft_step_s: float | None  # mean draft forward pass
    verify_pass_s: float | None  # mean target verify pass (accept/reject included)
    per_token_acceptance: float | None  # the paper's a; None for files without `rejections`
    # per item, aligned with the results' rows, for the plots
    item_acceptance: np.ndarray = field(repr=False)
    item_tokens_per_step: np.ndarray = field(repr=False)
    item_latency: np.ndarray = field(repr=False)
    item_prompt_tokens: np.ndarray = field(repr=False)
    item_new_tokens: np.ndarray = field(repr=False)
    admissions: Admissions | None = None


def run_stats(results: pa.Table, failed: pa.Table | None = None) -> RunStats:
    new = column(results, "new_tokens")
    steps = column(results, "verify_steps")
    with np.errstate(divide="ignore", invalid="ignore"):
        per_step = np.where(steps > 0, new / np.where(steps > 0, steps, 1), np.nan)
    acceptance = column(results, "acceptance_rate")  # null (NaN) where nothing was drafted
    draft_step, verify_pass = _step_costs(results)
    failures = Counter(failed["error_type"].to_pylist()) if failed is not None else Counter()
    # n/a where any row lacks `rejections`: files written before the column (a run resumed from one too), whose a
    # the other rows' would stand for unseen
    rejections = column(results, "rejections") if "rejections" in results.schema.names else np.array([np.nan])
    return RunStats(
        summary=summarize(results, failed),
        results=results.num_rows,
        failures_by_type=dict(failures.most_common()),
        prompt_tokens=int(column(results, "prompt_tokens", np.int64).sum()),
        drafted=int(column(results, "draft_tokens", np.int64).sum()),
        accepted=int(column(results, "accepted_tokens", np.int64).sum()),
        finish_reasons=dict(Counter(results["finish_reason"].to_pylist()).most_common()),
        acceptance_items=Distribution.of(acceptance),
        tokens_per_step_items=Distribution.of(per_step),
        new_tokens_items=Distribution.of(new),
        ttft=Distribution.of(column(results, "ttft_s")),
        draft_step_s=draft_step,
        verify_pass_s=verify_pass,
        per_token_acceptance=None if np.isnan(rejections).any() else geometric_acceptance(
            int(column(results, "accepted_tokens").sum()), int(rejections.sum())),
        item_acceptance=acceptance,
        item_tokens_per_step=per_step,
        item_latency=column(results, "latency_s"),
        item_prompt_tokens=column(results, "prompt_tokens"),
        item_new_tokens=new,
        admissions=Admissions.of(results),
    )


@dataclass
class Comparison:
    """A run against its baseline (`--drafter none`, same prompts), joined on id."""

    matched: int
    only_run: int
    only_baseline: int
    speedup: float | None  # summed baseline latency / summed run latency, over matched items
    speedup_items: Distribution
    slower_items: int  # matched items where the run took longer than the baseline
    identical: int  # matched items whose generations are equal
    first_differences: list[str]  # a few ids whose generations differ
    least_helped: list[tuple[str, float]]  # the ids with the lowest per-item speed-up, lowest first
    baseline_step_s: float | None  # mean 1-token target step of the baseline
    c: float | None  # draft step / baseline target step: the paper's c
    v: float | None  # run's verify pass / baseline target step: what verifying a block costs
    item_speedup: np.ndarray = field(repr=False)  # per matched item, in the run's row order
    item_run_rows: np.ndarray = field(repr=False)  # the run's row index of each item_speedup entry


def compare(results: pa.Table, baseline: pa.Table, target_alone: bool = True) -> Comparison:
    """Joins on id with Arrow's hash join (ids are unique once the reader has deduplicated them),
    and the null id, an id like any other that a hash join never matches, by hand.
    target_alone: whether the baseline ran the target alone; the baseline's target step, c and v
    need it (the speed-up and identical generations do not).

    Raises ValueError when the baseline's ids cannot take the run's type."""
    left = results.select(["id", "generation", "latency_s"]).append_column(
        "run_row", pa.array(np.arange(results.num_rows, dtype=np.int64)))
    right = baseline.select(["id", "generation", "latency_s"]).append_column(
        "base_row", pa.array(np.arange(baseline.num_rows, dtype=np.int64)))
    id_type = left.schema.field("id").type
    theirs = right.schema.field("id").type
    if theirs != id_type:  # e.g. int32 and int64 ids from inputs written apart: cast within one kind only
        def kind(t: pa.DataType) -> str:
            return "integer" if pa.types.is_integer(t) else "text" if pa.types.is_string(t) or \
                pa.types.is_large_string(t) else str(t)

        if kind(theirs) != kind(id_type):
            raise ValueError(f"the baseline's ids are {theirs}, the run's {id_type}: they cannot be matched")
        right = right.set_column(0, "id", right["id"].cast(id_type))
    joined = left.join(right, "id", join_type="inner", right_suffix="_base")
    run_null, base_null = (t.filter(pc.is_null(t["id"])) for t in (left, right))
    if run_null.num_rows and base_null.num_rows:
        pair = {**{c: run_null[c] for c in left.column_names},
                "generation_base": base_null["generation"], "latency_s_base": base_null["latency_s"],
                "base_row": base_null["base_row"]}
        joined = pa.concat_tables([joined, pa.table({c: pair[c] for c in joined.column_names})])
    joined = joined.sort_by("run_row")
    run_lat, base_lat = column(joined, "latency_s"), column(joined, "latency_s_base")
    with np.errstate(divide="ignore", invalid="ignore"):
        items = np.where(run_lat > 0, base_lat / np.where(run_lat > 0, run_lat, 1), np.nan)
    same = pc.fill_null(pc.equal(joined["generation"], joined["generation_base"]), False)
    ids = joined["id"].to_pylist()
    differ = joined.filter(pc.invert(same))["id"].to_pylist()
    # (the matched rows only: steps of other prompts, of other lengths, are not this run's costs against them)
    draft_step, verify_pass = _step_costs(results.take(joined["run_row"]))
    base_step = _step_costs(baseline.take(joined["base_row"]))[1] if target_alone else None
    matched = joined.num_rows
    return Comparison(
        matched=matched,
        only_run=results.num_rows - matched,
        only_baseline=baseline.num_rows - matched,
        speedup=_ratio(float(base_lat.sum()), float(run_lat.sum())) if matched else None,
        speedup_items=Distribution.of(items),
        slower_items=int((items < 1).sum()),
        identical=matched - len(differ),
        first_differences=[str(k) for k in differ[:5]],
        least_helped=[(str(ids[k]), float(items[k])) for k in np.argsort(items)[:5] if not np.isnan(items[k])],
        baseline_step_s=base_step,
        c=_ratio(draft_step, base_step) if draft_step is not None and base_step else None,
        v=_ratio(verify_pass, base_step) if verify_pass is not None and base_step else None,
        item_speedup=items,
        item_run_rows=column(joined, "run_row", np.int64),
    )


def quality_scores(results: pa.Table, references: str, metric: str) -> dict[str, float | str]:
    """Generations against a passthrough column of reference texts (pipeline.quality)."""
    if references not in results.schema.names:
        passthrough = [n for n in results.schema.names if n not in _OUTPUT_COLUMNS]
        raise KeyError(f"reference column {references!r} is not in the results (passthrough columns: "
                       f"{', '.join(passthrough) or 'none'}; pass it with --passthrough_columns when running)")
    kind = results.schema.field(references).type
    if references in _OUTPUT_COLUMNS:
        raise KeyError(f"--references {references!r} is an output column, not a passthrough column of references")
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise KeyError(f"--references {references!r} is {kind}, not text")
    # Rows without a reference (null: a run resumed without the column, a dataset field with gaps; blank: `datasets`
    # fills a missing text with "", which every metric scores 0) are left out of the reference metrics
    # (`score_generations`) and counted here.
    gens = results["generation"].to_pylist()
    refs = [r if r is not None and r.strip() else None for r in results[references].to_pylist()]
    if not gens:  # (every row failed: the rest of the report stands)
        return {"rows_with_reference": "0 of 0: no generated row to score"}
    if not (given := sum(r is not None for r in refs)):
        raise KeyError(f"--references {references!r} is null or blank in every result row: no reference to score "
                       "against")
    return {"rows_with_reference": f"{given} of {len(gens)}", **quality.score_generations(gens, refs, metric=metric)}


_OUTPUT_COLUMNS = {"id", *(name for name, _ in STATS)}


Section = tuple[str, list[tuple[str, str]]]
SCORE_LABELS = {
    "rouge1": "ROUGE-1 F1", "rouge2": "ROUGE-2 F1", "rougeL": "ROUGE-L F1", "bleu": "BLEU (0-100)",
    "chrf": "chrF (0-100)", "degenerate_share": "degenerate outputs (share)",
    "repeated_3gram_share": "repeated word 3-grams (mean share)", "distinct_share": "distinct outputs (share)",
    "rows_with_reference": "rows with a reference (scored)",
}


def _f(x: float | str | None, fmt: str, unit: str = "") -> str:
    return "n/a" if x is None else x if isinstance(x, str) else f"{format(x, fmt)}{unit}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def sections(stats: RunStats, comparison: Comparison | None = None,
             scores: dict[str, float | str] | None = None, references: str | None = None) -> list[Section]:
    """The report as titled (label, value) rows: printed as text, and as tables in the HTML page."""
    s = stats.summary
    run = [
        ("prompts", f"{s.prompts} ({stats.results} generated, {s.failed} failed)"),
        ("failed rows by type", _counts(stats.failures_by_type)),
        ("finish reasons", _counts(stats.finish_reasons)),
        ("prompt tokens", f"{stats.prompt_tokens}"),
        ("new tokens", f"{s.new_tokens}"),
        ("new tokens per item", stats.new_tokens_items.text(".1f")),
    ]
    spec = [
        ("drafted / accepted tokens", f"{stats.drafted} / {stats.accepted}"),
        ("acceptance (accepted / drafted)", _f(s.acceptance, ".3f")),
        ("acceptance per item", stats.acceptance_items.text(".3f")),
        ("per-token acceptance a (accepted / (accepted + rejections))", _f(stats.per_token_acceptance, ".3f")),
        ("tokens per target step", _f(s.tokens_per_step if stats.results else None, ".2f")),
        ("tokens per target step per item", stats.tokens_per_step_items.text(".2f")),
        ("mean draft step", _f(None if stats.draft_step_s is None else stats.draft_step_s * 1e3, ".2f", " ms")),
        ("mean target verify pass", _f(None if stats.verify_pass_s is None else stats.verify_pass_s * 1e3,
                                       ".2f", " ms")),
        ("c within the run (draft step / verify pass)", _f(s.draft_target_cost, ".3f")),
    ]
    speed = [
        ("latency p50 / p95 / p99",
         f"{s.latency_p50_s:.3f} s / {s.latency_p95_s:.3f} s / {s.latency_p99_s:.3f} s" if stats.results else "n/a"),
        ("time to first token", stats.ttft.text(".3f", " s")),
        ("generation time, summed over items", f"{s.total_latency_s:.2f} s"),
        ("throughput (new tokens / summed generation time)",
         _f(s.tokens_per_s if stats.results else None, ".1f", " tokens/s")),
    ]
    if (a := stats.admissions) is not None and a.rows:
        speed += [
            ("rows admitted / target prefill passes",
             f"{a.rows} / {a.passes} ({a.rows / max(a.passes, 1):.1f} rows a pass)"),
            ("time waiting on admissions (share of generation time)", _f(None if a.share is None else 100 * a.share,
                                                                         ".1f", "%")),
        ]
    out: list[Section] = [("Run", run), ("Speculation", spec), ("Speed", speed)]
    if comparison is not None:
        c = comparison
        base = [
            ("prompts in both runs", f"{c.matched} (only in this run {c.only_run}, only in the baseline "
                                     f"{c.only_baseline})"),
            ("speed-up (baseline / run generation time)", _f(c.speedup, ".2f", "x")),
            ("speed-up per item", c.speedup_items.text(".2f", "x")),
            ("items slower than the baseline", f"{c.slower_items} of {c.matched}"),
            ("least speed-up (id)", ", ".join(f"{k} {x:.2f}x" for k, x in c.least_helped) or "n/a"),
            ("identical generations", f"{c.identical} of {c.matched}"
             + (f" (differ: {', '.join(c.first_differences)})" if c.first_differences else "")),
            ("baseline target step", _f(None if c.baseline_step_s is None else c.baseline_step_s * 1e3,
                                        ".2f", " ms")),
            ("c (draft step / baseline target step)", _f(c.c, ".3f")),
            ("v (verify pass / baseline target step)", _f(c.v, ".3f")),
        ]
        out.append(("Against the baseline", base))
    if scores is not None:
        label = f"against {references!r}" if references else "of the generations"
        out.append((f"Quality {label}", [(SCORE_LABELS.get(k, k), _f(v, ".2f" if k in ("bleu", "chrf") else ".4f"))
                                          for k, v in scores.items()]))
    return out


def format_sections(parts: Sequence[Section]) -> str:
    width = max(len(label) for _, rows in parts for label, _ in rows)
    lines: list[str] = []
    for title, rows in parts:
        lines += [title] + [f"  {label.ljust(width)}  {value}" for label, value in rows] + [""]
    return "\n".join(lines).rstrip() + "\n"
