"""Laplace approximations with the generalised Gauss-Newton curvature (Foong, Li,
Hernández-Lobato & Turner 2019, arXiv:1906.11537, sec. 2 and App. A).

* :mod:`.linearized`: :class:`LinearizedLaplace` (the fit, prior precision by marginal
  likelihood, the linearised predictive) and :class:`LaplacePredictive`;
* :mod:`.kfac`: the Kronecker-factored (K-FAC / KFC) curvature of ``structure="kfac"``;
* :mod:`.guide`: :class:`LaplaceGuide`, the Laplace Gaussian as a Pyro guide (sampled Laplace),
  and :class:`KroneckerNormal`, the K-FAC posterior's distribution.
"""

from .guide import KroneckerNormal, LaplaceGuide, SubsetNormal
from .linearized import STRUCTURES, LaplacePredictive, LinearizedLaplace, last_layer_indices, network_jacobian

__all__ = [
    "STRUCTURES",
    "KroneckerNormal",
    "LaplaceGuide",
    "LaplacePredictive",
    "LinearizedLaplace",
    "SubsetNormal",
    "last_layer_indices",
    "network_jacobian",
]
