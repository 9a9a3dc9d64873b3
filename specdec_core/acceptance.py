"""The accept/reject step of Leviathan et al. (2023), on already-processed distributions.

Both functions return (n, next_token): the first n drafted tokens are kept, then
next_token (the correction at the first rejection, or the bonus token after all were
accepted) is appended. Each call costs one device-to-host sync.
"""

from __future__ import annotations

import torch

from specdec_core.processing import residual


class NonFiniteProbabilities(FloatingPointError):
    """The target's probabilities at a token it must emit are NaN or inf: its numbers overflowed
    (a row fails with this, as `generate()` would fail there, rather than in the sampler, which on
    a GPU can take the whole process's CUDA context with it)."""


def verify_greedy(drafts: list[int], target_choice: torch.Tensor | list[int]) -> tuple[int, int]:
    """Keep drafts while they equal the target's argmax; `target_choice` has len(drafts)+1 entries
    (a tensor, read back here, or a list the caller read back with other rows')."""
    choice = target_choice if isinstance(target_choice, list) else target_choice.tolist()
    n = 0
    while n < len(drafts) and drafts[n] == choice[n]:
        n += 1
    return n, choice[n]


def verify_sampled(
    drafts: list[int],
    p: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator,
) -> tuple[int, int]:
    """Speculative sampling.

    p: (k+1, V) target probabilities at each drafted position plus the bonus position.
    q: (k, V) draft probabilities the drafts were sampled from, or None for a deterministic
       drafter (q one-hot on the draft, so a draft x is accepted with probability p(x)).
    Draft i is accepted iff u_i * q_i(x_i) <= p_i(x_i), u_i ~ U[0,1): that is, with
    probability min(1, p/q). One uniform is drawn per draft, none when there are no drafts.
    """
    if q is not None and q.shape[-1] != p.shape[-1]:
        # One tokenizer, output layers of two sizes (padded rows, as Qwen2.5-7B's 152064 against
        # 0.5B's 151936): a token past a model's rows has probability 0 under it.
        width = max(p.shape[-1], q.shape[-1])
        p, q = (torch.nn.functional.pad(t, (0, width - t.shape[-1])) for t in (p, q))
    k = len(drafts)
    n = k
    finite = p.isfinite().all(-1)  # per position; read back with the draws, one transfer
    if k:
        idx = torch.tensor(drafts, device=p.device)
        rows = torch.arange(k, device=p.device)
        p_x = p[rows, idx]
        q_x = torch.ones_like(p_x) if q is None else q[rows, idx]
        u = torch.rand(k, generator=generator, device=p.device)
        read = torch.cat([u * q_x > p_x, finite]).tolist()
        rejected, finite = read[:k], read[k:]
        n = rejected.index(True) if True in rejected else k
    else:
        finite = finite.tolist()
    if not all(finite[: n + 1]):  # (positions after a rejection are never the target's)
        raise NonFiniteProbabilities("the target's probabilities are NaN or inf (its numbers overflowed: a wider "
                                     "--dtype may hold them)")
    if n < k:
        dist = residual(p[n], None if q is None else q[n], drafts[n])
    else:
        dist = p[k]
    token = torch.multinomial(dist, 1, generator=generator)
    return n, int(token.item())
