"""Metrics of BNN+LV fits (Yacoby, Pan & Doshi-Velez 2022, arXiv:1911.00569, sec. 3, App. E,
App. F.2).

* :func:`latent_means`: the guide's variational means ``mu_z`` of the training latents;
* :func:`latent_diagnostics`: satisfaction of the modelling assumptions, KSG mutual information
  ``I(x; mu_z)`` (k = 5), Henze-Zirkler statistic of ``mu_z`` and, for 1-D latents, the
  two-sample Kolmogorov-Smirnov statistic between ``mu_z`` and prior samples;
* :func:`reconstruction_mse` (eq. 33) and :func:`predictive_mse` (eq. 35);
* :func:`uncertainty_decomposition` (eq. 6-7): total, aleatoric and epistemic entropy of the
  predictive per test input, with a k-nearest-neighbour entropy estimator (k = 5, App. E), and
  :func:`plot_uncertainty_decomposition` (Fig. 6).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pyro
import torch
from scipy.special import digamma
from torch import Tensor

from ..posterior import as_sample_dict, guide_site_mean
from .._state import isolated_param_store
from .dependence import henze_zirkler, ks_statistic, ksg_mutual_information
from .._figures import finish_figure, panel_axes
from ..protocols import LatentModel, RegressionModel

__all__ = [
    "knn_entropy_1d",
    "latent_diagnostics",
    "latent_means",
    "plot_uncertainty_decomposition",
    "predictive_mse",
    "reconstruction_mse",
    "uncertainty_decomposition",
]


@torch.no_grad()
def latent_means(guide: Any, x: Tensor, y: Tensor, site: str = "z") -> Tensor:
    """Variational means of the latent site for all training points, ``(N, K)``.

    Read from the guide's variational distribution (:func:`guide_site_mean`), not from samples.
    """
    with isolated_param_store(guide):
        trace = pyro.poutine.trace(guide).get_trace(x, y)
    return guide_site_mean(trace, site).detach().reshape(x.shape[0], -1)


def latent_diagnostics(
    model: LatentModel, guide: Any, x: Tensor, y: Tensor | None = None, *, k: int = 5, seed: int = 0
) -> pd.Series:
    """How well a BNN+LV fit's latent means ``mu_z`` meet the model's assumptions (App. F.2).

    Call as ``latent_diagnostics(model, guide, x_train, y_train)`` (the model first: it supplies
    the prior scale of ``z``). Returns ``mi_x_z`` (KSG estimate of ``I(x; mu_z)``, ``k``
    neighbours; 0 when the latents are independent of the inputs, as assumed), ``hz_z``
    (Henze-Zirkler statistic of ``mu_z``; small when they look Gaussian) and, for K = 1, ``ks_z``
    (two-sample KS statistic of ``mu_z`` against as many prior samples, seeded by ``seed``).
    """
    if isinstance(guide, Tensor) or not isinstance(model, LatentModel):
        raise TypeError(
            "latent_diagnostics(model, guide, x, y): pass the BNN+LV model first, then its guide "
            f"and the training data; got a {type(model).__name__} and a {type(guide).__name__}"
        )
    if y is None:
        raise TypeError("latent_diagnostics(model, guide, x, y) needs the training targets y")
    mu = latent_means(guide, x, y)
    out = {
        "mi_x_z": ksg_mutual_information(x.double().numpy(), mu.double().numpy(), k=k),
        "hz_z": float(henze_zirkler(mu.double())),
    }
    if mu.shape[1] == 1:
        gen = torch.Generator().manual_seed(seed)
        prior = torch.randn(mu.shape[0], generator=gen) * float(model.latent_scale)
        out["ks_z"] = ks_statistic(mu[:, 0].numpy(), prior.numpy())
    return pd.Series(out)


@torch.no_grad()
def reconstruction_mse(model: LatentModel, samples: dict[str, Tensor], x: Tensor, y: Tensor) -> float:
    """Eq. 33: ``mean_n E_{q(z_n) q(w)} ||y_n - f([x_n, z_n]; w)||^2`` over posterior samples
    ``{"w": (S, P), "z": (S, N, K)}`` of the training points."""
    f = model.reconstruction_components(x, samples)  # (S, N, L)
    return (y.reshape(1, x.shape[0], -1) - f).square().sum(-1).mean().item()


@torch.no_grad()
def predictive_mse(model: RegressionModel, samples: Any, x: Tensor, y: Tensor, seed: int = 0) -> float:
    """Eq. 35: ``mean_n ||y_n - E_{p(z) q(w)} f([x_n, z]; w)||^2`` (latents from the prior)."""
    gen = torch.Generator().manual_seed(seed)
    loc, _ = model.predictive_components(x, as_sample_dict(samples), generator=gen)
    return (y.reshape(x.shape[0], -1) - loc.mean(0)).square().sum(-1).mean().item()


def knn_entropy_1d(samples: Tensor, k: int = 5) -> Tensor:
    """Kozachenko-Leonenko entropy of many 1-D sample sets at once: ``(B, n)`` -> ``(B,)``.

    ``H = psi(n) - psi(k) + log 2 + mean_i log rho_k(i)`` (``log 2`` is the log-volume of the
    unit ball in 1-D), the same estimator as :func:`pyro_bnnlv.stats.knn_entropy` for ``d = 1``,
    batched over sample sets. In 1-D the ``k`` nearest neighbours of a point lie among the ``k``
    sorted values on either side of it, so the distances come from a sort and a ``(B, n, 2k+1)``
    window instead of ``n x n`` matrices: memory is linear in ``n``. Ties give distance 0,
    floored at the dtype's ``tiny`` as in :mod:`pyro_bnnlv.stats.knn`.
    """
    if samples.dim() != 2:
        raise ValueError(f"samples must have shape (B, n), got {tuple(samples.shape)}")
    B, n = samples.shape
    if not 0 < k < n:
        raise ValueError(f"k must lie in [1, n), got k={k}, n={n}")
    s = samples.sort(-1).values
    pad = s.new_full((B, k), math.inf)
    windows = torch.cat([pad, s, pad], -1).unfold(-1, 2 * k + 1, 1)  # (B, n, 2k+1), centre k
    d = (windows - s.unsqueeze(-1)).abs()
    d[..., k] = math.inf  # not its own neighbour
    rho = d.topk(k, dim=-1, largest=False).values[..., -1]
    tiny = torch.finfo(s.dtype).tiny
    return rho.clamp_min(tiny).log().mean(-1) + float(digamma(n) - digamma(k)) + math.log(2.0)


@torch.no_grad()
def uncertainty_decomposition(
    model: RegressionModel, samples: Any, x: Tensor, *, num_inner: int = 200, k: int = 5, seed: int = 0
) -> pd.DataFrame:
    """Total, aleatoric and epistemic predictive entropy per input (eq. 6-7, App. E).

    For each of ``S`` weight samples, ``num_inner`` draws of ``(z, eps)`` from the prior and the
    noise give ``y ~ p(y | w, x)``; the aleatoric entropy is the average over weights of the
    per-weight k-NN entropy, the total entropy the k-NN entropy of all ``S * num_inner`` draws,
    and the epistemic entropy their difference. Single-output models only.
    """
    samples = as_sample_dict(samples)
    w = samples["w"]
    S, N = w.shape[0], x.shape[0]
    gen = torch.Generator().manual_seed(seed)
    w_rep = w.repeat_interleave(num_inner, 0)  # (S * M, P)
    loc, scale = model.predictive_components(x, {"w": w_rep}, generator=gen)
    if loc.shape[-1] != 1:
        raise ValueError("uncertainty_decomposition supports single-output models")
    y = loc[..., 0] + scale * torch.randn(loc.shape[:-1], generator=gen, dtype=loc.dtype)
    y = y.reshape(S, num_inner, N)  # (S, M, N)
    aleatoric = knn_entropy_1d(y.permute(2, 0, 1).reshape(N * S, num_inner), k).view(N, S).mean(1)
    total = knn_entropy_1d(y.permute(2, 0, 1).reshape(N, S * num_inner), k)
    frame = pd.DataFrame({"total": total.numpy(), "aleatoric": aleatoric.numpy()})
    frame["epistemic"] = frame["total"] - frame["aleatoric"]
    for d in range(x.shape[1]):
        frame.insert(d, f"x{d}" if x.shape[1] > 1 else "x", x[:, d].numpy())
    return frame


def plot_uncertainty_decomposition(
    frames: dict[str, pd.DataFrame], path: str | Path | None = None, *, data: Any = None, axes: Any = None
) -> Any:
    """Fig. 6: total / aleatoric / epistemic entropy against ``x``, one panel per method
    (shared axes), from :func:`uncertainty_decomposition` frames of 1-D inputs.

    With ``data`` (the :class:`~pyro_bnnlv.datasets.Dataset` the model was fitted to) ``x`` is
    drawn on the original scale (``x * x_std + x_mean``), as
    :func:`~pyro_bnnlv.plotting.plot_predictive_1d` draws it, and the entropies are those of
    ``y`` on its original scale: ``H(a Y + b) = H(Y) + log a`` adds ``log y_std`` to the total and
    aleatoric entropies; the epistemic part, their difference, is unchanged. Without ``data``
    everything is on the scale the model saw. ``axes``: one matplotlib axes per method to draw
    into. Returns the figure; with ``path`` it is also written there.
    """
    if not frames:
        raise ValueError("frames is empty: pass {method name: uncertainty_decomposition(...)}")
    for name, frame in frames.items():
        if "x" not in frame:
            raise ValueError(f"frame {name!r} has no 'x' column: the plot needs 1-D inputs")
    sx, mx, shift = 1.0, 0.0, 0.0
    if data is not None:
        sx, mx = float(data.x_std.reshape(-1)[0]), float(data.x_mean.reshape(-1)[0])
        shift = math.log(float(data.y_std))
    owned = axes is None
    fig, axes = panel_axes(axes, len(frames), "frames", 4.5)
    for ax, (name, frame) in zip(axes, frames.items()):
        frame = frame.sort_values("x")
        xo = frame["x"] * sx + mx
        for col in ("total", "aleatoric", "epistemic"):
            ax.plot(xo, frame[col] + (shift if col != "epistemic" else 0.0), label=col)
        ax.set_title(name)
        ax.set_xlabel("x" if data is not None else "x (as the model saw it)")
    axes[0].set_ylabel("entropy of y (nats)")
    axes[0].legend(fontsize=8)
    return finish_figure(fig, path, owned, dpi=110)
