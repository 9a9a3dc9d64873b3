"""How many tokens to draft in each round.

A policy starts one state per item; the engine asks the state for k before each round and reports how many drafts
were accepted after it. `AdaptiveGamma` picks argmax_g E(a, g) / (g * c + v(g + 1)) from each item's acceptance
and costs measured on this machine (`Costs.measure`); `batch_gamma` picks one gamma for a batch, from costs at its
width. Gamma never changes WHAT greedy decoding outputs, only how fast; which sample a seed gives depends on the
gammas, so seed-reproducible sampling needs a deterministic policy (docs/how-it-works.md, "Adaptive gamma";
docs/batching.md, "Adaptive gamma at batch level")."""

from __future__ import annotations

import bisect
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import median


class GammaState(ABC):
    """One item's choices: k before each round, told afterwards how many drafts were kept. With `stops_early`, it is
    asked `keep_drafting` before each draft token (greedy only), then shown the confidences to calibrate itself."""

    stops_early = False

    @abstractmethod
    def next(self) -> int: ...

    def update(self, drafted: int, accepted: int) -> None:  # noqa: B027 (optional hook)
        """`drafted` tokens were proposed this round and the first `accepted` were kept."""

    def keep_drafting(self, i: int, confidence: float) -> bool:
        """Propose draft token i (0-based) of this round, given the draft's confidence in it?"""
        return True

    def record_confidences(self, confidences: Sequence[float], accepted: int) -> None:  # noqa: B027
        """The draft's confidence in each proposed token, and how many of them were kept."""


class GammaPolicy(ABC):
    """Starts one `GammaState` per item; with `needs_costs`, it gets measured `Costs` before the first item's clock."""

    needs_costs = False

    @abstractmethod
    def start(self, gamma: int) -> GammaState: ...

    def set_costs(self, costs: Costs, replace: bool = False) -> None:  # noqa: B027 (optional hook)
        pass


class _Fixed(GammaState):
    def __init__(self, gamma: int):
        self.gamma = gamma

    def next(self) -> int:
        return self.gamma


class FixedGamma(GammaPolicy):
    """Always draft the configured number of tokens (the paper's setting)."""

    def start(self, gamma: int) -> GammaState:
        return _Fixed(gamma)


fixed_gamma = FixedGamma()

LOOKUP_DRAFT_COST = 0.001  # c of a drafter without a model (prompt lookup): microseconds against a model pass


def expected_tokens(a: float, g: int) -> float:
    """E(a, g): expected tokens per round with g drafts at acceptance a (paper, eq. 1)."""
    if g <= 0 or a >= 1.0:
        return max(g, 0) + 1.0
    return (1.0 - a ** (g + 1)) / (1.0 - a)


@dataclass
class Costs:
    """Step costs in units of one 1-token target pass: c per draft step, v[k] per k-token verify.
    Not to be changed once used: best gammas are memoised."""

    c: float
    v: dict[int, float] = field(default_factory=dict)
    step_s: float | None = None  # seconds of the 1-token target pass these are relative to
    _best: dict[tuple[float, int], int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def verify(self, k: int) -> float:
        if k <= 1:
            return 1.0
        if k in self.v:
            return self.v[k]
        known = sorted(self.v)
        if not known:  # a conservative default for CPUs: multi-token passes cost about 2x
            return 2.0
        if k > known[-1]:  # extrapolate from the largest measured block, linearly in tokens
            last = known[-1]
            return self.v[last] * (1.0 + 0.05 * (k - last))
        lower = max((x for x in known if x < k), default=1)
        upper = min(x for x in known if x > k)
        vl, vu = self.verify(lower), self.v[upper]
        return vl + (vu - vl) * (k - lower) / (upper - lower)

    def round_cost(self, g: int) -> float:
        return g * self.c + self.verify(g + 1)

    def speedup(self, a: float, g: int) -> float:
        """The analytic bound with measured costs: E(a, g) / (g c + v(g + 1))."""
        return expected_tokens(a, g) / self.round_cost(g)

    def best_gamma(self, a: float, max_gamma: int) -> int:
        key = (round(a, 3), max_gamma)  # asked every round: a table, not a search, on small models
        if key not in self._best:  # (one row's batch gamma: the argmax of `speedup`, 0 where nothing beats 1)
            self._best[key] = batch_gamma(self, [key[0]], max_gamma)
        return self._best[key]

    @classmethod
    def measure(cls, target_step: Callable[[int], float], draft_step: Callable[[], float] | None,
                ks: Sequence[int] = (2, 3, 4, 5, 6, 7, 8, 9), reps: int = 3) -> Costs:
        """Costs from timers: target_step(k) -> seconds of one k-token pass, draft_step() -> of one draft step.
        Each pass is timed right after a 1-token pass and taken relative to it, so load changes on a shared machine
        cancel out; the median ratio over reps is used."""
        v: dict[int, list[float]] = {k: [] for k in ks}
        d: list[float] = []
        steps: list[float] = []
        for _ in range(reps):
            for k in ks:
                steps.append(target_step(1))
                v[k].append(target_step(k) / steps[-1])
            if draft_step is not None:
                steps.append(target_step(1))
                d.append(draft_step() / steps[-1])
        return cls(c=median(d) if d else 0.0, v={k: median(x) for k, x in v.items()}, step_s=median(steps))


class _Calibration:
    """P(target accepts a draft token | the draft's confidence in it), learnt online in log-spaced bins.
    Each bin starts at a lightly weighted prior (the overall acceptance): an unseen bin says "as usual", not "never"."""

    EDGES = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85, 0.95)

    def __init__(self) -> None:
        self.hits = [0.0] * (len(self.EDGES) + 1)
        self.seen = [0.0] * (len(self.EDGES) + 1)

    def bin(self, conf: float) -> int:
        return bisect.bisect_right(self.EDGES, conf)  # (the index of the first edge above conf)

    def prob(self, conf: float, prior: float, weight: float = 4.0) -> float:
        b = self.bin(conf)
        return (self.hits[b] + prior * weight) / (self.seen[b] + weight)

    def add(self, conf: float, accepted: bool) -> None:
        b = self.bin(conf)
        self.seen[b] += 1
        self.hits[b] += accepted


@dataclass
class _Backoff:
    """Backed off: rounds left before a probe with one draft, and the wait after a failed probe (doubled, reset by an
    accepted draft). Shared by items that share acceptance: a draft that never agrees is probed every few rounds."""
    on: bool = False
    wait: int = 0
    probe_wait: int = 4


class AdaptiveGamma(GammaPolicy):
    """Per-item gamma from measured acceptance and costs (None: the engine times them once per process). Shared across
    items (the default), new items start from earlier ones' acceptance and back-off: a pair that never agrees stops."""

    prior_weight = 4.0  # tested drafts the prior counts as (a power of two: an unshared pool is the prior exactly)
    decay = 0.85  # of an item's acceptance counts, per round that drafted
    max_probe_wait = 32  # cap of a backed-off item's wait (in rounds, doubled per failed probe) before it probes

    def __init__(self, costs: Costs | None = None, *, max_gamma: int = 12, prior_acceptance: float = 0.6,
                 share_across_items: bool = True, early_stop: bool = True):
        self.costs, self.max_gamma = costs, max_gamma
        self.share, self.early_stop = share_across_items, early_stop
        self._lock = threading.Lock()
        # Process-wide pooled acceptance (decayed counts; not sharing, it stays the prior) and confidence calibration.
        self._pool_hits, self._pool_trials = prior_acceptance * self.prior_weight, self.prior_weight
        self.backoff = _Backoff()
        self.calibration = _Calibration()

    @property
    def needs_costs(self) -> bool:
        return self.costs is None

    def set_costs(self, costs: Costs, replace: bool = False) -> None:
        """replace: the engine measured costs that fit better (a wider batch than before)."""
        with self._lock:
            if self.costs is None or replace:
                self.costs = costs

    def prior(self) -> float:
        with self._lock:
            return self._pool_hits / self._pool_trials

    def _pool(self, hits: float, trials: float) -> None:
        if not self.share or trials <= 0:
            return
        with self._lock:
            keep = 0.5 ** (trials / 200.0)  # the pool forgets over a few hundred tested drafts
            self._pool_hits, self._pool_trials = self._pool_hits * keep + hits, self._pool_trials * keep + trials

    def start(self, gamma: int) -> _AdaptiveState:
        return _AdaptiveState(self, min(gamma, self.max_gamma))


class _AdaptiveState(GammaState):
    def __init__(self, policy: AdaptiveGamma, cap: int):
        self.policy, self.stops_early = policy, policy.early_stop
        self.cap = max(cap, 1)
        w = policy.prior_weight
        self.hits, self.trials = policy.prior() * w, w  # decayed Bernoulli counts of tested drafts
        self.backoff = policy.backoff if policy.share else _Backoff()
        self.last_k = 0
        self._survival = 1.0  # P(all drafts of this round so far are accepted)
        self._expected = 1.0  # expected tokens of this round if drafting stopped now

    @property
    def acceptance(self) -> float:
        return self.hits / self.trials

    def _costs(self) -> Costs:
        return self.policy.costs or Costs(c=0.1)

    def next(self) -> int:
        costs, off = self._costs(), self.backoff
        k = costs.best_gamma(self.acceptance, self.cap)
        if k == 0 and costs.best_gamma(1.0, self.cap) > 0:  # (no probe where no acceptance could pay)
            if off.wait > 0:
                off.wait -= 1
            elif off.on:  # the wait is over: probe with one draft
                k = 1
            else:
                off.on, off.wait = True, off.probe_wait - 1
        self.last_k = k
        return k

    def keep_drafting(self, i: int, confidence: float) -> bool:
        """Propose draft token i (0-based) of this round, or stop the round's drafting here?
        Not myopic, since v(k) is not convex on CPUs (a kernel switch makes one size jump): compares stopping now,
        E_i / C_i, with the best longer block, E_j / C_j up to this round's k, C_n = n c + v(n + 1) (token i's draft
        step is paid either way)."""
        p = self.policy.calibration.prob(confidence, self.acceptance)
        if i == 0:  # a new round; its first draft is always proposed
            self._survival, self._expected = 1.0, 1.0
        else:
            costs, a = self._costs(), self.acceptance
            stop_rate = self._expected / ((i + 1) * costs.c + costs.verify(i + 1))
            s, e, best = self._survival * p, self._expected, 0.0
            for j in range(i + 1, max(self.last_k, i + 1) + 1):
                e += s
                best = max(best, e / (j * costs.c + costs.verify(j + 1)))
                s *= a
            if best <= stop_rate:
                return False
        self._survival *= p
        self._expected += self._survival
        return True

    def record_confidences(self, confidences: Sequence[float], accepted: int) -> None:
        """Calibrate: drafts before the first rejection were accepted, it was not, later ones were never tested."""
        cal = self.policy.calibration
        with self.policy._lock:
            for j, conf in enumerate(confidences[: accepted + 1]):
                cal.add(conf, j < accepted)

    def update(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        # Geometric trials: `accepted` successes, plus one failure if a draft was rejected.
        trials = accepted + (1 if accepted < drafted else 0)
        d = self.policy.decay
        self.hits, self.trials = self.hits * d + accepted, self.trials * d + trials
        self.policy._pool(accepted, trials)
        off = self.backoff
        if off.on and self.last_k == 1 and accepted == 0:
            off.probe_wait = min(off.probe_wait * 2, self.policy.max_probe_wait)
            off.wait = off.probe_wait - 1
        elif accepted > 0:
            off.on, off.probe_wait = False, _Backoff.probe_wait


def batch_gamma(costs: Costs, acceptances: Sequence[float], max_gamma: int, per_token: float = 0.0,
                hurdle: float = 0.0, round_factor: float = 1.0) -> int:
    """Drafts per row for a round in which all rows verify in one pass (docs/batching.md).
    A batched pass is as wide as its longest row, so every row may draft K once one does: the round costs
    K c + v(K + 1) at this batch width and yields sum_b E(a_b, K); K = 0 yields one token per row at cost 1.
    per_token: the draft's prefill of each prompt per token it yields (a batch that does not draft skips it).
    hurdle: the fewest drafts whose rate is within this share of the best (what the rule leaves out grows with K).
    round_factor: what drafting rounds were measured to cost against K c + v(K + 1), relative to plain rounds."""
    tokens, powers, rates = float(len(acceptances)), list(acceptances), [float(len(acceptances))]
    for k in range(1, max_gamma + 1):  # sum_b E(a_b, k) = sum_b (1 + a_b + ... + a_b^k), a term a row per k (host time)
        tokens += sum(powers)
        powers = [p * a for p, a in zip(powers, acceptances, strict=True)]
        rates.append(tokens / (costs.round_cost(k) * round_factor + per_token * tokens))
    return next(k for k, rate in enumerate(rates) if rate * (1 + hurdle + 1e-9) >= max(rates))
