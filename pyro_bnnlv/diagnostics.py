r"""ArviZ export and function-space convergence diagnostics.

* :func:`to_inference_data` turns an ``MCMC`` run, a fitted guide (or several restarts, as
  chains) or posterior samples into an ``arviz.InferenceData`` with named dimensions:
  ``posterior`` (``w``, ``z`` where the model has it, and ``f`` at the observed inputs),
  ``posterior_predictive`` (``obs``), ``log_likelihood`` (``obs``, pointwise, so ``az.loo`` and
  ``az.waic`` work), ``observed_data``, ``constant_data`` (``x``) and, for MCMC runs of
  :func:`~pyro_bnnlv.infer.mcmc.nuts.run_nuts`, ``sample_stats`` (``diverging``, ``n_steps``, ``lp``,
  ``acceptance_rate``, ``tree_depth``).
* :func:`posterior_summary` reports R-hat and ESS on function values and on the
  log-likelihood beside those of the raw weights.
* :func:`compare_posteriors` (a statistic, in :mod:`pyro_bnnlv.stats.posterior_kl`; re-exported
  here) estimates ``KL`` in both directions between an approximation and a reference.

Why R-hat and ESS on raw weights mislead
----------------------------------------
The likelihood of a BNN is invariant under permutations of hidden units, sign flips of a
tanh unit's incoming and outgoing weights, and (for ReLU) rescalings between layers. The
posterior therefore has many symmetric copies of every mode. Two chains in two copies describe
*the same* distribution over functions but disagree on every weight, so weight R-hat is large
although nothing is wrong; conversely a chain can mix well within one copy and still be far from
the full posterior, which weight diagnostics cannot see either. Quantities invariant under the
symmetries -- the function values ``f(x)`` at chosen inputs, the log-likelihood, the log joint --
are what the posterior predictive depends on, and their R-hat/ESS are the ones to read.
:func:`posterior_summary` reports them first and keeps the weight diagnostics (median and worst
over all weights) for reference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyro
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from .posterior import Posterior, posterior_kind
from .infer.svi import set_seed
from ._figures import finish_figure
from .stats.posterior_kl import compare_posteriors

__all__ = [
    "to_inference_data",
    "posterior_summary",
    "plot_trace",
    "compare_posteriors",
    "weight_labels",
]


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
def weight_labels(net: Any) -> list[str]:
    """Readable names of the entries of the flat weight vector of an ``MLP``:
    ``"l0.W[3,0]"`` (layer 0, weight from input 0 to unit 3), ``"l0.b[3]"``; integers otherwise."""
    layers = getattr(net, "layers", None)
    if layers is None:
        return [str(i) for i in range(net.num_weights)]
    names: list[str] = []
    for li, (fan_in, fan_out, _, _) in enumerate(layers):
        names += [f"l{li}.W[{o},{i}]" for o in range(fan_out) for i in range(fan_in)]
        names += [f"l{li}.b[{o}]" for o in range(fan_out)]
    return names


def _model_sites(model: Any, x: Tensor, y: Tensor | None, obs_site: str) -> tuple[dict, int]:
    """Latent sites ``{name: (value shape, batch ndim)}`` and the model's max plate nesting.

    Deterministic sites (``pyro.deterministic``, e.g. the ``"w"`` of a projected BNN) count as
    latent: they are exported and conditioned on like sampled ones."""
    with torch.no_grad(), poutine.block():
        tr = poutine.trace(model).get_trace(x, y)
    if obs_site not in tr.nodes:
        raise ValueError(f"the model has no observation site {obs_site!r}")
    latent, nesting = {}, 0
    for name, site in tr.nodes.items():
        if site["type"] != "sample" or site_is_subsample(site):
            continue
        nesting = max(nesting, *(-f.dim for f in site["cond_indep_stack"] if f.vectorized), 0)
        if not site["is_observed"] or site["infer"].get("_deterministic", False):
            latent[name] = (tuple(site["value"].shape), len(site["fn"].batch_shape))
    return latent, nesting


def _posterior_chains(
    model: Any, posterior: Any, x: Tensor, y: Tensor | None, latent: dict, num_samples: int,
    seed: int | None,
) -> tuple[dict[str, Tensor], dict[str, np.ndarray]]:  # fmt: skip
    """Draws as ``{site: (C, S, *shape)}`` (:meth:`Posterior.from_any`) and an MCMC run's
    sample statistics ``{name: (C, S)}``."""
    shapes = {name: shape for name, (shape, _) in latent.items()}
    draws = Posterior.from_any(posterior, model, x, y, shapes=shapes, num_samples=num_samples, seed=seed).draws
    stats = _mcmc_stats(posterior, draws["w"].shape[1]) if posterior_kind(posterior) == "mcmc" else {}
    return draws, stats


def _mcmc_stats(mcmc: Any, num_draws: int) -> dict[str, np.ndarray]:
    recs = getattr(mcmc, "_diagnostics", None)
    if not recs or any(r is None for r in recs):
        return {}
    C = len(recs)
    stats: dict[str, np.ndarray] = {}
    diverging = np.zeros((C, num_draws), dtype=bool)
    for c, rec in enumerate(recs):
        for i in rec.get("divergences", []):
            if 0 <= i < num_draws:
                diverging[c, i] = True
    stats["diverging"] = diverging
    renames = (("num_steps", "n_steps", 1), ("potential_energy", "lp", -1),
               ("accept_prob", "acceptance_rate", 1), ("tree_depth", "tree_depth", 1))  # fmt: skip
    for src, dst, sign in renames:
        vals = [rec.get(src) for rec in recs]
        if all(v is not None and len(v) == num_draws for v in vals):
            arr = sign * np.asarray(vals, dtype=float)
            if not np.all(np.isnan(arr)) and not (dst == "tree_depth" and np.all(arr == 0)):
                stats[dst] = arr
    return stats


def _replay(
    model: Any, x: Tensor, y: Tensor, draws: dict[str, Tensor], latent: dict, nesting: int,
    obs_site: str, chunk_size: int,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Vectorised replay of the model conditioned on ``M`` flat draws: the observation
    distribution's mean ``(M, N[, L])``, pointwise log-likelihood ``(M, N)`` and a posterior
    predictive sample ``(M, N[, L])``."""
    M = next(iter(draws.values())).shape[0]
    means, lls, preds = [], [], []
    for start in range(0, M, chunk_size):
        stop = min(M, start + chunk_size)
        m = stop - start
        data = {}
        for name, v in draws.items():
            shape, batch_ndim = latent[name]
            data[name] = v[start:stop].reshape(m, *([1] * (nesting - batch_ndim)), *shape)
        with torch.no_grad(), poutine.block():
            with pyro.plate("_draws", m, dim=-(nesting + 1)):
                tr = poutine.trace(poutine.condition(model, data=data)).get_trace(x, y)
        fn = tr.nodes[obs_site]["fn"]
        lp = fn.log_prob(y)
        means.append(fn.mean.expand(*lp.shape, *fn.event_shape))
        lls.append(lp)
        preds.append(fn.sample())
    return torch.cat(means), torch.cat(lls), torch.cat(preds)


def _np(t: Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy()


# ----------------------------------------------------------------------------------------------
# to_inference_data
# ----------------------------------------------------------------------------------------------
def to_inference_data(
    model: Any,
    posterior: Any,
    x: Tensor,
    y: Tensor,
    *,
    num_samples: int = 1000,
    x_eval: Tensor | None = None,
    obs_site: str = "obs",
    seed: int | None = None,
    chunk_size: int = 500,
) -> Any:
    """An ``arviz.InferenceData`` of a posterior of ``model`` given ``(x, y)``.

    Args:
        model: the Pyro model, called as ``model(x, y)``; its observation site is ``obs_site``
            in a ``"data"`` plate (the library's convention).
        posterior: an ``MCMC`` object (e.g. from :func:`~pyro_bnnlv.infer.mcmc.nuts.run_nuts`); a
            fitted guide (``num_samples`` draws, one chain); a list of guides, e.g. several
            restarts (one chain each); samples ``{"w": (S, P), "z": (S, N, K)}`` or with a
            leading chain dimension ``(C, S, ...)``; a list of such dicts (one per chain); or a
            ``(S, P)`` weight tensor.
        x, y: the data the posterior conditions on (``x (N, D)``, ``y (N,)`` or ``(N, L)``).
        num_samples: draws per guide.
        x_eval: optional extra inputs ``(E, D)``: ``f`` there is stored as ``f_eval`` (models
            exposing ``f(x, w)`` and no local latents only).
        seed: seeds guide sampling and the posterior-predictive draws.
        chunk_size: draws per vectorised model replay (bounds memory).

    Groups and dimensions:
        The per-datapoint dimension is called ``data`` (the model's plate). ``posterior``:
        ``w (chain, draw, weight)`` with MLP weight labels, ``z (chain, draw, data,
        latent_dim)`` where present, ``f (chain, draw, data[, output])`` (the mean of the
        observation distribution, i.e. ``f(x; w)`` resp. ``f([x, z]; w)``), ``f_eval (chain,
        draw, eval_point[, output])``; ``posterior_predictive``: ``obs (chain, draw, data[,
        output])``; ``log_likelihood``: ``obs (chain, draw, data)``; ``observed_data``: ``obs``;
        ``constant_data``: ``x (data, input)``, ``x_eval``; ``sample_stats`` for MCMC runs.
    """
    import arviz as az

    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        raise TypeError("x and y must be tensors")
    if hasattr(model, "check_data"):
        model.check_data(x, y)
    set_seed(seed)
    latent, nesting = _model_sites(model, x, y, obs_site)
    draws, stats = _posterior_chains(model, posterior, x, y, latent, num_samples, seed)
    C, S = draws["w"].shape[:2]
    flat = {k: v.reshape(C * S, *v.shape[2:]) for k, v in draws.items()}
    mean, ll, pred = _replay(model, x, y, flat, latent, nesting, obs_site, chunk_size)
    N = x.shape[0]
    multi = mean.dim() == 3
    obs_dims = ["data", "output"] if multi else ["data"]

    posterior_vars = {"w": _np(draws["w"]), "f": _np(mean.reshape(C, S, *mean.shape[1:]))}
    dims: dict[str, list[str]] = {"w": ["weight"], "f": obs_dims, "obs": obs_dims, "x": ["data", "input"]}
    coords: dict[str, Any] = {"data": np.arange(N), "input": np.arange(x.shape[1])}
    net = getattr(model, "net", None)
    P = draws["w"].shape[-1]
    labelled = net is not None and getattr(net, "num_weights", None) == P
    coords["weight"] = weight_labels(net) if labelled else np.arange(P)
    for name, v in draws.items():
        if name == "w":
            continue
        posterior_vars[name] = _np(v)
        if name == "z" and v.dim() == 4 and v.shape[2] == N:
            dims["z"] = ["data", "latent_dim"]
            coords["latent_dim"] = np.arange(v.shape[3])
    if multi:
        coords["output"] = np.arange(mean.shape[-1])
    constant = {"x": _np(x)}
    if x_eval is not None:
        if set(draws) != {"w"} or not hasattr(model, "f"):
            raise ValueError("x_eval needs a model with f(x, w) and no local latent sites")
        with torch.no_grad():
            fe = model.f(x_eval, flat["w"])
        fe = fe.squeeze(-1) if fe.shape[-1] == 1 else fe
        posterior_vars["f_eval"] = _np(fe.reshape(C, S, *fe.shape[1:]))
        dims["f_eval"] = ["eval_point", "output"] if fe.dim() == 3 else ["eval_point"]
        dims["x_eval"] = ["eval_point", "input"]
        # 1-D inputs: the coordinate is the input value itself (readable plot titles)
        coords["eval_point"] = (_np(x_eval[:, 0]) if x_eval.shape[1] == 1
                                else np.arange(x_eval.shape[0]))  # fmt: skip
        constant["x_eval"] = _np(x_eval)
    return az.from_dict(
        posterior=posterior_vars,
        posterior_predictive={"obs": _np(pred.reshape(C, S, *pred.shape[1:]))},
        log_likelihood={"obs": _np(ll.reshape(C, S, *ll.shape[1:]))},
        observed_data={"obs": _np(y)},
        constant_data=constant,
        sample_stats=stats or None,
        coords=coords,
        dims=dims,
    )


# ----------------------------------------------------------------------------------------------
# posterior_summary
# ----------------------------------------------------------------------------------------------
def _diag_rows(arr: np.ndarray, labels: Sequence[str], kind: str) -> list[dict]:
    """Mean, sd, bulk/tail ESS and rank-normalised R-hat of ``arr (C, S, K)`` per column."""
    import arviz as az

    ds = az.convert_to_dataset({"v": arr}, coords={"k": np.arange(arr.shape[2])}, dims={"v": ["k"]})
    ess_b = az.ess(ds, method="bulk")["v"].values
    ess_t = az.ess(ds, method="tail")["v"].values
    rhat = az.rhat(ds)["v"].values
    return [
        {"quantity": lab, "kind": kind, "mean": float(arr[..., j].mean()),
         "sd": float(arr[..., j].std()), "ess_bulk": float(ess_b[j]), "ess_tail": float(ess_t[j]),
         "r_hat": float(rhat[j])}
        for j, lab in enumerate(labels)
    ]  # fmt: skip


def _aggregate(rows: list[dict], name: str, kind: str) -> list[dict]:
    df = pd.DataFrame(rows)
    n = len(df)
    return [
        {"quantity": f"{name}: median over {n}", "kind": kind, "mean": math.nan, "sd": math.nan,
         "ess_bulk": float(df.ess_bulk.median()), "ess_tail": float(df.ess_tail.median()),
         "r_hat": float(df.r_hat.median())},
        {"quantity": f"{name}: worst of {n}", "kind": kind, "mean": math.nan, "sd": math.nan,
         "ess_bulk": float(df.ess_bulk.min()), "ess_tail": float(df.ess_tail.min()),
         "r_hat": float(df.r_hat.max())},
    ]  # fmt: skip


def _invariant_draws(
    idata: Any, f_points: Sequence[int] | None, num_points: int
) -> list[tuple[str, list[str], np.ndarray]]:
    """The symmetry-invariant quantities of :func:`posterior_summary`: ``[(kind, labels, (C, S, K))]``
    for ``f`` at chosen inputs, the total log-likelihood and (when recorded) the log joint."""
    post = idata.posterior
    C, S = post.sizes["chain"], post.sizes["draw"]
    if "f_eval" in post:
        f = post["f_eval"].values.reshape(C, S, post["f_eval"].shape[2], -1)[..., 0]
        xs = idata.constant_data["x_eval"].values
        idx = list(range(f.shape[2])) if f_points is None else list(f_points)
    else:
        f = post["f"].values.reshape(C, S, post["f"].shape[2], -1)[..., 0]
        xs = idata.constant_data["x"].values
        idx = (np.unique(np.linspace(0, f.shape[2] - 1, num_points).round().astype(int)).tolist()
               if f_points is None else list(f_points))  # fmt: skip
    labels = [
        f"f(x={xs[i, 0]:.3g})" if xs.shape[1] == 1 else f"f(x[{i}])" for i in idx
    ]
    out = [("f", labels, f[:, :, idx])]
    ll = idata.log_likelihood["obs"].values
    out.append(("log_lik", ["log_lik (sum over obs)"], ll.reshape(C, S, -1).sum(-1, keepdims=True)))
    if hasattr(idata, "sample_stats") and "lp" in idata.sample_stats:
        out.append(("log_lik", ["lp (log joint)"], idata.sample_stats["lp"].values[..., None]))
    return out


def plot_trace(
    idata: Any,
    path: str | Path | None = None,
    *,
    f_points: Sequence[int] | None = None,
    num_points: int = 3,
    axes: Any = None,
) -> Any:
    """Trace plots of the quantities worth reading: ``f`` at a few inputs, the total
    log-likelihood and the log joint ``lp`` (NUTS runs), per chain.

    One row per quantity (the same ones, chosen the same way, as :func:`posterior_summary`:
    the ``x_eval`` points, else ``num_points`` evenly spaced training inputs, or the indices
    ``f_points``); left: a histogram per chain, right: the draws per chain. Weight traces are
    left out on purpose: they are not interpretable (module docstring) and ``az.plot_trace``
    over every weight of a BNN draws a panel per weight, slowly (1,313 weights in issue 20).
    ``axes``: a ``(rows, 2)`` array of matplotlib axes to draw into. Returns the figure; with
    ``path`` it is also written there.
    """
    panels = [(lab, arr[..., j]) for _, labels, arr in _invariant_draws(idata, f_points, num_points)
              for j, lab in enumerate(labels)]  # fmt: skip
    owned = axes is None
    if owned:
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(panels), 2, figsize=(9, 1.9 * len(panels)), squeeze=False,
                                 gridspec_kw={"width_ratios": [1, 2.5]})  # fmt: skip
    else:
        axes = np.asarray(axes, dtype=object).reshape(-1, 2)
        if axes.shape[0] != len(panels):
            raise ValueError(f"axes must have shape ({len(panels)}, 2) for these quantities, "
                             f"got {axes.shape[0]} rows")  # fmt: skip
        fig = axes[0, 0].figure
    for (label, arr), (ax_h, ax_t) in zip(panels, axes):
        bins = np.linspace(arr.min(), arr.max(), 30) if arr.max() > arr.min() else 10
        for c in range(arr.shape[0]):
            ax_h.hist(arr[c], bins=bins, histtype="step", density=True, label=f"chain {c}")
            ax_t.plot(arr[c], lw=0.6, alpha=0.8)
        ax_h.set_title(label, fontsize=9, loc="left")
        ax_h.set_yticks([])
        ax_t.set_xlabel("draw")
    axes[0][0].legend(fontsize=7)
    return finish_figure(fig, path, owned, dpi=110)


def posterior_summary(
    idata: Any,
    *,
    f_points: Sequence[int] | None = None,
    num_points: int = 5,
    per_weight: bool = False,
) -> pd.DataFrame:
    """R-hat and ESS of function values and of the log-likelihood, beside the raw weights'.

    Rows (column ``kind``):

    * ``"f"``: ``f`` at chosen inputs -- the ``x_eval`` points if the InferenceData has
      ``f_eval``, else ``num_points`` evenly spaced training inputs (or the indices
      ``f_points``);
    * ``"log_lik"``: the total log-likelihood ``sum_n log p(y_n | ...)`` of each draw, and the
      log joint ``lp`` when the sampler recorded it;
    * ``"w"`` (and ``"z"``): median and worst (max R-hat, min ESS) over all weights, or every
      weight with ``per_weight=True``. Weight diagnostics of a BNN are not meaningful on their own
      (see the module docstring): a large weight R-hat with good function-space R-hat usually
      means the chains sit in symmetric copies of the same mode.

    R-hat is ArviZ's rank-normalised split R-hat; ESS are ArviZ's bulk and tail ESS. Needs at
    least 2 chains for a meaningful R-hat (with one chain R-hat only compares its two halves).
    """
    post = idata.posterior
    C, S = post.sizes["chain"], post.sizes["draw"]
    rows: list[dict] = []
    for kind, labels, arr in _invariant_draws(idata, f_points, num_points):
        rows += _diag_rows(arr, labels, kind)
    for name in ("w", "z"):
        if name not in post:
            continue
        arr = post[name].values.reshape(C, S, -1)
        if name == "w":
            labs = [f"w[{c}]" for c in post["w"].coords["weight"].values]
        else:
            labs = [f"z[{i}]" for i in range(arr.shape[2])]
        wrows = _diag_rows(arr, labs, name)
        rows += wrows if per_weight else _aggregate(wrows, name, name)
    return pd.DataFrame(rows).set_index("quantity")


# ----------------------------------------------------------------------------------------------
# compare_posteriors
# ----------------------------------------------------------------------------------------------
