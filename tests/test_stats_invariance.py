"""Tests for pyro_bnnlv.stats.invariance_gap: the first-layer invariance gap (invariances paper, sec. 5,
eq. 22-23), checked against the linear model's closed forms (stats/linear_closed_forms.py, eq. 10, 15, 16),
against the paper's beta -> inf construction with B_x, and against dense-matrix KLs; and the
later layers (eq. 25-26) against a brute-force dense computation on hand-built activations; the
activations P(z_{l-1}) drawn through q_mix (eq. 24, 26) against eq. 23's moments (Monte Carlo)
and against the linear model's closed form where the two coincide."""

from __future__ import annotations

import math

import pytest
import torch
from pyro.infer.autoguide import AutoMultivariateNormal, AutoNormal

import pyro_bnnlv as pb
from pyro_bnnlv.models.linear import OverparametrisedLinear
from pyro_bnnlv.stats import linear_closed_forms as L
from pyro_bnnlv.stats.invariance_gap import (
    first_layer_indices,
    first_layer_invariance_gap,
    invariance_abiding_posterior,
    invariance_gap_at_inputs,
    invariance_gap_by_layer,
    layer_indices,
    layer_inputs,
    layer_invariance_gap,
    likelihood_factor_from_posterior,
    plot_first_layer_invariance_gap,
    sample_qmix,
)

F64 = torch.float64


def _random_theta(K: int, gen: torch.Generator):
    mu = torch.randn(K, generator=gen, dtype=F64)
    s2 = 0.5 + torch.rand(K, generator=gen, dtype=F64) * 2
    m = torch.randn(K, generator=gen, dtype=F64)
    lam = 0.1 + torch.rand(K, generator=gen, dtype=F64) * 3
    return mu, s2, m, lam


def test_likelihood_factor_inverts_eq6a():
    gen = torch.Generator().manual_seed(0)
    mu, s2, m, lam = _random_theta(6, gen)
    q = L.q0(L.Gaussian(mu, torch.diag(s2)), m, lam)
    m_hat, lam_hat = likelihood_factor_from_posterior(q.loc, q.cov.diagonal(), mu, s2)
    assert torch.allclose(m_hat, m, rtol=1e-10, atol=1e-10)
    assert torch.allclose(lam_hat, lam, rtol=1e-10)
    # q as wide as or wider than the prior: no Gaussian g_0, flat (lambda = inf)
    m2, lam2 = likelihood_factor_from_posterior(
        torch.tensor([0.3, 0.3]), torch.tensor([1.0, 2.0]), torch.zeros(2), torch.tensor([1.0, 1.0])
    )
    assert torch.isinf(lam2).all() and torch.allclose(m2, torch.full((2,), 0.3, dtype=F64))
    with pytest.raises(ValueError, match="q_var"):
        likelihood_factor_from_posterior(mu, -s2, mu, s2)


@pytest.mark.parametrize("scale", [1.0, 1.0 / 7, -2.5])
def test_eq23_at_constant_input_is_eq15(scale):
    """x = c 1 is the linear model of sec. 4 (eq. 23 is invariant to the scale of x)."""
    gen = torch.Generator().manual_seed(1)
    K = 5
    mu, s2, m, lam = _random_theta(K, gen)
    prior = L.Gaussian(mu, torch.diag(s2))
    loc, cov = invariance_abiding_posterior(torch.full((K,), scale, dtype=F64), mu, s2, m, lam)
    ref = L.qmix(prior, m, lam)
    assert torch.allclose(loc, ref.loc, atol=1e-12) and torch.allclose(cov, ref.cov, atol=1e-12)
    gap = invariance_gap_at_inputs(
        torch.full((K,), scale, dtype=F64), L.q0(prior, m, lam).loc, L.q0(prior, m, lam).cov.diagonal(), mu, s2
    )
    assert float(gap) == pytest.approx(float(L.invariance_gap(prior, m, lam)), rel=1e-10)


def test_eq23_is_the_beta_limit_of_the_translation_marginal():
    """The paper's construction: g_mix = int N(w; m + B_x Delta, Diag(lam)) N(Delta; 0, beta^2 I),
    B_x = [I; -x_{1:d-1}^T / x_d] (sec. 5), times the prior, for a large beta (dense algebra)."""
    gen = torch.Generator().manual_seed(2)
    d = 4
    mu, s2, m, lam = _random_theta(d, gen)
    x = torch.randn(d, generator=gen, dtype=F64)
    x[-1] = 1.3
    B = torch.cat([torch.eye(d - 1, dtype=F64), -(x[:-1] / x[-1]).unsqueeze(0)])
    assert torch.allclose(x @ B, torch.zeros(d - 1, dtype=F64), atol=1e-14)
    beta = 1e4
    G = torch.diag(lam) + beta**2 * B @ B.T
    prec = torch.diag(1 / s2) + torch.linalg.inv(G)
    cov = torch.linalg.inv(prec)
    loc = cov @ (mu / s2 + torch.linalg.solve(G, m))
    loc23, cov23 = invariance_abiding_posterior(x, mu, s2, m, lam)
    assert torch.allclose(loc23, loc, rtol=1e-6, atol=1e-6)
    assert torch.allclose(cov23, cov, rtol=1e-6, atol=1e-6)


def test_gap_formula_matches_dense_kl_for_general_inputs_and_batches():
    gen = torch.Generator().manual_seed(3)
    d, N = 3, 6
    mu, s2, _, _ = _random_theta(d, gen)
    mq = torch.randn(d, generator=gen, dtype=F64)
    v = s2 * (0.05 + 0.9 * torch.rand(d, generator=gen, dtype=F64))  # narrower than the prior
    X = torch.randn(N, d, generator=gen, dtype=F64)
    gaps = invariance_gap_at_inputs(X, mq, v, mu, s2)
    assert gaps.shape == (N,)
    m, lam = likelihood_factor_from_posterior(mq, v, mu, s2)
    for n in range(N):
        loc, cov = invariance_abiding_posterior(X[n], mu, s2, m, lam)
        ref = L.kl_gaussians(L.Gaussian(mq, torch.diag(v)), L.Gaussian(loc, cov))
        assert float(gaps[n]) == pytest.approx(float(ref), rel=1e-9)
    assert (gaps > 0).all()


def _linear_bnn(K: int, H: int, thetas, sigma0: float = 1.0):
    """BNN whose first-layer units are the linear model of sec. 4 at x = 1 (K = fan-in + bias)."""
    net = pb.MLP(K - 1, [H], 1, activation="tanh")
    idx = first_layer_indices(net)
    prior_scale = torch.ones(net.num_weights)
    prior_scale[idx.reshape(-1)] = math.sqrt(K) * sigma0
    model = pb.BNN(net, prior_scale=prior_scale.to(torch.float32), noise_scale=0.1)
    prior = L.prior_gaussian(K, 0.0, sigma0)
    loc = torch.zeros(net.num_weights, dtype=F64)
    scale = torch.full((net.num_weights,), 0.5, dtype=F64)
    for j, (m, lam) in enumerate(thetas):
        q = L.q0(prior, m, lam)
        loc[idx[j]] = q.loc
        scale[idx[j]] = q.cov.diagonal().sqrt()
    return model, prior, (loc, scale)


def test_first_layer_reduces_to_the_linear_models_closed_form():
    K, H, N = 6, 3, 4
    gen = torch.Generator().manual_seed(4)
    thetas = [
        (torch.full((K,), 0.7, dtype=F64), torch.full((K,), 2.5, dtype=F64)),  # isotropic
        (torch.randn(K, generator=gen, dtype=F64), 0.2 + torch.rand(K, generator=gen, dtype=F64)),
        L.theta_star_mix(torch.ones(10, dtype=F64), K, 0.3),  # the optimum of eq. 18
    ]
    model, prior, params = _linear_bnn(K, H, thetas)
    x = torch.ones(N, K - 1)
    df = first_layer_invariance_gap(model, params, x)
    assert list(df.index) == list(range(H))
    for j, (m, lam) in enumerate(thetas):
        gap = float(L.invariance_gap(prior, m, lam))
        assert df.gap_mean[j] == pytest.approx(gap, rel=1e-6)
        assert df.gap_max[j] == pytest.approx(gap, rel=1e-6)
        kl = float(L.kl_to_prior(L.q0(prior, m, lam), prior))
        assert df.kl_to_prior[j] == pytest.approx(kl, rel=1e-6)
    iso = float(L.invariance_gap_isotropic(K, K * 1.0, 2.5))
    assert df.gap_mean[0] == pytest.approx(iso, rel=1e-6)
    # condition (7) holds for isotropic lambda: spread 0 and equal pre-activation variances (eq. 9)
    assert df.shrinkage_spread[0] < 1e-6 and df.shrinkage_spread[1] > 0.05
    assert df.preact_var_qmix[0] == pytest.approx(df.preact_var_q0[0], rel=1e-6)
    assert df.preact_var_qmix[1] != pytest.approx(df.preact_var_q0[1], rel=1e-3)
    # eq. 11: the gap of a q_0 optimum is below its KL to the prior
    assert (df.gap_mean <= df.kl_to_prior).all()
    long = first_layer_invariance_gap(model, params, x, per_input=True)
    assert len(long) == N * H and set(long.columns) >= {"input", "unit", "gap"}
    assert long.groupby("unit").gap.mean().values == pytest.approx(df.gap_mean.values, rel=1e-12)


def test_fitted_autonormal_guide_and_index_layout(toy_data):
    x, y = toy_data
    model = pb.BNN(pb.MLP(1, [4], 1), prior_scale=1.0, noise_scale=0.1)
    guide = AutoNormal(model, init_scale=0.05, init_loc_fn=pb.init_to_network(model, seed=0))
    pb.fit_svi(model, guide, x, y, num_steps=200, lr=0.02, seed=0, progress=False)
    df = first_layer_invariance_gap(model, guide, x)
    with pb.infer.isolated_param_store(model, guide):
        loc, scale = (t.detach() for t in guide._get_loc_and_scale("w"))
    assert df.equals(first_layer_invariance_gap(model, (loc, scale), x))
    # an independent read of the first layer through MLP.unflatten
    (W, b), _ = model.net.unflatten(loc)
    (Ws, bs), _ = model.net.unflatten(scale)
    xa = torch.cat([x, torch.ones(len(x), 1)], -1).to(F64)
    for j in range(4):
        mq = torch.cat([W[j], b[j : j + 1]]).to(F64)
        v = torch.cat([Ws[j], bs[j : j + 1]]).to(F64) ** 2
        zero, one = torch.zeros(2, dtype=F64), torch.ones(2, dtype=F64)
        gaps = invariance_gap_at_inputs(xa, mq, v, zero, one)
        assert df.gap_mean[j] == pytest.approx(float(gaps.mean()), rel=1e-10)
    assert (df.gap_mean > 0).all() and (df.gap_mean <= df.gap_max).all()


def test_mixture_gap_monte_carlo():
    """Eq. 23's mixture over inputs: equals the per-input gap for identical inputs, is below the
    mean per-input gap (convexity) otherwise, and agrees with torch's mixture density."""
    K, H = 3, 2
    thetas = [
        (torch.full((K,), 0.5, dtype=F64), torch.full((K,), 1.5, dtype=F64)),
        (torch.tensor([0.1, -0.4, 1.0], dtype=F64), torch.tensor([0.5, 2.0, 1.0], dtype=F64)),
    ]
    model, prior, (loc, scale) = _linear_bnn(K, H, thetas)
    same = first_layer_invariance_gap(model, (loc, scale), torch.ones(5, K - 1), num_samples=4000)
    z = (same.gap_mixture - same.gap_mean) / same.gap_mixture_se
    assert (z.abs() < 4).all(), z
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(7, K - 1, generator=gen)
    df = first_layer_invariance_gap(model, (loc, scale), x, num_samples=4000, seed=1)
    assert (df.gap_mixture < df.gap_mean + 4 * df.gap_mixture_se).all()
    assert (df.gap_mixture < df.gap_mean - 0.05).any()  # the bound is not tight for spread inputs
    # independent estimate with torch.distributions' mixture log density
    idx = first_layer_indices(model.net)
    xa = torch.cat([x, torch.ones(7, 1)], -1).to(F64)
    for j in range(H):
        mq, v = loc[idx[j]], scale[idx[j]] ** 2
        m, lam = likelihood_factor_from_posterior(mq, v, prior.loc, prior.cov.diagonal())
        locs, covs = invariance_abiding_posterior(xa, prior.loc, prior.cov.diagonal(), m, lam)
        mix = torch.distributions.MixtureSameFamily(
            torch.distributions.Categorical(torch.ones(7, dtype=F64)),
            torch.distributions.MultivariateNormal(locs, covs),
        )
        q = torch.distributions.Normal(mq, v.sqrt())
        w = q.sample((20000,))
        t = q.log_prob(w).sum(-1) - mix.log_prob(w)
        se = math.hypot(float(t.std() / math.sqrt(len(t))), df.gap_mixture_se[j])
        assert abs(float(t.mean()) - df.gap_mixture[j]) < 4 * se


def test_uninformative_coordinates_give_the_prior():
    """A coordinate with q variance >= prior variance has a flat g_0: at inputs where it is
    non-zero q_mix is the prior, so the gap is KL[q_0 || p]; where it is 0 it is ignored."""
    model = pb.BNN(pb.MLP(2, [1], 1), prior_scale=1.0, noise_scale=0.1)
    idx = first_layer_indices(model.net)[0]  # [W00, W01, b0]
    loc = torch.zeros(model.net.num_weights, dtype=F64)
    scale = torch.full((model.net.num_weights,), 0.3, dtype=F64)
    loc[idx] = torch.tensor([0.5, -0.2, 0.1], dtype=F64)
    scale[idx[1]] = 1.2  # wider than the prior: uninformative
    x = torch.tensor([[1.0, 0.5], [2.0, 0.0]])
    long = first_layer_invariance_gap(model, (loc, scale), x, per_input=True)
    v = scale[idx] ** 2
    kl_prior = 0.5 * float((v + loc[idx] ** 2 - 1 - torch.log(v)).sum())
    assert long.gap[0] == pytest.approx(kl_prior, rel=1e-10)
    # at x = (2, 0) only (W00, b0) are seen: the 2-d eq. 23 gap plus nothing from W01 beyond KL
    sub = [0, 2]
    zero, one = torch.zeros(2, dtype=F64), torch.ones(2, dtype=F64)
    gap2 = invariance_gap_at_inputs(torch.tensor([2.0, 1.0], dtype=F64), loc[idx][sub], v[sub], zero, one)
    kl_w01 = 0.5 * float(v[1] + loc[idx[1]] ** 2 - 1 - torch.log(v[1]))
    assert long.gap[1] == pytest.approx(float(gap2) + kl_w01, rel=1e-10)
    df = first_layer_invariance_gap(model, (loc, scale), x)
    assert df.frac_uninformative[0] == pytest.approx(1 / 3)


def test_validation_and_plot(tmp_path, toy_data):
    x, _ = toy_data
    model = pb.BNN(pb.MLP(1, [3], 1), prior_scale=1.0, noise_scale=0.1)
    P = model.net.num_weights
    params = (torch.zeros(P), torch.full((P,), 0.1))
    with pytest.raises(ValueError, match="BNN with an MLP"):
        first_layer_invariance_gap(OverparametrisedLinear(3), params, x)
    with pytest.raises(ValueError, match="no hidden layer"):
        first_layer_invariance_gap(pb.BNN(pb.MLP(1, [], 1)), (torch.zeros(2), torch.ones(2)), x)
    with pytest.raises(ValueError, match="x has 2 columns"):
        first_layer_invariance_gap(model, params, torch.zeros(5, 2))
    with pytest.raises(ValueError, match=r"loc of site 'w' must have shape"):
        first_layer_invariance_gap(model, (torch.zeros(P + 1), torch.ones(P + 1)), x)
    with pytest.raises(ValueError, match="scale of site 'w' must be positive"):
        first_layer_invariance_gap(model, (torch.zeros(P), torch.zeros(P)), x)
    with pytest.raises(ValueError, match="fit it"):
        first_layer_invariance_gap(model, AutoNormal(model), x)
    with pytest.raises(ValueError, match="num_samples"):
        first_layer_invariance_gap(model, params, x, num_samples=-1)
    with pytest.raises(ValueError, match="both m and lam"):
        invariance_gap_at_inputs(
            torch.ones(2), torch.zeros(2), torch.ones(2), torch.zeros(2), torch.ones(2), m=torch.zeros(2)
        )
    df = first_layer_invariance_gap(model, params, x, num_samples=100)
    fig = plot_first_layer_invariance_gap(df, tmp_path / "gap.png")
    assert (tmp_path / "gap.png").stat().st_size > 0 and fig.axes[0].patches
    import matplotlib.pyplot as plt

    outer, (a, b) = plt.subplots(1, 2)
    assert plot_first_layer_invariance_gap(df, ax=b) is outer
    assert b.patches and not a.patches
    plt.close("all")
    assert df.attrs["num_inputs"] == len(x)


# --- later layers (eq. 25-26) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def deep_fit():
    """A tiny 1 -> [3, 2] -> 1 tanh BNN with a briefly fitted AutoNormal, its (loc, scale) and
    12 training inputs."""
    g = torch.Generator().manual_seed(11)
    x = torch.rand(12, 1, generator=g) * 2 - 1
    y = torch.cos(3 * x[:, 0]) + 0.1 * torch.randn(12, generator=g)
    model = pb.BNN(pb.MLP(1, [3, 2], 1, activation="tanh"), prior_scale=1.0, noise_scale=0.1)
    guide = AutoNormal(model, init_scale=0.05, init_loc_fn=pb.init_to_network(model, seed=0))
    pb.fit_svi(model, guide, x, y, num_steps=150, lr=0.02, seed=0, progress=False)
    with pb.infer.isolated_param_store(model, guide):
        loc, scale = (t.detach().to(F64) for t in guide._get_loc_and_scale("w"))
    return model, guide, (loc, scale), x


def test_layer_zero_is_the_first_layer_function(deep_fit):
    model, guide, params, x = deep_fit
    for kw in (dict(), dict(per_input=True), dict(num_samples=50, seed=3)):
        ref = first_layer_invariance_gap(model, guide, x, **kw)
        new = layer_invariance_gap(model, guide, x, 0, num_activation_samples=5, **kw)
        assert new.equals(ref) and list(new.columns) == list(ref.columns)
        assert new.attrs == ref.attrs
    by = invariance_gap_by_layer(model, params, x, num_samples=50, seed=3)
    assert list(by.layer.unique()) == [0, 1, 2] and list(by.columns[:2]) == ["layer", "unit"]
    ref = first_layer_invariance_gap(model, params, x, num_samples=50, seed=3)
    layer0 = by[by.layer == 0].drop(columns="layer").set_index("unit")
    assert layer0.equals(ref)
    assert by.attrs["total_gap_mean"][0] == ref.attrs["total_gap_mean"]
    # the layers' own units: 3, 2 and 1 (the output)
    assert by.groupby("layer").size().to_dict() == {0: 3, 1: 2, 2: 1}
    assert (by.gap_mean > 0).all() and (by.gap_mean <= by.gap_max).all()
    assert (by.gap_mixture < by.gap_mean + 4 * by.gap_mixture_se).all()
    long = invariance_gap_by_layer(model, params, x, layers=[2, 0], num_activation_samples=2, per_input=True)
    assert list(long.columns[:4]) == ["layer", "draw", "input", "unit"]
    assert long.groupby("layer").size().to_dict() == {0: 3 * len(x), 2: 2 * len(x)}
    assert (long[long.layer == 0].draw == 0).all() and set(long[long.layer == 2].draw) == {0, 1}


def _dense_eq25_gap(z, mq, v, mu, s2):
    """Brute force KL[N(mq, Diag v) || q_mix(. | z)] for a batch ``z (M, d)`` of one unit:
    g_0 by inverting eq. 6a by hand, eq. 25's mean and covariance as dense matrices, and
    torch.distributions' MultivariateNormal KL."""
    assert (v < s2).all()  # every coordinate informative: a Gaussian g_0 exists
    lam = s2 * v / (s2 - v)
    m = mq + lam * (mq - mu) / s2
    Sigma, V = torch.diag(s2), torch.diag(lam)
    sz = z @ Sigma  # (M, d)
    denom = torch.einsum("md,de,me->m", z, V + Sigma, z)
    loc = mu + (z @ (m - mu) / denom)[:, None] * sz
    cov = Sigma - sz[:, :, None] * sz[:, None, :] / denom[:, None, None]
    q0 = torch.distributions.MultivariateNormal(mq, torch.diag(v))
    return torch.distributions.kl_divergence(q0, torch.distributions.MultivariateNormal(loc, cov))


@pytest.mark.parametrize("layer", [1, 2])
def test_later_layer_matches_brute_force_on_hand_built_activations(deep_fit, layer):
    model, guide, (loc, scale), x = deep_fit
    S, seed = 4, 7
    # activations by hand: S weight vectors from q_0 with the documented draw, then the net
    eps = torch.randn((S, loc.numel()), generator=torch.Generator().manual_seed(seed), dtype=F64)
    w = loc + scale * eps
    h = x.to(F64).expand(S, -1, -1)
    for W, b in model.net.unflatten(w)[:layer]:
        h = torch.tanh(h @ W.transpose(-1, -2) + b[:, None, :])
    z = torch.cat([h, torch.ones(S, len(x), 1, dtype=F64)], -1)  # (S, N, d)
    got_z = layer_inputs(model, guide, x, layer, num_activation_samples=S, seed=seed, activations="q0")
    assert torch.allclose(got_z, z, rtol=0, atol=1e-12)
    df = layer_invariance_gap(model, guide, x, layer, num_activation_samples=S, seed=seed, activations="q0")
    long = layer_invariance_gap(
        model, guide, x, layer, num_activation_samples=S, seed=seed, per_input=True, activations="q0"
    )
    W_loc, b_loc = model.net.unflatten(loc)[layer]
    W_sc, b_sc = model.net.unflatten(scale)[layer]
    P_loc, pb_loc = model.net.unflatten(model.prior_loc.to(F64))[layer]
    P_sc, pb_sc = model.net.unflatten(model.prior_scale.to(F64))[layer]
    H = W_loc.shape[0]
    assert list(df.index) == list(range(H)) and len(long) == S * len(x) * H
    zs = z.reshape(-1, z.shape[-1])
    for j in range(H):
        mq = torch.cat([W_loc[j], b_loc[j : j + 1]])
        v = torch.cat([W_sc[j], b_sc[j : j + 1]]) ** 2
        mu = torch.cat([P_loc[j], pb_loc[j : j + 1]])
        s2 = torch.cat([P_sc[j], pb_sc[j : j + 1]]) ** 2
        kl = _dense_eq25_gap(zs, mq, v, mu, s2)  # (S N,)
        assert df.gap_mean[j] == pytest.approx(float(kl.mean()), rel=1e-8)
        assert df.gap_max[j] == pytest.approx(float(kl.max()), rel=1e-8)
        rows = long[long.unit == j]
        assert list(rows.draw) == list(torch.arange(S).repeat_interleave(len(x)))
        assert list(rows.input) == list(range(len(x))) * S
        assert rows.gap.values == pytest.approx(kl.numpy(), rel=1e-8)
        kl_prior = torch.distributions.kl_divergence(
            torch.distributions.Normal(mq, v.sqrt()), torch.distributions.Normal(mu, s2.sqrt())
        ).sum()
        assert df.kl_to_prior[j] == pytest.approx(float(kl_prior), rel=1e-8)
    assert df.attrs["num_activation_vectors"] == S * len(x)
    # another seed draws other activations (the gap is a Monte-Carlo estimate over z)
    other = layer_invariance_gap(model, guide, x, layer, num_activation_samples=S, seed=seed + 1, activations="q0")
    assert not other.gap_mean.equals(df.gap_mean)


def test_gap_of_a_layer_at_its_prior_is_zero(deep_fit):
    """q_0 = prior for one layer's units: g_0 is flat, q_mix(. | z) = p = q_0 for every z, so
    that layer's gap (and KL) vanish while the other layers keep theirs."""
    model, _, (loc, scale), x = deep_fit
    for layer in (1, 2):
        idx = layer_indices(model.net, layer).reshape(-1)
        loc2, scale2 = loc.clone(), scale.clone()
        loc2[idx] = model.prior_loc.to(F64)[idx]
        scale2[idx] = model.prior_scale.to(F64)[idx]
        by = invariance_gap_by_layer(model, (loc2, scale2), x, num_activation_samples=3, num_samples=20)
        at_prior = by[by.layer == layer]
        assert (at_prior.gap_max.abs() < 1e-8).all() and (at_prior.kl_to_prior.abs() < 1e-8).all()
        assert (at_prior.gap_mixture.abs() < 1e-8).all()
        assert (at_prior.frac_uninformative == 1).all()
        assert (by[by.layer != layer].gap_mean > 1e-3).all()
    # the same holds for the first layer through the first-layer function
    idx = layer_indices(model.net, 0).reshape(-1)
    loc2, scale2 = loc.clone(), scale.clone()
    loc2[idx], scale2[idx] = 0.0, 1.0
    assert (first_layer_invariance_gap(model, (loc2, scale2), x).gap_max.abs() < 1e-8).all()


def test_layer_validation(deep_fit):
    model, guide, params, x = deep_fit
    with pytest.raises(ValueError, match=r"layer=3 is out of range: model.net has 3 layer"):
        layer_invariance_gap(model, params, x, 3)
    with pytest.raises(ValueError, match=r"layer=-1 is out of range.*valid indices are 0\.\.2"):
        layer_invariance_gap(model, params, x, -1)
    for bad in (1.0, "1", True, None):
        with pytest.raises(ValueError, match="layer must be an int"):
            layer_invariance_gap(model, params, x, bad)
    with pytest.raises(ValueError, match="layer must be an int"):
        invariance_gap_by_layer(model, params, x, layers=[0, 1.5])
    with pytest.raises(ValueError, match="layer=7 is out of range"):
        layer_indices(model.net, 7)
    with pytest.raises(ValueError, match="layers must be a non-empty sequence"):
        invariance_gap_by_layer(model, params, x, layers=[])
    with pytest.raises(ValueError, match="layers contains duplicates"):
        invariance_gap_by_layer(model, params, x, layers=[1, 1])
    with pytest.raises(ValueError, match="BNN with an MLP"):
        layer_invariance_gap(OverparametrisedLinear(3), params, x, 1)
    with pytest.raises(ValueError, match="BNN with an MLP"):
        invariance_gap_by_layer(OverparametrisedLinear(3), params, x)
    with pytest.raises(ValueError, match="mean-field"):
        layer_invariance_gap(model, AutoMultivariateNormal(model), x, 1)
    with pytest.raises(ValueError, match="num_activation_samples must be a positive integer"):
        layer_invariance_gap(model, params, x, 1, num_activation_samples=0)
    with pytest.raises(ValueError, match="num_samples"):
        layer_invariance_gap(model, params, x, 2, num_samples=-1)
    with pytest.raises(ValueError, match="x has 2 columns"):
        layer_invariance_gap(model, params, torch.zeros(4, 2), 1)
    # a net without hidden layers: its only layer is the output layer (eq. 20), refused only by
    # the first-layer function
    linear = pb.BNN(pb.MLP(1, [], 1))
    lin_params = (torch.zeros(2), torch.full((2,), 0.5))
    assert len(layer_invariance_gap(linear, lin_params, x, 0)) == 1
    with pytest.raises(ValueError, match="no hidden layer"):
        first_layer_invariance_gap(linear, lin_params, x)


# --- P(z_{l-1}) through q_mix (eq. 24, 26) ----------------------------------------------------


def test_sample_qmix_draws_eq23s_gaussian():
    """Matheron's rule in sample_qmix: the draws' mean and covariance are eq. 23's
    (invariance_abiding_posterior) within Monte-Carlo error; a flat g_0 seen by z' gives the prior."""
    gen = torch.Generator().manual_seed(8)
    d, S = 4, 200_000
    mu, s2, m, lam = _random_theta(d, gen)
    z = torch.randn(d, generator=gen, dtype=F64)
    w = sample_qmix(z.expand(S, d), mu, s2, m, lam, torch.Generator().manual_seed(0))
    loc, cov = invariance_abiding_posterior(z, mu, s2, m, lam)
    se_loc = (cov.diagonal() / S).sqrt()
    assert ((w.mean(0) - loc).abs() < 5 * se_loc).all()
    emp = torch.cov(w.T)
    se_cov = ((cov.diagonal()[:, None] * cov.diagonal()[None, :] + cov**2) / S).sqrt()
    assert ((emp - cov).abs() < 5 * se_cov).all()
    # the draws live on the rank-one-reduced covariance: z'^T w has eq. 23's (smaller) variance
    assert float((w @ z).var()) == pytest.approx(float(z @ cov @ z), rel=0.02)
    assert float(z @ cov @ z) < float((s2 * z * z).sum()) - 0.1
    lam_flat = lam.clone()
    lam_flat[0] = math.inf
    w = sample_qmix(z.expand(S, d), mu, s2, m, lam_flat, torch.Generator().manual_seed(0))
    assert ((w.mean(0) - mu).abs() < 5 * (s2 / S).sqrt()).all()
    assert torch.allclose(w.var(0), s2, rtol=0.02)


def _random_mean_field(net, gen, prior_scale=1.0):
    """(loc, scale) of a mean-field q_0 narrower than the prior N(0, prior_scale^2) everywhere."""
    loc = torch.randn(net.num_weights, generator=gen, dtype=F64)
    scale = prior_scale * (0.2 + 0.6 * torch.rand(net.num_weights, generator=gen, dtype=F64))
    return loc, scale


def test_layer_inputs_from_qmix_have_eq24s_moments():
    """P(z_1) of eq. 24 for identity units: z_{1,j} = w^T [x_n, 1] with w ~ q_mix(w_{1,j}), the
    uniform mixture over the inputs x' of eq. 23's Gaussians, so at input x_n
    E z = mean_c loc_c^T x_n and Var z = mean_c (x_n^T cov_c x_n + (loc_c^T x_n)^2) - (E z)^2.
    The mean-field draws (activations="q0") have other moments."""
    gen = torch.Generator().manual_seed(9)
    model = pb.BNN(pb.MLP(2, [3], 1, activation="identity"), prior_scale=1.0, noise_scale=0.1)
    loc, scale = _random_mean_field(model.net, gen)
    x = torch.randn(5, 2, generator=gen)
    S = 20_000
    z = layer_inputs(model, (loc, scale), x, 1, num_activation_samples=S, seed=0)
    assert z.shape == (S, 5, 4) and (z[..., -1] == 1).all()
    z0 = layer_inputs(model, (loc, scale), x, 1, num_activation_samples=S, seed=0, activations="q0")
    xa = torch.cat([x, torch.ones(5, 1)], -1).to(F64)
    idx = layer_indices(model.net, 0)
    for j in range(3):
        mq, v = loc[idx[j]], scale[idx[j]] ** 2
        mu, s2 = torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64)
        m, lam = likelihood_factor_from_posterior(mq, v, mu, s2)
        locs, covs = invariance_abiding_posterior(xa, mu, s2, m, lam)  # one component per x'
        means = locs @ xa.T  # (component, input)
        variances = torch.einsum("nd,cde,ne->cn", xa, covs, xa)
        mean = means.mean(0)
        var = (variances + means**2).mean(0) - mean**2
        got = z[..., j]
        assert ((got.mean(0) - mean).abs() < 5 * (var / S).sqrt()).all(), (got.mean(0), mean)
        assert torch.allclose(got.var(0), var, rtol=0.05), (got.var(0), var)
        # q_0: mean mq^T x_n and variance x_n^T Diag(v) x_n, different from eq. 24's
        assert torch.allclose(z0[..., j].mean(0), xa @ mq, atol=5 * float((xa**2 @ v).max() / S) ** 0.5)
        assert (z0[..., j].var(0) < 0.8 * var).any()


def test_later_layer_gap_is_the_linear_models_where_they_coincide():
    """Inputs x = 0: a first-layer unit sees only its bias, whose q_mix(. | [0, 1]) is its q_0
    (eq. 23 with one informative coordinate), so with a bias q_0 of mean 1 and a tiny variance
    every z_1 is [1, ..., 1] under q_mix and q_0 alike, and the output unit (eq. 20, 25) is the
    linear model of sec. 4 at x = 1: its gap is eq. 10 of the closed forms (eq. 15's q_mix)."""
    H = 4
    K = H + 1
    net = pb.MLP(1, [H], 1, activation="identity")
    out = layer_indices(net, 1)[0]
    prior_scale = torch.ones(net.num_weights)
    prior_scale[out] = math.sqrt(K)
    model = pb.BNN(net, prior_scale=prior_scale, noise_scale=0.1)
    prior = L.prior_gaussian(K, 0.0, 1.0)
    loc = torch.zeros(net.num_weights, dtype=F64)
    scale = torch.full((net.num_weights,), 0.5, dtype=F64)
    first = layer_indices(net, 0)
    loc[first[:, -1]], scale[first[:, -1]] = 1.0, 1e-7
    for m, lam in [
        (torch.full((K,), 0.7, dtype=F64), torch.full((K,), 2.5, dtype=F64)),
        L.theta_star_mix(torch.ones(10, dtype=F64), K, 0.3),
    ]:
        q = L.q0(prior, m, lam)
        loc[out], scale[out] = q.loc, q.cov.diagonal().sqrt()
        gap = float(L.invariance_gap(prior, m, lam))
        for source in ("qmix", "q0"):
            df = layer_invariance_gap(
                model, (loc, scale), torch.zeros(3, 1), 1, num_activation_samples=8, activations=source
            )
            assert df.gap_mean[0] == pytest.approx(gap, rel=1e-5)
            assert df.gap_max[0] == pytest.approx(gap, rel=1e-5)


def test_activation_source_is_checked_and_qmix_is_the_default(deep_fit):
    model, guide, params, x = deep_fit
    with pytest.raises(ValueError, match="activations must be 'qmix'.*or 'q0'.*got 'mix'"):
        layer_invariance_gap(model, params, x, 1, activations="mix")
    with pytest.raises(ValueError, match="activations must be"):
        invariance_gap_by_layer(model, params, x, activations=None)
    default = layer_invariance_gap(model, params, x, 2, num_activation_samples=4, seed=2)
    assert default.equals(
        layer_invariance_gap(model, params, x, 2, num_activation_samples=4, seed=2, activations="qmix")
    )
    assert not default.gap_mean.equals(
        layer_invariance_gap(model, params, x, 2, num_activation_samples=4, seed=2, activations="q0").gap_mean
    )
    # layer 0 sees the data whatever the source
    assert layer_invariance_gap(model, params, x, 0, activations="q0").equals(layer_invariance_gap(model, params, x, 0))
