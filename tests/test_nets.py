import re
from pathlib import Path

import pytest
import torch
from torch import nn

import pyro_bnnlv as pb
from pyro_bnnlv._mlp_kernels import ACTIVATION_TABLE
from pyro_bnnlv import _compiled as compiled
from pyro_bnnlv.models.potential import mlp_regression_potential
from pyro_bnnlv.nets import ACTIVATIONS, MLP, ModuleNet


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_batched_forward_equals_loop_over_samples(activation):
    net = MLP(3, [7, 5], 2, activation=activation)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(11, 3, generator=g)
    w = torch.randn(4, net.num_weights, generator=g)
    batched = net(x, w)
    assert batched.shape == (4, 11, 2)
    for s in range(4):
        torch.testing.assert_close(batched[s], net(x, w[s]))


@pytest.mark.parametrize("batched_x", [False, True])
@pytest.mark.parametrize("net", [MLP(2, [50], 1, activation="leaky_relu"), MLP(3, [7, 5], 2)], ids=["lv", "deep"])
def test_forward_in_blocks_gives_the_forward_bit_for_bit(net, batched_x):
    # blocks of 3 weight samples (the last one of 2) give exactly the values of one batched forward
    g = torch.Generator().manual_seed(3)
    S, N = 11, 4
    x = torch.randn(S, N, net.in_features, generator=g) if batched_x else torch.randn(N, net.in_features, generator=g)
    w = torch.randn(S, net.num_weights, generator=g)
    assert net.values_per_point() == max(net.in_features, *net.hidden_sizes, net.out_features)
    blocked = net.forward_in_blocks(x, w, max_values=3 * N * net.values_per_point())
    assert torch.equal(blocked, net(x, w))
    assert torch.equal(net.forward_in_blocks(x, w, max_values=1), net(x, w))  # one sample per block


def test_forward_matches_torch_sequential_with_same_weights():
    net = MLP(3, [6], 2, activation="tanh")
    seq = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 2))
    w = torch.cat([p.detach().reshape(-1) for p in seq.parameters()])
    x = torch.randn(9, 3)
    torch.testing.assert_close(net(x, w), seq(x))
    (W0, b0), (W1, b1) = net.unflatten(w)
    torch.testing.assert_close(W0, seq[0].weight)
    torch.testing.assert_close(b1, seq[2].bias)


def test_activations_are_the_papers_choices():
    a = torch.linspace(-3, 3, 13)
    torch.testing.assert_close(ACTIVATIONS["rbf"](a), torch.exp(-(a**2)))
    torch.testing.assert_close(ACTIVATIONS["leaky_relu"](a), torch.where(a > 0, a, 0.01 * a))


def test_batched_inputs_and_nested_batch_dims():
    net = MLP(2, [4], 1)
    w = torch.randn(3, 5, net.num_weights)
    x = torch.randn(3, 5, 8, 2)  # a different input per weight sample
    out = net(x, w)
    assert out.shape == (3, 5, 8, 1)
    torch.testing.assert_close(out[2, 1], net(x[2, 1], w[2, 1]))


def test_num_weights_and_init_weights():
    net = MLP(1, [50], 1)
    assert net.num_weights == 50 + 50 + 50 + 1
    w1 = net.init_weights(torch.Generator().manual_seed(3))
    w2 = net.init_weights(torch.Generator().manual_seed(3))
    torch.testing.assert_close(w1, w2)
    assert w1.abs().max() <= 1.0  # fan-in 1 -> U(-1, 1); fan-in 50 -> U(-0.14, 0.14)
    assert w1[100:150].abs().max() <= 1 / 50**0.5


def test_module_adapter_matches_module_output():
    module = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    adapter = ModuleNet(module, 3, 2)
    w0 = adapter.init_weights()
    x = torch.randn(10, 3)
    torch.testing.assert_close(adapter(x, w0), module(x))
    w = w0 + 0.1 * torch.randn(5, adapter.num_weights)
    out = adapter(x, w)
    assert out.shape == (5, 10, 2)
    for s in range(5):
        torch.testing.assert_close(out[s], adapter(x, w[s]))


def test_bad_configuration_and_inputs_raise():
    with pytest.raises(ValueError, match="activation"):
        MLP(1, [5], 1, activation="swish")
    with pytest.raises(ValueError, match="positive"):
        MLP(1, [0], 1)
    net = MLP(2, [5], 1)
    with pytest.raises(ValueError, match="num_weights"):
        net(torch.zeros(3, 2), torch.zeros(net.num_weights + 1))
    with pytest.raises(ValueError, match="in_features=2"):
        net.check_input(torch.zeros(3, 4))


def test_mlp_hidden_activations_compose_to_forward():
    net = MLP(2, [4, 3], 2, activation="tanh")
    w = net.init_weights(torch.Generator().manual_seed(0)).expand(5, -1)  # (S, P)
    x = torch.randn(7, 2)
    assert torch.equal(net.hidden(x, w, 0), x)
    z1 = net.hidden(x, w, 1)
    assert z1.shape == (5, 7, 4) and (z1.abs() < 1).all()
    W, b = net.unflatten(w)[-1]
    last = torch.matmul(net.hidden(x, w, 2), W.transpose(-1, -2)) + b.unsqueeze(-2)
    torch.testing.assert_close(last, net(x, w), rtol=0, atol=0)
    with pytest.raises(ValueError, match="num_layers must lie in"):
        net.hidden(x, w, 3)


# ---------------------------------------------------------------------------------------------
# the activation table (pyro_bnnlv._mlp_kernels): every row consistent with itself, MLP and C++
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ACTIVATION_TABLE))
def test_activation_row_derivative_matches_autograd(name):
    row = ACTIVATION_TABLE[name]
    assert row.name == name and ACTIVATIONS[name] is row.value
    g = torch.Generator().manual_seed(3)
    a = (2 * torch.randn(40, 7, generator=g, dtype=torch.float64)).requires_grad_(True)
    dh = torch.randn(40, 7, generator=g, dtype=torch.float64)
    h = row.value(a)
    (auto,) = torch.autograd.grad(h, a, dh)
    (auto1,) = torch.autograd.grad(row.value(a).sum(), a)
    with torch.no_grad():
        a0, h0 = a.detach().clone(), h.detach().clone()
        hand = row.backward(dh, a0, h0)
        torch.testing.assert_close(hand, auto, rtol=1e-12, atol=1e-12)
        assert torch.equal(a0, a.detach()) and torch.equal(h0, h.detach())  # arguments untouched
        value, deriv = row.value_and_derivative(a0)
        torch.testing.assert_close(deriv, auto1, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(value, h0)


@pytest.mark.parametrize("name", sorted(ACTIVATION_TABLE))
def test_activation_row_forward_is_mlp_forward(name):
    """nets.MLP runs the table's value after every hidden layer (the layer loop written out here)."""
    net = MLP(3, [6, 4], 2, activation=name)
    assert net.activation_row is ACTIVATION_TABLE[name]
    g = torch.Generator().manual_seed(4)
    x = torch.randn(9, 3, generator=g, dtype=torch.float64)
    w = torch.randn(net.num_weights, generator=g, dtype=torch.float64)
    h = x
    for i, (W, b) in enumerate(net.unflatten(w)):
        h = h @ W.T + b
        if i < len(net.layers) - 1:
            h = ACTIVATION_TABLE[name].value(h)
    torch.testing.assert_close(net(x, w), h, rtol=1e-12, atol=1e-12)


def test_activation_table_codes_are_the_cpp_enum():
    """Each row's (cpp_name, code) is an entry of ``enum Activation`` in the C++ core, which has
    a ``case`` for it in both the forward and the backward ``switch``."""
    src = (Path(pb.__file__).parent / "infer" / "mcmc" / "_flat_nuts.cpp").read_text()
    enum = re.search(r"enum Activation \{([^}]*)\}", src).group(1)
    entries = dict((k.strip(), int(v)) for k, v in (e.split("=") for e in enum.split(",")))
    assert entries == {r.cpp_name: r.code for r in ACTIVATION_TABLE.values()}
    for row in ACTIVATION_TABLE.values():
        assert len(re.findall(rf"case {row.cpp_name}\b", src)) == 2, row.cpp_name


@pytest.mark.parametrize("name", sorted(ACTIVATION_TABLE))
def test_activation_row_compiled_potential_matches_table(name):
    """The C++ code of each activation (forward and backward, via the compiled NUTS potential)
    against the Python potential built on the table's value and backward, float64 to 1e-10."""
    if compiled.nuts_extension() is None:
        pytest.skip("no C++ toolchain")
    g = torch.Generator().manual_seed(5)
    net = MLP(2, [5, 4], 1, activation=name)
    x = torch.randn(17, 2, generator=g, dtype=torch.float64)
    y = torch.randn(17, generator=g, dtype=torch.float64)
    python = mlp_regression_potential(net, x, y, noise_scale=0.3, compiled=False)
    fast = mlp_regression_potential(net, x, y, noise_scale=0.3, compiled=True)
    for _ in range(3):
        q = torch.randn(python.dim, generator=g, dtype=torch.float64)
        (u_py, g_py), (u_c, g_c) = python(q), fast(q)
        assert float(u_c) == pytest.approx(float(u_py), rel=1e-10)
        torch.testing.assert_close(g_c, g_py, rtol=1e-10, atol=1e-10 * float(g_py.abs().max()))


def test_unflatten_splits_once_and_matches_slicing_bitwise():
    """unflatten uses one torch.split when the slices tile w (every MLP); values and gradients are
    bitwise those of one slice per piece, and the backward concatenates instead of zero-filling a
    full-size gradient per piece."""
    from pyro_bnnlv._mlp_kernels import _tiling, unflatten

    net = MLP(4, [6, 5], 2, activation="tanh")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 4, generator=g)
    sliced = lambda w: [(w[..., ws].reshape(*w.shape[:-1], fo, fi), w[..., bs]) for fi, fo, ws, bs in net.layers]
    grads = []
    for fn in (sliced, lambda w: unflatten(net.layers, w)):
        w = torch.randn(3, net.num_weights, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
        params = fn(w)
        h = x
        for i, (W, b) in enumerate(params):
            h = torch.matmul(h, W.transpose(-1, -2)) + b.unsqueeze(-2)
            h = torch.tanh(h) if i < len(params) - 1 else h
        h.pow(2).sum().backward()
        grads.append((h.detach(), w.grad))
        if fn is not sliced:
            for W, b in params:  # every piece straight from the one split (a reshape for W)
                assert type(b.grad_fn).__name__.startswith("Split")
                assert type(W.grad_fn.next_functions[0][0]).__name__.startswith("Split")
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    sizes = [fo * fi if k == 0 else fo for fi, fo, _, _ in net.layers for k in (0, 1)]
    assert _tiling(net.layers) == sizes
    shuffled = list(reversed(net.layers))  # out of order: one view per piece
    assert _tiling(shuffled) is None
    with pytest.raises(RuntimeError, match="split"):  # a w of another length is refused
        unflatten(net.layers, torch.randn(net.num_weights + 3))
    w = torch.randn(net.num_weights, generator=g)
    for (W, b), (fi, fo, ws, bs) in zip(unflatten(shuffled, w), shuffled):
        assert torch.equal(W, w[ws].reshape(fo, fi)) and torch.equal(b, w[bs])


def test_unflatten_traces_without_a_tracer_warning_and_matches_eager_elsewhere():
    """The split's sizes come from the layers, not from ``w``'s (traced) shape: tracing the
    forward pass raises no TracerWarning, and the trace agrees with eager code at another point."""
    import warnings

    net = MLP(3, [5], 2, activation="relu")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, 3, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        traced = torch.jit.trace(lambda w: net(x, w), (torch.randn(4, net.num_weights, generator=g),))
    w2 = torch.randn(4, net.num_weights, generator=g) * 3
    torch.testing.assert_close(traced(w2), net(x, w2), rtol=0, atol=0)


@pytest.mark.parametrize(
    "h_shape, W_shape",
    [
        ((9, 3), (5, 3)),
        ((4, 9, 3), (4, 5, 3)),
        ((9, 3), (4, 5, 3)),
        ((1, 9, 3), (4, 5, 3)),
        ((2, 4, 9, 3), (2, 4, 5, 3)),
    ],
)
def test_affine_matches_broadcast_matmul_plus_bias_in_value_and_gradient(h_shape, W_shape):
    """Every branch of ``affine`` (``addmm``, ``baddbmm``, the broadcasting fallback) is ``h W^T + b``."""
    from pyro_bnnlv._mlp_kernels import affine

    g = torch.Generator().manual_seed(3)
    h = torch.randn(h_shape, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(W_shape, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(W_shape[:-1], generator=g, dtype=torch.float64, requires_grad=True)
    out = affine(h, W, b)
    ref = torch.matmul(h, W.transpose(-1, -2)) + b.unsqueeze(-2)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(out.sin().sum(), (h, W, b))
    ref_grads = torch.autograd.grad(ref.sin().sum(), (h, W, b))
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
