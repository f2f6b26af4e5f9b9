r"""Invariance-gap diagnostic for every layer of a mean-field BNN.

Reference: Kurle, Herbrich, Januschowski, Wang & Gasthaus (2022), arXiv:2209.07157, sec. 3
(eq. 5-11) and sec. 5 (eq. 20-26). The over-parametrised linear model of sec. 4 is in
:mod:`pyro_bnnlv.models.linear`.

The construction (sec. 5)
-------------------------
Hidden unit ``j`` of the first layer computes ``z_{1,j} = h(w_{1,j}^T x)``. At one input ``x``
the pre-activation, and hence the likelihood of that input, depends on ``w_{1,j}`` only through
``w_{1,j}^T x``: it is invariant under translations ``w_{1,j} -> w_{1,j} + B_x Delta`` along
``x^perp`` (eq. 22). Marginalising a Gaussian likelihood approximation
``g_0(w) = N(w; m, V = Diag(lambda))`` over all such translations gives
``g_mix(w) propto exp(-(x^T (w - m))^2 / (2 x^T V x))`` (eq. 14 with ``1`` replaced by ``x``), and
the product with the prior ``N(mu, Sigma = Diag(sigma^2))`` is the invariance-abiding posterior
of eq. 23 (inside the expectation over ``x``):

.. math::

    q_{mix}(w_{1,j} \mid x) = \mathcal N\Big(
        \mu + \frac{x^T(m - \mu)}{x^T(V + \Sigma)x}\,\Sigma x,\;
        \Sigma - \frac{(\Sigma x)(\Sigma x)^T}{x^T(V + \Sigma)x}\Big),
    \qquad \text{precision } \Sigma^{-1} + \frac{x x^T}{x^T V x}.

The invariance gap at ``x`` is ``KL[q_0(w_{1,j}) || q_mix(w_{1,j} | x)]`` (eq. 10), in closed form
in O(d) per input and unit (``d`` = fan-in + 1):

.. math::

    2\,KL = \sum_k \Big[\frac{v_k + \delta_k^2}{\sigma_k^2} - 1 + \ln\frac{\sigma_k^2}{v_k}\Big]
            + \frac{x^T \operatorname{Diag}(v) x + (x^T\delta)^2}{x^T V x}
            - \ln\Big(1 + \frac{x^T \Sigma x}{x^T V x}\Big),
    \qquad \delta = E_{q_{mix}}[w] - m_q.

:func:`first_layer_invariance_gap` evaluates it for every training input and first-layer unit
of a fitted mean-field BNN and aggregates per unit.

Later layers (eq. 20-21, 25-26): unit ``j`` of layer ``l`` computes ``h(w_{l,j}^T z_{l-1})``, so
eq. 25 is eq. 23 with ``x`` replaced by ``z = [z_{l-1}, 1]`` and the expectation taken over
``z ~ P(z_{l-1})`` (eq. 26). :func:`layer_invariance_gap` applies the closed form to any layer,
:func:`invariance_gap_by_layer` to all, :func:`layer_inputs` returns the ``z`` used.

Assumptions and approximations
------------------------------
Made by the paper (sec. 3 and 5): 1. *per-input invariance*, eq. 23 averages the per-input
``q_mix`` over the inputs (a heuristic); 2. a uniform invariance (``beta -> inf``, sec. 4.1) and a
mean-field Gaussian ``g_0``; 3. the gap is an ELBO difference only under conditions (7)-(8): for
a diagonal prior, iff ``sigma_k^2 / (sigma_k^2 + lambda_k)`` is the same for every ``k`` with
``x_k != 0`` (column ``shrinkage_spread`` measures the violation); 4. layer-wise treatment, each
unit invariant given its own input (eq. 23, 25).

Made by this implementation: 5. ``m`` and ``V`` in eq. 23 are ``g_0``'s, recovered from the
fitted ``q_0`` by inverting eq. 6a (:func:`likelihood_factor_from_posterior`; ``lambda = inf``
where ``v >= sigma^2``, share reported as ``frac_uninformative``); 6. the bias is the last entry
of ``w_{l,j}``, inputs augmented to ``[x, 1]``; 7. ``gap_mean`` averages per-input gaps, an upper
bound on the gap to the mixture (``num_samples > 0`` adds a Monte-Carlo ``gap_mixture``); 8. each
unit uses its marginals of ``q`` and the diagonal prior; 9. earlier layers' activations are drawn
through ``q_mix`` (eq. 24, 26; :func:`layer_inputs`, ``activations="qmix"``) or ``q_0``
(``"q0"``), a Monte-Carlo estimate that varies with ``seed`` and ``S``. The full text of each:
docs/design-notes.md, 'stats.invariance_gap'.

Reading the output: the gap is the part of the unit's ``KL[q_0 || p]`` that mean-field VI pays
because it cannot represent the unit's translation invariance (eq. 10-11); units with a large
``gap_mean`` (or ``gap_fraction = gap_mean / kl_to_prior``) are those where the mean-field ELBO
over-regularises. The gap tends to 0 as a unit collapses to its prior (sec. 3, "posterior
collapse"), so small gaps together with small ``kl_to_prior`` flag collapsed units.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..protocols import HasNetwork, NetworkModel
from .._checks import as_float64, as_positive_float64, check_int
from .._state import isolated_param_store
from .._figures import finish_figure, new_axes
from ..nets import MLP
from ..models.bnn import BNN

__all__ = [
    "ACTIVATION_SOURCES",
    "first_layer_indices",
    "first_layer_invariance_gap",
    "invariance_abiding_posterior",
    "invariance_gap_at_inputs",
    "invariance_gap_by_layer",
    "layer_indices",
    "layer_inputs",
    "layer_invariance_gap",
    "likelihood_factor_from_posterior",
    "plot_first_layer_invariance_gap",
    "sample_qmix",
]

_DTYPE = torch.float64


def likelihood_factor_from_posterior(
    q_loc: Tensor, q_var: Tensor, prior_loc: Tensor, prior_var: Tensor
) -> tuple[Tensor, Tensor]:
    r"""Parameters ``(m, lambda)`` of ``g_0`` such that ``q_0 = p g_0 / Z_0`` (inverse of eq. 6a).

    Coordinate-wise, for a diagonal Gaussian prior ``N(mu, sigma^2)`` and ``q = N(m_q, v)``:

    .. math::

        \lambda = \frac{\sigma^2 v}{\sigma^2 - v}, \qquad
        m = m_q + \lambda \frac{m_q - \mu}{\sigma^2} \qquad (v < \sigma^2);

    ``lambda = inf`` (flat ``g_0``) and ``m = m_q`` where ``v >= sigma^2``. All arguments
    broadcast; float64 results. Round trip with :func:`pyro_bnnlv.models.linear.q0` is tested.
    """
    q_loc, q_var = _gaussian(q_loc, q_var, "q_loc", "q_var")
    prior_loc, prior_var = _gaussian(prior_loc, prior_var, "prior_loc", "prior_var")
    informative = q_var < prior_var
    gap = torch.where(informative, prior_var - q_var, torch.ones_like(prior_var - q_var))
    lam = torch.where(informative, prior_var * q_var / gap, torch.full_like(gap, math.inf))
    shift = torch.where(informative, lam * (q_loc - prior_loc) / prior_var, torch.zeros_like(gap))
    return q_loc + shift, lam


def _gaussian(loc: Tensor, var: Tensor, loc_name: str, var_name: str) -> tuple[Tensor, Tensor]:
    """``(loc, var)`` as float64 tensors, ``var`` positive (both may be infinite), named in errors."""
    return as_float64(loc, loc_name, allow_infinite=True), as_positive_float64(var, var_name, allow_infinite=True)


def _quadratic_terms(x: Tensor, prior_var: Tensor, lam: Tensor) -> tuple[Tensor, Tensor]:
    """``a = x^T V x`` (``inf`` if ``lambda_k = inf`` at some ``x_k != 0``), ``s = x^T Sigma x``."""
    x2 = x * x
    xv = torch.where(x2 == 0, torch.zeros_like(x2 * prior_var), x2 * lam)  # 0 * inf -> 0
    return xv.sum(-1), (x2 * prior_var).sum(-1)


def invariance_abiding_posterior(
    x: Tensor, prior_loc: Tensor, prior_var: Tensor, m: Tensor, lam: Tensor
) -> tuple[Tensor, Tensor]:
    r"""``q_mix(w | x)`` of eq. 23 (the Gaussian inside the expectation over ``x``): ``(loc, cov)``.

    ``x (..., d)`` are (augmented) inputs, ``prior_loc``, ``prior_var``, ``m``, ``lam`` are
    ``(..., d)`` and broadcast against ``x``. Returns ``loc (..., d)`` and a dense
    ``cov (..., d, d)`` (for checks and small ``d``; :func:`invariance_gap_at_inputs` never forms
    it). ``x^T V x = inf`` (a flat ``g_0`` coordinate seen by ``x``) gives the prior.
    """
    x = as_float64(x, "x", allow_infinite=True)
    mu, s2 = _gaussian(prior_loc, prior_var, "prior_loc", "prior_var")
    m, lam = _gaussian(m, lam, "m", "lam")
    a, s = _quadratic_terms(x, s2, lam)
    c = 1.0 / (a + s)  # 0 when a = inf
    sx = s2 * x
    coef = torch.where(torch.isinf(a), torch.zeros_like(a), (x * (m - mu)).sum(-1) * c)
    loc = mu + coef.unsqueeze(-1) * sx
    outer = sx.unsqueeze(-1) * sx.unsqueeze(-2)
    cov = torch.diag_embed(s2.expand_as(sx)) - c[..., None, None] * outer
    return loc, cov


def invariance_gap_at_inputs(
    x: Tensor,
    q_loc: Tensor,
    q_var: Tensor,
    prior_loc: Tensor,
    prior_var: Tensor,
    m: Tensor | None = None,
    lam: Tensor | None = None,
) -> Tensor:
    r"""``KL[q_0 || q_mix(. | x)]`` (eq. 10 with eq. 23's ``q_mix``) in closed form, O(d).

    ``q_0 = N(q_loc, Diag(q_var))``; ``g_0 = N(m, Diag(lam))`` defaults to
    :func:`likelihood_factor_from_posterior` of ``q_0``. Shapes ``(..., d)``, broadcast; the
    result has the broadcast batch shape. See the module docstring for the formula.
    """
    x = as_float64(x, "x", allow_infinite=True)
    mq, v = _gaussian(q_loc, q_var, "q_loc", "q_var")
    mu, s2 = _gaussian(prior_loc, prior_var, "prior_loc", "prior_var")
    if (m is None) != (lam is None):
        raise ValueError("pass both m and lam, or neither (then they are derived from q)")
    if m is None:
        m, lam = likelihood_factor_from_posterior(mq, v, mu, s2)
    m, lam = _gaussian(m, lam, "m", "lam")
    a, s = _quadratic_terms(x, s2, lam)
    inv_a = 1.0 / a  # 0 when a = inf
    coef = torch.where(torch.isinf(a), torch.zeros_like(a), (x * (m - mu)).sum(-1) / (a + s))
    delta = mu + coef.unsqueeze(-1) * (s2 * x) - mq
    diag = ((v + delta**2) / s2 - 1 + torch.log(s2 / v)).sum(-1)
    rank_one = ((x * x * v).sum(-1) + (x * delta).sum(-1) ** 2) * inv_a - torch.log1p(s * inv_a)
    return 0.5 * (diag + rank_one)


def _log_qmix(w: Tensor, x: Tensor, mu: Tensor, s2: Tensor, m: Tensor, lam: Tensor) -> Tensor:
    """``ln q_mix(w | x_n)``: ``w (S, H, d)``, ``x (N, d)``, params ``(H, d)`` -> ``(S, N, H)``."""
    xx = x[:, None, :]  # (N, 1, d)
    a, s = _quadratic_terms(xx, s2, lam)  # (N, H)
    inv_a = 1.0 / a
    coef = torch.where(torch.isinf(a), torch.zeros_like(a), (xx * (m - mu)).sum(-1) / (a + s))
    loc = mu + coef.unsqueeze(-1) * (s2 * xx)  # (N, H, d)
    delta = w[:, None] - loc  # (S, N, H, d)
    quad = (delta**2 / s2).sum(-1) + (delta * xx).sum(-1) ** 2 * inv_a
    logdet = torch.log(s2).sum(-1) - torch.log1p(s * inv_a)  # (N, H)
    d = w.shape[-1]
    return -0.5 * (d * math.log(2 * math.pi) + logdet + quad)


def _mixture_gap(
    q_loc: Tensor,
    q_var: Tensor,
    x: Tensor,
    mu: Tensor,
    s2: Tensor,
    m: Tensor,
    lam: Tensor,
    num_samples: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """Monte-Carlo ``KL[q_0 || (1/N) sum_n q_mix(. | x_n)]`` per unit and its standard error."""
    H, d = q_loc.shape
    N = x.shape[0]
    chunk = max(1, int(2e7 // max(1, N * H * d)))
    terms = []
    for start in range(0, num_samples, chunk):
        S = min(chunk, num_samples - start)
        eps = torch.randn((S, H, d), generator=generator, dtype=_DTYPE)
        w = q_loc + q_var.sqrt() * eps
        log_q0 = (-0.5 * (eps**2 + math.log(2 * math.pi) + torch.log(q_var))).sum(-1)  # (S, H)
        log_mix = torch.logsumexp(_log_qmix(w, x, mu, s2, m, lam), dim=1) - math.log(N)
        terms.append(log_q0 - log_mix)
    t = torch.cat(terms)  # (S, H)
    return t.mean(0), t.std(0) / math.sqrt(num_samples)


def _guide_loc_scale(model: Any, guide: Any) -> tuple[Tensor, Tensor]:
    if isinstance(guide, (tuple, list)):
        if len(guide) != 2:
            raise ValueError("guide must be a fitted AutoNormal or a (loc, scale) pair of site 'w'")
        loc, scale = guide
    else:
        getter = getattr(guide, "_get_loc_and_scale", None)
        if getter is None:
            raise ValueError(
                f"guide must be a fitted AutoNormal (mean-field) or a (loc, scale) pair, got {type(guide).__name__}"
            )
        try:
            with isolated_param_store(model, guide), torch.no_grad():
                loc, scale = getter("w")
        except AttributeError as err:
            raise ValueError("the guide has no parameters for site 'w': fit it (or call it once) first") from err
    loc, scale = torch.as_tensor(loc).detach(), torch.as_tensor(scale).detach()
    P = model.net.num_weights
    for name, t in (("loc", loc), ("scale", scale)):
        if t.shape != (P,):
            raise ValueError(f"guide {name} of site 'w' must have shape ({P},), got {tuple(t.shape)}")
        if not torch.isfinite(t).all():
            raise ValueError(f"guide {name} of site 'w' contains NaN or infinite values")
    if not (scale > 0).all():
        raise ValueError("guide scale of site 'w' must be positive")
    return loc.to(_DTYPE), scale.to(_DTYPE)


def _check_model(model: Any) -> Any:
    """The model's :class:`~pyro_bnnlv.nets.MLP` (``ValueError`` for anything else)."""

    if not isinstance(model, BNN) or not isinstance(model.net, MLP):
        raise ValueError(
            f"model must be a pyro_bnnlv BNN with an MLP network, got {type(model).__name__}"
            + (f" with {type(model.net).__name__}" if isinstance(model, HasNetwork) else "")
        )
    return model.net


def _check_layer(net: Any, layer: Any) -> int:
    if not isinstance(layer, numbers.Integral) or isinstance(layer, bool):
        raise ValueError(
            f"layer must be an int (0-based index into model.net.layers), got {layer!r} of type {type(layer).__name__}"
        )
    layer, num = int(layer), len(net.layers)
    if not 0 <= layer < num:
        raise ValueError(
            f"layer={layer} is out of range: model.net has {num} layer(s), valid indices are "
            f"0..{num - 1} (layer {num - 1} is the output layer)"
        )
    return layer


def layer_indices(net: Any, layer: int) -> Tensor:
    """``(n_l, fan_in + 1)`` indices into the flat ``w`` of an :class:`~pyro_bnnlv.nets.MLP`:
    row ``j`` holds unit ``j``'s input weights ``W_l[j, :]`` of layer ``layer`` (0-based index
    into ``net.layers``) and, last, its bias ``b_l[j]``."""
    layer = _check_layer(net, layer)
    fan_in, fan_out, w_sl, b_sl = net.layers[layer]
    weights = w_sl.start + torch.arange(fan_out * fan_in).reshape(fan_out, fan_in)
    bias = b_sl.start + torch.arange(fan_out).unsqueeze(-1)
    return torch.cat([weights, bias], dim=-1)


def first_layer_indices(net: Any) -> Tensor:
    """:func:`layer_indices` of the first layer, ``(H, D + 1)``: row ``j`` is ``[W_1[j, :], b_1[j]]``."""
    return layer_indices(net, 0)


def _augment(z: Tensor) -> Tensor:
    return torch.cat([z, torch.ones(*z.shape[:-1], 1, dtype=z.dtype)], dim=-1)


#: how :func:`layer_invariance_gap` draws the activations ``z_{l-1}`` of the earlier layers
ACTIVATION_SOURCES = ("qmix", "q0")


def _check_activations(activations: Any) -> str:
    if activations not in ACTIVATION_SOURCES:
        raise ValueError(
            f"activations must be 'qmix' (the paper's P(z_{{l-1}}), eq. 24 and 26) or 'q0' (the "
            f"fitted mean-field q_0), got {activations!r}"
        )
    return activations


def sample_qmix(
    z_mix: Tensor,
    prior_loc: Tensor,
    prior_var: Tensor,
    m: Tensor,
    lam: Tensor,
    generator: torch.Generator | None = None,
) -> Tensor:
    r"""One draw of ``w ~ q_mix(w | z')`` (eq. 23 / 25's Gaussian at ``z'``) per row of ``z_mix``.

    ``q_mix(w | z')`` is the prior ``N(mu, Sigma)`` conditioned on the Gaussian likelihood
    ``g_mix(w | z') = N(z'^T m; z'^T w, z'^T V z')`` of the one direction ``z'`` that the
    likelihood sees (eq. 14 with ``1`` replaced by ``z'``), so Matheron's rule gives an exact draw
    with ``O(d)`` work and no ``d x d`` matrix:

    .. math::

        w = w_p + \frac{\Sigma z'}{z'^T(V + \Sigma)z'}
            \big(z'^T m + \sqrt{z'^T V z'}\,\xi - z'^T w_p\big),
        \qquad w_p \sim \mathcal N(\mu, \Sigma),\ \xi \sim \mathcal N(0, 1),

        \text{mean } \mu + \frac{z'^T(m - \mu)}{z'^T(V + \Sigma)z'}\,\Sigma z', \qquad
        \text{covariance } \Sigma - \frac{(\Sigma z')(\Sigma z')^T}{z'^T(V + \Sigma)z'},

    exactly eq. 23's (:func:`invariance_abiding_posterior`). ``z_mix (..., d)`` broadcasts
    against the ``(..., d)`` parameters (``V = Diag(lam)``); ``z'^T V z' = inf`` (a flat ``g_0``
    coordinate seen by ``z'``) gives a prior draw. Returns ``(..., d)`` float64.
    """
    z = as_float64(z_mix, "z_mix", allow_infinite=True)
    mu, s2 = _gaussian(prior_loc, prior_var, "prior_loc", "prior_var")
    m, lam = _gaussian(m, lam, "m", "lam")
    shape = torch.broadcast_shapes(z.shape, mu.shape, s2.shape, m.shape, lam.shape)
    eps = torch.randn(shape, generator=generator, dtype=_DTYPE)
    xi = torch.randn(shape[:-1], generator=generator, dtype=_DTYPE)
    w_p = mu + s2.sqrt() * eps
    a, s = _quadratic_terms(z, s2, lam)
    finite = torch.isfinite(a)
    a0 = torch.where(finite, a, torch.zeros_like(a))
    residual = (z * m).sum(-1) + a0.sqrt() * xi - (z * w_p).sum(-1)
    coef = torch.where(finite, residual / (a0 + s), torch.zeros_like(a))
    return w_p + coef.unsqueeze(-1) * (s2 * z)


def _unit_params(
    net: Any, layer: int, loc: Tensor, scale: Tensor, prior_loc: Tensor, prior_scale: Tensor
) -> tuple[Tensor, ...]:
    """Per-unit ``(mq, v, mu, s2, m, lam)`` of ``layer``, each ``(H, d)`` (assumptions 5 and 8)."""
    idx = layer_indices(net, layer)
    mq, v = loc[idx], scale[idx] ** 2
    mu, s2 = prior_loc.detach().to(_DTYPE)[idx], prior_scale.detach().to(_DTYPE)[idx] ** 2
    m, lam = likelihood_factor_from_posterior(mq, v, mu, s2)
    return mq, v, mu, s2, m, lam


def _layer_inputs(
    model: Any,
    x: Tensor,
    loc: Tensor,
    scale: Tensor,
    layer: int,
    num_activation_samples: int,
    generator: torch.Generator,
    activations: str = "qmix",
) -> Tensor:
    """Augmented inputs ``[z_{l-1}, 1]`` of ``layer``: ``(1, N, d)`` for layer 0 (the data, no
    draw), else ``(S, N, d)``: ``activations="q0"``: from ``S`` draws ``w = loc + scale * eps``,
    ``eps (S, P)``; ``"qmix"``: from ``P(z_{l-1})`` of eq. 24 / 26 (:func:`layer_inputs`)."""
    net = model.net
    h = x.detach().to(_DTYPE)
    if layer == 0:
        return _augment(h).unsqueeze(0)
    S = num_activation_samples
    if activations == "q0":
        eps = torch.randn((S, loc.shape[-1]), generator=generator, dtype=_DTYPE)
        w = loc + scale * eps  # (S, P)
        return _augment(net.hidden(h.expand(S, *h.shape), w, layer))
    z = _augment(h).expand(S, *h.shape[:-1], h.shape[-1] + 1)  # (S, N, d): the inputs x ~ p(D)
    pool = _augment(h)  # the mixture's components: x' ~ p(D) (eq. 23)
    for k in range(layer):
        _, v, mu, s2, m, lam = _unit_params(net, k, loc, scale, model.prior_loc, model.prior_scale)
        H, d = mu.shape
        # one component z' ~ P(z_{k-1}) per (draw, input, unit): the pool's rows, uniformly
        comp = torch.randint(pool.shape[0], (S, z.shape[1], H), generator=generator)
        pre = torch.empty(S, z.shape[1], H, dtype=_DTYPE)
        rows = max(1, int(4e6 // max(1, z.shape[1] * H * d)))
        for i in range(0, S, rows):
            w = sample_qmix(pool[comp[i : i + rows]], mu, s2, m, lam, generator)  # (s, N, H, d)
            pre[i : i + rows] = (w * z[i : i + rows, :, None, :]).sum(-1)
        z = _augment(net.activation_row.value(pre))  # eq. 24 / 26: h_k(w^T z_{k-1})
        pool = z.reshape(-1, z.shape[-1])
    return z


def _validated(model, guide, x, layer, num_activation_samples, num_samples, activations="qmix"):
    net = _check_model(model)
    _check_activations(activations)
    layer = _check_layer(net, layer)
    check_int(num_samples, "num_samples", minimum=0)
    check_int(num_activation_samples, "num_activation_samples")
    net.check_input(x, "x")
    if x.dim() != 2:
        raise ValueError(f"x must have shape (N, {net.in_features}), got {tuple(x.shape)}")
    loc, scale = _guide_loc_scale(model, guide)
    return net, layer, loc, scale


def layer_inputs(
    model: NetworkModel,
    guide: Any,
    x: Tensor,
    layer: int,
    *,
    num_activation_samples: int = 32,
    seed: int | None = 0,
    activations: str = "qmix",
) -> Tensor:
    r"""The augmented inputs ``[z_{l-1}, 1]`` that :func:`layer_invariance_gap` uses for ``layer``.

    Layer 0: the training inputs ``[x, 1]``, shape ``(1, N, D + 1)``, whatever ``activations``.
    Layer ``l >= 1``: shape ``(S, N, n_{l-1} + 1)`` with ``S = num_activation_samples``; row
    ``(s, n)`` is a draw of ``z_{l-1}`` at the training input ``x_n``, one generator
    ``torch.Generator().manual_seed(seed)`` (``seed=None`` means 0) making every draw:

    * ``activations="qmix"`` (default; the paper's ``z ~ P(z_{l-1})``, eq. 24 and 26): layer by
      layer, ``z_{k,j} = h_k(w^T z_{k-1})`` with ``z_0 = [x_n, 1]`` and
      ``w ~ q_mix(w_{k,j})``, the mixture of eq. 23 (``k = 1``) or eq. 25: a component
      ``z' ~ P(z_{k-1})`` drawn uniformly from the training inputs (``k = 1``) or from the
      ``S x N`` draws of ``z_{k-1}`` (``k >= 2``), independently of ``z_{k-1}`` itself and of the
      other units, then ``w ~ q_mix(w_{k,j} | z')`` (:func:`sample_qmix`), with ``g_0`` read from
      the guide (assumption 5). Every ``(s, n, j)`` has its own component and weight draw.
    * ``activations="q0"``: sample ``s`` propagates ``x`` through the earlier layers with the
      weight vector ``w_s = loc + scale * eps_s``, ``eps = torch.randn((S, P), generator=...,
      dtype=float64)``, ``(loc, scale)`` the guide's mean-field ``q_0`` (the approximation this
      library used before issue 43); the draw depends only on ``seed``, ``S`` and ``P``, so
      every layer sees the same weight samples.
    """
    net, layer, loc, scale = _validated(model, guide, x, layer, num_activation_samples, 0, activations)
    gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
    return _layer_inputs(model, x, loc, scale, layer, num_activation_samples, gen, activations)


def _gaps_chunked(z: Tensor, mq, v, mu, s2, m, lam) -> Tensor:
    """:func:`invariance_gap_at_inputs` for ``z (M, d)`` against ``(H, d)`` units -> ``(M, H)``,
    in chunks of rows so that the ``(rows, H, d)`` temporaries stay small."""
    H, d = mq.shape
    rows = max(1, int(4e6 // max(1, H * d)))
    return torch.cat(
        [invariance_gap_at_inputs(z[i : i + rows, None, :], mq, v, mu, s2, m, lam) for i in range(0, z.shape[0], rows)]
    )


def layer_invariance_gap(
    model: NetworkModel,
    guide: Any,
    x: Tensor,
    layer: int,
    *,
    num_activation_samples: int = 32,
    per_input: bool = False,
    num_samples: int = 0,
    seed: int | None = 0,
    activations: str = "qmix",
):
    r"""Invariance gap of one layer of a mean-field BNN, per unit (sec. 5, eq. 20-23 and 25).

    For every activation vector ``z = [z_{l-1}, 1]`` and unit ``j``: ``g_0`` from the fitted
    ``q_0(w_{l,j})`` (inverse of eq. 6a), ``q_mix(w_{l,j} | z)`` and the gap
    ``KL[q_0(w_{l,j}) || q_mix(w_{l,j} | z)]`` (eq. 10), in closed form. For ``l >= 1`` the
    ``z`` are ``S x N`` draws at the training inputs (:func:`layer_inputs`; assumption 9);
    layer 0 uses the inputs themselves and is :func:`first_layer_invariance_gap`.

    Args:
        model: a :class:`~pyro_bnnlv.models.bnn.BNN` whose ``net`` is an
            :class:`~pyro_bnnlv.nets.MLP` (its diagonal prior ``prior_loc``, ``prior_scale`` is
            used).
        guide: a fitted ``AutoNormal`` (mean-field) guide of the model, or a pair
            ``(loc, scale)`` of site ``"w"``, each ``(P,)``.
        x: training inputs ``(N, D)``.
        layer: 0-based index into ``model.net.layers``; ``len(model.net.layers) - 1`` is the
            output layer (its units are the outputs ``f``, eq. 20).
        num_activation_samples: ``S``, the number of activation draws per training input for
            ``layer >= 1`` (ignored for layer 0).
        per_input: return the long per-(activation vector, unit) table instead of the per-unit
            summary.
        num_samples: if positive, also estimate ``KL[q_0 || mean_z q_mix(. | z)]`` (the eq. 23 /
            eq. 25 mixture) with this many samples of ``q_0`` per unit.
        seed: seeds one generator that first draws the activation weights (``layer >= 1``)
            and then the ``num_samples`` mixture samples; ``None`` means 0.
        activations: ``"qmix"`` (the paper's ``P(z_{l-1})``) or ``"q0"`` (:func:`layer_inputs`).

    Returns:
        a :class:`pandas.DataFrame` with the columns of :func:`first_layer_invariance_gap`, taken
        over the ``S x N`` activation vectors instead of the inputs (``gap_max`` grows with ``S``).
        ``attrs`` holds ``total_gap_mean``, ``total_kl_to_prior``, ``num_inputs`` and, for
        ``layer >= 1``, ``num_activation_samples`` and ``num_activation_vectors``. With
        ``per_input=True`` and ``layer >= 1`` the long table has an extra first column ``draw``
        (the weight draw ``s``); ``input`` indexes the training input.
    """
    net, layer, loc, scale = _validated(model, guide, x, layer, num_activation_samples, num_samples, activations)
    gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
    z = _layer_inputs(model, x, loc, scale, layer, num_activation_samples, gen, activations)  # (S, N, d)
    S, N, _ = z.shape
    za = z.reshape(S * N, -1)
    mq, v, mu, s2, m, lam = _unit_params(net, layer, loc, scale, model.prior_loc, model.prior_scale)  # (H, d)
    H = mq.shape[0]
    gaps = _gaps_chunked(za, mq, v, mu, s2, m, lam)  # (S N, H)
    zz = za[:, None, :]  # (S N, 1, d)
    a, s = _quadratic_terms(zz, s2, lam)
    var_q0 = (zz * zz * v).sum(-1)  # (S N, H)
    var_qmix = torch.where(torch.isinf(a), s, s * a / (s + a))  # z^T Cov_mix z
    if per_input:
        import pandas as pd

        cols = dict(
            input=torch.arange(N).repeat_interleave(H).repeat(S).numpy(),
            unit=torch.arange(H).repeat(S * N).numpy(),
            gap=gaps.reshape(-1).numpy(),
            preact_var_q0=var_q0.reshape(-1).numpy(),
            preact_var_qmix=var_qmix.reshape(-1).numpy(),
        )
        if layer > 0:
            cols = dict(draw=torch.arange(S).repeat_interleave(N * H).numpy(), **cols)
        return pd.DataFrame(cols)
    df = _summary(mq, v, mu, s2, lam, za, gaps, var_q0, var_qmix, num_samples, m, gen)
    df.attrs.update(num_inputs=int(N))
    if layer > 0:
        df.attrs.update(num_activation_samples=int(S), num_activation_vectors=int(S * N))
    return df


def _summary(mq, v, mu, s2, lam, z, gaps, var_q0, var_qmix, num_samples, m, gen):
    import pandas as pd

    H = mq.shape[0]
    kl_prior = 0.5 * ((v + (mq - mu) ** 2) / s2 - 1 + torch.log(s2 / v)).sum(-1)  # (H,)
    shrink = s2 / (s2 + lam)  # 0 where lambda = inf
    if num_samples > 0:
        mix, mix_se = _mixture_gap(mq, v, z, mu, s2, m, lam, num_samples, gen)
    else:
        mix = mix_se = torch.full((H,), math.nan, dtype=_DTYPE)
    gap_mean = gaps.mean(0)
    df = pd.DataFrame(
        dict(
            unit=range(H),
            gap_mean=gap_mean.numpy(),
            gap_max=gaps.max(0).values.numpy(),
            gap_mixture=mix.numpy(),
            gap_mixture_se=mix_se.numpy(),
            kl_to_prior=kl_prior.numpy(),
            gap_fraction=(gap_mean / kl_prior).numpy(),
            preact_var_q0=var_q0.mean(0).numpy(),
            preact_var_qmix=var_qmix.mean(0).numpy(),
            shrinkage_spread=(shrink.max(-1).values - shrink.min(-1).values).numpy(),
            frac_uninformative=torch.isinf(lam).to(_DTYPE).mean(-1).numpy(),
        )
    ).set_index("unit")
    df.attrs.update(total_gap_mean=float(gap_mean.sum()), total_kl_to_prior=float(kl_prior.sum()))
    return df


def invariance_gap_by_layer(
    model: NetworkModel,
    guide: Any,
    x: Tensor,
    *,
    layers: Sequence[int] | None = None,
    num_activation_samples: int = 32,
    per_input: bool = False,
    num_samples: int = 0,
    seed: int | None = 0,
    activations: str = "qmix",
):
    r""":func:`layer_invariance_gap` for several layers (default: all, output layer included) in
    one :class:`pandas.DataFrame` with a ``layer`` column first (then ``unit`` and the
    per-unit columns; with ``per_input=True``: ``layer``, ``draw``, ``input``, ``unit``, ...,
    where layer 0's rows have ``draw = 0``). All layers use the same ``seed``, hence the same
    ``q_0`` weight draws for their earlier layers (see :func:`layer_inputs`). Where the gap
    sits: ``df.groupby("layer")[["gap_mean", "kl_to_prior"]].sum()``; ``attrs`` holds
    ``total_gap_mean`` and ``total_kl_to_prior`` as ``{layer: value}`` dicts, ``num_inputs`` and
    ``num_activation_samples``.
    """
    import pandas as pd

    net = _check_model(model)
    if layers is None:
        layers = range(len(net.layers))
    elif isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence) or not layers:
        raise ValueError(f"layers must be a non-empty sequence of ints or None, got {layers!r}")
    layers = [_check_layer(net, lay) for lay in layers]
    if len(set(layers)) != len(layers):
        raise ValueError(f"layers contains duplicates: {layers}")
    frames, totals, kls = [], {}, {}
    for lay in layers:
        df = layer_invariance_gap(
            model,
            guide,
            x,
            lay,
            num_activation_samples=num_activation_samples,
            per_input=per_input,
            num_samples=num_samples,
            seed=seed,
            activations=activations,
        )
        if per_input:
            if "draw" not in df.columns:
                df.insert(0, "draw", 0)
        else:
            totals[lay], kls[lay] = df.attrs["total_gap_mean"], df.attrs["total_kl_to_prior"]
            df = df.reset_index()
        df.insert(0, "layer", lay)
        frames.append(df)
    out = pd.concat(frames, ignore_index=True)
    out.attrs.update(num_inputs=int(x.shape[0]), num_activation_samples=num_activation_samples)
    if not per_input:
        out.attrs.update(total_gap_mean=totals, total_kl_to_prior=kls)
    return out


def first_layer_invariance_gap(
    model: NetworkModel, guide: Any, x: Tensor, *, per_input: bool = False, num_samples: int = 0, seed: int | None = 0
):
    r"""First-layer invariance gap of a mean-field BNN, per hidden unit (sec. 5, eq. 22-23).

    ``layer_invariance_gap(model, guide, x, 0, ...)`` (the same arguments), except that a net
    without hidden layers is refused (``ValueError``): per training input ``x_n`` and unit ``j``,
    ``KL[q_0(w_{1,j}) || q_mix(w_{1,j} | x_n)]`` (eq. 10 with eq. 23's ``q_mix``).

    Returns:
        a :class:`pandas.DataFrame`. Per unit (default), indexed by ``unit``: ``gap_mean``,
        ``gap_max`` (over inputs), ``gap_mixture`` and ``gap_mixture_se`` (the Monte-Carlo
        ``KL[q_0 || (1/N) sum_n q_mix(. | x_n)]``, NaN unless ``num_samples > 0``), ``kl_to_prior`` (``KL[q_0(w_{1,j}) || p(w_{1,j})]``, which bounds
        the gap under conditions (7)-(8), eq. 11), ``gap_fraction = gap_mean / kl_to_prior``,
        ``preact_var_q0`` and ``preact_var_qmix`` (mean over inputs of the variance of the
        pre-activation ``w_{1,j}^T [x_n, 1]`` under ``q_0`` and ``q_mix``; equal where eq. 9's
        predictive equivalence holds), ``shrinkage_spread`` (``max_k - min_k`` of
        ``sigma_k^2/(sigma_k^2 + lambda_k)``: 0 iff condition (7) holds for every input with
        non-zero entries), ``frac_uninformative`` (share of the unit's coordinates with
        ``q`` variance ``>=`` prior variance). ``attrs`` holds the totals over units. With
        ``per_input=True``: columns ``input``, ``unit``, ``gap``, ``preact_var_q0``,
        ``preact_var_qmix``.
    """
    net = _check_model(model)
    if not net.hidden_sizes:
        raise ValueError("model.net has no hidden layer: the first layer is the output layer")
    return layer_invariance_gap(model, guide, x, 0, per_input=per_input, num_samples=num_samples, seed=seed)


def plot_first_layer_invariance_gap(df, path: str | Path | None = None, sort: bool = True, *, ax: Any = None) -> Any:
    """Bar chart per first-layer unit of ``kl_to_prior`` and ``gap_mean`` (and ``gap_mixture``
    when present) from :func:`first_layer_invariance_gap`. Returns the figure; writes the PNG
    ``path`` when given; draws into ``ax`` when given."""
    d = df.sort_values("kl_to_prior", ascending=False) if sort else df
    pos = range(len(d))
    owned = ax is None
    fig, ax = new_axes(ax, figsize=(max(6, 0.25 * len(d) + 2), 3.5))
    ax.bar(pos, d.kl_to_prior, color="lightgray", label="KL[q0 || p] of the unit")
    ax.bar(pos, d.gap_mean, color="tab:red", width=0.5, label="invariance gap (mean over inputs)")
    if d.gap_mixture.notna().any():
        ax.plot(list(pos), d.gap_mixture, "k.", label="gap to the eq. 23 mixture (MC)")
    ax.set_xticks(list(pos))
    ax.set_xticklabels([str(u) for u in d.index], fontsize=6)
    ax.set_xlabel("first-layer unit" + (" (sorted by KL)" if sort else ""))
    ax.set_ylabel("nats")
    ax.legend(fontsize=7)
    return finish_figure(fig, path, owned, dpi=100)
