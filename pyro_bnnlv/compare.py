"""The NCAI comparison experiment behind ``pyro-bnnlv compare DATASET``.

``ncai-bnnlv-nonidentifiability.txt`` sec. 7 and App. F: on one data set, train

* ``BNN (MFVI)``: BNN, ``AutoNormal``; observation-noise variance chosen from a grid;
* ``BNN+LV (MFVI)``: BNN+LV, ``AutoNormal`` over ``w`` and ``z`` from a standard network init;
* ``BNN+LV (NCAI_0)``: the NCAI step-1 initialisation followed by mean-field VI;
* ``BNN+LV (NCAI_lambda)``: the same initialisation with the NCAI objective (``NCAIElbo``),
  ``(eps_T, eps_x, eps_y)`` chosen from a grid,

each the best of ``restarts`` random restarts (and grid points) by validation log-likelihood,
with the paper's architectures (Tables 7-8), LeakyReLU(0.01) and Adam with learning rate 0.01.
The table reports test log-likelihood, RMSE, PICP, MPIW (original scale of ``y``), ``I(x; mu_z)``
(KSG, k = 5), ``HZ(mu_z)`` and the wall time of the whole search for that method.

Data are standardised with training statistics for every data set (so that the paper's noise and
prior grids mean the same thing everywhere); metrics are mapped back to the original scale.
Defaults are scaled down to finish in minutes on 2 cores (``steps=3000``, 2 restarts, one NCAI
setting); ``full=True`` uses the paper's settings (30,000 steps, 10 restarts, the App. F.1 grids,
empirical Bayes for the prior variances).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from tqdm.auto import tqdm

from .datasets import Dataset, load_dataset
from .guides.init import init_to_network
from .guides.ncai import ncai_guide
from .infer.empirical_bayes import EmpiricalBayes
from .infer.ncai import NCAIElbo
from .infer.predict import sample_posterior
from .infer.svi import fit_svi
from .models.bnn import BNN
from .models.bnnlv import BNNLV
from .nets import MLP
from .stats.latent import latent_diagnostics, latent_means
from .stats.predictive import evaluate

__all__ = ["CompareConfig", "DATASET_SETTINGS", "run_compare", "METHODS", "COLUMNS"]

METHODS = ("BNN (MFVI)", "BNN+LV (MFVI)", "BNN+LV (NCAI_0)", "BNN+LV (NCAI_lambda)")
COLUMNS = ["method", "test_ll", "rmse", "picp", "mpiw", "mi_x_z", "hz_z", "seconds"]

#: Hidden layers per data set (Tables 7 and 8) and latent prior variance where App. F.1 fixes it.
DATASET_SETTINGS: dict[str, dict[str, Any]] = {
    "heavy-tail": {"hidden": [50], "z_var": 0.01},
    "depeweg": {"hidden": [50], "z_var": 1.0},
    "bimodal": {"hidden": [50, 50], "z_var": 0.1},
    "williams": {"hidden": [20, 20]},
    "yuan": {"hidden": [20]},
    "goldberg": {"hidden": [20]},
    "lidar": {"hidden": [10]},
    "yacht": {"hidden": [5]},
    "energy": {"hidden": [10]},
    "airfoil": {"hidden": [30]},
    "abalone": {"hidden": [10]},
    "wine": {"hidden": [20]},
}


@dataclass
class CompareConfig:
    """Settings of one comparison; see the module docstring for the defaults' rationale."""

    steps: int = 3000
    restarts: int = 2
    lr: float = 0.01
    seed: int = 0
    hidden: list[int] | None = None  # default: DATASET_SETTINGS, else [20]
    z_var: float | None = None  # latent prior variance; default: DATASET_SETTINGS, else 1.0
    lv_noise_vars: tuple[float, ...] = (0.1,)  # App. F.1 grid {0.1, 0.01}
    bnn_noise_vars: tuple[float, ...] = (1.0, 0.1)  # App. F.1 grid {1.0, 0.1, 0.01}
    ncai_grid: list[dict[str, float]] = field(
        default_factory=lambda: [dict(lambda1=1.0, lambda2=10.0, lambda3=1.0,
                                      eps_T=0.01, eps_x=0.5, eps_y=0.1)]  # fmt: skip
    )
    map_steps: int = 2000
    num_samples: int = 500
    empirical_bayes: bool = False
    batch_size: int | None = None

    @classmethod
    def full(cls, **overrides: Any) -> "CompareConfig":
        """The paper's settings (App. F.1): long runs, 10 restarts, full grids, empirical Bayes."""
        grid = [
            dict(lambda1=1.0, lambda2=10.0, lambda3=1.0, eps_T=t, eps_x=ex, eps_y=ey)
            for t, ex, ey in itertools.product((0.01, 0.0003), (0.5, 1.0), (0.1, 0.5))
        ]
        settings = dict(steps=30000, restarts=10, lv_noise_vars=(0.1, 0.01),
                        bnn_noise_vars=(1.0, 0.1, 0.01), ncai_grid=grid, empirical_bayes=True)  # fmt: skip
        settings.update(overrides)
        return cls(**settings)


@dataclass
class _Fit:
    model: Any
    guide: Any
    valid_ll: float


def _fit(method: str, data: Dataset, cfg: CompareConfig, hidden: list[int], z_var: float,
         noise_var: float, ncai: dict[str, float] | None, seed: int) -> _Fit:  # fmt: skip
    D = data.input_dim
    noise = math.sqrt(noise_var)
    if method == "BNN (MFVI)":
        model = BNN(MLP(D, hidden, 1, activation="leaky_relu"), noise_scale=noise)
        guide = AutoNormal(model, init_scale=0.01, init_loc_fn=init_to_network(model, seed=seed))
    else:
        model = BNNLV(MLP(D + 1, hidden, 1, activation="leaky_relu"), latent_dim=1,
                      latent_scale=math.sqrt(z_var), noise_scale=noise)  # fmt: skip
        if method == "BNN+LV (MFVI)":
            guide = AutoNormal(model, init_scale=0.01, create_plates=model.create_plates,
                               init_loc_fn=init_to_network(model, seed=seed))  # fmt: skip
        else:
            guide = ncai_guide(model, data.x_train, data.y_train, num_steps=cfg.map_steps,
                               lr=cfg.lr, seed=seed)  # fmt: skip
    callback = EmpiricalBayes(model, guide) if cfg.empirical_bayes else None
    if ncai is not None:
        loss = NCAIElbo(**ncai, jit=not cfg.empirical_bayes)
    else:
        loss = Trace_ELBO() if cfg.empirical_bayes else None  # None: fit_svi's JIT default
    fit_svi(model, guide, data.x_train, data.y_train, num_steps=cfg.steps, lr=cfg.lr, loss=loss,
            batch_size=cfg.batch_size, seed=seed, progress=False, callback=callback)  # fmt: skip
    samples = sample_posterior(model, guide, data.x_train, data.y_train,
                               num_samples=cfg.num_samples, seed=seed)  # fmt: skip
    valid = evaluate(model, samples, data.x_valid, data.y_valid, seed=seed)
    return _Fit(model, guide, float(valid["test_ll"]))


def _candidates(method: str, cfg: CompareConfig):
    noise_vars = cfg.bnn_noise_vars if method == "BNN (MFVI)" else cfg.lv_noise_vars
    grid = cfg.ncai_grid if method == "BNN+LV (NCAI_lambda)" else [None]
    for noise_var, ncai, restart in itertools.product(noise_vars, grid, range(cfg.restarts)):
        yield noise_var, ncai, restart


def run_compare(
    dataset: str | Dataset,
    config: CompareConfig | None = None,
    *,
    progress: bool = True,
    figure: str | Path | None = None,
) -> tuple[pd.DataFrame, dict[str, _Fit]]:
    """Run the four methods on ``dataset``; return the results table and the selected fits."""
    cfg = config or CompareConfig()
    data = dataset if isinstance(dataset, Dataset) else load_dataset(
        dataset, seed=cfg.seed, standardize=True)  # fmt: skip
    settings = DATASET_SETTINGS.get(data.name, {})
    hidden = cfg.hidden or settings.get("hidden", [20])
    z_var = cfg.z_var or settings.get("z_var", 1.0)
    rows, fits = [], {}
    total = sum(len(list(_candidates(m, cfg))) for m in METHODS)
    bar = tqdm(total=total, disable=not progress, desc=f"compare {data.name}")
    for method in METHODS:
        t0 = time.perf_counter()
        best: _Fit | None = None
        for noise_var, ncai, restart in _candidates(method, cfg):
            seed = cfg.seed * 1000 + restart
            fit = _fit(method, data, cfg, hidden, z_var, noise_var, ncai, seed)
            if best is None or fit.valid_ll > best.valid_ll:
                best = fit
            bar.update(1)
            bar.set_postfix(method=method, valid_ll=f"{fit.valid_ll:.3f}")
        seconds = time.perf_counter() - t0
        fits[method] = best
        samples = sample_posterior(best.model, best.guide, data.x_train, data.y_train,
                                   num_samples=cfg.num_samples, seed=cfg.seed)  # fmt: skip
        test = evaluate(best.model, samples, data.x_test, data.y_test,
                        y_mean=data.y_mean, y_std=data.y_std, seed=cfg.seed)  # fmt: skip
        row = {"method": method, **test.to_dict(), "mi_x_z": math.nan, "hz_z": math.nan}
        if isinstance(best.model, BNNLV):
            diag = latent_diagnostics(best.model, best.guide, data.x_train, data.y_train)
            row.update(mi_x_z=diag["mi_x_z"], hz_z=diag["hz_z"])
        row["seconds"] = seconds
        rows.append(row)
    bar.close()
    table = pd.DataFrame(rows, columns=COLUMNS)
    if figure is not None and data.input_dim == 1:
        plot_compare(data, fits, cfg, figure)
    return table, fits


def plot_compare(data: Dataset, fits: dict[str, _Fit], cfg: CompareConfig, path: str | Path) -> Path:
    """Fig. 4: predictive mean and 95% band per method (top) and ``mu_z`` against ``x`` (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .stats.predictive import mixture_quantile

    fig, axes = plt.subplots(2, len(fits), figsize=(4 * len(fits), 6), squeeze=False)
    sx, mx, sy, my = (float(v) for v in (data.x_std[0], data.x_mean[0], data.y_std, data.y_mean))
    lo, hi = float(data.x_train.min()), float(data.x_train.max())
    grid = torch.linspace(lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo), 200).unsqueeze(-1)
    for col, (method, fit) in enumerate(fits.items()):
        samples = sample_posterior(fit.model, fit.guide, data.x_train, data.y_train,
                                   num_samples=300, seed=cfg.seed)  # fmt: skip
        with torch.no_grad():
            loc, scale = fit.model.predictive_components(
                grid, samples, generator=torch.Generator().manual_seed(0))
        loc = loc[..., 0]
        lower, upper = (mixture_quantile(loc, scale, q).float() for q in (0.025, 0.975))
        gx = grid[:, 0] * sx + mx
        ax = axes[0][col]
        ax.fill_between(gx, lower * sy + my, upper * sy + my, alpha=0.3)
        ax.plot(gx, loc.mean(0) * sy + my, lw=1.5)
        ax.scatter(data.x_train[:, 0] * sx + mx, data.y_train * sy + my, s=4, c="k")
        ax.set_title(method, fontsize=10)
        ax2 = axes[1][col]
        if isinstance(fit.model, BNNLV):
            mu = latent_means(fit.guide, data.x_train, data.y_train)
            ax2.scatter(data.x_train[:, 0] * sx + mx, mu[:, 0], s=4)
            ax2.set_ylabel("variational mean of z")
        else:
            ax2.axis("off")
        ax2.set_xlabel("x")
    fig.suptitle(f"{data.name}: posterior predictives (top), latent means vs x (bottom)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
