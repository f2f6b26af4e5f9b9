import math

import pytest
import torch
from scipy import stats

import pyro_bnnlv as pb
from pyro_bnnlv.stats.predictive import mixture_quantile, predictive_metrics


def test_single_gaussian_predictive_matches_closed_form():
    """One weight sample: the predictive is N(f, sigma^2) and every metric has a closed form."""
    model = pb.BNN(pb.MLP(1, [], 1, activation="identity"), noise_scale=0.5)  # f = a x + b
    w = torch.tensor([[2.0, 1.0]])
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    y = torch.tensor([1.0, 3.5, 4.0, 20.0])
    m = pb.evaluate(model, w, x, y)
    f = torch.tensor([1.0, 3.0, 5.0, 7.0])
    ll = stats.norm(f.numpy(), 0.5).logpdf(y.numpy()).mean()
    assert m["test_ll"] == pytest.approx(ll, rel=1e-5)
    assert m["rmse"] == pytest.approx(math.sqrt(((y - f) ** 2).mean().item()), rel=1e-6)
    half = stats.norm.ppf(0.975) * 0.5
    assert m["mpiw"] == pytest.approx(2 * half, rel=1e-5)
    inside = ((y - f).abs() <= half).float().mean().item()  # 1.0, 3.5 inside; 4.0, 20 outside
    assert m["picp"] == pytest.approx(inside) and inside == 0.5


def test_mixture_log_density_and_quantile_of_two_components():
    loc = torch.tensor([[[-1.0]], [[1.0]]])  # S=2, N=1, L=1
    scale = 0.3
    y = torch.tensor([[0.2]])
    m = predictive_metrics(y, loc, scale)
    dens = 0.5 * stats.norm(-1, 0.3).pdf(0.2) + 0.5 * stats.norm(1, 0.3).pdf(0.2)
    assert m["test_ll"] == pytest.approx(math.log(dens), rel=1e-6)
    q = mixture_quantile(loc, scale, 0.975).item()
    cdf = 0.5 * stats.norm(-1, 0.3).cdf(q) + 0.5 * stats.norm(1, 0.3).cdf(q)
    assert cdf == pytest.approx(0.975, abs=1e-9)
    assert m["rmse"] == pytest.approx(0.2)


def test_log_likelihood_uses_logsumexp_no_underflow():
    loc = torch.zeros(100, 1, 1)
    y = torch.tensor([[40.0]])  # 400 standard deviations away: densities underflow to 0
    m = predictive_metrics(y, loc, 0.1)
    assert m["test_ll"] == pytest.approx(stats.norm(0, 0.1).logpdf(40.0), rel=1e-6)


def test_metrics_on_original_scale():
    loc = torch.randn(50, 30, 1)
    y = torch.randn(30)
    std = predictive_metrics(y, loc, 0.4)
    orig = predictive_metrics(y, loc, 0.4, y_mean=10.0, y_std=3.0)
    assert orig["test_ll"] == pytest.approx(std["test_ll"] - math.log(3.0), rel=1e-5)
    assert orig["rmse"] == pytest.approx(3 * std["rmse"], rel=1e-5)
    assert orig["mpiw"] == pytest.approx(3 * std["mpiw"], rel=1e-5)
    assert orig["picp"] == pytest.approx(std["picp"])


def test_picp_is_calibrated_for_samples_from_the_predictive():
    g = torch.Generator().manual_seed(0)
    S, N = 40, 4000
    loc = torch.randn(S, N, 1, generator=g)
    comp = torch.randint(S, (N,), generator=g)
    y = loc[comp, torch.arange(N), 0] + 0.5 * torch.randn(N, generator=g)
    m = predictive_metrics(y, loc, 0.5)
    assert m["picp"] == pytest.approx(0.95, abs=0.01)  # binomial sd at N=4000 is 0.0034


def test_evaluate_rejects_bad_samples():
    model = pb.BNN(pb.MLP(1, [3], 1))
    x, y = torch.zeros(5, 1), torch.zeros(5)
    with pytest.raises(ValueError, match="'w'"):
        pb.evaluate(model, {"z": torch.zeros(3)}, x, y)
    with pytest.raises(ValueError, match="num_weights"):
        pb.evaluate(model, torch.zeros(4, 7), x, y)
    with pytest.raises(ValueError, match="NaN"):
        pb.evaluate(model, torch.full((4, model.num_weights), float("nan")), x, y)
