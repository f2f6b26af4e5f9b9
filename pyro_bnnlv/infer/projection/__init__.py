"""Projected BNNs (Pradier, Pan, Yao, Ghosh & Doshi-Velez 2018, arXiv:1811.07006, Alg. 1).

* :mod:`.fge`: stage 1, candidate weights by Fast Geometric Ensembling;
* :mod:`.fit`: stage 2, the decoder (eq. 6 or a generative objective), and stage 3, inference
  in the latent space (:func:`fit_projection`, :func:`fit_projected_bnn`);
* :mod:`.decoder`: the generative objectives (MMD, VAE) for stage 2.
"""

from .decoder import DEFAULT_BETA, DEFAULT_LR, DEFAULT_NUM_STEPS, GENERATIVE_OBJECTIVES
from .fge import FGEResult, cyclic_lr, fge
from .fit import ProjectedFit, ProjectionFit, fit_projected_bnn, fit_projection, init_projected_guide

__all__ = [
    "DEFAULT_BETA",
    "DEFAULT_LR",
    "DEFAULT_NUM_STEPS",
    "GENERATIVE_OBJECTIVES",
    "FGEResult",
    "ProjectedFit",
    "ProjectionFit",
    "cyclic_lr",
    "fge",
    "fit_projected_bnn",
    "fit_projection",
    "init_projected_guide",
]
