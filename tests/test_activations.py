"""SiLU, GELU and softplus (issue 40, item 6): the table rows against torch's modules, the MLP kernels
and Jacobian against autograd, the compiled NUTS potentials against the Python ones, and run_nuts
on the compiled path."""

import math
import warnings

import pytest
import torch
from torch import nn

import pyro_bnnlv as pb
from pyro_bnnlv import _compiled as compiled
from pyro_bnnlv._mlp_kernels import ACTIVATION_TABLE, SOFTPLUS_THRESHOLD, mlp_jacobian, mlp_squared_error_kernel
from pyro_bnnlv.infer.mcmc import mlp_classification_potential, mlp_regression_potential, run_nuts

NEW = ["silu", "gelu", "softplus"]
MODULES = {"silu": nn.SiLU(), "gelu": nn.GELU(), "softplus": nn.Softplus()}
needs_core = pytest.mark.skipif(compiled.nuts_extension() is None, reason="no C++ toolchain")


def _points() -> torch.Tensor:
    """Pre-activations over [-60, 60] in float64: a grid, the softplus threshold and its
    neighbours (20 itself takes torch's log1p branch), random points and zeros."""
    t = SOFTPLUS_THRESHOLD
    edge = [t - 1e-9, t, t + 1e-12, t + 1e-9, -t, 0.0, -0.0, 1e-300, -1e-300, 37.0, -37.0, 709.0, -745.0]
    g = torch.Generator().manual_seed(0)
    return torch.cat(
        [
            torch.linspace(-60, 60, 2401, dtype=torch.float64),
            torch.tensor(edge, dtype=torch.float64),
            3 * torch.randn(500, generator=g, dtype=torch.float64),
        ]
    )


@pytest.mark.parametrize("name", NEW)
def test_value_and_derivative_match_torch_modules(name):
    """The value is torch's module's, bitwise; the hand-written derivative is autograd's through the
    module (torch's own backward formula) to 1e-14 relative (1e-15 absolute, near silu's and
    gelu's zero of the derivative), at every point including |a| up to 745 and both sides of
    softplus's threshold."""
    row, module = ACTIVATION_TABLE[name], MODULES[name]
    a = _points().requires_grad_(True)
    h_ref = module(a)
    dh = torch.linspace(-2, 3, a.numel(), dtype=torch.float64)
    (auto,) = torch.autograd.grad(h_ref, a, dh)
    a0 = a.detach()
    assert torch.equal(row.value(a0), h_ref.detach())
    hand = row.backward(dh, a0, h_ref.detach())
    torch.testing.assert_close(hand, auto, rtol=1e-14, atol=1e-15)
    _, deriv = row.value_and_derivative(a0)
    (auto1,) = torch.autograd.grad(module(a).sum(), a)
    torch.testing.assert_close(deriv, auto1, rtol=1e-14, atol=1e-15)


def test_derivatives_are_the_documented_formulas():
    """silu' = s(a)(1 + a(1 - s(a))), gelu' = Phi(a) + a phi(a), softplus' = sigmoid(a) (1 above
    the threshold), written out with math.erf / math.exp at scalar points (large |a| included)."""
    sig = lambda a: 1 / (1 + math.exp(-a)) if a >= 0 else math.exp(a) / (1 + math.exp(a))
    Phi = lambda a: 0.5 * (1 + math.erf(a / math.sqrt(2)))
    phi = lambda a: math.exp(-a * a / 2) / math.sqrt(2 * math.pi)
    ref = {
        "silu": lambda a: sig(a) * (1 + a * (1 - sig(a))),
        "gelu": lambda a: Phi(a) + a * phi(a),
        "softplus": lambda a: 1.0 if a > 20 else sig(a),
    }
    pts = [-40.0, -20.5, -3.0, -1.0, -0.1, 0.0, 0.3, 1.7, 5.0, 19.5, 20.0, 20.5, 40.0]
    for name in NEW:
        _, d = ACTIVATION_TABLE[name].value_and_derivative(torch.tensor(pts, dtype=torch.float64))
        for a, got in zip(pts, d.tolist()):
            assert got == pytest.approx(ref[name](a), rel=1e-13, abs=1e-300), (name, a)


@pytest.mark.parametrize("name", NEW)
def test_mlp_kernel_and_jacobian_match_autograd(name):
    """The squared-error kernel's hand-written weight gradient and delta_0, and mlp_jacobian,
    against autograd / torch.func through pb.MLP and through the same nn.Sequential, float64,
    with weights large enough for pre-activations beyond softplus's threshold."""
    g = torch.Generator().manual_seed(1)
    net = pb.MLP(3, [6, 5], 2, activation=name)
    x = 4 * torch.randn(31, 3, generator=g, dtype=torch.float64)
    y = torch.randn(31, 2, generator=g, dtype=torch.float64)
    w = 2 * torch.randn(net.num_weights, generator=g, dtype=torch.float64)
    seq = nn.Sequential(nn.Linear(3, 6), MODULES[name], nn.Linear(6, 5), MODULES[name], nn.Linear(5, 2)).double()
    torch.nn.utils.vector_to_parameters(w, seq.parameters())  # nn.Linear's layout is MLP's
    with torch.no_grad():
        assert torch.equal(net(x, w), seq(x))
    a0 = torch.nn.functional.linear(x, *net.unflatten(w)[0])
    assert float(a0.abs().max()) > SOFTPLUS_THRESHOLD  # both softplus branches are exercised

    buf, gbuf, run = mlp_squared_error_kernel(net.layers, net.activation_row, x.clone(), y)
    buf.copy_(w)
    sse, delta0 = run()
    wr = w.clone().requires_grad_(True)
    ref = (net(x, wr) - y).square().sum()
    (g_ref,) = torch.autograd.grad(ref, wr)
    assert sse == pytest.approx(float(ref.detach()), rel=1e-13)
    torch.testing.assert_close(2 * gbuf, g_ref, rtol=1e-12, atol=1e-12 * float(g_ref.abs().max()))
    a0r = a0.clone().requires_grad_(True)
    rest = pb.MLP(6, [5], 2, activation=name)
    out = rest(ACTIVATION_TABLE[name].value(a0r), w[net.layers[1][2].start :])
    (d0,) = torch.autograd.grad((out - y).square().sum(), a0r)
    torch.testing.assert_close(2 * delta0, d0, rtol=1e-12, atol=1e-12 * float(d0.abs().max()))

    J, f = mlp_jacobian(net.layers, net.activation_row, x, w)
    J_func = torch.func.jacrev(lambda v: net(x, v))(w)
    torch.testing.assert_close(f, net(x, w), rtol=0, atol=0)
    torch.testing.assert_close(J, J_func, rtol=1e-12, atol=1e-12)
    J_last, _ = mlp_jacobian(net.layers, net.activation_row, x, w, first=1)
    torch.testing.assert_close(J_last, J_func[..., net.layers[1][2].start :], rtol=1e-12, atol=1e-12)


@needs_core
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", NEW)
def test_compiled_potentials_match_python(name, dtype):
    """The C++ MLPPotential (regression, with latent inputs, and categorical) against the Python
    potential, value and gradient, at small and large weights (pre-activations past 20)."""
    g = torch.Generator().manual_seed(2)
    rtol = 1e-12 if dtype == torch.float64 else 2e-5
    x = 3 * torch.randn(37, 2, generator=g, dtype=dtype)  # 37 points: padded to 40
    y = torch.randn(37, generator=g, dtype=dtype)
    labels = torch.randint(0, 3, (37,), generator=g)
    cases = [
        (
            pb.MLP(3, [7, 5], 1, activation=name),
            lambda net, c: mlp_regression_potential(
                net, x, y, prior_scale=0.9, noise_scale=0.3, latent_dim=1, compiled=c
            ),
        ),
        (
            pb.MLP(2, [6, 4], 3, activation=name),
            lambda net, c: mlp_classification_potential(
                net, x, labels, prior_loc=0.1, prior_scale=1.1, likelihood="categorical", compiled=c
            ),
        ),
    ]
    for net, build in cases:
        python, fast = build(net, False), build(net, True)
        assert python.compiled is None and fast.compiled is not None
        for scale in (0.3, 1.0, 4.0):
            q = scale * torch.randn(python.dim, generator=g, dtype=dtype)
            (u_py, g_py), (u_c, g_c) = python(q), fast(q)
            assert math.isfinite(float(u_c))
            assert float(u_c) == pytest.approx(float(u_py), rel=rtol)
            torch.testing.assert_close(g_c, g_py, rtol=0, atol=rtol * 10 * float(g_py.abs().max()))


@needs_core
def test_run_nuts_on_a_silu_mlp_takes_the_compiled_path():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 2, generator=g)
    y = torch.sin(x[:, 0]) + 0.1 * torch.randn(40, generator=g)
    model = pb.BNN(pb.MLP(2, [8], 1, activation="silu"), prior_scale=1.0, noise_scale=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mcmc = run_nuts(model, x, y, num_samples=20, warmup_steps=20, seed=0, progress=False, map_steps=50)
    info = mcmc.run_info
    assert info.path == "fast/flat" and info.compiled_tree and info.compiled_potential
    assert mcmc.get_samples()["w"].shape == (20, model.num_weights)


# ---------------------------------------------------------------------------------------------
# a ModuleNet that is an MLP (pb.nets.equivalent_mlp) and run_nuts on it
# ---------------------------------------------------------------------------------------------
_EQUIVALENT = [
    (nn.Tanh(), "tanh"),
    (nn.ReLU(inplace=True), "relu"),
    (nn.LeakyReLU(), "leaky_relu"),
    (nn.Sigmoid(), "sigmoid"),
    (nn.SiLU(), "silu"),
    (nn.GELU(), "gelu"),
    (nn.Softplus(), "softplus"),
    (nn.Identity(), "identity"),
]


@pytest.mark.parametrize("act,name", _EQUIVALENT, ids=[n for _, n in _EQUIVALENT])
def test_equivalent_mlp_computes_the_module_on_the_same_weights(act, name):
    seq = nn.Sequential(nn.Linear(4, 6), act, nn.Linear(6, 5), act, nn.Linear(5, 2)).double()
    net = pb.ModuleNet(seq, 4, 2)
    mlp = pb.nets.equivalent_mlp(net)
    assert mlp is not None and mlp.config() == dict(in_features=4, hidden_sizes=[6, 5], out_features=2, activation=name)
    assert pb.nets.equivalent_mlp(seq).config() == mlp.config()
    assert pb.nets.mlp_call(mlp) == f'pb.MLP(4, [6, 5], 2, activation="{name}")'
    assert torch.equal(mlp.bias_mask(), net.bias_mask()) and torch.equal(mlp.layer_fan_in(), net.layer_fan_in())
    g = torch.Generator().manual_seed(4)
    x = 5 * torch.randn(23, 4, generator=g, dtype=torch.float64)  # pre-activations past softplus's 20
    for w in (net.init_weights(), 3 * torch.randn(3, net.num_weights, generator=g, dtype=torch.float64)):
        torch.testing.assert_close(mlp(x, w), net(x, w), rtol=1e-13, atol=1e-13)


def test_equivalent_mlp_refuses_what_is_not_an_mlp():
    class MyLinear(nn.Linear):
        pass

    lin = lambda i, o, **kw: nn.Linear(i, o, **kw)
    hooked = nn.Sequential(lin(2, 3), nn.Tanh(), lin(3, 1))
    hooked[1].register_forward_hook(lambda mod, inp, out: 2 * out)
    cases = {
        "not an nn.Sequential": nn.ModuleList([lin(2, 1)]),
        "without bias": nn.Sequential(lin(2, 3, bias=False), nn.Tanh(), lin(3, 1)),
        "tanh GELU": nn.Sequential(lin(2, 3), nn.GELU(approximate="tanh"), lin(3, 1)),
        "slope": nn.Sequential(lin(2, 3), nn.LeakyReLU(0.2), lin(3, 1)),
        "beta": nn.Sequential(lin(2, 3), nn.Softplus(beta=2), lin(3, 1)),
        "threshold": nn.Sequential(lin(2, 3), nn.Softplus(threshold=10), lin(3, 1)),
        "mixed": nn.Sequential(lin(2, 3), nn.Tanh(), lin(3, 3), nn.ReLU(), lin(3, 1)),
        "ELU": nn.Sequential(lin(2, 3), nn.ELU(), lin(3, 1)),
        "norm": nn.Sequential(lin(2, 3), nn.LayerNorm(3), lin(3, 1)),
        "two linear": nn.Sequential(lin(2, 3), lin(3, 1)),
        "two activations": nn.Sequential(lin(2, 3), nn.Tanh(), nn.Tanh(), lin(3, 1)),
        "output activation": nn.Sequential(lin(2, 3), nn.Tanh(), lin(3, 1), nn.Sigmoid()),
        "subclass": nn.Sequential(MyLinear(2, 3), nn.Tanh(), lin(3, 1)),
        "nested": nn.Sequential(nn.Sequential(lin(2, 3), nn.Tanh()), lin(3, 1)),
        "hook": hooked,
        "parametrization": nn.Sequential(torch.nn.utils.parametrizations.weight_norm(lin(2, 3)), nn.Tanh(), lin(3, 1)),
    }
    for what, module in cases.items():
        mlp, reason = pb.nets.mlp_mismatch(module)
        assert mlp is None and reason, what
        assert pb.nets.equivalent_mlp(module) is None, what
    ok = nn.Sequential(lin(2, 3), nn.Tanh(), lin(3, 1))
    assert pb.nets.equivalent_mlp(pb.ModuleNet(ok, 2, 1)) is not None
    assert pb.nets.equivalent_mlp(pb.ModuleNet(nn.Sequential(lin(2, 3)), 2, 3)).hidden_sizes == ()
    # a ModuleNet whose declared widths are not the module's
    assert pb.nets.equivalent_mlp(pb.ModuleNet(nn.Sequential(lin(2, 3)), 2, 1)) is None


@needs_core
def test_run_nuts_on_an_mlp_module_net_uses_the_mlp_potential_and_says_so(monkeypatch, capsys):
    """A ModuleNet of nn.Linear and nn.SiLU gets the compiled potential of its equivalent MLP: the
    same draws as run_nuts on that MLP from the same start and seed, and one line on stderr naming
    it; a module with no equivalent warns once (UserWarning) naming why."""
    from pyro_bnnlv.models import potential as potential_module

    monkeypatch.setattr(potential_module, "_SAID", set())
    g = torch.Generator().manual_seed(5)
    x = torch.randn(30, 2, generator=g)
    y = torch.sin(x[:, 0]) + 0.1 * torch.randn(30, generator=g)
    seq = nn.Sequential(nn.Linear(2, 6), nn.SiLU(), nn.Linear(6, 6), nn.SiLU(), nn.Linear(6, 1))
    w0 = 0.5 * torch.randn(pb.ModuleNet(seq, 2, 1).num_weights, generator=g)
    kw = dict(num_samples=10, warmup_steps=10, seed=1, progress=False, init={"w": w0})
    runs = []
    for net in (pb.ModuleNet(seq, 2, 1), pb.MLP(2, [6, 6], 1, activation="silu")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            runs.append(run_nuts(pb.BNN(net, prior_scale=1.0, noise_scale=0.2), x, y, **kw))
    assert runs[0].run_info.compiled_potential and runs[0].run_info.path == "fast/flat"
    assert torch.equal(runs[0].get_samples()["w"], runs[1].get_samples()["w"])
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "this ModuleNet is" in line]
    assert said == [
        'pyro_bnnlv: NUTS: this ModuleNet is pb.MLP(2, [6, 6], 1, activation="silu") on the same '
        "weight vector: NUTS uses that MLP's compiled potential (10-30x faster than autograd "
        "through the module)"
    ]
    elu = pb.BNN(pb.ModuleNet(nn.Sequential(nn.Linear(2, 4), nn.ELU(), nn.Linear(4, 1)), 2, 1), noise_scale=0.2)
    with pytest.warns(UserWarning, match=r"no compiled potential \(layer 1 \(ELU\(alpha=1.0\)\) is not an activation"):
        m = run_nuts(elu, x, y, num_samples=3, warmup_steps=3, seed=0, progress=False, map_steps=5)
    assert not m.run_info.compiled_potential
    with warnings.catch_warnings():  # once per process
        warnings.simplefilter("error")
        run_nuts(elu, x, y, num_samples=3, warmup_steps=3, seed=0, progress=False, map_steps=5)
