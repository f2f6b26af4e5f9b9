"""Where NCAI_0 loses to mean-field VI on a heavy-tailed family problem (issue 37).

    python docs/bench/ncai_family_heavy_tails.py [--problem 14] [--restart 1] [--steps 3000]

Refits BNN+LV MFVI and NCAI_0 (mean-field VI from NCAI's initialisation) on one problem of the
family benchmark (:func:`pyro_bnnlv.reproduce.ncai_compare.compare_tasks`, ``compare``'s default
budget: the tasks of the committed store ``docs/results/sweeps/ncai-family``, so their validation
LL must match the store's) and prints, per fit, the test LL, quantiles of the per-point test LL
(``compare``'s test predictive: ``CompareConfig``'s 500 weight samples x 64 latent draws, its
seed) and the spread of the latent means and of ``f`` over the latent prior; then the per-point
difference NCAI_0 minus MFVI by how far ``y`` lies from its mean, and the share of the total
difference that the 5% most extreme test points carry.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from pyro_bnnlv.datasets import load_dataset
from pyro_bnnlv.datasets.ncai_family import FAMILY
from pyro_bnnlv.posterior import sample_posterior
from pyro_bnnlv.reproduce.ncai_compare import CompareConfig, _fit_task, compare_tasks
from pyro_bnnlv.stats.latent import latent_means
from pyro_bnnlv.stats.predictive import mixture_log_density, predictive_chunks

METHODS = ("BNN+LV (MFVI)", "BNN+LV (NCAI_0)")


def per_point_test_ll(fit, data, cfg: CompareConfig) -> tuple[torch.Tensor, float]:
    """The test LL of each test point under the fit's predictive (as ``evaluate`` computes it),
    and the latent pathway's reach: the standard deviation of ``f(x, z*)`` over the ``cfg.latent_draws`` latent
    draws ``z*`` of one weight sample, averaged over weight samples and test points."""
    M, seed = cfg.latent_draws, cfg.seed
    s = sample_posterior(fit.model, fit.guide, data.x_train, data.y_train, num_samples=cfg.num_samples, seed=seed)
    parts, spread = [], []
    for rows, loc, scale in predictive_chunks(fit.model, s, data.x_test, latent_draws=M, seed=seed):
        parts.append(mixture_log_density(data.y_test[rows].reshape(-1, 1), loc, scale))
        spread.append(loc.reshape(-1, M, loc.shape[1]).std(1).mean(0))  # rows s * M + m: sample s
    return torch.cat(parts), float(torch.cat(spread).mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problem", type=int, default=14)
    p.add_argument("--restart", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="SVI steps (default: compare's, as the store)")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = CompareConfig(**({} if args.steps is None else {"steps": args.steps, "map_steps": args.steps}))
    data = load_dataset(FAMILY[args.problem].name)
    tasks = {t.method: t for t in compare_tasks(data.name, cfg) if t.restart == args.restart}
    lls = {}
    for method in METHODS:
        fit = _fit_task(tasks[method], cfg, data)
        ll, spread = per_point_test_ll(fit, data, cfg)
        lls[method] = ll = ll.numpy()
        mu = latent_means(fit.guide, data.x_train, data.y_train)
        q = ", ".join(f"{v:.2f}" for v in np.quantile(ll, [0.01, 0.05, 0.5, 0.95]))
        print(
            f"{method}: valid LL {fit.valid_ll:.3f}, test LL {ll.mean():.3f}, per-point quantiles "
            f"(1%, 5%, 50%, 95%) {q}; sd of mu_z {float(mu.std()):.3f}; sd of f over z* {spread:.3f}; "
            f"noise sd {float(fit.model.noise_scale):.3f}"
        )
    diff = lls[METHODS[1]] - lls[METHODS[0]]
    order = np.argsort(np.abs(data.y_test.reshape(-1).numpy() - float(data.y_test.mean())))
    n = len(order)
    for lo, hi in ((0.0, 0.5), (0.5, 0.9), (0.9, 0.99), (0.99, 1.0)):
        part = diff[order[int(lo * n) : max(int(hi * n), int(lo * n) + 1)]]
        print(f"|y - mean| in quantiles {lo:.2f}-{hi:.2f}: NCAI_0 minus MFVI {part.mean():+.3f} per point")
    extreme = diff[order[-max(1, n // 20) :]].sum() / diff.sum()
    print(f"total {diff.mean():+.3f} per point; share of the total from the 5% most extreme points: {extreme:.2f}")


if __name__ == "__main__":
    main()
