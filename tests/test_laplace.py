"""Linearised / sampled Laplace: Jacobians against finite differences, the predictive against an
independent computation, exactness on a linear-Gaussian model, hyper-parameters, the guide."""

import math
import warnings

import pytest
import torch
from pyro.infer import Predictive

import pyro_bnnlv as pb
from pyro_bnnlv.guides import LaplaceGuide
from pyro_bnnlv.infer import LinearizedLaplace, last_layer_indices, network_jacobian

D64 = torch.float64


# ----------------------------------------------------------------------------------------------
# independent references
# ----------------------------------------------------------------------------------------------
def fd_jacobian(net, x, w, eps=1e-6):
    """Central finite differences of ``net(x, w)`` in float64, one weight at a time: ``(N, L, P)``."""
    x, w = x.double(), w.double()
    cols = []
    for k in range(w.numel()):
        e = torch.zeros_like(w)
        e[k] = eps
        cols.append((net(x, w + e) - net(x, w - e)) / (2 * eps))
    return torch.stack(cols, -1)


def reference_predictive(net, x, y, xs, w, prior_prec, sigma, structure):
    """GGN Laplace predictive by explicit matrices: finite-difference Jacobians, ``torch.linalg.inv``."""
    idx = last_layer_indices(net) if structure == "last_layer" else torch.arange(net.num_weights)
    J = fd_jacobian(net, x, w)[..., idx].reshape(-1, len(idx))
    Js = fd_jacobian(net, xs, w)[..., idx]  # (M, L, K)
    H = J.T @ J / sigma**2 + torch.diag(prior_prec[idx].double())
    cov = torch.diag(1 / H.diagonal()) if structure == "diag" else torch.linalg.inv(H)
    f_cov = torch.einsum("mak,kl,mbl->mab", Js, cov, Js)
    return net(xs.double(), w.double()), f_cov


def tiny_problem(out=2, hidden=(4,), activation="tanh", n=15, seed=0):
    g = torch.Generator().manual_seed(seed)
    net = pb.MLP(2, list(hidden), out, activation=activation)
    w = net.init_weights(g) * 1.5
    x = torch.randn(n, 2, generator=g, dtype=D64)
    y = torch.randn(n, out, generator=g, dtype=D64)
    xs = torch.randn(6, 2, generator=g, dtype=D64) * 2
    return net, w.double(), x, (y if out > 1 else y[:, 0]), xs


# ----------------------------------------------------------------------------------------------
# Jacobians
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "hidden,activation,out",
    [
        ((4,), "tanh", 1),
        ((3, 5), "sigmoid", 2),
        ((), "identity", 3),
        ((4,), "rbf", 2),
        ((3, 5), "silu", 2),
        ((4,), "gelu", 1),
        ((3, 5), "softplus", 2),
    ],
)
def test_mlp_jacobian_matches_torch_func_and_finite_differences(hidden, activation, out):
    net, w, x, _, _ = tiny_problem(out, hidden, activation)
    J_mlp, f_mlp = network_jacobian(net, x, w, method="mlp")
    J_func, f_func = network_jacobian(net, x, w, method="func")
    J_fd = fd_jacobian(net, x, w)
    assert J_mlp.shape == (x.shape[0], out, net.num_weights)
    torch.testing.assert_close(J_mlp, J_func, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(J_mlp, J_fd, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(f_mlp, net(x, w))
    torch.testing.assert_close(f_func, net(x, w))


def test_subset_jacobians_and_module_net():
    net, w, x, _, _ = tiny_problem(2, (3, 5), "tanh")
    idx = last_layer_indices(net)
    assert idx.tolist() == list(range(net.layers[-1][2].start, net.num_weights))
    J_last, _ = network_jacobian(net, x, w, indices=idx)  # MLP sweep, last layer only
    J_func, _ = network_jacobian(net, x, w, indices=idx, method="func")
    torch.testing.assert_close(J_last, fd_jacobian(net, x, w)[..., idx], rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(J_last, J_func, rtol=1e-12, atol=1e-12)
    odd = torch.tensor([0, 3, 7])  # not a layer block: torch.func path
    torch.testing.assert_close(
        network_jacobian(net, x, w, indices=odd)[0], fd_jacobian(net, x, w)[..., odd], rtol=1e-6, atol=1e-8
    )
    module = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)).double()
    mnet = pb.ModuleNet(module, 2, 2)
    wm = mnet.init_weights()
    torch.testing.assert_close(network_jacobian(mnet, x, wm)[0], fd_jacobian(mnet, x, wm), rtol=1e-6, atol=1e-8)
    assert last_layer_indices(mnet).tolist() == list(range(9, 17))


def test_jacobian_argument_errors():
    net, w, x, _, _ = tiny_problem()
    with pytest.raises(ValueError, match="method"):
        network_jacobian(net, x, w, method="backward")
    with pytest.raises(ValueError, match="method='mlp'"):
        network_jacobian(net, x, w, indices=torch.tensor([0, 2]), method="mlp")
    with pytest.raises(ValueError, match="num_weights"):
        network_jacobian(net, x, w[:-1])


# ----------------------------------------------------------------------------------------------
# the predictive against an independent computation
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("structure", ["full", "diag", "last_layer"])
@pytest.mark.parametrize("out", [1, 2])
def test_predictive_equals_explicit_finite_difference_computation(structure, out):
    net, w, x, y, xs = tiny_problem(out)
    prior_prec = torch.rand(net.num_weights, generator=torch.Generator().manual_seed(1)) + 0.5
    sigma = 0.3
    model = pb.BNN(net, prior_scale=prior_prec.rsqrt().float(), noise_scale=sigma)
    la = LinearizedLaplace(model, w, structure=structure).fit(x.float(), y.float())
    pred = la.predictive(xs)
    mean, f_cov = reference_predictive(net, x, y, xs, w, prior_prec.double(), sigma, structure)
    torch.testing.assert_close(pred.mean, mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(pred.f_cov, f_cov, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(pred.var, f_cov.diagonal(dim1=-2, dim2=-1) + sigma**2, rtol=1e-6, atol=1e-9)
    assert pred.f_cov.shape == (6, out, out)


def test_chunking_and_float32_agree_with_one_chunk_float64():
    net, w, x, y, xs = tiny_problem(2, n=23)
    model = pb.BNN(net, prior_scale=1.0, noise_scale=0.2)
    ref = LinearizedLaplace(model, w).fit(x, y)
    small = LinearizedLaplace(model, w, chunk_size=4).fit(x, y)
    torch.testing.assert_close(small.gram, ref.gram)
    torch.testing.assert_close(small.predictive(xs).f_cov, ref.predictive(xs).f_cov)
    f32 = LinearizedLaplace(model, w.float(), dtype=torch.float32).fit(x.float(), y.float())
    assert f32.predictive(xs).f_cov.dtype == torch.float32
    torch.testing.assert_close(f32.predictive(xs).f_cov.double(), ref.predictive(xs).f_cov, rtol=1e-3, atol=1e-5)


def test_memory_of_diag_and_last_layer_is_linear_in_the_weights():
    net = pb.MLP(3, [50, 50], 1)
    x, y = torch.randn(40, 3), torch.randn(40)
    model = pb.BNN(net)
    w = net.init_weights()
    assert LinearizedLaplace(model, w, structure="diag").fit(x, y).gram.shape == (net.num_weights,)
    la = LinearizedLaplace(model, w, structure="last_layer").fit(x, y)
    assert la.gram.shape == (51, 51) and la.num_params == 51


# ----------------------------------------------------------------------------------------------
# exactness on a linear-Gaussian model
# ----------------------------------------------------------------------------------------------
def _linear_gaussian(n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g, dtype=D64)
    y = x @ torch.tensor([0.5, -1.0, 2.0], dtype=D64) + 0.3 + 0.5 * torch.randn(n, generator=g, dtype=D64)
    prior_scale = torch.tensor([0.7, 1.3, 2.0, 1.0])
    model = pb.BNN(pb.MLP(3, [], 1, activation="identity"), prior_scale=prior_scale, noise_scale=0.5)
    phi = torch.cat([x, torch.ones(n, 1, dtype=D64)], 1)
    prec = phi.T @ phi / 0.5**2 + torch.diag(prior_scale.double() ** -2)
    cov = torch.linalg.inv(prec)
    mu = cov @ phi.T @ y / 0.5**2
    return model, x, y, phi, mu, cov, prior_scale.double()


@pytest.mark.parametrize("structure", ["full", "last_layer"])
def test_laplace_is_exact_on_a_linear_gaussian_model(structure):
    model, x, y, phi, mu, cov, prior_scale = _linear_gaussian()
    la = LinearizedLaplace(model, mu, structure=structure).fit(x, y)
    torch.testing.assert_close(la.posterior_covariance, cov, rtol=1e-10, atol=1e-12)
    xs = torch.randn(7, 3, dtype=D64)
    phis = torch.cat([xs, torch.ones(7, 1, dtype=D64)], 1)
    pred = la.predictive(xs)
    torch.testing.assert_close(pred.mean[:, 0], phis @ mu)
    torch.testing.assert_close(pred.var[:, 0], (phis @ cov * phis).sum(1) + 0.5**2)
    # the Laplace evidence is the exact evidence N(y; 0, s^2 I + Phi Lambda Phi^T)
    exact = torch.distributions.MultivariateNormal(
        torch.zeros(len(y), dtype=D64), 0.5**2 * torch.eye(len(y), dtype=D64) + phi @ torch.diag(prior_scale**2) @ phi.T
    ).log_prob(y)
    torch.testing.assert_close(la.log_marginal_likelihood(), exact)


def test_train_map_then_laplace_matches_the_exact_posterior_on_a_linear_model():
    model, x, y, _, mu, cov, _ = _linear_gaussian()
    w_map = pb.train_map(model, x.float(), y.float(), num_steps=3000, lr=0.05, seed=0, progress=False)
    torch.testing.assert_close(w_map.double(), mu, rtol=0, atol=2e-3)
    la = LinearizedLaplace(model, w_map).fit(x.float(), y.float())
    torch.testing.assert_close(la.posterior_covariance, cov, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------------------------
# hyper-parameters
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("structure", ["full", "diag", "last_layer"])
def test_eigen_evidence_equals_cholesky_evidence_and_marglik_optimum_is_a_maximum(structure):
    net, w, x, y, _ = tiny_problem(2, n=30)
    model = pb.BNN(net, prior_scale=torch.rand(net.num_weights) + 0.5, noise_scale=0.5)
    la = LinearizedLaplace(model, w, structure=structure).fit(x, y)
    p0 = la.prior_precision.clone()
    for delta, sigma in [(0.3, 0.2), (2.0, 1.1)]:
        fast = la._scaled_evidence(torch.tensor(math.log(delta), dtype=D64), torch.tensor(math.log(sigma), dtype=D64))
        slow = la.log_marginal_likelihood(delta * p0, torch.tensor(sigma, dtype=D64))
        torch.testing.assert_close(fast, slow)
    best = la.optimize_hyperparameters()
    torch.testing.assert_close(la.prior_precision, best["prior_factor"] * p0)
    assert float(la.noise_scale) == pytest.approx(best["noise_scale"])
    assert float(la.log_marginal_likelihood()) == pytest.approx(best["objective"], rel=1e-9)
    for f_d, f_s in [(1.1, 1), (0.9, 1), (1, 1.05), (1, 0.95)]:
        other = la.log_marginal_likelihood(f_d * la.prior_precision, f_s * la.noise_scale)
        assert float(other) < best["objective"]
    again = la.optimize_hyperparameters()  # a fixed point: optimising again changes nothing
    assert again["prior_factor"] == pytest.approx(1.0, rel=1e-4)
    assert again["noise_scale"] == pytest.approx(best["noise_scale"], rel=1e-4)


def test_noise_only_marglik_keeps_the_prior():
    net, w, x, y, _ = tiny_problem(1, n=30)
    la = LinearizedLaplace(pb.BNN(net, 1.0, 0.5), w).fit(x, y)
    out = la.optimize_hyperparameters(prior=False)
    assert out["prior_factor"] == 1.0
    torch.testing.assert_close(la.prior_precision, torch.ones(net.num_weights, dtype=D64))


@pytest.mark.parametrize("structure", ["full", "diag"])
def test_validation_selection_is_the_grid_argmax_of_the_predictive_ll(structure):
    net, w, x, y, xs = tiny_problem(2, n=30)
    xv, yv = torch.randn(12, 2, dtype=D64), torch.randn(12, 2, dtype=D64)
    model = pb.BNN(net, prior_scale=1.0, noise_scale=0.5)
    grid_d, grid_s = [0.1, 1.0, 10.0], [0.3, 0.8, 2.0]
    la = LinearizedLaplace(model, w, structure=structure).fit(x, y)
    best = la.optimize_hyperparameters("validation", x_valid=xv, y_valid=yv, prior_grid=grid_d, noise_grid=grid_s)
    scores = {}
    for d in grid_d:
        for s in grid_s:
            ref = LinearizedLaplace(model, w, structure=structure, prior_precision=d, noise_scale=s).fit(x, y)
            scores[(d, s)] = float(ref.predictive(xv).log_prob(yv).mean())
    arg = max(scores, key=scores.get)
    assert (best["prior_factor"], best["noise_scale"]) == pytest.approx(arg)
    assert best["objective"] == pytest.approx(scores[arg], rel=1e-9)


def test_hyperparameter_argument_errors():
    net, w, x, y, _ = tiny_problem(1)
    la = LinearizedLaplace(pb.BNN(net), w)
    with pytest.raises(RuntimeError, match="fit"):
        la.predictive(x)
    la.fit(x, y)
    with pytest.raises(ValueError, match="method"):
        la.optimize_hyperparameters("grid")
    with pytest.raises(ValueError, match="x_valid"):
        la.optimize_hyperparameters("validation")
    with pytest.raises(ValueError, match="nothing"):
        la.optimize_hyperparameters(prior=False, noise=False)
    with pytest.raises(ValueError, match="noise_scale"):
        la.set_hyperparameters(noise_scale=-1.0)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(structure="kronecker"), "structure"),
        (dict(structure="diag", subset_indices=torch.tensor([0])), "subset_indices"),
        (dict(structure="last_layer", subset_indices=torch.tensor([0, 0])), "subset_indices"),
        (dict(prior_precision=torch.ones(3)), "prior_precision"),
        (dict(noise_scale=0.0), "noise_scale"),
        (dict(dtype=torch.float16), "dtype"),
    ],
)
def test_constructor_errors_name_the_argument(kwargs, match):
    net, w, _, _, _ = tiny_problem(1)
    with pytest.raises(ValueError, match=match):
        LinearizedLaplace(pb.BNN(net), w, **kwargs)
    with pytest.raises(ValueError, match="w_map"):
        LinearizedLaplace(pb.BNN(net), w[:3])


def test_jitter_is_added_and_reported_for_a_non_positive_definite_precision():
    net = pb.MLP(1, [], 1, activation="identity")
    x, y = torch.ones(50, 1), torch.zeros(50)
    la = LinearizedLaplace(pb.BNN(net, noise_scale=1.0), torch.zeros(2), prior_precision=1e-30).fit(x, y)
    # round-off can leave the accumulated Gram matrix slightly indefinite; simulate that
    la.gram = torch.tensor([[1.0, 1.0 + 1e-3], [1.0 + 1e-3, 1.0]], dtype=D64)
    with pytest.warns(RuntimeWarning, match="jitter"):
        pred = la.predictive(x[:2])
    assert 1e-3 < la.jitter <= 1e-1 and torch.isfinite(pred.f_cov).all()
    la.set_hyperparameters(prior_precision=1e-3)
    la.gram = torch.full((2, 2), 50.0, dtype=D64)  # singular G, positive prior: no jitter
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        la.predictive(x[:2])
    assert la.jitter == 0.0


# ----------------------------------------------------------------------------------------------
# evaluate and the multi-output log-likelihood
# ----------------------------------------------------------------------------------------------
def test_evaluate_matches_the_gaussian_predictive():
    net, w, x, y, xs = tiny_problem(2)
    la = LinearizedLaplace(pb.BNN(net, noise_scale=0.3), w).fit(x, y)
    ys = torch.randn(6, 2, dtype=D64)
    out = la.evaluate(xs, ys, y_mean=1.0, y_std=2.0)
    pred = la.predictive(xs)
    mvn = torch.distributions.MultivariateNormal(pred.mean * 2 + 1, 4 * pred.cov)
    assert out["test_ll"] == pytest.approx(float(mvn.log_prob(ys * 2 + 1).mean()), rel=1e-9)
    assert out["rmse"] == pytest.approx(float(2 * (ys - pred.mean).square().mean().sqrt()), rel=1e-6)
    z = 1.959963984540054
    assert out["mpiw"] == pytest.approx(float((2 * z * 2 * pred.var.sqrt()).mean()), rel=1e-6)


# ----------------------------------------------------------------------------------------------
# sampled Laplace: the guide
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("structure", ["full", "diag", "last_layer"])
def test_guide_samples_have_the_laplace_mean_and_covariance(structure):
    net, w, x, y, _ = tiny_problem(1, n=40)
    model = pb.BNN(net, prior_scale=1.0, noise_scale=0.3)
    la = LinearizedLaplace(model, w, structure=structure).fit(x.float(), y.float())
    guide = la.as_guide(dtype=D64)
    assert isinstance(guide, LaplaceGuide)
    S = 20000
    ws = guide.sample_weights(S, seed=0)
    sub = torch.arange(net.num_weights) if structure != "last_layer" else la.indices
    cov = la.posterior_covariance
    cov = torch.diag(cov) if structure == "diag" else cov
    sd = cov.diagonal().sqrt()
    z = (ws[:, sub].mean(0) - w[sub]) / (sd / math.sqrt(S))
    assert z.abs().max() < 4.5
    emp = torch.cov(ws[:, sub].T)
    # covariance entries: standard error of a sample covariance ~ sd_i sd_j sqrt(2 / S)
    err = (emp - cov) / (sd[:, None] * sd[None, :] * math.sqrt(2 / S))
    assert err.abs().max() < 6
    if structure == "last_layer":
        fixed = torch.ones(net.num_weights, dtype=torch.bool)
        fixed[la.indices] = False
        assert torch.equal(ws[:, fixed], w[fixed].expand(S, -1))
    lp = guide.distribution().log_prob(ws[:3])
    assert lp.shape == (3,) and torch.isfinite(lp).all()


@pytest.mark.parametrize("structure", ["full", "diag", "last_layer"])
def test_guide_works_with_predictive_sample_posterior_evaluate_and_arviz(structure):
    from pyro_bnnlv.diagnostics import to_inference_data

    data = pb.load_dataset("clusters", sizes=(40, 20, 30))
    model = pb.BNN(pb.MLP(1, [10], 1), prior_scale=1.0, noise_scale=0.1)
    w_map = pb.train_map(model, data.x_train, data.y_train, num_steps=300, seed=0, progress=False)
    la = LinearizedLaplace(model, w_map, structure=structure).fit(data.x_train, data.y_train)
    guide = la.as_guide()
    pred = Predictive(model, guide=guide, num_samples=7)(data.x_test)
    assert pred["obs"].shape == (7, 30)
    pred_par = Predictive(model, guide=guide, num_samples=7, parallel=True)(data.x_test)
    assert pred_par["obs"].shape == (7, 30)
    samples = pb.sample_posterior(model, guide, data.x_train, num_samples=50, seed=0)
    assert samples["w"].shape == (50, model.num_weights)
    again = pb.sample_posterior(model, guide, data.x_train, num_samples=50, seed=0)
    assert torch.equal(samples["w"], again["w"])
    metrics = pb.evaluate(model, samples, data.x_test, data.y_test)
    assert metrics.notna().all() and math.isfinite(metrics["test_ll"])
    idata = to_inference_data(model, guide, data.x_train, data.y_train, num_samples=20, seed=0)
    assert idata.weights["w"].shape[:2] == (1, 20)
    # reload: same buffers, same draws
    clone = LaplaceGuide(
        la.w_map.float(),
        **(
            {"scale": guide.scale}
            if structure == "diag"
            else {"scale_tril": guide.scale_tril, "indices": guide.indices}
        ),
    )
    clone.load_state_dict(guide.state_dict())
    assert torch.equal(clone.sample_weights(5, seed=3), guide.sample_weights(5, seed=3))


def test_to_model_carries_the_selected_hyperparameters():
    net, w, x, y, _ = tiny_problem(1, n=30)
    la = LinearizedLaplace(pb.BNN(net, 1.0, 0.5), w).fit(x, y)
    la.optimize_hyperparameters()
    m = la.to_model()
    assert float(m.noise_scale) == pytest.approx(float(la.noise_scale), rel=1e-6)
    torch.testing.assert_close(m.prior_scale.double(), la.prior_precision.rsqrt(), rtol=1e-6, atol=0)


def test_linearised_laplace_has_in_between_uncertainty_on_the_clusters_toy():
    """sec. 3 / Fig. 1: the LL error bar in the gap is several times the one on the data."""
    data = pb.load_dataset("clusters")
    model = pb.BNN(pb.MLP(1, [50], 1), prior_scale=pb.fan_in_prior_scale(pb.MLP(1, [50], 1)), noise_scale=0.1)
    w_map = pb.train_map(model, data.x_train, data.y_train, num_steps=2000, seed=0, progress=False)
    la = LinearizedLaplace(model, w_map).fit(data.x_train, data.y_train)
    sd = la.predictive(torch.tensor([[-0.75], [0.0], [0.75]])).f_var[:, 0].sqrt()
    assert sd[1] > 3 * sd[0] and sd[1] > 3 * sd[2]


@pytest.mark.slow  # about a minute: includes the protein case
def test_bench_laplace_runs_and_agrees_with_the_reference():
    from pyro_bnnlv.reproduce.bench import BENCHMARKS

    fn, _ = BENCHMARKS["laplace"]
    table = fn(steps=2, rounds=1)
    assert table["ms"].map(math.isfinite).all()
    assert all(v < 1e-8 for k, v in table.attrs.items() if k.startswith("max_rel_diff"))
    small = table.loc["clusters toy, N=100"]
    assert small.loc["LinearizedLaplace diag (float64)", "curvature_floats"] == 151
