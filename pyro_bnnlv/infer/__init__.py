"""Inference, one concept per sub-package or module:

* :mod:`.svi`: the SVI and MAP fitting loops (:func:`fit_svi`, :func:`train_map`);
* :mod:`.elbos`: the ELBOs (NCAI, k-NN, closed-form KL, local reparameterisation, compiled);
* :mod:`.mcmc`: NUTS (:func:`run_nuts`, :class:`FlatNUTS`);
* :mod:`.laplace`: linearised and sampled Laplace;
* :mod:`.projection`: projected BNNs (FGE, decoder, latent-space inference);
* :mod:`.empirical_bayes`: MAP-II updates of the prior variances.
"""

from .elbos import (
    ClosedFormKLElbo,
    CompiledTraceElbo,
    FunctionalKNNElbo,
    FusedTraceElbo,
    KNNElbo,
    LocalReparamELBO,
    NCAIElbo,
    PenalizedElbo,
    input_box,
    local_reparam_forward,
)
from .._state import isolated_param_store, set_seed
from .empirical_bayes import EmpiricalBayes
from .laplace import LaplaceGuide, LaplacePredictive, LinearizedLaplace, last_layer_indices, network_jacobian
from .mcmc import FlatNUTS, FlatPotential, mlp_classification_potential, mlp_regression_potential, run_nuts
from .projection import FGEResult, fge, fit_projected_bnn, fit_projection
from .svi import NonFiniteLossError, PlateauSchedule, fit_svi, train_map

__all__ = [
    "ClosedFormKLElbo",
    "CompiledTraceElbo",
    "EmpiricalBayes",
    "FGEResult",
    "FlatNUTS",
    "FlatPotential",
    "FunctionalKNNElbo",
    "FusedTraceElbo",
    "KNNElbo",
    "LaplaceGuide",
    "LaplacePredictive",
    "LinearizedLaplace",
    "LocalReparamELBO",
    "NCAIElbo",
    "NonFiniteLossError",
    "PenalizedElbo",
    "PlateauSchedule",
    "fge",
    "fit_projected_bnn",
    "fit_projection",
    "fit_svi",
    "input_box",
    "isolated_param_store",
    "last_layer_indices",
    "local_reparam_forward",
    "mlp_classification_potential",
    "mlp_regression_potential",
    "network_jacobian",
    "run_nuts",
    "set_seed",
    "train_map",
]
