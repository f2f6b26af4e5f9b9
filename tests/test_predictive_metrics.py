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


def _linear_latent_case(sigma=0.3, b=2.0, sz=0.5):
    """A BNN+LV linear in z, f = a x + b z + c, two weight samples: the predictive integrates to
    the Gaussian mixture (1/2) sum_s N(y; a_s x + c_s, sigma^2 + b^2 sz^2) exactly."""
    model = pb.BNNLV(pb.MLP(2, [], 1), latent_dim=1, latent_scale=sz, noise_scale=sigma)
    x = torch.linspace(-1, 1, 200)[:, None]
    w = torch.tensor([[1.5, b, 0.3], [1.4, -b, 0.2]])
    g = torch.Generator().manual_seed(123)  # not the evaluation seeds: no shared draws
    sd = math.sqrt(sigma**2 + b**2 * sz**2)
    y = 1.5 * x[:, 0] + 0.3 + sd * torch.randn(200, generator=g)
    comp = torch.stack([torch.distributions.Normal(w[s, 0] * x[:, 0] + w[s, 2], sd).log_prob(y) for s in range(2)])
    exact = (torch.logsumexp(comp, 0) - math.log(2)).mean().item()
    return model, x, y, w, exact


def test_bnnlv_test_ll_integrates_the_latent_over_its_prior():
    """eq. 34 with latent_draws quasi-random z* per weight sample converges to the exact integral;
    one i.i.d. z* per weight sample (the former default) is several nats low when f is steep in z."""
    model, x, y, w, exact = _linear_latent_case()
    for seed in range(3):
        ll = {
            M: pb.evaluate(model, {"w": w}, x, y, seed=seed, latent_draws=M, y_mean=0, y_std=1)["test_ll"]
            for M in (1, 64, 256)
        }
        assert abs(ll[64] - exact) < 0.01, (seed, ll, exact)
        assert abs(ll[256] - exact) < 0.002, (seed, ll, exact)
        assert ll[1] < exact - 1.0
    default = pb.evaluate(model, {"w": w}, x, y, seed=0, y_mean=0, y_std=1)
    assert (
        default["test_ll"] == pb.evaluate(model, {"w": w}, x, y, seed=0, latent_draws=64, y_mean=0, y_std=1)["test_ll"]
    )


def test_bnnlv_latent_draws_are_marginally_the_prior():
    """Each quasi-random z* is N(0, sz^2): over many weight samples and inputs the components of
    f = z have the prior's mean and standard deviation; rows s*M .. s*M+M-1 share weight s."""
    model = pb.BNNLV(pb.MLP(2, [], 1), latent_dim=1, latent_scale=0.5, noise_scale=0.1)
    w = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 5.0]]).repeat(200, 1)  # f = z, or z + 5
    loc, _ = model.predictive_components(
        torch.zeros(50, 1), {"w": w}, generator=torch.Generator().manual_seed(0), latent_draws=8
    )
    assert loc.shape == (400 * 8, 50, 1)
    z = loc.reshape(400, 8, 50)
    assert torch.equal(z[1::2] >= 2.0, torch.ones_like(z[1::2], dtype=torch.bool))  # weight 1's rows
    z = torch.cat([z[0::2], z[1::2] - 5.0]).flatten()
    assert abs(z.mean().item()) < 0.01 and abs(z.std().item() - 0.5) < 0.01


@pytest.mark.parametrize("latent", [False, True])
def test_evaluate_in_chunks_equals_one_pass(monkeypatch, latent):
    """Chunking the test points (memory) changes no metric, for a BNN and for a BNN+LV (two
    latent dims, two outputs) whose latent draws are random."""
    if latent:
        model = pb.BNNLV(pb.MLP(3, [5], 2), latent_dim=2, latent_scale=0.7, noise_scale=0.3)
    else:
        model = pb.BNN(pb.MLP(1, [5], 2), noise_scale=0.3)
    w = torch.randn(40, model.net.num_weights, generator=torch.Generator().manual_seed(1))
    x = torch.linspace(-2, 2, 97)[:, None]
    y = torch.stack([torch.sin(x[:, 0]), torch.cos(x[:, 0])], -1)
    draws = {"latent_draws": 4} if latent else {}
    whole = pb.evaluate(model, w, x, y, y_mean=0, y_std=1, seed=3, **draws)
    per_chunk = 40 * 4 * 5 * 10 if latent else 40 * 5 * 10  # S x M x widest layer x 10 points
    monkeypatch.setattr("pyro_bnnlv.stats.predictive._CHUNK_ELEMENTS", per_chunk)
    chunked = pb.evaluate(model, w, x, y, y_mean=0, y_std=1, seed=3, **draws)
    for key in ("test_ll", "rmse", "picp", "mpiw"):
        assert chunked[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), key
    with pytest.raises(ValueError, match="at least one point"):
        pb.evaluate(model, w, x[:0], y[:0], y_mean=0, y_std=1, **draws)


def test_evaluate_latent_draws_and_intervals_options():
    model = pb.BNN(pb.MLP(1, [], 1), noise_scale=0.3)
    w, x, y = torch.tensor([[1.0, 0.0]]), torch.zeros(4, 1), torch.zeros(4)
    with pytest.raises(ValueError, match="latent_draws=8: BNN's predictive has no latent"):
        pb.evaluate(model, w, x, y, latent_draws=8)
    fast = pb.evaluate(model, w, x, y, intervals=False)
    full = pb.evaluate(model, w, x, y)
    assert fast["test_ll"] == full["test_ll"] and math.isnan(fast["picp"]) and math.isnan(fast["mpiw"])
    lv, x2, y2, w2, _ = _linear_latent_case()
    with pytest.raises(ValueError, match="latent_draws"):
        pb.evaluate(lv, {"w": w2}, x2, y2, latent_draws=0)
