r"""Linearised and sampled Laplace approximations with the Gauss-Newton (GGN) curvature.

Foong, Li, Hernández-Lobato & Turner (2019), arXiv:1906.11537, sec. 2 and App. A. For a model
``y_n ~ N(f(x_n; w), sigma^2 I_L)``, ``w ~ N(0, diag(1/p))`` (:class:`~pyro_bnnlv.models.BNN`) and
a MAP weight vector ``w*`` (:func:`~pyro_bnnlv.infer.svi.train_map`), the Laplace approximation
is ``q(w) = N(w*, Sigma)`` with the GGN posterior precision (sec. 2)

.. math::

    \Sigma^{-1} = H = \frac{1}{\sigma^2} \sum_{n=1}^N J_n^\top J_n + \operatorname{diag}(p),
    \qquad J_n = \frac{\partial f(x_n; w)}{\partial w}\Big|_{w^*} \in \mathbb R^{L \times P}.

Linearising ``f(x; w) ~ f(x; w*) + J(x)(w - w*)`` (App. A, eq. 2) makes the model linear-Gaussian,
with the predictive (App. A; "linearised Laplace", LL)

.. math::

    p(y^* \mid x^*, \mathcal D) \approx
    \mathcal N\big(y^*;\ f(x^*; w^*),\ \sigma^2 I_L + J(x^*)\, \Sigma\, J(x^*)^\top\big).

Using ``q`` as a posterior over the non-linear network and averaging the likelihood over samples
(sec. 2, eq. 1) is "sampled Laplace" (SL): :meth:`LinearizedLaplace.as_guide`.

Curvature structures (``structure=``):

* ``"full"``: the ``P x P`` matrix ``H``; memory ``O(P^2)``, a Cholesky ``O(P^3)``.
* ``"diag"``: only the diagonal of ``H`` (``q`` mean-field); memory ``O(P)``.
* ``"last_layer"``: the full ``H`` of the ``K`` last-layer weights (output weights and biases),
  every other weight fixed at ``w*``; memory ``O(K^2)`` with ``K = L (H_last + 1)``, independent of
  the rest of the network. ``f`` is linear in these weights, so the linearisation is exact and
  the Laplace posterior is Bayesian linear regression on the last hidden layer's features
  (App. B's "BLR"); it stays narrow in a gap between clusters of data: for in-between
  uncertainty use ``"full"`` or ``"kfac"`` (docs/design-notes.md, 'infer.laplace.linearized').
* ``"kfac"``: per layer (``nn.Linear`` / ``nn.Conv2d`` of a ModuleNet) a Kronecker product
  ``G_l (x) A_l`` of an output-side and an input-side factor (K-FAC; KFC for convolutions),
  layers independent: memory ``O(sum_l out_l^2 + in_l^2)``; the normalisation, the prior and the
  eigenbasis are in :mod:`pyro_bnnlv.infer.laplace.kfac`. :meth:`LinearizedLaplace.kfac_factors`
  gives the factors, :meth:`LinearizedLaplace.dense_precision` the ``P x P`` matrix they stand
  for (small networks, tests).

Jacobians: an :class:`~pyro_bnnlv.nets.MLP`'s in one batched sweep
(:func:`pyro_bnnlv._mlp_kernels.mlp_jacobian`), any other :class:`~pyro_bnnlv.nets.FlatNet`'s by
``torch.func.vmap(torch.func.jacrev(...))``; in chunks of ``chunk_size`` data points (working
memory ``O(chunk_size L P)`` besides the curvature).

Classification (a :class:`~pyro_bnnlv.models.BNN` with ``likelihood="categorical"`` or
``"bernoulli"``): the GGN of the likelihood (Immer, Korzepa & Bauer 2021, arXiv:2008.08400, eq. 4-5)

.. math::

    H = \sum_{n=1}^N J_n^\top \Lambda_n J_n + \operatorname{diag}(p), \qquad
    \Lambda_n = -\nabla^2_f \log p(y_n \mid f)\big|_{f(x_n; w^*)}
    = \operatorname{diag}(\pi_n) - \pi_n \pi_n^\top \ (\text{softmax } \pi_n),

the linearised predictive over the logits ``f* ~ N(f(x*; w*), J Sigma J^T)`` pushed through the
softmax by Monte Carlo (``link_approx="mc"``, default) or the probit approximation (``"probit"``:
``softmax(f_k / sqrt(1 + pi/8 Var f_k))``, MacKay 1992; Immer et al. 2021, sec. 3) and the log
marginal likelihood with ``log p(D | w*)`` the MAP's log-likelihood; there is no noise to tune.

Hyper-parameters (:meth:`LinearizedLaplace.optimize_hyperparameters`): a common factor ``delta``
on the prior precisions (``p = delta p_0``, ``p_0`` the model's ``1 / prior_scale^2``, so a
fan-in-scaled prior keeps its shape) and the noise ``sigma``, chosen by

* ``method="marglik"`` (**default**): maximising the Laplace approximation of the log marginal
  likelihood (MacKay 1992) at the fixed ``w*``,

  .. math::

      \log p(\mathcal D) \approx \log p(\mathcal D \mid w^*) + \log p(w^*)
      + \tfrac P2 \log 2\pi - \tfrac12 \log\det H
      = \log p(\mathcal D\mid w^*) - \tfrac12 \sum_i p_i w_i^{*2}
        + \tfrac12 \sum_i \log p_i - \tfrac12 \log \det H;

* ``method="validation"``: a grid search maximising the linearised predictive's average
  log-likelihood on validation data (the protocol of the paper's App. D, which grid-searched
  ``omega`` on a 10% validation split).

Both reuse one eigendecomposition of ``diag(p_0)^{-1/2} G diag(p_0)^{-1/2}`` (``G = sum_n J_n^T
J_n``), so a candidate ``(delta, sigma)`` costs ``O(P)`` (marglik) or ``O(N_valid L P)``.
Computation in ``dtype`` (float64 default); a failed Cholesky of ``H`` is retried with a jitter
``10^k * 1e-10 * mean(diag H)``, kept in :attr:`LinearizedLaplace.jitter` (``RuntimeWarning``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd
import torch
from torch import Tensor

from ..._checks import POSITIVE_NUMBERS, as_number_tensor, check_int
from ..._mlp_kernels import mlp_jacobian
from . import kfac as _kfac
from .guide import LaplaceGuide
from ...nets import MLP, FlatNet, ModuleNet
from ...models.bnn import BNN
from ...models.likelihoods import Gaussian
from ...stats.classification import classification_metrics
from ...stats.predictive import predictive_metrics
from ...protocols import LatentModel, NetworkModel

__all__ = ["STRUCTURES", "LaplacePredictive", "LinearizedLaplace", "last_layer_indices", "network_jacobian"]

Structure = Literal["full", "diag", "last_layer", "kfac"]
STRUCTURES = ("full", "diag", "last_layer", "kfac")
_DENSE_LIMIT = 8192  # kfac: the largest P for which posterior_precision / _covariance build P x P
_LOG2PI = math.log(2 * math.pi)


# -- Jacobians ---------------------------------------------------------------------------------
def last_layer_indices(net: FlatNet) -> Tensor:
    """Indices in the flat ``w`` of the last layer's weights and biases (a
    :class:`~pyro_bnnlv.nets.ModuleNet`'s: of the submodule owning its last parameter)."""
    if isinstance(net, MLP):
        _, _, w_sl, b_sl = net.layers[-1]
        return torch.arange(w_sl.start, b_sl.stop)
    if isinstance(net, ModuleNet):
        slices = net.param_slices()
        owner = next(reversed(slices)).rpartition(".")[0]
        return torch.cat([torch.arange(sl.start, sl.stop) for n, sl in slices.items() if n.rpartition(".")[0] == owner])
    raise ValueError(f"cannot tell the last layer of a {type(net).__name__}; pass subset_indices= explicitly")


def _mlp_first_layer(net: MLP, indices: Tensor | None) -> int | None:
    """Layer ``k`` such that ``indices`` are exactly the weights of layers ``k..end``, else None."""
    if indices is None:
        return 0
    for k, (_, _, w_sl, _) in enumerate(net.layers):
        if indices.numel() == net.num_weights - w_sl.start and torch.equal(
            indices, torch.arange(w_sl.start, net.num_weights)
        ):
            return k
    return None


def _mlp_jacobian(net: MLP, x: Tensor, w: Tensor, first: int) -> tuple[Tensor, Tensor]:
    """``J (N, L, K)`` over the weights of layers ``first..end`` and ``f (N, L)`` for an MLP
    (the kernel :func:`~pyro_bnnlv._mlp_kernels.mlp_jacobian`)."""
    net.check_weights(w)
    return mlp_jacobian(net.layers, net.activation_row, x, w, first)


def _func_jacobian(net: FlatNet, x: Tensor, w: Tensor, indices: Tensor | None) -> tuple[Tensor, Tensor]:
    """``J (N, L, K)`` and ``f (N, L)`` by ``vmap(jacrev)`` over the data points (any FlatNet)."""
    from torch.func import jacrev, vmap

    if indices is None:

        def f1(xi: Tensor, ww: Tensor) -> tuple[Tensor, Tensor]:
            out = net(xi.unsqueeze(0), ww).squeeze(0)
            return out, out

        return vmap(jacrev(f1, argnums=1, has_aux=True), in_dims=(0, None))(x, w)
    base = w.detach()

    def f2(xi: Tensor, ws: Tensor) -> tuple[Tensor, Tensor]:
        out = net(xi.unsqueeze(0), base.index_put((indices,), ws)).squeeze(0)
        return out, out

    return vmap(jacrev(f2, argnums=1, has_aux=True), in_dims=(0, None))(x, w[indices])


def network_jacobian(
    net: FlatNet, x: Tensor, w: Tensor, *, indices: Tensor | None = None, method: str = "auto"
) -> tuple[Tensor, Tensor]:
    """Jacobian of the network output with respect to (a subset of) the flat weights.

    Args:
        net: the network; ``x (N, D)``; ``w (P,)``.
        indices: differentiate with respect to ``w[indices]`` only (default: all ``P`` weights).
        method: ``"auto"`` (the MLP sweep where it applies, else ``torch.func``), ``"mlp"`` or
            ``"func"`` (``vmap(jacrev)``).

    Returns:
        ``J (N, L, K)`` with ``J[n, l, k] = d f_l(x_n; w) / d w[indices[k]]`` and ``f (N, L)``.
    """
    net.check_input(x)
    net.check_weights(w)
    if w.dim() != 1:
        raise ValueError(f"w must have shape (P,); got {tuple(w.shape)}")
    if method not in ("auto", "mlp", "func"):
        raise ValueError(f"method must be 'auto', 'mlp' or 'func', got {method!r}")
    first = _mlp_first_layer(net, indices) if isinstance(net, MLP) else None
    if method == "mlp" and first is None:
        raise ValueError("method='mlp' needs an MLP and indices=None or the weights of its last layers")
    if method != "func" and first is not None:
        return _mlp_jacobian(net, x, w, first)
    return _func_jacobian(net, x, w, indices)


# -- the Gaussian predictive -------------------------------------------------------------------
@dataclass
class LaplacePredictive:
    """Linearised-Laplace predictive ``N(mean, f_cov + noise_var I)`` at ``N`` inputs.

    ``mean (N, L)`` is ``f(x; w*)``; ``f_cov (N, L, L)`` is ``J Sigma J^T``, the covariance of the
    function values (the error bars of the paper's figures); ``noise_var`` is ``sigma^2``.
    """

    mean: Tensor
    f_cov: Tensor
    noise_var: Tensor

    @property
    def f_var(self) -> Tensor:
        """Variance of ``f`` per output, ``(N, L)``."""
        return self.f_cov.diagonal(dim1=-2, dim2=-1)

    @property
    def var(self) -> Tensor:
        """Predictive variance of ``y`` per output (``f_var + sigma^2``), ``(N, L)``."""
        return self.f_var + self.noise_var

    @property
    def cov(self) -> Tensor:
        """Predictive covariance of ``y``, ``(N, L, L)``."""
        eye = torch.eye(self.f_cov.shape[-1], dtype=self.f_cov.dtype)
        return self.f_cov + self.noise_var * eye

    def log_prob(self, y: Tensor) -> Tensor:
        """Predictive log density per point, ``y (N,)`` or ``(N, L)`` -> ``(N,)``."""
        y = y.reshape(self.mean.shape).to(self.mean.dtype)
        if self.mean.shape[-1] == 1:
            var = self.var[:, 0]
            return -0.5 * ((y[:, 0] - self.mean[:, 0]).square() / var + var.log() + _LOG2PI)
        return torch.distributions.MultivariateNormal(self.mean, self.cov).log_prob(y)


# -- the Laplace approximation -----------------------------------------------------------------
def _model_dtype(model: Any) -> torch.dtype:
    """The model's floating dtype (that of its prior scale buffer; ``model.double()`` changes it)."""
    scale = torch.as_tensor(model.prior_scale)
    return scale.dtype if scale.is_floating_point() else torch.get_default_dtype()


def _as_tensor(value: Any, name: str, dtype: torch.dtype) -> Tensor:
    """``value`` as a detached ``dtype`` tensor; strings, bools and other non-numbers are refused
    naming ``name``."""
    return as_number_tensor(value, name, dtype, POSITIVE_NUMBERS).detach().clone()


def _as_vector(value: Any, P: int, name: str, dtype: torch.dtype) -> Tensor:
    t = _as_tensor(value, name, dtype)
    if t.dim() == 0:
        t = t.expand(P).clone()
    if t.shape != (P,):
        raise ValueError(f"{name} must be a scalar or have shape ({P},); got {tuple(t.shape)}")
    if not (torch.isfinite(t).all() and (t > 0).all()):
        raise ValueError(f"{name} must be positive and finite")
    return t


def _as_positive_scalar(value: Any, name: str, dtype: torch.dtype) -> Tensor:
    t = _as_tensor(value, name, dtype)
    if t.dim() != 0 or not torch.isfinite(t) or t <= 0:
        raise ValueError(f"{name} must be a positive finite scalar, got {value!r}")
    return t


class LinearizedLaplace:
    """Linearised (and sampled) Laplace approximation of a BNN posterior around a MAP network.

    Args:
        model: a :class:`~pyro_bnnlv.models.BNN` (anything exposing ``net``, ``prior_scale`` and
            ``noise_scale``).
        w_map: the MAP weights ``(P,)`` (:func:`~pyro_bnnlv.infer.svi.train_map`).
        structure: ``"full"``, ``"diag"``, ``"last_layer"`` or ``"kfac"`` (module docstring).
        prior_precision: ``p``, scalar or ``(P,)``; default ``1 / model.prior_scale^2``. For
            ``"kfac"`` it must factor on each layer (:func:`~pyro_bnnlv.infer.laplace.kfac.prior_factors`).
        noise_scale: ``sigma``; default ``model.noise_scale``.
        subset_indices: for ``"last_layer"``, the weights to treat as Gaussian (default
            :func:`last_layer_indices`).
        dtype: computation dtype (``float64`` default).
        chunk_size: data points per Jacobian chunk (default: about 4 million Jacobian entries).

    Typical use::

        w_map = pb.train_map(model, x, y, num_steps=3000)
        la = LinearizedLaplace(model, w_map).fit(x, y)
        la.optimize_hyperparameters()                 # marginal likelihood (default)
        pred = la.predictive(x_test)                  # pred.mean, pred.var, pred.f_var
        la.evaluate(x_test, y_test)                   # test LL, RMSE, PICP, MPIW
        guide = la.as_guide()                         # sampled Laplace, a Pyro guide on "w"
    """

    def __init__(
        self,
        model: NetworkModel,
        w_map: Tensor,
        *,
        structure: Structure = "full",
        prior_precision: float | Tensor | None = None,
        noise_scale: float | Tensor | None = None,
        subset_indices: Tensor | None = None,
        dtype: torch.dtype = torch.float64,
        chunk_size: int | None = None,
    ) -> None:
        if structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {STRUCTURES}, got {structure!r}")
        self.likelihood = getattr(model, "likelihood", Gaussian())
        self.classification = bool(self.likelihood.classification)
        for attr in ("net", "prior_scale") + (() if self.classification else ("noise_scale",)):
            if not hasattr(model, attr):
                raise TypeError(f"model must expose {attr!r} (a pyro_bnnlv BNN); got {type(model).__name__}")
        if isinstance(model, LatentModel):
            # BNN+LV (per-point z as extra inputs) and ProjectedBNN (w = g_phi(z)): the Laplace
            # approximation here is of p(w | D) under w ~ N(0, prior_scale^2), which is neither
            # model's posterior (train_map refuses them for the same reason)
            raise TypeError(
                f"LinearizedLaplace approximates the weight posterior of a BNN with an "
                f"N(0, prior_scale^2) prior on w; {type(model).__name__} has other latent sites "
                f"(per-point latent inputs z of a BNN+LV, or w = g_phi(z) of a ProjectedBNN), so "
                f"its posterior is not that Gaussian: use pb.fit_svi(model, guide, x, y) (e.g. "
                f"pb.MeanField(model), or AutoDelta for a MAP) or pb.run_nuts for this model"
            )
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        chunk_size = check_int(chunk_size, "chunk_size", allow_none=True)
        self.model, self.net = model, model.net
        P = self.net.num_weights
        if not isinstance(w_map, Tensor):
            raise TypeError(f"w_map must be a torch.Tensor, got {type(w_map).__name__}")
        if w_map.shape != (P,):
            raise ValueError(f"w_map must have shape ({P},) (num_weights); got {tuple(w_map.shape)}")
        if not torch.isfinite(w_map).all():
            raise ValueError("w_map contains NaN or infinite values")
        self.structure: str = structure
        self.dtype = dtype
        self.w_map = w_map.detach().to(dtype)
        if prior_precision is None:
            prior_precision = 1.0 / torch.as_tensor(model.prior_scale).detach().to(dtype).square()
        self.prior_precision = _as_vector(prior_precision, P, "prior_precision", dtype)
        if self.classification and noise_scale is not None:
            raise ValueError(f"a {self.likelihood.name} model has no observation noise: leave out noise_scale")
        if noise_scale is None:  # a classifier's GGN carries its likelihood's Hessian: sigma = 1 leaves it as is
            noise_scale = 1.0 if self.classification else torch.as_tensor(model.noise_scale).detach()
        self.noise_scale = _as_positive_scalar(noise_scale, "noise_scale", dtype)
        if structure == "last_layer":
            idx = last_layer_indices(self.net) if subset_indices is None else torch.as_tensor(subset_indices)
            idx = idx.long().reshape(-1)
            if idx.numel() == 0 or idx.min() < 0 or idx.max() >= P or idx.unique().numel() != idx.numel():
                raise ValueError(f"subset_indices must be distinct indices in [0, {P})")
            self.indices: Tensor | None = idx
        elif subset_indices is not None:
            raise ValueError("subset_indices is only used with structure='last_layer'")
        else:
            self.indices = None
        # kfac: the layers' Kronecker blocks; the prior is checked to factor on each (ValueError)
        self._layers = _kfac.kfac_layers(self.net) if structure == "kfac" else None
        if self._layers is not None:
            _kfac.prior_factors(self.prior_precision, self._layers)
        self.chunk_size = chunk_size
        self.jitter = 0.0
        self._fitted = False
        self._chol: Tensor | None = None
        self._eig: Any = None  # eigendecomposition(s) relative to the prior precision (cached)

    # -- basic quantities ----------------------------------------------------------------------
    @property
    def num_params(self) -> int:
        """Number of Gaussian weights ``K`` (``P``, or the subset size for ``last_layer``)."""
        return self.net.num_weights if self.indices is None else self.indices.numel()

    def _sub(self, v: Tensor) -> Tensor:
        return v if self.indices is None else v[self.indices]

    def _chunk(self, L: int) -> int:
        if self.chunk_size is not None:
            return self.chunk_size
        return max(1, 4_000_000 // max(1, L * self.num_params))

    def jacobian(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``J (N, L, K)`` at ``w*`` (with respect to the Gaussian weights) and ``f (N, L)``."""
        return network_jacobian(self.net, x.to(self.dtype), self.w_map, indices=self.indices)

    def _check_fitted(self) -> None:
        if not self._fitted:
            raise RuntimeError("call fit(x, y) first")

    # -- fitting ---------------------------------------------------------------------------------
    def fit(self, x: Tensor, y: Tensor) -> "LinearizedLaplace":
        """Accumulate the curvature on the training data: the Gram matrix ``G = sum_n J_n^T J_n``
        (its diagonal for ``"diag"``) and the residual sum of squares at ``w*``; for a classifier
        the GGN ``sum_n J_n^T Lambda_n J_n`` and the log-likelihood at ``w*``."""
        if hasattr(self.model, "check_data"):
            self.model.check_data(x, y)
        x = x.to(self.dtype)
        if self.structure == "kfac":
            return self._fit_kfac(x, y)
        y = self._targets(y, x.shape[0])
        K, L, N = self.num_params, self.net.out_features, x.shape[0]
        full = self.structure != "diag"
        gram = torch.zeros((K, K) if full else (K,), dtype=self.dtype)
        total = torch.zeros((), dtype=self.dtype)  # the log-likelihood, or the residual sum of squares
        step = self._chunk(L)
        with torch.no_grad():
            for start in range(0, N, step):
                J, f = self.jacobian(x[start : start + step])  # (n, L, K), (n, L)
                if self.classification:
                    LJ = self.likelihood.hessian(f) @ J  # Lambda_n J_n
                    total += self.likelihood.log_prob(f, y[start : start + step]).sum()
                else:
                    LJ = J
                    total += (y[start : start + step] - f).square().sum()
                gram += J.reshape(-1, K).T @ LJ.reshape(-1, K) if full else (J * LJ).sum((0, 1))
        if not torch.isfinite(gram).all() or not torch.isfinite(total):
            what = "log-likelihood" if self.classification else "residuals"
            raise ValueError(f"the Jacobian or the {what} at w_map are not finite")
        return self._fitted_with(gram=gram, factors=None, num_data=N, num_outputs=L, fit_total=total)

    def _targets(self, y: Tensor, n: int) -> Tensor:
        """A classifier's labels (floating ones in ``dtype``) or the ``(n, L)`` regression targets."""
        if self.classification:
            labels = self.likelihood.observed(y, self.net.out_features)
            return labels.to(self.dtype) if labels.is_floating_point() else labels
        return y.to(self.dtype).reshape(n, -1)

    def _fitted_with(self, fit_total: Tensor, **state: Any) -> "LinearizedLaplace":
        """Keep the curvature ``state`` and the fit at ``w*`` (``map_loglik``, or ``sse``)."""
        self.__dict__.update(state)
        self.map_loglik, self.sse = (fit_total, None) if self.classification else (None, fit_total)
        self._fitted = True
        self._chol, self._eig = None, None
        return self

    def _fit_kfac(self, x: Tensor, y: Tensor) -> "LinearizedLaplace":
        """K-FAC factors (:func:`~pyro_bnnlv.infer.laplace.kfac.kfac_factors`; a Gaussian's at
        ``sigma = 1``) and the residual sum of squares or the log-likelihood at ``w*``."""
        hessian = self.likelihood.hessian if self.classification else None
        factors, f = _kfac.kfac_factors(
            self.net, self._layers, x, self.w_map, hessian, self._chunk(self.net.out_features)
        )
        N, L = f.shape
        y = self._targets(y, N)
        with torch.no_grad():
            total = self.likelihood.log_prob(f, y).sum() if self.classification else (y - f).square().sum()
        if not torch.isfinite(total) or not all(
            torch.isfinite(a).all() and torch.isfinite(g).all() for a, g in factors
        ):
            raise ValueError("the K-FAC factors or the fit at w_map are not finite")
        return self._fitted_with(gram=None, factors=factors, num_data=N, num_outputs=L, fit_total=total)

    def kfac_factors(self) -> list[tuple[Tensor, Tensor]]:
        """``structure="kfac"``: per layer ``(A_l, G_l)`` with the GGN block ``~ G_l (x) A_l`` in the
        row-major order of ``[W_l | b_l]`` (``G_l`` includes ``1 / sigma^2``);
        :func:`~pyro_bnnlv.infer.laplace.kfac.kfac_layers` says where the block sits in ``w``."""
        self._check_fitted()
        if self.structure != "kfac":
            raise ValueError(f"kfac_factors needs structure='kfac'; this fit has {self.structure!r}")
        s2 = self.noise_scale.square()
        return [(A, G / s2) for A, G in self.factors]

    @property
    def kfac_layers(self) -> list[_kfac.KronLayer]:
        """The K-FAC layer blocks (``structure="kfac"``), each with its ``index`` in ``w``."""
        if self._layers is None:
            raise ValueError(f"kfac_layers needs structure='kfac'; this fit has {self.structure!r}")
        return self._layers

    def dense_precision(self) -> Tensor:
        """``structure="kfac"``: the ``(P, P)`` posterior precision the factors stand for,
        ``blockdiag_l(G_l (x) A_l) + diag(p)`` in the order of ``w`` (for checks on small networks)."""
        H = torch.diag(self.prior_precision)
        for layer, (A, G) in zip(self._layers, self.kfac_factors()):
            idx = layer.index.reshape(-1)
            H[idx[:, None], idx[None, :]] += torch.kron(G, A)
        return H

    def _kfac_eigen(self) -> list[_kfac.KronEigen]:
        """Per layer eigenbasis relative to the current prior precision (cached)."""
        if self._eig is None:
            priors = _kfac.prior_factors(self.prior_precision, self._layers)
            self._eig = [_kfac.kron_eigen(A, G, do, di) for (A, G), (do, di) in zip(self.factors, priors)]
        return self._eig

    def _projected(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(B (N, L, K), f (N, L), mu (K,))``: the Jacobian in the eigenbasis relative to ``p_0``
        (``Sigma = V diag(1 / (mu / sigma^2 + delta)) V^T``, ``B = J V``) for ``"full"`` / ``"last_layer"``
        (``V = D^{-1/2} U``) and ``"kfac"`` (``V`` the layers' ``U_o (x) U_i``)."""
        if self.structure != "kfac":
            J, f = self.jacobian(x)
            mu, U = self._eigen()
            return (J * self._sub(self.prior_precision).rsqrt()) @ U, f, mu
        eig = self._kfac_eigen()
        f, inputs, grads = _kfac.layer_quantities(self.net, self._layers, x.to(self.dtype), self.w_map)
        B = torch.cat([_kfac.projected_jacobian(a, g, e) for a, g, e in zip(inputs, grads, eig)], -1)
        return B, f, torch.cat([e.lam.reshape(-1) for e in eig])

    def set_hyperparameters(
        self, *, prior_precision: float | Tensor | None = None, noise_scale: float | Tensor | None = None
    ) -> "LinearizedLaplace":
        """Change ``p`` and/or ``sigma`` (the curvature is rescaled, not recomputed)."""
        if prior_precision is not None:
            p = _as_vector(prior_precision, self.net.num_weights, "prior_precision", self.dtype)
            if self._layers is not None:
                _kfac.prior_factors(p, self._layers)
            self.prior_precision = p
            self._eig = None  # the eigendecomposition is taken relative to the prior precision
        if noise_scale is not None:
            if self.classification:
                raise ValueError(f"a {self.likelihood.name} model has no observation noise: leave out noise_scale")
            self.noise_scale = _as_positive_scalar(noise_scale, "noise_scale", self.dtype)
        self._chol = None
        return self

    @property
    def posterior_precision(self) -> Tensor:
        """``H = G / sigma^2 + diag(p)``: ``(K, K)``, or its diagonal ``(K,)`` for ``"diag"``; for
        ``"kfac"`` :meth:`dense_precision`, up to ``P = 8192`` (use :meth:`kfac_factors` beyond)."""
        self._check_fitted()
        if self.structure == "kfac":
            self._check_dense()
            return self.dense_precision()
        p = self._sub(self.prior_precision)
        s2 = self.noise_scale.square()
        if self.structure == "diag":
            return self.gram / s2 + p
        return self.gram / s2 + torch.diag(p)

    def _cholesky(self) -> Tensor:
        """Lower Cholesky factor of ``H`` (cached), with jitter if needed (module docstring)."""
        if self._chol is not None:
            return self._chol
        H = self.posterior_precision
        chol, info = torch.linalg.cholesky_ex(H)
        self.jitter = 0.0
        if info != 0:
            base = 1e-10 * H.diagonal().mean()
            for k in range(10):
                jitter = float(base * 10**k)
                chol, info = torch.linalg.cholesky_ex(H + jitter * torch.eye(H.shape[0], dtype=H.dtype))
                if info == 0:
                    self.jitter = jitter
                    warnings.warn(
                        f"posterior precision was not numerically positive definite in {self.dtype}; "
                        f"added jitter {jitter:.3g} to its diagonal (mean diagonal {float(H.diagonal().mean()):.3g})",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                    break
            else:
                raise ValueError(
                    "the posterior precision is not positive definite even with jitter "
                    f"{jitter:.3g}; check prior_precision and noise_scale, or use dtype=torch.float64"
                )
        self._chol = chol
        return chol

    @property
    def posterior_covariance(self) -> Tensor:
        """``Sigma = H^{-1}``: ``(K, K)``, or the diagonal variances ``(K,)`` for ``"diag"``."""
        if self.structure == "diag":
            return 1.0 / self.posterior_precision
        if self.structure == "kfac":
            self._check_fitted()
            self._check_dense()
            return self.as_guide(self.dtype).distribution().covariance_matrix
        return torch.cholesky_inverse(self._cholesky())

    def _check_dense(self) -> None:
        if self.net.num_weights > _DENSE_LIMIT:
            raise ValueError(
                f"structure='kfac' with P={self.net.num_weights} weights: a P x P matrix is not built "
                f"beyond P={_DENSE_LIMIT}; use kfac_factors() and kfac_layers"
            )

    # -- predictive ------------------------------------------------------------------------------
    def predictive(self, x: Tensor) -> LaplacePredictive:
        """The linearised predictive at ``x (N, D)`` (App. A), batched over the points."""
        self._check_fitted()
        self.net.check_input(x)
        if x.shape[0] == 0:
            raise ValueError("x has 0 rows: pass at least one input to predict at")
        x = x.to(self.dtype)
        L, K = self.num_outputs, self.num_params
        means, covs = [], []
        step = self._chunk(L)
        with torch.no_grad():
            if self.structure == "diag":
                sigma_diag = 1.0 / self.posterior_precision
            elif self.structure != "kfac":
                chol = self._cholesky()
            for start in range(0, x.shape[0], step):
                if self.structure == "kfac":  # Sigma in the layers' Kronecker eigenbases, never formed
                    B, f, mu = self._projected(x[start : start + step])
                    means.append(f)
                    covs.append(torch.einsum("nak,k,nbk->nab", B, 1.0 / (mu / self.noise_scale.square() + 1.0), B))
                    continue
                J, f = self.jacobian(x[start : start + step])
                n = J.shape[0]
                if self.structure == "diag":
                    cov = torch.einsum("nak,k,nbk->nab", J, sigma_diag, J)
                else:
                    A = torch.linalg.solve_triangular(chol, J.reshape(n * L, K).T, upper=False)
                    A = A.reshape(K, n, L)
                    cov = torch.einsum("kna,knb->nab", A, A)
                means.append(f)
                covs.append(cov)
        return LaplacePredictive(torch.cat(means), torch.cat(covs), self.noise_scale.square())

    def predictive_probs(
        self, x: Tensor, *, link_approx: str = "mc", num_samples: int = 1000, seed: int | None = None
    ) -> Tensor:
        """A classifier's predictive class probabilities ``(N, K)`` at ``x`` (two columns for a
        Bernoulli model): the linearised logits ``f* ~ N(f(x*; w*), J Sigma J^T)`` through the
        softmax (sigmoid), by

        * ``link_approx="mc"`` (default): the average of ``num_samples`` draws of the logits'
          Gaussian (``seed`` seeds them; default seed 0), consistent as ``num_samples`` grows;
        * ``link_approx="probit"``: ``softmax(f_k / sqrt(1 + pi/8 Var f_k))`` per point (MacKay
          1992; laplace-torch's default), which pulls every probability towards ``1/K``
          (docs/design-notes.md, 'infer.laplace.linearized').
        """
        if not self.classification:
            raise ValueError(
                "predictive_probs is for a classifier (likelihood='categorical' or 'bernoulli'); "
                "a regression model's predictive is predictive(x)"
            )
        if link_approx not in ("probit", "mc"):
            raise ValueError(f"link_approx must be 'probit' or 'mc', got {link_approx!r}")
        pred = self.predictive(x)
        if link_approx == "probit":
            kappa = (1.0 + math.pi / 8.0 * pred.f_var).rsqrt()
            return self.likelihood.probs(kappa * pred.mean)
        S = check_int(num_samples, "num_samples", minimum=1)
        gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
        eye = torch.eye(pred.f_cov.shape[-1], dtype=self.dtype)
        chol = torch.linalg.cholesky_ex(pred.f_cov + 1e-12 * eye)[0]  # (N, L, L); jitter for a rank-deficient cov
        eps = torch.randn(S, *pred.mean.shape, generator=gen, dtype=self.dtype)
        draws = pred.mean + (chol @ eps.unsqueeze(-1)).squeeze(-1)  # (S, N, L)
        return self.likelihood.probs(draws).mean(0)

    def evaluate(
        self,
        x: Tensor,
        y: Tensor,
        *,
        level: float = 0.95,
        y_mean: Tensor | float | None = None,
        y_std: Tensor | float | None = None,
        link_approx: str = "mc",
    ) -> pd.Series:
        """Test log-likelihood, RMSE, PICP and MPIW of the linearised predictive (exact: one
        Gaussian per point, the full ``L x L`` covariance for several outputs), as
        :func:`pyro_bnnlv.evaluate` reports them (original scale with ``y_mean``/``y_std``). For a
        classifier: test log-likelihood, accuracy, Brier score and ECE of :meth:`predictive_probs`."""

        if hasattr(self.model, "check_data"):
            self.model.check_data(x, y)
        if self.classification:
            labels = self.likelihood.observed(y, self.net.out_features).long()
            return classification_metrics(labels, self.predictive_probs(x, link_approx=link_approx)).rename("metrics")
        pred = self.predictive(x)
        out = predictive_metrics(y, pred.mean.unsqueeze(0), pred.var.sqrt(), level=level, y_mean=y_mean, y_std=y_std)
        if self.num_outputs > 1:
            ll = pred.log_prob(y)
            if y_std is not None:
                std = torch.as_tensor(y_std, dtype=self.dtype).expand(self.num_outputs)
                ll = ll - std.log().sum()
            out["test_ll"] = ll.mean().item()
        return out

    # -- marginal likelihood and hyper-parameters ------------------------------------------------
    def log_marginal_likelihood(
        self, prior_precision: float | Tensor | None = None, noise_scale: float | Tensor | None = None
    ) -> Tensor:
        """Laplace log marginal likelihood at ``w*`` (module docstring), for the current or the
        given ``p`` / ``sigma``. For ``"last_layer"`` the prior terms cover the subset only.
        Differentiable in tensor-valued ``prior_precision`` and ``noise_scale``."""
        self._check_fitted()
        P = self.net.num_weights
        if prior_precision is not None:
            _as_vector(prior_precision, P, "prior_precision", self.dtype)  # checks only (detached)
        if noise_scale is not None and self.classification:
            raise ValueError(f"a {self.likelihood.name} model has no observation noise: leave out noise_scale")
        if noise_scale is not None:
            _as_positive_scalar(noise_scale, "noise_scale", self.dtype)
        p = self.prior_precision if prior_precision is None else torch.as_tensor(prior_precision, dtype=self.dtype)
        p = self._sub(p.expand(P))
        sigma = self.noise_scale if noise_scale is None else torch.as_tensor(noise_scale, dtype=self.dtype)
        s2 = sigma.square()
        if self.structure == "kfac":
            priors = _kfac.prior_factors(p, self._layers)
            logdet = p.log().sum() + sum(
                (_kfac.kron_eigen(A, G, do, di).lam / s2 + 1.0).log().sum()
                for (A, G), (do, di) in zip(self.factors, priors)
            )
            return self._log_evidence(logdet, p, s2)
        H = self.gram / s2 + (p if self.structure == "diag" else torch.diag(p))
        if self.structure == "diag":
            return self._log_evidence(H.log().sum(), p, s2)
        chol, info = torch.linalg.cholesky_ex(H)
        if int(info) != 0:
            raise ValueError(
                f"the posterior precision H = G / sigma^2 + diag(prior_precision) is not numerically "
                f"positive definite in {self.dtype} (Cholesky fails at order {int(info)}), so its "
                "log-determinant is undefined: build LinearizedLaplace(..., dtype=torch.float64) "
                "(the default) or use a larger prior_precision"
            )
        return self._log_evidence(2 * chol.diagonal().log().sum(), p, s2)

    def _log_evidence(self, logdet: Tensor, p: Tensor, s2: Tensor) -> Tensor:
        NL = self.num_data * self.num_outputs
        if self.classification:
            loglik = self.map_loglik
        else:
            loglik = -0.5 * NL * (_LOG2PI + s2.log()) - 0.5 * self.sse / s2
        w = self._sub(self.w_map)
        return loglik - 0.5 * (p * w.square()).sum() + 0.5 * p.log().sum() - 0.5 * logdet

    def _eigen(self) -> tuple[Tensor, Tensor]:
        """Eigendecomposition ``(mu, U)`` of ``D^{-1/2} G D^{-1/2}``, ``D = diag(p_0)`` (cached)."""
        if self._eig is None:
            d = self._sub(self.prior_precision).rsqrt()
            mu, U = torch.linalg.eigh(d[:, None] * self.gram * d[None, :])
            self._eig = mu.clamp_min(0.0), U
        return self._eig

    def _scaled_evidence(self, log_delta: Tensor, log_sigma: Tensor) -> Tensor:
        """Log evidence at ``p = exp(log_delta) p_0``, ``sigma = exp(log_sigma)``, in O(K)."""
        p0 = self._sub(self.prior_precision)
        delta, s2 = log_delta.exp(), (2 * log_sigma).exp()
        if self.structure == "diag":
            logdet = (self.gram / s2 + delta * p0).log().sum()
        elif self.structure == "kfac":
            logdet = p0.log().sum() + sum((e.lam / s2 + delta).log().sum() for e in self._kfac_eigen())
        else:
            mu, _ = self._eigen()
            logdet = p0.log().sum() + (mu / s2 + delta).log().sum()
        return self._log_evidence(logdet, delta * p0, s2)

    def _valid_ll_fn(self, x: Tensor, y: Tensor):
        """``(delta, sigma) -> mean validation log-likelihood`` of the linearised predictive,
        ``p = delta p_0``, each evaluation ``O(N_valid L K)``."""
        if self.structure == "diag":
            B, f = self.jacobian(x)  # (N, L, K)
            scale = self._sub(self.prior_precision)
        else:
            B, f, mu = self._projected(x)  # J D^{-1/2} U (full, last_layer), J (U_o (x) U_i) (kfac)
            scale = None
        if self.classification:
            return self._valid_class_ll_fn(
                B, f, self.likelihood.observed(y, self.net.out_features).long(), None if scale is not None else mu
            )
        y = y.to(self.dtype).reshape(f.shape)
        r = y - f

        def ll(delta: float, sigma: float) -> float:
            s2 = sigma**2
            lam = 1.0 / (self.gram / s2 + delta * scale) if scale is not None else 1.0 / (mu / s2 + delta)
            if self.num_outputs == 1:
                var = (B[:, 0].square() @ lam) + s2
                out = -0.5 * (r[:, 0].square() / var + var.log() + _LOG2PI)
            else:
                cov = torch.einsum("nak,k,nbk->nab", B, lam, B) + s2 * torch.eye(self.num_outputs, dtype=self.dtype)
                out = torch.distributions.MultivariateNormal(torch.zeros_like(r), cov).log_prob(r)
            return float(out.mean())

        return ll

    def _valid_class_ll_fn(self, B: Tensor, f: Tensor, labels: Tensor, mu: Tensor | None):
        """``(delta, sigma) -> mean validation log-likelihood`` of a classifier's probit predictive
        (``sigma`` is unused), ``p = delta p_0``; ``B`` the Jacobian (``"diag"``, ``mu=None``) or
        its projection on the eigenbasis with eigenvalues ``mu``."""
        p0 = self._sub(self.prior_precision)

        def ll(delta: float, sigma: float) -> float:
            lam = 1.0 / (self.gram + delta * p0) if mu is None else 1.0 / (mu + delta)
            kappa = (1.0 + math.pi / 8.0 * (B.square() @ lam)).rsqrt()  # (N, L)
            log_p = self.likelihood.log_probs(kappa * f)
            return float(log_p.gather(-1, labels.unsqueeze(-1)).mean())

        return ll

    def _marglik_optimum(self, prior: bool, noise: bool) -> tuple[float, float, float]:
        """:meth:`optimize_hyperparameters`' ``"marglik"``: L-BFGS on ``(log delta, log sigma)`` from
        ``(0, log sigma)``, the untuned one held at its start; ``(delta, sigma, log evidence)``."""
        log_sigma0 = self.noise_scale.log()
        theta = torch.zeros(2, dtype=self.dtype)
        theta[1] = log_sigma0
        mask = torch.tensor([float(prior), float(noise)], dtype=self.dtype)
        start = theta.clone()
        theta = theta.clone().requires_grad_(True)
        opt = torch.optim.LBFGS(
            [theta], lr=1.0, max_iter=200, line_search_fn="strong_wolfe", tolerance_grad=1e-9, tolerance_change=1e-12
        )

        def closure() -> Tensor:
            opt.zero_grad()
            t = start + mask * (theta - start)
            loss = -self._scaled_evidence(t[0], t[1])
            loss.backward()
            return loss

        opt.step(closure)
        with torch.no_grad():
            t = start + mask * (theta - start)
            objective = float(self._scaled_evidence(t[0], t[1]))
        if not math.isfinite(objective):
            raise FloatingPointError("the marginal-likelihood optimisation diverged")
        return float(t[0].exp()), float(t[1].exp()), objective

    def optimize_hyperparameters(
        self,
        method: str = "marglik",
        *,
        x_valid: Tensor | None = None,
        y_valid: Tensor | None = None,
        prior: bool = True,
        noise: bool | None = None,
        prior_grid: Tensor | None = None,
        noise_grid: Tensor | None = None,
    ) -> dict[str, float]:
        """Choose the prior-precision factor ``delta`` (``p = delta p_0``) and ``sigma``; set them.

        Args:
            method: ``"marglik"`` (default; L-BFGS on ``log delta``, ``log sigma`` of the Laplace
                log marginal likelihood) or ``"validation"`` (grid search of the linearised
                predictive's mean log-likelihood on ``(x_valid, y_valid)``).
            prior, noise: which of the two to tune (the other stays fixed); ``noise`` defaults to
                ``True`` for regression and must stay off for a classifier (it has no noise).
            prior_grid: candidate ``delta`` for ``"validation"`` (default ``10^linspace(-3, 3, 25)``).
            noise_grid: candidate ``sigma`` for ``"validation"`` (default the training residual
                RMS times ``2^linspace(-2, 3, 21)``).

        Returns ``{"prior_factor": delta, "noise_scale": sigma, "objective": value}`` where the
        objective is the log marginal likelihood or the mean validation log-likelihood (a
        classifier's has no ``"noise_scale"``).
        """
        self._check_fitted()
        if noise is None:
            noise = not self.classification
        if noise and self.classification:
            raise ValueError(f"a {self.likelihood.name} model has no observation noise to tune: leave noise out")
        if method not in ("marglik", "validation"):
            raise ValueError(f"method must be 'marglik' or 'validation', got {method!r}")
        if not (prior or noise):
            raise ValueError("nothing to optimise: prior and noise are both False")
        if method == "marglik":
            delta, sigma, objective = self._marglik_optimum(prior, noise)
        else:
            if x_valid is None or y_valid is None:
                raise ValueError("method='validation' needs x_valid and y_valid")
            if hasattr(self.model, "check_data"):
                self.model.check_data(x_valid, y_valid)
            rms = 1.0 if self.classification else math.sqrt(float(self.sse) / (self.num_data * self.num_outputs))
            deltas = [1.0]
            if prior:
                deltas = (
                    10.0 ** torch.linspace(-3, 3, 25) if prior_grid is None else torch.as_tensor(prior_grid)
                ).tolist()
            sigmas = [float(self.noise_scale)]
            if noise:
                sigmas = (
                    (max(rms, 1e-8) * 2.0 ** torch.linspace(-2, 3, 21))
                    if noise_grid is None
                    else torch.as_tensor(noise_grid)
                ).tolist()
            if min(deltas) <= 0 or min(sigmas) <= 0:
                raise ValueError("prior_grid and noise_grid must be positive")
            with torch.no_grad():
                ll = self._valid_ll_fn(x_valid, y_valid)
                scores = [(ll(d, s), d, s) for d in deltas for s in sigmas]
            objective, delta, sigma = max(scores, key=lambda t: t[0] if math.isfinite(t[0]) else -math.inf)
            for name, value, grid in (("prior_grid", delta, deltas), ("noise_grid", sigma, sigmas)):
                if len(grid) > 2 and value in (min(grid), max(grid)):
                    warnings.warn(
                        f"the validation optimum lies on the edge of {name} ({value:.3g}); consider widening it",
                        RuntimeWarning,
                        stacklevel=2,
                    )
        if self.classification:
            self.set_hyperparameters(prior_precision=delta * self.prior_precision)
            return {"prior_factor": delta, "objective": objective}
        self.set_hyperparameters(prior_precision=delta * self.prior_precision, noise_scale=sigma)
        return {"prior_factor": delta, "noise_scale": sigma, "objective": objective}

    # -- sampled Laplace ---------------------------------------------------------------------------
    def as_guide(self, dtype: torch.dtype | None = None) -> LaplaceGuide:
        """Sampled Laplace: ``q(w) = N(w*, Sigma)`` as a Pyro guide on ``"w"``.

        Expect a much wider predictive than the linearised one (:meth:`predictive`): ``Sigma`` is the
        posterior of the *linearised* network (Immer, Korzepa & Bauer 2021, arXiv:2008.08400,
        sec. 1 and 3; docs/design-notes.md, 'infer.laplace.linearized').

        The guide is a :class:`~pyro_bnnlv.infer.laplace.guide.LaplaceGuide` in ``dtype`` (default: the
        model's, so the guide's draws fit a ``model.double()``)."""
        self._check_fitted()
        if dtype is not None and dtype not in (torch.float32, torch.float64):
            raise ValueError(
                f"dtype must be torch.float32 or torch.float64 (the guide's Gaussian needs a "
                f"floating dtype), got {dtype!r}"
            )
        dtype = _model_dtype(self.model) if dtype is None else dtype
        loc = self.w_map.to(dtype)
        if self.structure == "diag":
            return LaplaceGuide(loc, scale=self.posterior_precision.rsqrt().to(dtype))
        if self.structure == "kfac":  # per layer w = w* + U_o (E / sqrt(lam / sigma^2 + 1)) U_i^T
            s2 = self.noise_scale.square()
            blocks = [
                (layer.index, e.U_out.to(dtype), e.U_in.to(dtype), (e.lam / s2 + 1.0).rsqrt().to(dtype))
                for layer, e in zip(self._layers, self._kfac_eigen())
            ]
            return LaplaceGuide(loc, kron=blocks)
        # Cholesky factor of Sigma = H^{-1}: with H = C C^T, Sigma = C^{-T} C^{-1}; the lower factor
        # of Sigma is flip(chol(flip(Sigma))) computed stably from flip(C^{-1}).
        C = self._cholesky()
        eye = torch.eye(C.shape[0], dtype=C.dtype)
        C_inv = torch.linalg.solve_triangular(C, eye, upper=False)  # lower
        # Sigma = C_inv^T C_inv; QR of C_inv gives Sigma = R^T R with R upper -> scale_tril = R^T
        R = torch.linalg.qr(C_inv, mode="r")[1]
        tril = R.T * torch.sign(R.diagonal()).unsqueeze(0)
        return LaplaceGuide(loc, scale_tril=tril.to(dtype), indices=self.indices)

    def to_model(self) -> Any:
        """A :class:`~pyro_bnnlv.models.BNN` on the same network with the current prior
        (``1/sqrt(p)``) and noise, e.g. to evaluate sampled-Laplace draws after
        :meth:`optimize_hyperparameters` with :func:`pyro_bnnlv.evaluate`; in the model's dtype."""

        dtype = _model_dtype(self.model)
        noise = (
            dict(likelihood=self.likelihood) if self.classification else dict(noise_scale=self.noise_scale.to(dtype))
        )
        return BNN(self.net, prior_scale=self.prior_precision.rsqrt().to(dtype), **noise).to(dtype)

    def __repr__(self) -> str:
        state = "fitted" if self._fitted else "not fitted"
        noise = (
            f"likelihood={self.likelihood.name!r}"
            if self.classification
            else f"noise_scale={float(self.noise_scale):.4g}"
        )
        return (
            f"LinearizedLaplace(structure={self.structure!r}, num_params={self.num_params}, "
            f"{noise}, dtype={self.dtype}, {state})"
        )
