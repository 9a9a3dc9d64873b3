"""The accept/reject step on hand-made p and q."""

import pytest
import torch
from scipy.stats import chisquare

from specdec_core.acceptance import verify_greedy, verify_sampled
from specdec_core.processing import residual


def test_greedy_keeps_matching_prefix_then_target_token():
    assert verify_greedy([3, 1, 4], torch.tensor([3, 1, 5, 9])) == (2, 5)
    assert verify_greedy([3, 1, 4], torch.tensor([3, 1, 4, 9])) == (3, 9)  # bonus token
    assert verify_greedy([3], torch.tensor([2, 7])) == (0, 2)
    assert verify_greedy([], torch.tensor([6])) == (0, 6)


def test_draft_with_zero_target_mass_is_always_rejected():
    p = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        n, tok = verify_sampled([0], p, q, gen)
        assert n == 0 and tok in (1, 2)


def test_a_uniform_of_exactly_zero_rejects_a_draft_the_target_never_writes(monkeypatch):
    """torch's float32 uniforms are multiples of 2^-24, 0 among them (once in 16.8M draws): u * q <= p kept a
    draft of p = 0 then (a token outside the target's top-k, or an end min_new_tokens forbids)."""
    p = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]])
    monkeypatch.setattr(torch, "rand", lambda k, **kw: torch.zeros(k))
    for q in (None, torch.tensor([[0.9, 0.05, 0.05]])):
        assert verify_sampled([0], p, q, torch.Generator().manual_seed(0))[0] == 0


def test_draft_equal_to_target_is_always_accepted_and_bonus_comes_from_last_row():
    p = torch.tensor([[0.1, 0.9, 0.0], [0.3, 0.3, 0.4], [0.0, 0.0, 1.0]])
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        assert verify_sampled([1, 2], p, p[:2].clone(), gen) == (2, 2)


@pytest.mark.parametrize("deterministic", [False, True])
def test_first_token_follows_p_whatever_q(deterministic):
    """Leviathan et al. Thm 3.5 on one position: the emitted token is distributed as p."""
    p = torch.tensor([0.5, 0.2, 0.2, 0.1])
    q = torch.tensor([0.1, 0.1, 0.2, 0.6])
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(4)
    n_trials = 6000
    for _ in range(n_trials):
        if deterministic:  # an n-gram drafter always proposing token 0
            x, qq = 0, None
        else:
            x = int(torch.multinomial(q, 1, generator=gen))
            qq = q[None]
        n, tok = verify_sampled([x], torch.stack([p, p]), qq, gen)
        counts[x if n == 1 else tok] += 1
    assert chisquare(counts.numpy(), (p * n_trials).numpy()).pvalue > 1e-3
    # ...and the same counts are far from q: the test can fail.
    assert chisquare(counts.numpy(), (q * n_trials).numpy()).pvalue < 1e-6


def test_residual_is_normalised_positive_part():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(residual(p, q, 1), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(residual(p, None, 0), torch.tensor([0.0, 0.6, 0.4]))


def test_residual_without_mass_falls_back_to_p():
    """p == q up to float rounding: a rejection must not yield NaN (HF raises here)."""
    p = torch.tensor([0.25, 0.25, 0.5])
    q = p + torch.tensor([1e-9, -1e-9, 0.0])
    r = residual(p, q, 0)
    assert torch.isfinite(r).all() and torch.allclose(r, p)


def test_a_target_whose_numbers_overflow_fails_its_row_by_name():
    """NaN target probabilities at a token the target must emit fail with a reason that says so
    (they failed in torch's sampler, whose CUDA kernel may take the process's CUDA context with
    it); NaN only after a rejection, where the target's own path never goes, is no failure."""
    from specdec_core.acceptance import NonFiniteProbabilities

    gen = torch.Generator().manual_seed(0)
    nan = torch.full((3,), float("nan"))
    p = torch.tensor([0.0, 0.5, 0.5])
    with pytest.raises(NonFiniteProbabilities, match="NaN or inf"):
        verify_sampled([], nan[None], None, gen)
    with pytest.raises(NonFiniteProbabilities):
        verify_sampled([1], torch.stack([p, nan]), None, gen)  # the bonus position
    # the draft 0 has probability 0 under the target: rejected at once, the NaN after it unread
    n, tok = verify_sampled([0, 1], torch.stack([p, nan, nan]), torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]), gen)
    assert n == 0 and tok in (1, 2)
