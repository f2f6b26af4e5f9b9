r"""Differentiable statistics of the dependence between inputs ``x`` and latent means ``mu_z``.

The NCAI constraint (Yacoby, Pan & Doshi-Velez 2022, arXiv:1911.00569, eq. 9-10, 13) is
``I(x; z) = 0``; the paper penalises a proxy (eq. 23-24, the Pearson correlation ``PC``) and
names the proxy as its limitation (sec. 8). :func:`independence_statistic` offers, behind one
API, the proxies a penalty can use, each differentiable in ``mu_z``:

* ``"hsic-multiscale"`` -- the normalised HSIC (centred kernel alignment) averaged over a grid of
  Gaussian bandwidths ``c h_x`` and ``c h_z`` for ``c`` in ``scales`` (all pairs), where ``h_x``,
  ``h_z`` are the median heuristics (median pairwise distance of the batch, no gradient):

  .. math::

      T(x, \mu) = \frac{1}{|C|^2}\sum_{c, c' \in C}
          \frac{\operatorname{tr}(\tilde K_c \tilde L_{c'})}
               {\lVert\tilde K_c\rVert_F \lVert\tilde L_{c'}\rVert_F},
      \quad K_c = \exp\!\big(-\lVert x_i - x_j\rVert^2 / (2 c^2 h_x^2)\big),\
      \tilde K = HKH .

  Small ``c`` resolves dependence finer than the spread of ``x``; every term is in ``[0, 1]`` and
  ``T = 0`` in the population iff independent (Gretton et al. 2005; Cortes, Mohri & Rostamizadeh
  2012). Why several bandwidths: docs/design-notes.md, 'stats.independence'.
* ``"knn-mi"`` -- a differentiable k-nearest-neighbour estimate of ``I(x; mu_z)`` in nats
  (:func:`knn_mutual_information`): how much closer each ``mu_n`` is to the ``mu`` of its
  ``x``-neighbours than to the ``mu`` of random points. ``x`` is fixed data, so its
  neighbourhoods are data, not parameters; the gradient moves each ``mu_n`` relative to them.
* ``"knn-mi-multiscale"`` -- ``knn-mi`` at several neighbourhood sizes (``m`` in 8, 16, 32, 64),
  each estimate floored at 0 and the floors averaged (:func:`multiscale_knn_mi`), with reference
  sets drawn afresh at every call (the measured case for both: docs/design-notes.md,
  'stats.independence').
* ``"knn-mi-wide"`` -- the same at sizes that grow with the batch, doubling from 8 up to a quarter
  of it (:func:`doubling_sizes`), each estimated at 128 random anchor points per call: trained at
  sizes up to 64, ``"knn-mi-multiscale"`` left the dependence at coarser neighbourhoods
  (docs/results.md, 'Where knn-mi-multiscale goes quiet').
* ``"dcor"`` -- the squared distance correlation (Szekely, Rizzo & Bakirov 2007, eq. 2.7-2.9, the
  V-statistic), in ``[0, 1]``, 0 in the population iff independent.
* ``"hsic"`` -- today's NCAI term, :func:`~pyro_bnnlv.stats.hsic.normalized_hsic` (one
  bandwidth, ``h^2 = sum_d Var``).
* ``"pc"`` -- the paper's printed proxy for ``x``, eq. 24 in magnitude
  (:func:`~pyro_bnnlv.stats.dependence.correlation_penalty`); the paper's second factor, the
  correlation with ``y``, is the caller's (it needs ``y`` and its own ``eps_y``).

``docs/bench/independence_terms.py`` validates them against KSG on synthetic dependence patterns
and states their null distributions (``tests/test_stats_independence.py`` checks the same at a
smaller size).
"""

from __future__ import annotations

import functools
from typing import Literal, Sequence

import torch
from torch import Tensor

from .._checks import check_int, check_real
from ._inputs import _as_tensor_2d, _check_same_n
from ._pairwise import _centre
from .dependence import correlation_penalty
from .hsic import _sq_dists, normalized_hsic

__all__ = [
    "DEFAULT_SCALES",
    "KINDS",
    "distance_correlation",
    "doubling_sizes",
    "independence_statistic",
    "knn_mutual_information",
    "multiscale_hsic",
    "multiscale_knn_mi",
]

Kind = Literal["hsic-multiscale", "knn-mi", "knn-mi-multiscale", "knn-mi-wide", "dcor", "hsic", "pc"]
#: The statistics :func:`independence_statistic` computes.
KINDS: tuple[str, ...] = ("hsic-multiscale", "knn-mi", "knn-mi-multiscale", "knn-mi-wide", "dcor", "hsic", "pc")
#: Neighbourhood sizes of ``"knn-mi-multiscale"``.
DEFAULT_SIZES: tuple[int, ...] = (8, 16, 32, 64)
#: Anchor points per size and call of ``"knn-mi-wide"``.
WIDE_ANCHORS = 128
#: Bandwidth multiples of the median heuristic used by ``"hsic-multiscale"``.
DEFAULT_SCALES: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.0)


def _median_distance_sq(d2: Tensor) -> Tensor:
    """Squared median heuristic: the median of the off-diagonal squared distances (no grad),
    floored so that a constant sample gives a finite bandwidth."""
    n = d2.shape[0]
    off = d2.detach()[~torch.eye(n, dtype=torch.bool, device=d2.device)]
    med = off.median()
    return torch.where(med > 0, med, off.mean() + 1e-12)


def _check_scales(scales: Sequence[float]) -> tuple[float, ...]:
    if isinstance(scales, (str, bytes)) or not hasattr(scales, "__len__") or len(scales) == 0:
        raise ValueError(f"scales must be a non-empty sequence of positive numbers, got {scales!r}")
    return tuple(check_real(c, f"scales[{i}]", positive=True) for i, c in enumerate(scales))


def _unbiased_hsic(k: Tensor, l_: Tensor) -> Tensor:
    """Song et al. (2012, JMLR 13, eq. 5) unbiased HSIC of Grams with zeroed diagonals."""
    n = k.shape[0]
    cross = (k * l_).sum() + k.sum() * l_.sum() / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * (k.sum(1) @ l_.sum(1))
    return cross / (n * (n - 3))


def multiscale_hsic(x: Tensor, mu_z: Tensor, scales: Sequence[float] = DEFAULT_SCALES) -> Tensor:
    r"""Debiased normalised HSIC averaged over all pairs of bandwidths ``(c h_x, c' h_z)``,
    ``c, c'`` in ``scales`` (median heuristics ``h``); the formula is in the module docstring,
    with each ``tr(K~ L~)`` replaced by the unbiased HSIC of Song et al. (2012, eq. 5) (so a
    near-diagonal Gram at a small bandwidth does not inflate the norms, and the null mean is 0;
    the value can be slightly negative). Differentiable in both samples (bandwidths carry no
    gradient); needs ``n >= 4``; ``O(|scales|^2 n^2)``."""
    a, b = _as_tensor_2d("x", x), _as_tensor_2d("mu_z", mu_z)
    _check_same_n("x", a, "mu_z", b)
    if a.shape[0] < 4:
        raise ValueError(f"hsic-multiscale needs at least 4 rows, got {a.shape[0]}")
    scales = _check_scales(scales)
    a = a.to(b.dtype)
    off = (~torch.eye(a.shape[0], dtype=torch.bool, device=a.device)).to(b.dtype)
    grams = []
    for sample in (a, b):
        d2 = _sq_dists(sample)
        m2 = _median_distance_sq(d2)
        grams.append([torch.exp(-d2 / (2.0 * c * c * m2)) * off for c in scales])
    self_x = [_unbiased_hsic(k, k) for k in grams[0]]
    self_z = [_unbiased_hsic(l_, l_) for l_ in grams[1]]
    terms = [
        _unbiased_hsic(k, l_) / (sx * sz).clamp(min=1e-24).sqrt()
        for k, sx in zip(grams[0], self_x)
        for l_, sz in zip(grams[1], self_z)
    ]
    return torch.stack(terms).mean()


def distance_correlation(x: Tensor, mu_z: Tensor, eps: float = 1e-12) -> Tensor:
    r"""Squared distance correlation (V-statistic) of Szekely, Rizzo & Bakirov (2007):

    .. math::  \mathrm{dCor}^2 = \frac{\langle A, B\rangle}{\lVert A\rVert_F \lVert B\rVert_F},
               \quad A = H D^x H,\ B = H D^\mu H,\ D_{ij} = \lVert a_i - a_j\rVert,

    in ``[0, 1]``. Distances are ``sqrt(d^2 + eps)`` off the diagonal (0 on it), so the
    gradient is finite where two points coincide."""
    a, b = _as_tensor_2d("x", x), _as_tensor_2d("mu_z", mu_z)
    _check_same_n("x", a, "mu_z", b)
    a = a.to(b.dtype)
    off = ~torch.eye(a.shape[0], dtype=torch.bool, device=a.device)
    cents = []
    for sample in (a, b):
        dist = torch.where(off, (_sq_dists(sample) + eps).sqrt(), torch.zeros((), dtype=b.dtype))
        cents.append(_centre(dist))
    num = (cents[0] * cents[1]).sum()
    return num / ((cents[0].square().sum() * cents[1].square().sum()).sqrt() + eps)


def _standardise(a: Tensor) -> Tensor:
    sd = a.detach().std(0, unbiased=False)
    return a / torch.where(sd > 0, sd, torch.ones_like(sd))


@functools.lru_cache(maxsize=8)
def _reference_sets(n: int, m: int, subsets: int, seed: int) -> Tensor:
    """``(subsets, n, m)`` indices: for each point ``i``, ``subsets`` random ``m``-subsets of the
    other points (the first ``m`` of a random permutation of them, drawn with ``seed``). A pure
    function of its arguments, kept for the next call: an NCAI fit asks for the same sets at
    every full-batch step, and drawing them is most of the statistic's cost at ``n`` ~ 1,000."""
    keys = torch.rand(subsets, n, n, generator=torch.Generator().manual_seed(seed))
    keys.masked_fill_(torch.eye(n, dtype=torch.bool), float("inf"))  # never i itself
    return keys.topk(m, dim=-1, largest=False).indices


def _refuse_tracing() -> None:
    """The k-NN estimates' neighbourhoods depend on the data: a ``torch.jit`` trace would record
    the first batch's as constants (and the cache keyed on the data's bytes with them)."""
    if torch.jit.is_tracing():
        raise RuntimeError(
            "the k-NN estimates of I(x; mu_z) cannot be traced with torch.jit: their neighbourhoods depend "
            "on the data, and a trace would freeze the first batch's; call them eagerly"
        )


@functools.lru_cache(maxsize=16)
def _x_neighbours(xs: bytes, n: int, d: int, m: int) -> Tensor:
    """``(n, m)`` indices of the ``m`` nearest other rows of each row of the float64 ``(n, d)``
    array ``xs`` (its bytes: a pure function of the data, kept for the next call, as a full-batch
    fit asks for the same inputs' neighbourhoods at every step)."""
    return _neighbours(torch.frombuffer(bytearray(xs), dtype=torch.float64).reshape(n, d), m)


def _neighbours(x: Tensor, m: int) -> Tensor:
    """``(n, m)`` indices of the ``m`` nearest other rows of each row of ``x`` ``(n, d)``."""
    eye = torch.eye(x.shape[0], dtype=torch.bool, device=x.device)
    return _sq_dists(x).masked_fill(eye, float("inf")).topk(m, largest=False).indices


def _fresh_reference_sets(n: int, m: int, subsets: int, device: torch.device, rows: Tensor | None = None) -> Tensor:
    """``(subsets, r, m)`` indices drawn with torch's global generator (so ``pyro.set_rng_seed``
    fixes them) for the ``r`` points ``rows`` (default: all ``n``): per subset a random cyclic order
    of the ``n`` points, and for point ``i`` the ``m`` points that follow it in that order. Each set
    is a uniform ``m``-subset of the points other than ``i`` (the sets of different points overlap),
    at ``O(r m)`` cost instead of ``O(n^2)``."""
    order = torch.stack([torch.randperm(n, device=device) for _ in range(subsets)])  # (R, n)
    position = torch.empty_like(order)
    position.scatter_(1, order, torch.arange(n, device=device).expand(subsets, n))
    if rows is not None:
        position = position[:, rows]
    r = position.shape[1]
    after = (position.unsqueeze(-1) + torch.arange(1, m + 1, device=device)) % n  # (R, r, m)
    return order.gather(1, after.reshape(subsets, r * m)).reshape(subsets, r, m)


def knn_mutual_information(
    x: Tensor, mu_z: Tensor, k: int = 3, m: int = 15, subsets: int = 4, seed: int | None = 0, anchors: int | None = None
) -> Tensor:
    r"""Differentiable k-NN estimate of ``I(x; mu_z)`` in nats, from ``x``-neighbourhoods.

    ``I(x; z) = H(z) - E_x H(z | x)``. With the Kozachenko-Leonenko estimate of each entropy
    from the ``k``-th nearest-neighbour distance of ``mu_i`` (``K`` = its dimension), the
    unknown constants cancel between a conditional sample and a marginal sample *of the same
    size*:

    .. math::

        \hat I = \frac{K}{n} \sum_i \Big( \frac1R \sum_{r=1}^R \log \rho_k(\mu_i; S_{i,r})
                 - \log \rho_k(\mu_i; N_m(x_i)) \Big),

    where ``N_m(x_i)`` are the ``m`` nearest neighbours of ``x_i`` in ``x`` (the points whose
    ``mu`` should share ``x_i``'s conditional law; columns of ``x`` standardised, no gradient),
    ``S_{i,r}`` are ``R = subsets`` random sets of ``m`` other points (drawn with ``seed``:
    samples of the marginal), and ``rho_k(mu_i; S)`` is the Euclidean distance from ``mu_i`` to
    its ``k``-th nearest neighbour in ``{mu_j: j in S}`` (``mu`` standardised per column with
    standard deviations without gradient). Under independence both terms have the same
    distribution, so the estimate is centred at 0 at every ``n``, ``k``, ``m`` (no digamma
    correction whose small-sample bias would not cancel); when ``mu`` depends on ``x``, the
    ``x``-neighbours' ``mu`` are closer, ``log`` of their ratio estimating the log density ratio
    ``log p(mu | x) / p(mu)`` as in Kraskov, Stoegbauer & Grassberger (2004). The neighbour
    identities are piecewise constant, the distances differentiable in ``mu``. Not clipped at 0.
    ``seed=None`` draws the reference sets afresh from torch's global generator at each call
    (:func:`_fresh_reference_sets`) instead of the seeded, cached ones. ``anchors``: average over
    that many points ``i`` drawn at random (without replacement, torch's global generator) instead
    of all ``n``, an unbiased estimate of the same sum at ``O(anchors m)`` cost; every point stays a
    candidate neighbour.
    """
    _refuse_tracing()
    a, b = _as_tensor_2d("x", x), _as_tensor_2d("mu_z", mu_z)
    _check_same_n("x", a, "mu_z", b)
    k, m, subsets = check_int(k, "k"), check_int(m, "m"), check_int(subsets, "subsets")
    n = a.shape[0]
    if not k <= m <= n - 1:
        raise ValueError(
            f"knn-mi needs k <= m <= n - 1, got k = {k}, m = {m}, n = {n}: use a "
            f"larger batch, or a smaller m (neighbourhood size) or k"
        )
    anchors = check_int(anchors, "anchors", allow_none=True)
    rows = None if anchors is None or anchors >= n else torch.randperm(n, device=a.device)[:anchors]
    xs = _standardise(a.detach().to(torch.float64))
    if xs.device.type != "cpu":
        neighbours = _neighbours(xs, m)
    else:
        neighbours = _x_neighbours(xs.contiguous().numpy().tobytes(), n, xs.shape[1], m)
    if seed is None:
        randoms = _fresh_reference_sets(n, m, subsets, a.device, rows)
    else:
        randoms = _reference_sets(n, m, subsets, check_int(seed, "seed", minimum=0)).to(a.device)
        randoms = randoms if rows is None else randoms[:, rows]
    neighbours = neighbours if rows is None else neighbours[rows]
    mu = _standardise(b)
    centres = mu if rows is None else mu[rows]

    def log_kth_distance(others: Tensor) -> Tensor:  # others (..., r, m) -> log rho_k (..., r)
        gap = mu[others] - centres.unsqueeze(-2)  # only the r m pairs asked for, not all n^2
        return (gap.square().sum(-1) + 1e-24).sqrt().kthvalue(k, dim=-1).values.log()

    return b.shape[1] * (log_kth_distance(randoms).mean(0) - log_kth_distance(neighbours)).mean()


def doubling_sizes(n: int, smallest: int = 8, fraction: float = 0.25) -> tuple[int, ...]:
    """Neighbourhood sizes ``smallest, 2 smallest, 4 smallest, ...`` up to ``fraction n``
    (``"knn-mi-wide"``; at least ``smallest``, which :func:`multiscale_knn_mi` skips if the batch
    is smaller)."""
    sizes = [smallest]
    while 2 * sizes[-1] <= fraction * n:
        sizes.append(2 * sizes[-1])
    return tuple(sizes)


def multiscale_knn_mi(
    x: Tensor,
    mu_z: Tensor,
    sizes: Sequence[int] = DEFAULT_SIZES,
    k: int = 3,
    subsets: int = 2,
    seed: int | None = None,
    anchors: int | None = None,
) -> Tensor:
    r"""``(1/|M|) sum_{m in M} max(I_m, 0)``: :func:`knn_mutual_information` ``I_m`` at each
    neighbourhood size ``m`` of ``sizes`` below ``n`` (``M``), each floored at 0, in nats.

    Each size's estimate is floored before the average, so a negative estimate at one size cannot
    cancel dependence seen at another. ``seed=None`` (default) draws the reference sets afresh at
    each call from torch's global generator; an integer seed uses ``seed + j`` for the ``j``-th
    size. ``anchors``: each size's estimate at that many random points (:func:`knn_mutual_information`).
    The null mean is small and positive, not 0 (docs/design-notes.md, 'stats.independence').
    """
    _refuse_tracing()
    a, b = _as_tensor_2d("x", x), _as_tensor_2d("mu_z", mu_z)
    _check_same_n("x", a, "mu_z", b)
    n = a.shape[0]
    sizes = tuple(check_int(v, "sizes") for v in sizes)
    used = [m for m in sizes if k <= m <= n - 1]
    if not used:
        raise ValueError(
            f"knn-mi-multiscale needs a neighbourhood size m with k <= m <= n - 1; got sizes "
            f"{sizes}, k = {k}, n = {n}: use a larger batch, or smaller sizes or k"
        )
    estimates = [
        knn_mutual_information(a, b, k, m, subsets, None if seed is None else seed + j, anchors).clamp_min(0)
        for j, m in enumerate(used)
    ]
    return torch.stack(estimates).mean()


def independence_statistic(
    x: Tensor,
    mu_z: Tensor,
    kind: Kind = "hsic-multiscale",
    *,
    scales: Sequence[float] = DEFAULT_SCALES,
    k: int = 3,
    m: int = 15,
    subsets: int = 4,
    seed: int | None = 0,
    sizes: Sequence[int] = DEFAULT_SIZES,
) -> Tensor:
    """A differentiable statistic of the dependence of ``mu_z`` ``(n, K)`` on ``x`` ``(n, D)``,
    0-dim, in ``mu_z``'s dtype, near 0 when they are independent (see the module docstring).

    Args:
        x: inputs of the batch, ``(n, D)`` or ``(n,)``.
        mu_z: the guide's latent means of the same rows, ``(n, K)`` or ``(n,)``.
        kind: one of :data:`KINDS`: ``"hsic-multiscale"`` (default), ``"knn-mi"``, ``"dcor"``,
            ``"hsic"`` (today's NCAI term), ``"pc"`` (the paper's eq. 24 for ``x``).
        scales: bandwidth multiples of the median heuristic (``"hsic-multiscale"`` only).
        k, m, subsets, seed: ``"knn-mi"`` only: neighbour order, neighbourhood size, number of
            random reference sets and their seed (:func:`knn_mutual_information`).
        sizes: ``"knn-mi-multiscale"`` only: its neighbourhood sizes (:func:`multiscale_knn_mi`,
            with ``k``, 2 reference sets per size, drawn afresh at each call). ``"knn-mi-wide"``
            uses :func:`doubling_sizes` of the batch and :data:`WIDE_ANCHORS` anchors instead.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    if kind.startswith("knn-mi"):
        _refuse_tracing()
    a, b = _as_tensor_2d("x", x), _as_tensor_2d("mu_z", mu_z)
    _check_same_n("x", a, "mu_z", b)
    if a.shape[0] < 3:
        raise ValueError(f"x and mu_z need at least 3 rows (datapoints), got {a.shape[0]}")
    if kind == "hsic-multiscale":
        return multiscale_hsic(a, b, scales)
    if kind == "knn-mi":
        return knn_mutual_information(a, b, k, m, subsets, seed)
    if kind == "knn-mi-multiscale":
        return multiscale_knn_mi(a, b, sizes, k)
    if kind == "knn-mi-wide":
        return multiscale_knn_mi(a, b, doubling_sizes(a.shape[0]), k, anchors=WIDE_ANCHORS)
    if kind == "dcor":
        return distance_correlation(a, b)
    if kind == "hsic":
        return normalized_hsic(a, b)
    return correlation_penalty(a, b)
