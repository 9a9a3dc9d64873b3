"""What `pipeline.tune` predicts and recommends, from what it measured: arithmetic only.

The prediction is the paper's walltime improvement (Leviathan et al. 2023, Thm 3.8) with this
machine's costs (`Costs.speedup`: E(a, g) / (g c + v(g + 1))), generalised in two measured ways,
each kept separate so a reader can see which part of a miss is whose:

- coverage: the share of rounds in which the drafter proposed anything. A model draft always
  proposes; prompt lookup proposes only where the text repeats, and a round without drafts is a
  plain 1-token step (value 1, cost 1).
- overhead o: the per-round cost beyond the model passes (Python, acceptance, cache rollback),
  in 1-token target passes, fitted on one real run of the candidate. The paper's formula has no
  such term; on a CPU it is what the formula misses most (specdec-facts.md, section 5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.report.stats import geometric_acceptance
from specdec_core.gamma import Costs, expected_tokens

# A measured speed-up must beat the target alone by this much to be recommended: below it,
# run-to-run noise on a shared machine could make a loss look like a win.
PAY_MARGIN = 1.03


@dataclass
class SampleRun:
    """One real pass over the sample with one setting (totals over its prompts)."""

    new_tokens: int
    total_s: float  # wall time of the whole pass, prompts included
    decode_s: float  # the same without each prompt's first pass (what the formula models)
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    drafts_per_round: list[int] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def acceptance(self) -> float | None:
        """Per-token acceptance a: the geometric estimate (accepted / drafted underestimates it)."""
        return geometric_acceptance(self.accepted, self.rejections)

    @property
    def coverage(self) -> float:
        """Share of rounds that proposed at least one draft token."""
        if not self.drafts_per_round:
            return 1.0
        return sum(d > 0 for d in self.drafts_per_round) / len(self.drafts_per_round)

    @property
    def decode_s_per_token(self) -> float:
        return self.decode_s / self.new_tokens if self.new_tokens else float("inf")

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0


def predict(costs: Costs, a: float, g: int, coverage: float = 1.0, overhead: float = 0.0) -> float:
    """Predicted decode speed-up over the target alone at gamma g.

    Rounds that draft (share `coverage`) yield E(a, g) tokens for g c + v(g + 1) + o target
    passes; the others yield 1 token for 1 pass. With coverage 1 and o 0 this is exactly
    `Costs.speedup(a, g)`, the paper's formula with measured c and v(k)."""
    if g <= 0:
        return 1.0
    tokens = coverage * expected_tokens(a, g) + (1.0 - coverage)
    cost = coverage * (costs.round_cost(g) + overhead) + (1.0 - coverage)
    return tokens / cost


def fit_overhead(costs: Costs, drafts_per_round: Sequence[int], decode_s: float, base_s_per_token: float) -> float:
    """Per-drafting-round overhead o, in 1-token target passes, that makes the model's time for
    this run's rounds equal its measured decode time (a round without drafts costs one target
    step, as in the target-alone run that `base_s_per_token` comes from). Can be negative when
    the run was faster than its passes predict (e.g. load dropped)."""
    drafting = [d for d in drafts_per_round if d > 0]
    if not drafting or base_s_per_token <= 0:
        return 0.0
    passes = decode_s / base_s_per_token
    modelled = sum(costs.round_cost(d) for d in drafting) + (len(drafts_per_round) - len(drafting))
    return (passes - modelled) / len(drafting)


@dataclass
class Candidate:
    """A drafter tune weighs: `drafter` is pipeline.run's --drafter value."""

    name: str
    drafter: str  # model, ngram or none
    draft_model: str | None = None
    costs: Costs | None = None
    a: float | None = None
    coverage: float = 1.0
    overhead: float = 0.0

    def predictions(self, max_gamma: int) -> list[dict]:
        """Per gamma: the paper's formula with measured c and v(k), and the same plus overhead."""
        if self.drafter == "none" or self.costs is None or self.a is None:
            return []
        return [{"gamma": g,
                 "predicted": predict(self.costs, self.a, g, self.coverage),
                 "predicted_with_overhead": predict(self.costs, self.a, g, self.coverage, self.overhead)}
                for g in range(1, max_gamma + 1)]


def pick_to_verify(candidates: Sequence[Candidate], max_gamma: int, measured: set[tuple[str, int]],
                   n: int) -> list[tuple[Candidate, int]]:
    """The n (candidate, gamma) settings with the highest predicted speed-up (overhead included)
    that were not run yet; settings predicted not to pay are not worth a run."""
    options = [(p["predicted_with_overhead"], c, p["gamma"]) for c in candidates
               for p in c.predictions(max_gamma) if (c.name, p["gamma"]) not in measured]
    options = [o for o in options if o[0] > 1.0]
    options.sort(key=lambda o: -o[0])
    return [(c, g) for _, c, g in options[:n]]


def best_setting(rows: Sequence[dict], key: str) -> dict:
    """The row with the highest `key`, where a drafter must beat the target alone by PAY_MARGIN
    (rows are dicts with `drafter` and `key`; the target-alone row has drafter none). A drafter's
    run that proposed nothing (`drafted_tokens` 0: lookup on text that never repeats) did the
    target alone's work, so its gap to the target alone is noise: it is never chosen."""
    alone = [r for r in rows if r["drafter"] == "none"]
    base = max(alone, key=lambda r: r[key]) if alone else None
    best = max((r for r in rows if r["drafter"] == "none" or r.get("drafted_tokens") != 0), key=lambda r: r[key])
    if base is not None and best["drafter"] != "none" and best[key] < base[key] * PAY_MARGIN:
        return base
    return best


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured: positive when the model promised too much."""
    return (predicted - measured) / measured
