"""Inference: SVI / MAP fitting loops, ELBOs (NCAI), empirical Bayes, posterior sampling, NUTS."""
from .closed_form_kl import ClosedFormKLElbo
from .elbo import CompiledTraceElbo, PenalizedElbo
from .empirical_bayes import EmpiricalBayes
from .fge import FGEResult, fge
from .projection import fit_projected_bnn, fit_projection
from .knn_elbo import FunctionalKNNElbo, KNNElbo, input_box
from .ncai_elbo import NCAIElbo
from .nuts import FlatNUTS, FlatPotential, mlp_regression_potential, run_nuts
from ..posterior import as_sample_dict, guide_site_mean, sample_posterior
from .svi import NonFiniteLossError, PlateauSchedule, fit_svi, isolated_param_store, set_seed, train_map
from .laplace import LaplacePredictive, LinearizedLaplace, last_layer_indices, network_jacobian
from .local_reparam import LocalReparamELBO, local_reparam_forward

__all__ = [
    "ClosedFormKLElbo",
    "FGEResult",
    "fge",
    "fit_projected_bnn",
    "fit_projection",
    "FunctionalKNNElbo",
    "KNNElbo",
    "input_box",
    "EmpiricalBayes",
    "FlatNUTS",
    "FlatPotential",
    "mlp_regression_potential",
    "run_nuts",
    "NCAIElbo",
    "PenalizedElbo",
    "CompiledTraceElbo",
    "guide_site_mean",
    "NonFiniteLossError",
    "as_sample_dict",
    "fit_svi",
    "PlateauSchedule",
    "isolated_param_store",
    "sample_posterior",
    "set_seed",
    "train_map",
    "LaplacePredictive",
    "LinearizedLaplace",
    "last_layer_indices",
    "network_jacobian",
    "LocalReparamELBO",
    "local_reparam_forward",
]
