"""K-FAC linearised Laplace (structure="kfac"): the factors against explicit per-point
activations and autograd Jacobians (KFC patches by hand for a Conv2d), exactness where K-FAC is
exact (one data point, a model linear in the layer), the flat-weight order of the Kronecker block,
log-determinant / marginal likelihood / predictive / guide against the dense matrix the factors
stand for, test LL near structure="full", and the errors."""

import math
import warnings

import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Predictive
from torch import nn

import pyro_bnnlv as pb
from pyro_bnnlv.infer import LinearizedLaplace, network_jacobian

D64 = torch.float64


# ----------------------------------------------------------------------------------------------
# independent references
# ----------------------------------------------------------------------------------------------
def exact_ggn(net, x, w, Lam):
    """``sum_n J_n^T Lambda_n J_n`` with ``J`` by ``vmap(jacrev)``: ``(P, P)``."""
    J, _ = network_jacobian(net, x, w, method="func")
    return torch.einsum("nkp,nkl,nlq->pq", J, Lam, J)


def lam_of(likelihood, f, sigma=1.0):
    if likelihood == "gaussian":
        return torch.eye(f.shape[-1], dtype=D64).expand(f.shape[0], -1, -1) / sigma**2
    return pb.models.likelihoods.as_likelihood(likelihood).hessian(f)


def explicit_mlp_factors(net, x, w, likelihood):
    """Per layer ``A = mean_n a_n a_n^T`` (``a_n`` the layer input with a 1 appended) and
    ``G = sum_n B_n^T Lambda_n B_n``, ``B_n = df(x_n)/ds`` by ``torch.autograd.functional.jacobian``
    of the rest of the network, one point at a time."""
    params = net.unflatten(w)
    act = pb.nets.ACTIVATIONS[net.activation]

    def rest(s, l):  # f from the pre-activation of layer l
        h = s
        for i in range(l, len(params)):
            if i > l:
                h = h @ params[i][0].T + params[i][1]
            if i < len(params) - 1:
                h = act(h)
        return h

    out = []
    for l in range(len(params)):
        A = torch.zeros(params[l][0].shape[1] + 1, params[l][0].shape[1] + 1, dtype=D64)
        G = torch.zeros(params[l][0].shape[0], params[l][0].shape[0], dtype=D64)
        for n in range(x.shape[0]):
            h = x[n]
            for i in range(l):
                h = act(h @ params[i][0].T + params[i][1])
            a = torch.cat([h, torch.ones(1, dtype=D64)])
            s = h @ params[l][0].T + params[l][1]
            B = torch.autograd.functional.jacobian(lambda s_: rest(s_, l), s)  # (L, out)
            Lam = lam_of(likelihood, net(x[n : n + 1], w))[0]
            A += torch.outer(a, a) / x.shape[0]
            G += B.T @ Lam @ B
        out.append((A, G))
    return out


def tiny(out=2, hidden=(4, 3), likelihood="gaussian", n=12, seed=0, activation="tanh"):
    g = torch.Generator().manual_seed(seed)
    net = pb.MLP(2, list(hidden), out, activation=activation)
    w = net.init_weights(g).double() * 1.5
    x = torch.randn(n, 2, generator=g, dtype=D64)
    if likelihood == "gaussian":
        y = torch.randn(n, out, generator=g, dtype=D64)
        model = pb.BNN(net, prior_scale=pb.fan_in_prior_scale(net, bias_scale=0.8), noise_scale=0.6).double()
        y = y if out > 1 else y[:, 0]
    else:
        y = torch.randint(0, max(out, 2), (n,), generator=g)
        model = pb.BNN(net, prior_scale=pb.fan_in_prior_scale(net), likelihood=likelihood).double()
    return model, w, x, y


def conv_net(kernel=3):
    torch.manual_seed(0)
    side = 6 - kernel + 1
    module = nn.Sequential(
        nn.Unflatten(1, (1, 6, 6)), nn.Conv2d(1, 2, kernel), nn.Tanh(), nn.Flatten(), nn.Linear(2 * side * side, 3)
    ).double()
    return pb.ModuleNet(module, 36, 3)


# ----------------------------------------------------------------------------------------------
# factors
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("likelihood,out", [("gaussian", 2), ("categorical", 3), ("bernoulli", 1)])
def test_single_point_kfac_block_is_the_exact_ggn_block(likelihood, out):
    """For N = 1 the GGN block of every layer is exactly G (x) A, in the flat order of w."""
    model, w, x, y = tiny(out, likelihood=likelihood, n=1)
    la = LinearizedLaplace(model, w, structure="kfac").fit(x, y)
    sigma = float(la.noise_scale)
    H = exact_ggn(model.net, x, w, lam_of(likelihood, model.net(x, w), sigma))
    H_kfac = la.dense_precision() - torch.diag(la.prior_precision)
    for layer in la.kfac_layers:
        i = layer.index.reshape(-1)
        torch.testing.assert_close(H_kfac[i][:, i], H[i][:, i], rtol=1e-10, atol=1e-12)
    # and nothing outside the layer blocks
    mask = torch.zeros_like(H, dtype=torch.bool)
    for layer in la.kfac_layers:
        i = layer.index.reshape(-1)
        mask[i[:, None], i[None, :]] = True
    assert (H_kfac[~mask] == 0).all()


@pytest.mark.parametrize("likelihood,out", [("gaussian", 2), ("categorical", 3)])
def test_factors_match_explicit_activations_and_jacobians(likelihood, out):
    model, w, x, y = tiny(out, likelihood=likelihood, n=9, activation="sigmoid")
    la = LinearizedLaplace(model, w, structure="kfac", chunk_size=4).fit(x, y)  # several chunks
    expected = explicit_mlp_factors(model.net, x, w, likelihood)
    s2 = float(la.noise_scale) ** 2 if likelihood == "gaussian" else 1.0
    for (A, G), (A_ref, G_ref) in zip(la.kfac_factors(), expected):
        torch.testing.assert_close(A, A_ref, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(G, G_ref / s2, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("module_net", [False, True])
def test_model_linear_in_the_layer_is_exact_for_any_n(module_net):
    """A linear model with a Gaussian likelihood: B_n = I, so K-FAC = the full GGN (N = 20)."""
    g = torch.Generator().manual_seed(1)
    net = pb.ModuleNet(nn.Linear(3, 2).double(), 3, 2) if module_net else pb.MLP(3, [], 2)
    w = net.init_weights(g).double()
    x, y = torch.randn(20, 3, generator=g, dtype=D64), torch.randn(20, 2, generator=g, dtype=D64)
    model = pb.BNN(net, prior_scale=pb.fan_in_prior_scale(net, bias_scale=2.0), noise_scale=0.4).double()
    kfac = LinearizedLaplace(model, w, structure="kfac").fit(x, y)
    full = LinearizedLaplace(model, w, structure="full").fit(x, y)
    torch.testing.assert_close(kfac.dense_precision(), full.posterior_precision, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(kfac.log_marginal_likelihood(), full.log_marginal_likelihood(), rtol=1e-10, atol=1e-10)


def test_conv2d_factors_match_the_kfc_definition():
    """KFC (Grosse & Martens 2016): A = (1/N) sum_n sum_t a_t a_t^T over 3x3 patches cut by hand,
    G = (1/T) sum_n sum_t B_t^T Lambda_n B_t with B_t = df/ds_t by autograd; the Linear layer as K-FAC."""
    net = conv_net()
    conv, lin = net.module[1], net.module[4]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 36, generator=g, dtype=D64)
    y = torch.randint(0, 3, (5,), generator=g)
    w = net.init_weights().double()
    model = pb.BNN(net, prior_scale=pb.fan_in_prior_scale(net), likelihood="categorical").double()
    la = LinearizedLaplace(model, w, structure="kfac").fit(x, y)
    assert [lay.kind for lay in la.kfac_layers] == ["conv2d", "linear"]
    f = net(x, w)
    Lam = lam_of("categorical", f)
    A = torch.zeros(10, 10, dtype=D64)
    G = torch.zeros(2, 2, dtype=D64)
    A2 = torch.zeros(33, 33, dtype=D64)
    G2 = torch.zeros(3, 3, dtype=D64)
    T = 16
    for n in range(5):
        img = x[n].reshape(1, 6, 6)
        s = torch.nn.functional.conv2d(img.unsqueeze(0), conv.weight, conv.bias)[0]  # (2, 4, 4)
        J = torch.autograd.functional.jacobian(lambda s_: lin(torch.tanh(s_).reshape(-1)), s)  # (3, 2, 4, 4)
        for r in range(4):
            for c in range(4):
                a = torch.cat([img[:, r : r + 3, c : c + 3].reshape(-1), torch.ones(1, dtype=D64)])
                B = J[:, :, r, c]  # (L, out)
                A += torch.outer(a, a) / 5
                G += B.T @ Lam[n] @ B / T
        a2 = torch.cat([torch.tanh(s).reshape(-1), torch.ones(1, dtype=D64)])
        A2 += torch.outer(a2, a2) / 5
        G2 += Lam[n]  # B = I for the last layer
    (A_k, G_k), (A2_k, G2_k) = la.kfac_factors()
    for got, ref in ((A_k, A), (G_k, G), (A2_k, A2), (G2_k, G2)):
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)


def test_conv2d_block_order_in_w_with_one_output_position():
    """A 6x6 kernel on a 6x6 image has T = 1: for one point the conv block is the exact GGN block,
    which checks where weight (out, in, kh, kw) and bias entries sit in w."""
    net = conv_net(kernel=6)
    x = torch.randn(1, 36, generator=torch.Generator().manual_seed(2), dtype=D64)
    w = net.init_weights().double()
    model = pb.BNN(net, prior_scale=1.0, likelihood="categorical").double()
    la = LinearizedLaplace(model, w, structure="kfac").fit(x, torch.tensor([1]))
    H = exact_ggn(net, x, w, lam_of("categorical", net(x, w)))
    H_kfac = la.dense_precision() - torch.eye(net.num_weights, dtype=D64)
    for layer in la.kfac_layers:
        i = layer.index.reshape(-1)
        torch.testing.assert_close(H_kfac[i][:, i], H[i][:, i], rtol=1e-10, atol=1e-12)


def test_conv2d_predictive_and_marglik_against_the_dense_matrix():
    net = conv_net()
    g = torch.Generator().manual_seed(3)
    x, xs = torch.randn(6, 36, generator=g, dtype=D64), torch.randn(4, 36, generator=g, dtype=D64)
    w = net.init_weights().double()
    model = pb.BNN(net, prior_scale=pb.fan_in_prior_scale(net), likelihood="categorical").double()
    la = LinearizedLaplace(model, w, structure="kfac").fit(x, torch.randint(0, 3, (6,), generator=g))
    H = la.dense_precision()
    J, _ = network_jacobian(net, xs, w, method="func")
    torch.testing.assert_close(
        la.predictive(xs).f_cov, J @ torch.linalg.solve(H, J.transpose(1, 2)), rtol=1e-9, atol=1e-12
    )
    torch.testing.assert_close(
        la.log_marginal_likelihood(), dense_evidence(la, H, la.prior_precision, 1.0), rtol=1e-10, atol=1e-10
    )


# ----------------------------------------------------------------------------------------------
# posterior quantities against the dense matrix
# ----------------------------------------------------------------------------------------------
def dense_evidence(la, H, p, s2):
    if la.classification:
        loglik = la.map_loglik
    else:
        loglik = -0.5 * la.num_data * la.num_outputs * math.log(2 * math.pi * s2) - 0.5 * la.sse / s2
    return loglik - 0.5 * (p * la.w_map.square()).sum() + 0.5 * p.log().sum() - 0.5 * torch.linalg.slogdet(H)[1]


@pytest.mark.parametrize("likelihood,out", [("gaussian", 2), ("categorical", 3)])
def test_marglik_predictive_and_guide_against_the_dense_matrix(likelihood, out):
    model, w, x, y = tiny(out, likelihood=likelihood, n=15)
    la = LinearizedLaplace(model, w, structure="kfac").fit(x, y)
    H, p = la.dense_precision(), la.prior_precision
    s2 = float(la.noise_scale) ** 2
    torch.testing.assert_close(la.log_marginal_likelihood(), dense_evidence(la, H, p, s2), rtol=1e-10, atol=1e-10)
    # other hyper-parameters: the factors are rescaled, the prior re-factored
    kw = {} if la.classification else {"noise_scale": 0.9}
    s2b = 0.81 if kw else 1.0
    Hb = (H - torch.diag(p)) * s2 / s2b + torch.diag(3 * p)
    torch.testing.assert_close(
        la.log_marginal_likelihood(3 * p, **kw), dense_evidence(la, Hb, 3 * p, s2b), rtol=1e-10, atol=1e-10
    )
    # predictive f_cov = J Sigma J^T
    xs = torch.randn(7, 2, generator=torch.Generator().manual_seed(5), dtype=D64) * 2
    J, f = network_jacobian(model.net, xs, w, method="func")
    pred = la.predictive(xs)
    torch.testing.assert_close(pred.mean, f)
    torch.testing.assert_close(pred.f_cov, J @ torch.linalg.solve(H, J.transpose(1, 2)), rtol=1e-9, atol=1e-12)
    # sampled Laplace: the guide's covariance and density are those of N(w*, H^{-1})
    q = la.as_guide(D64).distribution()
    torch.testing.assert_close(q.covariance_matrix, torch.linalg.inv(H), rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(la.posterior_covariance, torch.linalg.inv(H), rtol=1e-8, atol=1e-12)
    ref = dist.MultivariateNormal(w, precision_matrix=H)
    draws = q.sample((4000,))
    torch.testing.assert_close(q.log_prob(draws[:5]), ref.log_prob(draws[:5]), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(q.variance, torch.linalg.inv(H).diagonal(), rtol=1e-9, atol=1e-12)
    emp = torch.cov(draws.T)
    sd = torch.linalg.inv(H).diagonal().sqrt()
    assert ((emp - torch.linalg.inv(H)) / torch.outer(sd, sd)).abs().max() < 0.1  # correlations, 4000 draws


def test_optimize_hyperparameters_maximises_the_dense_evidence():
    model, w, x, y = tiny(1, n=20)
    la = LinearizedLaplace(model, w, structure="kfac").fit(x, y)
    p0, H0 = la.prior_precision.clone(), la.dense_precision()
    G = H0 - torch.diag(p0)  # at the initial sigma
    s2_0 = float(la.noise_scale) ** 2
    res = la.optimize_hyperparameters()

    def ev(delta, sigma):
        return float(dense_evidence(la, G * s2_0 / sigma**2 + torch.diag(delta * p0), delta * p0, sigma**2))

    best = ev(res["prior_factor"], res["noise_scale"])
    assert res["objective"] == pytest.approx(best, rel=1e-9)
    for fd, fs in ((1.05, 1.0), (0.95, 1.0), (1.0, 1.05), (1.0, 0.95)):
        assert ev(res["prior_factor"] * fd, res["noise_scale"] * fs) < best
    torch.testing.assert_close(la.prior_precision, res["prior_factor"] * p0)
    # validation grid search runs on the same eigenbasis
    xv, yv = torch.randn(10, 2, dtype=D64), torch.randn(10, dtype=D64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an optimum on the edge of the small grids
        out = la.optimize_hyperparameters(
            "validation", x_valid=xv, y_valid=yv, prior_grid=[0.5, 1.0, 2.0], noise_grid=[0.5, 1.0, 2.0]
        )
    assert math.isfinite(out["objective"])


# ----------------------------------------------------------------------------------------------
# end to end
# ----------------------------------------------------------------------------------------------
def test_regression_test_ll_near_full():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(60, 1, generator=g, dtype=D64) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(60, generator=g, dtype=D64)
    xt = torch.linspace(-2, 2, 40, dtype=D64).unsqueeze(1)
    yt = torch.sin(2 * xt[:, 0]) + 0.1 * torch.randn(40, generator=g, dtype=D64)
    net = pb.MLP(1, [16], 1)
    model = pb.BNN(net, prior_scale=pb.fan_in_prior_scale(net, omega=2.0), noise_scale=0.1).double()
    w = pb.train_map(model, x, y, num_steps=1500, lr=0.02, seed=0, progress=False)
    ll = {}
    for s in ("kfac", "full"):
        la = LinearizedLaplace(model, w, structure=s).fit(x, y)
        la.optimize_hyperparameters()
        ll[s] = la.evaluate(xt, yt)["test_ll"]
    assert math.isfinite(ll["kfac"]) and ll["kfac"] > 0.0
    assert abs(ll["kfac"] - ll["full"]) < 0.3, ll


def test_categorical_test_ll_near_full_and_guide_in_pyro():
    data = pb.load_dataset("two-moons", seed=0)
    model = pb.BNN(pb.MLP(2, [12], 2), likelihood="categorical")
    w = pb.train_map(model, data.x_train, data.y_train, num_steps=800, lr=0.03, seed=0, progress=False)
    ll = {}
    for s in ("kfac", "full"):
        la = LinearizedLaplace(model, w, structure=s).fit(data.x_train, data.y_train)
        la.optimize_hyperparameters()
        ll[s] = la.evaluate(data.x_test, data.y_test, link_approx="probit")["test_ll"]
    assert math.isfinite(ll["kfac"]) and ll["kfac"] > math.log(0.5)
    assert abs(ll["kfac"] - ll["full"]) < 0.15, ll
    guide = LinearizedLaplace(model, w, structure="kfac").fit(data.x_train, data.y_train).as_guide()
    assert guide.structure == "kron" and "structure=kron" in repr(guide)
    draws = Predictive(model, guide=guide, num_samples=5, return_sites=["w"])(data.x_test)["w"]
    assert draws.shape == (5, 1, model.net.num_weights) and torch.isfinite(draws).all()
    assert not torch.equal(draws[0], draws[1])
    restored = pb.LaplaceGuide(
        guide.loc,
        kron=[tuple(getattr(guide, f"kron{k}_{n}") for n in ("index", "U_out", "U_in", "scale")) for k in range(2)],
    )
    restored.load_state_dict(guide.state_dict())


def test_repr_and_dense_guard():
    model, w, x, y = tiny(1, n=5)
    la = LinearizedLaplace(model, w, structure="kfac")
    assert "structure='kfac'" in repr(la) and "not fitted" in repr(la)
    la.fit(x, y)
    assert "fitted" in repr(la)
    assert la.posterior_precision.shape == (model.net.num_weights,) * 2
    with pytest.raises(ValueError, match="structure='kfac'"):
        LinearizedLaplace(model, w, structure="full").fit(x, y).kfac_factors()


# ----------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------
def test_unsupported_layer_is_named():
    module = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 1)).double()
    net = pb.ModuleNet(module, 3, 1)
    model = pb.BNN(net, prior_scale=1.0, noise_scale=0.5).double()
    with pytest.raises(ValueError, match=r"1\.weight.*1\.bias|nn.Linear and nn.Conv2d"):
        LinearizedLaplace(model, net.init_weights().double(), structure="kfac")
    conv = pb.ModuleNet(nn.Sequential(nn.Unflatten(1, (2, 3, 3)), nn.Conv2d(2, 2, 2, groups=2), nn.Flatten()), 18, 8)
    with pytest.raises(ValueError, match="groups=2"):
        LinearizedLaplace(pb.BNN(conv, prior_scale=1.0, noise_scale=0.5), conv.init_weights(), structure="kfac")


def test_prior_that_does_not_factor_is_refused():
    model, w, x, y = tiny(1, n=5)
    p = torch.rand(model.net.num_weights, generator=torch.Generator().manual_seed(0), dtype=D64) + 0.5
    with pytest.raises(ValueError, match="bias_scale"):
        LinearizedLaplace(model, w, structure="kfac", prior_precision=p)
    la = LinearizedLaplace(model, w, structure="kfac").fit(x, y)
    with pytest.raises(ValueError, match="layers\\[0\\]"):
        la.set_hyperparameters(prior_precision=p)
