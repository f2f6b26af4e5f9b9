r"""ArviZ export and function-space convergence diagnostics.

* :func:`to_inference_data` turns an ``MCMC`` run, a fitted guide (or several restarts, as
  chains) or posterior samples into an ``arviz.InferenceData`` that ``az.plot_trace(idata)``,
  ``az.summary(idata)`` and ``az.loo`` read as they are: ``f`` at a few inputs in ``posterior``,
  the raw weights in a group of their own, and, for :func:`~pyro_bnnlv.infer.mcmc.run_nuts`,
  ``sample_stats`` (``diverging``, ``n_steps``, ``lp``, ``acceptance_rate``, ``tree_depth``).
* :func:`plot_trace` draws the traces of those function values and of the log-likelihood.
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
although nothing is wrong. Quantities invariant under the symmetries -- ``f(x)`` at chosen
inputs, the log-likelihood, the log joint -- are what the posterior predictive depends on, and
their R-hat/ESS are the ones to read: :func:`posterior_summary` reports them first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyro
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from .posterior import Posterior, posterior_kind, weight_group
from ._state import set_seed
from ._checks import check_int
from ._figures import finish_figure
from .stats.posterior_kl import compare_posteriors

__all__ = ["compare_posteriors", "plot_trace", "posterior_summary", "to_inference_data", "weight_labels"]


# -- helpers -----------------------------------------------------------------------------------
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
    model: Any, posterior: Any, x: Tensor, y: Tensor | None, latent: dict, num_samples: int, seed: int | None
) -> tuple[dict[str, Tensor], dict[str, np.ndarray]]:
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
    renames = (
        ("num_steps", "n_steps", 1),
        ("potential_energy", "lp", -1),
        ("accept_prob", "acceptance_rate", 1),
        ("tree_depth", "tree_depth", 1),
    )
    for src, dst, sign in renames:
        vals = [rec.get(src) for rec in recs]
        if all(v is not None and len(v) == num_draws for v in vals):
            arr = sign * np.asarray(vals, dtype=float)
            if not np.all(np.isnan(arr)) and not (dst == "tree_depth" and np.all(arr == 0)):
                stats[dst] = arr
    return stats


def _replay(
    model: Any,
    x: Tensor,
    y: Tensor,
    draws: dict[str, Tensor],
    latent: dict,
    nesting: int,
    obs_site: str,
    chunk_size: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Vectorised replay of the model conditioned on ``M`` flat draws: the observation
    distribution's mean ``(M, N[, L])`` (a categorical's class probabilities ``(M, N, K)``), pointwise log-likelihood ``(M, N)`` and a posterior
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
        mean = fn.probs if isinstance(fn, torch.distributions.Categorical) else fn.mean  # class probabilities
        means.append(mean.expand(*lp.shape, *mean.shape[lp.dim() :]))
        lls.append(lp)
        preds.append(fn.sample())
    return torch.cat(means), torch.cat(lls), torch.cat(preds)


def _eval_point_labels(x_eval: Tensor) -> np.ndarray:
    """Coordinates of the inputs of ``f``: for 1-D inputs the input values to 4 significant
    digits (ArviZ's panel titles and summary rows read ``f[-2.316]``) when they stay distinct,
    else the row indices."""
    if x_eval.shape[1] == 1:
        values = np.array([float(f"{v:.4g}") for v in _np(x_eval[:, 0])])
        if len(np.unique(values)) == len(values):
            return values
    return np.arange(x_eval.shape[0])


def _np(t: Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy()


# -- to_inference_data -------------------------------------------------------------------------
def _f_at_eval_points(
    model: Any,
    x: Tensor,
    x_eval: Tensor | None,
    draws: dict[str, Tensor],
    flat: dict[str, Tensor],
    mean: Tensor,
    num_points: int,
) -> tuple[Tensor, Tensor]:
    """``(x_eval, f)`` of :func:`to_inference_data`: ``f(x_eval, w)`` per draw at the given inputs
    (a model with ``f`` and no local latents), else the replayed means at ``num_points`` training
    inputs spread over the data (in the order of ``x`` for 1-D inputs)."""
    if x_eval is not None:
        if set(draws) != {"w"} or not hasattr(model, "f"):
            raise ValueError(
                "x_eval needs a model with f(x, w) and no local latent sites; leave it out "
                "to store f at num_points training inputs"
            )
        with torch.no_grad():
            f = model.f(x_eval.to(x.dtype), flat["w"])
        return x_eval, f.squeeze(-1) if f.shape[-1] == 1 else f
    N = x.shape[0]
    order = torch.argsort(x[:, 0]) if x.shape[1] == 1 else torch.arange(N)
    idx = order[torch.linspace(0, N - 1, min(num_points, N)).round().long()]
    return x[idx], mean[:, idx]


def _coords(model: Any, x: Tensor, x_eval: Tensor, mean: Tensor, num_weights: int) -> dict[str, Any]:
    """The coordinates of :func:`to_inference_data`'s dimensions; the weights are labelled by
    layer and position (:func:`weight_labels`) when the model's network has that many weights."""
    coords: dict[str, Any] = {
        "data": np.arange(x.shape[0]),
        "input": np.arange(x.shape[1]),
        "eval_point": _eval_point_labels(x_eval),
    }
    if mean.dim() == 3:
        coords["output"] = np.arange(mean.shape[-1])
    net = getattr(model, "net", None)
    labelled = net is not None and getattr(net, "num_weights", None) == num_weights
    coords["weight"] = weight_labels(net) if labelled else np.arange(num_weights)
    return coords


def _posterior_groups(
    draws: dict[str, Tensor], f: Tensor, weights: bool, num_data: int, dims: dict, coords: dict
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(posterior, weights)`` groups of :func:`to_inference_data`: ``f`` and the scalar latent
    sites in ``posterior``; ``w`` and other array sites there too with ``weights``, else in the
    ``weights`` group. A per-point ``z`` gets its dimensions added to ``dims`` and ``coords``."""
    C, S = draws["w"].shape[:2]
    posterior_vars = {"f": _np(f.reshape(C, S, *f.shape[1:]))}
    raw: dict[str, np.ndarray] = {}
    for name, v in draws.items():
        scalar = name != "w" and v[0, 0].numel() == 1
        (posterior_vars if scalar or weights else raw)[name] = _np(v.reshape(C, S) if scalar else v)
        if name == "z" and v.dim() == 4 and v.shape[2] == num_data:
            dims["z"] = ["data", "latent_dim"]
            coords["latent_dim"] = np.arange(v.shape[3])
    return posterior_vars, raw


def _dims(mean: Tensor, pred: Tensor) -> dict[str, list[str]]:
    """The dimensions of :func:`to_inference_data`'s variables, from the replayed means ``mean``
    and observations ``pred`` (draws first)."""
    multi = mean.dim() == 3  # several outputs, or a classifier's class probabilities
    obs_dims = ["data", "output"] if pred.dim() == 3 else ["data"]  # a classifier's obs are labels
    f_dims = ["eval_point", "output"] if multi else ["eval_point"]
    return {"f": f_dims, "obs": obs_dims, "x": ["data", "input"], "x_eval": ["eval_point", "input"], "w": ["weight"]}


def to_inference_data(
    model: Callable[..., Any],
    posterior: Any,
    x: Tensor,
    y: Tensor,
    *,
    num_samples: int = 1000,
    x_eval: Tensor | None = None,
    num_points: int = 5,
    weights: bool = False,
    obs_site: str = "obs",
    seed: int | None = None,
    chunk_size: int = 500,
) -> Any:
    """An ``arviz.InferenceData`` of a posterior of ``model`` given ``(x, y)``, readable by
    ``az.plot_trace`` and ``az.summary`` as it is.

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
        x_eval: the inputs ``(E, D)`` at which ``f`` is stored (models exposing ``f(x, w)`` and
            no local latents only); default ``num_points`` training inputs.
        num_points: without ``x_eval``, ``f`` is stored at this many training inputs, evenly
            spaced in the order of ``x`` for 1-D inputs (so they span its range), evenly spaced
            rows otherwise.
        weights: ``True`` puts the raw weights (and the other non-scalar latent sites) in the
            ``posterior`` group, where ``az.plot_trace`` and ``az.summary`` show every one (slow
            and unreadable for a BNN: the module docstring says why their diagnostics mislead);
            by default they are in the group ``weights``.
        seed: seeds guide sampling and the posterior-predictive draws.
        chunk_size: draws per vectorised model replay (bounds memory).

    Groups and dimensions:
        The per-datapoint dimension is called ``data`` (the model's plate). ``posterior``:
        ``f (chain, draw, eval_point[, output])``, the mean of the observation distribution at
        the chosen inputs (``f(x; w)``, for a BNN+LV ``f([x, z]; w)`` with the posterior ``z`` of
        those training points; the ``eval_point`` coordinate is the input value, to 4
        significant digits, for 1-D inputs), and every scalar latent site. ``weights`` (or ``posterior`` with ``weights=True``):
        ``w (chain, draw, weight)`` with MLP weight labels, ``z (chain, draw, data,
        latent_dim)`` where present, and the other latent sites. ``posterior_predictive``: ``obs
        (chain, draw, data[, output])``; ``log_likelihood``: ``obs (chain, draw, data)``;
        ``observed_data``: ``obs``; ``constant_data``: ``x (data, input)`` and ``x_eval
        (eval_point, input)``; ``sample_stats`` for MCMC runs. The model's noise scale (fixed
        or a point estimate in this library's models, so not a posterior variable) is the
        attribute ``idata.posterior.attrs["noise_scale"]``; a sampled noise site of your own
        model is a scalar latent site, so a posterior variable. :func:`pyro_bnnlv.evaluate`
        and :meth:`~pyro_bnnlv.posterior.Posterior.from_any` read the weights from either group.
    """
    import arviz as az

    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        raise TypeError("x and y must be tensors")
    if hasattr(model, "check_data"):
        model.check_data(x, y)
    num_points = check_int(num_points, "num_points")
    set_seed(seed)
    latent, nesting = _model_sites(model, x, y, obs_site)
    draws, stats = _posterior_chains(model, posterior, x, y, latent, num_samples, seed)
    C, S = draws["w"].shape[:2]
    flat = {k: v.reshape(C * S, *v.shape[2:]) for k, v in draws.items()}
    mean, ll, pred = _replay(model, x, y, flat, latent, nesting, obs_site, chunk_size)
    N = x.shape[0]
    x_eval, f = _f_at_eval_points(model, x, x_eval, draws, flat, mean, num_points)
    dims = _dims(mean, pred)
    coords = _coords(model, x, x_eval, mean, draws["w"].shape[-1])

    posterior_vars, raw = _posterior_groups(draws, f, weights, N, dims, coords)
    constant = {"x": _np(x), "x_eval": _np(x_eval)}
    idata = az.from_dict(
        posterior=posterior_vars,
        posterior_predictive={"obs": _np(pred.reshape(C, S, *pred.shape[1:]))},
        log_likelihood={"obs": _np(ll.reshape(C, S, *ll.shape[1:]))},
        observed_data={"obs": _np(y)},
        constant_data=constant,
        sample_stats=stats or None,
        coords=coords,
        dims=dims,
    )
    noise = getattr(model, "noise_scale", None)
    if noise is not None and torch.as_tensor(noise).numel() == 1:
        idata.posterior.attrs["noise_scale"] = float(noise)
    if raw:
        idata.add_groups({"weights": az.convert_to_dataset(raw, coords=coords, dims=dims)})
    return idata


# -- posterior_summary -------------------------------------------------------------------------
def _diag_rows(arr: np.ndarray, labels: Sequence[str], kind: str) -> list[dict]:
    """Mean, sd, bulk/tail ESS and rank-normalised R-hat of ``arr (C, S, K)`` per column."""
    import arviz as az

    ds = az.convert_to_dataset({"v": arr}, coords={"k": np.arange(arr.shape[2])}, dims={"v": ["k"]})
    ess_b = az.ess(ds, method="bulk")["v"].values
    ess_t = az.ess(ds, method="tail")["v"].values
    rhat = az.rhat(ds)["v"].values
    return [
        {
            "quantity": lab,
            "kind": kind,
            "mean": float(arr[..., j].mean()),
            "sd": float(arr[..., j].std()),
            "ess_bulk": float(ess_b[j]),
            "ess_tail": float(ess_t[j]),
            "r_hat": float(rhat[j]),
        }
        for j, lab in enumerate(labels)
    ]


def _aggregate(rows: list[dict], name: str, kind: str) -> list[dict]:
    """Two rows: the median and the worst (min ESS, max R-hat) of ``rows``."""
    df = pd.DataFrame(rows)
    n = len(df)
    return [
        {
            "quantity": f"{name}: {label} {n}",
            "kind": kind,
            "mean": math.nan,
            "sd": math.nan,
            "ess_bulk": float(getattr(df.ess_bulk, low)()),
            "ess_tail": float(getattr(df.ess_tail, low)()),
            "r_hat": float(getattr(df.r_hat, high)()),
        }
        for label, low, high in (("median over", "median", "median"), ("worst of", "min", "max"))
    ]


def _invariant_draws(
    idata: Any, f_points: Sequence[int] | None, num_points: int | None
) -> list[tuple[str, list[str], np.ndarray]]:
    """The symmetry-invariant quantities of :func:`posterior_summary`: ``[(kind, labels, (C, S, K))]``
    for ``f`` at the stored inputs (the indices ``f_points``, else at most ``num_points`` of them
    evenly spaced), the total log-likelihood and (when recorded) the log joint."""
    post = idata.posterior
    if "f" not in post or "x_eval" not in getattr(idata, "constant_data", {}):
        raise ValueError(
            "the InferenceData has no function values f with their inputs x_eval: make it with "
            "pyro_bnnlv.to_inference_data"
        )
    C, S = post.sizes["chain"], post.sizes["draw"]
    f = post["f"].values.reshape(C, S, post["f"].shape[2], -1)[..., 0]
    xs = idata.constant_data["x_eval"].values
    E = f.shape[2]
    if f_points is not None:
        idx = [check_int(i, "f_points[i]", minimum=0) for i in f_points]
        if any(i >= E for i in idx):
            raise ValueError(f"f_points must index the {E} stored inputs of f (0..{E - 1}), got {list(f_points)}")
    elif num_points is None or num_points >= E:
        idx = list(range(E))
    else:
        idx = np.unique(np.linspace(0, E - 1, check_int(num_points, "num_points")).round().astype(int)).tolist()
    labels = [f"f(x={xs[i, 0]:.3g})" if xs.shape[1] == 1 else f"f(x_eval[{i}])" for i in idx]
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
    num_points: int | None = None,
    axes: Any = None,
) -> Any:
    """Trace plots of the quantities worth reading: ``f`` at the stored inputs, the total
    log-likelihood and the log joint ``lp`` (NUTS runs), per chain.

    One row per quantity (the same ones, chosen the same way, as :func:`posterior_summary`:
    the inputs ``x_eval`` at which :func:`to_inference_data` stored ``f``, all of them, at most
    ``num_points`` evenly spaced, or the indices ``f_points``); left: a histogram per chain,
    right: the draws per chain. Weight traces are left out on purpose: they are not
    interpretable (module docstring). ``axes``: a ``(rows, 2)`` array of matplotlib axes to draw
    into. Returns the figure; with ``path`` it is also written there.
    """
    from matplotlib.ticker import MaxNLocator

    panels = [
        (lab, arr[..., j])
        for _, labels, arr in _invariant_draws(idata, f_points, num_points)
        for j, lab in enumerate(labels)
    ]
    owned = axes is None
    if owned:
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(
            len(panels), 2, figsize=(9, 0.4 + 1.7 * len(panels)), squeeze=False, gridspec_kw={"width_ratios": [1, 2.5]}
        )
    else:
        axes = np.asarray(axes, dtype=object).reshape(-1, 2)
        if axes.shape[0] != len(panels):
            raise ValueError(f"axes must have shape ({len(panels)}, 2) for these quantities, got {axes.shape[0]} rows")
        fig = axes[0, 0].figure
    for (label, arr), (ax_h, ax_t) in zip(panels, axes):
        bins = np.linspace(arr.min(), arr.max(), 30) if arr.max() > arr.min() else 10
        for c in range(arr.shape[0]):
            ax_h.hist(arr[c], bins=bins, histtype="step", density=True)
            ax_t.plot(arr[c], lw=0.6, alpha=0.8, label=f"chain {c}")
        ax_h.set_ylabel(label, fontsize=9)
        ax_h.set_yticks([])
        ax_h.xaxis.set_major_locator(MaxNLocator(nbins=3))  # rows have their own ranges: few, short ticks
        ax_h.tick_params(axis="x", labelsize=8, labelbottom=True)
        ax_t.yaxis.set_major_locator(MaxNLocator(nbins=4))
        ax_t.tick_params(labelsize=8)
    for _, ax_t in axes[:-1]:  # one draw axis, labelled once at the bottom
        ax_t.sharex(axes[-1][1])
        ax_t.tick_params(labelbottom=False)
    axes[-1][1].set_xlabel("draw")
    axes[0][1].set_title("draws per chain", fontsize=9, loc="left")
    axes[0][0].set_title("histogram per chain", fontsize=9, loc="left")
    # above the top trace, right of its title: over no data
    axes[0][1].legend(
        fontsize=7,
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncol=min(arr.shape[0], 8),
        frameon=False,
        borderaxespad=0.2,
    )
    return finish_figure(fig, path, owned, dpi=110)


def posterior_summary(
    idata: Any, *, f_points: Sequence[int] | None = None, num_points: int | None = None, per_weight: bool = False
) -> pd.DataFrame:
    """R-hat and ESS of function values and of the log-likelihood, beside the raw weights'.

    Rows (column ``kind``):

    * ``"f"``: ``f`` at the inputs ``x_eval`` at which :func:`to_inference_data` stored it (all,
      at most ``num_points`` evenly spaced, or the indices ``f_points``);
    * ``"log_lik"``: the total log-likelihood ``sum_n log p(y_n | ...)`` of each draw, and the
      log joint ``lp`` when the sampler recorded it;
    * ``"w"`` (and ``"z"``): median and worst (max R-hat, min ESS) over all weights, or every
      weight with ``per_weight=True``, read from the ``weights`` group (or ``posterior``); not
      meaningful on their own (module docstring).

    R-hat is ArviZ's rank-normalised split R-hat; ESS are ArviZ's bulk and tail ESS. Needs at
    least 2 chains for a meaningful R-hat (with one chain R-hat only compares its two halves).
    """
    post = idata.posterior
    C, S = post.sizes["chain"], post.sizes["draw"]
    rows: list[dict] = []
    for kind, labels, arr in _invariant_draws(idata, f_points, num_points):
        rows += _diag_rows(arr, labels, kind)
    raw = weight_group(idata)
    for name in ("w", "z"):
        if raw is None or name not in raw:
            continue
        arr = raw[name].values.reshape(C, S, -1)
        if name == "w":
            labs = [f"w[{c}]" for c in raw["w"].coords["weight"].values]
        else:
            labs = [f"z[{i}]" for i in range(arr.shape[2])]
        wrows = _diag_rows(arr, labs, name)
        rows += wrows if per_weight else _aggregate(wrows, name, name)
    return pd.DataFrame(rows).set_index("quantity")


# -- compare_posteriors ------------------------------------------------------------------------
