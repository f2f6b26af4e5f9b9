"""Deprecated location: :mod:`pyro_bnnlv.posterior` (moved so that ``stats`` need not import
``infer``). The names stay importable from here."""

from ..posterior import as_sample_dict, guide_site_mean, sample_posterior

__all__ = ["sample_posterior", "as_sample_dict", "guide_site_mean"]
