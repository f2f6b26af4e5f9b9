"""pyro_bnnlv: Bayesian neural networks (with latent variables) and their inference, on Pyro.

Typical use::

    from pyro.infer.autoguide import AutoNormal
    import pyro_bnnlv as pb

    data = pb.load_dataset("cosine")
    model = pb.BNN(pb.MLP(1, [50], 1), prior_scale=1.0, noise_scale=0.1)
    guide = AutoNormal(model, init_scale=0.01, init_loc_fn=pb.init_to_network(model))
    pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=2000, lr=0.01)
    samples = pb.sample_posterior(model, guide, data.x_train, num_samples=500)
    print(pb.evaluate(model, samples, data.x_test, data.y_test))
"""

from . import datasets, diagnostics, protocols
from .datasets import load_dataset
from .guides import init_to_network
from .guides import HypernetGuide, ncai_guide
from .infer import (
    EmpiricalBayes,
    ClosedFormKLElbo,
    FunctionalKNNElbo,
    KNNElbo,
    NCAIElbo,
    NonFiniteLossError,
    PlateauSchedule,
    fit_svi,
    run_nuts,
    train_map,
)
from .posterior import sample_posterior
from .models import BNN, BNNLV, ProjectedBNN, fan_in_prior_scale
from .models import OverparametrisedLinear
from .nets import MLP, FlatNet, ModuleNet
from .param_names import own_param_names
from .stats.predictive import evaluate
from .diagnostics import compare_posteriors, posterior_summary, to_inference_data
from .guides import LaplaceGuide, MeanField
from .infer import LinearizedLaplace, LocalReparamELBO
from .infer import CompiledTraceElbo, FusedTraceElbo, PenalizedElbo
from .datasets import extrapolation_split, gap_splits, interpolation_split
from .sweep import grid_search

__version__ = "0.1.0"

__all__ = [
    "BNN",
    "BNNLV",
    "MLP",
    "ClosedFormKLElbo",
    "CompiledTraceElbo",
    "EmpiricalBayes",
    "FlatNet",
    "FunctionalKNNElbo",
    "FusedTraceElbo",
    "HypernetGuide",
    "KNNElbo",
    "LaplaceGuide",
    "LinearizedLaplace",
    "LocalReparamELBO",
    "MeanField",
    "ModuleNet",
    "NCAIElbo",
    "NonFiniteLossError",
    "OverparametrisedLinear",
    "PenalizedElbo",
    "PlateauSchedule",
    "ProjectedBNN",
    "compare_posteriors",
    "datasets",
    "diagnostics",
    "evaluate",
    "extrapolation_split",
    "fan_in_prior_scale",
    "fit_svi",
    "gap_splits",
    "grid_search",
    "init_to_network",
    "interpolation_split",
    "load_dataset",
    "ncai_guide",
    "own_param_names",
    "posterior_summary",
    "protocols",
    "run_nuts",
    "sample_posterior",
    "to_inference_data",
    "train_map",
]
