import numpy as np
import pytest
import torch

from pyro_bnnlv.stats.dependence import pearson_correlation
from pyro_bnnlv.stats.hsic import normalized_hsic


def _brute_force(a: np.ndarray, b: np.ndarray) -> float:
    """Gretton et al. (2005) eq. 4 with explicit centring matrices, normalised (Cortes et al. 2012)."""
    n = a.shape[0]
    H = np.eye(n) - np.ones((n, n)) / n

    def gram(v):
        h2 = v.var(0).sum()
        d2 = ((v[:, None, :] - v[None, :, :]) ** 2).sum(-1)
        return H @ np.exp(-d2 / (2 * h2)) @ H

    K, L = gram(a), gram(b)
    return float(np.trace(K @ L) / np.sqrt(np.trace(K @ K) * np.trace(L @ L)))


def test_matches_the_explicit_centring_formula():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(80, 2, generator=gen, dtype=torch.float64)
    b = torch.sin(2 * a[:, :1]) + 0.3 * torch.randn(80, 1, generator=gen, dtype=torch.float64)
    assert normalized_hsic(a, b).item() == pytest.approx(_brute_force(a.numpy(), b.numpy()), rel=1e-10)


def test_independent_small_dependent_large_even_without_correlation():
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(300, 1, generator=gen) * 8 - 4
    null = [normalized_hsic(x, torch.randn(300, 1, generator=gen)).item() for _ in range(50)]
    assert max(null) < 0.03 and min(null) >= 0
    square = x**2  # symmetric x: Pearson correlation ~0, dependence total
    assert abs(pearson_correlation(x, square).item()) < 0.2  # 0.12 on this draw
    assert normalized_hsic(x, square).item() > 0.3 > 10 * np.mean(null)
    assert normalized_hsic(x, 3 * x + 1).item() == pytest.approx(1.0, abs=1e-5)


def test_scale_invariant_constant_gives_zero_with_finite_gradient():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(100, 1, generator=gen)
    z = torch.randn(100, 1, generator=gen) + 0.5 * x
    assert normalized_hsic(x, 1e-3 * z).item() == pytest.approx(normalized_hsic(x, z).item(), rel=1e-4)
    const = torch.zeros(100, 1, requires_grad=True)
    value = normalized_hsic(x, const)
    (grad,) = torch.autograd.grad(value, const)
    assert value.item() == 0.0 and torch.isfinite(grad).all()


def test_trace_follows_the_input():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(50, 1, generator=gen)
    with torch.no_grad():
        traced = torch.jit.trace(normalized_hsic, (x, torch.zeros(50, 1)), check_trace=False)
    z = x + 0.1 * torch.randn(50, 1, generator=gen)
    assert traced(x, z).item() == pytest.approx(normalized_hsic(x, z).item(), rel=1e-5)
    with pytest.raises(ValueError, match="same number of rows"):
        normalized_hsic(x, z[:10])
