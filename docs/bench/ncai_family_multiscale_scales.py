"""Where ``knn-mi-multiscale`` goes quiet with dependence left (issue 37's family).

    python docs/bench/ncai_family_multiscale_scales.py [--problem 8] [--restart 1] [--steps 3000]

Refits one NCAI_lambda fit of the family benchmark with ``independence="knn-mi-multiscale"``
(:func:`pyro_bnnlv.reproduce.ncai_family.family_tasks`, ``compare``'s default budget; the task of
the committed store ``docs/results/sweeps/ncai-family-knn-mi-multiscale``, so its validation LL
must match the store's) and, on the fit's training means ``mu_z``, prints

* KSG ``I(x; mu_z)`` (:func:`~pyro_bnnlv.stats.ksg_mutual_information`, k = 3, 5, 10) and KSG
  with ``x`` permuted (its null);
* the k-NN estimate ``I_m`` of :func:`~pyro_bnnlv.stats.independence.knn_mutual_information` at
  neighbourhood sizes ``m`` = 8 ... 256 (mean and sd over ``--draws`` draws of the reference
  sets, 20 by default), and the same with ``x`` permuted;
* the term as trained (:func:`~pyro_bnnlv.stats.independence.multiscale_knn_mi`, sizes 8-64) and
  its cost per forward and backward pass with larger sizes added.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from pyro_bnnlv.datasets import load_dataset
from pyro_bnnlv.datasets.ncai_family import FAMILY
from pyro_bnnlv.reproduce.ncai_compare import CompareConfig, _fit_task
from pyro_bnnlv.reproduce.ncai_family import family_tasks
from pyro_bnnlv.stats.dependence import ksg_mutual_information
from pyro_bnnlv.stats.independence import knn_mutual_information, multiscale_knn_mi
from pyro_bnnlv.stats.latent import latent_means


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problem", type=int, default=8)
    p.add_argument("--restart", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="SVI steps (default: compare's, as the store)")
    p.add_argument("--draws", type=int, default=20, help="reference-set draws per estimate")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = CompareConfig(**({} if args.steps is None else {"steps": args.steps, "map_steps": args.steps}))
    data = load_dataset(FAMILY[args.problem].name)
    tasks = family_tasks([data.name], cfg, ["knn-mi-multiscale"], lambda_only=True)
    task = next(t for t in tasks if t.restart == args.restart)
    fit = _fit_task(task, cfg, data)
    x, valid_ll = data.x_train, fit.valid_ll
    mu = latent_means(fit.guide, x, data.y_train).detach()
    print(
        f"{data.name}, restart {args.restart}: n = {x.shape[0]}, x of {x.shape[1]} column(s), valid LL {valid_ll:.4f}"
    )
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    ksg = ", ".join(f"k={k} {ksg_mutual_information(x, mu, k=k):.3f}" for k in (3, 5, 10))
    print(f"KSG I(x; mu_z): {ksg}; x permuted (k=5) {ksg_mutual_information(x[perm], mu):.3f}")
    g = torch.Generator().manual_seed(1)
    for m in (8, 16, 32, 64, 128, 256):
        if m >= x.shape[0]:
            break
        est = [float(knn_mutual_information(x, mu, m=m, seed=s)) for s in range(args.draws)]
        null = [
            float(knn_mutual_information(x[torch.randperm(x.shape[0], generator=g)], mu, m=m, seed=s))
            for s in range(args.draws)
        ]
        print(
            f"m = {m:3d}: I_m {np.mean(est):+.3f} (sd {np.std(est):.3f}); "
            f"x permuted {np.mean(null):+.3f} (sd {np.std(null):.3f})"
        )
    torch.manual_seed(0)
    trained = [float(multiscale_knn_mi(x, mu)) for _ in range(min(5, args.draws))]
    print(f"knn-mi-multiscale as trained (sizes 8-64), {len(trained)} draws:", " ".join(f"{v:.3f}" for v in trained))
    leaf = mu.clone().requires_grad_(True)
    for sizes in ((8, 16, 32, 64), (8, 16, 32, 64, 128, 256)):
        multiscale_knn_mi(x, leaf, sizes).backward()
        t = time.perf_counter()
        for _ in range(min(10, args.draws)):
            multiscale_knn_mi(x, leaf, sizes).backward()
        ms = 1e3 * (time.perf_counter() - t) / min(10, args.draws)
        print(f"sizes {sizes}: {ms:.1f} ms per forward and backward")


if __name__ == "__main__":
    main()
