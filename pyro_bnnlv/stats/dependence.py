"""Dependence and normality statistics of the NCAI objective and its evaluation.

Everything here refers to Yacoby, Pan & Doshi-Velez (2022), arXiv:1911.00569 (the NCAI paper):

* :func:`henze_zirkler` -- the Henze-Zirkler (1990) multivariate-normality statistic, the
  differentiable proxy for ``D[q(z) || p(z)]`` (App. D.2, eq. 25-26; used in eq. 27 and as an
  evaluation metric in App. F.2), plus :func:`henze_zirkler_pvalue`;
* :func:`pearson_correlation` / :func:`correlation_penalty` -- the correlation proxy ``PC`` for
  ``I(x; z)`` (App. D.1, eq. 23-24; used in eq. 27);
* :func:`offdiag_cov_norm` -- the ``||offdiag Sigma_hat||_2`` term of eq. 26-27;
* :func:`ksg_mutual_information` -- the Kraskov-Stoegbauer-Grassberger estimator of ``I(x; mu_z)``
  (App. F.2), not differentiable;
* :func:`ks_statistic` -- the two-sample Kolmogorov-Smirnov statistic between ``{mu_z_n}`` and
  prior samples (App. F.2, univariate case), not differentiable.

The differentiable functions take and return torch tensors; the evaluation metrics take
tensors or array-likes and return Python floats. A sample is a matrix ``(n, d)``, one row per
datapoint, or ``(n,)`` for one variable (the paper's common case ``D = K = 1``); other shapes,
non-finite entries and mismatched row counts raise a ``ValueError`` naming the argument.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from scipy.spatial import cKDTree
from scipy.special import digamma
from torch import Tensor

from .._checks import ArgumentTypeError, check_int, check_real
from ._inputs import _as_tensor_2d, _check_same_n
from ._pairwise import henze_zirkler_beta, henze_zirkler_unchecked, offdiag_cov_norm_unchecked

__all__ = [
    "correlation_penalty",
    "henze_zirkler",
    "henze_zirkler_beta",
    "henze_zirkler_pvalue",
    "ks_statistic",
    "ksg_mutual_information",
    "offdiag_cov_norm",
    "pearson_correlation",
]


def _as_numpy_2d(name: str, value: Any) -> np.ndarray:
    """Same checks as :func:`_as_tensor_2d`, returning a float64 numpy array ``(n, d)``."""
    if isinstance(value, Tensor):
        value = value.detach().cpu()
    return _as_tensor_2d(name, value).to(torch.float64).numpy()


# -- Henze-Zirkler -----------------------------------------------------------------------------


def henze_zirkler(x: Tensor, *, ridge: float = 1e-12, compiled: bool | None = None) -> Tensor:
    r"""Henze-Zirkler multivariate-normality statistic ``HZ`` of a sample, differentiable in ``x``.

    Yacoby, Pan & Doshi-Velez (2022), arXiv:1911.00569, eq. 25 (App. D.2), following Henze & Zirkler
    (1990):

    .. math::

        \mathrm{HZ} = \frac1n \sum_{i,j=1}^n e^{-\frac{\beta^2}{2} D_{ij}}
            - 2 (1+\beta^2)^{-k/2} \sum_{i=1}^n e^{-\frac{\beta^2}{2(1+\beta^2)} D_i}
            + n (1+2\beta^2)^{-k/2},

    with :math:`D_{ij} = (x_i - x_j)^\top S_\delta^{-1} (x_i - x_j)`,
    :math:`D_i = (x_i - \bar x)^\top S_\delta^{-1} (x_i - \bar x)` and ``beta`` from
    :func:`henze_zirkler_beta`. ``HZ >= 0``; it is small for Gaussian samples and grows with
    ``n`` for non-Gaussian ones. It is affine invariant, so it only measures the *shape* of the
    sample (use :func:`offdiag_cov_norm` / the ELBO for location and scale).

    Choices (in full: docs/design-notes.md, 'stats.dependence'): ``S`` is the maximum-likelihood
    covariance (divisor ``n``, as Henze & Zirkler 1990; equals pingouin 0.7 and R ``MVN::hz``);
    no value-dependent branches: a ridge :math:`S_\delta = S + (\delta\,\mathrm{tr}(S)/k +
    10^{-30}) I` instead of a rank test, float64 inside (a singular covariance gets a large finite
    value, identical points a gradient of exactly 0: do not start an HZ penalty from all-equal
    means). The whole expression is differentiated: ``O(n^2 k)`` time, ``O(n^2)`` memory.

    Args:
        x: sample of shape ``(n, k)`` (or ``(n,)``, treated as ``k = 1``), ``n >= 3`` and ``n > k``
            (``n <= k`` points have a singular covariance whatever their distribution: a
            ``ValueError``, not the large finite value a collapsed sample gets).
        ridge: relative ridge ``delta`` added to the covariance (``>= 0``).
        compiled: ``None`` (default) computes the statistic and its gradient in one call of the
            compiled kernel (:func:`~pyro_bnnlv.stats._pairwise.compiled_henze_zirkler`, built on
            first use) when it is available, else with torch; ``False`` always uses torch;
            ``True`` requires the kernel. Both agree to float64 round-off (tested).

    Returns:
        0-dim tensor with the dtype of ``x``.
    """
    if torch.jit.is_tracing():  # checks are Python branches on values: run them eagerly only
        x = x.reshape(x.shape[0], -1)
    else:
        x = _as_tensor_2d("x", x)
        if x.shape[0] < 3:
            raise ValueError(f"`x` must have at least 3 rows (datapoints), got {x.shape[0]}")
        if x.shape[0] <= x.shape[1]:
            raise ValueError(
                f"`x` has n={x.shape[0]} rows and k={x.shape[1]} columns: the sample covariance of n <= k "
                f"points has rank at most n - 1 < k, so HZ (which whitens by its inverse) is not defined; "
                f"pass more rows than columns (n > k), e.g. a larger batch or fewer latent dimensions"
            )
        try:
            ridge = check_real(ridge, "`ridge`", nonnegative=True)
        except ValueError as err:  # a non-number stays an ArgumentTypeError (also a TypeError)
            kind = type(err) if isinstance(err, ArgumentTypeError) else ValueError
            raise kind(f"`ridge` must be a finite number >= 0, got {ridge!r}") from None
    return henze_zirkler_unchecked(x, ridge, compiled)


def henze_zirkler_pvalue(hz: float | Tensor, n: int, k: int) -> float:
    r"""Approximate p-value of an observed ``HZ`` under multivariate normality.

    Henze & Zirkler (1990) show ``HZ`` is approximately lognormal under the null; its mean and
    variance are (with ``a = 1 + 2 beta^2``, ``w = (1 + beta^2)(1 + 3 beta^2)``)

    .. math::

        \mu = 1 - a^{-k/2}\Big(1 + \frac{k\beta^2}{a} + \frac{k(k+2)\beta^4}{2a^2}\Big),\\
        \sigma^2 = 2(1+4\beta^2)^{-k/2}
            + 2a^{-k}\Big(1 + \frac{2k\beta^4}{a^2} + \frac{3k(k+2)\beta^8}{4a^4}\Big)
            - 4w^{-k/2}\Big(1 + \frac{3k\beta^4}{2w} + \frac{k(k+2)\beta^8}{2w^2}\Big),

    and the p-value is the survival function of the lognormal with those moments at ``hz``
    (the same approximation as pingouin ``multivariate_normality``). Not differentiable.
    """
    from scipy.stats import lognorm

    hz = float(hz.detach()) if isinstance(hz, Tensor) else float(hz)
    if n < 3 or k < 1:
        raise ValueError(f"need `n` >= 3 and `k` >= 1, got n={n}, k={k}")
    b2 = henze_zirkler_beta(n, k) ** 2
    b4, b8 = b2**2, b2**4
    a = 1.0 + 2.0 * b2
    wb = (1.0 + b2) * (1.0 + 3.0 * b2)
    mu = 1.0 - a ** (-k / 2) * (1.0 + k * b2 / a + k * (k + 2) * b4 / (2.0 * a**2))
    si2 = (
        2.0 * (1.0 + 4.0 * b2) ** (-k / 2)
        + 2.0 * a ** (-k) * (1.0 + 2.0 * k * b4 / a**2 + 3.0 * k * (k + 2) * b8 / (4.0 * a**4))
        - 4.0 * wb ** (-k / 2) * (1.0 + 3.0 * k * b4 / (2.0 * wb) + k * (k + 2) * b8 / (2.0 * wb**2))
    )
    log_mean = math.log(math.sqrt(mu**4 / (si2 + mu**2)))
    log_sd = math.sqrt(math.log1p(si2 / mu**2))
    return float(lognorm.sf(hz, log_sd, scale=math.exp(log_mean)))


# -- Pearson-correlation proxy for I(x; z) -----------------------------------------------------


def pearson_correlation(a: Tensor, b: Tensor, eps: float = 1e-12) -> Tensor:
    r"""Matrix of Pearson correlations between the columns of ``a`` and the columns of ``b``.

    Entry ``(d, j)`` is the summand of Yacoby, Pan & Doshi-Velez (2022), arXiv:1911.00569, eq. 24
    for the pair (column ``d`` of ``a``, column ``j`` of ``b``):

    .. math::

        r_{dj} = \frac{\mathrm{Cov}(a^{(d)}, b^{(j)})}
                      {\sqrt{(\mathbb V[a^{(d)}] + \epsilon)(\mathbb V[b^{(j)}] + \epsilon)}}

    (moments with divisor ``n``). ``eps`` is added to each *variance*, so that a constant column
    gives ``r = 0`` with a finite gradient (``sqrt`` at 0 would give ``0 * inf = NaN``).

    Args:
        a: ``(n, D)`` or ``(n,)``.
        b: ``(n, K)`` or ``(n,)``, same ``n``.
        eps: non-negative constant added to each variance.

    Returns:
        ``(D, K)`` tensor of signed correlations in ``[-1, 1]``, differentiable in ``a`` and ``b``.
    """
    a = _as_tensor_2d("a", a)
    b = _as_tensor_2d("b", b)
    _check_same_n("a", a, "b", b)
    eps = check_real(eps, "`eps`", nonnegative=True)
    dtype = torch.promote_types(a.dtype, b.dtype)
    a, b = a.to(dtype), b.to(dtype)
    n = a.shape[0]
    ac = a - a.mean(dim=0, keepdim=True)
    bc = b - b.mean(dim=0, keepdim=True)
    cov = ac.T @ bc / n
    sd_a = torch.sqrt(ac.square().mean(dim=0) + eps)
    sd_b = torch.sqrt(bc.square().mean(dim=0) + eps)
    return cov / (sd_a[:, None] * sd_b[None, :])


def correlation_penalty(a: Tensor, b: Tensor, reduction: Literal["mean", "max"] = "mean", eps: float = 1e-12) -> Tensor:
    r"""The ``PC`` proxy of Yacoby, Pan & Doshi-Velez 2022 (arXiv:1911.00569) eq. 23-24, as a
    magnitude.

    .. math::  \mathrm{PC}(\{a_n\}, \{b_n\}) = \frac{1}{DK}\sum_{d=1}^D \sum_{j=1}^K |r_{dj}|

    with ``r`` from :func:`pearson_correlation` (``reduction="max"`` gives
    :math:`\max_{d,j} |r_{dj}|` instead).

    Two deliberate departures from eq. 24 as printed (reasons: docs/design-notes.md,
    'stats.dependence'): the **magnitude** ``|r|`` (minimising a signed correlation drives it to
    -1, not to independence), and **all pairs** of dimensions (eq. 24 pairs ``d`` with ``d``); for
    ``K = 1`` this is eq. 24 in magnitude.

    Args:
        a: ``(n, D)`` or ``(n,)``, e.g. the inputs ``x`` (or outputs ``y``).
        b: ``(n, K)`` or ``(n,)``, e.g. the variational means ``mu_z``.
        reduction: ``"mean"`` or ``"max"`` over the ``D * K`` pairs.
        eps: see :func:`pearson_correlation`.

    Returns:
        0-dim tensor in ``[0, 1]``, differentiable in ``a`` and ``b``.
    """
    if reduction not in ("mean", "max"):
        raise ValueError(f"`reduction` must be 'mean' or 'max', got {reduction!r}")
    r = pearson_correlation(a, b, eps=eps).abs()
    return r.mean() if reduction == "mean" else r.max()


# -- off-diagonal covariance penalty -----------------------------------------------------------


def offdiag_cov_norm(z: Tensor, correction: int = 0) -> Tensor:
    r"""``||offdiag Sigma_hat(z)||_2`` of Yacoby, Pan & Doshi-Velez 2022 (arXiv:1911.00569)
    eq. 26-27.

    .. math::

        \Big(\sum_{j \ne l} \hat\Sigma_{jl}^2\Big)^{1/2},\qquad
        \hat\Sigma = \frac{1}{n - \text{correction}} \sum_n (z_n - \bar z)(z_n - \bar z)^\top

    "The l2 penalty of the off-diagonal terms of the empirical covariance": the Frobenius norm of
    ``Sigma_hat - diag(Sigma_hat)`` (both triangles, not squared, not the spectral norm). The
    default ``correction=0`` matches :func:`henze_zirkler`'s covariance. 0 for ``K = 1``; the
    gradient is finite everywhere.

    Args:
        z: ``(n, K)`` or ``(n,)``, e.g. the variational means ``mu_z``.
        correction: 0 (divisor ``n``) or 1 (divisor ``n - 1``).

    Returns:
        0-dim non-negative tensor, differentiable in ``z``.
    """
    z = _as_tensor_2d("z", z)
    n, k = z.shape
    if correction not in (0, 1):
        raise ValueError(f"`correction` must be 0 or 1, got {correction}")
    if not torch.jit.is_tracing() and n - correction < 1:
        raise ValueError(f"`z` must have more than {correction} rows, got {n}")
    return offdiag_cov_norm_unchecked(z, correction)


# -- evaluation metrics (not differentiable) ---------------------------------------------------


def ksg_mutual_information(x: Any, z: Any, k: int = 5, standardize: bool = True) -> float:
    r"""Kraskov-Stoegbauer-Grassberger estimate (in nats) of ``I(x; z)``, App. F.2 of the paper.

    Algorithm 1 of Kraskov, Stoegbauer & Grassberger (2004, Phys. Rev. E 69, 066138, eq. 8):

    .. math::  \hat I = \psi(k) + \psi(N) - \big\langle \psi(n_x + 1) + \psi(n_z + 1) \big\rangle

    where, for each point ``i``, ``eps_i`` is the distance to its ``k``-th nearest neighbour in
    the joint space under the max-norm ``max(||x_i - x_j||_inf, ||z_i - z_j||_inf)``, and
    ``n_x(i)`` (``n_z(i)``) counts the points ``j != i`` with ``||x_i - x_j||_inf < eps_i``
    (strict inequality) in the marginal space. The paper uses ``k = 5`` on ``x`` and the
    variational means ``mu_z``.

    ``standardize=True`` (default) first divides every column of ``x`` and ``z`` by its standard
    deviation (divisor ``n``; constant columns unchanged), as Kraskov et al. recommend and as
    scikit-learn's ``mutual_info_regression`` does (the max-norm mixes the coordinates' units).
    Unlike scikit-learn, no jitter is added and the estimate is **not** clipped at 0.

    **Ties.** Where a point has ``k`` or more exact copies in the joint space, ``eps_i = 0`` and
    the strict counts are undefined; there we use the rule of Gao, Kannan, Oh & Viswanath (2017,
    NeurIPS, arXiv:1709.06212, sec. 3): ``k`` is replaced by ``k~_i``, the number of points
    ``j != i`` at joint distance 0, and ``n_x``, ``n_z`` count the points at marginal distance
    0, so the term is ``psi(k~_i) + psi(N) - psi(n_x + 1) - psi(n_z + 1)`` (for discrete data
    the plug-in MI up to O(1/N)); tie-free data give exactly the KSG estimate.

    Args:
        x: ``(N, D)`` or ``(N,)``; tensor or array-like.
        z: ``(N, K)`` or ``(N,)``, same ``N``.
        k: number of neighbours, ``1 <= k < N``.
        standardize: scale every column to unit standard deviation first.

    Returns:
        The estimate as a Python float.
    """
    xa = _as_numpy_2d("x", x)
    za = _as_numpy_2d("z", z)
    _check_same_n("x", xa, "z", za)
    n = xa.shape[0]
    try:
        k_int = check_int(k, "`k`")
    except ArgumentTypeError:
        raise ArgumentTypeError(f"`k` must be an integer with 1 <= k < N = {n}, got {k!r}") from None
    except ValueError:
        k_int = None
    if k_int is None or not k_int < n:
        raise ValueError(f"`k` must be an integer with 1 <= k < N = {n}, got {k!r}")
    k = k_int
    if standardize:
        xa, za = _unit_std(xa), _unit_std(za)

    joint = np.hstack([xa, za])
    dist, _ = cKDTree(joint).query(joint, k=k + 1, p=np.inf)  # column 0 is the point itself
    # strict inequality: count points at distance <= the largest float below eps_i
    radius = np.nextafter(dist[:, -1], 0.0)
    n_x = cKDTree(xa).query_ball_point(xa, radius, p=np.inf, return_length=True) - 1.0
    n_z = cKDTree(za).query_ball_point(za, radius, p=np.inf, return_length=True) - 1.0
    # ties (Gao et al. 2017): eps_i = 0 -> k~_i = number of exact copies of point i
    k_i = np.full(n, float(k))
    tied = dist[:, -1] == 0.0
    if tied.any():
        k_i[tied] = cKDTree(joint).query_ball_point(joint[tied], 0.0, p=np.inf, return_length=True) - 1.0
    mi = digamma(n) + np.mean(digamma(k_i) - digamma(n_x + 1.0) - digamma(n_z + 1.0))
    return float(mi)


def _unit_std(a: np.ndarray) -> np.ndarray:
    sd = a.std(axis=0)
    return a / np.where(sd > 0, sd, 1.0)


def ks_statistic(mu_z: Any, prior_samples: Any) -> float:
    r"""Two-sample Kolmogorov-Smirnov statistic, App. F.2 of the paper (univariate case).

    .. math::  D = \sup_t \big| F_{\mu_z}(t) - F_{\text{prior}}(t) \big|

    with ``F`` the empirical CDFs of the variational means ``{mu_z_n}`` (representing the
    aggregated posterior ``q(z)``) and of samples from the prior ``p(z)``. Equals
    ``scipy.stats.ks_2samp(mu_z, prior_samples).statistic``. Lower is closer.

    Args:
        mu_z: ``(N,)`` or ``(N, 1)``.
        prior_samples: ``(M,)`` or ``(M, 1)``; ``M`` need not equal ``N``.

    Returns:
        The statistic in ``[0, 1]`` as a Python float.
    """
    a = _as_numpy_2d("mu_z", mu_z)
    b = _as_numpy_2d("prior_samples", prior_samples)
    for name, arr in (("mu_z", a), ("prior_samples", b)):
        if arr.shape[1] != 1:
            raise ValueError(
                f"`{name}` must be univariate, shape (n,) or (n, 1), got {arr.shape}; the KS "
                "statistic is used for K = 1 only"
            )
    a, b = np.sort(a[:, 0]), np.sort(b[:, 0])
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, grid, side="right") / a.size
    cdf_b = np.searchsorted(b, grid, side="right") / b.size
    return float(np.max(np.abs(cdf_a - cdf_b)))
