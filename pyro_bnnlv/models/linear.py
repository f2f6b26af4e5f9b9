r"""Over-parametrised Bayesian linear regression (the model of the invariances paper, sec. 4).

Reference: Kurle, Herbrich, Januschowski, Wang & Gasthaus (2022), "On the detrimental effect of
invariances in the likelihood for variational inference" (NeurIPS 2022; arXiv:2209.07157),
sec. 2-4.

Model (sec. 4). ``K`` weights, ``N`` observations that all see the input ``x = 1``:

.. math::

    w \sim \mathcal N(\mu, \Sigma), \quad \Sigma = \operatorname{Diag}(\sigma^2),
    \quad \sigma^2 = K \sigma_0^2 \mathbf 1, \qquad
    y_n = \tfrac1K \mathbf 1^T w + \epsilon_n, \quad \epsilon_n \sim \mathcal N(0, \sigma_y^2).

The prior variance grows with ``K`` so that the prior over the function ``f = 1^T w / K`` is
``N(mean(mu), sigma_0^2)`` for every ``K``. The likelihood only sees ``1^T w``: it is invariant
under the ``K - 1`` dimensional translations ``w -> w - B Delta`` of eq. 12.

This module holds the Pyro model (:class:`OverparametrisedLinear`, with a fast NUTS potential,
:meth:`OverparametrisedLinear.nuts_potential`), the :class:`Gaussian` type and
:func:`design_matrix`. The paper's closed forms (exact and mean-field posteriors, the invariance
gap, eq. 3's bound, ...) are in :mod:`pyro_bnnlv.stats.linear_closed_forms`; Pyro's SVI and NUTS
are compared with them, and Fig. 1-2 drawn, in :mod:`pyro_bnnlv.reproduce.invariance`; the sec. 5
construction for neural networks is :mod:`pyro_bnnlv.stats.invariance_gap`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from torch import Tensor

from .._tracing import shape_branches
from .._checks import as_float64_vector, as_positive_float64
from .bnn import as_tensor_args
from ..nets import as_positive_int
from .potential import FlatPotential

__all__ = ["DTYPE", "Gaussian", "OverparametrisedLinear", "design_matrix"]

DTYPE = torch.float64


class Gaussian(NamedTuple):
    """A multivariate Gaussian ``N(loc, cov)`` with ``loc (K,)`` and full ``cov (K, K)``."""

    loc: Tensor
    cov: Tensor


# -- helpers ---------------------------------------------------------------------------------


def design_matrix(K: int, x: Tensor | None = None, N: int | None = None) -> Tensor:
    """Design matrix ``X (N, K)`` with ``f_n = X[n] @ w``.

    * ``x is None``: ``N`` rows ``1/K 1^T`` (the paper's ``x = 1``, ``f = 1^T w / K``);
    * ``x`` of shape ``(N,)`` or ``(N, 1)`` (with ``K > 1``): a scalar input per datapoint,
      ``f_n = x_n 1^T w / K`` (a column of ones is the paper's model);
    * ``x`` of shape ``(N, K)``: general inputs, ``f_n = x_n^T w`` (no ``1/K``).

    The dtype follows ``x`` (float64 when ``x`` is None).
    """
    K = as_positive_int(K, "K")
    if x is None:
        if N is None or N < 1:
            raise ValueError("pass x (shape (N,), (N, 1) or (N, K)) or the number of rows N")
        return torch.full((N, K), 1.0 / K, dtype=DTYPE)
    if not isinstance(x, Tensor):  # as_tensor under the JIT warns even when x is a tensor already
        x = torch.as_tensor(x)
    if not torch.is_floating_point(x):
        x = x.to(torch.get_default_dtype())
    with shape_branches():
        if x.dim() == 2 and x.shape[1] == K:
            return x
        if x.dim() == 2 and x.shape[1] == 1:
            x = x.squeeze(-1)
    if x.dim() != 1:
        raise ValueError(f"x must have shape (N,), (N, 1) or (N, {K}); got {tuple(x.shape)}")
    return x.unsqueeze(-1).expand(x.shape[0], K) / K


# -- Pyro model ------------------------------------------------------------------------------


class OverparametrisedLinear(PyroModule):
    r"""Pyro model of sec. 4: ``w ~ N(mu 1, K sigma_0^2 I)``, ``y_n ~ N(x_n^T w, sigma_y^2)``.

    Args:
        K: number of weights (event shape of site ``"w"``).
        prior_loc: prior mean ``mu`` of each weight (scalar or ``(K,)``).
        prior_scale: ``sigma_0``, the prior standard deviation *of the function*
            ``1^T w / K``. The weights get standard deviation ``sqrt(K) sigma_0``
            (``sigma^2 = K sigma_0^2 1``, sec. 4 "Prior"); see :attr:`weight_prior_scale`.
            Scalar or ``(K,)``.
        noise_scale: observation noise standard deviation ``sigma_y``.

    Call as ``model(x=None, y=None, batch_size=None)``; ``x`` is read by :func:`design_matrix`
    (``None`` or a column of ones is the paper's ``f = 1^T w / K``; ``(N, K)`` is the general
    ``f = x_n^T w``). With ``x is None`` the number of rows comes from ``y``. Sites: ``"w"``
    (event ``(K,)``), plate ``"data"`` (size ``N``, ``subsample_size=batch_size``), ``"obs"``.

    Shapes: a global ``w`` sampled under vectorised particles or ``Predictive(parallel=True)``
    has batch shape ``(S, 1)`` (the 1 is the data plate) or ``(S,)``; the trailing singleton is
    dropped before :meth:`f`, so ``"obs"`` has batch shape ``(S, N)``, never ``(S, S, N)``.
    Buffers are float64 and cast to the dtype of ``x`` (or ``y`` when ``x`` is None) at call time.
    """

    def __init__(
        self,
        K: int,
        prior_loc: float | Tensor = 0.0,
        prior_scale: float | Tensor = 1.0,
        noise_scale: float | Tensor = 1.0,
    ) -> None:
        super().__init__()
        K = as_positive_int(K, "K")
        self.K = K
        # float64 buffers (exact closed forms via :meth:`prior`); cast to the data dtype per call
        self.register_buffer("prior_loc", as_float64_vector(prior_loc, K, "prior_loc"))
        self.register_buffer("prior_scale", as_float64_vector(prior_scale, K, "prior_scale", True))
        sigma = as_positive_float64(noise_scale, "noise_scale")
        if sigma.dim() != 0:
            raise ValueError(f"noise_scale must be a scalar, got shape {tuple(sigma.shape)}")
        self.register_buffer("noise_scale", sigma)

    @property
    def weight_prior_scale(self) -> Tensor:
        """Per-weight prior standard deviation ``sqrt(K) sigma_0``."""
        return self.prior_scale * math.sqrt(self.K)

    def design_matrix(self, x: Tensor | None = None, N: int | None = None) -> Tensor:
        """See :func:`design_matrix`."""
        return design_matrix(self.K, x, N)

    def f(self, x: Tensor | np.ndarray | None, w: Tensor | np.ndarray) -> Tensor:
        """Mean function ``f(x; w) = X w`` for a batch of weights: ``w (*B, K) -> (*B, N)``.

        ``x`` as in :func:`design_matrix` (``None`` needs ``w`` only for ``N = 1``: pass ``x``).
        NumPy arrays are converted (:func:`~pyro_bnnlv.models.bnn.as_tensor_args`).
        """
        x, w = as_tensor_args(x, w, torch.get_default_dtype())
        if w.shape[-1:] != (self.K,):
            raise ValueError(f"w must have shape (*B, {self.K}), got {tuple(w.shape)}")
        X = self.design_matrix(x, N=1).to(w.dtype)
        return w @ X.transpose(-1, -2)

    def prior(self) -> Gaussian:
        """The weight prior as a float64 :class:`Gaussian` (for the closed forms)."""
        return Gaussian(self.prior_loc.to(DTYPE), torch.diag(self.weight_prior_scale.to(DTYPE) ** 2))

    def check_data(self, x: Tensor | None, y: Tensor | None = None) -> None:
        """Raise ``ValueError`` naming the argument for data the model cannot take: ``x`` of
        shape ``(N,)``, ``(N, 1)`` or ``(N, K)`` (or ``None`` with ``y`` given), finite, with
        ``N >= 1`` rows; ``y`` a finite ``(N,)`` tensor with as many rows. Used by
        :func:`~pyro_bnnlv.fit_svi`, :func:`~pyro_bnnlv.evaluate`, ``run_nuts`` and ``save_fit``."""
        if x is None and y is None:
            raise ValueError("pass x (shape (N,), (N, 1) or (N, K)) or y to fix the number of rows")
        if x is not None:
            if not isinstance(x, Tensor):
                raise TypeError(f"x must be a torch.Tensor or None, got {type(x).__name__}")
            X = self.design_matrix(x, N=1)  # checks the shape
            if X.shape[0] == 0:
                raise ValueError("x has 0 rows: the data must have at least one point")
            if not torch.isfinite(x).all():
                raise ValueError("x contains NaN or infinite values")
        if y is None:
            return
        if not isinstance(y, Tensor) or y.dim() != 1:
            raise ValueError(f"y must be a tensor of shape (N,), got {getattr(y, 'shape', y)!r}")
        if y.shape[0] == 0:
            raise ValueError("y has 0 rows: the data must have at least one point")
        if x is not None and X.shape[0] != y.shape[0]:
            raise ValueError(f"x and y have different numbers of rows: {X.shape[0]} vs {y.shape[0]}")
        if not torch.isfinite(y).all():
            raise ValueError("y contains NaN or infinite values")

    def predictive_components(
        self, x: Tensor, samples: dict[str, Tensor], generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Predictive mixture components at ``x``: ``loc (S, N, 1)`` and the noise scale
        (``generator`` is accepted for :func:`~pyro_bnnlv.evaluate` and unused: no latent inputs)."""
        return self.f(x, samples["w"]).unsqueeze(-1), self.noise_scale.detach()

    def nuts_potential(self, x: Tensor | None, y: Tensor):
        """Fast NUTS potential (the contract of :mod:`pyro_bnnlv.infer.mcmc.nuts`):
        ``U(w) = -ln N(y; X w, sigma_y^2 I) - ln N(w; mu, K sigma_0^2 I)``, constants included.

        ``x`` as in :meth:`forward`; the dtype follows ``x`` (or ``y`` when ``x`` is None).
        ``run_nuts`` checks it against the traced model at the initial point.
        """
        if not isinstance(y, Tensor) or y.dim() != 1:
            raise ValueError(f"y must be a tensor of shape (N,), got {getattr(y, 'shape', y)!r}")
        X = self.design_matrix(x, N=y.shape[0])
        if x is None:
            X = X.to(y.dtype)
        if X.shape[0] != y.shape[0]:
            raise ValueError(f"x and y have different numbers of rows: {X.shape[0]} vs {y.shape[0]}")
        dtype = X.dtype
        X, yy = X.detach(), y.detach().to(dtype)
        loc = self.prior_loc.to(dtype=dtype, copy=True)
        scale = self.weight_prior_scale.to(dtype=dtype, copy=True)
        sigma = self.noise_scale.to(dtype=dtype, copy=True)

        def log_density(p: dict[str, Tensor]) -> Tensor:
            w = p["w"]
            lik = torch.distributions.Normal(X @ w, sigma).log_prob(yy).sum()
            return lik + torch.distributions.Normal(loc, scale).log_prob(w).sum()

        return FlatPotential.from_log_density({"w": (self.K,)}, log_density)

    def config(self) -> dict:
        return dict(
            K=self.K,
            prior_loc=self.prior_loc.tolist(),
            prior_scale=self.prior_scale.tolist(),
            noise_scale=float(self.noise_scale),
        )

    def forward(self, x: Tensor | None = None, y: Tensor | None = None, batch_size: int | None = None) -> Tensor:
        if not torch.jit.is_tracing():  # under the JIT the checks would be frozen constants
            self.check_data(x, y)
        X = self.design_matrix(x, N=None if y is None else y.shape[0])
        if x is None and y is not None:
            X = X.to(y.dtype)
        dtype = X.dtype
        # copies, never views of the buffers: AutoNormal(init_loc_fn=init_to_mean) turns the
        # prior's mean tensor itself into its loc parameter, and Adam would then update the
        # prior in place (tests/test_linear.py::test_init_to_mean_does_not_alias_the_prior)
        loc = self.prior_loc.to(dtype=dtype, copy=True)
        scale = self.weight_prior_scale.to(dtype=dtype, copy=True)
        w = pyro.sample("w", dist.Normal(loc, scale).to_event(1))
        with pyro.plate("data", X.shape[0], subsample_size=batch_size) as idx:
            X_b = X if batch_size is None else X[idx]
            y_b = y if (y is None or batch_size is None) else y[idx]
            if w.dim() > 1:  # global w: drop the data plate's singleton (squeeze(-2) only drops a 1)
                w = w.squeeze(-2)
            f = w @ X_b.transpose(-1, -2)  # (*S, N)
            return pyro.sample("obs", dist.Normal(f, self.noise_scale.to(dtype)), obs=y_b)
