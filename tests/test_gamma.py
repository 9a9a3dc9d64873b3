"""Gamma policies: the paper's formula, back-off when drafts do not pay, and exactness."""

import random

import pytest
import torch

from pipeline.report.stats import geometric_acceptance
from specdec_core.drafters import ModelDrafter, NgramDrafter
from specdec_core.engine import SpeculativeGenerator
from specdec_core.gamma import (
    AdaptiveGamma,
    Costs,
    GammaPolicy,
    GammaState,
    batch_gamma,
    expected_tokens,
    fixed_gamma,
)
from specdec_core.processing import SamplingSettings
from tests.test_engine_greedy import PROMPTS, reference


def test_expected_tokens_and_paper_bound():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    paper = Costs(c=0.05, v={k: 1.0 for k in range(2, 20)})  # v = 1: the paper's setting
    # Leviathan et al. (2023), Thm 3.8: (1 - a^(g+1)) / ((1 - a)(g c + 1))
    a, g = 0.8, 4
    assert paper.speedup(a, g) == pytest.approx((1 - a ** (g + 1)) / ((1 - a) * (g * 0.05 + 1)))


def test_best_gamma_grows_with_acceptance_and_backs_off_when_drafts_do_not_pay():
    costs = Costs(c=0.1, v={2: 1.3, 3: 1.4, 4: 1.5, 5: 1.6, 6: 1.7, 7: 1.8, 8: 1.9, 9: 2.0})
    gammas = [costs.best_gamma(a, 8) for a in (0.0, 0.2, 0.6, 0.8, 0.95)]
    assert gammas[0] == gammas[1] == 0  # drafting cannot pay: plain decoding
    assert gammas[2] >= 1 and gammas == sorted(gammas) and gammas[-1] == 8
    # Expensive verification (v = 2 for any block) needs a higher acceptance before drafting pays.
    flat2 = Costs(c=0.1, v={k: 2.0 for k in range(2, 10)})
    assert flat2.best_gamma(0.6, 8) == 0 and flat2.best_gamma(0.9, 8) > 0


def test_batch_gamma_weighs_one_shared_verify_pass():
    cheap = Costs(c=0.1, v={k: 1.0 + 0.05 * k for k in range(2, 10)})  # a few rows: spare compute
    full = Costs(c=0.1, v={k: float(k) for k in range(2, 10)})  # rows fill the machine: v(k) = k
    assert batch_gamma(cheap, [0.9] * 8, 4) == 4
    assert batch_gamma(full, [0.95] * 8, 4) == 0  # no acceptance pays for a pass k times dearer
    dear = Costs(c=0.1, v={k: 1.0 + 0.3 * (k - 1) for k in range(2, 10)})
    assert batch_gamma(dear, [0.9] * 8, 4) == 4
    # Rows that rarely agree hold the batch back: the pass is paid for all of them.
    assert batch_gamma(dear, [0.9] + [0.3] * 7, 4) == 0
    assert batch_gamma(dear, [0.8] * 4 + [0.5] * 4, 4) == 1  # some rows agreeing less: a shorter block
    assert batch_gamma(cheap, [0.9] * 8, 2) == 2  # never past the cap
    # The draft's prefill of each prompt, spread over the tokens drafting yields, can outweigh
    # a round's gain (K = 1 there yields 13.2 tokens at cost 1.4 against 8 at cost 1).
    assert batch_gamma(dear, [0.8] * 4 + [0.5] * 4, 4, per_token=0.01) == 1
    assert batch_gamma(dear, [0.8] * 4 + [0.5] * 4, 4, per_token=0.02) == 0


def test_batch_gamma_prices_drafting_rounds_at_their_measured_cost():
    costs = Costs(c=0.1, v={k: 0.8 + 0.2 * k for k in range(2, 6)})
    assert batch_gamma(costs, [0.8] * 8, 4) > 0
    assert batch_gamma(costs, [0.8] * 8, 4, round_factor=2.0) == 0  # a round at twice its costs loses at any K


def test_batch_gamma_takes_the_fewest_drafts_near_the_best_rate():
    # Costs measured at B = 8 on the quick pair (CPU): rates (tokens per plain step) at a = 0.8 are
    # 8, 9.48, 10.30, 10.30, 10.42 for K = 0..4: K = 4 is best by 1%, K = 2 within 5% of it.
    b8 = Costs(c=0.16, v={2: 1.23, 3: 1.4, 4: 1.6, 5: 1.7})
    assert batch_gamma(b8, [0.8] * 8, 4, 0.009) == 4
    assert batch_gamma(b8, [0.8] * 8, 4, 0.009, hurdle=0.05) == 2
    assert batch_gamma(b8, [0.8] * 8, 4, 0.009, hurdle=0.3) == 1
    # At a = 0.55 drafting one token is predicted 3% faster than none: within the hurdle, so none.
    assert batch_gamma(b8, [0.55] * 8, 4, 0.009) == 1
    assert batch_gamma(b8, [0.55] * 8, 4, 0.009, hurdle=0.05) == 0
    # A clear gain still drafts.
    assert batch_gamma(b8, [0.9] * 8, 4, 0.009, hurdle=0.05) > 0


def test_batch_gamma_rates_rounds_by_the_papers_expected_tokens():
    """The rule sums rows' a^i as it goes (host time at wide batches): its picks are the closed form's, E(a, K)."""
    rng = random.Random(0)
    for _ in range(3000):
        accs = [rng.choice([rng.random(), 0.0, 1.0, 0.5]) for _ in range(rng.choice([1, 2, 8, 128]))]
        costs = Costs(c=rng.uniform(0.01, 0.5), v={k: 1 + rng.uniform(0, 0.3) * (k - 1) for k in range(2, 8)})
        cap, per_token, hurdle = rng.randint(1, 6), rng.choice([0.0, rng.uniform(0, 0.2)]), rng.choice([0.0, 0.05])
        tokens = [sum(expected_tokens(a, k) for a in accs) for k in range(cap + 1)]
        rates = [t / (costs.round_cost(k) + per_token * t) if k else t for k, t in enumerate(tokens)]
        want = next(k for k, rate in enumerate(rates) if rate * (1 + hurdle + 1e-9) >= max(rates))
        assert batch_gamma(costs, accs, cap, per_token, hurdle) == want


def test_costs_interpolate_and_extrapolate():
    costs = Costs(c=0.1, v={2: 1.2, 5: 1.8})
    assert costs.verify(1) == 1.0 and costs.verify(2) == 1.2
    assert costs.verify(3) == pytest.approx(1.4) and costs.verify(7) > 1.8
    # Between the two nearest measured sizes, not the smallest and a larger one.
    three = Costs(c=0.1, v={2: 1.2, 5: 2.0, 8: 3.0})
    assert three.verify(6) == pytest.approx(2.0 + 1 / 3) and three.verify(7) == pytest.approx(2.0 + 2 / 3)


def test_costs_measure_takes_median_ratios_and_the_step_seconds():
    times = iter([1.0, 1.5, 2.0, 2.0, 1.0, 0.1, 1.0, 1.2, 2.0, 2.4, 1.0, 0.3])  # t1, t(k) / t1, draft per rep

    costs = Costs.measure(lambda k: next(times), lambda: next(times), ks=(2, 3), reps=2)
    assert costs.v == {2: pytest.approx(1.35), 3: pytest.approx(1.1)}
    assert costs.c == pytest.approx(0.2) and costs.step_s == pytest.approx(1.0)


def test_geometric_acceptance():
    assert geometric_acceptance(0, 0) is None
    assert geometric_acceptance(3, 1) == 0.75


def test_adaptive_state_backs_off_and_probes():
    costs = Costs(c=0.1, v={k: 1.5 for k in range(2, 12)})
    policy = AdaptiveGamma(costs, max_gamma=8, share_across_items=False, prior_acceptance=0.7)
    st = policy.start(8)
    assert st.next() > 0
    ks = []
    for _ in range(60):  # nothing is ever accepted
        k = st.next()
        ks.append(k)
        st.update(k, 0)
    assert ks[-20:].count(0) >= 17  # backed off, probing rarely
    assert 0 < sum(1 for k in ks[-40:] if k) <= 4
    # Acceptance comes back: probes succeed and drafting resumes.
    for _ in range(40):
        k = st.next()
        st.update(k, k)
    assert st.next() == 8


def test_a_draft_no_acceptance_pays_for_is_never_probed():
    """A proposed token costing more than the target step it could save (c = 2: a draft with another
    tokenizer on a tiny target) cannot pay even if every draft were accepted: no round drafts, not
    even a probe, at batch 1 or batched."""
    costs = Costs(c=2.0, v={k: 1.1 for k in range(2, 12)})
    st = AdaptiveGamma(costs, max_gamma=4, share_across_items=False, prior_acceptance=0.9).start(4)
    assert [st.next() for _ in range(100)] == [0] * 100
    assert batch_gamma(costs, [1.0] * 8, 4) == 0 and batch_gamma(Costs(c=0.1, v=costs.v), [1.0] * 8, 4) > 0


def test_an_items_acceptance_forgets_old_rounds():
    """Acceptance is a decayed average: after a long run of fully accepted rounds, a run of misses
    brings it and the item's gamma down within a few rounds, not after as many rounds again."""
    costs = Costs(c=0.1, v={k: 1.0 + 0.05 * k for k in range(2, 10)})
    st = AdaptiveGamma(costs, max_gamma=8, share_across_items=False, early_stop=False).start(8)
    for _ in range(100):
        k = st.next()
        st.update(k, k)
    assert st.acceptance > 0.99 and st.next() == 8
    ks = []
    for _ in range(8):
        ks.append(st.next())
        st.update(ks[-1], 0)
    assert st.acceptance < 0.8 and min(ks) < 8


def test_shared_prior_starts_new_items_backed_off():
    costs = Costs(c=0.1, v={k: 1.5 for k in range(2, 12)})
    policy = AdaptiveGamma(costs, max_gamma=8)
    for _ in range(3):
        st = policy.start(8)
        for _ in range(20):
            k = st.next()
            st.update(k, 0)
    assert policy.prior() < 0.3
    assert policy.start(8).next() == 0


def test_items_sharing_acceptance_share_the_back_off():
    """A draft that never agrees, over many short items: the wait between probes carries over from item to item
    (doubling to its cap), so the process probes about once every max_probe_wait rounds, where each item backing
    off on its own probed twice in its 24 rounds (and read its prompt with the draft for it)."""
    costs = Costs(c=0.1, v={k: 1.5 for k in range(2, 12)})
    policy = AdaptiveGamma(costs, max_gamma=8)
    drafting = []
    for _ in range(20):
        st = policy.start(8)
        for _ in range(24):
            k = st.next()
            st.update(k, 0)
            drafting.append(k > 0)
    assert sum(drafting[-240:]) <= 240 // AdaptiveGamma.max_probe_wait + 1
    # One item's accepted draft ends the back-off for the items after it.
    st = policy.start(8)
    while st.next() == 0:
        pass
    st.update(1, 1)
    assert policy.backoff.probe_wait == 4 and not policy.backoff.on


def test_the_wait_between_probes_doubles_on_failed_probes_only_up_to_its_cap():
    costs = Costs(c=0.1, v={k: 1.5 for k in range(2, 12)})
    policy = AdaptiveGamma(costs, max_gamma=8)
    st = policy.start(8)
    for _ in range(2000):
        st.update(st.next(), 0)
    assert policy.backoff.probe_wait == AdaptiveGamma.max_probe_wait
    other = AdaptiveGamma(costs, max_gamma=8).start(8)
    other.backoff.on, other.last_k = True, 3  # a round that drafted 3 and kept none: no probe
    other.update(3, 0)
    assert other.backoff.probe_wait == 4


def test_an_unshared_policy_keeps_its_prior_and_any_policy_its_cap():
    costs = Costs(c=0.1, v={k: 1.5 for k in range(2, 12)})
    policy = AdaptiveGamma(costs, max_gamma=8, share_across_items=False, prior_acceptance=0.6)
    st = policy.start(8)
    for _ in range(10):
        st.update(4, 0)
    assert policy.prior() == 0.6 and policy.start(8).acceptance == 0.6  # items do not inherit another's acceptance
    cheap = Costs(c=0.01, v={k: 1.0 for k in range(2, 12)})
    assert AdaptiveGamma(cheap, max_gamma=2, prior_acceptance=0.99).start(6).next() == 2  # (the engine's gamma 6)


def test_fixed_gamma_unchanged():
    st = fixed_gamma.start(5)
    st.update(5, 2)
    assert st.next() == 5


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_adaptive_greedy_equals_target(kind, models, tokenizer):
    target, draft = models[kind]
    for drafter in (ModelDrafter(draft), ModelDrafter(target), NgramDrafter()):
        policy = AdaptiveGamma(max_gamma=6)  # costs measured by the engine on first use
        gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=6, max_new_tokens=20, gamma_policy=policy)
        for prompt in PROMPTS:
            ids = tokenizer(prompt).input_ids
            out = gen.generate(ids)
            assert out.tokens == reference(target, ids, 20), (kind, prompt)
            assert out.stats.new_tokens == len(out.tokens)
        assert policy.costs is not None and policy.costs.v


def test_adaptive_self_draft_drafts_long_blocks(models, tokenizer):
    target, _ = models["llama"]
    costs = Costs(c=0.2, v={k: 1.0 + 0.05 * k for k in range(2, 10)})
    gen = SpeculativeGenerator(target, ModelDrafter(target), num_speculative_tokens=8, max_new_tokens=40,
                               gamma_policy=AdaptiveGamma(costs, max_gamma=8, early_stop=False))
    out = gen.generate(tokenizer(PROMPTS[1]).input_ids)
    assert out.stats.acceptance_rate == 1.0
    assert max(out.stats.gammas) == 8


def test_adaptive_sampling_is_reproducible_with_fixed_costs(models, tokenizer):
    target, draft = models["llama"]
    costs = Costs(c=0.1, v={k: 1.3 for k in range(2, 10)})

    def run(seed):
        policy = AdaptiveGamma(costs, max_gamma=6, share_across_items=False)
        gen = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=6, max_new_tokens=16,
                                   sampling=SamplingSettings(temperature=0.8), gamma_policy=policy)
        return gen.generate(tokenizer(PROMPTS[0]).input_ids, seed).tokens

    assert run(3) == run(3)
    assert len({tuple(run(s)) for s in range(6)}) > 1
    torch.manual_seed(0)


def test_early_stop_looks_past_a_cost_jump_and_stops_on_unsure_drafts():
    # v jumps at 4 tokens (a kernel switch), then stays flat: a myopic rule would stop at 2 drafts.
    costs = Costs(c=0.05, v={2: 1.05, 3: 1.1, 4: 1.5, 5: 1.52, 6: 1.54, 7: 1.56, 8: 1.58, 9: 1.6})
    policy = AdaptiveGamma(costs, max_gamma=8, share_across_items=False, prior_acceptance=0.9)
    st = policy.start(8)
    k = st.next()
    assert k >= 4
    assert all(st.keep_drafting(i, 0.5) for i in range(k))  # uncalibrated: confidence says "as usual"
    # Teach the calibration that low-confidence drafts are always rejected.
    for _ in range(200):
        policy.calibration.add(0.01, False)
        policy.calibration.add(0.9, True)
    st.next()
    assert st.keep_drafting(0, 0.9) and st.keep_drafting(1, 0.9)
    assert not st.keep_drafting(2, 0.01)


def test_the_rejected_drafts_confidence_is_calibrated_as_a_miss():
    """A round's accepted drafts are hits, its first rejected draft a miss; drafts after it were never judged."""
    policy = AdaptiveGamma(Costs(c=0.1), max_gamma=4)
    policy.start(4).record_confidences([0.9, 0.03, 0.5], accepted=1)
    cal = policy.calibration
    assert (cal.seen[cal.bin(0.9)], cal.hits[cal.bin(0.9)]) == (1, 1)
    assert (cal.seen[cal.bin(0.03)], cal.hits[cal.bin(0.03)]) == (1, 0)
    assert cal.seen[cal.bin(0.5)] == 0


class _StopAfterTwo(GammaState):
    """Asks for 4 drafts, stops each round after 2 through the early-stop hook, records calls."""

    def __init__(self, stops_early: bool):
        self.stops_early = stops_early
        self.asked: list[int] = []
        self.recorded: list[tuple[int, int]] = []
        self.updated: list[tuple[int, int]] = []

    def next(self) -> int:
        return 4

    def update(self, drafted: int, accepted: int) -> None:
        self.updated.append((drafted, accepted))

    def keep_drafting(self, i: int, confidence: float) -> bool:
        assert 0.0 <= confidence <= 1.0
        self.asked.append(i)
        return i < 2

    def record_confidences(self, confidences, accepted: int) -> None:
        self.recorded.append((len(confidences), accepted))


class _Policy(GammaPolicy):
    def __init__(self, stops_early: bool = True):
        self.stops_early = stops_early
        self.states: list[_StopAfterTwo] = []

    def start(self, gamma: int) -> GammaState:
        self.states.append(_StopAfterTwo(self.stops_early))
        return self.states[-1]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_engine_uses_the_early_stop_hooks_only_when_greedy(models, tokenizer, temperature):
    target, draft = models["llama"]
    policy = _Policy()
    gen = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=4, max_new_tokens=12,
                               sampling=SamplingSettings(temperature=temperature), gamma_policy=policy)
    ids = tokenizer(PROMPTS[0]).input_ids
    out = gen.generate(ids, seed=1)
    st, s = policy.states[0], out.stats
    # Each round the state is told what it drafted and kept, as the stats count them (some rounds rejected one).
    assert [d for d, _ in st.updated] == s.drafts
    assert sum(acc for _, acc in st.updated) == s.accepted_tokens
    assert sum(acc < d for d, acc in st.updated) == s.rejections > 0
    if temperature == 0.0:
        assert out.tokens == reference(target, ids, 12)
        assert max(out.stats.drafts) == 2 and st.asked and set(st.asked) <= {0, 1, 2}
        assert st.recorded == st.updated  # a confidence for each draft, calibrated by the round's accepted count
    else:  # sampling: stopping on the draft's confidence would bias the proposals, so never asked
        assert not st.asked and not st.recorded and max(out.stats.drafts) == 4


def test_engine_leaves_a_state_that_does_not_stop_early_alone(models, tokenizer):
    target, draft = models["llama"]
    policy = _Policy(stops_early=False)
    gen = SpeculativeGenerator(target, ModelDrafter(draft), num_speculative_tokens=4, max_new_tokens=12,
                               gamma_policy=policy)
    ids = tokenizer(PROMPTS[0]).input_ids
    out = gen.generate(ids)
    st = policy.states[0]
    assert out.tokens == reference(target, ids, 12)
    assert not st.asked and not st.recorded and max(out.stats.drafts) == 4
