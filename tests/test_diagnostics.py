"""ArviZ export, function-space summary and k-NN posterior comparison."""

import math
import warnings

import numpy as np
import pytest
import torch
from pyro.infer.autoguide import AutoNormal

import pyro_bnnlv as pb
from pyro_bnnlv.diagnostics import compare_posteriors, posterior_summary, to_inference_data, weight_labels
from pyro_bnnlv.infer.mcmc import run_nuts
from pyro_bnnlv.posterior import Posterior

az = pytest.importorskip("arviz")


@pytest.fixture(scope="module")
def linreg_run():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 1, generator=g)
    y = 2 * x[:, 0] + 0.5 + 0.3 * torch.randn(30, generator=g)
    model = pb.BNN(pb.MLP(1, [], 1, activation="identity"), prior_scale=2.0, noise_scale=0.3)
    mcmc = run_nuts(model, x, y, num_samples=150, warmup_steps=100, num_chains=2, seed=0, progress=False, map_steps=200)
    return model, x, y, mcmc


def test_inference_data_groups_dims_and_shapes(linreg_run):
    model, x, y, mcmc = linreg_run
    x_eval = torch.linspace(-2, 2, 4).unsqueeze(-1)
    idata = to_inference_data(model, mcmc, x, y, x_eval=x_eval, seed=0)
    for group in (
        "posterior",
        "weights",
        "posterior_predictive",
        "log_likelihood",
        "observed_data",
        "constant_data",
        "sample_stats",
    ):
        assert hasattr(idata, group), group
    post = idata.posterior
    # the posterior group is what az.plot_trace / az.summary read: f at a few inputs, no weights
    assert list(post.data_vars) == ["f"]
    assert post["f"].dims == ("chain", "draw", "eval_point") and post["f"].shape == (2, 150, 4)
    np.testing.assert_allclose(post["f"].coords["eval_point"].values, x_eval[:, 0].numpy(), rtol=1e-4)
    w_group = idata.weights
    assert w_group["w"].dims == ("chain", "draw", "weight") and w_group["w"].shape == (2, 150, 2)
    assert list(w_group["w"].coords["weight"].values) == ["l0.W[0,0]", "l0.b[0]"]
    assert idata.posterior_predictive["obs"].shape == (2, 150, 30)
    assert idata.log_likelihood["obs"].dims == ("chain", "draw", "data")
    assert idata.observed_data["obs"].shape == (30,)
    assert idata.constant_data["x"].dims == ("data", "input")
    assert idata.constant_data["x_eval"].dims == ("eval_point", "input")
    assert idata.posterior.attrs["noise_scale"] == pytest.approx(0.3)
    stats = idata.sample_stats
    assert stats["diverging"].dtype == bool and stats["n_steps"].shape == (2, 150)
    assert (stats["n_steps"] >= 1).all() and "lp" in stats and "acceptance_rate" in stats

    # the values are what they claim to be
    w = mcmc.get_samples(group_by_chain=True)["w"]
    np.testing.assert_allclose(w_group["w"].values, w.double().numpy())
    f_eval = (x_eval[:, 0] * w[..., :1] + w[..., 1:]).double().numpy()
    np.testing.assert_allclose(post["f"].values, f_eval, rtol=1e-5, atol=1e-5)
    f = (x[:, 0] * w[..., :1] + w[..., 1:]).double().numpy()
    ll = torch.distributions.Normal(torch.as_tensor(f), 0.3).log_prob(y.double()).numpy()
    np.testing.assert_allclose(idata.log_likelihood["obs"].values, ll, rtol=1e-5, atol=1e-5)
    resid = idata.posterior_predictive["obs"].values - f
    assert abs(resid.std() - 0.3) < 0.02

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loo = az.loo(idata)
        waic = az.waic(idata)
    assert math.isfinite(loo.elpd_loo) and math.isfinite(waic.elpd_waic)
    assert loo.elpd_loo == pytest.approx(waic.elpd_waic, abs=1.0)


def test_default_inference_data_is_what_arviz_plots_and_summarises(linreg_run):
    """Without x_eval, f at num_points training inputs spanning x's range; az.summary has one row
    per f value, az.plot_trace one panel row; weights=True puts w back in the posterior."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model, x, y, mcmc = linreg_run
    idata = to_inference_data(model, mcmc, x, y, num_points=3)
    xs = idata.constant_data["x_eval"].values[:, 0]
    np.testing.assert_allclose(xs, np.sort(x[:, 0].numpy())[[0, 14, 29]])  # min, middle, max of x
    w = mcmc.get_samples(group_by_chain=True)["w"].double().numpy()
    np.testing.assert_allclose(idata.posterior["f"].values, xs * w[..., :1] + w[..., 1:], rtol=1e-5, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ's notices on small samples
        table = az.summary(idata)
    assert list(table.index) == [f"f[{v:.4g}]" for v in xs]  # rows named by the input value
    axes = az.plot_trace(idata)
    assert axes.shape == (1, 2)
    plt.close("all")
    full = to_inference_data(model, mcmc, x, y, num_points=3, weights=True)
    assert set(full.posterior.data_vars) == {"f", "w"} and not hasattr(full, "weights")
    # every reader takes the weights from either group
    for form in (idata, full):
        assert Posterior.from_any(form).draws["w"].shape == (2, 150, 2)
        assert posterior_summary(form).loc["w: worst of 2", "r_hat"] < 1.1
    a = pb.evaluate(model, idata, x, y, y_mean=0.0, y_std=1.0)
    b = pb.evaluate(model, full, x, y, y_mean=0.0, y_std=1.0)
    assert dict(a) == pytest.approx(dict(b))
    with pytest.raises(ValueError, match="no weight draws 'w' in its posterior or weights group"):
        pb.evaluate(model, az.from_dict(posterior={"f": np.zeros((1, 5, 3))}), x, y, y_mean=0.0, y_std=1.0)


def test_inference_data_from_guides_restarts_and_samples(linreg_run):
    model, x, y, mcmc = linreg_run
    guides = []
    for seed in (0, 1):
        guide = AutoNormal(model, init_scale=0.05)
        pb.fit_svi(model, guide, x, y, num_steps=100, lr=0.05, seed=seed, progress=False)
        guides.append(guide)
    one = to_inference_data(model, guides[0], x, y, num_samples=50, seed=0)
    assert one.weights["w"].shape == (1, 50, 2)
    two = to_inference_data(model, guides, x, y, num_samples=40, seed=0)
    assert two.weights["w"].shape == (2, 40, 2)
    assert not hasattr(two, "sample_stats")

    s = mcmc.get_samples()
    assert to_inference_data(model, s, x, y).weights["w"].shape == (1, 300, 2)
    assert to_inference_data(model, s["w"], x, y).weights["w"].shape == (1, 300, 2)
    grouped = mcmc.get_samples(group_by_chain=True)
    assert to_inference_data(model, grouped, x, y).weights["w"].shape == (2, 150, 2)
    with pytest.raises(ValueError, match="shape"):
        to_inference_data(model, {"w": torch.zeros(10, 5)}, x, y)
    with pytest.raises(TypeError, match="posterior"):
        to_inference_data(model, 3.0, x, y)


def test_inference_data_with_latent_inputs_and_multiple_outputs():
    from test_nuts import LatentBNN

    torch.manual_seed(0)
    x, y = torch.randn(8, 1), torch.randn(8)
    model = LatentBNN(pb.MLP(2, [3], 1), latent_dim=1)
    P = model.net.num_weights
    samples = {"w": torch.randn(2, 10, P), "z": torch.randn(2, 10, 8, 1)}
    idata = to_inference_data(model, samples, x, y, seed=0, num_points=8)
    assert idata.weights["z"].dims == ("chain", "draw", "data", "latent_dim")
    assert idata.weights["z"].shape == (2, 10, 8, 1)
    assert list(idata.posterior.data_vars) == ["f"]
    xz = torch.cat([x.expand(2, 10, 8, 1), samples["z"]], -1)
    f = model.net(xz.reshape(20, 8, 2), samples["w"].reshape(20, P)).reshape(2, 10, 8)
    order = torch.argsort(x[:, 0])  # 8 of 8 points: all of them, in the order of x
    np.testing.assert_allclose(idata.posterior["f"].values, f[..., order].double().numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="x_eval needs a model with f\\(x, w\\) and no local latent"):
        to_inference_data(model, samples, x, y, x_eval=x[:2])

    multi = pb.BNN(pb.MLP(1, [3], 2), noise_scale=0.5)
    y2 = torch.randn(8, 2)
    idata = to_inference_data(multi, {"w": torch.randn(5, multi.net.num_weights)}, x, y2)
    assert idata.posterior["f"].dims == ("chain", "draw", "eval_point", "output")
    assert idata.posterior["f"].shape == (1, 5, 5, 2)
    assert idata.log_likelihood["obs"].shape == (1, 5, 8)
    assert idata.posterior_predictive["obs"].shape == (1, 5, 8, 2)


def test_posterior_summary_reports_function_space_first(linreg_run):
    model, x, y, mcmc = linreg_run
    idata = to_inference_data(model, mcmc, x, y, x_eval=torch.tensor([[-1.0], [0.0], [1.0]]))
    table = posterior_summary(idata)
    assert list(table.kind.unique()) == ["f", "log_lik", "w"]
    assert list(table.index[:3]) == ["f(x=-1)", "f(x=0)", "f(x=1)"]
    assert "log_lik (sum over obs)" in table.index and "lp (log joint)" in table.index
    assert {"w: median over 2", "w: worst of 2"} <= set(table.index)
    assert (table.r_hat < 1.1).all() and (table.ess_bulk > 50).all()
    f0 = idata.posterior["f"].values[..., 1]
    assert table.loc["f(x=0)", "mean"] == pytest.approx(f0.mean())
    per = posterior_summary(to_inference_data(model, mcmc, x, y), per_weight=True, num_points=3)
    assert (per.kind == "f").sum() == 3 and (per.kind == "w").sum() == 2
    assert per.loc["w[l0.W[0,0]]", "r_hat"] < 1.1


def test_posterior_summary_sees_symmetric_modes_that_weights_cannot():
    """Two chains in sign-flipped copies of a tanh network's mode: weight R-hat explodes,
    function-space R-hat stays near 1 (the reason for reporting both)."""
    net = pb.MLP(1, [3], 1, activation="tanh")
    model = pb.BNN(net, noise_scale=0.1)
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-1, 1, 10).unsqueeze(-1)
    y = torch.sin(3 * x[:, 0])
    base = net.init_weights(g) + 0.05 * torch.randn(200, net.num_weights, generator=g)
    flipped = base.clone()
    flipped[:, :6] *= -1  # W1 and b1 of all units
    flipped[:, 6:9] *= -1  # W2
    idata = to_inference_data(model, {"w": torch.stack([base, flipped])}, x, y)
    table = posterior_summary(idata)
    assert table.loc["w: worst of 10", "r_hat"] > 1.5  # rank-normalised R-hat saturates near 1.8
    assert (table[table.kind == "f"].r_hat < 1.05).all()


def test_weight_labels():
    assert weight_labels(pb.MLP(2, [2], 1))[:6] == [
        "l0.W[0,0]",
        "l0.W[0,1]",
        "l0.W[1,0]",
        "l0.W[1,1]",
        "l0.b[0]",
        "l0.b[1]",
    ]


# ----------------------------------------------------------------------------------------------
# compare_posteriors
# ----------------------------------------------------------------------------------------------
def _gauss_kl(m0, c0, m1, c1):
    d = m0.numel()
    c1i = torch.linalg.inv(c1)
    return 0.5 * (torch.trace(c1i @ c0) + (m1 - m0) @ c1i @ (m1 - m0) - d + torch.logdet(c1) - torch.logdet(c0))


def _linear_model():
    # f(x; w) = w0 x + w1: with T = 2 distinct inputs the map w -> f^X is invertible, so the KL in
    # predictor space equals the KL in parameter space exactly
    return pb.BNN(pb.MLP(1, [], 1, activation="identity"))


def test_compare_posteriors_same_gaussian_gives_near_zero_kl():
    g = torch.Generator().manual_seed(0)
    chol = torch.tensor([[1.0, 0.0], [0.6, 0.5]], dtype=torch.float64)
    a = torch.randn(1000, 2, generator=g, dtype=torch.float64) @ chol.T
    b = torch.randn(1000, 2, generator=g, dtype=torch.float64) @ chol.T
    table = compare_posteriors(
        a, b, _linear_model(), torch.distributions.Uniform(-2.0, 2.0), num_draws=20, num_inputs=2, seed=0
    )
    assert table.shape == (2, 2) and list(table.index) == ["parameter", "predictor"]
    assert (table.abs() < 0.12).all().all(), table


def test_compare_posteriors_matches_the_analytic_kl_of_two_gaussians():
    """KL 0.66 and 0.86 nats; the 1-NN estimator at n = 1000 has a standard deviation of about
    0.08 here. (It is biased low when the first distribution has much heavier tails than the
    second -- e.g. a reference twice as wide as the approximation -- so the pair is moderate.)"""
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    m0, c0 = torch.zeros(2, dtype=torch.float64), torch.tensor([[1.0, 0.3], [0.3, 0.5]], dtype=torch.float64)
    m1, c1 = torch.tensor([0.8, -0.4], dtype=torch.float64), 1.3 * c0
    a = torch.distributions.MultivariateNormal(m0, c0).sample((1000,))
    b = torch.distributions.MultivariateNormal(m1, c1).sample((1000,))
    inputs = torch.rand(50, 1, generator=g) * 4 - 2  # a tensor input_dist: rows drawn uniformly
    table = compare_posteriors({"w": a}, b.unsqueeze(0), _linear_model(), inputs, num_draws=20, num_inputs=2, seed=0)
    kl_ab, kl_ba = float(_gauss_kl(m0, c0, m1, c1)), float(_gauss_kl(m1, c1, m0, c0))
    assert (kl_ab, kl_ba) == pytest.approx((0.662, 0.857), abs=1e-3)
    for space in ("parameter", "predictor"):
        assert table.loc[space, "KL(approx||ref)"] == pytest.approx(kl_ab, abs=0.25)
        assert table.loc[space, "KL(ref||approx)"] == pytest.approx(kl_ba, abs=0.25)
    assert table.attrs["num_samples_approx"] == 1000 and table.attrs["num_inputs"] == 2


def test_compare_posteriors_accepts_mcmc_guides_and_idata(linreg_run):
    model, x, y, mcmc = linreg_run
    guide = AutoNormal(model, init_scale=0.05)
    pb.fit_svi(model, guide, x, y, num_steps=300, lr=0.05, seed=0, progress=False)
    idata = to_inference_data(model, mcmc, x, y)
    table = compare_posteriors(
        guide,
        idata,
        model,
        lambda T: torch.rand(T, 1) * 4 - 2,
        x=x,
        num_samples=200,
        num_draws=5,
        num_inputs=10,
        seed=0,
    )
    assert table.attrs["num_samples_approx"] == 200 and table.attrs["num_samples_ref"] == 200
    assert np.isfinite(table.values).all()
    with pytest.raises(ValueError, match="pass x="):
        compare_posteriors(guide, mcmc, model, lambda T: torch.rand(T, 1))
    with pytest.raises(TypeError, match="input_dist"):
        compare_posteriors(mcmc, mcmc, model, "uniform")


def test_one_posterior_type_reads_every_form():
    """Posterior.from_any: samples, chains, a list of dicts, an InferenceData and an MCMC-like run
    give the same draws; evaluate takes the InferenceData too (issue 15: one posterior type)."""
    from pyro_bnnlv.posterior import Posterior

    data = pb.load_dataset("cosine", sizes=(30, 10, 10))
    model = pb.BNN(pb.MLP(1, [5], 1), noise_scale=0.1)
    g = torch.Generator().manual_seed(0)
    w = 0.1 * torch.randn(2, 15, model.num_weights, generator=g)
    idata = pb.to_inference_data(model, {"w": w}, data.x_train, data.y_train, seed=0)
    forms = {"chains": {"w": w}, "tensor": w, "list": [{"w": w[0]}, {"w": w[1]}], "idata": idata}
    for name, form in forms.items():
        post = Posterior.from_any(form)
        assert (post.num_chains, post.num_draws) == (2, 15), name
        torch.testing.assert_close(post.draws["w"].to(w.dtype), w, rtol=0, atol=0)
    flat = Posterior.from_any({"w": w[0]})
    assert (flat.num_chains, flat.num_draws) == (1, 15) and flat.weights(5).shape == (5, model.num_weights)
    a = pb.evaluate(model, idata, data.x_test, data.y_test)
    b = pb.evaluate(model, {"w": w.reshape(30, -1)}, data.x_test, data.y_test)
    assert dict(a) == pytest.approx(dict(b))
    with pytest.raises(ValueError, match="needs the model and its inputs"):
        Posterior.from_any(pb.MeanField(model))
    with pytest.raises(TypeError, match="a posterior must be"):
        Posterior.from_any("w")
