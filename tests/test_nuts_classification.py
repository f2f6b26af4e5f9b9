"""NUTS on MLP classifiers (issue 42): ``mlp_classification_potential`` (log-softmax / logistic
cross-entropy with a hand-written backward pass) against autograd of the traced Pyro model, its C++
twin against it, and ``run_nuts`` on the compiled path: parallel threads, reproducible, and a
logistic-regression posterior mean against quadrature."""

import math

import pyro.poutine as poutine
import pytest
import torch

import pyro_bnnlv as pb
from pyro_bnnlv import _compiled as compiled
from pyro_bnnlv.infer.mcmc import FlatPotential, flat_potential, mlp_classification_potential, run_nuts
from pyro_bnnlv.infer.mcmc import nuts as nuts_module
from pyro_bnnlv.models.likelihoods import Bernoulli

needs_core = pytest.mark.skipif(compiled.nuts_extension() is None, reason="no C++ toolchain")

CASES = [
    ("categorical", 3, "tanh", [5]),
    ("categorical", 3, "relu", [4, 3]),
    ("bernoulli", 1, "tanh", [5]),
    ("bernoulli", 1, "sigmoid", [4, 3]),
]


def _data(likelihood, K, N=23, D=2, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g, dtype=dtype)
    y = torch.randint(0, max(K, 2), (N,), generator=g)
    return x, y, g


def _traced_potential(model, x, y, w):
    """``-log p(y, w | x)`` of the Pyro model by tracing it, and its autograd gradient."""
    w = w.detach().clone().requires_grad_(True)
    tr = poutine.trace(poutine.condition(model, data={"w": w})).get_trace(x, y)
    u = -tr.log_prob_sum()
    (grad,) = torch.autograd.grad(u, w)
    return float(u.detach()), grad


@pytest.mark.parametrize("likelihood,K,activation,hidden", CASES)
def test_python_potential_equals_autograd_of_the_traced_model(likelihood, K, activation, hidden):
    net = pb.MLP(2, hidden, K, activation=activation)
    model = pb.BNN(net, prior_scale=0.7, likelihood=likelihood).double()
    x, y, g = _data(likelihood, K)
    # Bernoulli labels as float64: the model reads integer labels as the default dtype (float32),
    # which rounds its traced log-likelihood to float32; float labels are kept as they are
    y = y.double() if likelihood == "bernoulli" else y
    pot = mlp_classification_potential(net, x, y, prior_scale=model.prior_scale, likelihood=likelihood, compiled=False)
    assert pot.compiled is None and pot.names == ("w",) and pot.dim == net.num_weights
    for scale in (0.3, 1.0, 3.0, 3.0):  # several points, large logits included (stable log-sum-exp)
        w = scale * torch.randn(net.num_weights, generator=g, dtype=torch.float64)
        u, grad = pot(w)
        u_ref, g_ref = _traced_potential(model, x, y, w)
        assert float(u) == pytest.approx(u_ref, rel=1e-12, abs=1e-10)
        assert torch.allclose(grad, g_ref, rtol=1e-10, atol=1e-10)


def test_prior_mean_and_labels_of_other_types():
    """A non-zero prior mean enters value and gradient; Bernoulli labels as ints, bools or floats
    give one potential; wrong labels are refused naming the fix."""
    net = pb.MLP(2, [4], 1)
    x, y, g = _data("bernoulli", 1)
    w = torch.randn(net.num_weights, generator=g, dtype=torch.float64)
    loc = 0.2 * torch.randn(net.num_weights, generator=g, dtype=torch.float64)
    pots = [
        mlp_classification_potential(
            net, x, lab, prior_loc=loc, prior_scale=0.8, likelihood="bernoulli", compiled=False
        )
        for lab in (y, y.bool(), y.double())
    ]
    values = [p(w) for p in pots]
    assert all(float(u) == float(values[0][0]) and torch.equal(gr, values[0][1]) for u, gr in values)
    # against the log density written out
    ref = -Bernoulli().log_prob(net(x, w), y.double()).sum() - torch.distributions.Normal(loc, 0.8).log_prob(w).sum()
    assert float(values[0][0]) == pytest.approx(float(ref), rel=1e-12)
    with pytest.raises(ValueError, match="labels"):
        mlp_classification_potential(pb.MLP(2, [4], 3), x, y + 2, likelihood="categorical")
    with pytest.raises(ValueError, match="categorical"):
        mlp_classification_potential(net, x, y, likelihood="gaussian")


@needs_core
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("likelihood,K,activation,hidden", CASES + [("categorical", 4, "rbf", [])])
def test_compiled_potential_equals_python_potential(likelihood, K, activation, hidden, dtype):
    net = pb.MLP(3, hidden, K, activation=activation)
    x, y, g = _data(likelihood, K, N=29, D=3, seed=1, dtype=dtype)  # 29 points: padded to 32
    kw = dict(
        prior_loc=0.1, prior_scale=torch.rand(net.num_weights, generator=g, dtype=dtype) + 0.5, likelihood=likelihood
    )
    python = mlp_classification_potential(net, x, y, compiled=False, **kw)
    fast = mlp_classification_potential(net, x, y, compiled=True, **kw)
    assert python.compiled is None and fast.compiled is not None and fast.dim == python.dim
    rtol = 1e-12 if dtype == torch.float64 else 1e-5
    for scale in (0.3, 1.0, 4.0):
        q = scale * torch.randn(python.dim, generator=g, dtype=dtype)
        (u_py, g_py), (u_c, g_c) = python(q), fast(q)
        assert float(u_c) == pytest.approx(float(u_py), rel=rtol)
        assert g_c.dtype == dtype and g_c.shape == g_py.shape
        assert torch.allclose(g_c, g_py, rtol=0, atol=rtol * 10 * float(g_py.abs().max()))
    # a clone (one per chain) computes the same
    (u1, g1), (u2, g2) = fast.compiled.value_and_grad(q), fast.compiled.clone().value_and_grad(q)
    assert u2 == u1 and torch.equal(g2, g1)


@needs_core
def test_flat_potential_of_an_mlp_classifier_is_compiled_and_other_nets_keep_autograd():
    x, y, _ = _data("categorical", 3)
    model = pb.BNN(pb.MLP(2, [5], 3), likelihood="categorical").double()
    pot = flat_potential(model, x, y)
    assert pot.compiled is not None
    w = torch.randn(model.num_weights, dtype=torch.float64)
    u_ref, g_ref = _traced_potential(model, x, y, w)
    u, grad = pot(w)
    assert float(u) == pytest.approx(u_ref, rel=1e-12) and torch.allclose(grad, g_ref, atol=1e-10)
    other = pb.BNN(pb.ModuleNet(torch.nn.Linear(2, 3, bias=False), 2, 3), likelihood="categorical").double()  # no MLP
    pot_other = flat_potential(other, x, y)
    assert isinstance(pot_other, FlatPotential) and pot_other.compiled is None
    w = torch.randn(other.num_weights, dtype=torch.float64)
    u_ref, g_ref = _traced_potential(other, x, y, w)
    u, grad = pot_other(w)
    assert float(u) == pytest.approx(u_ref, rel=1e-12) and torch.allclose(grad, g_ref, atol=1e-10)


def _small_classifier():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(30, 2, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long() + (x[:, 1] > 0.8).long()
    return pb.BNN(pb.MLP(2, [4], 3), likelihood="categorical", prior_scale=1.0), x, y


@needs_core
def test_run_nuts_runs_classifier_chains_in_parallel_threads_reproducibly(monkeypatch, recwarn):
    monkeypatch.setattr(nuts_module, "usable_cores", lambda: 2)  # no "chains share 1 core" warning
    model, x, y = _small_classifier()
    kw = dict(num_samples=10, warmup_steps=10, num_chains=2, seed=5, progress=False, map_steps=50, max_tree_depth=5)
    a = run_nuts(model, x, y, **kw)
    b = run_nuts(model, x, y, **kw)
    assert not [w for w in recwarn if "one after another" in str(w.message)]
    info = a.run_info
    assert info.chain_method == "threads" and info.compiled_potential and info.compiled_tree
    wa, wb = a.get_samples(group_by_chain=True)["w"], b.get_samples(group_by_chain=True)["w"]
    assert wa.shape == (2, 10, model.num_weights) and torch.equal(wa, wb)
    assert not torch.equal(wa[0], wa[1])


@needs_core
def test_compiled_nuts_on_logistic_regression_matches_quadrature():
    """As tests/test_classification.py's test on the autograd path, on the compiled potential: a
    Bernoulli model with no hidden layer is logistic regression on (w, b); its posterior mean by
    quadrature on a 2-D grid is the independent answer for the NUTS mean."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 1, generator=g, dtype=torch.float64)
    y = torch.bernoulli(torch.sigmoid(1.5 * x[:, 0] - 0.5), generator=g).long()
    model = pb.BNN(pb.MLP(1, [], 1), prior_scale=2.0, likelihood="bernoulli").double()
    grid = torch.linspace(-4, 6, 401, dtype=torch.float64)
    W, B = torch.meshgrid(grid, grid, indexing="ij")
    wb = torch.stack([W.reshape(-1), B.reshape(-1)], -1)  # MLP weight order: weight, then bias
    logp = Bernoulli().log_prob(model.f(x, wb), y.double()).sum(-1) + torch.distributions.Normal(0, 2.0).log_prob(
        wb
    ).sum(-1)
    post = torch.softmax(logp, 0)
    exact = (post[:, None] * wb).sum(0)
    mc = run_nuts(model, x, y, num_samples=600, warmup_steps=300, seed=0, progress=False)
    assert mc.run_info.compiled_potential and mc.run_info.compiled_tree
    draws = mc.get_samples()["w"]
    se = draws.std(0) / math.sqrt(600 / 4)  # a conservative effective sample size
    assert torch.all((draws.mean(0) - exact).abs() < 4 * se), (draws.mean(0), exact)
