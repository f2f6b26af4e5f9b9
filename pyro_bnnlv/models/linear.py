r"""Over-parametrised Bayesian linear regression and its invariance gap, in closed form.

Reference: ``invariances-likelihood-variational-inference.txt`` (Kurle et al.), sec. 2-4.

Model (sec. 4). ``K`` weights, ``N`` observations that all see the input ``x = 1``:

.. math::

    w \sim \mathcal N(\mu, \Sigma), \quad \Sigma = \operatorname{Diag}(\sigma^2),
    \quad \sigma^2 = K \sigma_0^2 \mathbf 1, \qquad
    y_n = \tfrac1K \mathbf 1^T w + \epsilon_n, \quad \epsilon_n \sim \mathcal N(0, \sigma_y^2).

The prior variance grows with ``K`` so that the prior over the function ``f = 1^T w / K`` is
``N(mean(mu), sigma_0^2)`` for every ``K``. The likelihood only sees ``1^T w``: it is invariant
under the ``K - 1`` dimensional translations ``w -> w - B Delta`` of eq. 12.

Everything below the Pyro model is closed form (float64 torch, dense ``K x K`` matrices: meant
for ``K`` up to a few thousand; :func:`invariance_gap_isotropic` is O(1) for any ``K``):

=============================================  =====================================================
:func:`exact_posterior`                        eq. 13 (with the prior-mean term restored)
:func:`q0`                                     mean-field posterior, eq. 6a
:func:`invariant_likelihood_precision`         ``g_mix``, eq. 14
:func:`qmix`                                   invariance-abiding posterior, eq. 15
:func:`invariance_gap`                         ``KL[q_0 || q_mix]``, eq. 10
:func:`invariance_gap_isotropic`               eq. 16
:func:`theta_star_mix`, :func:`theta_star_0`   eq. 18, eq. 19 (mean corrected)
:func:`expected_log_likelihood`,               ELL, KL and ELBO of any Gaussian ``q`` (eq. 2)
:func:`kl_to_prior`, :func:`elbo_terms`
:func:`data_related_bound`                     eq. 3 / 11
:func:`predictive_moments`                     predictive mean and variance of ``f*`` and ``y*``
:func:`invariance_gap_table`,                  data and PNG for Fig. 1 and Fig. 2
:func:`plot_invariance_gap`
=============================================  =====================================================

The model has a fast NUTS potential (:meth:`OverparametrisedLinear.nuts_potential`); Pyro's SVI
and NUTS on it are compared with these closed forms in :mod:`pyro_bnnlv.invariance`, and the
sec. 5 construction for neural networks is :mod:`pyro_bnnlv.stats.invariance`.

Readings of the paper that differ from the printed text (each checked in ``tests/test_linear.py``):

* **Eq. 13** prints ``m_p* = V_p* (sum_i y_i)/(K sigma_y^2) 1``, which is the posterior mean only
  for ``mu = 0``. For a general prior mean it is ``V_p* (Sigma^{-1} mu + sum_i y_i/(K sigma_y^2) 1)``.
* **Eq. 10** prints ``ELBO(q_0) - ELBO(q_mix) = KL[q_0||p] - KL[q_mix||p] = KL[q_0||q_mix]``. The
  left-hand side has the wrong sign: with equal ELLs (eq. 9), ``ELBO(q_0) - ELBO(q_mix) =
  KL[q_mix||p] - KL[q_0||p] <= 0``. The correct statement (and the one the text uses: q_mix is
  the "tighter objective") is ``ELBO(q_mix) - ELBO(q_0) = KL[q_0||p] - KL[q_mix||p] =
  KL[q_0||q_mix] >= 0``.
* **Eq. 9/10 need lambda proportional to sigma^2.** Condition (7) for the translation
  ``t(w, Delta) = w - B Delta`` asks that ``p(w) g_0(w - B Delta)`` be a translate of
  ``p(w) g_0(w)`` along ``range(B) = 1^perp``; the product's mean moves by
  ``Diag(sigma^2/(sigma^2+lambda)) B Delta``, which stays in ``1^perp`` for all ``Delta`` iff
  ``sigma_k^2/(sigma_k^2+lambda_k)`` is the same for all ``k``, i.e. ``lambda = c sigma^2``. The
  paper's setting (isotropic prior, equal ``lambda_k``, and both optima of eq. 18-19) satisfies this;
  for other ``lambda``, ``ELL(q_0) != ELL(q_mix)`` and
  ``KL[q_0||p] - KL[q_mix||p] - KL[q_0||q_mix] = E_{q_0}[ln g_mix] - E_{q_mix}[ln g_mix] != 0``.
* **Eq. 19** prints ``m_0* = m_mix* = mean(y) 1``. The variances ``lambda_0* = K^2 sigma_y^2/N`` are
  right, but with that mean ``q_0`` has mean ``N sigma_0^2 ybar/(N sigma_0^2 + K sigma_y^2) 1``,
  not the posterior mean, and the ELBO gradient w.r.t. ``m`` is not zero. The mean-field optimum of
  a Gaussian posterior has the posterior mean (Wainwright & Jordan, the paper's ref. [34]); solving
  ``(lambda mu + sigma^2 m)/(sigma^2 + lambda) = m_p*`` gives
  ``m_0* = m_p* + lambda_0* (m_p* - mu)/sigma^2``, for ``mu = 0`` and ``sigma_0``:
  ``m_0* = ybar (N sigma_0^2 + K sigma_y^2)/(N sigma_0^2 + sigma_y^2) 1``. Pass
  ``as_printed=True`` to :func:`theta_star_0` for the printed value. The gap (Fig. 1) does not depend
  on ``m`` in the isotropic setting, so only Fig. 2's mean-dependent terms are affected.
* **Eq. 3** holds for the ELBO-*optimal* ``q`` (from ``ELBO(q*) >= ELBO(p) = ELL(p)``), with
  ``ELL(q*)`` the supremum ``-N/2 ln(2 pi sigma_y^2)`` (exact fit, no residual). With a non-zero
  prior mean the ``y_n^2`` becomes ``(y_n - E_p f_n)^2``.
* **Fig. 1 caption** lists ``KL[q_0(theta_0*) || q_mix(theta_mix*)]``; the text (sec. 4.2) and the
  claimed linear growth are about ``KL[q_0(theta_mix*) || q_mix(theta_mix*)]``, which is what
  :func:`invariance_gap_table` reports (``KL[q_0(theta_0*) || p(w|D)]`` stays bounded in ``K``).
  Fig. 1 does not state ``N``; with ``N = 1`` the gap at ``theta_0*`` peaks near ``K = 10`` and the
  gap at ``theta_mix*`` crosses the bound at ``K ~ 19`` ("reached quickly"); with Fig. 2's
  ``N = 10`` the ``theta_0*`` gap still rises until ``K = 82`` and only then decays like
  ``(N sigma_0^2/sigma_y^2)^2/(4K)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from torch import Tensor

from .._figures import finish_figure
from ..nets import as_positive_int
from .potential import FlatPotential

__all__ = [
    "OverparametrisedLinear",
    "Gaussian",
    "ElboTerms",
    "PredictiveMoments",
    "design_matrix",
    "prior_gaussian",
    "exact_posterior",
    "log_evidence",
    "invariant_likelihood_precision",
    "q0",
    "qmix",
    "kl_gaussians",
    "invariance_gap",
    "invariance_gap_isotropic",
    "theta_star_mix",
    "theta_star_0",
    "expected_log_likelihood",
    "max_expected_log_likelihood",
    "kl_to_prior",
    "elbo_terms",
    "data_related_bound",
    "predictive_moments",
    "invariance_gap_table",
    "plot_invariance_gap",
]

DTYPE = torch.float64

#: ``sigma_y = (2 pi e)^{-1/2}``, the noise of Fig. 1 and Fig. 2.
FIGURE_NOISE_SCALE = (2 * math.pi * math.e) ** -0.5


class Gaussian(NamedTuple):
    """A multivariate Gaussian ``N(loc, cov)`` with ``loc (K,)`` and full ``cov (K, K)``."""

    loc: Tensor
    cov: Tensor


class ElboTerms(NamedTuple):
    """``ELBO = ELL - KL`` (eq. 2)."""

    ell: Tensor
    kl: Tensor
    elbo: Tensor


class PredictiveMoments(NamedTuple):
    """Predictive mean and variances at one input: ``var_y = var_f + sigma_y^2``."""

    mean: Tensor
    var_f: Tensor
    var_y: Tensor


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _f64(value: Any, name: str) -> Tensor:
    t = torch.as_tensor(value, dtype=DTYPE)
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} must be finite, got {value!r}")
    return t


def _positive(value: Any, name: str) -> Tensor:
    t = _f64(value, name)
    if (t <= 0).any():
        raise ValueError(f"{name} must be positive, got {value!r}")
    return t


def _vector(value: Any, K: int, name: str, positive: bool = False) -> Tensor:
    """A scalar or ``(K,)`` value as a float64 ``(K,)`` vector."""
    t = _positive(value, name) if positive else _f64(value, name)
    if t.dim() == 0:
        return t.expand(K).clone()
    if t.shape != (K,):
        raise ValueError(f"{name} must be a scalar or have shape ({K},), got {tuple(t.shape)}")
    return t


def _data(y: Any) -> Tensor:
    y = _f64(y, "y")
    if y.dim() != 1 or y.shape[0] == 0:
        raise ValueError(f"y must have shape (N,) with N >= 1, got {tuple(y.shape)}")
    return y


def _diag_prior(prior: Gaussian) -> tuple[Tensor, Tensor]:
    """``(mu, sigma^2)`` of a mean-field prior; the invariance constructions need a diagonal one."""
    mu, cov = _f64(prior.loc, "prior.loc"), _f64(prior.cov, "prior.cov")
    sigma2 = torch.diagonal(cov)
    if not torch.equal(cov, torch.diag(sigma2)):
        raise ValueError("prior.cov must be diagonal (mean-field prior, sec. 3 of the paper)")
    if (sigma2 <= 0).any():
        raise ValueError("prior variances must be positive")
    return mu, sigma2


def _design(X: Any, K: int, N: int) -> Tensor:
    if X is None:
        return torch.full((N, K), 1.0 / K, dtype=DTYPE)
    X = _f64(X, "X")
    if X.shape != (N, K):
        raise ValueError(f"X must have shape (N, K) = ({N}, {K}), got {tuple(X.shape)}")
    return X


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
    x = torch.as_tensor(x)
    if not torch.is_floating_point(x):
        x = x.to(torch.get_default_dtype())
    if x.dim() == 2 and x.shape[1] == K:
        return x
    if x.dim() == 2 and x.shape[1] == 1:
        x = x.squeeze(-1)
    if x.dim() != 1:
        raise ValueError(f"x must have shape (N,), (N, 1) or (N, {K}); got {tuple(x.shape)}")
    return x.unsqueeze(-1).expand(x.shape[0], K) / K


# --------------------------------------------------------------------------------------------
# Pyro model
# --------------------------------------------------------------------------------------------


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
        self.register_buffer("prior_loc", _vector(prior_loc, K, "prior_loc"))
        self.register_buffer("prior_scale", _vector(prior_scale, K, "prior_scale", True))
        sigma = _positive(noise_scale, "noise_scale")
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

    def f(self, x: Tensor | None, w: Tensor) -> Tensor:
        """Mean function ``f(x; w) = X w`` for a batch of weights: ``w (*B, K) -> (*B, N)``.

        ``x`` as in :func:`design_matrix` (``None`` needs ``w`` only for ``N = 1``: pass ``x``).
        """
        if w.shape[-1:] != (self.K,):
            raise ValueError(f"w must have shape (*B, {self.K}), got {tuple(w.shape)}")
        X = self.design_matrix(x, N=1).to(w.dtype)
        return w @ X.transpose(-1, -2)

    def prior(self) -> Gaussian:
        """The weight prior as a float64 :class:`Gaussian` (for the closed forms)."""
        return Gaussian(
            self.prior_loc.to(DTYPE), torch.diag(self.weight_prior_scale.to(DTYPE) ** 2)
        )

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
        """Fast NUTS potential (the contract of :mod:`pyro_bnnlv.infer.nuts`):
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

    def forward(
        self, x: Tensor | None = None, y: Tensor | None = None, batch_size: int | None = None
    ) -> Tensor:
        if not torch.jit.is_tracing():  # under the JIT the checks would be frozen constants
            self.check_data(x, y)
        X = self.design_matrix(x, N=None if y is None else y.shape[0])
        if x is None and y is not None:
            X = X.to(y.dtype)
        if y is not None and y.shape[0] != X.shape[0]:
            raise ValueError(f"x and y have different numbers of rows: {X.shape[0]} vs {y.shape[0]}")
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
            if w.dim() > 1 and w.shape[-2] == 1:  # global w: drop the data plate's singleton
                w = w.squeeze(-2)
            f = w @ X_b.transpose(-1, -2)  # (*S, N)
            return pyro.sample("obs", dist.Normal(f, self.noise_scale.to(dtype)), obs=y_b)


# --------------------------------------------------------------------------------------------
# closed forms: prior, exact posterior, evidence
# --------------------------------------------------------------------------------------------


def prior_gaussian(K: int, prior_loc: Any = 0.0, prior_scale: Any = 1.0) -> Gaussian:
    """Prior ``N(mu, Diag(sigma^2))`` with ``sigma^2 = K sigma_0^2`` (sec. 4, "Prior")."""
    mu = _vector(prior_loc, K, "prior_loc")
    sigma2 = K * _vector(prior_scale, K, "prior_scale", positive=True) ** 2
    return Gaussian(mu, torch.diag(sigma2))


def exact_posterior(prior: Gaussian, y: Any, noise_scale: Any, X: Any = None) -> Gaussian:
    r"""Exact posterior ``p(w | y) = N(m_N, S_N)`` (eq. 13).

    .. math::

        S_N = (\Sigma^{-1} + X^T X / \sigma_y^2)^{-1}, \qquad
        m_N = S_N (\Sigma^{-1} \mu + X^T y / \sigma_y^2).

    With the paper's ``X = 1 1^T / K`` this is ``S_N = (N/(K^2 sigma_y^2) 1 1^T + Sigma^{-1})^{-1}``
    and ``m_N = S_N (Sigma^{-1} mu + sum_i y_i / (K sigma_y^2) 1)``; the printed eq. 13 drops the
    ``Sigma^{-1} mu`` term (exact for ``mu = 0`` only). ``prior`` may be full-covariance here.
    """
    y = _data(y)
    mu, Sigma = _f64(prior.loc, "prior.loc"), _f64(prior.cov, "prior.cov")
    X = _design(X, mu.shape[0], y.shape[0])
    s2 = _positive(noise_scale, "noise_scale") ** 2
    prior_prec = torch.cholesky_inverse(torch.linalg.cholesky(Sigma))
    prec = prior_prec + X.T @ X / s2
    L = torch.linalg.cholesky(prec)
    S = torch.cholesky_inverse(L)
    m = torch.cholesky_solve((prior_prec @ mu + X.T @ y / s2).unsqueeze(-1), L).squeeze(-1)
    return Gaussian(m, S)


def log_evidence(prior: Gaussian, y: Any, noise_scale: Any, X: Any = None) -> Tensor:
    """``ln p(y) = ln N(y; X mu, X Sigma X^T + sigma_y^2 I)``; equals ``ELBO(q_mix(theta_mix*))``."""
    y = _data(y)
    mu, Sigma = _f64(prior.loc, "prior.loc"), _f64(prior.cov, "prior.cov")
    X = _design(X, mu.shape[0], y.shape[0])
    s2 = _positive(noise_scale, "noise_scale") ** 2
    cov = X @ Sigma @ X.T + s2 * torch.eye(y.shape[0], dtype=DTYPE)
    return torch.distributions.MultivariateNormal(X @ mu, covariance_matrix=cov).log_prob(y)


# --------------------------------------------------------------------------------------------
# closed forms: likelihood approximations and the two posteriors (x = 1)
# --------------------------------------------------------------------------------------------


def invariant_likelihood_precision(lam: Any) -> Tensor:
    r"""Precision of ``g_mix(w) = N(w; m, V_mix)`` (eq. 14): ``V_mix^{-1} = 1 1^T / (1^T lambda)``.

    ``g_mix(w) propto exp(-(1^T (w - m))^2 / (2 * 1^T lambda))``: a Gaussian likelihood for
    ``1^T w`` with "observation" ``1^T m`` and variance ``1^T lambda``, flat along ``1^perp``.
    (Derivation: the limit of ``(Diag(lambda) + beta^2 B B^T)^{-1}`` annihilates ``range(B) =
    1^perp``, so it is ``c 1 1^T``; testing it on ``Diag(lambda) 1`` gives ``c = 1/1^T lambda``.)
    """
    lam = _positive(lam, "lam")
    if lam.dim() != 1:
        raise ValueError(f"lam must have shape (K,), got {tuple(lam.shape)}")
    K = lam.shape[0]
    return torch.ones(K, K, dtype=DTYPE) / lam.sum()


def _theta(prior: Gaussian, m: Any, lam: Any) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    mu, sigma2 = _diag_prior(prior)
    K = mu.shape[0]
    return mu, sigma2, _vector(m, K, "m"), _vector(lam, K, "lam", positive=True)


def q0(prior: Gaussian, m: Any, lam: Any) -> Gaussian:
    r"""Mean-field posterior ``q_0 propto p(w) g_0(w; m, lambda)`` (eq. 6a).

    Product of the diagonal prior ``N(mu, Diag(sigma^2))`` and the mean-field likelihood
    approximation ``g_0 = N(w; m, Diag(lambda))``:

    .. math::

        v_k = \frac{\sigma_k^2 \lambda_k}{\sigma_k^2 + \lambda_k}, \qquad
        m_{0,k} = \frac{\lambda_k \mu_k + \sigma_k^2 m_k}{\sigma_k^2 + \lambda_k}.

    ``m`` and ``lam`` are scalars or ``(K,)`` vectors; ``lam`` must be positive and finite
    (``lam -> inf`` is the prior).
    """
    mu, sigma2, m, lam = _theta(prior, m, lam)
    v = sigma2 * lam / (sigma2 + lam)
    loc = (lam * mu + sigma2 * m) / (sigma2 + lam)
    return Gaussian(loc, torch.diag(v))


def qmix(prior: Gaussian, m: Any, lam: Any) -> Gaussian:
    r"""Invariance-abiding posterior ``q_mix propto p(w) g_mix(w; m, lambda)`` (eq. 15).

    .. math::

        q_{mix} = \mathcal N\Big(\mu + \frac{1^T(m - \mu)}{1^T(\lambda + \sigma^2)} \sigma^2,\;
        \operatorname{Diag}(\sigma^2) - \frac{\sigma^2 (\sigma^2)^T}{1^T(\lambda + \sigma^2)}\Big),

    i.e. Gaussian conditioning of the prior on the scalar "observation" ``1^T m = 1^T w + e``,
    ``e ~ N(0, 1^T lambda)`` (eq. 14). Depends on ``m`` and ``lambda`` only through their sums.
    """
    mu, sigma2, m, lam = _theta(prior, m, lam)
    denom = (lam + sigma2).sum()
    loc = mu + (m - mu).sum() / denom * sigma2
    cov = torch.diag(sigma2) - torch.outer(sigma2, sigma2) / denom
    return Gaussian(loc, cov)


def kl_gaussians(q: Gaussian, p: Gaussian) -> Tensor:
    """``KL[N(q.loc, q.cov) || N(p.loc, p.cov)]`` for full covariances (float64)."""
    Lq = torch.linalg.cholesky(_f64(q.cov, "q.cov"))
    Lp = torch.linalg.cholesky(_f64(p.cov, "p.cov"))
    K = Lq.shape[0]
    A = torch.linalg.solve_triangular(Lp, Lq, upper=False)
    diff = _f64(p.loc, "p.loc") - _f64(q.loc, "q.loc")
    b = torch.linalg.solve_triangular(Lp, diff.unsqueeze(-1), upper=False).squeeze(-1)
    logdet = 2 * (torch.log(torch.diagonal(Lp)).sum() - torch.log(torch.diagonal(Lq)).sum())
    return 0.5 * ((A**2).sum() + (b**2).sum() - K + logdet)


def invariance_gap(prior: Gaussian, m: Any, lam: Any) -> Tensor:
    r"""Invariance gap ``KL[q_0(theta) || q_mix(theta)]`` (eq. 10), exact for any ``theta``.

    Under conditions (7)-(8) — for this model: ``lambda`` proportional to ``sigma^2`` — it equals
    ``ELBO(q_mix) - ELBO(q_0) = KL[q_0 || p] - KL[q_mix || p]`` (eq. 10 with the sign of its
    left-hand side corrected, see the module docstring). For other ``lambda`` it is still the KL
    between the two posteriors, but no longer the ELBO difference.
    """
    return kl_gaussians(q0(prior, m, lam), qmix(prior, m, lam))


def invariance_gap_isotropic(K: int, sigma2: Any, lam: Any) -> Tensor:
    r"""Eq. 16: the gap when ``lambda_k = lambda``, ``sigma_k^2 = sigma^2`` for all ``k``.

    .. math::

        KL[q_0 || q_{mix}] = \frac{K-1}{2}\Big[\ln\frac{\sigma^2+\lambda}{\lambda}
        + \frac{\lambda}{\sigma^2 + \lambda} - 1\Big].

    (Both posteriors then share their mean and their variance ``sigma^2 lambda/(sigma^2+lambda)``
    along ``1``; on ``1^perp`` q_mix keeps the prior variance ``sigma^2``, hence ``K - 1`` equal
    terms. Independent of ``m`` and ``mu``.) Verified against :func:`invariance_gap`.
    """
    sigma2, lam = _positive(sigma2, "sigma2"), _positive(lam, "lam")
    u = sigma2 / lam  # phi - 1; written with log1p to stay accurate as phi -> 1 (large K)
    return 0.5 * (K - 1) * (torch.log1p(u) - u / (1.0 + u))


# --------------------------------------------------------------------------------------------
# closed forms: optimal variational parameters
# --------------------------------------------------------------------------------------------


def theta_star_mix(y: Any, K: int, noise_scale: Any) -> tuple[Tensor, Tensor]:
    r"""Eq. 18: ``m_mix* = mean(y) 1``, ``lambda_mix* = K sigma_y^2 / N 1``.

    With these, ``q_mix`` (eq. 15) is the exact posterior (eq. 13) for *any* diagonal prior: the
    likelihood of the paper's model depends on ``w`` through ``s = 1^T w`` only,
    ``prod_n N(y_n; s/K, sigma_y^2) propto N(K ybar; s, K^2 sigma_y^2/N)``, and ``g_mix`` is that
    same Gaussian in ``s`` when ``1^T m = K ybar`` and ``1^T lambda = K^2 sigma_y^2 / N``. So the
    optimum is not unique: any ``(m, lambda)`` with those two sums is optimal; this is the
    symmetric one.
    """
    y = _data(y)
    s2 = _positive(noise_scale, "noise_scale") ** 2
    N = y.shape[0]
    return y.mean() * torch.ones(K, dtype=DTYPE), (K * s2 / N) * torch.ones(K, dtype=DTYPE)


def theta_star_0(
    prior: Gaussian, y: Any, noise_scale: Any, as_printed: bool = False
) -> tuple[Tensor, Tensor]:
    r"""Eq. 19 (corrected mean): parameters of ``g_0`` that maximise ``ELBO(q_0)``.

    The best mean-field Gaussian for a Gaussian posterior ``N(m_p, V_p)`` has the posterior mean
    and precisions ``diag(V_p^{-1}) = 1/sigma_k^2 + N/(K^2 sigma_y^2)``. Matching with eq. 6a:

    .. math::

        \lambda_0^* = \frac{K^2 \sigma_y^2}{N} 1, \qquad
        m_{0,k}^* = m_{p,k} + \lambda_{0,k}^* \frac{m_{p,k} - \mu_k}{\sigma_k^2},

    which for ``mu = 0``, ``sigma^2 = K sigma_0^2`` is
    ``ybar (N sigma_0^2 + K sigma_y^2)/(N sigma_0^2 + sigma_y^2) 1``. The paper prints
    ``m_0* = m_mix* = ybar 1`` (returned with ``as_printed=True``), at which ``q_0``'s mean is
    ``N sigma_0^2 ybar/(N sigma_0^2 + K sigma_y^2)`` instead of the posterior mean and the ELBO
    gradient in ``m`` is non-zero (see tests).
    """
    y = _data(y)
    mu, sigma2 = _diag_prior(prior)
    K, N = mu.shape[0], y.shape[0]
    s2 = _positive(noise_scale, "noise_scale") ** 2
    lam = (K**2 * s2 / N) * torch.ones(K, dtype=DTYPE)
    if as_printed:
        return y.mean() * torch.ones(K, dtype=DTYPE), lam
    m_p = exact_posterior(prior, y, noise_scale).loc
    return m_p + lam * (m_p - mu) / sigma2, lam


# --------------------------------------------------------------------------------------------
# closed forms: ELBO terms, data-related bound, predictive
# --------------------------------------------------------------------------------------------


def expected_log_likelihood(q: Gaussian, y: Any, noise_scale: Any, X: Any = None) -> Tensor:
    r"""``ELL(q) = E_q[ln p(y | w)]`` for a Gaussian ``q = N(m_q, S_q)`` (eq. 2):

    .. math::

        -\frac N2 \ln(2\pi\sigma_y^2)
        - \frac{\lVert y - X m_q \rVert^2 + \operatorname{tr}(X S_q X^T)}{2 \sigma_y^2}.
    """
    y = _data(y)
    loc, cov = _f64(q.loc, "q.loc"), _f64(q.cov, "q.cov")
    X = _design(X, loc.shape[0], y.shape[0])
    s2 = _positive(noise_scale, "noise_scale") ** 2
    N = y.shape[0]
    resid = y - X @ loc
    tr = ((X @ cov) * X).sum()
    return -0.5 * N * torch.log(2 * math.pi * s2) - (resid @ resid + tr) / (2 * s2)


def max_expected_log_likelihood(y: Any, noise_scale: Any) -> Tensor:
    """``ELL(q*) = -N/2 ln(2 pi sigma_y^2)``: the supremum of the ELL (exact fit, eq. 3)."""
    y = _data(y)
    s2 = _positive(noise_scale, "noise_scale") ** 2
    return -0.5 * y.shape[0] * torch.log(2 * math.pi * s2)


def kl_to_prior(q: Gaussian, prior: Gaussian) -> Tensor:
    """``KL[q || p]`` (the regulariser of eq. 2)."""
    return kl_gaussians(q, prior)


def elbo_terms(q: Gaussian, prior: Gaussian, y: Any, noise_scale: Any, X: Any = None) -> ElboTerms:
    """``ELL(q)``, ``KL[q || p]`` and ``ELBO = ELL - KL`` (eq. 2), all analytic."""
    ell = expected_log_likelihood(q, y, noise_scale, X)
    kl = kl_to_prior(q, prior)
    return ElboTerms(ell, kl, ell - kl)


def data_related_bound(prior: Gaussian, y: Any, noise_scale: Any, X: Any = None) -> Tensor:
    r"""Data-related bound ``ELL(q*) - ELL(p)`` (eq. 3; used in eq. 11).

    .. math::

        \sum_n \frac{\sigma_L^2(x_n) + (y_n - E_p[f(x_n)])^2}{2 \sigma_y^2},
        \qquad \sigma_L^2(x_n) = x_n^T \Sigma x_n.

    Eq. 3 assumes a zero-mean prior (then ``(y_n - E_p f)^2 = y_n^2``). It bounds ``KL[q||p]``
    for the ELBO-optimal ``q`` (``ELBO(q) >= ELBO(p) = ELL(p)``), and via eq. 11 the gap
    ``KL[q_0||q_mix] <= KL[q_0||p]`` of the ``q_0`` optimum.
    """
    y = _data(y)
    mu, Sigma = _f64(prior.loc, "prior.loc"), _f64(prior.cov, "prior.cov")
    X = _design(X, mu.shape[0], y.shape[0])
    s2 = _positive(noise_scale, "noise_scale") ** 2
    var_f = ((X @ Sigma) * X).sum(-1)
    return ((var_f + (y - X @ mu) ** 2) / (2 * s2)).sum()


def predictive_moments(q: Gaussian, noise_scale: Any, x_star: Any = 1.0) -> PredictiveMoments:
    """Predictive mean and variance of ``f* = x*^T w`` and ``y* = f* + eps`` under ``q``.

    ``x_star`` is a scalar input (row ``x_star/K 1^T``, the paper's model at ``x = x_star``) or a
    ``(K,)`` design row.
    """
    loc, cov = _f64(q.loc, "q.loc"), _f64(q.cov, "q.cov")
    K = loc.shape[0]
    x = _f64(x_star, "x_star")
    row = (x / K) * torch.ones(K, dtype=DTYPE) if x.dim() == 0 else x
    if row.shape != (K,):
        raise ValueError(f"x_star must be a scalar or have shape ({K},), got {tuple(x.shape)}")
    s2 = _positive(noise_scale, "noise_scale") ** 2
    var_f = row @ cov @ row
    return PredictiveMoments(row @ loc, var_f, var_f + s2)


# --------------------------------------------------------------------------------------------
# Figures 1 and 2
# --------------------------------------------------------------------------------------------


def invariance_gap_table(
    Ks: Sequence[int] = tuple(range(2, 129, 2)),
    N: int = 10,
    y_value: float = 1.0,
    prior_loc: float = 0.0,
    prior_scale: float = 1.0,
    noise_scale: float = FIGURE_NOISE_SCALE,
    as_printed: bool = False,
):
    """Data of Fig. 1 and Fig. 2 as a long :class:`pandas.DataFrame`.

    Defaults are the figures' settings: ``sigma^2 = K 1`` (``sigma_0 = 1``),
    ``sigma_y^2 = 1/(2 pi e)``, ``N = 10`` identical observations ``y = 1`` at ``x = 1`` (Fig. 1
    does not state ``N``; ``N = 1`` matches its description better, see the module docstring).

    One row per ``(K, theta, approx)`` with ``theta`` in ``{"theta_0*", "theta_mix*"}`` and
    ``approx`` in ``{"q0", "qmix"}``; columns ``ell``, ``kl`` (to the prior), ``elbo``,
    ``pred_mean``, ``pred_var_f``, ``pred_var_y`` (at ``x* = 1``), and per ``(K, theta)``:
    ``gap`` (``KL[q_0(theta)||q_mix(theta)]``, Fig. 1), ``bound`` (eq. 3), ``ell_max`` (eq. 3's
    ``ELL(q*)``), ``log_evidence``, ``prior_pred_var_y``, and
    ``kl_q0_to_posterior`` (``KL[q_0(theta)||p(w|D)]``, the caption's other reading).
    ``as_printed`` uses the printed mean of eq. 19 for ``theta_0*``.
    """
    import pandas as pd

    y = torch.full((N,), float(y_value), dtype=DTYPE)
    rows = []
    for K in Ks:
        K = int(K)
        prior = prior_gaussian(K, prior_loc, prior_scale)
        post = exact_posterior(prior, y, noise_scale)
        bound = float(data_related_bound(prior, y, noise_scale))
        ell_max = float(max_expected_log_likelihood(y, noise_scale))
        logz = float(log_evidence(prior, y, noise_scale))
        prior_var_y = float(predictive_moments(prior, noise_scale).var_y)
        thetas = {
            "theta_0*": theta_star_0(prior, y, noise_scale, as_printed=as_printed),
            "theta_mix*": theta_star_mix(y, K, noise_scale),
        }
        for tname, (m, lam) in thetas.items():
            gap = float(invariance_gap(prior, m, lam))
            kl_post = float(kl_gaussians(q0(prior, m, lam), post))
            for qname, build in (("q0", q0), ("qmix", qmix)):
                q = build(prior, m, lam)
                terms = elbo_terms(q, prior, y, noise_scale)
                pm = predictive_moments(q, noise_scale)
                rows.append(
                    dict(
                        K=K, theta=tname, approx=qname,
                        ell=float(terms.ell), kl=float(terms.kl), elbo=float(terms.elbo),
                        pred_mean=float(pm.mean), pred_var_f=float(pm.var_f),
                        pred_var_y=float(pm.var_y), gap=gap, bound=bound, ell_max=ell_max,
                        log_evidence=logz, prior_pred_var_y=prior_var_y,
                        kl_q0_to_posterior=kl_post,
                    )
                )
    return pd.DataFrame(rows)


def plot_invariance_gap(df, path=None, svi=None, *, axes=None):
    """Fig. 1 (gap vs ``K`` with the bound) and Fig. 2 (KL, ELL, ELBO, predictive variance)
    panels from :func:`invariance_gap_table` output. Returns the figure; writes the PNG ``path``
    when given; ``axes``: five matplotlib axes to draw into (default: a new figure).

    ``svi``: optionally a :func:`pyro_bnnlv.invariance.svi_invariance_experiment` table (columns
    ``K``, ``elbo_fit``, ``pred_var_y_fit``), overlaid as black crosses on the ELBO and
    predictive-variance panels."""
    import matplotlib.pyplot as plt

    colors = {"theta_0*": "tab:blue", "theta_mix*": "tab:red"}
    owned = axes is None
    if owned:
        fig, axes = plt.subplots(1, 5, figsize=(22, 4))
    else:
        axes = list(getattr(axes, "flat", axes))
        if len(axes) != 5:
            raise ValueError(f"axes must hold 5 matplotlib axes (gap, KL, ELL, ELBO, predictive variance), got {len(axes)}")
        fig = axes[0].figure
    g = df[df.approx == "q0"]
    for tname, sub in g.groupby("theta"):
        axes[0].plot(sub.K, sub.gap, color=colors[tname], label=f"KL[q0||qmix] at {tname}")
    axes[0].plot(g.K.unique(), g.groupby("K").bound.first(), "k--", label="data-related bound")
    axes[0].set_title("Fig. 1: invariance gap")
    for ax, col, title in zip(
        axes[1:], ["kl", "ell", "elbo", "pred_var_y"], ["KL[q||p]", "ELL", "ELBO", "pred. var y*"]
    ):
        for (tname, qname), sub in df.groupby(["theta", "approx"]):
            style = dict(ls="-") if qname == "qmix" else dict(ls="none", marker=".")
            ax.plot(sub.K, sub[col], color=colors[tname], label=f"{qname}, {tname}", **style)
        ax.set_title(title)
    axes[4].plot(g.K.unique(), g.groupby("K").prior_pred_var_y.first(), "k--", label="prior")
    if svi is not None:
        axes[3].plot(svi["K"], svi["elbo_fit"], "kx", label="AutoNormal (Pyro SVI)")
        axes[4].plot(svi["K"], svi["pred_var_y_fit"], "kx", label="AutoNormal (Pyro SVI)")
    for ax in axes:
        ax.set_xlabel("K")
        ax.legend(fontsize=7)
    return finish_figure(fig, path, owned, dpi=100)
