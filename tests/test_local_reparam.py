"""Local reparameterisation: exact per-point marginals, the same ELBO in expectation as plain
reparameterisation (Trace_ELBO), lower variance, and training through fit_svi."""

import math

import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import AutoMultivariateNormal, AutoNormal

import pyro_bnnlv as pb
from pyro_bnnlv.infer.elbos.local_reparam import LocalReparamELBO, local_reparam_forward


def _guide_params(P, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(P, generator=g) * 0.5, torch.rand(P, generator=g) * 0.3 + 0.05


def test_linear_layer_marginal_is_the_exact_gaussian():
    net = pb.MLP(2, [], 1, activation="identity")
    loc, scale = _guide_params(net.num_weights)
    x = torch.tensor([[1.0, -2.0], [0.5, 0.0], [3.0, 1.0]])
    f = local_reparam_forward(net, x, loc, scale, num_particles=40000)[..., 0]  # (K, 3)
    mean = x @ loc[:2] + loc[2]
    var = x.square() @ scale[:2].square() + scale[2].square()
    S = f.shape[0]
    assert ((f.mean(0) - mean) / (var / S).sqrt()).abs().max() < 4.5
    assert ((f.var(0) - var) / (var * math.sqrt(2 / S))).abs().max() < 4.5


def test_hidden_layer_marginal_matches_weight_sampling():
    """Per point, f under local reparameterisation has the law of f(x; w), w ~ q: compare the
    first two moments with plain weight samples (two-sample z-tests)."""
    net = pb.MLP(1, [6], 1, activation="tanh")
    loc, scale = _guide_params(net.num_weights, seed=1)
    x = torch.linspace(-2, 2, 5).unsqueeze(-1)
    S = 40000
    torch.manual_seed(0)
    f_lr = local_reparam_forward(net, x, loc, scale, num_particles=S)[..., 0]
    w = loc + scale * torch.randn(S, net.num_weights)
    f_w = net(x, w)[..., 0]
    for a, b in ((f_lr, f_w), (f_lr.square(), f_w.square())):
        se = (a.var(0) / S + b.var(0) / S).sqrt()
        assert ((a.mean(0) - b.mean(0)) / se).abs().max() < 4.5


def _elbo_samples(loss, model, guide, x, y, n, **kw):
    return torch.tensor([-loss.loss(model, guide, x, y, **kw) for _ in range(n)], dtype=torch.float64)


@pytest.mark.parametrize("batch_size", [None, 10])
def test_same_elbo_in_expectation_as_trace_elbo_with_lower_variance(batch_size):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 1, generator=g) * 2 - 1
    y = torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(40, generator=g)
    model = pb.BNN(pb.MLP(1, [8], 1), prior_scale=1.0, noise_scale=0.3)
    guide = AutoNormal(model, init_scale=0.2, init_loc_fn=pb.init_to_network(model))
    kw = {} if batch_size is None else {"batch_size": batch_size}
    n = 3000
    plain = _elbo_samples(Trace_ELBO(), model, guide, x, y, n, **kw)
    local = _elbo_samples(LocalReparamELBO(), model, guide, x, y, n, **kw)
    local_mc = _elbo_samples(LocalReparamELBO(analytic_kl=False), model, guide, x, y, n, **kw)
    for est in (local, local_mc):
        se = math.sqrt(float(plain.var() / n + est.var() / n))
        assert abs(float(plain.mean() - est.mean())) < 4.5 * se, (plain.mean(), est.mean(), se)
    if batch_size is None:  # without minibatch noise the local estimator is much less variable
        assert float(local.var()) < 0.5 * float(plain.var())


def test_fit_svi_with_local_reparam_descends_and_learns_the_noise():
    data = pb.load_dataset("clusters", sizes=(60, 20, 40))
    model = pb.BNN(pb.MLP(1, [20], 1), prior_scale=1.0, noise_scale=0.5, learn_noise=True)
    guide = AutoNormal(model, init_scale=0.01, init_loc_fn=pb.init_to_network(model))
    losses = pb.fit_svi(
        model,
        guide,
        data.x_train,
        data.y_train,
        num_steps=800,
        lr=0.02,
        loss=LocalReparamELBO(num_particles=4),
        seed=0,
        progress=False,
    )
    assert sum(losses[-100:]) / 100 < sum(losses[:100]) / 100 - 50
    assert float(model.noise_scale.detach()) < 0.3  # moved from 0.5 towards the true 0.1
    samples = pb.sample_posterior(model, guide, data.x_train, num_samples=100, seed=0)
    m = pb.evaluate(model, samples, data.x_test, data.y_test)
    assert m.notna().all() and m["rmse"] < 0.3


def test_seeded_estimates_are_reproducible():
    x, y = torch.randn(10, 1), torch.randn(10)
    model = pb.BNN(pb.MLP(1, [4], 1))
    guide = AutoNormal(model, init_loc_fn=pb.init_to_network(model))
    pyro.set_rng_seed(3)
    a = LocalReparamELBO(num_particles=2).loss(model, guide, x, y)
    pyro.set_rng_seed(3)
    assert LocalReparamELBO(num_particles=2).loss(model, guide, x, y) == a


def test_errors_name_the_problem():
    x, y = torch.randn(10, 1), torch.randn(10)
    model = pb.BNN(pb.MLP(1, [4], 1))
    with pytest.raises(ValueError, match="mean-field Gaussian guide"):
        LocalReparamELBO().loss(model, AutoMultivariateNormal(model), x, y)
    lv = pb.BNNLV(pb.MLP(2, [4], 1), latent_dim=1)
    with pytest.raises(ValueError, match="only latent site"):
        LocalReparamELBO().loss(lv, AutoNormal(lv), x, y)
    with pytest.raises(ValueError, match="num_particles"):
        LocalReparamELBO(num_particles=0)


@pytest.mark.parametrize("analytic_kl", [True, False])
@pytest.mark.parametrize("particles, batch_size, learn_noise", [(1, None, False), (4, 10, False), (2, 10, True)])
def test_fused_steps_equal_the_traced_estimate(analytic_kl, particles, batch_size, learn_noise):
    from fused_twin import compare_with_twin

    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 1, generator=g) * 2 - 1
    y = torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(40, generator=g)
    net = pb.MLP(1, [8], 1)
    model = pb.BNN(net, prior_scale=pb.fan_in_prior_scale(net), noise_scale=0.3, learn_noise=learn_noise)
    guide = pb.MeanField(model, init_scale=0.2)
    loss = LocalReparamELBO(num_particles=particles, analytic_kl=analytic_kl)
    calls = []
    original = loss._fused_estimate
    loss._fused_estimate = lambda *a, **k: calls.append(1) or original(*a, **k)
    kwargs = {} if batch_size is None else {"batch_size": batch_size}
    n, twin = compare_with_twin(model, guide, x, y, kwargs, loss, rtol=1e-5)
    assert n == 2 + learn_noise and type(twin) is LocalReparamELBO and not twin.fused
    assert len(calls) == 5 + 3  # every step after the first, checks included


def test_a_fused_fit_runs_no_pyro_trace_after_its_first_step(monkeypatch):
    traced = []
    original = LocalReparamELBO._get_trace
    monkeypatch.setattr(LocalReparamELBO, "_get_trace", lambda self, *a: traced.append(1) or original(self, *a))
    x = torch.linspace(-1, 1, 30).unsqueeze(-1)
    y = torch.sin(3 * x[:, 0])
    model = pb.BNN(pb.MLP(1, [8], 1), prior_scale=1.0, noise_scale=0.3)
    guide = pb.MeanField(model)
    pb.fit_svi(model, guide, x, y, num_steps=20, loss=LocalReparamELBO(), seed=0, progress=False, check_jit=False)
    assert len(traced) == 1
    assert not LocalReparamELBO(site="v").fused and LocalReparamELBO().eager_twin().eager_twin() is None
