"""The accept/reject step of Leviathan et al. (2023), on already-processed distributions.

Both functions return (n, next_token): the first n drafted tokens are kept, then
next_token (the correction at the first rejection, or the bonus token after all were
accepted) is appended. Host reads: greedy, the target's choices (none where the caller read them with other
rows'); sampled, the draws and the drawn token (after a rejection, the residual's mass too).
"""

from __future__ import annotations

import torch

from specdec_core.processing import residual


class NonFiniteProbabilities(FloatingPointError):
    """The target's probabilities at a token it must emit are NaN or inf (overflow): the row fails here, as
    `generate()` would, not in the sampler, which on a GPU can take the process's CUDA context with it."""


def verify_greedy(drafts: list[int], target_choice: torch.Tensor | list[int]) -> tuple[int, int]:
    """Keep drafts while they equal the target's argmax; `target_choice` has len(drafts)+1 entries
    (a tensor, read back here, or a list the caller read back with other rows')."""
    choice = target_choice if isinstance(target_choice, list) else target_choice.tolist()
    n = next((i for i, (d, c) in enumerate(zip(drafts, choice, strict=False)) if d != c), len(drafts))
    return n, choice[n]


def verify_sampled(drafts: list[int], p: torch.Tensor, q: torch.Tensor | None, generator: torch.Generator
                   ) -> tuple[int, int]:
    """Speculative sampling: draft i is accepted iff u_i * q_i(x_i) < p_i(x_i), u_i ~ U[0,1), i.e. w.p. min(1, p/q).
    p: (k+1, V), at each draft and the bonus position. q: (k, V), what the drafts were sampled from, or None for a
    deterministic drafter (one-hot: x accepted w.p. p(x)). One uniform per draft, none without drafts."""
    if q is not None and q.shape[-1] != p.shape[-1]:
        # Output layers padded to other sizes (Qwen2.5-7B 152064, 0.5B 151936): past a model's rows, p is 0.
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
        read = torch.cat([u * q_x >= p_x, finite]).tolist()  # (>=: u may be 0, and a draft of p = 0 never kept)
        rejected, finite = read[:k], read[k:]
        n = rejected.index(True) if True in rejected else k
    else:
        finite = finite.tolist()
    if not all(finite[: n + 1]):  # (positions after a rejection are never the target's)
        raise NonFiniteProbabilities("the target's probabilities are NaN or inf (its numbers overflowed: a wider "
                                     "--dtype may hold them; a --temperature near 0 overflows any)")
    dist = residual(p[n], None if q is None else q[n], drafts[n]) if n < k else p[k]
    token = torch.multinomial(dist, 1, generator=generator)
    return n, int(token.item())
