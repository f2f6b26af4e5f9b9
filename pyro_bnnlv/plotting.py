"""Figures of a fitted regression posterior (matplotlib).

* :func:`plot_predictive_1d`: predictive mean and band over a grid of a 1-D input, with the data;
* :func:`plot_predicted_vs_observed` and :func:`plot_calibration`: for inputs of any dimension,
  the predictive mean and interval of every test target against its observed value, and the
  coverage of the central intervals (PICP) against their nominal level;
* :func:`plot_reliability`: for a classifier, the reliability diagram of its class probabilities
  (accuracy per confidence bin against the diagonal, ECE in the title).

Each takes every posterior :func:`~pyro_bnnlv.evaluate` takes: samples ``{"w": (S, P)}`` or a
``(S, P)`` tensor, an ``MCMC`` run, an ArviZ ``InferenceData``, a fitted guide (``num_samples``
draws, seeded by ``seed``; a sampled Laplace's ``la.as_guide()`` too) or a fitted
:class:`~pyro_bnnlv.infer.LinearizedLaplace` (its exact Gaussian predictive). The predictive at an
input is the Gaussian mixture ``(1/S) sum_s N(f(x; w_s), sigma^2)`` of :func:`~pyro_bnnlv.evaluate`
(latent inputs drawn from their prior, ``latent_draws`` per weight sample for BNN+LV, eq. 34 of
Yacoby, Pan & Doshi-Velez 2022, arXiv:1911.00569), or one Gaussian for the linearised Laplace;
intervals are its exact quantiles (:func:`~pyro_bnnlv.stats.predictive.mixture_interval`).

Every helper returns the ``matplotlib.figure.Figure``, draws into ``ax=`` when given and never
changes matplotlib's backend. With ``path`` the figure is also written there (and, when the
helper created it, closed, so batch scripts do not accumulate open figures).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._checks import check_int, check_seed
from ._figures import finish_figure, new_axes
from .protocols import RegressionModel
from .datasets.base import Dataset
from .posterior import SelfEvaluatingPosterior
from .stats.classification import classification_metrics, reliability_curve
from .stats.predictive import (
    check_level,
    mixture_interval,
    posterior_sample_dict,
    predictive_chunks,
    predictive_metrics,
)

__all__ = [
    "finish_figure",
    "new_axes",
    "plot_calibration",
    "plot_predicted_vs_observed",
    "plot_predictive_1d",
    "plot_reliability",
]

#: Nominal levels of :func:`plot_calibration`'s curve: 0.05, 0.10, ..., 0.95.
DEFAULT_LEVELS = tuple(round(0.05 * k, 2) for k in range(1, 20))
_SPLITS = ("train", "valid", "test")


def _check_data(data: Any, helper: str) -> Dataset:
    if not isinstance(data, Dataset):
        raise TypeError(
            f"{helper}: data must be a pyro_bnnlv Dataset (e.g. pb.datasets.from_arrays(x, y) "
            f"or pb.load_dataset(name)), got {type(data).__name__}"
        )
    return data


def _predictive_mixture(
    model: Any, posterior: Any, data: Dataset, x: Tensor, *, num_samples: int, seed: int | None, latent_draws: int
) -> tuple[Tensor, Tensor]:
    """``(loc, scale)``, both ``(S, N, L)`` float64 on the data's (standardised) scale: the
    predictive mixture at ``x`` of any posterior :func:`~pyro_bnnlv.evaluate` takes, normalised
    the way it normalises them (a self-evaluating posterior's own Gaussian predictive, else
    :func:`~pyro_bnnlv.stats.predictive.posterior_sample_dict`), in evaluate's chunks."""
    if isinstance(posterior, SelfEvaluatingPosterior):  # LinearizedLaplace: its exact Gaussian
        pred = posterior.predictive(x)
        return pred.mean.double().unsqueeze(0), pred.var.double().sqrt().unsqueeze(0)
    if not isinstance(model, RegressionModel):
        raise TypeError(
            f"model must be a pyro_bnnlv model (with check_data, f and predictive_components), "
            f"got {type(model).__name__}"
        )
    if callable(getattr(model, "_check_dtype", None)):
        model._check_dtype(x)
    samples = posterior_sample_dict(
        model, posterior, x, train_data=(data.x_train, data.y_train), num_samples=num_samples, seed=seed
    )
    locs, scales = [], []
    for _, loc, scale in predictive_chunks(model, samples, x, latent_draws=latent_draws, seed=seed):
        locs.append(loc.double())
        scales.append(torch.as_tensor(scale, dtype=torch.float64).expand_as(loc))
    return torch.cat(locs, 1), torch.cat(scales, 1)


def _split(data: Dataset, split: str) -> tuple[Tensor, Tensor]:
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")
    x, y = getattr(data, f"x_{split}"), getattr(data, f"y_{split}")
    if x.shape[0] == 0:
        raise ValueError(f"data has no {split} points; choose another split= ({_SPLITS})")
    return x, y


def _original_y(data: Dataset, t: Tensor) -> np.ndarray:
    """Values on the data's standardised scale of ``y`` mapped back (``t * y_std + y_mean``)."""
    return (t.double() * float(data.y_std) + float(data.y_mean)).numpy().ravel()


def _titled(fig: Any, ax: Any, title: str, path: str | Path | None, owned: bool) -> Any:
    """Title and legend of a plot of this module, then :func:`finish_figure`."""
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    return finish_figure(fig, path, owned)


def _split_mixture(
    helper: str, model: Any, posterior: Any, data: Any, split: str, num_samples: int, seed: Any, latent_draws: int
) -> tuple[Dataset, Tensor, Tensor, Tensor, Tensor]:
    """``(data, x, y, loc, scale)`` of a split, checked, with the predictive mixture at ``x``."""
    data = _check_data(data, helper)
    x, y = _split(data, split)
    loc, scale = _predictive_mixture(
        model, posterior, data, x, num_samples=num_samples, seed=check_seed(seed), latent_draws=latent_draws
    )
    return data, x, y, loc, scale


def plot_predictive_1d(
    model: RegressionModel,
    posterior: Any,
    data: Dataset,
    path: str | Path | None = None,
    *,
    ax: Any = None,
    title: str = "",
    num_grid: int = 300,
    level: float = 0.95,
    num_samples: int = 500,
    seed: int = 0,
    latent_draws: int = 1,
) -> Any:
    """Predictive mean and central ``level`` band of ``y`` over a grid, with the data points.

    Args:
        model: the fitted model (exposes ``predictive_components``).
        posterior: any posterior :func:`~pyro_bnnlv.evaluate` takes (module docstring; a guide
            gives ``num_samples`` draws, seeded by ``seed``).
        data: a :class:`~pyro_bnnlv.datasets.Dataset` with one input (e.g. from
            :func:`~pyro_bnnlv.datasets.from_arrays`); for more inputs use
            :func:`plot_predicted_vs_observed` and :func:`plot_calibration`. The grid spans its
            training, test and (if present) ``extras["x_ood"]`` inputs with a 10% margin;
            everything is drawn on the original scale of the data (``x * x_std + x_mean``,
            ``y * y_std + y_mean``).
        path: also write the figure there (PNG, PDF, ... by extension).
        ax: draw into this matplotlib axes instead of a new figure.
        latent_draws: latent inputs per weight sample and grid point for BNN+LV (default 1, a
            Monte-Carlo estimate of the same predictive; :func:`~pyro_bnnlv.evaluate` uses 64).

    Returns the figure. The band is the exact ``(1 -/+ level) / 2`` quantiles of the predictive
    mixture, as in :func:`~pyro_bnnlv.evaluate`.
    """
    data = _check_data(data, "plot_predictive_1d")
    if data.input_dim != 1:
        raise ValueError(
            f"plot_predictive_1d needs 1-D inputs; the data set has {data.input_dim}. For inputs of "
            "any dimension plot the test targets: plot_predicted_vs_observed(model, posterior, data) "
            "(predictive mean and interval against the observed y) and plot_calibration(model, "
            "posterior, data) (interval coverage against the nominal level), in pyro_bnnlv.plotting"
        )
    check_level(level)
    num_grid = check_int(num_grid, "num_grid", minimum=2)
    seed = check_seed(seed)
    xs = [data.x_train, data.x_test] + ([data.extras["x_ood"]] if "x_ood" in data.extras else [])
    lo = min(float(x.min()) for x in xs)
    hi = max(float(x.max()) for x in xs)
    pad = 0.1 * (hi - lo)
    grid = torch.linspace(lo - pad, hi + pad, num_grid, dtype=data.x_train.dtype).unsqueeze(-1)
    loc, scale = _predictive_mixture(
        model, posterior, data, grid, num_samples=num_samples, seed=seed, latent_draws=latent_draws
    )
    loc, scale = loc[..., 0], scale[..., 0]
    lower, upper = mixture_interval(loc, scale, level)
    sx, mx = float(data.x_std[0]), float(data.x_mean[0])

    def ox(t):
        return (t.double() * sx + mx).numpy().ravel()

    owned = ax is None
    fig, ax = new_axes(ax)
    ax.fill_between(
        ox(grid),
        _original_y(data, lower),
        _original_y(data, upper),
        alpha=0.3,
        label=f"{level * 100:g}% predictive interval",
    )
    ax.plot(ox(grid), _original_y(data, loc.mean(0)), lw=2, label="predictive mean")
    ax.scatter(ox(data.x_train), _original_y(data, data.y_train), s=8, c="k", label="train")
    ax.scatter(ox(data.x_test), _original_y(data, data.y_test), s=8, c="tab:red", alpha=0.6, label="test")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    return _titled(fig, ax, title, path, owned)


def plot_predicted_vs_observed(
    model: RegressionModel,
    posterior: Any,
    data: Dataset,
    path: str | Path | None = None,
    *,
    ax: Any = None,
    split: str = "test",
    title: str = "",
    level: float = 0.95,
    num_samples: int = 500,
    seed: int = 0,
    latent_draws: int = 1,
) -> Any:
    """Predictive mean and central ``level`` interval of every target of a split against its
    observed value, with the diagonal ``predicted = observed``; inputs of any dimension.

    A point on the diagonal is predicted exactly; a well-calibrated predictive has about a
    fraction ``level`` of the intervals crossing it (the PICP, given in the legend; the whole
    curve over levels is :func:`plot_calibration`). Everything is on the original scale of ``y``
    (``y * y_std + y_mean``).

    Args:
        model, posterior: as for :func:`plot_predictive_1d` (any posterior
            :func:`~pyro_bnnlv.evaluate` takes).
        data: a :class:`~pyro_bnnlv.datasets.Dataset`; ``split`` (``"test"``, ``"valid"`` or
            ``"train"``) chooses its points.
        level: probability of the central interval drawn as error bars.
        num_samples, seed: draws from a guide and their seed (also seeds BNN+LV's latent draws).
        latent_draws: latent inputs per weight sample and point for BNN+LV (default 1, see
            :func:`plot_predictive_1d`; ``latent_draws=64`` and the same ``seed`` reproduce
            :func:`~pyro_bnnlv.evaluate`'s numbers exactly).
        path, ax, title: as for :func:`plot_predictive_1d`.

    Returns the figure.
    """
    check_level(level)
    data, x, y, loc, scale = _split_mixture(
        "plot_predicted_vs_observed", model, posterior, data, split, num_samples, seed, latent_draws
    )
    picp = float(predictive_metrics(y, loc, scale, level=level)["picp"])
    loc, scale = loc[..., 0], scale[..., 0]
    mean = _original_y(data, loc.mean(0))
    lower, upper = (_original_y(data, bound) for bound in mixture_interval(loc, scale, level))
    observed = _original_y(data, y)
    owned = ax is None
    fig, ax = new_axes(ax, figsize=(5.5, 5))
    ax.errorbar(
        observed,
        mean,
        yerr=np.stack([mean - lower, upper - mean]),
        fmt="o",
        ms=3,
        lw=0.8,
        alpha=0.7,
        label=f"predictive mean, {level * 100:g}% interval (PICP {picp:.2f})",
    )
    lo = float(min(observed.min(), lower.min()))
    hi = float(max(observed.max(), upper.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="predicted = observed")
    ax.set_xlabel(f"observed y ({split}, {len(observed)} points)")
    ax.set_ylabel("predicted y")
    return _titled(fig, ax, title, path, owned)


def plot_calibration(
    model: RegressionModel,
    posterior: Any,
    data: Dataset,
    path: str | Path | None = None,
    *,
    ax: Any = None,
    split: str = "test",
    title: str = "",
    levels: Sequence[float] = DEFAULT_LEVELS,
    num_samples: int = 500,
    seed: int = 0,
    latent_draws: int = 1,
) -> Any:
    """Calibration curve: PICP, the fraction of a split's targets inside the central predictive
    interval of nominal probability ``level``, against ``level`` for each of ``levels``, with the
    diagonal of perfect calibration; inputs of any dimension.

    A target ``y_n`` lies inside the central ``level`` interval exactly when the predictive CDF
    ``F_n(y_n)`` lies in ``[(1 - level) / 2, (1 + level) / 2]``, so the curve is that of the
    probability integral transform (Kuleshov, Fenner & Ermon 2018, arXiv:1807.00263, for the
    central intervals): below the diagonal the intervals are too narrow (over-confident), above
    it too wide. Each point is :func:`~pyro_bnnlv.evaluate`'s ``picp`` at that ``level``.

    Args:
        model, posterior, data, split, num_samples, seed, latent_draws, path, ax, title: as for
            :func:`plot_predicted_vs_observed`.
        levels: nominal probabilities in ``(0, 1)`` (default 0.05, 0.10, ..., 0.95).

    Returns the figure; the curve is its first line (``fig.axes[0].lines[0]``: x the levels,
    y the PICPs).
    """
    if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence | np.ndarray) or len(levels) == 0:
        raise ValueError(f"levels must be a non-empty sequence of probabilities in (0, 1), got {levels!r}")
    for level in levels:
        check_level(level)
    levels = sorted(float(v) for v in levels)
    data, x, y, loc, scale = _split_mixture(
        "plot_calibration", model, posterior, data, split, num_samples, seed, latent_draws
    )
    picp = [float(predictive_metrics(y, loc, scale, level=level)["picp"]) for level in levels]
    owned = ax is None
    fig, ax = new_axes(ax, figsize=(5, 5))
    ax.plot(levels, picp, "o-", ms=4, label=f"{split} set ({x.shape[0]} points)")
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    ax.set_xlim(-0.02, 1.02)  # points at PICP 0 or 1 stay whole
    ax.set_ylim(-0.02, 1.02)
    ax.set_aspect("equal")
    ax.set_xlabel("nominal level of the central interval")
    ax.set_ylabel("PICP (fraction of targets inside)")
    return _titled(fig, ax, title, path, owned)


def plot_reliability(
    y: Tensor | np.ndarray,
    probs: Tensor | np.ndarray,
    path: str | Path | None = None,
    *,
    bins: int = 15,
    ax: Any = None,
    title: str = "",
) -> Any:
    """Reliability diagram of class probabilities (Guo, Pleiss, Sun & Weinberger 2017,
    arXiv:1706.04599, Fig. 1): the accuracy of each equal-width bin of the top-class probability
    against the diagonal of perfect calibration, with the expected calibration error in the title.

    A bar spans its bin and rises to the accuracy of the bin's points; its shade grows with the
    bin's share of the points (the palest bars hold the fewest; empty bins have no height). The
    dots mark each bin's mean confidence and accuracy: on the diagonal the classifier is
    calibrated, below it over-confident. The numbers are
    :func:`~pyro_bnnlv.stats.reliability_curve` and :func:`~pyro_bnnlv.stats.classification_metrics`'s
    ``ece``.

    Args:
        y: ``(N,)`` integer labels in ``[0, K)``.
        probs: ``(N, K)`` predictive probabilities (rows summing to 1), or ``(N,)`` ``P(y = 1)``.
        path: also write the figure there.
        bins: number of confidence bins (15, as Guo et al.).
        ax: draw into this matplotlib axes instead of a new figure.
        title: prefix of the title.

    Returns the figure (the diagram is its ``fig.axes[0]``, or ``ax``).
    """
    curve = reliability_curve(y, probs, bins=bins)
    ece = float(classification_metrics(y, probs, bins=bins)["ece"])
    count = curve["count"].to_numpy()
    share = count / max(count.max(), 1)
    owned = ax is None
    fig, ax = new_axes(ax, figsize=(5, 5))
    colors = [(0.12, 0.47, 0.71, 0.15 + 0.85 * s) for s in share]  # tab:blue, opaque for the fullest bin
    ax.bar(
        curve["lower"],
        curve["accuracy"].fillna(0.0),
        width=curve["upper"] - curve["lower"],
        align="edge",
        color=colors,
        edgecolor="k",
        linewidth=0.5,
        label="accuracy per bin (shade: share of points)",
    )
    used = count > 0
    ax.plot(
        curve["confidence"][used],
        curve["accuracy"][used],
        "o",
        color="tab:red",
        ms=4,
        label="(mean confidence, accuracy)",
    )
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_aspect("equal")
    ax.set_xlabel("confidence (top-class probability)")
    ax.set_ylabel("accuracy")
    heading = f"ECE = {ece:.3f} ({len(curve)} bins, {int(count.sum())} points)"
    return _titled(fig, ax, f"{title}  {heading}".strip(), path, owned)
