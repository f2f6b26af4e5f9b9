"""Laplace approximations with the generalised Gauss-Newton curvature (Foong, Li,
Hernández-Lobato & Turner 2019, arXiv:1906.11537, sec. 2 and App. A).

* :mod:`.linearized`: :class:`LinearizedLaplace` (the fit, prior precision by marginal
  likelihood, the linearised predictive) and :class:`LaplacePredictive`;
* :mod:`.guide`: :class:`LaplaceGuide`, the Laplace Gaussian as a Pyro guide (sampled Laplace).
"""

from .guide import LaplaceGuide, SubsetNormal
from .linearized import STRUCTURES, LaplacePredictive, LinearizedLaplace, last_layer_indices, network_jacobian

__all__ = [
    "STRUCTURES",
    "LaplaceGuide",
    "LaplacePredictive",
    "LinearizedLaplace",
    "SubsetNormal",
    "last_layer_indices",
    "network_jacobian",
]
