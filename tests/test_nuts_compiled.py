"""The compiled NUTS core (C++) against its Python twin: same potential, same draws, same errors."""

import warnings

import pytest
import torch

import pyro_bnnlv as pb
from pyro_bnnlv.infer import compiled
from pyro_bnnlv.infer.nuts import FlatNUTS, FlatPotential, mlp_regression_potential, run_nuts

from test_nuts import _check_exact, _draws, _linreg_data, _linreg_model, _tiny_bnn64

pytestmark = pytest.mark.skipif(compiled.extension() is None, reason="no C++ toolchain")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("latent_dim", [0, 2])
@pytest.mark.parametrize("activation", ["tanh", "relu", "leaky_relu", "sigmoid", "rbf", "identity"])
def test_compiled_potential_equals_python_potential(activation, latent_dim, dtype):
    g = torch.Generator().manual_seed(0)
    net = pb.MLP(1 + latent_dim, [7, 5], 2, activation=activation)
    x = torch.randn(13, 1, generator=g, dtype=dtype)
    y = torch.randn(13, 2, generator=g, dtype=dtype)
    kw = dict(prior_loc=0.3, prior_scale=torch.rand(net.num_weights, generator=g, dtype=dtype) + 0.5,
              noise_scale=0.2, latent_dim=latent_dim, latent_scale=torch.full((latent_dim,), 0.7))  # fmt: skip
    python = mlp_regression_potential(net, x, y, compiled=False, **kw)
    fast = mlp_regression_potential(net, x, y, compiled=True, **kw)
    assert python.compiled is None and fast.compiled is not None and fast.dim == python.dim
    rtol = 1e-12 if dtype == torch.float64 else 1e-5
    for _ in range(3):
        q = torch.randn(python.dim, generator=g, dtype=dtype)
        (u_py, g_py), (u_c, g_c) = python(q), fast(q)
        assert float(u_c) == pytest.approx(float(u_py), rel=rtol)
        assert g_c.dtype == dtype and g_c.shape == g_py.shape
        assert torch.allclose(g_c, g_py, rtol=0, atol=rtol * 10 * float(g_py.abs().max()))


def test_compiled_tree_reproduces_python_tree_draw_for_draw():
    """The C++ tree (with the compiled potential, or calling the Python one back) and the Python
    tree draw the same random numbers in the same order: identical chains up to rounding (the
    C++ leapfrog is not fused like torch's ``add(alpha=)``, ~1e-16 per step)."""
    model, x, y = _tiny_bnn64()
    kw = dict(prior_loc=model.prior_loc, prior_scale=model.prior_scale, noise_scale=model.noise_scale)
    pot_c = mlp_regression_potential(model.net, x, y, compiled=True, **kw)
    pot_py = mlp_regression_potential(model.net, x, y, compiled=False, **kw)
    w0 = model.net.init_weights(torch.Generator().manual_seed(1)).double()
    fixed = dict(step_size=0.01, adapt_step_size=False, adapt_mass_matrix=False)
    ref = _draws(FlatNUTS(pot_py, compiled=False, **fixed), w0, 30, 0)
    assert torch.allclose(_draws(FlatNUTS(pot_c, **fixed), w0, 30, 0), ref, atol=1e-10, rtol=0)
    assert torch.allclose(_draws(FlatNUTS(pot_py, compiled=True, **fixed), w0, 30, 0), ref, atol=1e-10, rtol=0)
    # with adaptation and a dense mass matrix (the tree's matrix-vector branch)
    for full_mass in (False, True):
        a = _draws(FlatNUTS(pot_c, max_tree_depth=6, full_mass=full_mass), w0, 3, 8)
        b = _draws(FlatNUTS(pot_py, compiled=False, max_tree_depth=6, full_mass=full_mass), w0, 3, 8)
        assert torch.allclose(a, b, atol=1e-7, rtol=0), (full_mass, (a - b).abs().max())


def test_compiled_tree_with_latent_inputs_matches_python_tree():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 1, generator=g, dtype=torch.float64)
    y = torch.randn(12, generator=g, dtype=torch.float64)
    net = pb.MLP(2, [5], 1)
    kw = dict(noise_scale=0.3, latent_dim=1, latent_scale=1.0)
    pot_c = mlp_regression_potential(net, x, y, compiled=True, **kw)
    pot_py = mlp_regression_potential(net, x, y, compiled=False, **kw)
    q0 = 0.3 * torch.randn(pot_py.dim, generator=g, dtype=torch.float64)
    init = pot_py.unpack(q0)
    fixed = dict(step_size=0.02, adapt_step_size=False, adapt_mass_matrix=False, max_tree_depth=5)

    def chain(pot, compiled_tree):
        torch.manual_seed(0)
        from pyro.infer import MCMC

        mcmc = MCMC(FlatNUTS(pot, compiled=compiled_tree, **fixed), num_samples=10, warmup_steps=0,
                    initial_params=dict(init), disable_progbar=True)  # fmt: skip
        mcmc.run()
        return mcmc.get_samples()

    a, b = chain(pot_c, True), chain(pot_py, False)
    for k in ("w", "z"):
        assert a[k].shape == b[k].shape
        assert torch.allclose(a[k], b[k], atol=1e-10, rtol=0)
    assert not torch.allclose(a["z"][0], a["z"][-1])  # the chain moved


def test_compiled_tree_rejects_a_bad_python_gradient():
    model, x, y = _tiny_bnn64()
    good = mlp_regression_potential(model.net, x, y, compiled=False, noise_scale=0.1)
    calls = []

    def wrong_after_setup(q):  # Pyro's setup evaluates the potential through autograd first
        calls.append(1)
        u, grad = good.value_and_grad(q)
        return u, (grad if len(calls) <= 1 else grad[:-1].clone())

    bad = FlatPotential(good.sites, wrong_after_setup)
    kernel = FlatNUTS(bad, step_size=0.01, adapt_step_size=False, adapt_mass_matrix=False)
    w0 = model.net.init_weights(torch.Generator().manual_seed(1)).double()
    with pytest.raises(RuntimeError, match="gradient must have the shape and dtype of q"):
        _draws(kernel, w0, 2, 0)


def test_disabled_or_unbuildable_core_falls_back_to_python(monkeypatch):
    x, y = _linreg_data()
    model = _linreg_model()
    monkeypatch.setenv("PYRO_BNNLV_COMPILED", "0")
    assert compiled.extension() is None
    pot = mlp_regression_potential(model.net, x, y, noise_scale=0.5, prior_scale=1.5)
    assert pot.compiled is None
    with pytest.raises(RuntimeError, match="compiled=True"):
        FlatNUTS(pot, compiled=True)
    with pytest.raises(RuntimeError, match="compiled=True"):
        mlp_regression_potential(model.net, x, y, compiled=True)
    mcmc = run_nuts(model, x, y, num_samples=600, warmup_steps=300, seed=0, progress=False, map_steps=200)
    assert not mcmc.run_info["compiled_tree"] and not mcmc.run_info["compiled_potential"]
    _check_exact(mcmc.get_samples()["w"], x, y)

    # a build that fails warns once, names the cause, and is not retried
    monkeypatch.delenv("PYRO_BNNLV_COMPILED")
    monkeypatch.setitem(compiled._state, "tried", False)
    monkeypatch.setitem(compiled._state, "module", None)

    def broken(*args, **kwargs):
        raise RuntimeError("Error building extension\nfoo.cpp:1: error: no compiler here")

    monkeypatch.setattr("torch.utils.cpp_extension.load", broken)
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        assert compiled.extension() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compiled.extension() is None


def test_run_nuts_reports_the_compiled_path():
    x, y = _linreg_data()
    mcmc = run_nuts(_linreg_model(), x, y, num_samples=5, warmup_steps=5, seed=0, progress=False, map_steps=20)
    assert mcmc.run_info["compiled_tree"] and mcmc.run_info["compiled_potential"]
