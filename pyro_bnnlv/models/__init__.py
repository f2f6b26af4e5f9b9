"""Pyro models: BNN (``bnn``), BNN+LV (``bnnlv``), the over-parametrised linear model (``linear``)
and the projected BNN (``projected``)."""

from .bnn import BNN, fan_in_prior_scale
from .bnnlv import BNNLV
from .projected import ProjectedBNN
from .linear import OverparametrisedLinear

__all__ = ["BNN", "BNNLV", "OverparametrisedLinear", "ProjectedBNN", "fan_in_prior_scale"]
