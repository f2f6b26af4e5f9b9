r"""Metrics of a classifier's predictive probabilities (issue 42).

Notation: ``N`` points with labels ``y_n in {0, ..., K-1}`` and predictive probabilities
``p_nk`` (rows summing to 1), e.g. the Bayesian model average ``p_nk = (1/S) sum_s p(y = k | x_n, w_s)``
over ``S`` posterior samples; per-sample probabilities ``p_snk`` where a function needs them.

* :func:`classification_metrics`: test log-likelihood, accuracy, the multi-class Brier score
  (Brier 1950, Monthly Weather Review 78(1)) and the expected calibration error (ECE) of Guo,
  Pleiss, Sun & Weinberger (2017), "On calibration of modern neural networks", arXiv:1706.04599;
* :func:`reliability_curve`: the per-bin data behind the ECE (a reliability diagram,
  :func:`pyro_bnnlv.plotting.plot_reliability`);
* :func:`predictive_entropy` and :func:`mutual_information`: total uncertainty and its epistemic
  part, BALD (Houlsby, Huszár, Ghahramani & Lengyel 2011, arXiv:1112.5745);
* :func:`ood_auroc`: AUROC of detecting out-of-distribution inputs by a score (Hendrycks & Gimpel
  2017, "A baseline for detecting misclassified and out-of-distribution examples in neural
  networks", arXiv:1610.02136).

Inputs are tensors (or arrays) of any float dtype; everything is computed in float64. Entropies
are in nats, with ``0 log 0 = 0``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from .._checks import ArgumentTypeError, check_int
from .ood import auroc

__all__ = [
    "ROW_SUM_TOLERANCE",
    "classification_metrics",
    "mutual_information",
    "ood_auroc",
    "predictive_entropy",
    "reliability_curve",
]

#: Largest ``|sum_k p_nk - 1|`` accepted for a row of probabilities.
ROW_SUM_TOLERANCE = 1e-4

_TINY = torch.finfo(torch.float64).tiny  # log(p) is clamped at log(tiny) = -708.4 when p = 0


def _labels(y: Any) -> Tensor:
    """``y`` as ``torch.long (N,)``; errors name ``y`` and say what to pass."""
    if isinstance(y, (str, bytes)) or y is None:
        raise ArgumentTypeError(f"y must be a (N,) tensor of integer class labels 0..K-1, got {y!r:.60}")
    t = torch.as_tensor(np.asarray(y) if not isinstance(y, Tensor) else y).detach().cpu()
    if t.is_floating_point() or t.is_complex():
        whole = bool(torch.isfinite(t).all() and (t == t.round()).all()) if not t.is_complex() else False
        fix = (
            "they are whole numbers: pass y.long()"
            if whole
            else "they are not whole numbers: y must be class labels, not probabilities or regression targets"
        )
        raise ValueError(f"y must hold integer class labels 0..K-1 (torch.long), got dtype {t.dtype}; {fix}")
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(
            f"y must have shape (N,) with N >= 1 (one label per point), got {tuple(t.shape)}"
            + ("; pass y.reshape(-1)" if t.dim() == 2 and t.shape[-1] == 1 else "")
        )
    return t.long()


def _float64(value: Any, name: str) -> Tensor:
    """``value`` (tensor, array, nested list) as a float64 tensor on the CPU."""
    if isinstance(value, Tensor):
        return value.detach().cpu().double()
    try:
        return torch.as_tensor(np.asarray(value, dtype=np.float64))
    except (TypeError, ValueError):
        raise ArgumentTypeError(
            f"{name} must be a tensor or array of numbers, got {value!r:.60} of type {type(value).__name__}"
        ) from None


def _check_rows(p: Tensor, name: str) -> None:
    """Every row of ``p (..., K)`` a probability vector (entries in [0, 1], sum 1 within the tolerance)."""
    if torch.isnan(p).any():
        raise ValueError(
            f"{name} contains NaN (first at index {tuple(torch.nonzero(torch.isnan(p))[0].tolist())}); "
            f"check the model's outputs for NaN before computing metrics"
        )
    if (p < -ROW_SUM_TOLERANCE).any() or (p > 1 + ROW_SUM_TOLERANCE).any():
        raise ValueError(
            f"{name} must hold probabilities in [0, 1], got values in [{float(p.min()):.4g}, "
            f"{float(p.max()):.4g}]; for logits pass logits.softmax(-1)"
        )
    err = (p.sum(-1) - 1).abs()
    if (err > ROW_SUM_TOLERANCE).any():
        at = tuple(torch.nonzero(err > ROW_SUM_TOLERANCE)[0].tolist())
        raise ValueError(
            f"the rows of {name} must sum to 1 (tolerance {ROW_SUM_TOLERANCE:g}): row {at} sums to "
            f"{float(p.sum(-1)[at]):.6g}; pass logits.softmax(-1), or normalise with "
            f"p / p.sum(-1, keepdim=True)"
        )


def _probs(probs: Any, name: str, dims: tuple[int, ...] = (2,)) -> Tensor:
    """``probs`` as float64 ``(..., K)`` rows of probabilities; a 1-D ``(N,)`` (when 2 is among
    ``dims``) is read as ``P(y = 1)`` of a binary problem: ``(N, 2)`` ``[1 - p, p]``."""
    p = _float64(probs, name)
    if p.dim() == 1 and 2 in dims:
        p = torch.stack([1 - p, p], -1)
    if p.dim() not in dims:
        shapes = " or ".join({2: "(N, K)", 3: "(S, N, K)"}[d] for d in dims)
        raise ValueError(f"{name} must have shape {shapes}, got {tuple(p.shape)}")
    if p.shape[-1] < 2 or p.numel() == 0:
        raise ValueError(
            f"{name} needs at least two classes (columns) and one point, got shape {tuple(p.shape)}; "
            f"for a binary problem give (N, 2) probabilities or a (N,) vector of P(y = 1)"
        )
    _check_rows(p, name)
    return p


def _checked(y: Any, probs: Any, log_probs: Any) -> tuple[Tensor, Tensor, Tensor]:
    """``(labels, probs, log_probs)`` of :func:`classification_metrics`, all checked."""
    if (probs is None) == (log_probs is None):
        raise ValueError("pass exactly one of probs= (predictive probabilities) and log_probs= (their logarithms)")
    if log_probs is not None:
        lp = _float64(log_probs, "log_probs")
        if torch.isnan(lp).any() or (lp > ROW_SUM_TOLERANCE).any():
            raise ValueError(
                "log_probs must be log-probabilities (<= 0, no NaN); for logits pass logits.log_softmax(-1)"
            )
        p = _probs(lp.exp(), "exp(log_probs)")
        lp = lp.clamp_max(0.0)
        lp = torch.stack([torch.log1p(-lp.exp()), lp], -1) if lp.dim() == 1 else lp  # (N,): log P(y = 1)
    else:
        p = _probs(probs, "probs")
        lp = torch.log(p.clamp_min(_TINY))
    labels = _labels(y)
    N, K = p.shape
    name = "probs" if log_probs is None else "log_probs"
    if len(labels) != N:
        raise ValueError(f"y has {len(labels)} labels but {name} has {N} rows; give one row per point")
    if labels.min() < 0 or labels.max() >= K:
        bad = int(labels.min()) if labels.min() < 0 else int(labels.max())
        raise ValueError(
            f"y has the label {bad}, outside [0, {K}) of the K = {K} classes (columns) of {name}: "
            f"labels must be 0..K-1 and {name} needs one column per class (a K mismatch?)"
        )
    return labels, p, lp


def _bin_stats(y: Tensor, p: Tensor, bins: int) -> pd.DataFrame:
    confidence, predicted = p.max(-1)
    correct = (predicted == y).double()
    index = (torch.ceil(confidence * bins).long() - 1).clamp(0, bins - 1)
    count = torch.bincount(index, minlength=bins).double()
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = (torch.bincount(index, weights=confidence, minlength=bins) / count).numpy()
        acc = (torch.bincount(index, weights=correct, minlength=bins) / count).numpy()
    edges = np.linspace(0.0, 1.0, bins + 1)
    frame = pd.DataFrame(
        {
            "lower": edges[:-1],
            "upper": edges[1:],
            "confidence": conf,
            "accuracy": acc,
            "count": count.numpy().astype(np.int64),
        }
    )
    frame.index.name = "bin"
    return frame


def _ece(curve: pd.DataFrame) -> float:
    used = curve[curve["count"] > 0]
    return float((used["count"] * (used["accuracy"] - used["confidence"]).abs()).sum() / curve["count"].sum())


def reliability_curve(y: Tensor | np.ndarray, probs: Tensor | np.ndarray, bins: int = 15) -> pd.DataFrame:
    r"""Per confidence bin: the data of a reliability diagram (Guo et al. 2017, arXiv:1706.04599, sec. 2).

    The confidence of point ``n`` is its top-class probability ``c_n = max_k p_nk`` and its
    prediction ``argmax_k p_nk`` (ties: the lowest class index). ``bins`` equal-width bins
    ``B_m = ((m - 1) / M, m / M]`` of ``[0, 1]`` (the first also holds 0) group the points; per
    bin ``confidence = mean_{n in B_m} c_n`` and ``accuracy = mean_{n in B_m} [argmax_k p_nk = y_n]``
    (both NaN for an empty bin) and ``count = |B_m|``. The expected calibration error is
    ``ECE = sum_m (|B_m| / N) |accuracy_m - confidence_m|`` (their eq. 3; :func:`classification_metrics`).

    Args:
        y: ``(N,)`` integer labels in ``[0, K)``.
        probs: ``(N, K)`` predictive probabilities, rows summing to 1 (within 1e-4); a ``(N,)``
            vector is read as ``P(y = 1)`` of a binary problem.
        bins: the number ``M`` of bins.

    Returns a DataFrame indexed by ``bin`` (0..M-1) with columns ``lower``, ``upper``,
    ``confidence``, ``accuracy``, ``count``.
    """
    labels, p, _ = _checked(y, probs, None)
    return _bin_stats(labels, p, check_int(bins, "bins"))


def classification_metrics(
    y: Tensor | np.ndarray,
    probs: Tensor | np.ndarray | None = None,
    *,
    log_probs: Tensor | np.ndarray | None = None,
    bins: int = 15,
) -> pd.Series:
    r"""Test log-likelihood, accuracy, Brier score and ECE of predictive probabilities.

    With labels ``y_n`` and probabilities ``p_nk`` (module docstring):

    * ``test_ll = (1/N) sum_n log p_{n, y_n}``, the mean log predictive probability of the true
      label (minus the negative log-likelihood, or "log loss"; higher is better). From ``probs``
      the logarithm is taken of ``max(p, 2.2e-308)`` (the smallest positive float64), so a zero
      probability on a true label counts ``-708.4`` instead of ``-inf``; pass ``log_probs=``
      instead (e.g. ``logits.log_softmax(-1)``, or a log-mean-exp over posterior samples) for
      exact log-probabilities, ``-inf`` included.
    * ``accuracy``: the fraction of points with ``argmax_k p_nk = y_n`` (ties: the lowest index).
    * ``brier = (1/N) sum_n sum_k (p_nk - [y_n = k])^2`` (Brier 1950; in ``[0, 2]``, lower is
      better; for ``K = 2`` it is twice the binary ``mean_n (p_n1 - y_n)^2``).
    * ``ece``: expected calibration error with ``bins`` equal-width bins of the top-class
      probability, each weighted by its share of the points (Guo et al. 2017, arXiv:1706.04599,
      eq. 3; :func:`reliability_curve` gives the bins).

    Args:
        y: ``(N,)`` integer labels in ``[0, K)`` (e.g. ``data.y_test`` of a classification set).
        probs: ``(N, K)`` predictive probabilities; rows must sum to 1 within 1e-4. A ``(N,)``
            vector is read as ``P(y = 1)`` of a binary problem.
        log_probs: instead of ``probs``, their logarithms ``(N, K)`` (or ``(N,)``: ``log P(y = 1)``).
        bins: number of ECE bins (15, as Guo et al.).

    Returns a ``pandas.Series`` with keys ``test_ll``, ``accuracy``, ``brier``, ``ece``.
    """
    bins = check_int(bins, "bins")
    labels, p, lp = _checked(y, probs, log_probs)
    onehot = torch.nn.functional.one_hot(labels, p.shape[1]).double()
    return pd.Series(
        {
            "test_ll": float(lp.gather(1, labels[:, None]).mean()),
            "accuracy": float((p.argmax(-1) == labels).double().mean()),
            "brier": float(((p - onehot) ** 2).sum(-1).mean()),
            "ece": _ece(_bin_stats(labels, p, bins)),
        }
    )


def _entropy(p: Tensor) -> Tensor:
    """``-sum_k p_k log p_k`` over the last axis, ``0 log 0 = 0``."""
    return -torch.xlogy(p, p).sum(-1)


def predictive_entropy(probs_samples: Tensor | np.ndarray) -> Tensor:
    r"""Entropy of the predictive (Bayesian model average) class distribution, per point: ``(N,)``.

    ``H[p_bar_n] = -sum_k p_bar_nk log p_bar_nk`` with ``p_bar_nk = (1/S) sum_s p_snk``, in nats
    (``0 log 0 = 0``): the total uncertainty, aleatoric and epistemic together, in ``[0, log K]``.
    Hendrycks & Gimpel (2017, arXiv:1610.02136) flag out-of-distribution inputs by low maximum
    probability; the predictive entropy is the same idea over the whole distribution
    (:func:`ood_auroc` scores either).

    Args:
        probs_samples: ``(S, N, K)`` class probabilities per posterior sample (each row summing to
            1 within 1e-4), or ``(N, K)`` predictive probabilities already averaged.
    """
    p = _probs(probs_samples, "probs_samples", dims=(2, 3))
    return _entropy(p.mean(0) if p.dim() == 3 else p)


def mutual_information(probs_samples: Tensor | np.ndarray) -> Tensor:
    r"""BALD: mutual information between a point's label and the weights, per point: ``(N,)``.

    ``I[y_n; w] = H[p_bar_n] - (1/S) sum_s H[p_sn]`` (Houlsby et al. 2011, arXiv:1112.5745, eq. 2-3,
    with the posterior replaced by its ``S`` samples): the entropy of the mean minus the mean
    entropy, in nats, ``0 log 0 = 0``. It is the epistemic part of :func:`predictive_entropy`,
    0 when the samples agree and up to ``log min(S, K)`` when confident samples disagree (two
    samples, one certain of class 0 and one of class 1: ``log 2``). Non-negative by concavity of
    the entropy; rounding below zero is clamped to 0.

    Args:
        probs_samples: ``(S, N, K)`` class probabilities per posterior sample, rows summing to 1
            within 1e-4.
    """
    if not isinstance(probs_samples, (Tensor, np.ndarray)) or np.ndim(probs_samples) != 3:
        raise ValueError(
            f"probs_samples must have shape (S, N, K) (class probabilities per posterior sample), got "
            f"{tuple(np.shape(probs_samples))}; averaged (N, K) probabilities carry no disagreement "
            f"between samples to measure"
        )
    p = _probs(probs_samples, "probs_samples", dims=(3,))
    return (_entropy(p.mean(0)) - _entropy(p).mean(0)).clamp_min(0.0)


def _scores(value: Any, name: str) -> Tensor:
    t = _float64(value, name)
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} contains NaN or infinite scores; check the model's outputs")
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(
            f"{name} must be a non-empty (N,) vector of scores, one per point, got shape "
            f"{tuple(t.shape)}" + ("; pass .reshape(-1)" if t.numel() else "")
        )
    return t


def ood_auroc(score_in: Tensor | np.ndarray, score_out: Tensor | np.ndarray) -> float:
    r"""AUROC of detecting out-of-distribution (OOD) points by a score that is larger OOD.

    OOD points are the positives. The AUROC is the Mann-Whitney statistic
    ``P(s_out > s_in) + P(s_out = s_in) / 2`` over all pairs of an OOD and an in-distribution
    point: 0.5 is chance, 1 perfect separation. Hendrycks & Gimpel (2017, arXiv:1610.02136) use
    the maximum softmax probability; pass a score that grows with uncertainty, e.g.
    ``1 - probs.max(-1).values``, :func:`predictive_entropy` or :func:`mutual_information`.

    Args:
        score_in: ``(N_in,)`` scores of in-distribution points (e.g. the test set).
        score_out: ``(N_out,)`` scores of OOD points (e.g. ``data.extras["x_ood"]`` of ``digits-ood``).
    """
    return auroc(_scores(score_in, "score_in"), _scores(score_out, "score_out"))
