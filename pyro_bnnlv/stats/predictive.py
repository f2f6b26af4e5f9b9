"""Metrics of a Monte-Carlo posterior predictive (``ncai-bnnlv-nonidentifiability.txt`` App. F.2).

The posterior predictive at an input is approximated by the equal-weight Gaussian mixture

.. math::

    p(y^* \\mid x^*, \\mathcal D) \\approx \\frac1S \\sum_{s=1}^S
        \\mathcal N\\big(y^*;\\ f(x^*; w_s),\\ \\sigma_s^2 I\\big),
    \\qquad w_s \\sim q(w)\\ \\text{(or MCMC)},

(for BNN+LV the inputs carry latent draws ``z_s ~ p(z)``, eq. 34). The metrics are

* average test log-likelihood, eq. 34: ``mean_n log mean_s N(y_n; f_s(x_n), sigma^2)``, computed
  with ``logsumexp`` (never by averaging densities, which underflows);
* RMSE of the predictive mean ``mean_s f_s(x_n)`` (square root of the predictive MSE, eq. 35);
* PICP: fraction of test targets inside the central 95% interval of the predictive mixture;
* MPIW: mean width of that interval.

Interval endpoints are the exact quantiles of the Gaussian mixture, found by bisection on its
CDF (deterministic, no extra sampling noise). With ``y_mean``/``y_std`` (standardisation
statistics) every metric is reported on the original scale of ``y``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from ..infer.predict import as_sample_dict

__all__ = [
    "evaluate",
    "mixture_log_density",
    "mixture_quantile",
    "predictive_metrics",
]


def mixture_log_density(y: Tensor, loc: Tensor, scale: Tensor | float) -> Tensor:
    """``log (1/S) sum_s N(y_n; loc[s, n], scale^2 I_L)`` per point: ``y (N, L)``, ``loc (S, N, L)`` -> ``(N,)``."""
    scale = torch.as_tensor(scale, dtype=loc.dtype)
    comp = torch.distributions.Normal(loc, scale).log_prob(y).sum(-1)  # (S, N)
    return torch.logsumexp(comp, dim=0) - math.log(loc.shape[0])


def mixture_quantile(loc: Tensor, scale: Tensor | float, q: float, iters: int = 60) -> Tensor:
    """``q``-quantile of the mixture ``(1/S) sum_s N(loc[s, ...], scale^2)``, elementwise over ``loc[0]``.

    Bisection on the mixture CDF between ``min loc - 12 scale`` and ``max loc + 12 scale``; after
    ``iters`` halvings the bracket is ``2^-iters`` of its initial width.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must lie in (0, 1), got {q}")
    loc = loc.double()
    scale = torch.as_tensor(scale, dtype=torch.float64).expand_as(loc)
    lo = (loc - 12 * scale).amin(0)
    hi = (loc + 12 * scale).amax(0)
    normal = torch.distributions.Normal(loc, scale)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        below = normal.cdf(mid.unsqueeze(0)).mean(0) < q
        lo = torch.where(below, mid, lo)
        hi = torch.where(below, hi, mid)
    return 0.5 * (lo + hi)


def _check_level(level: float) -> None:
    real = isinstance(level, numbers.Real) and not isinstance(level, bool)
    if not real or not 0.0 < level < 1.0:
        hint = f" (a probability: level={level / 100:g} for a {level:g}% interval)" if (
            real and 1.0 < level < 100.0) else ""
        raise ValueError(f"level must lie in (0, 1), got {level!r}{hint}")


def _target_statistic(value: Any, name: str, num_outputs: int, dtype: torch.dtype) -> Tensor:
    """``y_mean``/``y_std`` as a tensor that broadcasts over the ``L`` outputs only.

    A scalar, or one value per output (shape ``(L,)`` or ``(1, L)``); anything else (e.g. the
    inputs' ``x_std`` passed by mistake, which would broadcast ``y`` to ``(N, D)``) is refused.
    """
    t = torch.as_tensor(value, dtype=dtype)
    if t.numel() not in (1, num_outputs) or t.dim() > 2 or (t.dim() == 2 and t.shape[0] != 1):
        raise ValueError(
            f"{name} must be a scalar or have one value per output (shape ({num_outputs},)); "
            f"got shape {tuple(t.shape)} (is it the inputs' statistic, e.g. data.x_std instead "
            f"of data.{name}?)"
        )
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} must be finite, got {value!r}")
    return t.reshape(-1)


def predictive_metrics(
    y: Tensor,
    loc: Tensor,
    scale: Tensor | float,
    *,
    level: float = 0.95,
    y_mean: Tensor | float | None = None,
    y_std: Tensor | float | None = None,
) -> pd.Series:
    """Metrics of the Gaussian-mixture predictive ``loc (S, N, L)``, ``scale`` for targets ``y (N, L)``.

    ``y_mean``/``y_std``: standardisation statistics; targets and predictive are mapped back to
    the original scale (``y * std + mean``) before every metric.
    """
    if loc.dim() != 3:
        raise ValueError(f"loc must have shape (S, N, L); got {tuple(loc.shape)}")
    _check_level(level)
    y = y.reshape(loc.shape[1], -1).to(loc.dtype)
    if y.shape[-1] != loc.shape[-1]:
        raise ValueError(f"y has {y.shape[-1]} outputs but the predictive has {loc.shape[-1]}")
    scale = torch.as_tensor(scale, dtype=loc.dtype)
    if y_std is not None:
        L = loc.shape[-1]
        std = _target_statistic(y_std, "y_std", L, loc.dtype)
        mean = _target_statistic(0.0 if y_mean is None else y_mean, "y_mean", L, loc.dtype)
        if (std <= 0).any():
            raise ValueError(f"y_std must be positive, got {y_std}")
        y, loc, scale = y * std + mean, loc * std + mean, scale * std
    elif y_mean is not None:
        raise ValueError("y_mean was given without y_std")
    ll = mixture_log_density(y, loc, scale)
    pred_mean = loc.mean(0)
    alpha = (1.0 - level) / 2
    lower = mixture_quantile(loc, scale, alpha).to(loc.dtype)
    upper = mixture_quantile(loc, scale, 1.0 - alpha).to(loc.dtype)
    inside = ((y >= lower) & (y <= upper)).to(loc.dtype)
    return pd.Series(
        {
            "test_ll": ll.mean().item(),
            "rmse": (y - pred_mean).square().mean().sqrt().item(),
            "picp": inside.mean().item(),
            "mpiw": (upper - lower).mean().item(),
        },
        name="metrics",
    )


def evaluate(
    model: Any,
    posterior_samples: Any,
    x: Tensor,
    y: Tensor,
    *,
    level: float = 0.95,
    y_mean: Tensor | float | None = None,
    y_std: Tensor | float | None = None,
    seed: int | None = None,
) -> pd.Series:
    """Test log-likelihood (eq. 34), RMSE, PICP and MPIW of a posterior on ``(x, y)``.

    Args:
        model: a library model (exposes ``check_data`` and ``predictive_components``).
        posterior_samples: ``{"w": (S, P), ...}``, a ``(S, P)`` tensor, or an ``MCMC`` object.
        x, y: test inputs ``(N, D)`` and targets ``(N,)``/``(N, L)``.
        level: central interval probability for PICP/MPIW (0.95 in the papers).
        y_mean, y_std: standardisation statistics of ``y`` (e.g. ``dataset.y_mean``,
            ``dataset.y_std``); metrics are then on the original scale.
        seed: seeds any sampling the model needs (prior draws of latent inputs for BNN+LV).
    """
    model.check_data(x, y)
    samples = as_sample_dict(posterior_samples)
    gen = None if seed is None else torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        loc, scale = model.predictive_components(x, samples, generator=gen)
    return predictive_metrics(y, loc, scale, level=level, y_mean=y_mean, y_std=y_std)
