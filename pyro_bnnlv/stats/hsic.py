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
on a symmetric ``a`` has correlation 0 and nHSIC near 1). Bandwidths follow the median heuristic
(median pairwise distance, computed without gradient), which makes nHSIC invariant to rescaling
either sample: a penalty on it cannot be met by shrinking ``b``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["normalized_hsic", "gaussian_gram"]


def gaussian_gram(a: Tensor, eps: float = 1e-12) -> Tensor:
    """``exp(-||a_i - a_j||^2 / (2 h^2))`` with ``h^2`` the median of the squared distances (no grad)."""
    d2 = (a.unsqueeze(0) - a.unsqueeze(1)).square().sum(-1)
    n = a.shape[0]
    off = d2.detach()[~torch.eye(n, dtype=torch.bool, device=a.device)]
    h2 = off.median() + eps  # eps: all-equal samples give a constant kernel, not 0/0
    return torch.exp(-d2 / (2 * h2))


def normalized_hsic(a: Tensor, b: Tensor, eps: float = 1e-12) -> Tensor:
    """Normalised HSIC (centred kernel alignment) of two samples ``(n, Da)``, ``(n, Db)``, in ``[0, 1]``.

    Computed in float64 and returned in ``b``'s dtype; differentiable in both arguments and free
    of value-dependent Python branches (safe to trace). A constant sample gives 0. The estimate
    is biased upwards by about ``1/n`` for independent samples.
    """
    a2 = a.reshape(a.shape[0], -1).to(torch.float64)
    b2 = b.reshape(b.shape[0], -1).to(torch.float64)
    if not torch.jit.is_tracing():
        if a2.shape[0] != b2.shape[0]:
            raise ValueError(f"a and b need the same number of rows, got {a2.shape[0]} and {b2.shape[0]}")
        if a2.shape[0] < 2:
            raise ValueError(f"need at least 2 rows, got {a2.shape[0]}")
    K, L = gaussian_gram(a2), gaussian_gram(b2)
    Kc = K - K.mean(0, keepdim=True) - K.mean(1, keepdim=True) + K.mean()
    Lc = L - L.mean(0, keepdim=True) - L.mean(1, keepdim=True) + L.mean()
    num = (Kc * Lc).sum()
    den = torch.sqrt((Kc.square().sum() + eps) * (Lc.square().sum() + eps))
    return (num / den).to(b.dtype)
