r"""Classification against NUTS (two moons) and a small CNN on digits with OOD digits (issue 42).

``pyro-bnnlv reproduce classification``: two experiments, each a sweep of
:func:`pyro_bnnlv.sweep.run_sweep` (resumable with ``--out DIR``: the stores are ``DIR/two-moons``
and ``DIR/digits``).

**a. Two moons against NUTS** (:func:`two_moons_experiment`). ``two-moons`` (300 training, 100
test points, noise 0.2), an ``MLP(2, [16], 2)`` tanh classifier with an ``N(0, 1)`` prior on every
weight and a softmax likelihood (``pb.BNN(net, likelihood="categorical")``), per seed ``s`` (the
data set's seed and the fits'):

* **NUTS**, the reference: the compiled flat kernel, 4 chains of 1,000 warm-up and 1,000 kept
  draws, seeds ``s..s+3``;
* **NUTS-ref**, an independent reference: Pyro's own ``NUTS(potential_fn=...)`` kernel
  (``kernel="pyro"``), 2 chains of 250 + 250 draws, seeds ``1000 + s``. Its distance to NUTS is
  the floor set by the references' own Monte-Carlo error: a method closer to NUTS than that is
  not distinguishable from it;
* **MFVI** (``pb.MeanField``), **FCVI** (``AutoMultivariateNormal``, full covariance), 3,000 Adam
  steps at 0.01 on the full batch, 1,000 posterior draws;
* **MAP** (``pb.train_map``, 2,000 steps) and the linearised Laplace approximations around it,
  ``structure="full" / "diag" / "last_layer" / "kfac"`` (Immer, Korzepa & Bauer 2021,
  arXiv:2008.08400: the GGN with ``Lambda_n = diag(p_n) - p_n p_n^T`` and the predictive of the
  linearised network ``f_lin(x; w) = f(x; w*) + J(x)(w - w*)``; K-FAC: Ritter, Botev & Barber
  2018), with the model's prior (the posterior NUTS samples; no marginal-likelihood tuning here,
  which would change the target), class probabilities averaged over 1,000 draws of the
  linearised logits (``link_approx="mc"``).

Each method's predictive ``q(y | x) = E_q[softmax f(x; w)]`` is compared with NUTS's ``p(y | x)``
in predictor space on a 50 x 50 grid covering the training inputs +- 1 (standardised units):
the mean total-variation distance ``TV = mean_x (1/2) sum_k |p_k(x) - q_k(x)|`` and the mean
``KL(p || q) = mean_x sum_k p_k(x) log(p_k(x) / q_k(x))``; and on the test set: accuracy, NLL
(``-mean log q(y_n | x_n)``), Brier score and ECE (15 bins, Guo, Pleiss, Sun & Weinberger 2017,
arXiv:1706.04599). Probabilities on the grid are stored per task as logits ``log(q_1 / q_0)``
rounded to 3 decimals and clipped to ``+-27.6`` (``q`` in ``[1e-12, 1 - 1e-12]``), so the
distances are computed after the sweep from the store.

**b. Digits with a CNN, OOD digits** (:func:`digits_experiment`). ``digits-ood`` (8 x 8 digits
0-4, ``K = 5``; the images of 5-9 are the OOD inputs), the CNN of docs/guide.md as an
``nn.Sequential`` in ``pb.ModuleNet`` (``Conv2d(1, 16, 3)``, ReLU, ``Linear(576, 32)``, ReLU,
``Linear(32, 5)``: 18,789 weights) with the prior ``pb.fan_in_prior_scale(net, omega=1)``. Per
seed: **MAP** (1,500 Adam steps at 0.01), **K-FAC** linearised Laplace around it with the prior
precision chosen by the Laplace marginal likelihood (``optimize_hyperparameters()``), and
**MFVI** (``pb.MeanField`` on the same BNN, 1,500 steps at 0.01). Reported: accuracy, NLL, Brier,
ECE on the test digits; the AUROC of telling the OOD digits from the test digits by the
predictive entropy ``H[p_bar]`` and by the mutual information ``I[y; w] = H[p_bar] - E_w H[p_w]``
(BALD, Houlsby, Huszár, Ghahramani & Lengyel 2011, arXiv:1112.5745; from 1,000 draws of the
linearised logits for K-FAC, :func:`laplace_probs_samples`, and 500 posterior draws for MFVI; a
point estimate has none); the fit's seconds (K-FAC: the MAP fit plus the Laplace fit and its
hyper-parameter search) and the posterior's memory (the bytes of the tensors it stores:
:func:`posterior_bytes`; K-FAC's Kronecker factors and their eigendecompositions, against
``P^2`` floats for a dense covariance).

Results are compared over seeds by paired differences (same seed: same data split and MAP):
the mean difference and its standard error ``sd / sqrt(n)``; an ordering is written only where
``|mean| > 2 SE``, "tie" otherwise (with 3 seeds this is a loose screen, not a test).

Commands (the numbers in docs/results.md)::

    pyro-bnnlv reproduce classification --out docs/results/sweeps/classification-v1 \
        --code-version classification-v1 --results-dir docs/results

``--small`` runs a smoke-test size (seconds; meaningless numbers).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn as nn
from pyro.infer.autoguide import AutoMultivariateNormal
from torch import Tensor

from .._compiled import nuts_extension
from .._warning_tally import WarningTally
from ..datasets import Dataset, load_dataset
from ..guides import MeanField, init_to_network
from ..infer.laplace.linearized import LinearizedLaplace
from ..infer.mcmc.nuts import run_nuts
from ..infer.svi import fit_svi, train_map
from ..models.bnn import BNN, fan_in_prior_scale
from ..nets import MLP, ModuleNet
from ..param_names import own_param_names
from ..plotting import plot_reliability
from ..posterior import sample_posterior
from ..stats.classification import classification_metrics, mutual_information, ood_auroc, predictive_entropy
from ..sweep import Task, run_sweep, task_function
from ..sweep.cli import add_sweep_arguments, report, sweep_options
from . import tables

__all__ = [
    "DIGITS_METHODS",
    "TWO_MOONS_METHODS",
    "digits_cnn",
    "digits_experiment",
    "digits_fit",
    "digits_paired_table",
    "digits_rows",
    "digits_table",
    "grid_inputs",
    "laplace_probs_samples",
    "main",
    "paired_differences",
    "plot_digits_reliability",
    "plot_two_moons_entropy",
    "posterior_bytes",
    "two_moons_experiment",
    "two_moons_fit",
    "two_moons_paired_table",
    "two_moons_rows",
    "two_moons_table",
]

TWO_MOONS_METHODS = ("NUTS", "NUTS-ref", "MFVI", "FCVI", "MAP", "LA-full", "LA-diag", "LA-last_layer", "LA-kfac")
#: the tasks of one two-moons seed: the Laplace methods share their MAP fit
TWO_MOONS_TASKS = {
    "NUTS": ("NUTS",),
    "NUTS-ref": ("NUTS-ref",),
    "MFVI": ("MFVI",),
    "FCVI": ("FCVI",),
    "MAP+Laplace": ("MAP", "LA-full", "LA-diag", "LA-last_layer", "LA-kfac"),
}
DIGITS_METHODS = ("MAP", "K-FAC", "MFVI")
DIGITS_TASKS = {"MAP+K-FAC": ("MAP", "K-FAC"), "MFVI": ("MFVI",)}

#: default sizes (about 20 minutes on one core) and the smoke-test sizes of ``--small``
TWO_MOONS_SIZE = dict(
    hidden=16,
    grid=50,
    margin=1.0,
    nuts_chains=4,
    nuts_warmup=1000,
    nuts_samples=1000,
    nuts_map_steps=2000,
    ref_chains=2,
    ref_warmup=250,
    ref_samples=250,
    ref_tree_depth=10,
    vi_steps=3000,
    map_steps=2000,
    num_samples=1000,
)
TWO_MOONS_SMALL = dict(
    hidden=8,
    grid=12,
    margin=1.0,
    nuts_chains=2,
    nuts_warmup=100,
    nuts_samples=100,
    nuts_map_steps=300,
    ref_chains=1,
    ref_warmup=30,
    ref_samples=30,
    ref_tree_depth=5,
    vi_steps=200,
    map_steps=300,
    num_samples=200,
)
DIGITS_SIZE = dict(map_steps=1500, vi_steps=1500, lr=0.01, la_samples=1000, vi_samples=500)
DIGITS_SMALL = dict(map_steps=40, vi_steps=40, lr=0.01, la_samples=100, vi_samples=30)

_LOGIT_CLIP = 27.6  # |log(q / (1 - q))| for q = 1e-12


# --------------------------------------------------------------------------- shared helpers


def grid_inputs(x: Tensor, n: int = 50, margin: float = 1.0) -> tuple[Tensor, tuple[float, float, float, float]]:
    """An ``n x n`` grid over the box of the 2-D inputs ``x`` widened by ``margin`` on each side:
    ``(points (n^2, 2), (x0_min, x0_max, x1_min, x1_max))``, the first coordinate varying fastest
    (``points.reshape(n, n, 2)[i, j] = (a_j, b_i)``, as ``imshow`` draws it)."""
    lo, hi = x.min(0).values - margin, x.max(0).values + margin
    a = torch.linspace(float(lo[0]), float(hi[0]), n)
    b = torch.linspace(float(lo[1]), float(hi[1]), n)
    B, A = torch.meshgrid(b, a, indexing="ij")
    return torch.stack([A.reshape(-1), B.reshape(-1)], -1), (float(lo[0]), float(hi[0]), float(lo[1]), float(hi[1]))


def _sample_probs(model: BNN, w: Tensor, x: Tensor) -> Tensor:
    """``(S, N, K)`` softmax class probabilities of the weight draws ``w (S, P)`` in float64."""
    with torch.no_grad():
        return torch.softmax(model.f(x, w).double(), -1)


def laplace_probs_samples(la: LinearizedLaplace, x: Tensor, num_samples: int = 1000, seed: int = 0) -> Tensor:
    r"""``(S, N, K)`` class probabilities of ``S`` draws of the linearised logits at ``x``.

    The linearised Laplace predictive of a classifier (Immer et al. 2021, arXiv:2008.08400, sec. 3)
    has Gaussian logits ``f_* ~ N(f(x_*; w*), J_* Sigma J_*^T)`` (``la.predictive(x)``: ``mean``
    and ``f_cov``); draw ``s`` is ``softmax(mean + C eps_s)`` with ``C C^T = f_cov`` and
    ``eps_s ~ N(0, I)``. Their mean over ``s`` is ``la.predictive_probs(x, num_samples=S, seed=seed)``
    (the same draws); the draws themselves give the mutual information (BALD,
    :func:`~pyro_bnnlv.stats.mutual_information`)."""
    pred = la.predictive(x)
    gen = torch.Generator().manual_seed(int(seed))
    eye = torch.eye(pred.f_cov.shape[-1], dtype=pred.f_cov.dtype)
    chol = torch.linalg.cholesky_ex(pred.f_cov + 1e-12 * eye)[0]
    eps = torch.randn(int(num_samples), *pred.mean.shape, generator=gen, dtype=pred.f_cov.dtype)
    draws = pred.mean + (chol @ eps.unsqueeze(-1)).squeeze(-1)
    return la.likelihood.probs(draws)


def _tensor_bytes(value: Any, seen: set[int]) -> int:
    if isinstance(value, Tensor):
        if id(value) in seen:
            return 0
        seen.add(id(value))
        return value.nelement() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in value)
    if isinstance(value, Mapping):
        return sum(_tensor_bytes(v, seen) for v in value.values())
    if hasattr(value, "__dataclass_fields__"):
        return sum(_tensor_bytes(getattr(value, k), seen) for k in value.__dataclass_fields__)
    return 0


def posterior_bytes(posterior: Any) -> int:
    """Bytes of the tensors an approximate posterior stores.

    * a :class:`~pyro_bnnlv.infer.LinearizedLaplace`: every tensor among its attributes (``w_map``,
      the prior precision, and the curvature: ``P^2`` floats for ``"full"``, ``P`` for ``"diag"``,
      per layer the Kronecker factors ``A_l``, ``G_l`` and their cached eigendecompositions for
      ``"kfac"``), the model and its network excluded;
    * a guide (an ``nn.Module``, e.g. ``MeanField``: a location and a scale per weight): its
      parameters;
    * a tensor (a MAP weight vector): its own bytes.
    """
    if isinstance(posterior, Tensor):
        return posterior.nelement() * posterior.element_size()
    if isinstance(posterior, LinearizedLaplace):
        seen: set[int] = set()
        skip = {"model", "net", "likelihood", "_layers"}
        return sum(_tensor_bytes(v, seen) for k, v in vars(posterior).items() if k not in skip)
    if isinstance(posterior, nn.Module):
        return sum(p.nelement() * p.element_size() for p in posterior.parameters())
    raise TypeError(
        f"posterior_bytes takes a LinearizedLaplace, a guide (nn.Module) or a tensor, got {type(posterior).__name__}"
    )


def paired_differences(table: pd.DataFrame, a: str, b: str, column: str) -> tuple[float, float, int]:
    """``(mean, SE, n)`` of ``column`` of method ``a`` minus method ``b``, paired by ``seed``
    (``SE = sd / sqrt(n)``, NaN for ``n < 2``)."""
    wide = tables.by_method(table, "seed", [column])[column]
    if a not in wide.columns or b not in wide.columns:
        return math.nan, math.nan, 0
    return tables.paired(wide[a], wide[b])


def _metrics(y: Tensor, probs: Tensor) -> dict[str, float]:
    m = classification_metrics(y, probs)
    return dict(accuracy=float(m["accuracy"]), nll=-float(m["test_ll"]), brier=float(m["brier"]), ece=float(m["ece"]))


def _encode_grid(probs: Tensor) -> str:
    """Grid probabilities of class 1 as logits, rounded to 3 decimals, clipped at ``+-27.6``."""
    p = probs[:, 1].double().clamp(1e-12, 1 - 1e-12)
    logit = (p.log() - (-p).log1p()).clamp(-_LOGIT_CLIP, _LOGIT_CLIP)
    return json.dumps([round(float(v), 3) for v in logit])


def _decode_grid(text: str) -> Tensor:
    """``(G, 2)`` class probabilities of :func:`_encode_grid`'s text."""
    p1 = torch.sigmoid(torch.tensor(json.loads(text), dtype=torch.float64))
    return torch.stack([1 - p1, p1], -1)


# --------------------------------------------------------------------------- a. two moons


def _two_moons_model(hidden: int) -> BNN:
    return BNN(MLP(2, [hidden], 2, activation="tanh"), prior_scale=1.0, likelihood="categorical")


def _nuts_probs(
    model: BNN,
    data: Dataset,
    xg: Tensor,
    *,
    kernel: str,
    chains: int,
    warmup: int,
    samples: int,
    seed: int,
    max_tree_depth: int = 10,
    map_steps: int = 2000,
) -> tuple[Tensor, Tensor, dict[str, float]]:
    mc = run_nuts(
        model,
        data.x_train,
        data.y_train,
        num_samples=samples,
        warmup_steps=warmup,
        num_chains=chains,
        seed=seed,
        progress=False,
        kernel=kernel,
        max_tree_depth=max_tree_depth,
        map_steps=map_steps,
    )
    w = mc.get_samples()["w"]
    info = mc.run_info
    extra = dict(leapfrog_per_draw=float(info.mean_leapfrog_per_sample), draws=int(w.shape[0]))
    return _sample_probs(model, w, data.x_test).mean(0), _sample_probs(model, w, xg).mean(0), extra


@task_function("classification/two-moons")
def two_moons_fit(task: Task, **size: Any) -> dict[str, Any]:
    """One task of :func:`two_moons_experiment`: the methods of ``TWO_MOONS_TASKS[task.method]`` on
    ``two-moons`` with seed ``task.seed``. Per method ``m``: ``m.accuracy``, ``m.nll``, ``m.brier``,
    ``m.ece``, ``m.seconds`` and ``m.grid`` (the grid logits, JSON); ``size`` overrides
    :data:`TWO_MOONS_SIZE`."""
    opts = {**TWO_MOONS_SIZE, **size}
    seed = int(task.seed)
    data = load_dataset("two-moons", seed=seed)
    xg, box = grid_inputs(data.x_train, int(opts["grid"]), float(opts["margin"]))
    model = _two_moons_model(int(opts["hidden"]))
    out: dict[str, Any] = dict(grid_n=int(opts["grid"]), x0_min=box[0], x0_max=box[1], x1_min=box[2], x1_max=box[3])

    def put(method: str, test_probs: Tensor, grid_probs: Tensor, seconds: float, **extra: Any) -> None:
        for key, value in {**_metrics(data.y_test, test_probs), "seconds": seconds, **extra}.items():
            out[f"{method}.{key}"] = value
        out[f"{method}.grid"] = _encode_grid(grid_probs)

    with WarningTally() as tally:
        if task.method == "NUTS":
            t = time.perf_counter()
            pt, pg, extra = _nuts_probs(
                model,
                data,
                xg,
                kernel="flat",
                chains=int(opts["nuts_chains"]),
                warmup=int(opts["nuts_warmup"]),
                samples=int(opts["nuts_samples"]),
                seed=seed,
                map_steps=int(opts["nuts_map_steps"]),
            )
            put("NUTS", pt, pg, time.perf_counter() - t, **extra)
        elif task.method == "NUTS-ref":
            t = time.perf_counter()
            pt, pg, extra = _nuts_probs(
                model,
                data,
                xg,
                kernel="pyro",
                chains=int(opts["ref_chains"]),
                warmup=int(opts["ref_warmup"]),
                samples=int(opts["ref_samples"]),
                seed=1000 + seed,
                max_tree_depth=int(opts["ref_tree_depth"]),
                map_steps=int(opts["nuts_map_steps"]),
            )
            put("NUTS-ref", pt, pg, time.perf_counter() - t, **extra)
        elif task.method in ("MFVI", "FCVI"):
            t = time.perf_counter()
            if task.method == "MFVI":
                guide = MeanField(model, seed=seed)
            else:
                guide = own_param_names(
                    AutoMultivariateNormal(model, init_loc_fn=init_to_network(model, seed=seed), init_scale=0.01)
                )
            fit_svi(
                model,
                guide,
                data.x_train,
                data.y_train,
                num_steps=int(opts["vi_steps"]),
                lr=0.01,
                seed=seed,
                progress=False,
            )
            w = sample_posterior(model, guide, data.x_train, num_samples=int(opts["num_samples"]), seed=seed)["w"]
            seconds = time.perf_counter() - t
            put(task.method, _sample_probs(model, w, data.x_test).mean(0), _sample_probs(model, w, xg).mean(0), seconds)
        elif task.method == "MAP+Laplace":
            t = time.perf_counter()
            w = train_map(
                model, data.x_train, data.y_train, num_steps=int(opts["map_steps"]), lr=0.01, seed=seed, progress=False
            )
            map_seconds = time.perf_counter() - t
            put("MAP", _sample_probs(model, w[None], data.x_test)[0], _sample_probs(model, w[None], xg)[0], map_seconds)
            for structure in ("full", "diag", "last_layer", "kfac"):
                t = time.perf_counter()
                la = LinearizedLaplace(model, w, structure=structure).fit(data.x_train, data.y_train)
                S = int(opts["num_samples"])
                pt = la.predictive_probs(data.x_test, num_samples=S, seed=seed)
                pg = la.predictive_probs(xg, num_samples=S, seed=seed)
                put(f"LA-{structure}", pt, pg, map_seconds + time.perf_counter() - t)
        else:
            raise ValueError(f"unknown two-moons task method {task.method!r}; expected one of {list(TWO_MOONS_TASKS)}")
    out["warnings"] = tally.summary()
    return out


def two_moons_rows(sweep: pd.DataFrame) -> pd.DataFrame:
    """Long table (one row per seed and method) from the two-moons sweep: the test metrics and,
    against the seed's NUTS run, ``tv_to_nuts`` and ``kl_to_nuts`` over the grid (module docstring)."""
    rows = []
    for seed, block in sweep[sweep["status"] == "done"].groupby("seed", sort=True):
        merged: dict[str, Any] = {}
        for _, r in block.iterrows():
            merged.update({k: v for k, v in r.items() if isinstance(k, str) and "." in k and not _isnan(v)})
        ref = _decode_grid(merged["NUTS.grid"]) if "NUTS.grid" in merged else None
        for m in TWO_MOONS_METHODS:
            if f"{m}.grid" not in merged:
                continue
            row: dict[str, Any] = dict(dataset="two-moons", seed=int(seed), method=m)
            if ref is not None:
                q = _decode_grid(merged[f"{m}.grid"])
                row["tv_to_nuts"] = float(0.5 * (ref - q).abs().sum(-1).mean())
                row["kl_to_nuts"] = float((ref * (ref.log() - q.log())).sum(-1).mean())
            else:
                row["tv_to_nuts"] = row["kl_to_nuts"] = math.nan
            for key in ("accuracy", "nll", "brier", "ece", "seconds"):
                row[key] = float(merged.get(f"{m}.{key}", math.nan))
            rows.append(row)
    return pd.DataFrame(rows)


def _isnan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def two_moons_experiment(
    seeds: Sequence[int] = (0, 1, 2),
    *,
    small: bool = False,
    out_dir: str | Path | None = None,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    code_version: str | None = None,
    stop_after: float | None = None,
    progress: bool = True,
    **size: Any,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run part a (module docstring) as a sweep; return ``(rows, sweep)``: :func:`two_moons_rows`
    and the sweep's table (the grid logits, for :func:`plot_two_moons_entropy`)."""
    opts = {**(TWO_MOONS_SMALL if small else TWO_MOONS_SIZE), **size}
    tasks = [Task("two-moons", method=g, split=int(s), seed=int(s)) for s in seeds for g in TWO_MOONS_TASKS]
    fn = functools.partial(two_moons_fit, **opts)
    sweep = run_sweep(
        tasks,
        fn,
        out_dir=out_dir,
        executor=executor,
        workers=workers,
        address=address,
        code_version=code_version,
        progress=progress,
        desc="classification two-moons",
        stop_after=stop_after,
        prepare=nuts_extension,
    )
    rows = two_moons_rows(sweep)
    rows.attrs = dict(sweep.attrs)
    return rows, sweep


def plot_two_moons_entropy(sweep: pd.DataFrame, path: str | Path | None = None, seed: int = 0) -> Any:
    """Predictive entropy ``H[q(y | x)]`` (nats, 0 to ``log 2``) over the grid, one panel per
    method, from the sweep's stored grid logits of ``seed``; the training points on top."""
    import matplotlib.pyplot as plt

    block = sweep[(sweep["seed"] == seed) & (sweep["status"] == "done")]
    merged: dict[str, Any] = {}
    for _, r in block.iterrows():
        merged.update({k: v for k, v in r.items() if isinstance(k, str) and not _isnan(v)})
    methods = [m for m in TWO_MOONS_METHODS if f"{m}.grid" in merged]
    if not methods:
        raise ValueError(f"the sweep has no finished two-moons task of seed {seed}")
    n = int(merged["grid_n"])
    extent = (merged["x0_min"], merged["x0_max"], merged["x1_min"], merged["x1_max"])
    data = load_dataset("two-moons", seed=seed)
    cols = min(5, len(methods))
    rows = math.ceil(len(methods) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.5 * rows), squeeze=False, sharex=True, sharey=True)
    im = None
    for ax, m in zip(axes.flat, methods):
        p = _decode_grid(merged[f"{m}.grid"])
        h = -(p * p.clamp_min(1e-300).log()).sum(-1).reshape(n, n)
        im = ax.imshow(
            h.numpy(), origin="lower", extent=extent, vmin=0, vmax=math.log(2), cmap="viridis", aspect="auto"
        )
        x, y = data.x_train.numpy(), data.y_train.numpy()
        ax.scatter(x[:, 0], x[:, 1], c=y, cmap="coolwarm", s=3, edgecolors="none")
        ax.set_title(m, fontsize=9)
    for ax in list(axes.flat)[len(methods) :]:
        ax.axis("off")
    fig.colorbar(im, ax=axes, shrink=0.8, label="predictive entropy (nats)")
    fig.suptitle(f"two moons, seed {seed}: predictive entropy per method")
    if path is not None:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    return fig


# --------------------------------------------------------------------------- b. digits


def digits_cnn(num_classes: int = 5) -> ModuleNet:
    """The small CNN of docs/guide.md: ``Conv2d(1, 16, 3)``, ReLU, ``Linear(576, 32)``, ReLU,
    ``Linear(32, K)`` on the 8 x 8 images (18,789 weights for ``K = 5``)."""
    cnn = nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 16, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 6 * 6, 32),
        nn.ReLU(),
        nn.Linear(32, num_classes),
    )
    return ModuleNet(cnn, 64, num_classes)


def _digits_row(
    method: str, y: Tensor, probs: Tensor, probs_ood: Tensor, samples: Tensor | None, samples_ood: Tensor | None
) -> dict[str, Any]:
    row = {f"{method}.{k}": v for k, v in _metrics(y, probs).items()}
    row[f"{method}.auroc_entropy"] = ood_auroc(predictive_entropy(probs), predictive_entropy(probs_ood))
    row[f"{method}.auroc_mi"] = (
        None if samples is None else ood_auroc(mutual_information(samples), mutual_information(samples_ood))
    )
    return row


@task_function("classification/digits")
def digits_fit(task: Task, **size: Any) -> dict[str, Any]:
    """One task of :func:`digits_experiment`: MAP with K-FAC Laplace, or MFVI, on ``digits-ood``
    with seed ``task.seed`` (data split and fit). Per method ``m``: ``m.accuracy``, ``m.nll``,
    ``m.brier``, ``m.ece``, ``m.auroc_entropy``, ``m.auroc_mi``, ``m.seconds``, ``m.memory_mb``;
    ``test_probs.MAP`` / ``test_probs.K-FAC`` (JSON, for the reliability diagram)."""
    opts = {**DIGITS_SIZE, **size}
    seed = int(task.seed)
    data = load_dataset("digits-ood", seed=seed)
    x, y, xt, yt, xo = data.x_train, data.y_train, data.x_test, data.y_test, data.extras["x_ood"]
    torch.manual_seed(seed)
    net = digits_cnn(data.num_classes)
    model = BNN(net, prior_scale=fan_in_prior_scale(net, omega=1.0), likelihood="categorical")
    P = net.num_weights
    out: dict[str, Any] = dict(num_weights=P, dense_cov_mb=P * P * 8 / 2**20)
    lr = float(opts["lr"])
    with WarningTally() as tally:
        if task.method == "MAP+K-FAC":
            t = time.perf_counter()
            w = train_map(model, x, y, num_steps=int(opts["map_steps"]), lr=lr, seed=seed, progress=False)
            map_seconds = time.perf_counter() - t
            p, po = _sample_probs(model, w[None], xt)[0], _sample_probs(model, w[None], xo)[0]
            out.update(_digits_row("MAP", yt, p, po, None, None))
            out.update({"MAP.seconds": map_seconds, "MAP.memory_mb": posterior_bytes(w) / 2**20})
            out["test_probs.MAP"] = json.dumps([[round(float(v), 5) for v in r] for r in p])
            t = time.perf_counter()
            la = LinearizedLaplace(model, w, structure="kfac").fit(x, y)
            hyper = la.optimize_hyperparameters()
            la_seconds = time.perf_counter() - t
            S = int(opts["la_samples"])
            s, so = laplace_probs_samples(la, xt, S, seed), laplace_probs_samples(la, xo, S, seed)
            out.update(_digits_row("K-FAC", yt, s.mean(0), so.mean(0), s, so))
            out.update(
                {
                    "K-FAC.seconds": map_seconds + la_seconds,
                    "K-FAC.laplace_seconds": la_seconds,
                    "K-FAC.memory_mb": posterior_bytes(la) / 2**20,
                    "K-FAC.prior_factor": float(hyper["prior_factor"]),
                }
            )
            out["test_probs.K-FAC"] = json.dumps([[round(float(v), 5) for v in r] for r in s.mean(0)])
        elif task.method == "MFVI":
            t = time.perf_counter()
            guide = MeanField(model, seed=seed)
            fit_svi(model, guide, x, y, num_steps=int(opts["vi_steps"]), lr=lr, seed=seed, progress=False)
            seconds = time.perf_counter() - t
            w = sample_posterior(model, guide, x, num_samples=int(opts["vi_samples"]), seed=seed)["w"]
            s, so = _sample_probs(model, w, xt), _sample_probs(model, w, xo)
            out.update(_digits_row("MFVI", yt, s.mean(0), so.mean(0), s, so))
            out.update({"MFVI.seconds": seconds, "MFVI.memory_mb": posterior_bytes(guide) / 2**20})
        else:
            raise ValueError(f"unknown digits task method {task.method!r}; expected one of {list(DIGITS_TASKS)}")
    out["warnings"] = tally.summary()
    return out


_DIGITS_COLUMNS = ("accuracy", "nll", "brier", "ece", "auroc_entropy", "auroc_mi", "seconds", "memory_mb")


def digits_rows(sweep: pd.DataFrame) -> pd.DataFrame:
    """Long table (one row per seed and method) from the digits sweep."""
    rows = []
    for seed, block in sweep[sweep["status"] == "done"].groupby("seed", sort=True):
        merged: dict[str, Any] = {}
        for _, r in block.iterrows():
            merged.update({k: v for k, v in r.items() if isinstance(k, str) and not _isnan(v)})
        for m in DIGITS_METHODS:
            if f"{m}.accuracy" not in merged:
                continue
            row: dict[str, Any] = dict(dataset="digits-ood", seed=int(seed), method=m)
            row.update({k: float(merged.get(f"{m}.{k}", math.nan)) for k in _DIGITS_COLUMNS})
            row["dense_cov_mb"] = float(merged.get("dense_cov_mb", math.nan))
            rows.append(row)
    return pd.DataFrame(rows)


def digits_experiment(
    seeds: Sequence[int] = (0, 1, 2),
    *,
    small: bool = False,
    out_dir: str | Path | None = None,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    code_version: str | None = None,
    stop_after: float | None = None,
    progress: bool = True,
    **size: Any,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run part b (module docstring) as a sweep; return ``(rows, sweep)``: :func:`digits_rows`
    and the sweep's table (the test probabilities, for :func:`plot_digits_reliability`)."""
    opts = {**(DIGITS_SMALL if small else DIGITS_SIZE), **size}
    tasks = [Task("digits-ood", method=g, split=int(s), seed=int(s)) for s in seeds for g in DIGITS_TASKS]
    fn = functools.partial(digits_fit, **opts)
    sweep = run_sweep(
        tasks,
        fn,
        out_dir=out_dir,
        executor=executor,
        workers=workers,
        address=address,
        code_version=code_version,
        progress=progress,
        desc="classification digits",
        stop_after=stop_after,
    )
    rows = digits_rows(sweep)
    rows.attrs = dict(sweep.attrs)
    return rows, sweep


def plot_digits_reliability(sweep: pd.DataFrame, path: str | Path | None = None, seed: int = 0) -> Any:
    """Reliability diagrams (Guo et al. 2017, Fig. 1) of MAP and K-FAC Laplace on the test digits of
    ``seed``, side by side, from the probabilities the sweep stored."""
    import matplotlib.pyplot as plt

    block = sweep[(sweep["seed"] == seed) & (sweep["status"] == "done")]
    stored = {}
    for m in ("MAP", "K-FAC"):
        col = f"test_probs.{m}"
        values = [v for v in block.get(col, pd.Series(dtype=object)) if isinstance(v, str)]
        if values:
            stored[m] = torch.tensor(json.loads(values[0]), dtype=torch.float64)
    if not stored:
        raise ValueError(f"the sweep has no finished MAP+K-FAC digits task of seed {seed}")
    y = load_dataset("digits-ood", seed=seed).y_test
    fig, axes = plt.subplots(1, len(stored), figsize=(5.6 * len(stored), 4.4), squeeze=False)
    for ax, (m, probs) in zip(axes[0], stored.items()):
        probs = probs / probs.sum(-1, keepdim=True)  # undo the rounding to 5 decimals
        plot_reliability(y, probs, ax=ax, title=f"{m}, seed {seed}")
    fig.suptitle("test digits 0-4: reliability of the CNN's predictive")
    if path is not None:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    return fig


# --------------------------------------------------------------------------- results tables


def _mean_se(v: pd.Series, decimals: int = 3) -> str:
    v = v.dropna()
    if v.empty:
        return ""
    se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan
    return (
        f"{tables.num(float(v.mean()), decimals)} ± {tables.num(se, decimals)}"
        if math.isfinite(se)
        else tables.num(float(v.mean()), decimals)
    )


def two_moons_table(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """``docs/results/classification-two-moons.csv``: per method, mean ± SE over the seeds of the
    grid TV distance and KL(NUTS || method) and the test metrics and seconds."""
    t = pd.concat(frames, ignore_index=True)
    cols = [
        ("tv_to_nuts", "TV to NUTS", 3),
        ("kl_to_nuts", "KL(NUTS ‖ method)", 3),
        ("accuracy", "accuracy", 3),
        ("nll", "test NLL", 3),
        ("ece", "ECE", 3),
        ("seconds", "seconds", 1),
    ]
    rows = []
    for m in [m for m in TWO_MOONS_METHODS if m in set(t["method"])]:
        g = t[t["method"] == m]
        rows.append([m, str(g["seed"].nunique())] + [_mean_se(g[c], d) for c, _, d in cols])
    return tables.table(["method", "seeds"] + [label for _, label, _ in cols], rows)


def _paired_rows(t: pd.DataFrame, pairs, columns: Sequence[str], decimals: int) -> list[list[str]]:
    """Per pair ``(a, b)`` of methods, ``a - b`` of each column (lower is better) paired by seed:
    ``"mean ± SE, verdict"`` with a tie within 2 SE (:func:`.tables.paired_text`)."""
    rows = []
    for a, b in pairs:
        cells = [
            tables.paired_text(
                *paired_differences(t, a, b, c), f"{b} better", f"{a} better", decimals, style="± {se}", within=2
            )
            for c in columns
        ]
        rows.append([f"{a} − {b}", *cells])
    return rows


def two_moons_paired_table(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """The two-moons methods ordered by mean TV to NUTS, each against the next: the paired
    difference (same seed) of the TV and of the KL with its SE and the verdict ("tie" within 2 SE)."""
    t = pd.concat(frames, ignore_index=True)
    methods = [m for m in TWO_MOONS_METHODS if m in set(t["method"]) and m != "NUTS"]
    order = sorted(methods, key=lambda m: float(t[t["method"] == m]["tv_to_nuts"].mean()))
    rows = _paired_rows(t, zip(order, order[1:]), ("tv_to_nuts", "kl_to_nuts"), 4)
    return tables.table(["pair (ordered by mean TV)", "TV difference ± SE", "KL difference ± SE"], rows)


def digits_table(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """``docs/results/classification-digits.csv``: per method, mean ± SE over the seeds."""
    t = pd.concat(frames, ignore_index=True)
    cols = [
        ("accuracy", "accuracy", 3),
        ("nll", "test NLL", 3),
        ("brier", "Brier", 3),
        ("ece", "ECE", 3),
        ("auroc_entropy", "OOD AUROC, entropy", 3),
        ("auroc_mi", "OOD AUROC, MI (BALD)", 3),
        ("seconds", "fit seconds", 1),
        ("memory_mb", "posterior MB", 2),
    ]
    rows = []
    for m in [m for m in DIGITS_METHODS if m in set(t["method"])]:
        g = t[t["method"] == m]
        rows.append([m, str(g["seed"].nunique())] + [_mean_se(g[c], d) for c, _, d in cols])
    return tables.table(["method", "seeds"] + [label for _, label, _ in cols], rows)


def digits_paired_table(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """K-FAC Laplace and MFVI minus MAP per seed: paired differences ± SE of the test NLL, ECE and
    Brier (lower is better) and the verdict ("tie" within 2 SE)."""
    t = pd.concat(frames, ignore_index=True)
    rows = _paired_rows(t, (("K-FAC", "MAP"), ("MFVI", "MAP"), ("K-FAC", "MFVI")), ("nll", "ece", "brier"), 3)
    return tables.table(["pair", "test NLL difference ± SE", "ECE difference ± SE", "Brier difference ± SE"], rows)


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pyro-bnnlv reproduce classification", description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", nargs="*", default=["two-moons", "digits"], choices=["two-moons", "digits"])
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..k-1 of the data and the fits (default 3)")
    p.add_argument("--small", action="store_true", help="a smoke-test size (seconds, meaningless numbers)")
    p.add_argument(
        "--results-dir",
        default=None,
        metavar="DIR",
        help="write classification-two-moons.csv, classification-digits.csv and the figures here",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_sweep_arguments(p)
    args = p.parse_args(argv)
    opts = sweep_options(args)
    results = Path(args.results_dir) if args.results_dir else None
    if results is not None and not results.is_dir():
        p.error(f"--results-dir {args.results_dir!r} is not a directory")
    out = opts.pop("out_dir")
    torch.set_num_threads(1)
    pd.set_option("display.width", 200)
    status = 0
    seeds = range(args.seeds)
    for part in args.parts:
        t0 = time.perf_counter()
        sub = None if out is None else Path(out) / part
        if part == "two-moons":
            rows, sweep = two_moons_experiment(seeds, small=args.small, out_dir=sub, progress=not args.quiet, **opts)
            name, builders, figure = (
                "classification-two-moons",
                (two_moons_table, two_moons_paired_table),
                plot_two_moons_entropy,
            )
        else:
            rows, sweep = digits_experiment(seeds, small=args.small, out_dir=sub, progress=not args.quiet, **opts)
            name, builders, figure = (
                "classification-digits",
                (digits_table, digits_paired_table),
                plot_digits_reliability,
            )
        if not rows.empty:
            for build in builders:
                print(build([rows], [], {}), end="\n\n")
            if results is not None:
                rows.to_csv(results / f"{name}.csv", index=False)
                import matplotlib.pyplot as plt

                fig = figure(sweep, results / f"{name}.png")
                plt.close(fig)
        print(f"{part}: {time.perf_counter() - t0:.0f} s")
        status = max(status, report(sweep))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
