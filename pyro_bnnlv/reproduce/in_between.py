"""UCI standard splits and gap splits: MAP, MFVI, linearised and sampled Laplace (Tables 1-2).

``in-between-uncertainty-linearised-laplace.txt`` sec. 3 and App. D, one hidden layer of 50 tanh
units, inputs and targets standardised with training statistics, test log-likelihood on the
original scale. Per split:

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
  of 100, Adam 0.01, a fixed number of steps; 100 posterior samples for the predictive.

Deviations from App. D (to fit two CPU cores): a fixed step budget and no grid search or
retraining on train+validation for MFVI; MAP's epoch grid replaced by validation early stopping;
one prior scale (``omega = 1``) for MAP; a subset of the standard splits (``--standard-splits``).

Command (the numbers in the report)::

    python -m pyro_bnnlv.reproduce.in_between --output in_between_uci.csv
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from collections.abc import Sequence

import pandas as pd
import torch
from pyro.infer.autoguide import AutoNormal

from ..datasets import Dataset, gap_splits, load_dataset
from ..guides import init_to_network
from ..infer.laplace import LinearizedLaplace
from ..infer.predict import sample_posterior
from ..infer.svi import fit_svi, set_seed
from ..models.bnn import BNN
from ..nets import MLP
from ..stats.predictive import evaluate

__all__ = ["fit_map_learned_noise", "run_split", "uci_table", "DATASETS", "PAPER_LL"]

DATASETS = ("boston", "concrete", "energy", "naval", "wine", "yacht")
METHODS = ("MAP", "MFVI", "LL", "LL-valid", "SL")

#: the paper's Tables 1-2 (1 hidden layer, tanh): mean test log-likelihood
PAPER_LL = {
    "standard": {
        "MAP": dict(boston=-2.69, concrete=-3.22, energy=-1.12, naval=5.48, wine=-0.99, yacht=-2.51),
        "MFVI": dict(boston=-2.61, concrete=-3.12, energy=-0.82, naval=5.79, wine=-0.97, yacht=-1.32),
        "LL": dict(boston=-2.57, concrete=-3.05, energy=-0.82, naval=6.40, wine=-0.97, yacht=-1.01),
        "SL": dict(boston=-2.85, concrete=-3.27, energy=-2.77, naval=3.19, wine=-1.01, yacht=-3.75),
    },
    "gap": {
        "MAP": dict(boston=-2.90, concrete=-3.64, energy=-104.53, naval=-260.25, wine=-0.97, yacht=-2.63),
        "MFVI": dict(boston=-2.88, concrete=-3.64, energy=-100.16, naval=-385.33, wine=-0.96, yacht=-1.77),
        "LL": dict(boston=-2.79, concrete=-3.53, energy=-6.49, naval=-15.66, wine=-0.96, yacht=-1.33),
        "SL": dict(boston=-3.03, concrete=-3.67, energy=-14.08, naval=2.20, wine=-1.00, yacht=-3.95),
    },
}  # fmt: skip

_LOG2PI = math.log(2 * math.pi)


def fit_map_learned_noise(
    net: MLP, data: Dataset, *, num_steps: int = 2000, lr: float = 0.01, prior_scale: float = 1.0,
    eval_every: int = 50, seed: int = 0,
) -> tuple[torch.Tensor, float, int]:  # fmt: skip
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
    data: Dataset, *, map_steps: int = 2000, vi_steps: int = 4000, batch_size: int = 100,
    num_samples: int = 100, seed: int = 0, methods: Sequence[str] = METHODS,
) -> dict[str, float]:  # fmt: skip
    """Test log-likelihood (original scale) of each method on one split; also seconds per method."""
    out: dict[str, float] = {}
    D = data.input_dim
    kwargs = dict(y_mean=data.y_mean, y_std=data.y_std)
    t = time.perf_counter()
    net = MLP(D, [50], 1, activation="tanh")
    w, sigma, step = fit_map_learned_noise(net, data, num_steps=map_steps, seed=seed)
    with torch.no_grad():
        f = net(data.x_test, w)[:, 0]
    out["MAP"] = _gaussian_metrics(f, torch.full_like(f, sigma**2), data)
    out["map_step"] = step
    out["sec_MAP"] = time.perf_counter() - t
    model = BNN(net, prior_scale=1.0, noise_scale=sigma)
    if any(m in methods for m in ("LL", "SL", "LL-valid")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
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
                samples = sample_posterior(sl_model, la.as_guide(), data.x_train,
                                           num_samples=num_samples, seed=seed)  # fmt: skip
                out["SL"] = float(evaluate(sl_model, samples, data.x_test, data.y_test, **kwargs)["test_ll"])
                out["sec_SL"] = time.perf_counter() - t
    if "MFVI" in methods:
        t = time.perf_counter()
        vnet = MLP(D, [50], 1, activation="tanh")
        vmodel = BNN(vnet, prior_scale=1.0, noise_scale=math.exp(-0.5), learn_noise=True)
        guide = AutoNormal(vmodel, init_scale=1e-2, init_loc_fn=init_to_network(vmodel, seed=seed))
        bs = None if len(data.x_train) <= batch_size else batch_size
        fit_svi(vmodel, guide, data.x_train, data.y_train, num_steps=vi_steps, lr=0.01,
                batch_size=bs, seed=seed, progress=False)  # fmt: skip
        samples = sample_posterior(vmodel, guide, data.x_train, num_samples=num_samples, seed=seed)
        out["MFVI"] = float(evaluate(vmodel, samples, data.x_test, data.y_test, **kwargs)["test_ll"])
        out["sec_MFVI"] = time.perf_counter() - t
    return out


def uci_table(
    datasets: Sequence[str] = DATASETS, *, standard_splits: Sequence[int] = (0, 1, 2),
    gap: bool = True, max_gap_dims: int | None = None, progress: bool = True, **options,
) -> pd.DataFrame:  # fmt: skip
    """Run :func:`run_split` on the standard splits and the gap splits; one row per split."""
    rows = []
    for name in datasets:
        for s in standard_splits:
            data = load_dataset(name, split=int(s))
            res = run_split(data, **options)
            rows.append(dict(dataset=name, kind="standard", split=int(s), **res))
            if progress:
                print(_fmt(rows[-1]), flush=True)
        if gap:
            base = load_dataset(name, split=0)
            for d, data in enumerate(gap_splits(base)):
                if max_gap_dims is not None and d >= max_gap_dims:
                    break
                res = run_split(data, **options)
                rows.append(dict(dataset=name, kind="gap", split=d, **res))
                if progress:
                    print(_fmt(rows[-1]), flush=True)
    return pd.DataFrame(rows)


def _fmt(row: dict) -> str:
    vals = " ".join(f"{m}={row[m]:.2f}" for m in METHODS if m in row)
    return f"{row['dataset']:>9} {row['kind']:>8} {row['split']:>2}: {vals}"


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Mean +- standard error of the test LL per (kind, dataset, method), beside the paper's."""
    rows = []
    for (kind, name), g in table.groupby(["kind", "dataset"], sort=False):
        for m in METHODS:
            if m not in g:
                continue
            v = g[m].astype(float)
            se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")
            paper = PAPER_LL[kind].get("LL" if m == "LL-valid" else m, {}).get(name, float("nan"))
            rows.append(dict(kind=kind, dataset=name, method=m, n_splits=len(v), mean=float(v.mean()),
                             se=se, paper=paper))  # fmt: skip
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pyro-bnnlv reproduce in-between", description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="*", default=list(DATASETS))
    p.add_argument("--standard-splits", type=int, default=3, help="standard splits 0..k-1 (default 3)")
    p.add_argument("--no-gap", action="store_true")
    p.add_argument("--max-gap-dims", type=int, default=None, help="gap splits per data set (default all)")
    p.add_argument("--map-steps", type=int, default=2000)
    p.add_argument("--vi-steps", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", default=None, help="CSV of the per-split results")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    table = uci_table(args.datasets, standard_splits=range(args.standard_splits), gap=not args.no_gap,
                      max_gap_dims=args.max_gap_dims, map_steps=args.map_steps, vi_steps=args.vi_steps,
                      seed=args.seed)  # fmt: skip
    if args.output:
        table.to_csv(args.output, index=False)
    summ = summary(table)
    wide = summ.assign(cell=[f"{m:.2f} ± {s:.2f} ({p:.2f})" for m, s, p in zip(summ["mean"], summ["se"], summ["paper"])])
    print(wide.pivot_table(index=["kind", "method"], columns="dataset", values="cell", aggfunc="first").to_string())
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
