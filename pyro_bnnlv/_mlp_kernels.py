r"""Ground layer: the MLP kernels, written once, and the one activation table they share.

An MLP on a flat weight vector is described by its ``layers``, ``[(fan_in, fan_out, weight slice,
bias slice)]`` (:attr:`pyro_bnnlv.nets.MLP.layers`: per layer the weight matrix
``(fan_out, fan_in)`` row-major, then the bias), and an :class:`Activation` row of
:data:`ACTIVATION_TABLE` applied after every layer but the last. The kernels:

* :func:`unflatten` and :func:`mlp_hidden`: the batched forward pass (:class:`~pyro_bnnlv.nets.MLP`);
* :meth:`Activation.backward`: the hand-written ``dL/da`` of one layer, used by the NUTS potential
  (:func:`pyro_bnnlv.models.potential.mlp_regression_potential`) and by :func:`mlp_jacobian`;
* :func:`mlp_loss_kernel`: a loss of the outputs (its value and ``dL/df`` given by a head) and
  its hand-written gradient in the weights, on preallocated buffers; :func:`mlp_squared_error_kernel`
  is its sum of squared residuals (the NUTS potentials
  :func:`pyro_bnnlv.models.potential.mlp_regression_potential` and ``mlp_classification_potential``);
* :func:`mlp_jacobian`: ``J = df/dw`` by one batched backward sweep of the ``L`` one-hot output
  cotangents (:mod:`pyro_bnnlv.infer.laplace.linearized`);
* :func:`mlp_local_reparam_sample`: moment propagation of a mean-field Gaussian through the
  layers, sampling each pre-activation from its exact Gaussian (:mod:`pyro_bnnlv.infer.elbos.local_reparam`).

The compiled NUTS core (``infer/mcmc/_flat_nuts.cpp``) has its own forward and backward ``switch`` on
``enum Activation``; :attr:`Activation.code` is the row's value there.

Adding an activation: one row in :data:`ACTIVATION_TABLE` (name, value, ``backward`` from
``(dL/dh, a, h = value(a))``, the C++ enum name and code, a description); then, for the compiled
NUTS core, the entry in ``enum Activation`` and one ``case`` in each of the two ``switch (act_)``
of ``infer/mcmc/_flat_nuts.cpp`` (an activation whose derivative is not a cheap function of ``a``
and ``h``, like silu, gelu and softplus, writes ``act'(a)`` into the layer's ``S`` buffer in the
forward ``case`` and multiplies by it in the backward one). ``tests/test_nets.py`` checks every row: the derivative against
autograd, the forward against :class:`~pyro_bnnlv.nets.MLP`, the row's enum entry and two
``case`` lines in the C++ source, and the compiled potential against the Python one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "ACTIVATIONS",
    "ACTIVATION_TABLE",
    "SOFTPLUS_THRESHOLD",
    "Activation",
    "LayerSpec",
    "affine",
    "get_activation",
    "mlp_hidden",
    "mlp_jacobian",
    "mlp_local_reparam_sample",
    "mlp_loss_kernel",
    "mlp_squared_error_kernel",
    "unflatten",
]

LayerSpec = tuple[int, int, slice, slice]  # (fan_in, fan_out, weight slice, bias slice)


class Activation(NamedTuple):
    """One row of the activation table.

    Attributes:
        name: the ``activation=`` string of :class:`~pyro_bnnlv.nets.MLP`.
        value: ``a -> h = act(a)`` (elementwise, differentiable by autograd).
        backward: ``(dh, a, h) -> da = dh * act'(a)``, with ``h = value(a)``: the hand-written
            derivative (it may use whichever of ``a`` and ``h`` is cheaper; it may write into
            tensors it creates, never into its arguments).
        cpp_name, code: the entry ``cpp_name = code`` of ``enum Activation`` in ``_flat_nuts.cpp``.
        doc: what the activation is, for the docs and error messages.
    """

    name: str
    value: Callable[[Tensor], Tensor]
    backward: Callable[[Tensor, Tensor, Tensor], Tensor]
    cpp_name: str
    code: int
    doc: str

    def value_and_derivative(self, a: Tensor) -> tuple[Tensor, Tensor]:
        """``(act(a), act'(a))`` from the table's value and hand-written backward."""
        h = self.value(a)
        return h, self.backward(torch.ones_like(a), a, h)


def _leaky_relu(a: Tensor) -> Tensor:
    return torch.nn.functional.leaky_relu(a, 0.01)


def _rbf(a: Tensor) -> Tensor:
    return torch.exp(-a.square())


def _identity(a: Tensor) -> Tensor:
    return a


#: softplus's threshold: above it torch returns ``a`` itself (``torch.nn.functional.softplus``'s
#: default ``beta = 1, threshold = 20``), so the derivative there is exactly 1
SOFTPLUS_THRESHOLD = 20.0
_SQRT1_2 = 0.7071067811865476  # 1 / sqrt(2)
_INV_SQRT_2PI = 0.3989422804014327  # 1 / sqrt(2 pi)


def _silu(a: Tensor) -> Tensor:
    r"""SiLU (swish) ``a sigma(a)``, ``torch.nn.functional.silu``."""
    return torch.nn.functional.silu(a)


def _silu_backward(dh: Tensor, a: Tensor, h: Tensor) -> Tensor:
    r"""``dh * silu'(a)`` with ``silu'(a) = sigma(a) (1 + a (1 - sigma(a)))`` (from
    ``d/da [a sigma(a)] = sigma(a) + a sigma(a)(1 - sigma(a))``)."""
    s = torch.sigmoid(a)
    return (1.0 - s).mul_(a).add_(1.0).mul_(s).mul_(dh)


def _gelu(a: Tensor) -> Tensor:
    r"""GELU, exact form ``a Phi(a)`` with ``Phi(a) = (1 + erf(a / sqrt 2)) / 2`` the standard
    normal CDF (``torch.nn.functional.gelu``, ``approximate="none"``)."""
    return torch.nn.functional.gelu(a)


def _gelu_backward(dh: Tensor, a: Tensor, h: Tensor) -> Tensor:
    r"""``dh * gelu'(a)`` with ``gelu'(a) = Phi(a) + a phi(a)``, ``phi(a) = exp(-a^2 / 2) / sqrt(2 pi)``
    the standard normal density (torch's ``gelu_backward``, operation for operation)."""
    cdf = torch.erf(a * _SQRT1_2).add_(1.0).mul_(0.5)
    pdf = torch.exp(a.square().mul_(-0.5)).mul_(_INV_SQRT_2PI)
    return pdf.mul_(a).add_(cdf).mul_(dh)


def _softplus(a: Tensor) -> Tensor:
    r"""Softplus ``log(1 + exp(a))``, and ``a`` itself where ``a > 20`` (``torch.nn.functional.softplus``
    with its defaults ``beta = 1``, ``threshold = 20``; the two differ there by ``log1p(exp(-a)) < 2.1e-9``)."""
    return torch.nn.functional.softplus(a)


def _softplus_backward(dh: Tensor, a: Tensor, h: Tensor) -> Tensor:
    r"""``dh * softplus'(a)`` with ``softplus'(a) = sigma(a) = exp(a) / (1 + exp(a))`` below the
    threshold and exactly 1 above it (``a > 20``, where the function is ``a``), as torch's
    ``softplus_backward``."""
    return torch.where(a > SOFTPLUS_THRESHOLD, dh, torch.sigmoid(a).mul_(dh))


# The backward formulas are the NUTS potential's hand-written ones, operation for operation (the
# compiled core's float64 values are tested against them to 1e-12).
ACTIVATION_TABLE: dict[str, Activation] = {
    row.name: row
    for row in [
        Activation("identity", _identity, lambda dh, a, h: dh, "IDENTITY", 0, "a"),
        Activation("tanh", torch.tanh, lambda dh, a, h: torch.addcmul(dh, dh, h * h, value=-1.0), "TANH", 1, "tanh(a)"),
        Activation("relu", torch.relu, lambda dh, a, h: torch.where(a > 0, dh, 0.0), "RELU", 2, "max(a, 0)"),
        Activation(
            "leaky_relu",
            _leaky_relu,
            lambda dh, a, h: torch.where(a > 0, dh, 0.01 * dh),
            "LEAKY_RELU",
            3,
            "LeakyReLU with slope 0.01 (Yacoby, Pan & Doshi-Velez 2022, arXiv:1911.00569, sec. 7)",
        ),
        Activation(
            "sigmoid",
            torch.sigmoid,
            lambda dh, a, h: torch.addcmul(dh * h, dh * h, h, value=-1.0),
            "SIGMOID",
            4,
            "1 / (1 + exp(-a))",
        ),
        # h = exp(-a^2), dh/da = -2 a h
        Activation(
            "rbf",
            _rbf,
            lambda dh, a, h: (a * h).mul_(dh).mul_(-2.0),
            "RBF",
            5,
            "exp(-a^2) (Pradier et al. 2018, arXiv:1811.07006, sec. 5)",
        ),
        Activation("silu", _silu, _silu_backward, "SILU", 6, "a sigmoid(a) (SiLU / swish, nn.SiLU)"),
        Activation(
            "gelu",
            _gelu,
            _gelu_backward,
            "GELU",
            7,
            "a Phi(a), Phi the standard normal CDF (exact GELU, nn.GELU(approximate='none'))",
        ),
        Activation(
            "softplus",
            _softplus,
            _softplus_backward,
            "SOFTPLUS",
            8,
            "log(1 + exp(a)), a above 20 (nn.Softplus(beta=1, threshold=20))",
        ),
    ]
}

#: ``{name: value}``: the activation functions by name (the table's value column).
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {k: r.value for k, r in ACTIVATION_TABLE.items()}


def get_activation(name: str) -> Activation:
    """The table row of ``name``; ``ValueError`` naming the choices otherwise."""
    try:
        return ACTIVATION_TABLE[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown activation {name!r}; expected one of {sorted(ACTIVATION_TABLE)}") from None


# -- forward -----------------------------------------------------------------------------------
def unflatten(layers: Sequence[LayerSpec], w: Tensor) -> list[tuple[Tensor, Tensor]]:
    """``w (*B, P)`` -> ``[(W_l (*B, fan_out, fan_in), b_l (*B, fan_out))]`` (views).

    One ``torch.split`` when the slices tile ``w`` in order (every :class:`~pyro_bnnlv.nets.MLP`):
    its backward concatenates the pieces' gradients, where one ``w[..., slice]`` per piece would
    allocate and zero-fill a ``(*B, P)`` gradient each (on Proj-BNN's stage 3, ``(20, 1, 15991)``
    decoder draws, those fills were 45% of a step). The values and gradients are the same, bit for bit
    up to the sign of a zero gradient entry (slicing's zero-filled buffers turn -0.0 into +0.0)."""
    batch = w.shape[:-1]
    sizes = _tiling(layers)
    if sizes is None:  # slices that do not tile w in order: one view each
        return [(w[..., w_sl].reshape(*batch, fan_out, fan_in), w[..., b_sl]) for fan_in, fan_out, w_sl, b_sl in layers]
    pieces = torch.split(w, sizes, dim=-1)
    return [
        (pieces[2 * i].reshape(*batch, fan_out, fan_in), pieces[2 * i + 1])
        for i, (fan_in, fan_out, _, _) in enumerate(layers)
    ]


def _tiling(layers: Sequence[LayerSpec]) -> list[int] | None:
    """The piece sizes when the layers' (weight, bias) slices tile ``[0, P)`` in order from 0,
    else ``None``. From the layers alone, not ``w``'s shape: under ``torch.jit.trace`` a shape is
    a traced value, and comparing it would freeze a branch into the trace (a ``w`` of another
    length makes ``torch.split`` raise: sizes must sum to ``w.shape[-1]``)."""
    sizes, at = [], 0
    for _, _, w_sl, b_sl in layers:
        for sl in (w_sl, b_sl):
            if sl.start != at or sl.step not in (None, 1) or sl.stop < at:
                return None
            sizes.append(sl.stop - at)
            at = sl.stop
    return sizes


def affine(h: Tensor, W: Tensor, b: Tensor) -> Tensor:
    """``h W^T + b``, batched: ``(.., N, fan_in) @ (.., fan_in, fan_out) + (.., 1, fan_out)``.

    One fused call where the shapes allow it (``addmm`` for one weight matrix and 2-D ``h``,
    ``baddbmm`` for a 3-D ``h`` with one weight matrix per row of the batch, as a BNN+LV's
    predictive has), the broadcasting ``matmul`` and a separate bias add otherwise and under
    ``torch.jit.trace`` (the batch sizes compared here would be frozen into a trace)."""
    if not torch.jit.is_tracing():
        if h.dim() == 2 and W.dim() == 2:
            return torch.addmm(b, h, W.t())
        if h.dim() == 3 and W.dim() == 3 and h.shape[0] == W.shape[0]:
            return torch.baddbmm(b.unsqueeze(-2), h, W.transpose(-1, -2))
    return torch.matmul(h, W.transpose(-1, -2)) + b.unsqueeze(-2)


def mlp_hidden(h: Tensor, params: Sequence[tuple[Tensor, Tensor]], act: Activation) -> Tensor:
    """``h`` through the layers ``params`` (each :func:`affine`, then ``act``), batched."""
    for W, b in params:
        h = act.value(affine(h, W, b))
    return h


# -- a loss of the outputs with a hand-written backward (the NUTS potentials) ------------------
def mlp_loss_kernel(
    layers: Sequence[LayerSpec], act: Activation, xin: Tensor, head: Callable[[Tensor], tuple[float, Tensor]]
) -> tuple[Tensor, Tensor, Callable[[], tuple[float, Tensor]]]:
    r"""Forward and hand-written backward of ``E(w) = head(f(xin; w))`` on buffers.

    ``head(f)`` takes the outputs ``f (N, L)`` (a buffer of the kernel: it may be overwritten)
    and returns ``(E, delta)`` with ``delta (N, L)`` proportional to ``dE/df``: ``c dE/df`` for
    one constant ``c`` of the head (the squared error returns the residual, ``c = 1/2``; the
    cross-entropies ``c = 1``). Returns ``(buf, gbuf, run)``: write the weights into ``buf (P,)``
    (``xin (N, D)`` may be changed in place too), then ``run()`` returns ``(E, delta_0)`` and
    leaves ``c dE/dw`` in ``gbuf (P,)``, with ``delta_0 (N, fan_out_0) = c dE/da_0`` the
    derivative with respect to the first layer's pre-activation (for gradients with respect to
    inputs). Backward, layer ``l`` from the last: ``dE/dW_l = delta_l^T h_l``, ``dE/db_l =
    sum_n delta_l``, ``delta_{l-1} = act.backward(delta_l W_l, a_{l-1}, h_l)``. Every operation
    works on views of the buffers, with no autograd graph (about twenty tensor operations for one
    hidden layer). tanh is evaluated as ``2 sigmoid(2a) - 1`` with the factor 2 folded into the
    affine map (faster on the CPU: docs/design-notes.md, '_mlp_kernels'); the absolute error is at
    the float epsilon (the compiled core does the same).
    """
    dtype = xin.dtype
    P = max(b_sl.stop for *_, b_sl in layers)
    fast_tanh = act.name == "tanh"  # its backward reads only h, so the pre-activation is not kept
    neg_one = torch.full((1, 1), -1.0, dtype=dtype)
    value, backward = act.value, act.backward
    buf = torch.zeros(P, dtype=dtype)  # current weights
    gbuf = torch.zeros(P, dtype=dtype)  # c times the gradient of E w.r.t. the weights
    views = []
    for fan_in, fan_out, w_sl, b_sl in layers:
        W = buf[w_sl].view(fan_out, fan_in)
        views.append((W, W.t(), buf[b_sl], gbuf[w_sl].view(fan_out, fan_in), gbuf[b_sl]))
    last = len(views) - 1

    def run() -> tuple[float, Tensor]:
        hs, pre = [xin], []
        h = xin
        for i, (_, Wt, b, _, _) in enumerate(views):
            if i == last:
                a = torch.addmm(b, h, Wt)
            elif fast_tanh:
                h = torch.add(neg_one, torch.sigmoid(torch.addmm(b, h, Wt, beta=2.0, alpha=2.0)), alpha=2.0)
                pre.append(h)
                hs.append(h)
            else:
                a = torch.addmm(b, h, Wt)
                pre.append(a)
                h = value(a)
                hs.append(h)
        loss, delta = head(a)
        delta_t = delta.t()
        for i in range(last, -1, -1):
            W, _, _, gW, gb = views[i]
            torch.mm(delta_t, hs[i], out=gW)
            torch.sum(delta, 0, out=gb)
            if i > 0:
                delta = backward(torch.mm(delta, W), pre[i - 1], hs[i])
                delta_t = delta.t()
        return loss, delta

    return buf, gbuf, run


def mlp_squared_error_kernel(
    layers: Sequence[LayerSpec], act: Activation, xin: Tensor, Y: Tensor
) -> tuple[Tensor, Tensor, Callable[[], tuple[float, Tensor]]]:
    r""":func:`mlp_loss_kernel` of ``E(w) = sum_n |f(xin_n; w) - Y_n|^2``: ``run()`` returns
    ``(E, delta_0)`` and leaves ``dE/dw / 2`` in ``gbuf`` (the head's ``delta`` is the residual
    ``r = f - Y``, ``c = 1/2``)."""
    L = layers[-1][1]

    def squared_error(a: Tensor) -> tuple[float, Tensor]:
        delta = a - Y  # residual r = f - y, (N, L)
        rr = torch.mm(delta.t(), delta)  # (L, L): sums of squares on the diagonal
        return (rr.item() if L == 1 else float(rr.trace())), delta

    return mlp_loss_kernel(layers, act, xin, squared_error)


# -- Jacobian (hand-written backward of the L output cotangents at once) -----------------------
def mlp_jacobian(
    layers: Sequence[LayerSpec], act: Activation, x: Tensor, w: Tensor, first: int = 0
) -> tuple[Tensor, Tensor]:
    """``J (N, L, K)`` over the weights of layers ``first..end`` and ``f (N, L)``, ``x (N, D)``, ``w (P,)``.

    With ``h_l`` the input of layer ``l`` and ``delta_l (L, N, fan_out)`` the derivative of each
    output with respect to layer ``l``'s pre-activation: ``dJ/dW_l[j, i] = delta_l[j] h_l[i]``,
    ``dJ/db_l[j] = delta_l[j]`` and ``delta_{l-1} = act.backward(delta_l W_l, a_{l-1}, h_l)``.
    Columns in layer order: ``W_first, b_first, ..., W_last, b_last``.
    """
    params = unflatten(layers, w)
    last = len(params) - 1
    inputs, pre = [], []
    h = x
    for i, (W, b) in enumerate(params):
        inputs.append(h)
        a = h @ W.T + b
        if i < last:
            pre.append(a)
            h = act.value(a)
        else:
            h = a
    L, N = params[-1][0].shape[0], x.shape[0]
    delta = torch.eye(L, dtype=x.dtype).unsqueeze(1).expand(L, N, L)
    blocks: list[Tensor] = []
    for i in range(last, first - 1, -1):
        W, _ = params[i]
        blocks.append(delta)  # bias block
        blocks.append((delta.unsqueeze(-1) * inputs[i].unsqueeze(-2)).reshape(L, N, -1))
        if i > first:
            dh = delta @ W  # (L, N, fan_in); a and h expanded so an in-place backward fits
            delta = act.backward(dh, pre[i - 1].expand_as(dh), inputs[i].expand_as(dh))
    J = torch.cat(blocks[::-1], dim=-1)
    return J.permute(1, 0, 2), h


# -- moment propagation (local reparameterisation) ---------------------------------------------
def mlp_local_reparam_sample(
    layers: Sequence[LayerSpec], act: Activation, x: Tensor, loc: Tensor, scale: Tensor, num_particles: int = 1
) -> Tensor:
    r"""``f(x_n; w_n)`` with independent ``w_n ~ N(loc, diag(scale^2))`` per point and particle,
    ``(num_particles, N, L)``: layer by layer, the pre-activation given its input ``h`` has mean
    ``h M^T + m_b`` and variance ``h^2 (S^2)^T + s_b^2`` (independent entries) and is sampled from it."""
    var = scale.square()
    h = x.expand(num_particles, *x.shape)
    last = len(layers) - 1
    for i, (fan_in, fan_out, w_sl, b_sl) in enumerate(layers):
        M = loc[w_sl].reshape(fan_out, fan_in)
        S2 = var[w_sl].reshape(fan_out, fan_in)
        mean = h @ M.T + loc[b_sl]
        v = h.square() @ S2.T + var[b_sl]
        a = mean + v.sqrt() * torch.randn_like(mean)
        h = act.value(a) if i < last else a
    return h
