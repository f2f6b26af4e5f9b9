"""UCI standard splits and gap splits: MAP, MFVI, linearised and sampled Laplace (Tables 1-2).

Foong, Li, Hernández-Lobato & Turner (2019), arXiv:1906.11537, sec. 3 and App. D, one hidden
layer of 50 tanh units, inputs and targets standardised with training statistics, test
log-likelihood on the original scale. Per split:

* **MAP**: Adam on the weights and ``log sigma^2`` jointly (``N(0, omega^2)`` prior on all weights,
  ``omega = 1``; ``log sigma^2`` initialised to -1 and learned by maximum likelihood, App. D),
  full batch; the number of steps is chosen by validation log-likelihood (checked every 50 steps,
  the best kept), standing in for the paper's grid over epochs. Predictive ``N(f(x; w*), sigma^2)``.
* **LL**: :class:`~pyro_bnnlv.infer.LinearizedLaplace` (full GGN) around the MAP network, with the
  prior factor and ``sigma`` chosen by the Laplace marginal likelihood (``LL``, the library
  default) and, separately, by validation log-likelihood (``LL-valid``, the paper's protocol).
* **SL**: sampled Laplace: 100 draws from the ``LL`` Gaussian (App. D: 100 samples), Monte-Carlo
  predictive (eq. 1).
* **MFVI**: ``AutoNormal`` on a BNN with ``N(0, 1)`` priors and learned noise (App. D), minibatches
  of 100, Adam 0.01; 100 posterior samples for the predictive. ``--mfvi short`` (default): a
  fixed 4,000 steps, one particle, initial scales 0.01. ``--mfvi paper``: App. D's settings
  (32 particles, initial variances 1e-5, 1,000 epochs for the small sets, 100 for the large;
  one point of the paper's grid, no retraining on train+validation). The paper's catastrophic
  MFVI failures on the energy/naval gap splits need the paper's settings: the short budget
  gives a less confident MFVI that fails far less.

Data sets: the paper's nine (boston, concrete, energy, kin8nm, naval, power, protein, wine,
yacht); ``--hidden-layers 2`` gives the paper's 2HL tanh rows (two layers of 50).

Deviations from App. D (to fit two CPU cores): a fixed step budget and no grid search or
retraining on train+validation for MFVI; MAP's epoch grid replaced by validation early stopping;
one prior scale (``omega = 1``) for MAP; optionally a subset of the standard splits
(``--standard-splits``; protein has 5, the others 20).

``--protocol app-d`` runs MAP and both Laplace predictives as App. D states them instead (grid
search on validation, refit on train + validation, minibatch training of the grid's length:
:mod:`pyro_bnnlv.reproduce.app_d`).

Commands (the numbers in the README)::

    pyro-bnnlv reproduce in-between --standard-splits 20 --output docs/results/in-between-uci-1hl.csv
    pyro-bnnlv reproduce in-between --hidden-layers 2 --standard-splits 5 --output docs/results/in-between-uci-2hl.csv
    pyro-bnnlv reproduce in-between --methods MFVI --mfvi paper --standard-splits 5 --output docs/results/in-between-uci-1hl-mfvi-paper.csv
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import torch
from pyro.infer.autoguide import AutoNormal

from .._warning_tally import WarningTally
from ..datasets import Dataset, default_data_dir, gap_split, load_dataset
from ..datasets.files import uci_num_splits
from ..guides import init_to_network
from ..param_names import own_param_names
from ..infer.elbos.fused import FusedTraceElbo
from ..infer.laplace.linearized import LinearizedLaplace
from ..posterior import sample_posterior
from ..infer.svi import fit_svi, set_seed
from ..models.bnn import BNN
from ..nets import MLP
from ..stats.predictive import evaluate
from .app_d import app_d_map_laplace
from ..sweep import Task, run_sweep, task_function
from ..sweep.cli import add_sweep_arguments, report, sweep_options
from .timing import median_ms
from . import tables

__all__ = ["DATASETS", "PAPER_LL", "fit_map_learned_noise", "run_split", "split_task", "summary", "uci_table"]

DATASETS = ("boston", "concrete", "energy", "kin8nm", "naval", "power", "protein", "wine", "yacht")
METHODS = ("MAP", "MFVI", "LL", "LL-valid", "SL")


def _row(*values: float) -> dict[str, float]:
    return dict(zip(DATASETS, values))


#: the paper's Tables 1-2 (tanh): mean test log-likelihood per hidden-layer count, split kind,
#: method and data set
PAPER_LL = {
    1: {
        "standard": {
            "MAP": _row(-2.69, -3.22, -1.12, 1.15, 5.48, -2.85, -2.92, -0.99, -2.51),
            "MFVI": _row(-2.61, -3.12, -0.82, 1.10, 5.79, -2.86, -2.93, -0.97, -1.32),
            "LL": _row(-2.57, -3.05, -0.82, 1.23, 6.40, -2.83, -2.89, -0.97, -1.01),
            "SL": _row(-2.85, -3.27, -2.77, 1.15, 3.19, -3.41, -2.90, -1.01, -3.75),
        },
        "gap": {
            "MAP": _row(-2.90, -3.64, -104.53, 1.09, -260.25, -2.89, -3.08, -0.97, -2.63),
            "MFVI": _row(-2.88, -3.64, -100.16, 1.01, -385.33, -2.88, -3.08, -0.96, -1.77),
            "LL": _row(-2.79, -3.53, -6.49, 1.14, -15.66, -2.89, -3.09, -0.96, -1.33),
            "SL": _row(-3.03, -3.67, -14.08, 1.06, 2.20, -3.45, -3.08, -1.00, -3.95),
        },
    },
    2: {
        "standard": {
            "MAP": _row(-2.80, -3.33, -0.86, 1.24, 5.72, -2.81, -2.83, -0.99, -2.22),
            "MFVI": _row(-2.70, -3.20, -1.60, 1.19, 6.08, -2.87, -2.88, -0.98, -1.87),
            "LL": _row(-2.40, -3.07, -0.65, 1.29, 6.29, -2.79, -2.79, -0.98, -0.92),
            "SL": _row(-2.82, -3.29, -2.67, 1.26, 3.80, -3.23, -2.79, -1.07, -3.63),
        },
        "gap": {
            "MAP": _row(-2.91, -3.68, -113.12, 1.13, -219.61, -2.90, -3.08, -0.97, -2.27),
            "MFVI": _row(-2.92, -3.60, -29.98, 1.10, -205.93, -2.88, -3.07, -1.01, -1.87),
            "LL": _row(-2.75, -3.43, -6.34, 1.22, -20.76, -2.90, -3.13, -1.01, -1.45),
            "SL": _row(-3.01, -3.62, -17.17, 1.20, -51.99, -3.36, -3.11, -1.12, -3.61),
        },
    },
}

_LOG2PI = math.log(2 * math.pi)


def fit_map_learned_noise(
    net: MLP,
    data: Dataset,
    *,
    num_steps: int = 2000,
    lr: float = 0.01,
    prior_scale: float = 1.0,
    eval_every: int = 50,
    seed: int = 0,
) -> tuple[torch.Tensor, float, int]:
    """MAP weights and maximum-likelihood ``sigma`` (App. D), early-stopped on validation LL.

    Maximises ``(log p(y | w, sigma) + log p(w)) / N`` by full-batch Adam over ``w`` and
    ``log sigma^2`` (initialised at -1); every ``eval_every`` steps the validation log-likelihood
    of ``N(f(x; w), sigma^2)`` is computed and the best ``(w, sigma)`` kept. Returns
    ``(w, sigma, step)``.
    """
    set_seed(seed)
    x, y, xv, yv = data.x_train, data.y_train, data.x_valid, data.y_valid
    w = torch.nn.Parameter(net.init_weights(torch.Generator().manual_seed(seed)))
    log_s2 = torch.nn.Parameter(torch.tensor(-1.0))
    opt = torch.optim.Adam([w, log_s2], lr=lr)
    N = len(x)
    best = (-math.inf, w.detach().clone(), math.exp(-0.5), 0)
    for step in range(1, num_steps + 1):
        f = net(x, w)[:, 0]
        nll = 0.5 * ((y - f).square() / log_s2.exp() + log_s2 + _LOG2PI).sum()
        loss = (nll + 0.5 * (w / prior_scale).square().sum()) / N
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % eval_every == 0 or step == num_steps:
            with torch.no_grad():
                s2 = log_s2.exp()
                fv = net(xv, w)[:, 0]
                ll = float((-0.5 * ((yv - fv).square() / s2 + s2.log() + _LOG2PI)).mean())
            if math.isfinite(ll) and (ll > best[0] or len(xv) == 0):
                best = (ll, w.detach().clone(), float(s2.sqrt()), step)
    return best[1], best[2], best[3]


def _gaussian_metrics(mean: torch.Tensor, var: torch.Tensor, data: Dataset) -> float:
    """Test LL of ``N(mean, var)`` on the original scale."""
    y = data.y_test.double()
    ll = -0.5 * ((y - mean.double()).square() / var.double() + var.double().log() + _LOG2PI)
    return float(ll.mean() - math.log(float(data.y_std)))


def run_split(
    data: Dataset,
    *,
    map_steps: int = 2000,
    vi_steps: int = 4000,
    batch_size: int = 100,
    num_samples: int = 100,
    seed: int = 0,
    methods: Sequence[str] = METHODS,
    hidden_layers: int = 1,
    mfvi: str = "short",
    protocol: str = "default",
    laplace_prior: str = "as-stated",
) -> dict[str, float]:
    """Test log-likelihood (original scale) of each method on one split; also seconds per method.

    ``hidden_layers``: 1 or 2 hidden layers of 50 tanh units (the paper's 1HL / 2HL rows).
    ``mfvi``: ``"short"`` (``vi_steps`` steps, one particle, initial scales 0.01) or ``"paper"``
    (App. D: 32 vectorised particles, initial variances 1e-5, 1,000 epochs of minibatches of 100
    for sets under 2,000 training points and 100 epochs for the larger ones, Adam 0.01).
    MAP is fitted only when a MAP or Laplace method is asked for. ``protocol="app-d"``: MAP, LL
    and SL by App. D's grid search and refit (:func:`~pyro_bnnlv.reproduce.app_d.app_d_map_laplace`;
    ``LL-valid`` is then not run: the grid chooses every method's prior; ``laplace_prior`` goes to it)."""
    if hidden_layers not in (1, 2):
        raise ValueError(f"hidden_layers must be 1 or 2 (the paper's networks), got {hidden_layers!r}")
    if mfvi not in ("short", "paper"):
        raise ValueError(f"mfvi must be 'short' or 'paper', got {mfvi!r}")
    if protocol not in ("default", "app-d"):
        raise ValueError(f"protocol must be 'default' or 'app-d', got {protocol!r}")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; expected a subset of {list(METHODS)}")
    hidden = [50] * hidden_layers
    out: dict[str, float] = {}
    if protocol == "app-d":
        laplace = tuple(m for m in ("MAP", "LL", "SL") if m in methods)
        if laplace:
            t = time.perf_counter()
            with WarningTally() as tally:
                out.update(
                    app_d_map_laplace(
                        data,
                        hidden_layers=hidden_layers,
                        methods=laplace,
                        num_samples=num_samples,
                        seed=seed,
                        laplace_prior=laplace_prior,
                    )
                )
            out["sec_app_d"] = time.perf_counter() - t
            out["warnings"] = tally.summary()
        methods = [m for m in methods if m == "MFVI"]
    D = data.input_dim
    kwargs = dict(y_mean=data.y_mean, y_std=data.y_std)
    if any(m in methods for m in ("MAP", "LL", "SL", "LL-valid")):
        t = time.perf_counter()
        net = MLP(D, hidden, 1, activation="tanh")
        w, sigma, step = fit_map_learned_noise(net, data, num_steps=map_steps, seed=seed)
        with torch.no_grad():
            f = net(data.x_test, w)[:, 0]
        out["MAP"] = _gaussian_metrics(f, torch.full_like(f, sigma**2), data)
        out["map_step"] = step
        out["sec_MAP"] = time.perf_counter() - t
        model = BNN(net, prior_scale=1.0, noise_scale=sigma)
    if any(m in methods for m in ("LL", "SL", "LL-valid")):
        with WarningTally() as tally:  # jitter and grid-edge warnings: counted in the row, shown once
            t = time.perf_counter()
            la = LinearizedLaplace(model, w).fit(data.x_train, data.y_train)
            la.optimize_hyperparameters("marglik")
            out["LL"] = float(la.evaluate(data.x_test, data.y_test, **kwargs)["test_ll"])
            out["sec_LL"] = time.perf_counter() - t
            if "LL-valid" in methods:
                lv = LinearizedLaplace(model, w).fit(data.x_train, data.y_train)
                lv.optimize_hyperparameters("validation", x_valid=data.x_valid, y_valid=data.y_valid)
                out["LL-valid"] = float(lv.evaluate(data.x_test, data.y_test, **kwargs)["test_ll"])
            if "SL" in methods:
                t = time.perf_counter()
                sl_model = la.to_model()
                samples = sample_posterior(sl_model, la.as_guide(), data.x_train, num_samples=num_samples, seed=seed)
                out["SL"] = float(evaluate(sl_model, samples, data.x_test, data.y_test, **kwargs)["test_ll"])
                out["sec_SL"] = time.perf_counter() - t
        out["warnings"] = tally.summary()
    if "MFVI" in methods:
        out.update(
            _mfvi(data, hidden, mfvi=mfvi, vi_steps=vi_steps, batch_size=batch_size, num_samples=num_samples, seed=seed)
        )
    return out


def _mfvi(
    data: Dataset, hidden: list[int], *, mfvi: str, vi_steps: int, batch_size: int, num_samples: int, seed: int
) -> dict[str, float]:
    """:func:`run_split`'s MFVI (``mfvi``: ``"short"`` or App. D's ``"paper"``, as there): its test
    log-likelihood on the original scale (``"MFVI"``) and seconds (``"sec_MFVI"``)."""
    t = time.perf_counter()
    vnet = MLP(data.input_dim, hidden, 1, activation="tanh")
    vmodel = BNN(vnet, prior_scale=1.0, noise_scale=math.exp(-0.5), learn_noise=True)
    n_train = len(data.x_train)
    bs = None if n_train <= batch_size else batch_size
    paper = mfvi == "paper"
    guide = own_param_names(
        AutoNormal(
            vmodel, init_scale=math.sqrt(1e-5) if paper else 1e-2, init_loc_fn=init_to_network(vmodel, seed=seed)
        )
    )
    if paper:
        epochs = 1000 if n_train < 2000 else 100
        steps = epochs * math.ceil(n_train / batch_size)
        loss = FusedTraceElbo(num_particles=32, vectorize_particles=True)  # Trace_ELBO's estimator, no JIT
    else:
        steps, loss = vi_steps, None
    fit_svi(
        vmodel,
        guide,
        data.x_train,
        data.y_train,
        num_steps=steps,
        lr=0.01,
        batch_size=bs,
        seed=seed,
        progress=False,
        loss=loss,
    )
    samples = sample_posterior(vmodel, guide, data.x_train, num_samples=num_samples, seed=seed)
    metrics = evaluate(vmodel, samples, data.x_test, data.y_test, y_mean=data.y_mean, y_std=data.y_std)
    return {"MFVI": float(metrics["test_ll"]), "sec_MFVI": time.perf_counter() - t}


#: the tasks of one split: MAP and the Laplace methods built on it, and MFVI (independent of MAP)
TASK_METHODS = {"MAP+Laplace": ("MAP", "LL", "LL-valid", "SL"), "MFVI": ("MFVI",)}


@task_function("in-between/split")
def split_task(task: Task, *, methods: Sequence[str] = METHODS, **options) -> dict[str, float]:
    """One task of :func:`uci_table`: the methods of ``TASK_METHODS[task.method]`` (those also in
    ``methods``) on standard split ``task.split`` or, with ``grid={"kind": "gap"}``, gap split
    ``task.split`` (input dimension) of ``task.dataset``; ``options`` go to :func:`run_split`."""
    kind = task.params.get("kind")
    if kind == "standard":
        data = load_dataset(task.dataset, split=int(task.split))
    elif kind == "gap":
        data = gap_split(load_dataset(task.dataset, split=0), int(task.split))
    else:
        raise ValueError(f"task grid kind must be 'standard' or 'gap', got {kind!r}")
    chosen = [m for m in TASK_METHODS[task.method] if m in methods]
    return run_split(data, seed=task.seed, methods=chosen, **options)


def uci_table(
    datasets: Sequence[str] = DATASETS,
    *,
    standard_splits: Sequence[int] = (0, 1, 2),
    gap: bool = True,
    max_gap_dims: int | None = None,
    progress: bool = True,
    seed: int = 0,
    methods: Sequence[str] = METHODS,
    out_dir: str | Path | None = None,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    code_version: str | None = None,
    threads: int = 1,
    stop_after: float | None = None,
    **options,
) -> pd.DataFrame:
    """Run :func:`run_split` on the standard splits and the gap splits; one row per split.

    Standard splits a data set does not have (protein has 5, the others 20) are skipped. Each
    split is up to two tasks of :func:`pyro_bnnlv.sweep.run_sweep` (MAP with the Laplace methods,
    and MFVI), run in parallel and resumable with ``out_dir`` (``executor``, ``workers``,
    ``address``, ``code_version``, ``threads`` go to it); the rows are merged from the store."""
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; expected a subset of {list(METHODS)}")
    groups = [g for g, ms in TASK_METHODS.items() if set(ms) & set(methods)]
    tasks = []
    for name in datasets:
        splits = [("standard", int(s)) for s in standard_splits if int(s) < uci_num_splits(name)]
        if gap:
            dims = load_dataset(name, split=0).input_dim
            splits += [("gap", d) for d in range(dims if max_gap_dims is None else min(dims, max_gap_dims))]
        tasks += [Task(name, method=g, split=s, grid={"kind": kind}, seed=seed) for kind, s in splits for g in groups]
    fn = functools.partial(split_task, methods=tuple(methods), **options)
    sweep = run_sweep(
        tasks,
        fn,
        out_dir=out_dir,
        executor=executor,
        workers=workers,
        address=address,
        code_version=code_version,
        threads=threads,
        progress=progress,
        desc="in-between",
        stop_after=stop_after,
    )
    key = ["dataset", "kind", "split"]
    results = sweep.drop(columns=["task_id", "method", "restart", "seed", "task_seconds", "attempts", "error"])
    table = results.groupby(key, sort=False).first().reset_index()  # the two tasks of a split -> one row
    table["status"] = (
        results.groupby(key, sort=False)["status"]
        .agg(lambda v: "done" if (v == "done").all() else "failed" if (v == "failed").any() else "pending")
        .to_numpy()
    )
    table = table[key + [c for c in table.columns if c not in key and c != "status"] + ["status"]]
    table.attrs = dict(sweep.attrs)
    return table


def summary(table: pd.DataFrame, hidden_layers: int = 1) -> pd.DataFrame:
    """Mean +- standard error of the test LL per (kind, dataset, method), beside the paper's."""
    rows = []
    for (kind, name), g in table.groupby(["kind", "dataset"], sort=False):
        for m in METHODS:
            if m not in g:
                continue
            v = g[m].astype(float).dropna()  # a failed or pending split has no value
            se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")
            paper = PAPER_LL[hidden_layers][kind].get("LL" if m == "LL-valid" else m, {}).get(name, float("nan"))
            rows.append(
                dict(kind=kind, dataset=name, method=m, n_splits=len(v), mean=float(v.mean()), se=se, paper=paper)
            )
    return pd.DataFrame(rows)


def _laplace_prior_option(laplace_prior: str) -> dict[str, str]:
    """``{"laplace_prior": ...}`` unless it is the default, ``"as-stated"``: the option came after
    the first App. D stores, whose task functions were recorded without it, so leaving the default
    out keeps rerunning their commands a read of the committed stores."""
    return {} if laplace_prior == "as-stated" else {"laplace_prior": laplace_prior}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pyro-bnnlv reproduce in-between", description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="*", default=list(DATASETS))
    p.add_argument("--standard-splits", type=int, default=3, help="standard splits 0..k-1 (default 3)")
    p.add_argument("--no-gap", action="store_true")
    p.add_argument("--max-gap-dims", type=int, default=None, help="gap splits per data set (default all)")
    p.add_argument("--map-steps", type=int, default=2000)
    p.add_argument("--vi-steps", type=int, default=4000)
    p.add_argument(
        "--hidden-layers",
        type=int,
        default=1,
        choices=(1, 2),
        help="hidden layers of 50 tanh units (the paper's 1HL / 2HL rows)",
    )
    p.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS, help="methods to run (default all)")
    p.add_argument(
        "--mfvi",
        default="short",
        choices=("short", "paper"),
        help="MFVI budget: short (default) or the paper's App. D settings (slower)",
    )
    p.add_argument(
        "--protocol",
        default="default",
        choices=("default", "app-d"),
        help="MAP and Laplace: this module's defaults, or App. D's grid search on validation "
        "and refit on train + validation (pyro_bnnlv.reproduce.app_d)",
    )
    p.add_argument(
        "--laplace-prior",
        default="as-stated",
        choices=("as-stated", "fan-in"),
        help="with --protocol app-d: the Laplace posterior's prior, N(0, omega^2) on every parameter "
        "(App. D's UCI text) or N(0, omega^2 / fan-in) on the weights (its toy experiments)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads per task (default 1)")
    p.add_argument("--output", default=None, help="CSV of the per-split results")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_sweep_arguments(p)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    table = uci_table(
        args.datasets,
        standard_splits=range(args.standard_splits),
        gap=not args.no_gap,
        max_gap_dims=args.max_gap_dims,
        map_steps=args.map_steps,
        vi_steps=args.vi_steps,
        seed=args.seed,
        hidden_layers=args.hidden_layers,
        methods=args.methods,
        mfvi=args.mfvi,
        protocol=args.protocol,
        threads=args.threads,
        progress=not args.quiet,
        **_laplace_prior_option(args.laplace_prior),
        **sweep_options(args),
    )
    if args.output:
        table.to_csv(args.output, index=False)
    summ = summary(table, args.hidden_layers)
    wide = summ.assign(
        cell=[f"{m:.2f} ± {s:.2f} ({p:.2f})" for m, s, p in zip(summ["mean"], summ["se"], summ["paper"])]
    )
    print(wide.pivot_table(index=["kind", "method"], columns="dataset", values="cell", aggfunc="first").to_string())
    print(f"total {time.perf_counter() - t0:.0f} s")
    return report(table)


if __name__ == "__main__":
    raise SystemExit(main())


# ----------------------------------------------------------------------------------------------
# laplace: GGN Laplace fit + linearised predictive
# ----------------------------------------------------------------------------------------------
def _func_reference_laplace(
    net: MLP, x: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, sigma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain ``torch.func`` full-GGN Laplace, written out: Jacobians by ``vmap(jacrev)``,
    ``H = J^T J / sigma^2 + I``, Cholesky, predictive variance ``||C^{-1} J*^T||^2 + sigma^2``."""
    from torch.func import jacrev, vmap

    def f1(xi: torch.Tensor, ww: torch.Tensor) -> torch.Tensor:
        return net(xi.unsqueeze(0), ww).squeeze(0)

    jac = vmap(jacrev(f1, argnums=1), in_dims=(0, None))
    J = jac(x, w).reshape(-1, w.shape[0])
    H = J.T @ J / sigma**2 + torch.eye(w.shape[0], dtype=w.dtype)
    C = torch.linalg.cholesky(H)
    Js = jac(xs, w).reshape(-1, w.shape[0])
    var = torch.linalg.solve_triangular(C, Js.T, upper=False).square().sum(0) + sigma**2
    return net(xs, w), var


def laplace_bench(steps: int | None = None, rounds: int = 3, seed: int = 0) -> pd.DataFrame:
    """``pyro-bnnlv bench laplace``: Laplace fit + linearised predictive of a 1x50 tanh network.

    Cases: the two-cluster toy (100 training, 200 test points, 151 weights); 1,000 training and
    200 test points of the same 1-D problem; the largest UCI set in the data directory (protein,
    standard split 0: 37,041 training, 4,573 test points, 9 inputs, 551 weights). The weights are
    a fixed random draw (the cost does not depend on them). Contenders, interleaved in ``rounds``:

    * ``torch.func reference``: :func:`_func_reference_laplace` in float64 (and float32);
    * ``LinearizedLaplace`` full / diag / last-layer, float64 (the default), and full in float32:
      ``LinearizedLaplace(model, w, structure=...).fit(x, y).predictive(xs)``.

    ``steps`` timed repetitions per contender and round (default 50 on the small cases, 3 on
    protein); medians. Columns: ``ms``, ``ratio_to_func_ref`` (to the float64 reference, same
    case), ``curvature_floats`` (stored curvature: ``P^2``, ``P`` or ``K^2``) and
    ``jacobian_chunk_floats`` (the largest Jacobian block held at once).
    """

    torch.manual_seed(seed)
    cases = []
    for n in (100, 1000):
        data = load_dataset("clusters", seed=seed, sizes=(n, 10, 200))
        cases.append((f"clusters toy, N={n}", data.x_train, data.y_train, data.x_test, 50))
    if (default_data_dir() / "uci" / "protein-tertiary-structure").exists():
        data = load_dataset("protein", split=0)
        cases.append(("protein (largest UCI), N=%d" % len(data.x_train), data.x_train, data.y_train, data.x_test, 3))
    rows, attrs = [], {}
    for label, x, y, xs, default_steps in cases:
        n_steps = default_steps if steps is None else int(steps)
        net = MLP(x.shape[1], [50], 1, activation="tanh")
        w = net.init_weights(torch.Generator().manual_seed(seed))
        model = BNN(net, prior_scale=1.0, noise_scale=0.1)
        sigma = float(model.noise_scale)  # the float32 0.1 the model uses, so both sides agree
        P = net.num_weights
        x64, xs64, w64 = x.double(), xs.double(), w.double()
        contenders: dict[str, Callable[[], object]] = {
            "torch.func reference, full, float64": lambda: _func_reference_laplace(net, x64, xs64, w64, sigma),
            "torch.func reference, full, float32": lambda: _func_reference_laplace(net, x, xs, w, sigma),
            "LinearizedLaplace full (float64)": lambda: LinearizedLaplace(model, w).fit(x, y).predictive(xs),
            "LinearizedLaplace full, float32": lambda: (
                LinearizedLaplace(model, w, dtype=torch.float32).fit(x, y).predictive(xs)
            ),
            "LinearizedLaplace diag (float64)": lambda: (
                LinearizedLaplace(model, w, structure="diag").fit(x, y).predictive(xs)
            ),
            "LinearizedLaplace last_layer (float64)": lambda: (
                LinearizedLaplace(model, w, structure="last_layer").fit(x, y).predictive(xs)
            ),
        }
        times: dict[str, list[float]] = {k: [] for k in contenders}
        for _ in range(rounds):
            for name, fn in contenders.items():
                times[name].append(median_ms(fn, n_steps, warmup=5 if n_steps > 5 else 1))
        # equal answers: ours vs the reference
        _, v_ref = _func_reference_laplace(net, x64, xs64, w64, sigma)
        v_ours = LinearizedLaplace(model, w).fit(x, y).predictive(xs).var[:, 0]
        agree = float(((v_ours - v_ref).abs() / v_ref).max())
        ref = statistics.median(times["torch.func reference, full, float64"])
        la = LinearizedLaplace(model, w)
        K = 51
        chunk = {
            "full": min(len(x), la._chunk(1)) * P,
            "diag": min(len(x), la._chunk(1)) * P,
            "last_layer": min(len(x), 4_000_000 // K) * K,
        }
        for name in contenders:
            struct = "diag" if "diag" in name else "last_layer" if "last_layer" in name else "full"
            stored = {"full": P * P, "diag": P, "last_layer": K * K}[struct]
            work = len(x) * P if "reference" in name else chunk[struct]
            med = statistics.median(times[name])
            rows.append((label, name, med, med / ref, stored, work))
        attrs[f"max_rel_diff_var_vs_reference [{label}]"] = agree
    table = pd.DataFrame(
        rows, columns=["case", "contender", "ms", "ratio_to_func_ref", "curvature_floats", "jacobian_chunk_floats"]
    )
    table = table.set_index(["case", "contender"])
    table.attrs.update(attrs)
    return table


# --------------------------------------------------------------------------- results tables


_IB_LABELS = {
    "MAP": "MAP",
    "MFVI": "MFVI",
    "LL": "linearised Laplace",
    "LL-valid": "LL, validation hyper-params",
    "SL": "sampled Laplace",
}


def in_between_table(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """``pyro-bnnlv reproduce in-between --output CSV``: mean ± standard error of the test LL over
    the splits, the paper's Tables 1-2 in brackets (``hidden_layers=2``: its 2HL rows). One table
    per split kind; a CSV with a single method gives one table with a row per kind."""
    hidden = int(options.get("hidden_layers", 1))
    t = pd.concat(frames, ignore_index=True)
    summ = summary(t, hidden)
    datasets = list(summ["dataset"].drop_duplicates())
    methods = [m for m in METHODS if m in set(summ["method"])]
    kinds = list(summ["kind"].drop_duplicates())
    idx = summ.set_index(["kind", "method", "dataset"])

    def cell(kind: str, method: str, dataset: str) -> str:
        if (kind, method, dataset) not in idx.index:
            return ""
        r = idx.loc[(kind, method, dataset)]
        return tables.with_paper(tables.mean_se(r["mean"], r["se"]), r["paper"])

    def counts(kind: str) -> str:
        n = summ[(summ["kind"] == kind)].drop_duplicates("dataset").set_index("dataset")["n_splits"]
        return ", ".join(f"{d} {int(n[d])}" for d in datasets if d in n.index)

    if len(methods) == 1:
        (m,) = methods
        rows = []
        for kind in kinds:
            ns = set(summ[summ["kind"] == kind]["n_splits"])
            label = f"{kind} ({ns.pop()} splits)" if len(ns) == 1 else kind
            rows.append([label] + [cell(kind, m, d) for d in datasets])
        return f"splits: {'; '.join(f'{k} ({counts(k)})' for k in kinds)}\n\n" + tables.table(
            [f"{_IB_LABELS.get(m, m)}"] + datasets, rows
        )
    parts = []
    for kind in kinds:
        rows = [[_IB_LABELS.get(m, m)] + [cell(kind, m, d) for d in datasets] for m in methods]
        parts.append(f"{kind} splits ({counts(kind)})\n\n" + tables.table([""] + datasets, rows))
    return "\n\n".join(parts)


def protocol_paired_table(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """Two runs of ``reproduce in-between`` (first CSV: another protocol, e.g. ``--protocol
    app-d``; second: this module's default) paired by split: per set, split kind and method, the
    mean test LL of each over the splits both have, the paired difference (first minus second)
    with its standard error and the paired t-test's verdict (:func:`tables.paired_verdict`), and
    the paper's number (``hidden_layers=2``: its 2HL rows); ``label=NAME`` names the first run
    (default: its file name; "_" for a space, which marker options cannot hold)."""
    if len(frames) != 2:
        raise ValueError(
            f"the in-between-paired table compares two CSVs (another protocol, then the default); got {paths}"
        )
    hidden = int(options.get("hidden_layers", 1))
    label = options.get("label", Path(paths[0]).stem).replace("_", " ")
    both = frames[0].merge(frames[1], on=["dataset", "kind", "split"], suffixes=("_first", "_default"))
    methods = [m for m in ("MAP", "LL", "SL") if f"{m}_first" in both and f"{m}_default" in both]
    rows = []
    for (name, kind), g in both.groupby(["dataset", "kind"], sort=False):
        for m in methods:
            a, b = g[f"{m}_first"].astype(float), g[f"{m}_default"].astype(float)
            ok = a.notna() & b.notna()
            mean, se, n = tables.paired(a[ok], b[ok])
            if not n:
                continue
            paper = PAPER_LL[hidden][kind].get(m, {}).get(name, math.nan)
            rows.append(
                [
                    name,
                    kind,
                    m,
                    str(n),
                    tables.num(float(a[ok].mean())),
                    tables.num(float(b[ok].mean())),
                    tables.paired_text(mean, se, n, f"{label} better", "default better", style="+"),
                    tables.num(paper),
                ]
            )
    header = ["set", "splits", "method", "n", label, "default", f"{label} - default (SE), verdict", "paper"]
    return tables.table(header, rows)
