"""Pyro models: BNN (``bnn``), and more to come (BNN+LV, projected BNN, linear)."""
from .bnn import BNN, fan_in_prior_scale

__all__ = ["BNN", "fan_in_prior_scale"]
