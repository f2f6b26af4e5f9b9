"""Why the hypernet guides of hyvi-uci are overconfident: the k-NN KL, used as a training
objective, rewards a guide wider than the prior.

    python docs/bench/knn_kl_width.py estimator [--split 0] [--out docs/results/knn-kl-width-estimator.csv]
    python docs/bench/knn_kl_width.py fits [--splits 0 1] [--store DIR] [--stop-after H] [--out docs/results/knn-kl-width-fits.csv]

The estimator is Pequignot et al. (2020)'s eq. 4 (Perez-Cruz 2008;
:func:`pyro_bnnlv.stats.knn.knn_kl`) at hyvi-uci's paper settings: boston, a
1x50 ReLU network (d = 751 weights), prior N(0, 0.5 I), 500 guide and 500 prior draws, k = 1.

``estimator``: fit MFVI (App. E's protocol, as ``reproduce hyvi-uci --paper`` does, split
``--split``), then compare the exact ``KL(q || p)`` of its mean-field guide with the k-NN
estimate (20 independent pairs of 500 + 500 draws) at ``q`` and at ``q`` with every standard
deviation scaled by 0.25 ... 4.

``fits``: the ablation. The same data, network, schedule (App. E: Adam 0.005 decayed by 0.7
after a plateau, patience 60 epochs for mean-field guides, 30 for hypernets), 100 particles:

* ``MFVI``: AutoNormal, the KL in closed form (``TraceMeanField_ELBO``);
* ``NN-MFVI``: the same AutoNormal guide trained with NN-HyVI's k-NN KL (``KNNElbo``);
* ``NN-HyVI``, ``FuNN-HyVI``: the hypernet guides as in ``reproduce hyvi-uci --paper``.

Per fit: the learned noise sd (standardised scale), test RMSE and LL (1,000 draws), the guide's
marginal sd per weight relative to the prior's (median over the 751 weights, and the share
of weights wider than the prior), the k-NN estimate of ``KL(q || p)`` at the fitted guide (mean
of 10 pairs of 500 + 500 draws) and, for mean-field guides, the exact KL. Each fit is a task of
:func:`pyro_bnnlv.sweep.run_sweep` (resumable store ``--store``; one worker).
"""

from __future__ import annotations

import argparse
import time

import pandas as pd
import pyro
import torch

from pyro_bnnlv.datasets import load_split
from pyro_bnnlv import sample_posterior
from pyro_bnnlv.infer import KNNElbo, fit_svi, input_box
from pyro_bnnlv.infer.svi import PlateauSchedule, set_seed
from pyro_bnnlv.models import BNN
from pyro_bnnlv.nets import MLP
from pyro_bnnlv.reproduce.hyvi import PRIOR_SCALE, _guide, _loss
from pyro_bnnlv.stats.knn import knn_kl
from pyro_bnnlv.stats.predictive import evaluate
from pyro_bnnlv.sweep import Task, run_sweep

METHODS = ("MFVI", "NN-MFVI", "NN-HyVI", "FuNN-HyVI")


def _setup(split: int):
    set_seed(split)
    data = load_split("boston", split, valid_fraction=0.0)
    model = BNN(
        MLP(data.input_dim, [50], 1, activation="relu"), prior_scale=PRIOR_SCALE, noise_scale=0.5, learn_noise=True
    )
    return data, model


def _fit(method: str, split: int, steps: int = 200_000):
    """``(data, model, guide, steps run)``: hyvi-uci's paper protocol for ``method``."""
    data, model = _setup(split)
    x, y = data.x_train, data.y_train
    guide = _guide("MFVI" if method == "NN-MFVI" else method, model, split)
    loss = (
        KNNElbo(num_particles=100, num_kl_samples=500, num_prior_samples=500)
        if method == "NN-MFVI"
        else _loss(method, input_box(x), 200, 100, 500)
    )
    plateau = PlateauSchedule(patience=60 if method.endswith("MFVI") else 30)
    hist = fit_svi(
        model,
        guide,
        x,
        y,
        num_steps=steps,
        lr=0.005,
        batch_size=50,
        seed=split,
        loss=loss,
        progress=False,
        lr_schedule=plateau,
    )
    return data, model, guide, len(hist)


def _knn_kl(q_draws: torch.Tensor, pairs: int, g: torch.Generator) -> list[float]:
    d = q_draws.shape[-1]
    out = []
    for _ in range(pairs):
        idx = torch.randperm(len(q_draws), generator=g)[:500]
        out.append(float(knn_kl(q_draws[idx], PRIOR_SCALE * torch.randn(500, d, generator=g))))
    return out


def estimator_table(split: int = 0, pairs: int = 20) -> pd.DataFrame:
    with pyro.get_param_store().scope():
        _, _, guide, _ = _fit("MFVI", split)
        loc, scale = guide.locs.w.detach().clone(), guide.scales.w.detach().clone()
    prior = torch.distributions.Normal(torch.zeros_like(loc), PRIOR_SCALE)
    g = torch.Generator().manual_seed(1)
    rows = []
    d = loc.numel()
    for factor in (0.25, 0.5, 1.0, 2.0, 4.0):
        q = torch.distributions.Normal(loc, scale * factor)
        est = torch.tensor(
            [
                float(
                    knn_kl(
                        loc + factor * scale * torch.randn(500, d, generator=g),
                        PRIOR_SCALE * torch.randn(500, d, generator=g),
                    )
                )
                for _ in range(pairs)
            ]
        )
        rows.append(
            {
                "sd_factor": factor,
                "exact_kl": float(torch.distributions.kl_divergence(q, prior).sum()),
                "knn_kl_mean": float(est.mean()),
                "knn_kl_sd": float(est.std()),
            }
        )
    return pd.DataFrame(rows)


def fit_task(task: Task) -> dict[str, float]:
    """One fit of the ablation and its diagnostics (module docstring); ``task.grid`` may cap the
    steps (``{"steps": n}``, for tests)."""
    t0 = time.perf_counter()
    split = int(task.split)
    with pyro.get_param_store().scope():
        data, model, guide, steps = _fit(task.method, split, int(task.params.get("steps", 200_000)))
        w = sample_posterior(model, guide, data.x_train, num_samples=1000, seed=split)["w"]
        exact = float("nan")
        if task.method.endswith("MFVI"):
            q = torch.distributions.Normal(guide.locs.w.detach(), guide.scales.w.detach())
            exact = float(torch.distributions.kl_divergence(q, torch.distributions.Normal(0.0, PRIOR_SCALE)).sum())
    m = evaluate(model, {"w": w}, data.x_test, data.y_test, y_mean=data.y_mean, y_std=data.y_std)
    ratio = w.std(0) / PRIOR_SCALE
    est = _knn_kl(w, 10, torch.Generator().manual_seed(split))
    return {
        "noise_scale": float(torch.as_tensor(model.noise_scale).detach()),
        "rmse": float(m["rmse"]),
        "test_ll": float(m["test_ll"]),
        "sd_ratio_median": float(ratio.median()),
        "share_wider_than_prior": float((ratio > 1).float().mean()),
        "knn_kl": sum(est) / len(est),
        "exact_kl": exact,
        "steps_run": float(steps),
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="part", required=True)
    e = sub.add_parser("estimator")
    e.add_argument("--split", type=int, default=0)
    e.add_argument("--out", default=None)
    f = sub.add_parser("fits")
    f.add_argument("--splits", type=int, nargs="+", default=[0, 1])
    f.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    f.add_argument("--store", default="docs/results/sweeps/knn-kl-width")
    f.add_argument("--stop-after", type=float, default=None, help="hours after which no fit starts")
    f.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.part == "estimator":
        table = estimator_table(args.split)
        print(table.to_string(index=False))
    else:
        tasks = [Task("boston", method=m, split=s, seed=s) for s in args.splits for m in args.methods]
        table = run_sweep(
            tasks,
            fit_task,
            out_dir=args.store,
            executor="inline",
            code_version="knn-kl-width-1",
            stop_after=None if args.stop_after is None else 3600 * args.stop_after,
            desc="knn-kl-width",
        )
        columns = [
            "split",
            "method",
            "status",
            "noise_scale",
            "rmse",
            "test_ll",
            "sd_ratio_median",
            "share_wider_than_prior",
            "knn_kl",
            "exact_kl",
            "steps_run",
            "seconds",
        ]
        print(table[[c for c in columns if c in table]].to_string(index=False))
        table = table[table["status"] == "done"][[c for c in columns if c in table and c != "status"]]
    if args.out:
        table.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
