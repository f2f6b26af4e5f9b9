"""Guides and guide initialisation. Mean-field VI is Pyro's ``AutoNormal``; full-covariance VI is
``AutoMultivariateNormal``; this package adds what Pyro does not have."""
from .init import init_to_network
from .ncai import ncai_guide, ncai_init_loc_fn, ncai_init_weights

__all__ = ["init_to_network", "ncai_guide", "ncai_init_loc_fn", "ncai_init_weights"]
