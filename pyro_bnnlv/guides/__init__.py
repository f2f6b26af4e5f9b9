"""Guides and guide initialisation. Mean-field VI is Pyro's ``AutoNormal``; full-covariance VI is
``AutoMultivariateNormal``; this package adds what Pyro does not have."""
from .hypernet import HypernetGuide, ImplicitSample, hypernet_lv_guide
from .init import init_to_network
from .ncai import ncai_guide, ncai_init_loc_fn, ncai_init_weights

__all__ = ["HypernetGuide", "ImplicitSample", "hypernet_lv_guide", "init_to_network", "ncai_guide", "ncai_init_loc_fn", "ncai_init_weights"]
