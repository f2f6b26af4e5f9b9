"""Inference: SVI / MAP fitting loops, ELBOs (NCAI), empirical Bayes, posterior sampling."""
from .elbo import PenalizedElbo
from .empirical_bayes import EmpiricalBayes
from .ncai import NCAIElbo
from .predict import as_sample_dict, guide_site_mean, sample_posterior
from .svi import NonFiniteLossError, fit_svi, isolated_param_store, set_seed, train_map

__all__ = [
    "EmpiricalBayes",
    "NCAIElbo",
    "PenalizedElbo",
    "guide_site_mean",
    "NonFiniteLossError",
    "as_sample_dict",
    "fit_svi",
    "isolated_param_store",
    "sample_posterior",
    "set_seed",
    "train_map",
]
