"""Tests for pyro_bnnlv.models.linear and pyro_bnnlv.stats.linear_closed_forms (invariances paper,
sec. 3-4, eq. 3, 6a, 9-19, Fig. 1-2)."""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from numpy.polynomial.hermite_e import hermegauss
from pyro import poutine
from pyro.infer import Trace_ELBO

from pyro_bnnlv.models.linear import Gaussian, OverparametrisedLinear, design_matrix
from pyro_bnnlv.reproduce.invariance import invariance_gap_table, plot_invariance_gap
from pyro_bnnlv.stats.linear_closed_forms import (
    data_related_bound,
    elbo_terms,
    exact_posterior,
    expected_log_likelihood,
    invariance_gap,
    invariance_gap_isotropic,
    kl_gaussians,
    log_evidence,
    predictive_moments,
    prior_gaussian,
    q0,
    qmix,
    theta_star_0,
    theta_star_mix,
)

F64 = torch.float64
SIGMA_Y = (2 * math.pi * math.e) ** -0.5  # the figures' noise: sigma_y^2 = 1/(2 pi e)


@pytest.fixture(autouse=True)
def _seed():
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    yield


def _guide_for(q: Gaussian):
    """A fixed full-covariance Gaussian guide for site "w"."""
    L = torch.linalg.cholesky(q.cov)

    def guide(x=None, y=None, batch_size=None):
        pyro.sample("w", dist.MultivariateNormal(q.loc, scale_tril=L))

    return guide


def _log_weights(model, q: Gaussian, x, y, n: int) -> torch.Tensor:
    """Per-sample ``ln p(y|w) + ln p(w) - ln q(w)`` with torch.distributions (no Pyro, no closed forms)."""
    qd = torch.distributions.MultivariateNormal(q.loc, covariance_matrix=q.cov)
    w = qd.sample((n,))
    prior = torch.distributions.Normal(model.prior_loc.to(F64), model.weight_prior_scale.to(F64))
    lik = torch.distributions.Normal(model.f(x, w), model.noise_scale).log_prob(y).sum(-1)
    return lik + prior.log_prob(w).sum(-1) - qd.log_prob(w)


def _pyro_elbo(model, q: Gaussian, x, y, num_particles: int) -> float:
    elbo = Trace_ELBO(num_particles=num_particles, vectorize_particles=True, max_plate_nesting=1)
    return -elbo.loss(model, _guide_for(q), x, y)


def _quadrature_elbo(prior: Gaussian, q: Gaussian, y, sigma_y, order: int = 12) -> float:
    """ELBO by tensor-product Gauss-Hermite quadrature over q, from log densities only."""
    K = q.loc.shape[0]
    z1, w1 = hermegauss(order)
    w1 = w1 / w1.sum()
    grids = np.meshgrid(*([z1] * K), indexing="ij")
    Z = torch.as_tensor(np.stack([g.ravel() for g in grids], -1), dtype=F64)
    Wq = torch.as_tensor(np.prod(np.meshgrid(*([w1] * K), indexing="ij"), 0).ravel(), dtype=F64)
    w = q.loc + Z @ torch.linalg.cholesky(q.cov).T
    f = w.mean(-1, keepdim=True)  # x = 1: f = 1^T w / K
    lik = torch.distributions.Normal(f, torch.tensor(sigma_y, dtype=F64)).log_prob(y).sum(-1)
    lp = torch.distributions.MultivariateNormal(prior.loc, prior.cov).log_prob(w)
    lq = torch.distributions.MultivariateNormal(q.loc, q.cov).log_prob(w)
    return float((Wq * (lik + lp - lq)).sum())


# ---------------------------------------------------------------------------------------------
# the Pyro model
# ---------------------------------------------------------------------------------------------


def test_prior_scaling_and_f_shapes():
    K, N = 5, 3
    model = OverparametrisedLinear(K, prior_loc=0.5, prior_scale=2.0, noise_scale=0.3)
    # sigma^2 = K sigma_0^2 per weight, so Var[1^T w / K] = sigma_0^2 for every K
    assert torch.allclose(model.weight_prior_scale, torch.full((K,), math.sqrt(K) * 2.0, dtype=F64))
    prior = model.prior()
    assert float(predictive_moments(prior, 0.3).var_f) == pytest.approx(4.0, rel=1e-12)
    w = torch.randn(K, dtype=F64)
    ones = torch.ones(N, dtype=F64)
    expected = w.mean().expand(N)
    for x in (ones, ones.unsqueeze(-1), torch.full((N, K), 1.0 / K, dtype=F64)):
        assert torch.allclose(model.f(x, w), expected)
    assert model.f(None, w).shape == (1,)
    X = torch.randn(N, K, dtype=F64)
    assert torch.allclose(model.f(X, w), X @ w)
    assert model.f(X, torch.randn(7, K, dtype=F64)).shape == (7, N)
    assert model.f(X, torch.randn(2, 7, K, dtype=F64)).shape == (2, 7, N)
    with pytest.raises(ValueError, match="w must have shape"):
        model.f(X, torch.randn(3, K + 1))
    with pytest.raises(ValueError, match="x must have shape"):
        model.f(torch.randn(N, K + 2), w)
    with pytest.raises(ValueError, match="prior_scale"):
        OverparametrisedLinear(K, prior_scale=-1.0)
    with pytest.raises(ValueError, match="pass x"):
        model()
    with pytest.raises(ValueError, match="different numbers of rows"):
        model(torch.ones(4, dtype=F64), torch.ones(3, dtype=F64))


class _PresetMVN(dist.MultivariateNormal):
    """A MultivariateNormal whose rsample returns preset values (log_prob is the real one)."""

    def __init__(self, loc, scale_tril, value):
        super().__init__(loc, scale_tril=scale_tril)
        self._value = value

    def rsample(self, sample_shape=torch.Size()):
        return self._value

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(_PresetMVN, _instance)
        new = super().expand(batch_shape, _instance=new)
        new._value = self._value
        return new


def test_vectorised_particles_equal_average_of_single_particles():
    """The vectorised-particle trap: obs must be (P, N), and the vectorised ELBO with P preset
    guide samples must equal the average of P single-particle Trace_ELBOs on the same samples."""
    K, N, P = 6, 5, 16
    model = OverparametrisedLinear(K, prior_loc=0.2, prior_scale=1.0, noise_scale=0.4)
    y = torch.randn(N, dtype=F64) + 1.0
    x = torch.linspace(-1, 2, N, dtype=F64)  # scalar inputs: f_n = x_n 1^T w / K
    loc = torch.randn(K, dtype=F64)
    L = torch.linalg.cholesky(torch.eye(K, dtype=F64) * 0.5 + 0.1)
    samples = loc + torch.randn(P, K, dtype=F64) @ L.T

    def guide_all(x=None, y=None, batch_size=None):
        pyro.sample("w", _PresetMVN(loc, L, samples.unsqueeze(-2)))  # (P, 1, K)

    vec = Trace_ELBO(num_particles=P, vectorize_particles=True, max_plate_nesting=1)
    loss_vec = vec.loss(model, guide_all, x, y)

    single = []
    for p in range(P):

        def guide_p(x=None, y=None, batch_size=None, _w=samples[p]):
            pyro.sample("w", _PresetMVN(loc, L, _w))

        single.append(Trace_ELBO(num_particles=1, max_plate_nesting=1).loss(model, guide_p, x, y))
    assert loss_vec == pytest.approx(float(np.mean(single)), rel=1e-12, abs=1e-10)

    # the same numbers by hand, so both are the right ELBO and not a shared mistake
    noise = torch.tensor(0.4, dtype=F64)
    lw = (
        torch.distributions.Normal(samples @ design_matrix(K, x).T, noise).log_prob(y).sum(-1)
        + torch.distributions.Normal(torch.tensor(0.2, dtype=F64), torch.tensor(K, dtype=F64).sqrt())
        .log_prob(samples)
        .sum(-1)
        - torch.distributions.MultivariateNormal(loc, scale_tril=L).log_prob(samples)
    )
    assert -loss_vec == pytest.approx(float(lw.mean()), rel=1e-12)

    # shapes inside the vectorised model trace
    with pyro.plate("particles", P, dim=-2):
        g = poutine.trace(guide_all).get_trace(x, y)
        tr = poutine.trace(poutine.replay(model, trace=g)).get_trace(x, y)
    assert tr.nodes["w"]["value"].shape == (P, 1, K)
    assert tr.nodes["obs"]["fn"].batch_shape == (P, N)


def test_predictive_parallel_and_subsampling_shapes():
    K, N = 4, 9
    model = OverparametrisedLinear(K, noise_scale=0.5)
    x = torch.ones(N, dtype=F64)
    pred = pyro.infer.Predictive(model, num_samples=11, parallel=True)(x)
    assert pred["w"].shape == (11, 1, K)
    assert pred["obs"].shape == (11, N)
    y = torch.randn(N, dtype=F64)
    tr = poutine.trace(model).get_trace(x, y, batch_size=3)
    assert tr.nodes["obs"]["value"].shape == (3,)
    assert tr.nodes["obs"]["scale"] == pytest.approx(N / 3)


# ---------------------------------------------------------------------------------------------
# exact posterior (eq. 13)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("general_x", [False, True])
def test_exact_posterior_matches_bruteforce_conditioning(general_x):
    rng = np.random.default_rng(1)
    K, N, sigma_y, sigma0 = 7, 4, 0.6, 0.8
    mu = rng.normal(size=K)
    X = rng.normal(size=(N, K)) if general_x else np.full((N, K), 1.0 / K)
    y = rng.normal(size=N) + 1.0
    Sigma = np.eye(K) * K * sigma0**2
    # joint Gaussian of (w, y), then condition on y
    C = X @ Sigma @ X.T + sigma_y**2 * np.eye(N)
    gain = Sigma @ X.T @ np.linalg.inv(C)
    m_bf = mu + gain @ (y - X @ mu)
    S_bf = Sigma - gain @ X @ Sigma
    post = exact_posterior(prior_gaussian(K, torch.tensor(mu), sigma0), y, sigma_y, X if general_x else None)
    np.testing.assert_allclose(post.loc.numpy(), m_bf, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(post.cov.numpy(), S_bf, rtol=1e-10, atol=1e-12)
    if not general_x:
        # printed eq. 13: same covariance; its mean V_p* sum(y)/(K sigma_y^2) 1 misses Sigma^-1 mu
        V = np.linalg.inv(N / (K**2 * sigma_y**2) * np.ones((K, K)) + np.linalg.inv(Sigma))
        np.testing.assert_allclose(V, S_bf, rtol=1e-10)
        printed = V @ (y.sum() / (K * sigma_y**2) * np.ones(K))
        assert np.abs(printed - m_bf).max() > 1e-2  # wrong for mu != 0 ...
        np.testing.assert_allclose(V @ (np.linalg.inv(Sigma) @ mu) + printed, m_bf, rtol=1e-10)
        post0 = exact_posterior(prior_gaussian(K, 0.0, sigma0), y, sigma_y)
        np.testing.assert_allclose(post0.loc.numpy(), printed, rtol=1e-10)  # ... right for mu = 0


def test_trace_elbo_of_pyro_model_matches_closed_form_elbo():
    """Pyro's Trace_ELBO (many vectorised particles) vs the analytic ELBO, within 4 MC s.e."""
    torch.manual_seed(3)
    K, N, P = 8, 6, 20000
    for general_x in (False, True):
        model = OverparametrisedLinear(K, prior_loc=0.3, prior_scale=0.9, noise_scale=0.5)
        x = torch.randn(N, K, dtype=F64) / K if general_x else torch.ones(N, dtype=F64)
        y = torch.randn(N, dtype=F64) + 1.0
        A = torch.randn(K, K, dtype=F64) * 0.3
        q = Gaussian(torch.randn(K, dtype=F64), A @ A.T + 0.2 * torch.eye(K, dtype=F64))
        X = design_matrix(K, x)
        closed = float(elbo_terms(q, model.prior(), y, 0.5, X).elbo)
        mc = _pyro_elbo(model, q, x, y, P)
        se = float(_log_weights(model, q, x, y, P).std()) / math.sqrt(P)
        assert abs(mc - closed) < 4 * se, (general_x, mc, closed, se)
        assert se < 0.1


# ---------------------------------------------------------------------------------------------
# q_0, q_mix, the invariance gap (eq. 6a, 9, 10, 14-16)
# ---------------------------------------------------------------------------------------------


def test_qmix_at_theta_mix_is_exact_posterior_and_elbo_is_log_evidence():
    torch.manual_seed(4)
    for K, N, mu in [(2, 1, 0.0), (5, 10, 0.7), (32, 3, -0.4)]:
        y = torch.randn(N, dtype=F64) + 1.0
        prior = prior_gaussian(K, mu, 1.3)
        post = exact_posterior(prior, y, 0.4)
        m, lam = theta_star_mix(y, K, 0.4)
        q = qmix(prior, m, lam)
        assert torch.allclose(q.loc, post.loc, atol=1e-12)
        assert torch.allclose(q.cov, post.cov, atol=1e-12)
        assert float(elbo_terms(q, prior, y, 0.4).elbo) == pytest.approx(float(log_evidence(prior, y, 0.4)), abs=1e-9)
        # eq. 18's optimum is not unique: any (m, lambda) with the same sums gives the same q_mix
        d = torch.randn(K, dtype=F64)
        d = d - d.mean()
        q2 = qmix(prior, m + d, lam * (1 + 0.5 * d / d.abs().max()))
        assert torch.allclose(q2.loc, post.loc, atol=1e-12)
        assert torch.allclose(q2.cov, post.cov, atol=1e-12)


def test_eq16_matches_general_kl():
    for K, s2, lam, m, mu in [(2, 2.0, 0.3, 1.0, 0.0), (17, 17 * 0.5, 4.0, -2.0, 0.3)]:
        prior = Gaussian(torch.full((K,), mu, dtype=F64), torch.eye(K, dtype=F64) * s2)
        assert float(invariance_gap(prior, m, lam)) == pytest.approx(
            float(invariance_gap_isotropic(K, s2, lam)), rel=1e-10
        )


@pytest.mark.parametrize("K", [2, 3])
def test_eq10_gap_equals_elbo_difference_by_quadrature(K):
    """KL[q0||qmix] = ELBO(qmix) - ELBO(q0), the ELBOs by Gauss-Hermite quadrature of log densities."""
    torch.manual_seed(5)
    y = torch.randn(4, dtype=F64) + 1.0
    # a non-isotropic prior with lambda proportional to sigma^2 (condition (7)), and random m
    prior = Gaussian(torch.randn(K, dtype=F64), torch.diag(torch.rand(K, dtype=F64) * 3 + 0.5))
    sigma2 = torch.diagonal(prior.cov)
    m, lam = torch.randn(K, dtype=F64) * 2, 0.7 * sigma2
    elbo_0 = _quadrature_elbo(prior, q0(prior, m, lam), y, SIGMA_Y)
    elbo_mix = _quadrature_elbo(prior, qmix(prior, m, lam), y, SIGMA_Y)
    gap = float(invariance_gap(prior, m, lam))
    assert gap > 0.05
    assert elbo_mix - elbo_0 == pytest.approx(gap, abs=1e-9)
    # the closed-form ELBOs agree with quadrature, and eq. 9 (equal ELL) holds
    assert float(elbo_terms(q0(prior, m, lam), prior, y, SIGMA_Y).elbo) == pytest.approx(elbo_0, abs=1e-9)
    assert float(expected_log_likelihood(q0(prior, m, lam), y, SIGMA_Y)) == pytest.approx(
        float(expected_log_likelihood(qmix(prior, m, lam), y, SIGMA_Y)), abs=1e-10
    )


def test_eq10_needs_lambda_proportional_to_prior_variance():
    """Without condition (7) (lambda not proportional to sigma^2) eq. 9 and eq. 10 fail."""
    K = 4
    y = torch.ones(3, dtype=F64)
    prior = prior_gaussian(K, 0.0, 1.0)
    m, lam = torch.ones(K, dtype=F64), torch.tensor([0.1, 1.0, 5.0, 20.0], dtype=F64)
    e0 = elbo_terms(q0(prior, m, lam), prior, y, SIGMA_Y)
    em = elbo_terms(qmix(prior, m, lam), prior, y, SIGMA_Y)
    assert abs(float(e0.ell - em.ell)) > 0.1
    assert abs(float(em.elbo - e0.elbo - invariance_gap(prior, m, lam))) > 0.1

    # the general identity: KL[q0||p] - KL[qmix||p] - KL[q0||qmix] = E_q0[ln g_mix] - E_qmix[ln g_mix]
    def e_log_gmix(q):  # ln g_mix(w) = -(1^T (w - m))^2 / (2 1^T lambda) + const (eq. 14)
        return -(((q.loc - m).sum()) ** 2 + q.cov.sum()) / (2 * lam.sum())

    a, b = q0(prior, m, lam), qmix(prior, m, lam)
    residual = e0.kl - em.kl - invariance_gap(prior, m, lam)
    assert float(residual) == pytest.approx(float(e_log_gmix(a) - e_log_gmix(b)), abs=1e-10)
    assert abs(float(residual)) > 0.1


def test_eq10_gap_equals_elbo_difference_by_pyro_monte_carlo():
    """Same identity at K = 16 with Pyro's Trace_ELBO on the Pyro model (q_mix at theta_mix* is the
    exact posterior, so its ELBO estimate has zero variance)."""
    torch.manual_seed(6)
    K, N, P = 16, 10, 20000
    model = OverparametrisedLinear(K, prior_scale=1.0, noise_scale=SIGMA_Y)
    x, y = torch.ones(N, dtype=F64), torch.ones(N, dtype=F64)
    prior = model.prior()
    m, lam = theta_star_mix(y, K, SIGMA_Y)
    q_0, q_m = q0(prior, m, lam), qmix(prior, m, lam)
    diff = _pyro_elbo(model, q_m, x, y, P) - _pyro_elbo(model, q_0, x, y, P)
    se = math.hypot(
        float(_log_weights(model, q_0, x, y, P).std()), float(_log_weights(model, q_m, x, y, P).std())
    ) / math.sqrt(P)
    gap = float(invariance_gap(prior, m, lam))
    assert gap == pytest.approx(31.1409, abs=1e-3)
    assert abs(diff - gap) < 4 * se, (diff, gap, se)
    assert se < 0.1


# ---------------------------------------------------------------------------------------------
# optimal parameters (eq. 17-19)
# ---------------------------------------------------------------------------------------------


def _elbo_grad(build, prior, m, lam, y):
    m = m.clone().requires_grad_(True)
    log_lam = lam.log().clone().requires_grad_(True)
    elbo = elbo_terms(build(prior, m, log_lam.exp()), prior, y, SIGMA_Y).elbo
    return torch.autograd.grad(elbo, (m, log_lam)), float(elbo.detach())


def test_optimal_parameters_are_stationary_and_eq19_mean_is_misprinted():
    K, N = 8, 10
    y = torch.ones(N, dtype=F64)
    prior = prior_gaussian(K, 0.0, 1.0)
    post = exact_posterior(prior, y, SIGMA_Y)

    (gm, gl), elbo_mix = _elbo_grad(qmix, prior, *theta_star_mix(y, K, SIGMA_Y), y)
    assert gm.abs().max() < 1e-8 and gl.abs().max() < 1e-8

    m0, lam0 = theta_star_0(prior, y, SIGMA_Y)
    assert torch.allclose(lam0, torch.full((K,), K**2 * SIGMA_Y**2 / N, dtype=F64))  # eq. 19 lambda
    (gm, gl), elbo_0 = _elbo_grad(q0, prior, m0, lam0, y)
    assert gm.abs().max() < 1e-8 and gl.abs().max() < 1e-8
    # q0(theta_0*) is the KL-optimal mean-field Gaussian: posterior mean, diagonal posterior precision
    q = q0(prior, m0, lam0)
    assert torch.allclose(q.loc, post.loc, atol=1e-12)
    prec = torch.linalg.inv(post.cov)
    assert torch.allclose(1 / torch.diagonal(q.cov), torch.diagonal(prec), rtol=1e-10)
    # closed form for mu = 0: m_0* = ybar (N s0^2 + K sy^2) / (N s0^2 + sy^2)
    s2 = SIGMA_Y**2
    assert torch.allclose(m0, torch.full((K,), (N + K * s2) / (N + s2), dtype=F64))

    # the printed m_0* = ybar 1 is not stationary and has a lower ELBO
    mp, _ = theta_star_0(prior, y, SIGMA_Y, as_printed=True)
    (gm, _), elbo_printed = _elbo_grad(q0, prior, mp, lam0, y)
    assert gm.abs().max() > 0.1  # vs < 1e-8 at the corrected optimum
    assert elbo_printed < elbo_0 - 0.1
    assert elbo_mix > elbo_0  # the invariance-abiding optimum is the tighter bound


# ---------------------------------------------------------------------------------------------
# Fig. 1, Fig. 2, eq. 3 / 11
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("N", [1, 10])
def test_fig1_gap_linear_at_theta_mix_and_vanishing_at_theta_0(N):
    y = torch.ones(N, dtype=F64)
    a = N / SIGMA_Y**2  # N sigma_0^2 / sigma_y^2 with sigma_0 = 1
    Ks = np.array([2**j for j in range(1, 10)])  # dense closed forms up to K = 512
    g_mix, g_0 = [], []
    for K in Ks:
        prior = prior_gaussian(int(K), 0.0, 1.0)
        g_mix.append(float(invariance_gap(prior, *theta_star_mix(y, int(K), SIGMA_Y))))
        m0, lam0 = theta_star_0(prior, y, SIGMA_Y)
        g_0.append(float(invariance_gap(prior, m0, lam0)))
        assert g_0[-1] == pytest.approx(float(invariance_gap_isotropic(int(K), K, lam0[0])), rel=1e-8)
    g_mix, g_0 = np.array(g_mix), np.array(g_0)
    # theta_mix*: exactly linear, (K - 1)/2 (ln phi + 1/phi - 1) with phi = 1 + a
    slope = 0.5 * (math.log1p(a) + 1 / (1 + a) - 1)
    np.testing.assert_allclose(g_mix / (Ks - 1), slope, rtol=1e-9)
    assert np.all(g_0 < g_mix)
    # theta_0*: rises, peaks, then vanishes like a^2 / (4K); large K via eq. 16 (O(1) per K,
    # checked equal to the general KL above), lambda_0* = K^2 sigma_y^2 / N, sigma^2 = K
    Kl = np.array([2**j for j in range(1, 25)])
    g_0l = np.array([float(invariance_gap_isotropic(int(K), K, K**2 * SIGMA_Y**2 / N)) for K in Kl])
    np.testing.assert_allclose(g_0l[: len(Ks)], g_0, rtol=1e-8)
    peak = int(np.argmax(g_0l))
    assert np.all(np.diff(g_0l[peak:]) < 0)
    assert g_0l[-1] < 0.01 * g_0l[peak]
    assert Kl[-1] * g_0l[-1] == pytest.approx(a**2 / 4, rel=0.01)
    if N == 1:
        assert Kl[peak] == 8  # already decaying inside Fig. 1's K range (2..128)
    else:
        assert Kl[peak] == 64  # N = 10: true peak at K = 82, decay only late in Fig. 1's range


def test_eq11_bound_holds_at_theta_0_and_is_exceeded_at_theta_mix():
    N = 1
    df = invariance_gap_table(Ks=range(2, 129, 2), N=N)
    q0_rows = df[df.approx == "q0"]
    at0 = q0_rows[q0_rows.theta == "theta_0*"].set_index("K")
    atm = q0_rows[q0_rows.theta == "theta_mix*"].set_index("K")
    bound = 2 * N * math.pi * math.e  # N (sigma_0^2 + y^2) / (2 sigma_y^2)
    assert np.allclose(at0.bound, bound)
    # eq. 11 at the q0 optimum: gap <= KL[q0||p] <= bound
    assert np.all(at0.gap <= at0.kl + 1e-12) and np.all(at0.kl <= bound)
    # the theta_mix* gap exceeds the unattainable bound from K ~ 19 on (N = 1)
    crossing = atm.index[atm.gap > bound].min()
    assert crossing == 20
    assert np.all(atm.gap[atm.index >= crossing] > bound)


def test_fig2_terms_and_predictive_variance_reverting_to_prior():
    df = invariance_gap_table(Ks=[2, 8, 32, 128, 512, 1024], N=10)
    sel = lambda t, a: df[(df.theta == t) & (df.approx == a)].set_index("K")  # noqa: E731
    mix_opt = sel("theta_mix*", "qmix")
    # q_mix(theta_mix*) is the exact posterior: ELL, KL, ELBO and predictive constant in K
    for col in ("ell", "kl", "elbo", "pred_mean", "pred_var_y"):
        assert np.ptp(mix_opt[col]) < 1e-8, col
    np.testing.assert_allclose(mix_opt.elbo, mix_opt.log_evidence, atol=1e-8)
    # eq. 9: for either theta, q0 and qmix give the same predictive and ELL
    for t in ("theta_0*", "theta_mix*"):
        for col in ("ell", "pred_mean", "pred_var_y"):
            np.testing.assert_allclose(sel(t, "q0")[col], sel(t, "qmix")[col], rtol=1e-9, atol=1e-9)
    # the mean-field optimum: predictive variance reverts to the prior's, KL[qmix(theta_0*)||p] shrinks
    mf = sel("theta_0*", "q0")
    prior_var = mf.prior_pred_var_y.iloc[0]
    assert prior_var == pytest.approx(1 + SIGMA_Y**2)
    assert np.all(np.diff(mf.pred_var_y) > 0)
    assert mf.pred_var_y.iloc[-1] > 0.85 * prior_var
    Ks = mf.index.to_numpy()  # derived: Var f* = sigma_0^2 K sigma_y^2 / (N sigma_0^2 + K sigma_y^2)
    np.testing.assert_allclose(mf.pred_var_f, Ks * SIGMA_Y**2 / (10 + Ks * SIGMA_Y**2), rtol=1e-9)
    assert mf.pred_var_y.iloc[0] < 0.1 * prior_var
    assert np.all(np.diff(sel("theta_0*", "qmix").kl) < 0)
    assert np.all(np.diff(mf.ell) < 0)
    # its predictive mean stays the posterior mean (eq. 19 corrected); the printed mean collapses it
    np.testing.assert_allclose(mf.pred_mean, mix_opt.pred_mean, rtol=1e-9)
    printed = invariance_gap_table(Ks=[1024], N=10, as_printed=True)
    assert printed[(printed.theta == "theta_0*")].pred_mean.iloc[0] < 0.2


def test_table_and_plot(tmp_path):
    df = invariance_gap_table()
    assert len(df) == 64 * 4
    assert set(df.theta) == {"theta_0*", "theta_mix*"} and set(df.approx) == {"q0", "qmix"}
    assert df.K.min() == 2 and df.K.max() == 128
    out = tmp_path / "fig.png"
    fig = plot_invariance_gap(df, out)
    assert out.stat().st_size > 10_000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(fig.axes) == 5 and fig.axes[0].lines  # returned, still drawable
    import matplotlib.pyplot as plt

    outer, axes = plt.subplots(2, 5)
    assert plot_invariance_gap(df, axes=axes[1]) is outer  # a row of the caller's figure, no file
    assert all(ax.lines for ax in axes[1]) and not any(ax.lines for ax in axes[0])
    with pytest.raises(ValueError, match="axes must hold 5"):
        plot_invariance_gap(df, axes=axes[0, :2])
    plt.close("all")


def test_closed_form_input_validation():
    prior = prior_gaussian(3)
    with pytest.raises(ValueError, match="lam"):
        q0(prior, 0.0, -1.0)
    with pytest.raises(ValueError, match="diagonal"):
        qmix(Gaussian(prior.loc, prior.cov + 0.1), 0.0, 1.0)
    with pytest.raises(ValueError, match="shape"):
        q0(prior, torch.zeros(4), 1.0)
    with pytest.raises(ValueError, match="y must have shape"):
        exact_posterior(prior, torch.ones(2, 2), 1.0)
    with pytest.raises(ValueError, match="X must have shape"):
        data_related_bound(prior, torch.ones(2), 1.0, X=torch.ones(2, 4))
    with pytest.raises(ValueError, match="noise_scale"):
        exact_posterior(prior, torch.ones(2), 0.0)
    assert float(kl_gaussians(prior, prior)) == pytest.approx(0.0, abs=1e-12)


def test_init_to_mean_does_not_alias_the_prior():
    """AutoNormal(init_loc_fn=init_to_mean) turns the prior's mean tensor into its loc parameter;
    the model must hand out copies, or Adam moves the prior (found while fitting sec. 4's model)."""
    from pyro.infer.autoguide import AutoNormal, init_to_mean

    from pyro_bnnlv import fit_svi

    model = OverparametrisedLinear(4, prior_loc=0.0, noise_scale=0.5)
    guide = AutoNormal(model, init_loc_fn=init_to_mean)
    x, y = torch.ones(5, dtype=F64), torch.full((5,), 2.0, dtype=F64)
    fit_svi(model, guide, x, y, num_steps=20, lr=0.1, seed=0, progress=False)
    assert torch.equal(model.prior_loc, torch.zeros(4, dtype=F64))
    assert torch.equal(model.weight_prior_scale, torch.full((4,), 2.0, dtype=F64))
    loc, _ = guide._get_loc_and_scale("w")
    assert float(loc.detach().abs().max()) > 0.5  # the guide did move


@pytest.mark.parametrize("with_x", [True, False])
def test_nuts_potential_equals_the_traced_potential(with_x):
    from pyro.infer.mcmc.util import initialize_model
    from pyro.ops.integrator import potential_grad

    K, N = 3, 4
    model = OverparametrisedLinear(K, prior_loc=0.3, prior_scale=0.7, noise_scale=0.4)
    y = torch.randn(N, dtype=F64)
    x = torch.randn(N, K, dtype=F64) if with_x else None
    pot = model.nuts_potential(x, y)
    _, traced, _, _ = initialize_model(model, model_args=(x, y))
    for _ in range(3):
        w = torch.randn(K, dtype=F64) * 2
        u, g = pot(w)
        g_ref, u_ref = potential_grad(traced, {"w": w.clone()})
        assert float(u) == pytest.approx(float(u_ref), rel=1e-12)
        assert torch.allclose(g, g_ref["w"], rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="y must be"):
        model.nuts_potential(x, torch.ones(N, 1, dtype=F64))
    with pytest.raises(ValueError, match="different numbers of rows"):
        model.nuts_potential(torch.ones(N + 1, dtype=F64), y)
