"""pass@k: the probability that at least one of k samples of a prompt is correct.

Source: M. Chen et al., "Evaluating Large Language Models Trained on Code" (arXiv:2107.03374),
section 2.1. From n >= k samples of a prompt, c of them correct, the unbiased estimate is

    pass@k = 1 - C(n - c, k) / C(n, k)

(C(n - c, k) of the C(n, k) ways to choose k of the n samples pick only incorrect ones). Taking 1 - (1 - c/n)^k
instead is biased low. The binomials overflow a float long before n is large (C(2000, 1000) ~ 2e600),
so the ratio is computed as the paper's numerically stable product:

    C(n - c, k) / C(n, k) = (n - c)! (n - k)! / (n! (n - c - k)!) = prod_{i = n - c + 1}^{n} (1 - k / i)

Every factor lies in [0, 1) when n - c >= k. When n - c < k, every choice of k samples holds a correct
one and pass@k = 1 exactly. k = 1 gives c / n; c = 0 gives 0. The benchmark number is the mean over
prompts.
"""

from __future__ import annotations

import torch
from torch import Tensor


def pass_at_k(num_samples: Tensor, num_correct: Tensor, k: int) -> Tensor:
    """Unbiased pass@k per prompt (module docstring), float64 [P], from `num_samples` n [P] and
    `num_correct` c [P] (integer counts, 0 <= c <= n); every prompt needs n >= k >= 1."""
    n = torch.as_tensor(num_samples, dtype=torch.float64)
    c = torch.as_tensor(num_correct, dtype=torch.float64)
    if n.shape != c.shape or n.dim() != 1:
        raise ValueError(f"num_samples and num_correct must be 1-D and of the same shape, got {tuple(n.shape)} and {tuple(c.shape)}")
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got {k}")
    if n.numel() == 0:
        return n
    if bool((n < k).any()):
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt; the fewest here is {int(n.min())}")
    if bool((c < 0).any() or (c > n).any()):
        raise ValueError("num_correct must lie between 0 and num_samples for every prompt")
    i = torch.arange(1, int(n.max()) + 1, dtype=torch.float64)  # [M]
    in_product = (i > (n - c)[:, None]) & (i <= n[:, None])  # [P, M]: i = n - c + 1 .. n
    none_correct = torch.where(in_product, 1.0 - k / i, torch.ones_like(i)).prod(dim=-1)  # C(n-c, k) / C(n, k)
    return torch.where(n - c < k, torch.ones_like(n), 1.0 - none_correct)
