"""Deprecated location: :mod:`pyro_bnnlv.infer.laplace_guide` (the sampled-Laplace guide lives
beside the Laplace fit that builds it). The names stay importable from here."""

from ..infer.laplace_guide import LaplaceGuide, SubsetNormal

__all__ = ["LaplaceGuide", "SubsetNormal"]
