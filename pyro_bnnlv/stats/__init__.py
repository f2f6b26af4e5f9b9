"""Estimators and metrics.

* ``predictive``: test log-likelihood, RMSE, PICP, MPIW of a Monte-Carlo posterior predictive;
* ``posterior_kl``: KL between two posteriors in parameter and predictor space;
* ``knn``: k-nearest-neighbour entropy and KL estimators, in parameter and predictor space;
* ``dependence``: Henze-Zirkler normality statistic, correlation penalties, KSG mutual
  information, Kolmogorov-Smirnov statistic (the NCAI paper's proxies and metrics);
* ``independence``: differentiable dependence statistics of ``x`` and ``mu_z`` behind one API,
  :func:`independence_statistic` (multiscale HSIC, a k-NN mutual information, distance
  correlation, today's HSIC, the paper's PC);
* ``ood``: epistemic entropy per input, OOD-vs-test AUROC, histograms (HyVI paper sec. 4);
* ``latent``: BNN+LV diagnostics, reconstruction / predictive MSE, uncertainty decomposition.
* ``classification``: test log-likelihood, accuracy, Brier score, ECE and reliability curve of
  class probabilities; predictive entropy, BALD mutual information, OOD AUROC.
* ``invariance``: invariance gap of a mean-field BNN, per unit of every layer (invariances paper,
  sec. 5, eq. 23 and 25).
"""

from .classification import classification_metrics, mutual_information, ood_auroc, predictive_entropy, reliability_curve
from .dependence import (
    correlation_penalty,
    henze_zirkler,
    henze_zirkler_pvalue,
    ks_statistic,
    ksg_mutual_information,
    offdiag_cov_norm,
    pearson_correlation,
)
from .independence import independence_statistic
from .knn import functional_knn_entropy, functional_knn_kl, input_sampler, knn_entropy, knn_kl, predictor_space_samples
from .latent import (
    knn_entropy_1d,
    latent_diagnostics,
    latent_means,
    plot_uncertainty_decomposition,
    predictive_mse,
    reconstruction_mse,
    uncertainty_decomposition,
)
from .ood import auroc, epistemic_entropy, ood_report, plot_epistemic_histograms
from .predictive import evaluate, mixture_interval, mixture_log_density, mixture_quantile, predictive_metrics
from .invariance_gap import (
    first_layer_invariance_gap,
    invariance_gap_by_layer,
    layer_invariance_gap,
    plot_first_layer_invariance_gap,
)
from .posterior_kl import compare_posteriors

__all__ = [
    "auroc",
    "classification_metrics",
    "compare_posteriors",
    "correlation_penalty",
    "epistemic_entropy",
    "evaluate",
    "first_layer_invariance_gap",
    "functional_knn_entropy",
    "functional_knn_kl",
    "henze_zirkler",
    "henze_zirkler_pvalue",
    "independence_statistic",
    "input_sampler",
    "invariance_gap_by_layer",
    "knn_entropy",
    "knn_entropy_1d",
    "knn_kl",
    "ks_statistic",
    "ksg_mutual_information",
    "latent_diagnostics",
    "latent_means",
    "layer_invariance_gap",
    "mixture_interval",
    "mixture_log_density",
    "mixture_quantile",
    "mutual_information",
    "offdiag_cov_norm",
    "ood_auroc",
    "ood_report",
    "pearson_correlation",
    "plot_epistemic_histograms",
    "plot_first_layer_invariance_gap",
    "plot_uncertainty_decomposition",
    "predictive_entropy",
    "predictive_metrics",
    "predictive_mse",
    "predictor_space_samples",
    "reconstruction_mse",
    "reliability_curve",
    "uncertainty_decomposition",
]
