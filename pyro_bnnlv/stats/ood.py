r"""Epistemic uncertainty per input and out-of-distribution (OOD) detection.

Reference: Pequignot et al. (2020), "Implicit variational inference: the parameter and the
predictor space", sec. 4 ("Epistemic Uncertainty", Fig. 2-3): for each input ``x`` draw ``S``
predictions ``f(x; w_s)`` with ``w_s ~ q`` (no observation noise) and estimate the entropy of
this 1-D distribution with the k-NN estimator (eq. 5 with ``d = 1``). A posterior whose epistemic
entropy is higher on OOD inputs than on test inputs can flag them; the AUROC of separating OOD
inputs from test inputs by that entropy measures how well.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from ..posterior import as_sample_dict
from .latent import knn_entropy_1d
from .._figures import finish_figure, new_axes, panel_axes
from ..protocols import LatentModel, RegressionModel

__all__ = ["auroc", "epistemic_entropy", "ood_report", "plot_epistemic_histograms", "plot_ood_comparison"]


@torch.no_grad()
def epistemic_entropy(model: RegressionModel, samples: Any, x: Tensor, k: int = 5) -> Tensor:
    """k-NN entropy (nats) of the predictive ``f(x_n; w)``, ``w ~`` posterior, per input: ``(N,)``.

    ``samples``: ``{"w": (S, P)}``, an ``(S, P)`` tensor or an ``MCMC`` object; ``model.f`` must
    exist and the network must have one output. For a BNN+LV, whose predictive spread mixes
    weight uncertainty with the latent inputs' (aleatoric) noise, use
    :func:`~pyro_bnnlv.stats.uncertainty_decomposition` instead.
    """
    w = as_sample_dict(samples)["w"]
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a (N, D) tensor, got {getattr(x, 'shape', type(x))}")
    if isinstance(model, LatentModel):
        raise ValueError(
            "epistemic_entropy is for models without latent inputs; for BNN+LV use "
            "pyro_bnnlv.stats.uncertainty_decomposition (eq. 6-7 of the NCAI paper)"
        )
    f = model.f(x, w)
    if f.shape[-1] != 1:
        raise ValueError("epistemic_entropy needs a single-output network")
    return knn_entropy_1d(f[..., 0].T.contiguous(), k=k)


def auroc(negatives: Tensor, positives: Tensor) -> float:
    """Area under the ROC curve of the score separating ``positives`` from ``negatives``.

    Equals ``P(score_pos > score_neg) + P(tie)/2`` (the Mann-Whitney statistic over all pairs),
    computed from average ranks. 0.5 is chance, 1 perfect separation (positives score higher).
    """
    neg, pos = torch.as_tensor(negatives).double().reshape(-1), torch.as_tensor(positives).double().reshape(-1)
    if neg.numel() == 0 or pos.numel() == 0:
        raise ValueError("auroc needs at least one negative and one positive score")
    if not (torch.isfinite(neg).all() and torch.isfinite(pos).all()):
        raise ValueError("scores contain NaN or infinite values")
    both = torch.cat([neg, pos])
    ranks = torch.tensor(pd.Series(both.numpy()).rank(method="average").to_numpy())
    n_pos, n_neg = pos.numel(), neg.numel()
    u = ranks[n_neg:].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


def _is_method_mapping(samples: Any) -> bool:
    """``{method name: samples}`` rather than one posterior's ``{"w": ...}``."""
    return isinstance(samples, Mapping) and "w" not in samples and len(samples) > 0


def ood_report(
    model: RegressionModel,
    samples: Any,
    x_train: Tensor,
    x_test: Tensor,
    x_ood: Tensor,
    *,
    k: int = 5,
    figure: str | Path | None = None,
    title: str = "",
) -> pd.DataFrame:
    """Epistemic entropy on training, test and OOD inputs, and the OOD-vs-test AUROC.

    The three input sets must be on the scale the model was trained on: OOD inputs standardised
    with the training statistics (``(x_raw - data.x_mean) / data.x_std``, as
    ``data.extras["x_ood"]`` already is), or they look far out of distribution whatever the
    posterior.

    Returns a DataFrame indexed by ``split`` (``train``, ``test``, ``ood``) with columns ``n``,
    ``mean``, ``median``, ``q10``, ``q90`` of the per-input epistemic entropy and ``auroc``
    (on the ``ood`` row: separating OOD from test inputs by entropy; NaN elsewhere). The
    per-input entropies are in ``frame.attrs["entropy"]`` (``{split: numpy array}``). With
    ``figure``, writes histograms like the paper's Fig. 2-3 there.

    Several methods at once: ``samples`` as ``{method name: samples}`` (same model); the frame is
    then indexed by ``(method, split)`` and ``figure`` has one panel per method on shared axes
    (:func:`plot_ood_comparison`).
    """
    if _is_method_mapping(samples):
        reports = {name: ood_report(model, s, x_train, x_test, x_ood, k=k) for name, s in samples.items()}
        bare = {name: r.copy() for name, r in reports.items()}
        for r in bare.values():
            r.attrs = {}  # pandas compares attrs when concatenating; the arrays are kept below
        frame = pd.concat(bare, names=["method"])
        frame.attrs["entropy"] = {name: r.attrs["entropy"] for name, r in reports.items()}
        if figure is not None:
            plot_ood_comparison(reports, figure, title=title)
        return frame
    entropies = {
        name: epistemic_entropy(model, samples, x, k=k)
        for name, x in (("train", x_train), ("test", x_test), ("ood", x_ood))
    }
    rows = []
    for name, h in entropies.items():
        rows.append(
            {
                "split": name,
                "n": h.numel(),
                "mean": float(h.mean()),
                "median": float(h.median()),
                "q10": float(h.quantile(0.1)),
                "q90": float(h.quantile(0.9)),
                "auroc": auroc(entropies["test"], h) if name == "ood" else float("nan"),
            }
        )
    frame = pd.DataFrame(rows).set_index("split")
    frame.attrs["entropy"] = {k_: v.numpy() for k_, v in entropies.items()}
    if figure is not None:
        plot_epistemic_histograms(entropies, figure, title=title, auroc_value=float(frame.loc["ood", "auroc"]))
    return frame


def _bins(groups: list[dict[str, Any]], num: int = 40) -> Any:
    import numpy as np

    values = [np.asarray(v, dtype=float) for g in groups for v in g.values()]
    return np.linspace(min(v.min() for v in values), max(v.max() for v in values), num)


def plot_epistemic_histograms(
    entropies: dict[str, Any],
    path: str | Path | None = None,
    title: str = "",
    auroc_value: float | None = None,
    *,
    ax: Any = None,
    bins: Any = None,
) -> Any:
    """Histograms of per-input epistemic entropy, one colour per split (Fig. 2-3).

    ``entropies``: ``{split: per-input entropies}`` (e.g. ``ood_report(...).attrs["entropy"]``).
    Draws into ``ax`` when given; ``bins`` (edges) default to 40 over the range of all values.
    Returns the figure; with ``path`` it is also written there.
    """
    import numpy as np

    owned = ax is None
    fig, ax = new_axes(ax, figsize=(6, 3.5))
    values = {k: np.asarray(v, dtype=float) for k, v in entropies.items()}
    bins = _bins([values]) if bins is None else bins
    for name, v in values.items():
        ax.hist(v, bins=bins, alpha=0.5, density=True, label=f"{name} (n={len(v)})")
    ax.set_xlabel("epistemic entropy of f(x) (nats)")
    ax.set_ylabel("density")
    extra = f"  AUROC(ood vs test) = {auroc_value:.3f}" if auroc_value is not None else ""
    ax.set_title((title + extra).strip(), fontsize=9)
    ax.legend(fontsize=8)
    return finish_figure(fig, path, owned, dpi=110)


def plot_ood_comparison(
    reports: Mapping[str, pd.DataFrame], path: str | Path | None = None, *, title: str = "", axes: Any = None
) -> Any:
    """One panel per method, shared x and y axes and the same bins: the epistemic-entropy
    histograms of :func:`ood_report` frames ``{method name: frame}``, each titled with its AUROC.
    ``axes``: one matplotlib axes per method to draw into. Returns the figure; with ``path`` it
    is also written there."""
    if not reports:
        raise ValueError("reports is empty: pass {method name: ood_report(...)}")
    owned = axes is None
    fig, axes = panel_axes(axes, len(reports), "methods", 4.2)
    bins = _bins([r.attrs["entropy"] for r in reports.values()])
    for ax, (name, frame) in zip(axes, reports.items()):
        plot_epistemic_histograms(
            frame.attrs["entropy"], title=name, ax=ax, bins=bins, auroc_value=float(frame.loc["ood", "auroc"])
        )
    for ax in axes[1:]:
        ax.set_ylabel("")
    if title:
        fig.suptitle(title, fontsize=10)
    return finish_figure(fig, path, owned, dpi=110)
