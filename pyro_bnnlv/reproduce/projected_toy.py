r"""Proj-BNN Fig. 2 on the four-mode toy: does the projected posterior cover several weight modes?

Pradier, Pan, Yao, Ghosh & Doshi-Velez (2018), arXiv:1811.07006, sec. 5.1 and
Fig. 2: a 3-unit RBF network on data with four bumps fits three of them at a time, so its good
weights form separate groups ("missed-bump modes"). Mean-field VI on ``w`` settles in one; the
paper's Proj-BNN, with "a decoder ``g_phi`` that maps an isotropic 2-D Gaussian to weights that
we sampled from the solution set", covers two.

``python -m pyro_bnnlv.reproduce.projected_toy`` runs, on ``four-modes`` (the mirror-symmetric
construction, whose two best modes are exactly equally likely):

1. candidates: MAP fits from random restarts (App. A: "fitting a feedforward network multiple
   times"), the ones fitting three bumps, units put in canonical order
   (:func:`~pyro_bnnlv.datasets.projected_toys.canonical_rbf_units`);
2. mean-field VI on ``w`` (``AutoNormal``) from the best candidate;
3. the projected BNN (Alg. 1 from stage 2: ``fit_projected_bnn(candidates=...)``) with each
   decoder objective of :func:`~pyro_bnnlv.infer.projection.fit.fit_projection` (eq. 6's
   autoencoder, the VAE, the MMD) and each variant (``q(z)`` only, ``q(z) q(phi)``).

For every fit it reports the share of 2,000 prior draws of ``z`` whose decoded weights fit three
bumps and how many missed-bump modes they cover, the same for the posterior samples, and the
test log-likelihood (eq. 7). A mode "counts" when it holds at least 10% of the samples that fit
three bumps (issue 17's criterion).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyro
import torch
from pyro.infer.autoguide import AutoNormal
from torch import Tensor

from ..datasets import load_dataset
from ..datasets.base import Dataset
from ..datasets.projected_toys import (
    FOUR_MODE_CENTRES,
    bumps_fitted,
    canonical_rbf_units,
    four_modes_net,
    missed_bump_modes,
)
from ..guides import init_to_network
from ..infer import fit_svi
from ..posterior import sample_posterior
from ..infer.projection.decoder import DEFAULT_BETA
from ..infer.projection.fit import fit_projected_bnn, fit_projection
from ..models import BNN, ProjectedBNN
from ..stats.predictive import evaluate
from . import tables

__all__ = [
    "FIGURE_FITS",
    "FourModesResult",
    "four_modes_candidates",
    "four_modes_census",
    "four_modes_experiment",
    "main",
    "plot_four_modes",
]


def four_modes_candidates(
    data: Dataset,
    *,
    num_restarts: int = 200,
    num_steps: int = 1500,
    lr: float = 0.05,
    prior_scale: float = 1.0,
    noise_scale: float = 0.1,
    seed: int = 0,
) -> Tensor:
    """MAP fits of the 3-unit RBF network from ``num_restarts`` random starts (run as one batch),
    keeping those that fit three bumps, with their units in canonical order: ``(R, 10)``.

    Each start puts the units at centres ``c ~ U(-4.5, 4.5)`` with slopes ``a ~ U(1.5, 3)`` and
    heights ``v ~ U(0.5, 1.5)`` (``b = -a c``), so restarts reach all four modes; Adam maximises
    ``log p(y | x, w) + log N(w; 0, prior_scale^2)`` divided by ``N``, as
    :func:`~pyro_bnnlv.infer.svi.train_map` does for one start."""
    net = four_modes_net()
    x, y = data.x_train, data.y_train
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(num_restarts, 3, generator=g) * 9 - 4.5
    slopes = 1.5 + 1.5 * torch.rand(num_restarts, 3, generator=g)
    heights = 0.5 + torch.rand(num_restarts, 3, generator=g)
    w = torch.cat([slopes, -slopes * centres, heights, torch.zeros(num_restarts, 1)], 1).requires_grad_()
    opt = torch.optim.Adam([w], lr=lr)
    for _ in range(num_steps):
        log_lik = torch.distributions.Normal(net(x, w)[..., 0], noise_scale).log_prob(y).sum(1)
        loss = -(log_lik - 0.5 * (w / prior_scale).square().sum(1)).sum() / len(y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    w = w.detach()
    keep = bumps_fitted(net, w).sum(1) >= 3
    if keep.sum() < 2:
        raise RuntimeError(f"only {int(keep.sum())} of {num_restarts} restarts fit three bumps: raise num_restarts")
    return canonical_rbf_units(net, w[keep])


@dataclass
class FourModesResult:
    """Output of :func:`four_modes_experiment`: the census ``table`` (one row per fit), the weight
    samples per fit, the decoded prior draws per Proj-BNN fit, the candidates and the data."""

    table: pd.DataFrame
    samples: dict[str, Tensor]
    prior_draws: dict[str, Tensor]
    candidates: Tensor
    data: Dataset
    seconds: dict[str, float] = field(default_factory=dict)


def four_modes_census(
    samples: dict[str, Tensor], data: Dataset, prior_draws: dict[str, Tensor] | None = None
) -> pd.DataFrame:
    """One row per weight sample (name -> ``(S, 10)``): ``fits_three`` (share fitting three
    bumps), ``modes`` (missed bumps holding >= 10% of those), ``miss <c>`` (the share of those
    missing bump ``c``), ``test_ll`` (eq. 7, noise 0.1); with ``prior_draws`` (name -> decoded
    prior draws) also ``prior_fits_three`` and ``prior_modes``."""
    net = four_modes_net()
    bnn = BNN(net, prior_scale=1.0, noise_scale=0.1)
    rows = {}
    for name, w in samples.items():
        m = missed_bump_modes(net, w)
        n3 = max(1, round(m["fits_three"] * len(w)))
        row = {"prior_fits_three": float("nan"), "prior_modes": float("nan")}
        if prior_draws is not None and name in prior_draws:
            prior = missed_bump_modes(net, prior_draws[name])
            row = {"prior_fits_three": prior["fits_three"], "prior_modes": prior["modes"]}
        row.update(fits_three=m["fits_three"], modes=m["modes"])
        row.update({f"miss {c:+.0f}": m["counts"].get(c, 0) / n3 for c in FOUR_MODE_CENTRES})
        row["test_ll"] = float(evaluate(bnn, {"w": w}, data.x_test, data.y_test)["test_ll"])
        rows[name] = row
    table = pd.DataFrame(rows).T
    table.index.name = "fit"
    return table


def four_modes_experiment(
    *,
    objectives: Sequence[str] = ("autoencoder", "vae", "mmd"),
    variants: Sequence[str] = ("qz-only", "full"),
    betas: dict[str, float] | None = None,
    num_restarts: int = 200,
    map_steps: int = 1500,
    decoder_steps: int = 2000,
    vi_steps: int = 2000,
    num_particles: int = 20,
    num_samples: int = 1000,
    seed: int = 0,
    progress: bool = False,
) -> FourModesResult:
    """The Fig. 2 experiment (module docstring). ``betas`` overrides
    :data:`~pyro_bnnlv.infer.projection.decoder.DEFAULT_BETA` per objective."""
    betas = {**DEFAULT_BETA, **(betas or {})}
    data = load_dataset("four-modes")
    x, y = data.x_train, data.y_train
    net = four_modes_net()
    bnn = BNN(net, prior_scale=1.0, noise_scale=0.1)
    seconds = {}
    t0 = time.perf_counter()
    candidates = four_modes_candidates(data, num_restarts=num_restarts, num_steps=map_steps, seed=seed)
    seconds["candidates"] = time.perf_counter() - t0
    samples, prior_draws = {"candidates": candidates}, {}
    t0 = time.perf_counter()
    with pyro.get_param_store().scope():
        with torch.no_grad():
            log_lik = torch.distributions.Normal(net(x, candidates)[..., 0], 0.1).log_prob(y).sum(1)
        guide = AutoNormal(bnn, init_scale=0.01, init_loc_fn=init_to_network(bnn, weights=candidates[log_lik.argmax()]))
        fit_svi(bnn, guide, x, y, num_steps=vi_steps, lr=0.01, seed=seed, progress=progress)
        samples["MFVI on w"] = sample_posterior(bnn, guide, x, num_samples=num_samples, seed=seed)["w"]
    seconds["MFVI on w"] = time.perf_counter() - t0
    z_prior = torch.randn(2000, 2, generator=torch.Generator().manual_seed(seed))
    for objective in objectives:
        t0 = time.perf_counter()
        model = ProjectedBNN(net, latent_dim=2, decoder_hidden=[20], latent_scale=1.0, noise_scale=0.1)
        projection = fit_projection(
            model,
            candidates,
            x,
            y,
            objective=objective,
            beta=betas[objective],
            num_steps=decoder_steps,
            lr=0.01,
            input_noise=0.1,
            seed=seed,
            progress=progress,
        )
        with torch.no_grad():
            decoded = model.project(z_prior * model.latent_scale, projection.phi)
        decoder_seconds = time.perf_counter() - t0
        for variant in variants:  # stage 3 on the one decoder (the same as fit_projected_bnn's own stage 2)
            name = f"Proj-BNN {objective}, {'q(z)' if variant == 'qz-only' else 'q(z) q(phi)'}"
            t0 = time.perf_counter()
            model = ProjectedBNN(net, latent_dim=2, decoder_hidden=[20], latent_scale=1.0, noise_scale=0.1)
            fit = fit_projected_bnn(
                model,
                x,
                y,
                variant=variant,
                projection=projection,
                num_steps=vi_steps,
                lr=0.01,
                num_particles=num_particles,
                seed=seed,
                progress=progress,
            )
            samples[name] = sample_posterior(fit.model, fit.guide, x, num_samples=num_samples, seed=seed)["w"]
            prior_draws[name] = decoded
            seconds[name] = decoder_seconds + time.perf_counter() - t0
    table = four_modes_census(samples, data, prior_draws)
    return FourModesResult(table, samples, prior_draws, candidates, data, seconds)


#: the fits :func:`plot_four_modes` shows by default
FIGURE_FITS = (
    "candidates",
    "MFVI on w",
    "Proj-BNN autoencoder, q(z) q(phi)",
    "Proj-BNN mmd, q(z)",
    "Proj-BNN mmd, q(z) q(phi)",
)


def _mode_colours(net, w: Tensor) -> list:
    ok = bumps_fitted(net, w)
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    return [palette[int((~r).nonzero()[0])] if int(r.sum()) == 3 else "0.7" for r in ok]


def plot_four_modes(
    result: FourModesResult, path: str | Path | None = None, fits: Sequence[str] | None = None, *, axes: Any = None
) -> Any:
    """Fig. 2 of the paper: per fit (default :data:`FIGURE_FITS`, those present), the weight samples
    (units in canonical order) on the candidates' first two principal components, coloured by the
    bump they miss (grey: fit fewer than three), and the posterior predictive with the data.

    Returns the figure; writes the PNG ``path`` when given. ``axes``: a ``(2, len(fits))`` array of
    matplotlib axes to draw into (default: a new figure)."""
    import matplotlib.pyplot as plt

    net = four_modes_net()
    names = [k for k in (fits or FIGURE_FITS) if k in result.samples]
    mean = result.candidates.mean(0)
    _, _, V = torch.linalg.svd(result.candidates - mean, full_matrices=False)
    grid = torch.linspace(-5, 5, 300)[:, None]
    x, y = result.data.x_train, result.data.y_train
    pc_c = (result.candidates - mean) @ V[:2].T
    owned = axes is None
    if owned:
        fig, axes = plt.subplots(2, len(names), figsize=(3.4 * len(names), 6.2), squeeze=False)
    else:
        axes = np.asarray(axes, dtype=object).reshape(2, -1)
        if axes.shape[1] != len(names):
            raise ValueError(f"axes must be 2 x {len(names)} (one column per fit {names}), got 2 x {axes.shape[1]}")
        fig = axes[0, 0].figure
    for j, name in enumerate(names):
        w = canonical_rbf_units(net, result.samples[name])
        pc = (w - mean) @ V[:2].T
        ax = axes[0, j]
        ax.scatter(pc[:, 0], pc[:, 1], s=4, alpha=0.3, c=_mode_colours(net, w))
        ax.scatter(pc_c[:, 0], pc_c[:, 1], s=40, c=_mode_colours(net, result.candidates), marker="x")
        row = result.table.loc[name]
        ax.set_title(f"{name}\nfit 3 bumps {row['fits_three']:.0%}, modes {int(row['modes'])}", fontsize=8)
        ax.set_xlabel("PC 1 of the candidates (x)", fontsize=7)
        with torch.no_grad():
            f = net(grid, result.samples[name])[..., 0]
        ax = axes[1, j]
        ax.scatter(x[:, 0], y, s=2, c="k")
        ax.fill_between(grid[:, 0], f.quantile(0.025, 0), f.quantile(0.975, 0), alpha=0.3)
        ax.plot(grid[:, 0], f.mean(0))
        ax.set_title(f"predictive, test LL {row['test_ll']:.2f}", fontsize=8)
        ax.set_ylim(-0.6, 1.6)
    handles = [
        plt.Line2D([], [], ls="", marker="o", c=c, label=f"misses x = {m:+.0f}")
        for c, m in zip(["tab:blue", "tab:orange", "tab:green", "tab:red"], FOUR_MODE_CENTRES)
    ]
    handles.append(plt.Line2D([], [], ls="", marker="o", c="0.7", label="fits < 3 bumps"))
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8)
    if owned:
        fig.tight_layout(rect=(0, 0.04, 1, 1))
    if path is not None:
        fig.savefig(path, dpi=80)
        if owned:
            plt.close(fig)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pyro_bnnlv.reproduce.projected_toy", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--objectives", nargs="*", default=["autoencoder", "vae", "mmd"])
    p.add_argument("--variants", nargs="*", default=["qz-only", "full"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--small", action="store_true", help="a smoke-test size (meaningless numbers)")
    p.add_argument("--figure", help="PNG path for the Fig. 2 panels")
    p.add_argument("--output", help="CSV path")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    kw = dict(num_restarts=40, map_steps=300, decoder_steps=100, vi_steps=100, num_samples=100) if args.small else {}
    result = four_modes_experiment(objectives=args.objectives, variants=args.variants, seed=args.seed, **kw)
    print(result.table.to_string(float_format="%.3f"))
    print("seconds:", {k: round(v) for k, v in result.seconds.items()})
    if args.output:
        result.table.to_csv(args.output)
    if args.figure:
        plot_four_modes(result, args.figure)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


# --------------------------------------------------------------------------- results tables


def four_modes_table(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """The four-mode toy's census (``pyro-bnnlv reproduce proj-four-modes --output CSV``), one CSV
    per seed: each cell lists the seeds' values in the order given ("a / b / c"); the
    missed-bump shares are the first seed's. Bold: a fit whose samples cover at least two modes
    in every seed."""
    missing = [p for f, p in zip(frames, paths) if "modes" not in f.columns or "fit" not in f.columns]
    if missing:
        raise ValueError(f"{missing} are not proj-four-modes censuses (columns fit, modes, ...)")
    censuses = [f.set_index("fit") for f in frames]

    def cell(fit: str, column: str, decimals: int) -> str:
        values = [t.loc[fit, column] if fit in t.index else float("nan") for t in censuses]
        texts = [tables.num(v, decimals) for v in values]
        return "" if not any(texts) else " / ".join(t or "-" for t in texts)

    shares = [c for c in censuses[0].columns if c.startswith("miss ")]
    rows = []
    for fit in censuses[0].index:
        covers = all(fit in t.index and t.loc[fit, "modes"] >= 2 for t in censuses)
        share = "/".join(tables.share(censuses[0].loc[fit, c]) for c in shares)
        rows.append(
            [
                tables.bold(str(fit), covers and fit != "candidates"),
                cell(fit, "prior_fits_three", 2),
                cell(fit, "prior_modes", 0),
                cell(fit, "fits_three", 2),
                cell(fit, "modes", 0),
                share,
                cell(fit, "test_ll", 2),
            ]
        )
    header = [
        "fit",
        "prior draws fitting 3",
        "prior modes",
        "samples fitting 3",
        "modes",
        "missed-bump shares (" + " / ".join(s.removeprefix("miss ") for s in shares) + "; first seed)",
        "test LL",
    ]
    return tables.table(header, rows)
