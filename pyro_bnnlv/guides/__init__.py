"""Guides and guide initialisation. Mean-field VI is Pyro's ``AutoNormal`` (``MeanField``: with a
network start and small initial scales); full-covariance VI is
``AutoMultivariateNormal``; this package adds what Pyro does not have: the implicit hypernetwork
guide (``hypernet``), the sampled-Laplace guide (re-exported from ``infer.laplace_guide``) and NCAI
initialisation (``ncai``)."""

from .hypernet import HypernetGuide, ImplicitSample, hypernet_lv_guide
from .init import init_to_network
from .mean_field import MeanField
from .ncai_init import ncai_guide, ncai_init_loc_fn, ncai_init_weights
from ..infer.laplace.guide import LaplaceGuide, SubsetNormal

__all__ = [
    "HypernetGuide",
    "ImplicitSample",
    "LaplaceGuide",
    "MeanField",
    "SubsetNormal",
    "hypernet_lv_guide",
    "init_to_network",
    "ncai_guide",
    "ncai_init_loc_fn",
    "ncai_init_weights",
]
