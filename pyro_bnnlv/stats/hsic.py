"""Kernel dependence: the normalised Hilbert-Schmidt independence criterion.

For samples ``{(a_n, b_n)}`` with Gaussian-kernel Gram matrices ``K``, ``L`` and the centring
matrix ``H = I - 11^T / n``, the biased HSIC estimate (Gretton, Bousquet, Smola & Schoelkopf
2005, "Measuring statistical dependence with Hilbert-Schmidt norms", eq. 4) is
``HSIC_b = tr(K H L H) / (n - 1)^2``. Normalised by the two self-dependences it becomes the
centred kernel alignment (Cortes, Mohri & Rostamizadeh 2012, JMLR 13, eq. 3):

.. math::

    \\mathrm{nHSIC}(a, b) = \\frac{\\operatorname{tr}(\\tilde K \\tilde L)}
        {\\lVert \\tilde K \\rVert_F \\, \\lVert \\tilde L \\rVert_F} \\in [0, 1],
    \\qquad \\tilde K = H K H,\\ \\tilde L = H L H.

With a characteristic kernel (Gaussian) the population HSIC is 0 if and only if ``a`` and ``b``
are independent, so unlike a Pearson correlation it sees non-linear dependence (``b = a^2``
on a symmetric ``a`` has correlation 0 and nHSIC near 1). Bandwidths follow the data's spread
(``h^2 = sum_d Var(a_d)``, computed without gradient), which makes nHSIC invariant to rescaling
either sample: a penalty on it cannot be met by shrinking ``b``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._pairwise import centred_alignment

__all__ = ["gaussian_gram", "normalized_hsic"]


def _sq_dists(a: Tensor) -> Tensor:
    sq = a.square().sum(-1)
    return (sq[:, None] + sq[None, :] - 2.0 * (a @ a.T)).clamp(min=0.0)


def gaussian_gram(a: Tensor, eps: float = 1e-12) -> Tensor:
    """``exp(-||a_i - a_j||^2 / (2 h^2))`` with ``h^2 = sum_d Var(a_d)`` (no grad).

    ``2 h^2`` is the mean squared pairwise distance (the "mean heuristic", ``O(n)``; the median
    heuristic needs a selection over ``n^2`` distances and differs by a constant factor on
    Gaussian data). ``eps``: all-equal samples give a constant kernel, not ``0/0``.
    """
    h2 = a.detach().var(0, unbiased=False).sum() + eps
    return torch.exp(-_sq_dists(a) / (2 * h2))


def normalized_hsic(a: Tensor, b: Tensor, eps: float = 1e-12, *, compiled: bool | None = None) -> Tensor:
    """Normalised HSIC (centred kernel alignment) of two samples ``(n, Da)``, ``(n, Db)``, in ``[0, 1]``.

    Differentiable in both arguments and free of value-dependent Python branches (safe to
    trace); computed in ``b``'s dtype. A constant sample gives 0. The estimate is biased upwards
    by about ``1/n`` for independent samples. Cost ``O(n^2)`` time and transient memory: the
    statistic is one fused function with an analytic gradient
    (:func:`~pyro_bnnlv.stats._pairwise.centred_alignment`; ``O(n)`` kept for backward),
    first-order differentiable. ``compiled``: ``None`` (default) uses the compiled kernel when it
    can be built, ``False`` torch only, ``True`` requires the kernel; both agree to round-off.
    """
    if not torch.jit.is_tracing():
        for name, value in (("a", a), ("b", b)):
            if not isinstance(value, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor of shape (n, D), got {type(value).__name__}")
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"a and b need the same number of rows, got {a.shape[0]} and {b.shape[0]}")
        if a.shape[0] < 2:
            raise ValueError(f"need at least 2 rows, got {a.shape[0]}")
    a2 = a.reshape(a.shape[0], -1).to(b.dtype)
    b2 = b.reshape(b.shape[0], -1)
    return centred_alignment(a2, b2, eps, compiled=compiled)
