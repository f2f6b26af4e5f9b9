"""Inference: SVI / MAP fitting loops, posterior sampling."""
from .predict import as_sample_dict, sample_posterior
from .svi import NonFiniteLossError, fit_svi, isolated_param_store, set_seed, train_map

__all__ = [
    "NonFiniteLossError",
    "as_sample_dict",
    "fit_svi",
    "isolated_param_store",
    "sample_posterior",
    "set_seed",
    "train_map",
]
