r"""k-nearest-neighbour (kNN) estimators of differential entropy and KL divergence.

These are the estimators used by NN-HyVI and FuNN-HyVI in Pequignot et al. (2020), "Implicit
variational inference: the parameter and the predictor space", section 3.1:

* :func:`knn_kl` -- the Perez-Cruz (2008) estimator of ``KL(Q, P)``, the paper's eq. (4);
* :func:`knn_entropy` -- the Kozachenko-Leonenko / Singh et al. (2003) entropy estimator,
  the paper's eq. (5) (up to an O(1/N) choice of constant, see its docstring);
* :func:`functional_knn_kl` and :func:`functional_knn_entropy` -- the predictor-space versions,
  eq. (6) and (7), which apply eq. (4)/(5) to the vectors ``f^X = (f(X_0), ..., f(X_{T-1}))``
  of function values at ``T`` inputs ``X ~ nu^T`` and average over independent draws of ``X``;
* :func:`predictor_space_samples` -- evaluates ``S`` weight samples of a parametric predictor at
  ``R`` independent draws of ``T`` inputs, producing the ``(R, S, T[, O])`` tensors those two
  functions take (Alg. 2, lines 7-8 of the paper's supplementary material).

Everything is plain torch, vectorised over draws, and differentiable w.r.t. the samples: the
gradient of the ELBO's KL term (eq. 8-9) flows through the kNN distances.

Numerics
--------
Neighbours are found in two passes: *which* rows are nearest by float64 centred matrix products
without gradients (``k + 2`` candidates per row), *how far* they are by explicit differences in
the inputs' dtype, with gradients.

Ties
----
Exact ties (MCMC repeats, copied samples, ``AutoDelta``) follow two rules: 1. *a sample is a
set* (identical rows of one sample count once: ``n'``, ``m'`` distinct rows); 2. *a tie across
the two samples is the same draw*, left out of ``x_i``'s neighbour search and count,
``m_i = m' - #{j : y_j = x_i}`` (Perez-Cruz 2008, ISIT, pp. 1666-1670; the paper's eq. 4):

.. math:: \widehat{KL} = \frac1{n'} \sum_i \Big[\log\frac{m_i}{n' - 1}
          + d \log\frac{\nu_k(i)}{\rho_k(i)}\Big],

so ``knn_kl(s, s) == 0``. A sample with fewer than ``k + 1`` distinct rows raises a
``ValueError`` (as in Gao, Kannan, Oh & Viswanath 2017, arXiv:1709.06212, ties are counted,
never logged).

High dimension
--------------
The Monte-Carlo sd of :func:`knn_kl` grows like ``0.8 sqrt(d / n)`` nats; the estimators warn
when ``d`` exceeds ``10 n'``.

Support
-------
Where draws of ``p`` lie beyond every draw of ``q`` the KL estimate is biased low, in any
dimension, and as an objective it rewards width. The KL estimators warn when more than 10% of
the first sample lies outside the second's region (threshold ``5 / (m/2 + 1)`` for small ``m``;
fewer than 20 rows are not checked).

Derivations and measurements of all four: docs/design-notes.md, 'stats.knn'.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Literal, Sequence

import torch
from torch import Tensor

from .._checks import check_int

__all__ = [
    "functional_knn_entropy",
    "functional_knn_kl",
    "input_sampler",
    "knn_entropy",
    "knn_kl",
    "log_unit_ball_volume",
    "predictor_space_samples",
]

EntropyCorrection = Literal["paper", "rescaled", "none"]

_DTYPES = (torch.float32, torch.float64)

# d / n above which the estimators warn (module docstring, "High dimension")
_MAX_DIM_PER_SAMPLE = 10
# share of the first sample outside the second's region above which KL estimates warn ("Support")
_MAX_SHARE_OUTSIDE = 0.1


# -- helpers -----------------------------------------------------------------------------------
def log_unit_ball_volume(d: int) -> float:
    r"""``log V_d = (d/2) log(pi) - lgamma(d/2 + 1)``, the log volume of the unit ball in R^d
    (in log space: ``Gamma(d/2 + 1)`` overflows float64 for ``d > 340``)."""
    d = check_int(d, "d")
    return 0.5 * d * math.log(math.pi) - math.lgamma(0.5 * d + 1.0)


def _digamma(x: int) -> float:
    return float(torch.special.digamma(torch.tensor(float(x), dtype=torch.float64)))


def _check_tensor(x: Tensor, name: str, ndims: tuple[int, ...]) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() not in ndims:
        raise ValueError(f"{name} must have {' or '.join(map(str, ndims))} dimensions, got shape {tuple(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"{name} must be float32 or float64, got {x.dtype}")
    if x.numel() == 0 or any(s == 0 for s in x.shape):
        raise ValueError(f"{name} must be non-empty, got shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains non-finite values (nan or inf)")


def _check_rows(n: int, name: str, minimum: int, k: int, what: str) -> None:
    if n < minimum:
        raise ValueError(f"{name} has {n} samples but k={k} needs at least {minimum} ({what})")


def _row_ids(x: Tensor) -> Tensor:
    """``(..., n)`` integer ids of the rows of ``x`` (..., n, d), equal for rows equal within a
    batch (``torch.unique`` with the batch index as a leading key: ``-0.0 == 0.0``, nothing else)."""
    n, d = x.shape[-2:]
    flat = x.detach().reshape(-1, n, d)
    b = flat.shape[0]
    batch = torch.arange(b, dtype=x.dtype, device=x.device).repeat_interleave(n)
    rows = torch.cat([batch[:, None], flat.reshape(b * n, d)], dim=1)
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    return inverse.reshape(x.shape[:-1])


def _first_occurrences(ids: Tensor, num_ids: int | None = None) -> Tensor:
    """``(..., n)`` mask of the rows whose id has no earlier row with the same id (ids unique
    across batches, as :func:`_row_ids` makes them, and below ``num_ids``, default
    ``ids.numel()``: a bound from shapes, not values, so that a trace stays valid)."""
    flat = ids.reshape(-1)
    index = torch.arange(flat.numel(), device=ids.device)
    size = flat.numel() if num_ids is None else num_ids
    first = torch.full((size,), flat.numel(), device=ids.device, dtype=index.dtype)
    first = first.scatter_reduce(0, flat, index, reduce="amin")
    return (first[flat] == index).reshape(ids.shape)


# candidates re-measured exactly beyond the k nearest by the matrix-product distances
_EXTRA_CANDIDATES = 2


def _chunk(n: int, m: int) -> int:
    """Batch entries per block of the candidate search: float64 ``(block, n, m)`` matrices of at
    most 2^24 entries (128 MB), e.g. one at a time for predictor-space KLs of 1,000 x 1,000 draws."""
    return max(1, 2**24 // (n * m))


def _candidates(x: Tensor, y: Tensor, ok: Tensor, c: int) -> tuple[Tensor, Tensor]:
    """Indices ``(B, n, c)`` of the ``c`` nearest admissible rows of ``y`` by float64 centred
    matrix products, and whether each is admissible (no gradient)."""
    x64, y64 = x.detach().double(), y.detach().double()
    centre = x64.mean(-2, keepdim=True)
    x64, y64 = x64 - centre, y64 - centre
    sq = x64.square().sum(-1, keepdim=True) + y64.square().sum(-1).unsqueeze(-2) - 2 * x64 @ y64.mT
    approx, index = sq.masked_fill(~ok, math.inf).topk(c, dim=-1, largest=False, sorted=True)
    return index, torch.isfinite(approx)


def _log_kth_distance(x: Tensor, y: Tensor, admissible: Tensor, k: int) -> Tensor:
    """Log distance from each row of ``x`` (..., n, d) to its k-th nearest admissible row of
    ``y`` (..., m, d); ``admissible`` is a boolean ``(..., n, m)`` (identical rows are never
    admissible: module docstring, "Ties"). Returns ``(..., n)``; ``+inf`` where fewer than ``k``
    rows are admissible. Differentiable w.r.t. ``x`` and ``y`` (module docstring, "Numerics").
    """
    batch, (n, d), m = x.shape[:-2], x.shape[-2:], y.shape[-2]
    x3, y3, ok = x.reshape(-1, n, d), y.reshape(-1, m, d), admissible.reshape(-1, n, m)
    c = min(k + _EXTRA_CANDIDATES, m)
    with torch.no_grad():  # which rows are the nearest: matrix products in float64, centred
        found = [
            _candidates(x3[b : b + _chunk(n, m)], y3[b : b + _chunk(n, m)], ok[b : b + _chunk(n, m)], c)
            for b in range(0, x3.shape[0], _chunk(n, m))
        ]
        index = torch.cat([f[0] for f in found])  # (B, n, c)
        valid = torch.cat([f[1] for f in found])
    # how far they are: explicit coordinate differences, in the inputs' dtype, with gradients
    near = torch.gather(y3, 1, index.reshape(y3.shape[0], n * c, 1).expand(-1, -1, d)).reshape(-1, n, c, d)
    sq_exact = (x3.unsqueeze(-2) - near).square().sum(-1)
    # an inadmissible slot (fewer than c admissible rows) may hold x_i itself: keep sqrt off 0
    dist = torch.where(valid, sq_exact, torch.ones_like(sq_exact)).sqrt().masked_fill(~valid, math.inf)
    kth = dist.topk(k, dim=-1, largest=False, sorted=True).values[..., k - 1]
    return kth.log().reshape(*batch, n)


def _within(x: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """For a batch ``x`` (..., n, d): ``keep`` (..., n), the distinct rows; ``n_eff`` (...),
    their number; ``log_rho`` (..., n), the log distance from each row to its k-th nearest
    *other distinct* row (finite once ``n_eff > k``, which :func:`_check_distinct` enforces)."""
    ids = _row_ids(x)
    keep = _first_occurrences(ids)
    admissible = keep.unsqueeze(-2) & (ids.unsqueeze(-1) != ids.unsqueeze(-2))
    log_rho = _log_kth_distance(x, x, admissible, k)
    return keep, keep.sum(-1), log_rho


def _check_distinct(n_eff: Tensor, n: int, name: str, minimum: int, k: int, what: str) -> int:
    """Raise unless every batch has ``minimum`` distinct rows; return the smallest count (``n``
    under the JIT, where this data-dependent check is skipped)."""
    if torch.jit.is_tracing():
        return n
    low = int(n_eff.min())
    if low < minimum:
        raise ValueError(
            f"{name} has {low} distinct rows (of {n}) but k={k} needs at least {minimum} ({what}); "
            "duplicated rows count once (a point mass or a copied sample has no k-NN density "
            "estimate): pass draws with spread, or more of them"
        )
    return low


def _masked_mean(values: Tensor, keep: Tensor, n_eff: Tensor) -> Tensor:
    """Mean of ``values`` over the kept rows (last dim); rows not kept contribute exactly 0."""
    return torch.where(keep, values, torch.zeros_like(values)).sum(-1) / n_eff.to(values.dtype)


def _warn_if_high_dimensional(n: int, d: int, name: str) -> None:
    """Warn when ``d`` exceeds ``_MAX_DIM_PER_SAMPLE * n``: the estimate has lost its meaning."""
    if d > _MAX_DIM_PER_SAMPLE * n:
        warnings.warn(
            f"{name}: dimension d={d} is {d / n:.3g} times the number of distinct samples n={n} "
            f"(d/n > {_MAX_DIM_PER_SAMPLE}): the k-NN estimate is meaningless here, its noise "
            f"alone is ~{0.8 * math.sqrt(d / n):.2g} nats (0.8 sqrt(d/n)) and its bias grows "
            "like d, possibly with the wrong sign (module docstring, 'High dimension'); use "
            "many more samples or a lower-dimensional summary",
            UserWarning,
            stacklevel=3,
        )


def _warn_if_outside_support(x: Tensor, y: Tensor, names: Sequence[str]) -> None:
    """Warn when many rows of ``x`` lie outside the region the sample ``y`` covers.

    Radius of a row: its norm after standardising every coordinate by the mean and sd of the
    even rows of ``y``. A row of ``x`` beyond the largest radius of the odd rows of ``y`` sits
    where ``y`` has no draws, so the k-NN estimate of ``y``'s density there (``nu_k``) falls off
    linearly in distance where the true log-density falls off much faster: the KL estimate is
    biased low (module docstring, "Support"). The odd rows are not used for the standardisation,
    so under ``x ~ y`` they and the rows of ``x`` are exchangeable and the expected share is
    ``1 / (m_odd + 1)`` in any dimension (standardising by all of ``y`` shrinks ``y``'s own
    radii by ``~ 4 d / m`` against ``x``'s and raises false alarms when ``d >> m``).
    """
    m = y.shape[-2] // 2
    if m < 10:  # too few draws to say where y has none
        return
    with torch.no_grad():
        fit, held_out = y[..., 0 : 2 * m : 2, :], y[..., 1 : 2 * m : 2, :]
        mean = fit.mean(-2, keepdim=True)
        sd = fit.std(-2, keepdim=True).clamp_min(torch.finfo(y.dtype).tiny)
        r_x = ((x - mean) / sd).square().sum(-1)  # (..., n)
        r_y = ((held_out - mean) / sd).square().sum(-1).amax(-1, keepdim=True)  # (..., 1)
        share = float((r_x > r_y).to(x.dtype).mean(-1).max())
    if share > max(_MAX_SHARE_OUTSIDE, 5.0 / (m + 1)):
        warnings.warn(
            f"{share:.0%} of the rows of {names[0]} lie outside the region {names[1]} covers (farther "
            f"from its centre, per standardised coordinate, than any of {m} of its rows): the k-NN "
            f"density of {names[1]} cannot be estimated there and the KL estimate is biased low, "
            "possibly negative (measured: KL(N(0, 4I) || N(0, I)) in d = 30 from 500 draws each "
            "gives -3.3 for a true +24.2; module docstring, 'Support'); draw the second sample from "
            "a distribution that covers the first",
            UserWarning,
            stacklevel=4,
        )


def _entropy(x: Tensor, k: int, name: str) -> Tensor:
    """Kozachenko-Leonenko estimate for a batch ``x`` (..., n, d) -> (...), over distinct rows."""
    n, d = x.shape[-2:]
    keep, n_eff, log_r = _within(x, k)
    low = _check_distinct(n_eff, n, name, k + 1, k, "each point needs k other points")
    _warn_if_high_dimensional(low, d, name)
    n_f = n_eff.to(x.dtype)
    const = torch.special.digamma(n_f) - _digamma(k) + log_unit_ball_volume(d)
    return const + d * _masked_mean(log_r, keep, n_eff)


def _kl(x: Tensor, y: Tensor, k: int, names: tuple[str, str]) -> Tensor:
    """Perez-Cruz estimate of KL(law of x || law of y) for batches (..., n, d), (..., m, d).

    Per distinct row ``x_i``: ``log(m_i / (n' - 1)) + d log(nu_k(i) / rho_k(i))`` with ``n'``
    distinct rows of ``x`` and ``m_i`` distinct rows of ``y`` other than ``x_i`` itself (module
    docstring, "Ties"); the estimate is the mean over the distinct rows of ``x``.
    """
    n, d = x.shape[-2:]
    m = y.shape[-2]
    keep, n_eff, log_rho = _within(x, k)
    low = _check_distinct(n_eff, n, names[0], k + 1, k, "each point needs k other points")
    ids = _row_ids(torch.cat([x, y], dim=-2))  # joint ids: a row of y identical to x_i shares its id
    ids_x, ids_y = ids[..., :n], ids[..., n:]
    keep_y = _first_occurrences(ids_y, ids.numel()).unsqueeze(-2)  # (..., 1, m)
    admissible = keep_y & (ids_x.unsqueeze(-1) != ids_y.unsqueeze(-2))  # (..., n, m)
    m_i = admissible.sum(-1)  # (..., n): y's distinct rows, x_i itself excluded
    _check_distinct(torch.where(keep, m_i, m), m, names[1], k, k, "k neighbours of each p-sample are needed")
    # counted as p's rows are: a q with k or fewer distinct rows (a point mass, KL = +inf) has no
    # k-NN density estimate, however many copies it holds
    _check_distinct(
        keep_y.sum(-1),
        m,
        names[1],
        k + 1,
        k,
        "q's k-NN density needs k + 1 distinct rows; KL(p || a point mass) is +inf",
    )
    _warn_if_high_dimensional(low, d, names[0])
    _warn_if_outside_support(x, y, names)
    log_nu = _log_kth_distance(x, y, admissible, k)
    n_f = n_eff.to(x.dtype).unsqueeze(-1)
    log_counts = torch.log(m_i.to(x.dtype) / (n_f - 1))
    return _masked_mean(log_counts + d * (log_nu - log_rho), keep, n_eff)


# -- parameter space: eq. (4) and (5) ----------------------------------------------------------
def knn_entropy(samples: Tensor, k: int = 1) -> Tensor:
    r"""kNN (Kozachenko-Leonenko) estimate of the differential entropy, in nats.

    For ``samples = {x_i}_{i<n}`` in R^d (i.i.d. from a density ``q``) and ``rho_k(i)`` the
    Euclidean distance from ``x_i`` to its k-th nearest neighbour in ``{x_j}_{j != i}``:

    .. math::

        \hat H_k = \psi(n) - \psi(k) + \log V_d + \frac{d}{n} \sum_{i<n} \log \rho_k(i),
        \qquad \log V_d = \tfrac d2 \log\pi - \log\Gamma(\tfrac d2 + 1).

    **Relation to the paper's eq. (5).** Eq. (5) (Singh et al., 2003) has ``ln N`` where we use
    ``psi(N)`` (Kozachenko-Leonenko as written by Kraskov et al., 2004, which makes
    ``E[ln u] = psi(k) - psi(N)`` exact); they differ by ``1/(2N) + O(1/N^2)``, with no effect on
    gradients (docs/design-notes.md, 'stats.knn').

    Args:
        samples: ``(n, d)`` float32/float64 tensor of i.i.d. samples, ``n > k``.
        k: neighbour order. Small ``k`` has less bias; larger ``k`` is more robust to
            (near-)duplicate samples (paper, below eq. 4).

    Returns:
        0-dim tensor (same dtype as ``samples``), differentiable w.r.t. ``samples``.
        Exact duplicates are handled as described in the module docstring.
    """
    k = check_int(k, "k")
    _check_tensor(samples, "samples", (2,))
    _check_rows(samples.shape[0], "samples", k + 1, k, "each point needs k other points")
    return _entropy(samples, k, "samples")


def knn_kl(p_samples: Tensor, q_samples: Tensor, k: int = 1) -> Tensor:
    r"""Perez-Cruz (2008) kNN estimate of ``KL(p || q)`` from samples of ``p`` and ``q``.

    For ``x_i ~ p`` (``i < n``) and ``y_j ~ q`` (``j < m``) in R^d, with ``rho_k(i)`` the
    distance from ``x_i`` to its k-th nearest neighbour in ``{x_j}_{j != i}`` and ``nu_k(i)``
    the distance from ``x_i`` to its k-th nearest neighbour in ``{y_j}``:

    .. math::

        \widehat{KL}_k(p \,\|\, q) = \log\frac{m}{n-1}
            + \frac{d}{n} \sum_{i<n} \log\frac{\nu_k(i)}{\rho_k(i)} .

    This is the paper's eq. (4), ``KL_k(Q~, P~) = ln(M/(N-1)) + d/N sum_i ln(s_k(q_i)/r_k(q_i))``,
    with the paper's ``(Q~, N, r_k, P~, M, s_k)`` being our ``(p_samples, n, rho_k, q_samples,
    m, nu_k)``.

    **Argument order.** The *first* argument is the distribution the expectation is taken
    under, the one whose within-sample distances appear in the denominator. In the hypernet
    objectives (eq. 8-9, Alg. 1 line 7) the KL term is ``KL(Q, P)`` from the variational
    distribution to the prior, so call ``knn_kl(guide_samples, prior_samples)``.

    The estimate is consistent (Perez-Cruz, 2008) but, unlike KL itself, can be negative at
    finite sample size, and it is invariant to a common rescaling of both samples.

    Args:
        p_samples: ``(n, d)`` samples of ``p`` (the guide / variational distribution), ``n > k``.
        q_samples: ``(m, d)`` samples of ``q`` (the prior), with more than ``k`` distinct rows
            (a point mass ``q`` is refused: ``KL(p || q)`` is ``+inf``).
        k: neighbour order, the same for both distances.

    Returns:
        0-dim tensor, differentiable w.r.t. both sample tensors (dtypes are promoted to the
        common one).
    """
    k = check_int(k, "k")
    _check_tensor(p_samples, "p_samples", (2,))
    _check_tensor(q_samples, "q_samples", (2,))
    if p_samples.shape[1] != q_samples.shape[1]:
        raise ValueError(
            f"p_samples and q_samples must have the same dimension d, got {p_samples.shape[1]} and {q_samples.shape[1]}"
        )
    _check_rows(p_samples.shape[0], "p_samples", k + 1, k, "each point needs k other points")
    _check_rows(q_samples.shape[0], "q_samples", k + 1, k, "q's k-NN density needs k + 1 distinct rows")
    dtype = torch.promote_types(p_samples.dtype, q_samples.dtype)
    return _kl(p_samples.to(dtype), q_samples.to(dtype), k, ("p_samples", "q_samples"))


# -- predictor space: eq. (6) and (7) ----------------------------------------------------------
def _flatten_function_values(f: Tensor, name: str) -> tuple[Tensor, int]:
    """(R, S, T) or (R, S, T, O) -> ((R, S, T*O), T)."""
    _check_tensor(f, name, (3, 4))
    return f.reshape(f.shape[0], f.shape[1], -1), f.shape[2]


def functional_knn_entropy(f_samples: Tensor, k: int = 1, correction: EntropyCorrection = "paper") -> Tensor:
    r"""Predictor-space entropy estimate, the paper's eq. (7).

    ``f_samples[r, i]`` is the vector ``f_i^{X_r} = (f_i(X_{r,0}), ..., f_i(X_{r,T-1}))`` of the
    i-th function sample evaluated at the r-th draw ``X_r ~ nu^T`` of ``T`` inputs (for
    vector-valued predictors the ``O`` outputs are concatenated, so each point lives in
    R^{T*O}). The expectation over ``X ~ nu^T`` in eq. (7) is the average over the ``R`` draws:

    .. math::

        \hat H^\nu_k = \frac1R \sum_{r<R} \hat H_k(\{f_i^{X_r}\}_{i<S}) + c_T ,

    with :func:`knn_entropy` as ``\hat H_k`` and the constant ``c_T`` chosen by ``correction``:

    * ``"paper"`` (default): ``c_T = -(1/2) ln T``, eq. (7) exactly as printed.
    * ``"rescaled"``: ``c_T = -(T*O/2) ln T``, the shift a ``T^{-1/2}`` rescaling of all
      distances makes in R^{T*O}: targets ``E_X H(T^{-1/2} f^X)``.
    * ``"none"``: ``c_T = 0``; the estimate targets ``E_X H(f^X)``.

    The options differ by a constant, so gradients do not depend on the choice (why no choice is
    T-independent: docs/design-notes.md, 'stats.knn').

    Args:
        f_samples: ``(R, S, T)`` or ``(R, S, T, O)`` function values, ``S > k``.
        k: neighbour order.
        correction: ``"paper"``, ``"rescaled"`` or ``"none"``, see above.

    Returns:
        0-dim tensor, differentiable w.r.t. ``f_samples``.
    """
    k = check_int(k, "k")
    if correction not in ("paper", "rescaled", "none"):
        raise ValueError(f"correction must be 'paper', 'rescaled' or 'none', got {correction!r}")
    flat, num_inputs = _flatten_function_values(f_samples, "f_samples")
    _check_rows(flat.shape[1], "f_samples (dim 1)", k + 1, k, "each point needs k other points")
    d = flat.shape[2]
    if correction == "paper":
        c_t = -0.5 * math.log(num_inputs)
    elif correction == "rescaled":
        c_t = -0.5 * d * math.log(num_inputs)
    else:
        c_t = 0.0
    return _entropy(flat, k, "f_samples").mean() + c_t


def functional_knn_kl(f_p: Tensor, f_q: Tensor, k: int = 1) -> Tensor:
    r"""Predictor-space KL estimate, the paper's eq. (6): ``KL^nu_k(F~, G~)``.

    .. math::

        \widehat{KL}^\nu_k = \frac1R \sum_{r<R}
            \widehat{KL}_k(\{f_i^{X_r}\}_{i<S}, \{g_j^{X_r}\}_{j<S'}),

    with :func:`knn_kl` as ``\widehat{KL}_k``. As in eq. (6) and Alg. 2 (lines 7-9), both
    sample sets of draw ``r`` must be evaluated at the *same* inputs ``X_r``; use
    :func:`predictor_space_samples` with a tuple of weight samples to get that. No ``ln T``
    correction: eq. (4) only involves ratios of distances, so the ``T^{-1/2}`` scaling cancels
    (paper, below eq. 6).

    Args:
        f_p: ``(R, S, T[, O])`` values of samples of ``p`` -- the variational distribution in
            FuNN-HyVI (eq. 9), ``S > k``.
        f_q: ``(R, S', T[, O])`` values of samples of ``q`` -- the prior, ``S' > k`` distinct.
        k: neighbour order.

    Returns:
        0-dim tensor, the estimate of ``KL(p || q)`` in predictor space, differentiable w.r.t.
        both inputs.
    """
    k = check_int(k, "k")
    x, _ = _flatten_function_values(f_p, "f_p")
    y, _ = _flatten_function_values(f_q, "f_q")
    if f_p.dim() != f_q.dim() or f_p.shape[0] != f_q.shape[0] or f_p.shape[2:] != f_q.shape[2:]:
        raise ValueError(
            f"f_p and f_q must agree in the number of draws R (dim 0) and in the "
            f"inputs/outputs (dims 2:), got shapes {tuple(f_p.shape)} and "
            f"{tuple(f_q.shape)}"
        )
    _check_rows(x.shape[1], "f_p (dim 1)", k + 1, k, "each point needs k other points")
    _check_rows(y.shape[1], "f_q (dim 1)", k + 1, k, "q's k-NN density needs k + 1 distinct rows")
    dtype = torch.promote_types(x.dtype, y.dtype)
    return _kl(x.to(dtype), y.to(dtype), k, ("f_p", "f_q")).mean()


def input_sampler(input_dist: Any, generator: torch.Generator | None = None) -> Callable[[int], Tensor]:
    """``T -> (T, D)`` draws from an input distribution ``nu`` given in any of three forms.

    ``input_dist`` is a torch/Pyro ``Distribution`` (sampled ``(T,)``), a tensor of inputs whose
    rows are drawn uniformly with replacement (with ``generator``, default torch's global one), or
    a callable ``T -> (T, D)``. Used by :func:`predictor_space_samples` callers: the FuNN-HyVI
    ELBO and :func:`~pyro_bnnlv.stats.posterior_kl.compare_posteriors`.
    """
    if isinstance(input_dist, torch.distributions.Distribution):

        def sample(T: int) -> Tensor:
            return input_dist.sample((T,)).reshape(T, -1)

        return sample
    if isinstance(input_dist, Tensor):
        pool = input_dist.reshape(input_dist.shape[0], -1)

        def sample(T: int) -> Tensor:
            return pool[torch.randint(pool.shape[0], (T,), generator=generator)]

        return sample
    if callable(input_dist):

        def sample(T: int) -> Tensor:
            return torch.as_tensor(input_dist(T)).reshape(T, -1)

        return sample
    raise TypeError(
        "input_dist must be a callable T -> (T, D) inputs, a torch Distribution or a tensor of "
        f"inputs to draw rows from; got {type(input_dist).__name__}"
    )


def predictor_space_samples(
    fn: Callable[[Tensor, Tensor], Tensor],
    weight_samples: Tensor | Sequence[Tensor],
    input_sampler: Callable[[int], Tensor],
    num_draws: int,
    num_inputs: int,
) -> Tensor | tuple[Tensor, ...]:
    r"""Evaluate function samples at ``num_draws`` independent draws of ``num_inputs`` inputs.

    For ``r < R = num_draws``: ``X_r = input_sampler(T)`` (shape ``(T, D)``, a draw from
    ``nu^T``) and ``out[r] = fn(X_r, w)`` of shape ``(S, T)`` or ``(S, T, O)`` for weight
    samples ``w`` of shape ``(S, P)``. This is Alg. 2, lines 7-8 (repeated ``R`` times to
    Monte-Carlo the expectations in eq. 6-7).

    Args:
        fn: ``fn(x, w)`` maps inputs ``(T, D)`` and weights ``(S, P)`` to ``(S, T[, O])``.
        weight_samples: a tensor ``(S, P)``, or a sequence of them (e.g. ``(guide_w,
            prior_w)``), which are then all evaluated at the same inputs, as eq. (6) requires.
        input_sampler: ``input_sampler(T)`` returns a ``(T, D)`` tensor of inputs drawn from
            ``nu``.
        num_draws: ``R >= 1``.
        num_inputs: ``T >= 1``.

    Returns:
        ``(R, S, T[, O])`` tensor, or a tuple of them if ``weight_samples`` was a sequence.
        Differentiable w.r.t. the weight samples.
    """
    num_draws, num_inputs = check_int(num_draws, "num_draws"), check_int(num_inputs, "num_inputs")
    single = isinstance(weight_samples, Tensor)
    weights = (weight_samples,) if single else tuple(weight_samples)
    if not weights or not all(isinstance(w, Tensor) and w.dim() >= 1 for w in weights):
        raise ValueError("weight_samples must be a tensor (S, P) or a non-empty sequence of them")
    values: list[list[Tensor]] = [[] for _ in weights]
    for _ in range(num_draws):
        x = input_sampler(num_inputs)
        if not isinstance(x, Tensor) or x.dim() < 1 or x.shape[0] != num_inputs:
            raise ValueError(
                f"input_sampler({num_inputs}) must return a tensor with "
                f"{num_inputs} rows, got {getattr(x, 'shape', type(x))}"
            )
        for out, w in zip(values, weights):
            f = fn(x, w)
            if f.dim() not in (2, 3) or tuple(f.shape[:2]) != (w.shape[0], num_inputs):
                raise ValueError(
                    f"fn(x, w) must return shape (S, T) or (S, T, O) = "
                    f"({w.shape[0]}, {num_inputs}[, O]), got {tuple(f.shape)}"
                )
            out.append(f)
    stacked = tuple(torch.stack(out) for out in values)
    return stacked[0] if single else stacked
