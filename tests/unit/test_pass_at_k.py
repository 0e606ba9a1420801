"""pass@k (Chen et al. 2021): hand-derived values, edge cases, the binomial form, and large n."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from oxrl.algorithms.pass_at_k import pass_at_k
from oxrl.loops.rl import pass_ks


def by_binomials(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k) in exact rational arithmetic (math.comb is 0 when n - c < k)."""
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def one(n: int, c: int, k: int) -> float:
    return float(pass_at_k(torch.tensor([n]), torch.tensor([c]), k)[0])


def test_hand_values():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert one(5, 2, 2) == pytest.approx(0.7, abs=1e-15)
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert one(4, 1, 2) == pytest.approx(0.5, abs=1e-15)
    # n=10, c=3, k=1: 1 - C(7,1)/C(10,1) = 1 - 7/10 = c/n = 0.3
    assert one(10, 3, 1) == pytest.approx(0.3, abs=1e-15)
    # n=6, c=2, k=3: 1 - C(4,3)/C(6,3) = 1 - 4/20 = 0.8
    assert one(6, 2, 3) == pytest.approx(0.8, abs=1e-15)


def test_edge_cases():
    assert one(5, 0, 1) == 0.0 and one(5, 0, 5) == 0.0  # nothing correct: never passes
    assert one(5, 4, 2) == 1.0  # n - c = 1 < k = 2: every pair holds a correct sample
    assert one(5, 5, 3) == 1.0  # all correct
    assert one(5, 1, 5) == 1.0  # k = n: all samples drawn, one is correct
    assert one(1, 1, 1) == 1.0 and one(1, 0, 1) == 0.0


def test_vectorised_matches_binomials_on_every_small_case():
    cases = [(n, c, k) for n in range(1, 13) for c in range(n + 1) for k in range(1, n + 1)]
    for k in range(1, 13):
        rows = [(n, c) for n, c, kk in cases if kk == k]
        n = torch.tensor([r[0] for r in rows])
        c = torch.tensor([r[1] for r in rows])
        expected = torch.tensor([by_binomials(n_, c_, k) for n_, c_ in rows], dtype=torch.float64)
        assert torch.allclose(pass_at_k(n, c, k), expected, rtol=0, atol=1e-12), k


def test_stable_where_the_binomials_overflow_a_float():
    # C(2000, 1000) ~ 2e600: float binomials cannot even be formed, the product form is exact to rounding.
    with pytest.raises(OverflowError):
        float(math.comb(2000, 1000))
    for c in (1, 3, 10, 200):
        assert one(2000, c, 1000) == pytest.approx(by_binomials(2000, c, 1000), abs=1e-12)


def test_mean_over_prompts_is_the_benchmark_number():
    n, c = torch.tensor([5, 5, 5]), torch.tensor([0, 2, 5])
    assert float(pass_at_k(n, c, 2).mean()) == pytest.approx((0.0 + 0.7 + 1.0) / 3)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="k >= 1"):
        pass_at_k(torch.tensor([4]), torch.tensor([1]), 0)
    with pytest.raises(ValueError, match="at least 5 samples"):
        pass_at_k(torch.tensor([4, 8]), torch.tensor([1, 1]), 5)
    with pytest.raises(ValueError, match="between 0 and num_samples"):
        pass_at_k(torch.tensor([4]), torch.tensor([5]), 1)


def test_reported_ks():
    assert pass_ks(1) == [1]
    assert pass_ks(2) == [1, 2]
    assert pass_ks(6) == [1, 2, 4, 6]
    assert pass_ks(8) == [1, 2, 4, 8]
