"""The flat potential ``U(q) = -log p(y, latents | x)`` of a model, for NUTS (a ground piece of
``models``: a model can describe its own potential without importing ``infer``).

* :class:`FlatPotential`: the potential on one flat vector of all latent sites, with its value and
  gradient in one call (``from_log_density`` builds one from any log density with autograd);
* :func:`mlp_regression_potential`: MLP regression (BNN, BNN+LV) with a hand-written backward
  pass, and its compiled twin from the C++ core (:func:`pyro_bnnlv._compiled.nuts_extension`);
* :func:`mlp_classification_potential`: the same for MLP classifiers (categorical or Bernoulli
  likelihood; only the likelihood term and its gradient ``dL/df`` differ).

:mod:`pyro_bnnlv.infer.mcmc.nuts` runs NUTS on these (and re-exports both names).
"""

from __future__ import annotations

import logging
import math
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .._compiled import resolve_nuts_extension as resolve_extension
from .._mlp_kernels import mlp_loss_kernel, mlp_squared_error_kernel
from ..nets import MLP, MLP_ACTIVATION_MODULES, ModuleNet, equivalent_mlp, mlp_call, mlp_mismatch
from .likelihoods import Likelihood, as_likelihood

__all__ = ["FlatPotential", "mlp_classification_potential", "mlp_of", "mlp_regression_potential"]

_log = logging.getLogger("pyro_bnnlv")

#: the notices :func:`mlp_of` gave in this process (each is said once)
_SAID: set[str] = set()

#: a gradient of the autograd potential of a ModuleNet against the compiled one of the same MLP
_MODULENET_SLOWDOWN = "10-30x"


def mlp_of(net: Any) -> MLP | None:
    """The :class:`~pyro_bnnlv.nets.MLP` whose hand-written (compiled) NUTS potential serves ``net``:
    ``net`` itself; the :func:`~pyro_bnnlv.nets.equivalent_mlp` of a :class:`~pyro_bnnlv.nets.ModuleNet`
    (the same function of the same weight vector, so the same potential; said once per process on
    stderr and the ``pyro_bnnlv`` logger); or ``None``, autograd through ``net`` (a ``ModuleNet``
    warns once per process, naming why it has no equivalent MLP)."""
    if isinstance(net, MLP):
        return net
    if not isinstance(net, ModuleNet):
        return None
    mlp = equivalent_mlp(net)
    if mlp is not None:
        msg = (
            f"pyro_bnnlv: NUTS: this ModuleNet is {mlp_call(mlp)} on the same weight vector: NUTS uses "
            f"that MLP's compiled potential ({_MODULENET_SLOWDOWN} faster than autograd through the module)"
        )
        if msg not in _SAID:
            _SAID.add(msg)
            _log.info(msg)
            print(msg, file=sys.stderr, flush=True)
        return mlp
    _, reason = mlp_mismatch(net.module)
    if not reason:  # an MLP's module with other in/out widths than the ModuleNet's
        reason = f"its widths differ from the ModuleNet's ({net.in_features} -> {net.out_features})"
    msg = (
        f"NUTS: this ModuleNet has no compiled potential ({reason}), so NUTS evaluates it by "
        f"autograd through the module, {_MODULENET_SLOWDOWN} slower per leapfrog step than a pb.MLP; an "
        f"nn.Sequential of biased nn.Linear layers and one activation of pb.MLP's ({MLP_ACTIVATION_MODULES}) "
        "gets the MLP's (pb.nets.equivalent_mlp)"
    )
    if msg not in _SAID:
        _SAID.add(msg)
        warnings.warn(msg, UserWarning, stacklevel=3)
    return None


_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


# -- the flat potential ------------------------------------------------------------------------
class _ValueAndGrad(torch.autograd.Function):
    """``U(q)`` as an autograd node whose backward returns the precomputed ``dU/dq``."""

    @staticmethod
    def forward(ctx, q: Tensor, fn: Callable) -> Tensor:  # type: ignore[override]
        u, g = fn(q.detach())
        ctx.save_for_backward(g)
        return torch.as_tensor(u, dtype=q.dtype)

    @staticmethod
    def backward(ctx, grad_u: Tensor):  # type: ignore[override]
        (g,) = ctx.saved_tensors
        return grad_u * g, None


@dataclass
class FlatPotential:
    r"""The potential ``U(q) = -log p(y, latents | x)`` on one flat vector of all latent sites.

    Args:
        sites: ``{site name: event shape}`` of the model's (unconstrained) latent sites. The flat
            vector ``q`` concatenates the sites in *sorted name order* (Pyro orders its mass
            matrix the same way), each flattened row-major.
        value_and_grad: ``q (D,) -> (U(q), dU/dq (D,))`` with ``U`` a Python float or a 0-dim
            tensor. It is called with tensors that do not require grad, under
            ``torch.no_grad()``; it must return a fresh gradient tensor (not a buffer it will
            overwrite).
        compiled: optional compiled twin of ``value_and_grad`` that :class:`FlatNUTS`'s compiled
            tree calls without going through Python (a ``MLPPotential`` of
            :func:`pyro_bnnlv._compiled.nuts_extension`); ``None`` for potentials written in Python.
            Assigning a new ``value_and_grad`` (a wrapper, a tempered potential, ...) resets it
            to ``None``, so the compiled tree never bypasses the replacement.

    ``potential_fn`` is the same potential in Pyro's dict form, differentiable by autograd (its
    backward returns the precomputed gradient), for ``NUTS(potential_fn=...)`` and for checks.
    """

    sites: dict[str, torch.Size]
    value_and_grad: Callable[[Tensor], tuple[Tensor, Tensor]]
    compiled: Any = None
    sizes: dict[str, int] = field(init=False)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "value_and_grad" and "compiled" in self.__dict__:
            object.__setattr__(self, "compiled", None)
        object.__setattr__(self, name, value)

    def __post_init__(self) -> None:
        if not self.sites:
            raise ValueError("sites must name at least one latent site")
        self.sites = {k: torch.Size(self.sites[k]) for k in sorted(self.sites)}
        self.sizes = {k: int(math.prod(s)) for k, s in self.sites.items()}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.sites)

    @property
    def dim(self) -> int:
        return sum(self.sizes.values())

    def pack(self, params: Mapping[str, Tensor]) -> Tensor:
        """``{site: value}`` -> flat ``q`` (one site: a view, no copy)."""
        missing = [k for k in self.sites if k not in params]
        if missing:
            raise ValueError(f"params lack sites {missing}; expected {list(self.sites)}")
        for k, shape in self.sites.items():
            if params[k].shape != shape:
                raise ValueError(f"site {k!r} has shape {tuple(params[k].shape)}, expected {tuple(shape)}")
        if len(self.sites) == 1:
            return params[self.names[0]].reshape(-1)
        return torch.cat([params[k].reshape(-1) for k in self.sites])

    def unpack(self, q: Tensor) -> dict[str, Tensor]:
        """Flat ``q`` -> ``{site: view of q}``."""
        out, pos = {}, 0
        for k, shape in self.sites.items():
            n = self.sizes[k]
            out[k] = q[pos : pos + n].view(shape)
            pos += n
        return out

    def __call__(self, q: Tensor) -> tuple[Tensor, Tensor]:
        """``(U(q), dU/dq)`` for a flat ``q`` (any grad mode), ``U`` as a 0-dim tensor."""
        with torch.no_grad():
            u, g = self.value_and_grad(q.detach())
        return torch.as_tensor(u, dtype=q.dtype), g

    def potential_fn(self, params: Mapping[str, Tensor]) -> Tensor:
        """Pyro's form: ``{site: value}`` -> ``U``, differentiable w.r.t. the values."""
        return _ValueAndGrad.apply(self.pack(params), self.value_and_grad)

    @classmethod
    def from_log_density(
        cls, sites: Mapping[str, Sequence[int]], log_density: Callable[[dict[str, Tensor]], Tensor]
    ) -> "FlatPotential":
        """A potential from ``log_density({site: value}) = log p(y, latents | x)`` (with constants).

        The gradient is computed by ``torch.autograd``; ``log_density`` must be written on plain
        tensors (no ``pyro.sample``), which is what makes it fast.
        """
        pot = cls(dict(sites), lambda q: (q.new_zeros(()), q))  # placeholder, replaced below

        def value_and_grad(q: Tensor) -> tuple[Tensor, Tensor]:
            with torch.enable_grad():
                q = q.detach().requires_grad_(True)
                u = -log_density(pot.unpack(q))
                (g,) = torch.autograd.grad(u, q)
            return u.detach(), g

        pot.value_and_grad = value_and_grad
        return pot


class _RegressionTerms(NamedTuple):
    """The checked constants of :func:`mlp_regression_potential`'s ``U``."""

    Y: Tensor  # (N, L) targets in x's dtype
    sigma: float
    loc: Tensor  # (P,) prior mean
    prec: Tensor  # (P,) prior precision
    const: float  # every normalising constant of U
    sites: dict[str, tuple[int, ...]]
    zprec: Tensor | None  # (K,) latent prior precision, None without latents


def _regression_terms(
    net: Any,
    x: Tensor,
    y: Tensor,
    prior_loc: Tensor | float,
    prior_scale: Tensor | float,
    noise_scale: Tensor | float,
    latent_dim: int,
    latent_scale: Tensor | float,
) -> _RegressionTerms:
    """:func:`mlp_regression_potential`'s argument checks and constants."""
    if not isinstance(net, MLP):
        raise TypeError(f"net must be a pyro_bnnlv MLP, got {type(net).__name__}")
    if not isinstance(latent_dim, int) or latent_dim < 0:
        raise ValueError(f"latent_dim must be a non-negative integer, got {latent_dim!r}")
    dtype = x.dtype
    N, K, L, P = x.shape[0], latent_dim, net.out_features, net.num_weights
    D = net.in_features - K
    if x.dim() != 2 or x.shape[1] != D:
        raise ValueError(f"x must have shape (N, {D}) (net.in_features - latent_dim); got {tuple(x.shape)}")
    if y.shape[0] != N or y.reshape(N, -1).shape[1] != L:
        raise ValueError(f"y must have shape ({N},) or ({N}, {L}); got {tuple(y.shape)}")
    Y = y.detach().reshape(N, L).to(dtype)
    sigma = float(torch.as_tensor(noise_scale).detach())
    if not sigma > 0:
        raise ValueError(f"noise_scale must be positive, got {sigma}")
    loc, prec, prior_const = _prior_terms(P, dtype, prior_loc, prior_scale)
    const = N * L * (math.log(sigma) + _LOG_SQRT_2PI) + prior_const
    sites: dict[str, tuple[int, ...]] = {"w": (P,)}
    if K:
        zscale = torch.as_tensor(latent_scale, dtype=dtype).detach().expand(K).clone()
        if (zscale <= 0).any():
            raise ValueError("latent_scale must be positive")
        zprec = zscale.pow(-2)
        const += N * (float(zscale.log().sum()) + K * _LOG_SQRT_2PI)
        sites["z"] = (N, K)
    return _RegressionTerms(Y, sigma, loc, prec, const, sites, zprec if K else None)


def mlp_regression_potential(
    net: Any,
    x: Tensor,
    y: Tensor,
    *,
    prior_loc: Tensor | float = 0.0,
    prior_scale: Tensor | float = 1.0,
    noise_scale: Tensor | float = 0.1,
    latent_dim: int = 0,
    latent_scale: Tensor | float = 1.0,
    compiled: bool | None = None,
) -> FlatPotential:
    r"""Fast potential of MLP regression, with a hand-written backward pass.

    .. math::

        U(w, z) = -\sum_n \log\mathcal N(y_n; f([x_n, z_n]; w), \sigma^2 I)
                  - \log\mathcal N(w; m, \operatorname{diag}(s^2))
                  - \sum_n \log\mathcal N(z_n; 0, \sigma_z^2 I_K)

    with the ``z`` terms only when ``latent_dim = K > 0`` (BNN+LV; the network input is
    ``[x, z]``). Sites ``{"w": (P,)}`` or ``{"w": (P,), "z": (N, K)}``. The network's part is
    the kernel :func:`~pyro_bnnlv._mlp_kernels.mlp_squared_error_kernel` (views of two
    preallocated buffers, weights in, gradient out; no autograd graph).

    Args:
        net: an :class:`~pyro_bnnlv.nets.MLP` (``in_features = D + K``).
        x: ``(N, D)`` inputs; y: ``(N,)`` or ``(N, L)`` targets.
        prior_loc, prior_scale: prior mean and standard deviation of ``w`` (scalars or ``(P,)``).
        noise_scale: observation noise ``sigma`` (scalar).
        latent_dim, latent_scale: ``K`` and ``sigma_z`` (scalar or ``(K,)``) of the latent inputs.
        compiled: use the C++ twin of this function (:func:`pyro_bnnlv._compiled.nuts_extension`, same
            operations, faster (``pyro-bnnlv bench nuts`` times both), built on first use):
            ``None`` (default) when it builds, ``True`` to require it (error otherwise),
            ``False`` for the Python code.
    """
    K = latent_dim
    Y, sigma, loc, prec, const, sites, zprec = _regression_terms(
        net, x, y, prior_loc, prior_scale, noise_scale, latent_dim, latent_scale
    )
    dtype, N, P = x.dtype, x.shape[0], net.num_weights
    D = net.in_features - K
    has_loc = bool((loc != 0).any())

    inv_var = 1.0 / sigma**2
    row = net.activation_row  # value, hand-written backward, C++ code (_mlp_kernels.ACTIVATION_TABLE)
    if K:
        xin = torch.cat([x.detach().to(dtype), torch.zeros(N, K, dtype=dtype)], dim=1)
        z_in = xin[:, D:]
    else:
        xin = x.detach().to(dtype)
    buf, gbuf, squared_error = mlp_squared_error_kernel(net.layers, row, xin, Y)
    if K:
        fan_in0, fan_out0, w_sl0, _ = net.layers[0]
        W0z = buf[w_sl0].view(fan_out0, fan_in0)[:, D:]  # (H, K) weights acting on z

    def value_and_grad(q: Tensor) -> tuple[float, Tensor]:
        # The backward pass runs on the residual r = f - y; the 1/sigma^2 is applied once at the
        # end (the weight gradient is linear in it), which saves an operation per call.
        if K:
            w, z = q[:P], q[P:].view(N, K)
            z_in.copy_(z)
        else:
            w = q
        buf.copy_(w)
        sse, delta = squared_error()
        u = 0.5 * inv_var * sse
        d = w - loc if has_loc else w
        pd = prec * d
        u += 0.5 * torch.dot(pd, d).item() + const
        gw = torch.add(pd, gbuf, alpha=inv_var)
        if not K:
            return u, gw
        zp = z * zprec
        gz = torch.addmm(zp, delta, W0z, alpha=inv_var)
        u += 0.5 * torch.dot(zp.view(-1), z.reshape(-1)).item()
        return u, torch.cat([gw, gz.view(-1)])

    terms = (loc, prec, has_loc, inv_var, const, K, zprec if K else torch.ones(0, dtype=dtype))
    return _with_compiled_twin(compiled, sites, value_and_grad, net, xin, Y, terms, "gaussian")


def _with_compiled_twin(
    compiled: bool | None,
    sites: dict,
    value_and_grad: Callable,
    net: MLP,
    xin: Tensor,
    Y: Tensor,
    terms: tuple,
    lik: str,
) -> FlatPotential:
    """``FlatPotential(sites, value_and_grad)``, or the compiled ``MLPPotential`` of the same
    ``terms`` (``loc, prec, has_loc, inv_var, const, latent_dim, zprec``) and likelihood ``lik``
    when :func:`~pyro_bnnlv._compiled.resolve_nuts_extension` gives the C++ core."""
    ext = resolve_extension(compiled)
    if ext is None:
        return FlatPotential(sites, value_and_grad)
    layers = [(fi, fo, w_sl.start, b_sl.start) for fi, fo, w_sl, b_sl in net.layers]
    core = ext.MLPPotential(xin, Y, layers, net.activation_row.code, *terms, _LIKELIHOOD_CODES[lik])
    return FlatPotential(sites, core.value_and_grad, compiled=core)


# -- classification ----------------------------------------------------------------------------
#: the ``likelihood`` code of the compiled ``MLPPotential`` (``enum Likelihood`` in _flat_nuts.cpp)
_LIKELIHOOD_CODES = {"gaussian": 0, "categorical": 1, "bernoulli": 2}


def _prior_terms(
    P: int, dtype: torch.dtype, prior_loc: Tensor | float, prior_scale: Tensor | float
) -> tuple[Tensor, Tensor, float]:
    """``(loc (P,), prec (P,), const)`` of the prior ``N(w; m, diag(s^2))``, ``const`` its
    normalising constant ``sum log s + P log sqrt(2 pi)``."""
    scale = torch.as_tensor(prior_scale, dtype=dtype).detach().expand(P).clone()
    loc = torch.as_tensor(prior_loc, dtype=dtype).detach().expand(P).clone()
    if (scale <= 0).any():
        raise ValueError("prior_scale must be positive")
    return loc, scale.pow(-2), float(scale.log().sum()) + P * _LOG_SQRT_2PI


def _cross_entropy_head(
    name: str, labels: Tensor, K: int, dtype: torch.dtype
) -> tuple[Callable[[Tensor], tuple[float, Tensor]], Tensor]:
    """The head ``f (N, K) -> (E, dE/df)`` of :func:`~pyro_bnnlv._mlp_kernels.mlp_loss_kernel` for
    the cross-entropy ``E = -sum_n log p(y_n | f_n)`` (``name``: ``"categorical"`` or
    ``"bernoulli"``), and the targets as an ``(N, K)`` matrix of ``dtype`` (one-hot rows;
    Bernoulli: the 0/1 column) for the compiled twin."""
    N = labels.shape[0]
    if name == "bernoulli":
        Y = labels.to(dtype).reshape(N, 1)

        def bernoulli(f: Tensor) -> tuple[float, Tensor]:
            # -log p = softplus(f) - y f = max(f, 0) - y f + log1p(exp(-|f|)) (torch's, as Pyro's)
            e = torch.nn.functional.binary_cross_entropy_with_logits(f, Y, reduction="sum")
            return e.item(), torch.sigmoid(f).sub_(Y)  # sigmoid(f) - y

        return bernoulli, Y
    idx = labels.long().reshape(N, 1)
    onehot = torch.zeros(N, K, dtype=dtype).scatter_(1, idx, 1.0)

    def categorical(f: Tensor) -> tuple[float, Tensor]:
        logp = torch.log_softmax(f, 1)  # f - logsumexp(f), the log-sum-exp shifted by max_k f
        e = -logp.gather(1, idx).sum().item()
        return e, logp.exp_().sub_(onehot)  # softmax(f) - onehot(y)

    return categorical, onehot


def mlp_classification_potential(
    net: Any,
    x: Tensor,
    y: Tensor,
    *,
    prior_loc: Tensor | float = 0.0,
    prior_scale: Tensor | float = 1.0,
    likelihood: str | Likelihood = "categorical",
    compiled: bool | None = None,
) -> FlatPotential:
    r"""Fast potential of an MLP classifier, with a hand-written backward pass.

    .. math::

        U(w) = -\sum_n \log p(y_n \mid f(x_n; w)) - \log\mathcal N(w; m, \operatorname{diag}(s^2))

    with, for the categorical likelihood over ``K`` logits (cross-entropy of the softmax),

    .. math::

        -\log p(y_n \mid f_n) = \log\sum_k e^{f_{nk}} - f_{n y_n},
        \qquad \frac{\partial}{\partial f_n} = \operatorname{softmax}(f_n) - e_{y_n}

    (``e_{y_n}`` the one-hot row of the label; the log-sum-exp is shifted by ``max_k f_nk``) and,
    for the Bernoulli likelihood on one logit,

    .. math::

        -\log p(y_n \mid f_n) = \log(1 + e^{f_n}) - y_n f_n
                              = \max(f_n, 0) - y_n f_n + \log(1 + e^{-|f_n|}),
        \qquad \frac{\partial}{\partial f_n} = \sigma(f_n) - y_n .

    The gradient in ``w`` is ``dL/df`` pulled back through the network by the same hand-written
    backward pass as :func:`mlp_regression_potential`'s (:func:`~pyro_bnnlv._mlp_kernels.mlp_loss_kernel`),
    plus the prior's ``diag(s^-2) (w - m)``. Site ``{"w": (P,)}``; ``U`` includes every
    normalising constant, so it equals the traced potential of
    ``pb.BNN(net, prior_scale=s, likelihood=...)``.

    Args:
        net: an :class:`~pyro_bnnlv.nets.MLP` with ``K`` outputs (categorical, ``K >= 2``) or one
            (Bernoulli).
        x: ``(N, D)`` inputs; y: ``(N,)`` labels, integers ``0..K-1`` (Bernoulli: 0/1 as
            integers, bools or floats).
        prior_loc, prior_scale: prior mean and standard deviation of ``w`` (scalars or ``(P,)``).
        likelihood: ``"categorical"`` or ``"bernoulli"`` (or a classification
            :class:`~pyro_bnnlv.models.likelihoods.Likelihood`).
        compiled: use the C++ twin (the ``MLPPotential`` of
            :func:`pyro_bnnlv._compiled.nuts_extension` with its cross-entropy term): ``None``
            (default) when it builds, ``True`` to require it (error otherwise), ``False`` for the
            Python code.
    """
    if not isinstance(net, MLP):
        raise TypeError(f"net must be a pyro_bnnlv MLP, got {type(net).__name__}")
    lik = as_likelihood(likelihood)
    if not lik.classification:
        raise ValueError(
            f"likelihood must be 'categorical' or 'bernoulli', got {lik.name!r} (regression: mlp_regression_potential)"
        )
    dtype = x.dtype
    N, D, K, P = x.shape[0], net.in_features, net.out_features, net.num_weights
    lik.check_outputs(K)
    if x.dim() != 2 or x.shape[1] != D:
        raise ValueError(f"x must have shape (N, {D}) (net.in_features); got {tuple(x.shape)}")
    if y.shape[0] != N:
        raise ValueError(f"x and y have different numbers of rows: {N} vs {y.shape[0]}")
    lik.check_targets(y, K)
    loc, prec, const = _prior_terms(P, dtype, prior_loc, prior_scale)
    has_loc = bool((loc != 0).any())
    head, Y = _cross_entropy_head(lik.name, lik.observed(y.detach(), K), K, dtype)
    row = net.activation_row
    xin = x.detach().to(dtype)
    buf, gbuf, cross_entropy = mlp_loss_kernel(net.layers, row, xin, head)

    def value_and_grad(q: Tensor) -> tuple[float, Tensor]:
        buf.copy_(q)
        ce, _ = cross_entropy()
        d = q - loc if has_loc else q
        pd = prec * d
        u = ce + 0.5 * torch.dot(pd, d).item() + const
        return u, torch.add(pd, gbuf)

    terms = (loc, prec, has_loc, 1.0, const, 0, torch.ones(0, dtype=dtype))
    return _with_compiled_twin(compiled, {"w": (P,)}, value_and_grad, net, xin, Y, terms, lik.name)
