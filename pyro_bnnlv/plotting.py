"""Figures of a fitted regression posterior (matplotlib).

Every helper returns the ``matplotlib.figure.Figure``, draws into ``ax=`` when given (so it can
be a panel of your own figure) and never changes matplotlib's backend: in a notebook or an
interactive session the figure shows as usual; on a machine without a display matplotlib picks
its non-interactive ``Agg`` backend by itself (set ``MPLBACKEND=Agg`` to force it). With ``path``
the figure is also written there (and, when the helper created it, closed, so batch scripts do not
accumulate open figures; the returned figure can still be saved again).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ._figures import finish_figure, new_axes
from .stats.predictive import mixture_quantile, posterior_sample_dict

__all__ = ["plot_predictive_1d", "new_axes", "finish_figure"]


def plot_predictive_1d(
    model: Any,
    posterior: Any,
    data: Any,
    path: str | Path | None = None,
    *,
    ax: Any = None,
    title: str = "",
    num_grid: int = 300,
    level: float = 0.95,
    num_samples: int = 500,
    seed: int = 0,
) -> Any:
    """Predictive mean and central ``level`` band of ``y`` over a grid, with the data points.

    Args:
        model: the fitted model (exposes ``predictive_components``).
        posterior: samples ``{"w": (S, P)}``, a ``(S, P)`` tensor, an ``MCMC`` run, or a fitted
            guide (``num_samples`` draws, seeded by ``seed``).
        data: a 1-D :class:`~pyro_bnnlv.datasets.Dataset` (e.g. from
            :func:`~pyro_bnnlv.datasets.from_arrays`). The grid spans its training, test and (if
            present) ``extras["x_ood"]`` inputs with a 10% margin; everything is drawn on the
            original scale of the data (``x * x_std + x_mean``, ``y * y_std + y_mean``).
        path: also write the figure there (PNG, PDF, ... by extension).
        ax: draw into this matplotlib axes instead of a new figure.

    Returns the figure. The band is the exact ``(1 -/+ level) / 2`` quantiles of the Gaussian
    mixture ``(1/S) sum_s N(f(x; w_s), sigma^2)`` (latent inputs drawn from their prior for
    BNN+LV), as in :func:`~pyro_bnnlv.evaluate`.
    """
    if data.input_dim != 1:
        raise ValueError(f"plot_predictive_1d needs 1-D inputs; the data set has {data.input_dim}")
    samples = posterior_sample_dict(model, posterior, data.x_train,
                                    train_data=(data.x_train, data.y_train),
                                    num_samples=num_samples, seed=seed)  # fmt: skip
    xs = [data.x_train, data.x_test] + ([data.extras["x_ood"]] if "x_ood" in data.extras else [])
    lo = min(float(x.min()) for x in xs)
    hi = max(float(x.max()) for x in xs)
    pad = 0.1 * (hi - lo)
    grid = torch.linspace(lo - pad, hi + pad, num_grid, dtype=data.x_train.dtype).unsqueeze(-1)
    with torch.no_grad():
        loc, scale = model.predictive_components(grid, samples, generator=torch.Generator().manual_seed(seed))
    loc = loc[..., 0]
    alpha = (1 - level) / 2
    lower, upper = (mixture_quantile(loc, scale, q) for q in (alpha, 1 - alpha))
    sx, mx = float(data.x_std[0]), float(data.x_mean[0])
    sy, my = float(data.y_std), float(data.y_mean)

    def ox(t):
        return (t.double() * sx + mx).numpy().ravel()

    def oy(t):
        return (t.double() * sy + my).numpy().ravel()

    owned = ax is None
    fig, ax = new_axes(ax)
    ax.fill_between(ox(grid), oy(lower), oy(upper), alpha=0.3,
                    label=f"{level * 100:g}% predictive interval")  # fmt: skip
    ax.plot(ox(grid), oy(loc.mean(0)), lw=2, label="predictive mean")
    ax.scatter(ox(data.x_train), oy(data.y_train), s=8, c="k", label="train")
    ax.scatter(ox(data.x_test), oy(data.y_test), s=8, c="tab:red", alpha=0.6, label="test")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    return finish_figure(fig, path, owned)
