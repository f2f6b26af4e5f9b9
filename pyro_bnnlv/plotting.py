"""Figures (matplotlib, Agg backend: works without a display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from .infer.predict import as_sample_dict  # noqa: E402
from .stats.predictive import mixture_quantile  # noqa: E402

__all__ = ["plot_predictive_1d"]


def plot_predictive_1d(
    model: Any,
    posterior_samples: Any,
    data: Any,
    path: str | Path,
    *,
    title: str = "",
    num_grid: int = 300,
    level: float = 0.95,
) -> Path:
    """Predictive mean and central ``level`` band of ``y`` over a grid, with the data points.

    The grid spans the training, test and (if present) ``extras["x_ood"]`` inputs, with a
    margin. Everything is drawn on the original scale of the data set.
    """
    if data.input_dim != 1:
        raise ValueError(f"plot_predictive_1d needs 1-D inputs; the data set has {data.input_dim}")
    samples = as_sample_dict(posterior_samples)
    xs = [data.x_train, data.x_test] + ([data.extras["x_ood"]] if "x_ood" in data.extras else [])
    lo = min(float(x.min()) for x in xs)
    hi = max(float(x.max()) for x in xs)
    pad = 0.1 * (hi - lo)
    grid = torch.linspace(lo - pad, hi + pad, num_grid).unsqueeze(-1)
    with torch.no_grad():
        loc, scale = model.predictive_components(grid, samples, generator=torch.Generator().manual_seed(0))
    loc = loc[..., 0]
    alpha = (1 - level) / 2
    lower, upper = (mixture_quantile(loc, scale, q) for q in (alpha, 1 - alpha))
    sx, mx = float(data.x_std[0]), float(data.x_mean[0])
    sy, my = float(data.y_std), float(data.y_mean)

    def ox(t):
        return (t * sx + mx).numpy().ravel()

    def oy(t):
        return (t * sy + my).numpy().ravel()

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.fill_between(ox(grid), oy(lower.float()), oy(upper.float()), alpha=0.3,
                    label=f"{int(level * 100)}% predictive interval")  # fmt: skip
    ax.plot(ox(grid), oy(loc.mean(0)), lw=2, label="predictive mean")
    ax.scatter(ox(data.x_train), oy(data.y_train), s=8, c="k", label="train")
    ax.scatter(ox(data.x_test), oy(data.y_test), s=8, c="tab:red", alpha=0.6, label="test")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
