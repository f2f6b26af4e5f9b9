r"""Closed forms of the over-parametrised linear model: exact and mean-field posteriors, the
invariance gap, the optimal variational parameters, ELBO terms, the data-related bound.

Reference: Kurle, Herbrich, Januschowski, Wang & Gasthaus (2022), "On the detrimental effect of
invariances in the likelihood for variational inference" (NeurIPS 2022; arXiv:2209.07157),
sec. 2-4. The model, its prior and design matrix are :mod:`pyro_bnnlv.models.linear`
(:class:`~pyro_bnnlv.models.linear.OverparametrisedLinear`); Pyro's SVI and NUTS on it are
compared with these closed forms in :mod:`pyro_bnnlv.reproduce.invariance`, which also draws
Fig. 1 and Fig. 2 from them.

Everything here is closed form (float64 torch, dense ``K x K`` matrices: meant for ``K`` up to a
few thousand; :func:`invariance_gap_isotropic` is O(1) for any ``K``):

=============================================  =====================================================
:func:`prior_gaussian`                         the prior ``N(mu, K sigma_0^2 I)`` (sec. 4)
:func:`exact_posterior`                        eq. 13 (with the prior-mean term restored)
:func:`log_evidence`                           ``ln p(y)``
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
=============================================  =====================================================

Readings of the paper that differ from the printed text (each checked in ``tests/test_linear.py``;
derivations and figures: docs/design-notes.md, 'stats.linear_closed_forms'):

* **Eq. 13** restores the prior-mean term: ``m_p* = V_p* (Sigma^{-1} mu + sum_i y_i/(K sigma_y^2) 1)``.
* **Eq. 10** with the sign corrected: ``ELBO(q_mix) - ELBO(q_0) = KL[q_0||p] - KL[q_mix||p] =
  KL[q_0||q_mix] >= 0``.
* **Eq. 9/10 need lambda proportional to sigma^2** (condition (7) for ``w - B Delta``); otherwise
  ``KL[q_0||p] - KL[q_mix||p] - KL[q_0||q_mix] = E_{q_0}[ln g_mix] - E_{q_mix}[ln g_mix] != 0``.
* **Eq. 19**: ``m_0* = m_p* + lambda_0* (m_p* - mu)/sigma^2`` (the posterior mean of ``q_0``), not
  the printed ``ybar 1`` (``as_printed=True`` of :func:`theta_star_0`).
* **Eq. 3** holds for the ELBO-optimal ``q`` with ``ELL(q*) = -N/2 ln(2 pi sigma_y^2)``; with a
  non-zero prior mean ``y_n^2`` becomes ``(y_n - E_p f_n)^2``.
* **Fig. 1** plots ``KL[q_0(theta_mix*) || q_mix(theta_mix*)]`` (the text's gap, not the caption's
  ``theta_0*``), as :func:`~pyro_bnnlv.reproduce.invariance.invariance_gap_table` reports.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .._checks import as_float64, as_float64_vector, as_positive_float64
from ..models.linear import DTYPE, Gaussian

__all__ = [
    "ElboTerms",
    "Gaussian",
    "PredictiveMoments",
    "data_related_bound",
    "elbo_terms",
    "exact_posterior",
    "expected_log_likelihood",
    "invariance_gap",
    "invariance_gap_isotropic",
    "invariant_likelihood_precision",
    "kl_gaussians",
    "kl_to_prior",
    "log_evidence",
    "max_expected_log_likelihood",
    "predictive_moments",
    "prior_gaussian",
    "q0",
    "qmix",
    "theta_star_0",
    "theta_star_mix",
]


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


# -- helpers ---------------------------------------------------------------------------------


def _data(y: Any) -> Tensor:
    y = as_float64(y, "y")
    if y.dim() != 1 or y.shape[0] == 0:
        raise ValueError(f"y must have shape (N,) with N >= 1, got {tuple(y.shape)}")
    return y


def _diag_prior(prior: Gaussian) -> tuple[Tensor, Tensor]:
    """``(mu, sigma^2)`` of a mean-field prior; the invariance constructions need a diagonal one."""
    mu, cov = as_float64(prior.loc, "prior.loc"), as_float64(prior.cov, "prior.cov")
    sigma2 = torch.diagonal(cov)
    if not torch.equal(cov, torch.diag(sigma2)):
        raise ValueError("prior.cov must be diagonal (mean-field prior, sec. 3 of the paper)")
    if (sigma2 <= 0).any():
        raise ValueError("prior variances must be positive")
    return mu, sigma2


def _problem(g: Gaussian, name: str, y: Any, noise_scale: Any, X: Any) -> tuple[Tensor, ...]:
    """``(y, loc, cov, X, sigma_y^2)``: the data and the Gaussian ``g`` (``name`` in errors), checked."""
    y, loc, cov = _data(y), as_float64(g.loc, f"{name}.loc"), as_float64(g.cov, f"{name}.cov")
    return y, loc, cov, _design(X, loc.shape[0], y.shape[0]), as_positive_float64(noise_scale, "noise_scale") ** 2


def _design(X: Any, K: int, N: int) -> Tensor:
    if X is None:
        return torch.full((N, K), 1.0 / K, dtype=DTYPE)
    X = as_float64(X, "X")
    if X.shape != (N, K):
        raise ValueError(f"X must have shape (N, K) = ({N}, {K}), got {tuple(X.shape)}")
    return X


# -- closed forms: prior, exact posterior, evidence ------------------------------------------


def prior_gaussian(K: int, prior_loc: Any = 0.0, prior_scale: Any = 1.0) -> Gaussian:
    """Prior ``N(mu, Diag(sigma^2))`` with ``sigma^2 = K sigma_0^2`` (sec. 4, "Prior")."""
    mu = as_float64_vector(prior_loc, K, "prior_loc")
    sigma2 = K * as_float64_vector(prior_scale, K, "prior_scale", positive=True) ** 2
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
    y, mu, Sigma, X, s2 = _problem(prior, "prior", y, noise_scale, X)
    prior_prec = torch.cholesky_inverse(torch.linalg.cholesky(Sigma))
    prec = prior_prec + X.T @ X / s2
    L = torch.linalg.cholesky(prec)
    S = torch.cholesky_inverse(L)
    m = torch.cholesky_solve((prior_prec @ mu + X.T @ y / s2).unsqueeze(-1), L).squeeze(-1)
    return Gaussian(m, S)


def log_evidence(prior: Gaussian, y: Any, noise_scale: Any, X: Any = None) -> Tensor:
    """``ln p(y) = ln N(y; X mu, X Sigma X^T + sigma_y^2 I)``; equals ``ELBO(q_mix(theta_mix*))``."""
    y, mu, Sigma, X, s2 = _problem(prior, "prior", y, noise_scale, X)
    cov = X @ Sigma @ X.T + s2 * torch.eye(y.shape[0], dtype=DTYPE)
    return torch.distributions.MultivariateNormal(X @ mu, covariance_matrix=cov).log_prob(y)


# -- closed forms: likelihood approximations and the two posteriors (x = 1) ------------------


def invariant_likelihood_precision(lam: Any) -> Tensor:
    r"""Precision of ``g_mix(w) = N(w; m, V_mix)`` (eq. 14): ``V_mix^{-1} = 1 1^T / (1^T lambda)``.

    ``g_mix(w) propto exp(-(1^T (w - m))^2 / (2 * 1^T lambda))``: a Gaussian likelihood for
    ``1^T w`` with "observation" ``1^T m`` and variance ``1^T lambda``, flat along ``1^perp``.
    (Derivation: the limit of ``(Diag(lambda) + beta^2 B B^T)^{-1}`` annihilates ``range(B) =
    1^perp``, so it is ``c 1 1^T``; testing it on ``Diag(lambda) 1`` gives ``c = 1/1^T lambda``.)
    """
    lam = as_positive_float64(lam, "lam")
    if lam.dim() != 1:
        raise ValueError(f"lam must have shape (K,), got {tuple(lam.shape)}")
    K = lam.shape[0]
    return torch.ones(K, K, dtype=DTYPE) / lam.sum()


def _theta(prior: Gaussian, m: Any, lam: Any) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    mu, sigma2 = _diag_prior(prior)
    K = mu.shape[0]
    return mu, sigma2, as_float64_vector(m, K, "m"), as_float64_vector(lam, K, "lam", positive=True)


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
    Lq = torch.linalg.cholesky(as_float64(q.cov, "q.cov"))
    Lp = torch.linalg.cholesky(as_float64(p.cov, "p.cov"))
    K = Lq.shape[0]
    A = torch.linalg.solve_triangular(Lp, Lq, upper=False)
    diff = as_float64(p.loc, "p.loc") - as_float64(q.loc, "q.loc")
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
    sigma2, lam = as_positive_float64(sigma2, "sigma2"), as_positive_float64(lam, "lam")
    u = sigma2 / lam  # phi - 1; written with log1p to stay accurate as phi -> 1 (large K)
    return 0.5 * (K - 1) * (torch.log1p(u) - u / (1.0 + u))


# -- closed forms: optimal variational parameters --------------------------------------------


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
    s2 = as_positive_float64(noise_scale, "noise_scale") ** 2
    N = y.shape[0]
    return y.mean() * torch.ones(K, dtype=DTYPE), (K * s2 / N) * torch.ones(K, dtype=DTYPE)


def theta_star_0(prior: Gaussian, y: Any, noise_scale: Any, as_printed: bool = False) -> tuple[Tensor, Tensor]:
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
    s2 = as_positive_float64(noise_scale, "noise_scale") ** 2
    lam = (K**2 * s2 / N) * torch.ones(K, dtype=DTYPE)
    if as_printed:
        return y.mean() * torch.ones(K, dtype=DTYPE), lam
    m_p = exact_posterior(prior, y, noise_scale).loc
    return m_p + lam * (m_p - mu) / sigma2, lam


# -- closed forms: ELBO terms, data-related bound, predictive --------------------------------


def expected_log_likelihood(q: Gaussian, y: Any, noise_scale: Any, X: Any = None) -> Tensor:
    r"""``ELL(q) = E_q[ln p(y | w)]`` for a Gaussian ``q = N(m_q, S_q)`` (eq. 2):

    .. math::

        -\frac N2 \ln(2\pi\sigma_y^2)
        - \frac{\lVert y - X m_q \rVert^2 + \operatorname{tr}(X S_q X^T)}{2 \sigma_y^2}.
    """
    y, loc, cov, X, s2 = _problem(q, "q", y, noise_scale, X)
    N = y.shape[0]
    resid = y - X @ loc
    tr = ((X @ cov) * X).sum()
    return -0.5 * N * torch.log(2 * math.pi * s2) - (resid @ resid + tr) / (2 * s2)


def max_expected_log_likelihood(y: Any, noise_scale: Any) -> Tensor:
    """``ELL(q*) = -N/2 ln(2 pi sigma_y^2)``: the supremum of the ELL (exact fit, eq. 3)."""
    y = _data(y)
    s2 = as_positive_float64(noise_scale, "noise_scale") ** 2
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
    y, mu, Sigma, X, s2 = _problem(prior, "prior", y, noise_scale, X)
    var_f = ((X @ Sigma) * X).sum(-1)
    return ((var_f + (y - X @ mu) ** 2) / (2 * s2)).sum()


def predictive_moments(q: Gaussian, noise_scale: Any, x_star: Any = 1.0) -> PredictiveMoments:
    """Predictive mean and variance of ``f* = x*^T w`` and ``y* = f* + eps`` under ``q``.

    ``x_star`` is a scalar input (row ``x_star/K 1^T``, the paper's model at ``x = x_star``) or a
    ``(K,)`` design row.
    """
    loc, cov = as_float64(q.loc, "q.loc"), as_float64(q.cov, "q.cov")
    K = loc.shape[0]
    x = as_float64(x_star, "x_star")
    row = (x / K) * torch.ones(K, dtype=DTYPE) if x.dim() == 0 else x
    if row.shape != (K,):
        raise ValueError(f"x_star must be a scalar or have shape ({K},), got {tuple(x.shape)}")
    s2 = as_positive_float64(noise_scale, "noise_scale") ** 2
    var_f = row @ cov @ row
    return PredictiveMoments(row @ loc, var_f, var_f + s2)
