r"""Kronecker-factored (K-FAC / KFC) Gauss-Newton curvature for :class:`LinearizedLaplace`'s
``structure="kfac"``.

Layers. Every layer ``l`` is an affine map ``s = W_bar a`` of its input with a 1 appended for the
bias, ``W_bar = [W | b]`` of shape ``(out, in + 1)`` (``(out, in)`` without a bias): the
layers of an :class:`~pyro_bnnlv.nets.MLP` and, in a :class:`~pyro_bnnlv.nets.ModuleNet`, every
``nn.Linear`` and ``nn.Conv2d`` (any other parameter is refused, naming it). A ``Conv2d`` is the
same map applied at each of its ``T`` output positions ``t`` to the unfolded input patch
``a_t`` (``F.unfold``: channel-major ``C x kh x kw``, the order of ``weight.reshape(out, -1)``);
an ``nn.Linear`` applied to ``(N, ..., in)`` shares its weights over the ``T = prod(...)`` positions
the same way. :class:`KronLayer` records where ``W_bar``'s entries live in the flat ``w``
(``index[i, j]``, so ``w[index.reshape(-1)]`` is ``W_bar`` row-major whatever the layout of ``w``).

The exact GGN block. With ``B_{n,t} = d f(x_n) / d s_t`` (``L x out``, the output Jacobian with
respect to the layer's pre-activations) and ``Lambda_n`` the Hessian of ``-log p(y_n | f)`` in
``f`` (``I / sigma^2`` for the Gaussian, ``diag(pi) - pi pi^T`` for the softmax),
``d f_k / d W_bar[i, j] = sum_t B_{n,t}[k, i] a_{n,t}[j]``, so in the row-major order of ``W_bar``

.. math::

    H_l = \sum_n \sum_{t, t'} \big(B_{n,t}^\top \Lambda_n B_{n,t'}\big) \otimes
          \big(a_{n,t} a_{n,t'}^\top\big).

K-FAC (Martens & Grosse 2015, arXiv:1503.05671, sec. 3: the expectation of the Kronecker product
replaced by the Kronecker product of the expectations) and, for weight sharing, KFC (Grosse &
Martens 2016, arXiv:1602.01410, sec. 3: spatially uncorrelated derivatives drop the ``t != t'``
terms, spatial homogeneity factorises the rest) give ``H_l ~ G_l (x) A_l`` with

.. math::

    A_l = \frac1N \sum_n \sum_t a_{n,t} a_{n,t}^\top, \qquad
    G_l = \frac1T \sum_n \sum_t B_{n,t}^\top \Lambda_n B_{n,t},

i.e. ``N E[a a^T] (x) E[B^T Lambda B]``, the normalisation of Ritter, Botev & Barber (2018,
ICLR, sec. 3) and of laplace-torch (Daxberger et al. 2021, arXiv:2106.14806). The block is exact
for one data point and ``T = 1``, and for a model linear in the layer with a Gaussian likelihood.
Two differences from laplace-torch (docs/design-notes.md, 'infer.laplace.kfac'): the bias is the
appended input 1, not a Kronecker block of its own, and a convolution's ``G`` is KFC's.

The posterior (prior precision ``p``, factor ``delta``, noise ``sigma``). On a layer's block the
prior precision must factor as ``diag(d_out) (x) diag(d_in)`` (one value per output unit times
one per input column, bias column included: e.g. one precision for the weights and another for
the biases, as :func:`~pyro_bnnlv.models.bnn.fan_in_prior_scale` gives); then, exactly,

.. math::

    \tfrac1{\sigma^2} G \otimes A + \delta\, D_o \otimes D_i
    = (D_o^{1/2} \otimes D_i^{1/2})\,
      \big[\tfrac1{\sigma^2} \tilde G \otimes \tilde A + \delta I\big]\,
      (D_o^{1/2} \otimes D_i^{1/2}),
    \quad \tilde G = D_o^{-1/2} G D_o^{-1/2} = Q_G \operatorname{diag}(\lambda_G) Q_G^\top,

(likewise ``A~``), so with ``U_o = D_o^{-1/2} Q_G``, ``U_i = D_i^{-1/2} Q_A``

.. math::

    \Sigma_l = (U_o \otimes U_i) \operatorname{diag}\big(1 / (\lambda_G \otimes \lambda_A / \sigma^2
    + \delta)\big) (U_o \otimes U_i)^\top, \quad
    \log\det H_l = \sum \log p_l + \sum \log(\lambda_G \otimes \lambda_A / \sigma^2 + \delta).

Every ``(delta, sigma)`` then costs ``O(sum_l out_l in_l)``; ``Sigma``-products use the matrix
form ``(U_o (x) U_i) vec(X) = vec(U_o X U_i^T)``. Memory: the factors and their eigenvectors,
``2 sum_l (out_l^2 + in_l^2)`` numbers, never ``P x P``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...nets import MLP, FlatNet, ModuleNet

__all__ = [
    "KronEigen",
    "KronLayer",
    "kfac_factors",
    "kfac_layers",
    "kron_eigen",
    "layer_quantities",
    "prior_factors",
    "projected_jacobian",
]


@dataclass
class KronLayer:
    """One Kronecker block: ``name``, ``kind`` (``"linear"`` or ``"conv2d"``), ``index (out, in_aug)``
    the positions in ``w`` of ``W_bar = [W | b]`` (row-major), ``bias`` and, for a ModuleNet, the
    ``module``."""

    name: str
    kind: str
    index: Tensor
    bias: bool
    module: nn.Module | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.index.shape)  # type: ignore[return-value]


@dataclass
class KronEigen:
    """A layer's posterior in the eigenbasis (module docstring): ``U_out (out, out)``,
    ``U_in (in_aug, in_aug)``, ``lam (out, in_aug) = lambda_G (x) lambda_A`` at ``sigma = 1``."""

    U_out: Tensor
    U_in: Tensor
    lam: Tensor


def _block_index(w_start: int, b_start: int | None, out: int, fan_in: int) -> Tensor:
    idx = w_start + torch.arange(out * fan_in).reshape(out, fan_in)
    if b_start is None:
        return idx
    return torch.cat([idx, (b_start + torch.arange(out)).unsqueeze(1)], 1)


def kfac_layers(net: FlatNet) -> list[KronLayer]:
    """The Kronecker blocks of ``net`` (module docstring), covering every weight once.

    ``ValueError`` for a :class:`~pyro_bnnlv.nets.ModuleNet` with parameters outside ``nn.Linear``
    / ``nn.Conv2d`` layers (naming them), grouped or non-zero-padded convolutions, or another
    kind of network."""
    if isinstance(net, MLP):
        return [
            KronLayer(f"layers[{i}]", "linear", _block_index(w_sl.start, b_sl.start, fan_out, fan_in), True)
            for i, (fan_in, fan_out, w_sl, b_sl) in enumerate(net.layers)
        ]
    if not isinstance(net, ModuleNet):
        raise ValueError(f"structure='kfac' needs a pyro_bnnlv MLP or ModuleNet, got {type(net).__name__}")
    slices = net.param_slices()
    layers, covered = [], set()
    for prefix, sub in net.module.named_modules():
        if not isinstance(sub, (nn.Linear, nn.Conv2d)):
            continue
        dot = f"{prefix}." if prefix else ""
        if isinstance(sub, nn.Conv2d):
            if (
                sub.groups != 1
                or sub.padding_mode != "zeros"
                or isinstance(sub.padding, str)
                and sub.padding != "valid"
            ):
                raise ValueError(
                    f"structure='kfac' supports nn.Conv2d with groups=1, padding_mode='zeros' and "
                    f"numeric padding; {prefix!r} has groups={sub.groups}, padding={sub.padding!r}, "
                    f"padding_mode={sub.padding_mode!r}"
                )
        names = [dot + "weight"] + ([dot + "bias"] if sub.bias is not None else [])
        if any(n not in slices for n in names):  # a weight shared with an earlier module
            raise ValueError(f"structure='kfac': the parameters of {prefix!r} are shared with another layer")
        out = sub.weight.shape[0]
        fan_in = sub.weight[0].numel()
        b_start = slices[names[1]].start if sub.bias is not None else None
        index = _block_index(slices[names[0]].start, b_start, out, fan_in)
        kind = "conv2d" if isinstance(sub, nn.Conv2d) else "linear"
        layers.append(KronLayer(prefix or "<module>", kind, index, sub.bias is not None, sub))
        covered.update(names)
    unknown = [n for n in slices if n not in covered]
    if unknown:
        raise ValueError(
            f"structure='kfac' approximates the curvature of nn.Linear and nn.Conv2d layers only; parameters "
            f"{unknown} belong to other layers: use structure='diag' or 'full' for this network"
        )
    return layers


# -- per-layer inputs and output Jacobians -----------------------------------------------------
def _augment(a: Tensor, bias: bool) -> Tensor:
    """``a (N, in, T)`` with a row of ones appended when the layer has a bias."""
    return torch.cat([a, torch.ones_like(a[:, :1])], 1) if bias else a


def _layer_input(layer: KronLayer, inp: Tensor) -> Tensor:
    """The layer's inputs as ``(N, in_aug, T)``: unfolded patches of a Conv2d, the positions of a Linear."""
    N = inp.shape[0]
    if layer.kind == "conv2d":
        m = layer.module
        padding = 0 if m.padding == "valid" else m.padding
        a = F.unfold(inp, m.kernel_size, dilation=m.dilation, padding=padding, stride=m.stride)
    else:
        a = inp.reshape(N, -1, inp.shape[-1]).transpose(1, 2)
    return _augment(a, layer.bias)


def _pre_activation_grad(layer: KronLayer, g: Tensor) -> Tensor:
    """``d f_k / d s`` of one output ``k`` as ``(N, out, T)``."""
    N = g.shape[0]
    if layer.kind == "conv2d":
        return g.reshape(N, g.shape[1], -1)
    return g.reshape(N, -1, g.shape[-1]).transpose(1, 2)


def layer_quantities(
    net: FlatNet, layers: list[KronLayer], x: Tensor, w: Tensor
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """``f (N, L)``, the layers' inputs ``a_l (N, in_aug, T)`` and output Jacobians
    ``B_l (L, N, out, T)`` with respect to their pre-activations, at ``w``.

    A zero tensor is added to each pre-activation and ``f`` differentiated with respect to it,
    one output at a time (the data points are independent, so the gradient of ``f[:, k].sum()``
    holds every point's own); a ModuleNet's layers by forward hooks under ``functional_call``."""
    inputs: list[Tensor] = []
    perturb: list[Tensor] = []
    w = w.detach()
    with torch.enable_grad():
        if isinstance(net, MLP):
            h = x
            params = net.unflatten(w)
            for i, (W, b) in enumerate(params):
                inputs.append(_augment(h.detach().unsqueeze(-1), True))
                e = torch.zeros(x.shape[0], W.shape[0], dtype=x.dtype, requires_grad=True)
                perturb.append(e)
                s = h @ W.T + b + e
                h = net.activation_row.value(s) if i < len(params) - 1 else s
            f = h
        else:
            position = {id(layer.module): k for k, layer in enumerate(layers)}
            seen: dict[int, Tensor] = {}
            perturb_map: dict[int, Tensor] = {}

            def hook(module: nn.Module, args: tuple, out: Tensor) -> Tensor:
                k = position[id(module)]
                if k in seen:
                    raise ValueError(
                        f"structure='kfac': layer {layers[k].name!r} is called more than once in the forward pass"
                    )
                seen[k] = _layer_input(layers[k], args[0].detach())
                e = torch.zeros_like(out, requires_grad=True)
                perturb_map[k] = e
                return out + e

            handles = [layer.module.register_forward_hook(hook) for layer in layers]
            try:
                f = net(x, w)
            finally:
                for handle in handles:
                    handle.remove()
            missing = [layer.name for k, layer in enumerate(layers) if k not in seen]
            if missing:
                raise ValueError(f"structure='kfac': layers {missing} are not called in the forward pass")
            inputs = [seen[k] for k in range(len(layers))]
            perturb = [perturb_map[k] for k in range(len(layers))]
        L = f.shape[-1]
        grads: list[list[Tensor]] = [[] for _ in layers]
        for k in range(L):
            gs = torch.autograd.grad(f[:, k].sum(), perturb, retain_graph=k < L - 1, allow_unused=True)
            for i, (layer, g) in enumerate(zip(layers, gs)):
                g = torch.zeros_like(perturb[i]) if g is None else g
                grads[i].append(g.unsqueeze(-1) if isinstance(net, MLP) else _pre_activation_grad(layer, g))
    return f.detach(), inputs, [torch.stack(g) for g in grads]


def kfac_factors(
    net: FlatNet,
    layers: list[KronLayer],
    x: Tensor,
    w: Tensor,
    hessian: Callable[[Tensor], Tensor] | None = None,
    chunk_size: int = 1024,
) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
    """The factors ``[(A_l, G_l)]`` of the module docstring (``H_l ~ G_l (x) A_l`` in ``W_bar``'s
    row-major order) and ``f (N, L)`` at ``w``.

    ``hessian``: ``f (n, L) -> Lambda (n, L, L)``, the likelihood's Hessian in ``f``; ``None`` for
    ``Lambda = I`` (the Gaussian at ``sigma = 1``: divide ``G`` by ``sigma^2``)."""
    N = x.shape[0]
    A = [torch.zeros(lay.shape[1], lay.shape[1], dtype=x.dtype) for lay in layers]
    G = [torch.zeros(lay.shape[0], lay.shape[0], dtype=x.dtype) for lay in layers]
    fs = []
    for start in range(0, N, chunk_size):
        f, inputs, grads = layer_quantities(net, layers, x[start : start + chunk_size], w)
        fs.append(f)
        Lam = None if hessian is None else hessian(f)  # (n, L, L)
        for i, (a, B) in enumerate(zip(inputs, grads)):
            T = a.shape[-1]
            A[i] += torch.einsum("nit,njt->ij", a, a)
            LB = B if Lam is None else torch.einsum("nkl,lnot->knot", Lam, B)
            G[i] += torch.einsum("knit,knjt->ij", B, LB) / T
    return [(a / N, g) for a, g in zip(A, G)], torch.cat(fs)


# -- prior and eigenbasis ----------------------------------------------------------------------
def prior_factors(p: Tensor, layers: list[KronLayer]) -> list[tuple[Tensor, Tensor]]:
    """``[(d_out, d_in)]`` with ``p[layer.index] = outer(d_out, d_in)`` (module docstring);
    ``ValueError`` naming the layer when a block's prior precision does not factor so."""
    out = []
    for layer in layers:
        P = p[layer.index]
        d_in = P[0]
        d_out = P[:, 0] / P[0, 0]
        if not torch.allclose(torch.outer(d_out, d_in), P, rtol=1e-9, atol=0.0):
            raise ValueError(
                f"structure='kfac' needs each layer's prior precision to factor as (one value per output unit) x "
                f"(one per input, bias included), e.g. constant within the layer's weights and within its biases; "
                f"layer {layer.name!r} has another pattern. Use a scalar prior_scale or "
                f"pb.fan_in_prior_scale(net, omega, bias_scale=...) (one scale for the weights and one for the "
                f"biases of each layer), or structure='diag' / 'full'"
            )
        out.append((d_out, d_in))
    return out


def kron_eigen(A: Tensor, G: Tensor, d_out: Tensor, d_in: Tensor) -> KronEigen:
    """The eigenbasis of ``G (x) A`` relative to the prior ``diag(d_out) (x) diag(d_in)``."""
    ri, ro = d_in.rsqrt(), d_out.rsqrt()
    lam_a, Q_a = torch.linalg.eigh(ri[:, None] * A * ri[None, :])
    lam_g, Q_g = torch.linalg.eigh(ro[:, None] * G * ro[None, :])
    lam = torch.outer(lam_g.clamp_min(0.0), lam_a.clamp_min(0.0))
    return KronEigen(ro[:, None] * Q_g, ri[:, None] * Q_a, lam)


def projected_jacobian(a: Tensor, B: Tensor, eig: KronEigen) -> Tensor:
    """The layer's Jacobian in the eigenbasis, ``U_o^T J_{n,k} U_i`` flattened: ``(N, L, out * in_aug)``,
    from ``a (N, in_aug, T)`` and ``B (L, N, out, T)``: ``J_{n,k} = sum_t B[k, n, :, t] a[n, :, t]^T``."""
    Bu = torch.einsum("knot,op->knpt", B, eig.U_out)
    au = torch.einsum("nit,iq->nqt", a, eig.U_in)
    Jt = torch.einsum("knpt,nqt->nkpq", Bu, au)
    return Jt.reshape(Jt.shape[0], Jt.shape[1], -1)
