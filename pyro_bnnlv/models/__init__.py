"""Pyro models: BNN (``bnn``), BNN+LV (``bnnlv``), the projected BNN (``projected``)."""
from .bnn import BNN, fan_in_prior_scale
from .bnnlv import BNNLV
from .projected import ProjectedBNN

__all__ = ["BNN", "BNNLV", "ProjectedBNN", "fan_in_prior_scale"]
