"""Pyro models: BNN (``bnn``), BNN+LV (``bnnlv``); projected BNN and linear to come."""
from .bnn import BNN, fan_in_prior_scale
from .bnnlv import BNNLV

__all__ = ["BNN", "BNNLV", "fan_in_prior_scale"]
