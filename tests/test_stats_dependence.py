"""Tests for pyro_bnnlv.stats.dependence (ncai-bnnlv-nonidentifiability.txt, App. D and F.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pyro_bnnlv.stats.dependence import (
    correlation_penalty,
    henze_zirkler,
    henze_zirkler_beta,
    henze_zirkler_pvalue,
    ks_statistic,
    ksg_mutual_information,
    offdiag_cov_norm,
    pearson_correlation,
)

pingouin = pytest.importorskip("pingouin")
sklearn_mi = pytest.importorskip("sklearn.feature_selection._mutual_info")
from sklearn.feature_selection import mutual_info_regression  # noqa: E402
from scipy.stats import ks_2samp  # noqa: E402


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def _sample(kind: str, n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "gauss":
        a = rng.normal(size=(k, k))
        return rng.normal(size=(n, k)) @ a + rng.normal(size=k)
    if kind == "skewed":
        return rng.exponential(size=(n, k)) ** 2
    if kind == "bimodal":
        sign = np.where(rng.random(size=(n, 1)) < 0.5, -1.0, 1.0)
        return rng.normal(size=(n, k)) + 3.0 * sign
    if kind == "uniform":
        return rng.uniform(size=(n, k))
    raise AssertionError(kind)


def _hz_reference(x: np.ndarray) -> float:
    """Line-by-line transcription of pingouin 0.7 ``multivariate_normality`` (its ``hz``).

    pingouin refuses ``k = 1`` (``assert p >= 2``), so the univariate case is checked against
    this transcription; ``test_reference_transcription_matches_pingouin`` checks that it agrees
    with pingouin itself wherever pingouin runs.
    """
    n, p = x.shape
    s = np.cov(x, rowvar=False, bias=True).reshape(p, p)
    s_inv = np.linalg.pinv(s, hermitian=True)
    dif = x - x.mean(0)
    dj = np.diag(np.linalg.multi_dot([dif, s_inv, dif.T]))
    y = np.linalg.multi_dot([x, s_inv, x.T])
    yd = np.diag(y)
    djk = -2 * y.T + yd + yd[..., None]
    b = 1 / np.sqrt(2) * ((2 * p + 1) / 4) ** (1 / (p + 4)) * (n ** (1 / (p + 4)))
    if np.linalg.matrix_rank(s) != p:
        return 4.0 * n
    return n * (
        1 / n**2 * np.sum(np.exp(-(b**2) / 2 * djk))
        - 2 * (1 + b**2) ** (-p / 2) * (1 / n) * np.sum(np.exp(-(b**2) / (2 * (1 + b**2)) * dj))
        + (1 + 2 * b**2) ** (-p / 2)
    )


# ----------------------------------------------------------------------------------------------
# Henze-Zirkler
# ----------------------------------------------------------------------------------------------

HZ_CASES = [
    (kind, n, k, seed)
    for kind in ("gauss", "skewed", "bimodal", "uniform")
    for n, k in ((20, 2), (100, 2), (500, 2), (30, 5), (200, 5), (60, 3))
    for seed in (0, 1)
]


@pytest.mark.parametrize("kind,n,k,seed", HZ_CASES)
def test_hz_matches_pingouin(kind, n, k, seed):
    x = _sample(kind, n, k, seed)
    ref = pingouin.multivariate_normality(x)
    hz = henze_zirkler(torch.from_numpy(x))
    assert hz.dtype == torch.float64 and hz.dim() == 0
    assert hz.item() == pytest.approx(ref.hz, rel=1e-9)
    assert henze_zirkler_pvalue(hz, n, k) == pytest.approx(ref.pval, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("kind,n,k,seed", HZ_CASES[::4])
def test_reference_transcription_matches_pingouin(kind, n, k, seed):
    x = _sample(kind, n, k, seed)
    assert _hz_reference(x) == pytest.approx(pingouin.multivariate_normality(x).hz, rel=1e-12)


@pytest.mark.parametrize("kind", ["gauss", "skewed", "bimodal", "uniform"])
@pytest.mark.parametrize("n", [20, 100, 500])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hz_univariate_matches_reference(kind, n, seed):
    x = _sample(kind, n, 1, seed)
    ref = _hz_reference(x)
    assert henze_zirkler(torch.from_numpy(x)).item() == pytest.approx(ref, rel=1e-9)
    # 1-D input is the same sample as (n, 1)
    assert henze_zirkler(torch.from_numpy(x[:, 0])).item() == henze_zirkler(torch.from_numpy(x)).item()


def test_hz_beta_uses_published_exponent():
    # beta = 2^{-1/2} (n(2k+1)/4)^{1/(k+4)}, not the ^{-k/4} printed after eq. 25
    assert henze_zirkler_beta(100, 2) == pytest.approx((1 / math.sqrt(2)) * (100 * 5 / 4) ** (1 / 6), rel=1e-15)
    assert henze_zirkler_beta(1000, 1) > henze_zirkler_beta(100, 1)


def test_hz_separates_gaussian_from_non_gaussian():
    n, k = 300, 2
    gauss = henze_zirkler(torch.from_numpy(_sample("gauss", n, k, 3))).item()
    bimodal = henze_zirkler(torch.from_numpy(_sample("bimodal", n, k, 3))).item()
    assert henze_zirkler_pvalue(gauss, n, k) > 0.01
    assert henze_zirkler_pvalue(bimodal, n, k) < 1e-6
    assert bimodal > 5 * gauss


def test_hz_affine_invariant():
    x = torch.from_numpy(_sample("skewed", 80, 3, 0))
    a = torch.tensor([[2.0, 0.3, 0.0], [0.0, -1.0, 0.5], [0.1, 0.0, 4.0]], dtype=torch.float64)
    assert henze_zirkler(x @ a + 7.0).item() == pytest.approx(henze_zirkler(x).item(), rel=1e-9)


def test_hz_singular_covariance_is_large_and_finite_without_a_branch():
    """A constant column: pingouin returns the convention 4n; ours stays a smooth function of the
    sample (ridge, no rank test), large, finite, with a finite gradient, and it is the limit of
    nearly constant columns (so a traced objective cannot freeze a branch)."""
    x = _sample("gauss", 50, 3, 0)
    x[:, 2] = 1.5  # constant column: rank-deficient covariance
    assert pingouin.multivariate_normality(x).hz == 4 * 50
    xt = torch.from_numpy(x).requires_grad_(True)
    hz = henze_zirkler(xt)
    hz.backward()
    assert torch.isfinite(xt.grad).all()
    gauss = henze_zirkler(torch.from_numpy(_sample("gauss", 50, 3, 0))).item()
    assert hz.item() > 3 * gauss  # 3.4 vs 0.99: the collapsed column reads as non-Gaussian
    # all points equal: the closed form n (1 - 2 (1+b^2)^(-k/2) + (1+2b^2)^(-k/2)), gradient 0
    from pyro_bnnlv.stats.dependence import henze_zirkler_beta

    n, k = 300, 1
    b2 = henze_zirkler_beta(n, k) ** 2
    z = torch.zeros(n, k, dtype=torch.float64, requires_grad=True)
    hz0 = henze_zirkler(z)
    hz0.backward()
    assert hz0.item() == pytest.approx(n * (1 - 2 * (1 + b2) ** -0.5 + (1 + 2 * b2) ** -0.5), rel=1e-12)
    assert torch.equal(z.grad, torch.zeros_like(z))


def test_hz_nearly_collinear_float32_matches_float64():
    """Issue 16.6: a nearly collinear float32 sample used to fall back to 4n (800)."""
    gen = torch.Generator().manual_seed(0)
    x1 = torch.randn(200, 1, generator=gen, dtype=torch.float64)
    x = torch.cat([x1, x1 + 1e-3 * torch.randn(200, 1, generator=gen, dtype=torch.float64)], 1)
    ref = henze_zirkler(x).item()
    assert ref < 5
    assert henze_zirkler(x.float()).item() == pytest.approx(ref, rel=1e-3)


def test_hz_jit_trace_follows_the_input():
    """Traced at a degenerate sample, the compiled statistic must still track later samples."""
    gen = torch.Generator().manual_seed(1)
    traced = torch.jit.trace(henze_zirkler, (torch.zeros(40, 1),), check_trace=False)
    for x in (torch.randn(40, 1, generator=gen), torch.rand(40, 1, generator=gen)):
        assert traced(x).item() == pytest.approx(henze_zirkler(x).item(), rel=1e-5)


def test_hz_float32_close_to_float64():
    x = torch.from_numpy(_sample("skewed", 100, 3, 1))
    h32 = henze_zirkler(x.float())
    assert h32.dtype == torch.float32
    assert h32.item() == pytest.approx(henze_zirkler(x).item(), rel=1e-4)


def test_hz_gradcheck():
    x = torch.from_numpy(_sample("skewed", 12, 2, 0)).requires_grad_(True)
    assert torch.autograd.gradcheck(henze_zirkler, (x,))


@pytest.mark.parametrize("kind", ["bimodal", "skewed"])
def test_hz_gradient_descent_lowers_hz(kind):
    x0 = torch.from_numpy(_sample(kind, 200, 2, 0))
    x = x0.clone().requires_grad_(True)
    opt = torch.optim.Adam([x], lr=0.05)
    hz0 = henze_zirkler(x0).item()
    for _ in range(30):
        opt.zero_grad()
        loss = henze_zirkler(x)
        loss.backward()
        assert torch.isfinite(x.grad).all()
        opt.step()
    hz1 = henze_zirkler(x).item()
    assert hz1 < 0.5 * hz0
    # plain steepest descent: a small step along -grad lowers HZ
    x = x0.clone().requires_grad_(True)
    henze_zirkler(x).backward()
    with torch.no_grad():
        assert henze_zirkler(x0 - 1e-2 * x.grad).item() < hz0


# ----------------------------------------------------------------------------------------------
# Pearson proxy and off-diagonal covariance
# ----------------------------------------------------------------------------------------------


def test_pearson_matches_numpy():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(100, 3))
    b = a[:, :2] @ rng.normal(size=(2, 2)) + rng.normal(size=(100, 2))
    r = pearson_correlation(torch.from_numpy(a), torch.from_numpy(b))
    assert r.shape == (3, 2)
    expected = np.corrcoef(a, b, rowvar=False)[:3, 3:]
    np.testing.assert_allclose(r.numpy(), expected, rtol=1e-9)
    pen = correlation_penalty(torch.from_numpy(a), torch.from_numpy(b))
    assert pen.item() == pytest.approx(np.abs(expected).mean(), rel=1e-9)
    pen_max = correlation_penalty(torch.from_numpy(a), torch.from_numpy(b), reduction="max")
    assert pen_max.item() == pytest.approx(np.abs(expected).max(), rel=1e-9)


def test_correlation_penalty_is_magnitude():
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.normal(size=(200, 1)))
    noise = torch.from_numpy(rng.normal(size=(200, 1)))
    pos = correlation_penalty(x, x + 0.3 * noise)
    neg = correlation_penalty(x, -x - 0.3 * noise)
    assert pos.item() == pytest.approx(neg.item(), rel=1e-12)
    assert pos.item() > 0.9
    assert pearson_correlation(x, -x - 0.3 * noise).item() < -0.9


def test_correlation_penalty_gradient_descent_decorrelates():
    torch.manual_seed(0)
    x = torch.randn(300, 2, dtype=torch.float64)
    z = (x[:, :1] + 0.1 * torch.randn(300, 1, dtype=torch.float64)).requires_grad_(True)
    before = correlation_penalty(x, z, reduction="max").item()
    assert before > 0.6
    opt = torch.optim.Adam([z], lr=0.05)
    for _ in range(100):
        opt.zero_grad()
        correlation_penalty(x, z).backward()
        opt.step()
    after = pearson_correlation(x, z).abs().max().item()
    assert after < 0.05 < before


def test_correlation_constant_columns_no_nan():
    x = torch.randn(50, 2, dtype=torch.float64)
    x[:, 1] = 3.0
    z = torch.full((50, 1), 0.7, dtype=torch.float64, requires_grad=True)  # all means equal
    xr = x.clone().requires_grad_(True)
    r = pearson_correlation(xr, z)
    assert r.abs().max().item() < 1e-12  # mean of a constant is exact only up to round-off
    pen = correlation_penalty(xr, z)
    pen.backward()
    assert torch.isfinite(xr.grad).all() and torch.isfinite(z.grad).all()
    # float32 constant column (mean not exactly representable): still ~0, still finite
    x32 = torch.randn(1000, 1)
    c32 = torch.full((1000, 1), 0.1, requires_grad=True)
    p32 = correlation_penalty(x32, c32)
    p32.backward()
    assert p32.item() < 1e-3 and torch.isfinite(c32.grad).all()


def test_offdiag_cov_norm():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(100, 3)) @ rng.normal(size=(3, 3))
    c = np.cov(z, rowvar=False, bias=True)
    expected = np.sqrt(np.sum(c**2) - np.sum(np.diag(c) ** 2))
    assert offdiag_cov_norm(torch.from_numpy(z)).item() == pytest.approx(expected, rel=1e-10)
    c1 = np.cov(z, rowvar=False, bias=False)
    expected1 = np.sqrt(np.sum(c1**2) - np.sum(np.diag(c1) ** 2))
    assert offdiag_cov_norm(torch.from_numpy(z), correction=1).item() == pytest.approx(expected1, rel=1e-10)


def test_offdiag_cov_norm_k1_and_diagonal_are_zero_with_finite_grad():
    z1 = torch.randn(40, 1, dtype=torch.float64, requires_grad=True)
    v = offdiag_cov_norm(z1)
    v.backward()
    assert v.item() == 0.0 and torch.equal(z1.grad, torch.zeros_like(z1))
    # exactly uncorrelated columns: norm 0, gradient finite (subgradient 0)
    z2 = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], requires_grad=True)
    v2 = offdiag_cov_norm(z2)
    v2.backward()
    assert v2.item() == 0.0 and torch.isfinite(z2.grad).all()


def test_offdiag_cov_norm_gradient_descent():
    torch.manual_seed(0)
    base = torch.randn(200, 1, dtype=torch.float64)
    z = torch.cat([base, base + 0.5 * torch.randn(200, 1, dtype=torch.float64)], 1)
    z.requires_grad_(True)
    before = offdiag_cov_norm(z).item()
    opt = torch.optim.SGD([z], lr=50.0)
    for _ in range(20):
        opt.zero_grad()
        offdiag_cov_norm(z).backward()
        opt.step()
    assert offdiag_cov_norm(z).item() < 0.1 * before


# ----------------------------------------------------------------------------------------------
# KSG mutual information
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [50, 300, 1000])
def test_ksg_matches_sklearn_compute_mi_cc_exactly(seed, n):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n) * 2.0 + 1.0
    z = np.sin(x) * (seed % 3) + rng.standard_t(3, size=n)
    for k in (3, 5):
        ref = sklearn_mi._compute_mi_cc(x, z, k)  # raw data, clipped at 0
        ours = ksg_mutual_information(x, z, k=k, standardize=False)
        assert max(ours, 0.0) == pytest.approx(ref, abs=1e-12)


def test_ksg_negative_estimate_is_not_clipped():
    # independent samples: some seeds give a (slightly) negative raw estimate that sklearn clips
    values = []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        x, z = rng.normal(size=200), rng.normal(size=200)
        values.append(ksg_mutual_information(x, z, standardize=False))
        assert sklearn_mi._compute_mi_cc(x, z, 5) == pytest.approx(max(values[-1], 0.0), abs=1e-12)
    assert min(values) < 0.0


@pytest.mark.parametrize("seed", range(3))
def test_ksg_matches_mutual_info_regression(seed):
    # sklearn standardises (divides by the std) and jitters by 1e-10 * max(1, mean|x|); with
    # continuous data the jitter changes no neighbour count, so agreement is to round-off.
    rng = np.random.default_rng(seed)
    x = rng.normal(size=800) * 3.0 + 1.0
    z = x**2 + rng.normal(size=800) * 2.0
    ref = mutual_info_regression(x[:, None], z, n_neighbors=5, discrete_features=False, random_state=0)[0]
    assert ksg_mutual_information(x, z, k=5) == pytest.approx(ref, abs=1e-6)
    assert ref > 0.5


def _gauss_mi_estimates(cov: np.ndarray, d: int, n: int, seeds: range) -> np.ndarray:
    out = []
    for s in seeds:
        w = np.random.default_rng(s).multivariate_normal(np.zeros(len(cov)), cov, size=n)
        out.append(ksg_mutual_information(w[:, :d], w[:, d:], k=5))
    return np.array(out)


@pytest.mark.parametrize("rho", [0.0, 0.6, 0.9])
def test_ksg_gaussian_closed_form_1d(rho):
    # I = -0.5 log(1 - rho^2). Over 100 seeds at n = 1000, k = 5 the KSG estimate has
    # sd 0.019 (rho=0), 0.024 (rho=0.6), ~0.04 (rho=0.9, n=500) and bias < 0.01. The mean of
    # 10 seeds therefore has sd <= ~0.013; tolerance 0.04 is ~3 sd plus the bias.
    cov = np.array([[1.0, rho], [rho, 1.0]])
    est = _gauss_mi_estimates(cov, 1, 1000, range(10))
    truth = -0.5 * math.log(1 - rho**2)
    assert est.mean() == pytest.approx(truth, abs=0.04)
    assert np.all(np.abs(est - truth) < 0.12)  # every single run within ~5 sd


def test_ksg_gaussian_closed_form_multivariate():
    # I = -0.5 log(det C / (det C_xx det C_zz)) = 0.2299 for this C; single-run sd at n = 1000
    # is 0.023 (100 seeds), so the 10-seed mean has sd ~0.007; tolerance 0.03.
    cov = np.array([[1, 0.3, 0.5, 0.2], [0.3, 1, 0.1, 0.4], [0.5, 0.1, 1, 0.3], [0.2, 0.4, 0.3, 1.0]])
    truth = -0.5 * math.log(np.linalg.det(cov) / (np.linalg.det(cov[:2, :2]) * np.linalg.det(cov[2:, 2:])))
    est = _gauss_mi_estimates(cov, 2, 1000, range(10))
    assert est.mean() == pytest.approx(truth, abs=0.03)


def test_ksg_standardize_gives_scale_invariance():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 2))
    z = x[:, :1] + rng.normal(size=(500, 1))
    base = ksg_mutual_information(x, z)
    assert ksg_mutual_information(x * [100.0, 0.01], z * 1e3) == pytest.approx(base, rel=1e-9)
    assert ksg_mutual_information(torch.from_numpy(x), torch.from_numpy(z)) == base


# ----------------------------------------------------------------------------------------------
# KS statistic
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_ks_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    mu = rng.normal(loc=0.3 * seed, scale=0.5, size=50 + 40 * seed)
    prior = rng.normal(size=1000)
    ref = ks_2samp(mu, prior).statistic
    assert ks_statistic(torch.from_numpy(mu), prior) == pytest.approx(ref, abs=1e-15)
    assert ks_statistic(mu[:, None], prior[:, None]) == pytest.approx(ref, abs=1e-15)
    # ties between and within samples
    a, b = np.round(mu, 1), np.round(prior, 1)
    assert ks_statistic(a, b) == pytest.approx(ks_2samp(a, b).statistic, abs=1e-15)


# ----------------------------------------------------------------------------------------------
# input validation
# ----------------------------------------------------------------------------------------------


def test_bad_shapes_and_values_raise_naming_the_argument():
    good = torch.randn(20, 2)
    with pytest.raises(ValueError, match="`x`.*shape"):
        henze_zirkler(torch.randn(4, 5, 2))
    with pytest.raises(ValueError, match="`x`.*NaN"):
        henze_zirkler(torch.tensor([[0.0, 1.0], [float("nan"), 2.0], [1.0, 1.0], [2.0, 0.0]]))
    with pytest.raises(ValueError, match="`x`.*at least 3"):
        henze_zirkler(torch.randn(2, 1))
    with pytest.raises(ValueError, match="`b`.*shape"):
        pearson_correlation(good, torch.randn(20, 1, 1))
    with pytest.raises(ValueError, match="`a`.*NaN"):
        correlation_penalty(torch.full((20, 1), float("inf")), good)
    with pytest.raises(ValueError, match="`a` and `b`.*same number of rows"):
        correlation_penalty(good, torch.randn(21, 1))
    with pytest.raises(ValueError, match="`reduction`"):
        correlation_penalty(good, good, reduction="sum")
    with pytest.raises(ValueError, match="`z`.*shape"):
        offdiag_cov_norm(torch.randn(3, 2, 2))
    with pytest.raises(ValueError, match="`z`.*NaN"):
        offdiag_cov_norm(torch.tensor([[float("nan"), 1.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="`x` and `z`.*same number of rows"):
        ksg_mutual_information(np.zeros((10, 1)), np.zeros((11, 1)))
    with pytest.raises(ValueError, match="`k`"):
        ksg_mutual_information(np.random.rand(10), np.random.rand(10), k=10)
    with pytest.raises(ValueError, match="`z`.*NaN"):
        ksg_mutual_information(np.random.rand(10), np.r_[np.random.rand(9), np.nan])
    with pytest.raises(ValueError, match="`mu_z`.*univariate"):
        ks_statistic(np.zeros((10, 2)), np.zeros(10))
    with pytest.raises(ValueError, match="`prior_samples`.*shape"):
        ks_statistic(np.zeros(10), np.zeros((2, 2, 2)))


@pytest.mark.parametrize("n, k", [(3, 3), (4, 5), (5, 5)])
def test_hz_refuses_no_more_rows_than_columns(n, k):
    """``n <= k`` points have a singular covariance whatever their law (issue 39): an error, not
    an ordinary-looking value; ``n = k + 1`` is fine."""
    x = torch.from_numpy(_sample("gauss", n, k, 0))
    with pytest.raises(ValueError, match=rf"`x` has n={n} rows and k={k} columns: .*pass more rows than columns"):
        henze_zirkler(x)
    assert torch.isfinite(henze_zirkler(torch.from_numpy(_sample("gauss", k + 1, k, 0))))
