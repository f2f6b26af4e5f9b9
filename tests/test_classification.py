"""Classification through the library's models and methods (issue 42): the categorical and Bernoulli
likelihoods of pb.BNN, checked against torch's cross-entropies, autograd Hessians, a quadrature
posterior and hand-computed predictive averages."""

import math

import numpy as np
import pyro
import pyro.poutine as poutine
import pytest
import torch
import torch.nn.functional as F

import pyro_bnnlv as pb
from pyro_bnnlv.infer.mcmc.init import flat_potential
from pyro_bnnlv.infer.svi import _default_loss, map_objective
from pyro_bnnlv.models.likelihoods import Bernoulli, Categorical, as_likelihood
from pyro_bnnlv.stats import classification_metrics


def _blobs(N=60, K=3, D=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = 3.0 * torch.randn(K, D, generator=g)
    y = torch.arange(N) % K
    x = centres[y] + torch.randn(N, D, generator=g)
    return x, y


def test_likelihood_log_probs_are_torchs_cross_entropies():
    f = torch.randn(7, 4, dtype=torch.float64)
    y = torch.tensor([0, 3, 1, 2, 2, 0, 3])
    assert torch.allclose(Categorical().log_prob(f, y), -F.cross_entropy(f, y, reduction="none"))
    assert torch.allclose(Categorical().log_probs(f).exp().sum(-1), torch.ones(7, dtype=torch.float64))
    f1 = torch.randn(7, 1, dtype=torch.float64)
    yb = torch.tensor([0, 1, 1, 0, 1, 0, 0])
    expected = -F.binary_cross_entropy_with_logits(f1[:, 0], yb.double(), reduction="none")
    assert torch.allclose(Bernoulli().log_prob(f1, Bernoulli().observed(yb, 1)), expected)
    assert torch.allclose(Bernoulli().log_probs(f1).exp(), Bernoulli().probs(f1))


def test_likelihood_hessians_equal_autograd():
    f = torch.randn(5, 3, dtype=torch.float64)
    H = Categorical().hessian(f)
    for n in range(5):
        for label in range(3):  # the Hessian of -log softmax does not depend on the label
            auto = torch.autograd.functional.hessian(lambda v: -torch.log_softmax(v, -1)[label], f[n])
            assert torch.allclose(H[n], auto, atol=1e-12)
    f1 = torch.randn(5, 1, dtype=torch.float64)
    Hb = Bernoulli().hessian(f1)
    for n in range(5):
        auto = torch.autograd.functional.hessian(
            lambda v: F.binary_cross_entropy_with_logits(v, torch.ones(1, dtype=v.dtype)), f1[n]
        )
        assert torch.allclose(Hb[n], auto, atol=1e-12)


def test_model_obs_site_is_the_cross_entropy_and_regression_is_unchanged():
    x, y = _blobs()
    model = pb.BNN(pb.MLP(2, [8], 3), likelihood="categorical")
    w = model.net.init_weights(torch.Generator().manual_seed(1))
    tr = poutine.trace(poutine.condition(model, data={"w": w})).get_trace(x, y)
    tr.compute_log_prob()
    assert torch.allclose(tr.nodes["obs"]["log_prob_sum"], -F.cross_entropy(model.f(x, w), y, reduction="sum"))
    assert torch.equal(tr.nodes["obs"]["value"], y)
    # the default Gaussian model: the same trace as a hand-written Normal
    reg = pb.BNN(pb.MLP(2, [8], 1), noise_scale=0.3)
    yr = x[:, 0].sin()
    wr = reg.net.init_weights(torch.Generator().manual_seed(1))
    tr = poutine.trace(poutine.condition(reg, data={"w": wr})).get_trace(x, yr)
    tr.compute_log_prob()
    manual = torch.distributions.Normal(reg.f(x, wr)[:, 0], 0.3).log_prob(yr).sum()
    assert torch.equal(tr.nodes["obs"]["log_prob_sum"], manual)
    assert reg.likelihood == as_likelihood("gaussian") and float(reg.noise_scale) == pytest.approx(0.3)


def test_bad_labels_and_shapes_name_the_fix():
    x, y = _blobs()
    model = pb.BNN(pb.MLP(2, [8], 3), likelihood="categorical")
    with pytest.raises(TypeError, match=r"y.long\(\)"):
        model.check_data(x, y.float())
    with pytest.raises(ValueError, match="3 classes"):
        model.check_data(x, y + 1)
    with pytest.raises(ValueError, match="argmax"):
        model.check_data(x, F.one_hot(y, 3))
    with pytest.raises(ValueError, match="K >= 2"):
        pb.BNN(pb.MLP(2, [8], 1), likelihood="categorical")
    with pytest.raises(ValueError, match="out_features=1"):
        pb.BNN(pb.MLP(2, [8], 3), likelihood="bernoulli")
    with pytest.raises(ValueError, match="no observation noise"):
        pb.BNN(pb.MLP(2, [8], 3), likelihood="categorical", noise_scale=0.2)
    with pytest.raises(ValueError, match="likelihood must be one of"):
        pb.BNN(pb.MLP(2, [8], 3), likelihood="poisson")
    with pytest.raises(ValueError, match="0/1 labels"):
        pb.BNN(pb.MLP(2, [8], 1), likelihood="bernoulli").check_data(x, torch.rand(len(x)))
    with pytest.raises(AttributeError, match="noise_scale"):
        model.noise_scale  # noqa: B018
    with pytest.raises(ValueError, match="class labels"):
        pb.evaluate(model, {"w": torch.zeros(3, model.num_weights)}, x, y, y_mean=0.0, y_std=1.0)


def test_evaluate_is_the_bayesian_model_average_of_the_class_probabilities():
    x, y = _blobs()
    model = pb.BNN(pb.MLP(2, [8], 3), likelihood="categorical")
    w = torch.randn(25, model.num_weights, generator=torch.Generator().manual_seed(0))
    probs = torch.softmax(model.f(x, w).double(), -1).mean(0)  # by hand
    got = pb.evaluate(model, {"w": w}, x, y)
    expected = classification_metrics(y, probs)
    assert list(got.index) == ["test_ll", "accuracy", "brier", "ece"]
    for key in got.index:
        assert got[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9)


def test_mean_field_svi_and_map_classify_two_moons():
    data = pb.load_dataset("two-moons", seed=0)
    model = pb.BNN(pb.MLP(2, [16], 2), likelihood="categorical")
    guide = pb.MeanField(model)
    assert isinstance(_default_loss(model, guide), pyro.infer.Trace_ELBO)  # the fused step is Gaussian
    losses = pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=600, lr=0.03, seed=0, progress=False)
    assert losses[-1] < losses[0]
    m = pb.evaluate(model, guide, data, num_samples=200, seed=0)
    assert m["accuracy"] > 0.85 and m["test_ll"] > math.log(0.5)
    w = pb.train_map(model, data.x_train, data.y_train, num_steps=600, lr=0.03, progress=False)
    acc = (model.f(data.x_test, w).argmax(-1) == data.y_test).double().mean()
    assert acc > 0.85
    # the MAP objective is the cross-entropy plus the Gaussian prior, per point
    N = len(data.x_train)
    expected = (
        F.cross_entropy(model.f(data.x_train, w), data.y_train, reduction="sum")
        + 0.5 * (w / model.prior_scale).square().sum()
    ) / N
    assert float(map_objective(model, w, data.x_train, data.y_train, N)) == pytest.approx(float(expected), rel=1e-6)


def test_classifier_flat_potential_equals_the_traced_model():
    x, y = _blobs(N=30)
    model = pb.BNN(pb.MLP(2, [5], 3), likelihood="categorical", prior_scale=0.7).double()
    x = x.double()
    pot = flat_potential(model, x, y)
    w = torch.randn(model.num_weights, dtype=torch.float64, requires_grad=True)
    u, grad = pot(w)
    tr = poutine.trace(poutine.condition(model, data={"w": w})).get_trace(x, y)
    expected = -tr.log_prob_sum()
    (auto,) = torch.autograd.grad(expected, w)
    assert float(u.detach()) == pytest.approx(float(expected.detach()), rel=1e-10)
    assert torch.allclose(grad, auto, atol=1e-10)


def test_inference_data_and_saved_fit_of_a_classifier(tmp_path):
    x, y = _blobs()
    model = pb.BNN(pb.MLP(2, [8], 3), likelihood="categorical")
    guide = pb.MeanField(model)
    pb.fit_svi(model, guide, x, y, num_steps=50, progress=False)
    samples = pb.sample_posterior(model, guide, x, num_samples=20, seed=0)
    idata = pb.to_inference_data(model, samples, x, y)
    f = torch.as_tensor(idata.posterior["f"].values)  # class probabilities at the stored inputs
    assert f.shape[-1] == 3 and torch.allclose(f.sum(-1), torch.ones(()).double())
    ll = torch.as_tensor(idata.log_likelihood["obs"].values)[0]
    expected = -F.cross_entropy(model.f(x, samples["w"]).transpose(1, 2), y.expand(20, -1), reduction="none")
    assert torch.allclose(ll, expected.double(), atol=1e-5)
    from pyro_bnnlv.serialization import load_fit, save_fit

    save_fit(tmp_path / "fit.pt", model, guide, x, y)
    model2, guide2 = load_fit(tmp_path / "fit.pt")
    assert model2.likelihood == model.likelihood
    a = pb.evaluate(model, guide, x, y, seed=3, num_samples=50)
    b = pb.evaluate(model2, guide2, x, y, seed=3, num_samples=50)
    assert a.equals(b)


def _logistic_map(K=3, N=60, seed=0):
    x, y = _blobs(N=N, K=K, seed=seed)
    out = 1 if K == 2 else K
    model = pb.BNN(pb.MLP(2, [], out), prior_scale=1.5, likelihood="bernoulli" if K == 2 else "categorical")
    w = pb.train_map(model, x, y, num_steps=1500, lr=0.05, progress=False)
    return model, x, y, w


@pytest.mark.parametrize("K", [2, 3])
def test_laplace_ggn_of_a_linear_classifier_is_the_exact_hessian(K):
    """With no hidden layer the logits are linear in the weights, so the GGN is the Hessian of the
    negative log joint (autograd, in float64), and the log evidence is the Laplace formula by hand."""
    model, x, y, w = _logistic_map(K)
    la = pb.LinearizedLaplace(model, w).fit(x, y)
    x64, w64 = x.double(), w.double()
    labels = model._observed(y)

    def neg_log_joint(v):
        lik = model.likelihood.log_prob(model.net(x64, v), labels.double() if K == 2 else labels).sum()
        return -(lik + torch.distributions.Normal(0.0, torch.tensor(1.5, dtype=torch.float64)).log_prob(v).sum())

    H = torch.autograd.functional.hessian(neg_log_joint, w64)
    assert torch.allclose(la.posterior_precision, H, rtol=1e-8, atol=1e-8)
    P = w.numel()
    by_hand = -neg_log_joint(w64) + 0.5 * P * math.log(2 * math.pi) - 0.5 * torch.logdet(H)
    assert float(la.log_marginal_likelihood()) == pytest.approx(float(by_hand), rel=1e-8)
    diag = pb.LinearizedLaplace(model, w, structure="diag").fit(x, y)
    assert torch.allclose(diag.posterior_precision, H.diagonal(), rtol=1e-8)
    assert la.optimize_hyperparameters().keys() == {"prior_factor", "objective"}
    with pytest.raises(ValueError, match="no observation noise"):
        la.optimize_hyperparameters(noise=True)


def test_laplace_probit_and_mc_predictives_against_quadrature():
    """Bernoulli: E[sigmoid(f)] under the linearised Gaussian of f by Gauss-Hermite quadrature;
    MC with many draws equals it, and the probit approximation is within 0.02."""
    model, x, y, w = _logistic_map(K=2)
    la = pb.LinearizedLaplace(model, w).fit(x, y)
    xt = 2.0 * torch.randn(20, 2, generator=torch.Generator().manual_seed(5))
    pred = la.predictive(xt)
    nodes, weights = (torch.from_numpy(a) for a in np.polynomial.hermite_e.hermegauss(60))
    f = pred.mean[:, :1] + pred.f_var[:, :1].sqrt() * nodes  # (N, 60)
    exact = (torch.sigmoid(f) * weights).sum(-1) / weights.sum()
    mc = la.predictive_probs(xt, link_approx="mc", num_samples=40_000, seed=0)[:, 1]
    probit = la.predictive_probs(xt)[:, 1]
    assert torch.allclose(mc, exact, atol=6e-3)
    # the probit approximation's error is about 0.02 at most (MacKay 1992), and it is nearer the
    # exact average than the plug-in sigmoid of the mean
    assert torch.allclose(probit, exact, atol=3e-2)
    assert (probit - exact).abs().mean() < (torch.sigmoid(pred.mean[:, 0]) - exact).abs().mean()
    assert not torch.allclose(probit, torch.sigmoid(pred.mean[:, 0]), atol=1e-3)  # the variance matters
    m = pb.evaluate(model, la, xt, (xt[:, 0] > 0).long())
    assert list(m.index) == ["test_ll", "accuracy", "brier", "ece"]


def test_categorical_laplace_on_an_mlp_improves_on_map_calibration_and_samples_as_a_guide():
    data = pb.load_dataset("two-moons", seed=1)
    model = pb.BNN(pb.MLP(2, [20], 2), likelihood="categorical")
    w = pb.train_map(model, data.x_train, data.y_train, num_steps=1500, lr=0.02, progress=False)
    map_m = pb.evaluate(model, {"w": w[None]}, data)
    for structure in ("full", "diag", "last_layer"):
        la = pb.LinearizedLaplace(model, w, structure=structure).fit(data.x_train, data.y_train)
        la.optimize_hyperparameters()
        m = pb.evaluate(model, la, data)
        assert m["accuracy"] >= map_m["accuracy"] - 0.03, structure
        if structure != "diag":  # the diagonal's variances are too wide (it drops the correlations)
            assert m["test_ll"] > map_m["test_ll"] - 0.05, (structure, m, map_m)
        if structure == "full":
            ref = la.predictive_probs(data.x_test, num_samples=50_000, seed=1)
            assert (la.predictive_probs(data.x_test) - ref).abs().max() < 0.03  # the default: 1,000 draws
            # the per-class probit shrinks the two logits by their own (large, prior-wide) variances
            # and ignores that only their difference is fixed by the data
            assert (la.predictive_probs(data.x_test, link_approx="probit") - ref).abs().max() > 0.1
    la = pb.LinearizedLaplace(model, w).fit(data.x_train, data.y_train)
    with pytest.warns(RuntimeWarning, match="edge of prior_grid"):  # validation wants the MAP here
        out = la.optimize_hyperparameters(method="validation", x_valid=data.x_valid, y_valid=data.y_valid)
    assert out.keys() == {"prior_factor", "objective"}
    sampled = pb.evaluate(la.to_model(), la.as_guide(), data, num_samples=200, seed=0)
    assert sampled["accuracy"] > 0.8


@pytest.mark.parametrize("elbo", ["KNNElbo", "FunctionalKNNElbo"])
def test_hypernetwork_guides_classify_with_both_knn_elbos(elbo):
    """NN-HyVI (k-NN KL in weight space) and FuNN-HyVI (in predictor space: here on the logits f,
    which model.f returns for a classifier) train a categorical BNN."""
    data = pb.load_dataset("two-moons", seed=0)
    model = pb.BNN(pb.MLP(2, [16], 2), likelihood="categorical")
    guide = pb.HypernetGuide(model)
    with pytest.warns(UserWarning, match="lie outside the region"):  # the early draws are wider than the prior's
        pb.fit_svi(
            model,
            guide,
            data.x_train,
            data.y_train,
            num_steps=200,
            lr=0.01,
            loss=getattr(pb, elbo).fast(),
            seed=0,
            progress=False,
        )
    m = pb.evaluate(model, guide, data, num_samples=200, seed=0)
    assert m["accuracy"] > 0.9 and m["test_ll"] > -0.3
