"""Tests for pyro_bnnlv.reproduce.invariance: Pyro's SVI (AutoNormal) and NUTS on the
over-parametrised linear model against the closed forms of stats/linear_closed_forms.py
(invariances paper, sec. 4, Fig. 1-2).

Tolerances. The SVI tolerances are about 3x the largest error measured over 5 seeds at the
same settings (the fast settings below: K in {2, 8, 32, 128}, seeds 0-4; maxima loc_err 0.0073,
scale_rel_err 0.021 (K <= 32), |scale_mean_rel_err| 0.0038, |pred_var_rel_err| 0.0075, elbo_gap
0.0026; at the default settings 0.0048, 0.017 (K = 128), 0.0018, 0.0036, 0.0039). The NUTS
check compares with Monte-Carlo standard errors from the effective sample size.
"""

from __future__ import annotations

import pytest
import torch

from pyro_bnnlv.reproduce.invariance import (
    FIGURE_NOISE_SCALE,
    fit_mean_field_linear,
    nuts_invariance_check,
    svi_invariance_experiment,
    write_invariance_gap_figure,
)
from pyro_bnnlv.models.linear import OverparametrisedLinear
from pyro_bnnlv.stats.linear_closed_forms import exact_posterior, predictive_moments, q0, theta_star_0

FAST_STAGES = ((0.05, 500), (0.01, 500), (0.002, 1000))


@pytest.fixture(scope="module")
def svi_fast():
    torch.set_num_threads(1)
    return svi_invariance_experiment(Ks=[2, 8, 32], stages=FAST_STAGES, num_particles=128, seed=0)


def _check_svi_table(df, scale_tol: float) -> None:
    assert (df.loc_err < 0.02).all(), df.loc_err
    assert (df.scale_rel_err < scale_tol).all(), df.scale_rel_err
    assert (df.scale_mean_rel_err.abs() < 0.01).all(), df.scale_mean_rel_err
    assert (df.pred_var_rel_err.abs() < 0.02).all(), df.pred_var_rel_err
    assert (df.elbo_gap > -1e-9).all() and (df.elbo_gap < 0.01).all(), df.elbo_gap
    # the optimum is not the exact posterior (Fig. 2d): its predictive variance is K times the
    # posterior's at K = 2 and grows towards the prior's sigma_0^2 = 1
    assert df.pred_var_f_prior.to_numpy() == pytest.approx(1.0)
    assert df.pred_var_f_fit.is_monotonic_increasing
    assert (df.pred_var_f_fit > 1.9 * df.pred_var_f_post).all()
    assert (df.pred_var_f_fit < df.pred_var_f_prior).all()
    assert df.pred_var_f_post.to_numpy() == pytest.approx(df.pred_var_f_post.iloc[0], rel=1e-9)
    # Fig. 1: the gap at theta_mix* grows linearly in K
    assert df.gap_theta_mix.is_monotonic_increasing


def test_svi_autonormal_recovers_the_mean_field_optimum(svi_fast):
    df = svi_fast
    assert list(df.K) == [2, 8, 32]
    _check_svi_table(df, scale_tol=0.05)
    # closed forms in the table are those of stats.linear_closed_forms
    N, y = 10, torch.ones(10, dtype=torch.float64)
    for _, row in df.iterrows():
        prior = OverparametrisedLinear(int(row.K), noise_scale=FIGURE_NOISE_SCALE).prior()
        q = q0(prior, *theta_star_0(prior, y, FIGURE_NOISE_SCALE))
        assert row.scale_star == pytest.approx(float(q.cov.diagonal().sqrt().mean()), rel=1e-12)
        post = exact_posterior(prior, y, FIGURE_NOISE_SCALE)
        assert row.pred_var_f_post == pytest.approx(float(predictive_moments(post, 1.0).var_f))
        assert row.pred_var_y_fit == pytest.approx(row.pred_var_f_fit + FIGURE_NOISE_SCALE**2)
    assert N == 10


def test_fit_mean_field_linear_is_reproducible_and_the_guide_holds_the_last_iterate():
    model = OverparametrisedLinear(3, noise_scale=0.5)
    x, y = torch.ones(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    stages = ((0.05, 30), (0.01, 20))
    g1, q1, info1 = fit_mean_field_linear(model, x, y, stages=stages, num_particles=4, seed=3)
    g2, q2, info2 = fit_mean_field_linear(model, x, y, stages=stages, num_particles=4, seed=3)
    assert torch.equal(q1.loc, q2.loc) and torch.equal(q1.cov, q2.cov)
    assert info1["num_steps"] == 50 and info1["scale_iterate_sd"] > 0
    assert torch.equal(model.prior_loc, torch.zeros(3, dtype=torch.float64))  # no aliasing
    loc, _ = g1._get_loc_and_scale("w")
    assert loc.shape == (3,) and not torch.equal(loc.detach().double(), q1.loc)  # averaged != last


def test_nuts_recovers_the_exact_posterior():
    torch.set_num_threads(1)
    table, mcmc = nuts_invariance_check(K=4, num_samples=1000, warmup_steps=500, num_chains=2, seed=0)
    assert mcmc.run_info.path == "fast/flat"
    assert list(table.index) == ["mean f", "var f", "mean w[0]", "var w[0]", "mean w[1]", "var w[1]", "cov w[0],w[1]"]
    assert (table.ess > 400).all(), table.ess
    assert (table.z.abs() < 4).all(), table
    # power: the mean-field optimum's variance of f (about K times the exact one at small K) is
    # far outside the NUTS estimate's error bars
    prior = OverparametrisedLinear(4, noise_scale=FIGURE_NOISE_SCALE).prior()
    y = torch.ones(10, dtype=torch.float64)
    q_mf = q0(prior, *theta_star_0(prior, y, FIGURE_NOISE_SCALE))
    v_mf = float(predictive_moments(q_mf, FIGURE_NOISE_SCALE).var_f)
    assert abs(table.loc["var f", "nuts"] - v_mf) > 10 * table.loc["var f", "se"]


def test_figure_and_validation(tmp_path, svi_fast):
    path = tmp_path / "fig" / "invariance-gap.png"
    table = write_invariance_gap_figure(path, Ks=[2, 4, 8, 16, 32], svi=svi_fast)
    assert path.stat().st_size > 0 and set(table.K) == {2, 4, 8, 16, 32}
    with pytest.raises(ValueError, match="Ks"):
        svi_invariance_experiment(Ks=[0])
    with pytest.raises(ValueError, match="N must"):
        svi_invariance_experiment(Ks=[2], N=0)
    with pytest.raises(ValueError, match="stages"):
        svi_invariance_experiment(Ks=[2], stages=((0.1,),))
    with pytest.raises(ValueError, match="stages"):
        svi_invariance_experiment(Ks=[2], stages=((-0.1, 10),))
    with pytest.raises(ValueError, match="num_particles"):
        fit_mean_field_linear(OverparametrisedLinear(2), None, torch.ones(3), num_particles=0)
    with pytest.raises(ValueError, match="coords"):
        nuts_invariance_check(K=3, coords=(5,))


@pytest.mark.slow
def test_svi_sweep_k_2_to_128_at_default_settings():
    """The issue's sweep K in {2, 4, ..., 128} at the default settings (about 10 minutes)."""
    torch.set_num_threads(1)
    df = svi_invariance_experiment(seed=0)
    assert list(df.K) == list(range(2, 129, 2))
    _check_svi_table(df, scale_tol=0.05)
    # Fig. 2d: at K = 128 the mean-field variance of f is 1 / (1 + N/(K sigma_y^2)) of the prior's
    assert df.pred_var_f_fit.iloc[-1] == pytest.approx(1 / (1 + 10 / (128 * FIGURE_NOISE_SCALE**2)), rel=0.02)
