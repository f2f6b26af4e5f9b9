"""Where NCAI_0 loses to mean-field VI on a heavy-tailed family problem (issue 37).

    python docs/bench/ncai_family_heavy_tails.py [--problem 14] [--restart 1] [--steps 3000] [--num-samples 500]

Refits BNN+LV MFVI and NCAI_0 (mean-field VI from NCAI's initialisation) on one problem of the
family benchmark (:func:`pyro_bnnlv.reproduce.ncai_compare.compare_tasks`, ``compare``'s default
budget: the tasks of the committed store ``docs/results/sweeps/ncai-family``, so their validation
LL must match the store's) and prints, per fit, the test LL, quantiles of the per-point test LL
(``compare``'s test predictive: ``CompareConfig``'s 500 weight samples x 64 latent draws, its
seed) and the spread of the latent means and of ``f`` over the latent prior; then the per-point
difference NCAI_0 minus MFVI by how far ``y`` lies from its mean, and the share of the total
difference that the 5% most extreme test points carry.

Then whether the latent prior is where the tails are lost: per fit, the shape of the latent means
(excess kurtosis of ``mu_z``, the share beyond the prior's 0.1% tails, ``|mu_z| > 3.29 sigma_z``)
and the test LL when the predictive draws ``z*`` from the fit's aggregate of latent means (a
training point's ``mu_z`` drawn at random per component) instead of from the prior ``N(0,
sigma_z^2)``: a fit whose network met the extreme training targets at latent values the prior
seldom draws gains there, one whose means follow the prior does not.
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
    the latent pathway's reach, the standard deviation of ``f(x, z*)`` over the ``cfg.latent_draws``
    latent draws ``z*`` of one weight sample, and its shape, the excess kurtosis and skewness of
    ``f(x, z*)`` over those draws, each averaged over weight samples and test points."""
    M, seed = cfg.latent_draws, cfg.seed
    s = sample_posterior(fit.model, fit.guide, data.x_train, data.y_train, num_samples=cfg.num_samples, seed=seed)
    parts, spread, kurt, skew = [], [], [], []
    for rows, loc, scale in predictive_chunks(fit.model, s, data.x_test, latent_draws=M, seed=seed):
        parts.append(mixture_log_density(data.y_test[rows].reshape(-1, 1), loc, scale))
        f = loc.reshape(-1, M, loc.shape[1])  # rows s * M + m: sample s
        spread.append(f.std(1).mean(0))
        c = f - f.mean(1, keepdim=True)
        kurt.append((c.pow(4).mean(1) / c.pow(2).mean(1).square() - 3.0).mean(0))
        skew.append((c.pow(3).mean(1) / c.pow(2).mean(1).pow(1.5)).mean(0))
    shape = (float(torch.cat(kurt).mean()), float(torch.cat(skew).mean()))
    return torch.cat(parts), float(torch.cat(spread).mean()), shape


def aggregate_test_ll(fit, data, cfg: CompareConfig, mu: torch.Tensor) -> torch.Tensor:
    """Per-point test LL of the predictive mixture whose latent draws are the fit's latent means
    (each of the ``cfg.latent_draws`` components per weight sample takes the ``mu_z`` of a
    training point drawn at random, seeded by ``cfg.seed``) instead of prior draws."""
    model, M = fit.model, cfg.latent_draws
    s = sample_posterior(model, fit.guide, data.x_train, data.y_train, num_samples=cfg.num_samples, seed=cfg.seed)
    w, gen = s["w"], torch.Generator().manual_seed(cfg.seed)
    scale = torch.as_tensor(model.noise_scale).detach()
    out, S, chunk = [], w.shape[0], 8
    with torch.no_grad():
        for start in range(0, data.x_test.shape[0], chunk):
            x = data.x_test[start : start + chunk]  # (n, D)
            n = x.shape[0]
            z = mu[torch.randint(mu.shape[0], (S, M * n), generator=gen)]  # (S, M * n, K): rows m * n + i
            loc = model.net(model.network_input(x.repeat(M, 1), z), w)  # (S, M * n, L)
            loc = loc.reshape(S * M, n, loc.shape[-1])
            out.append(mixture_log_density(data.y_test[start : start + n].reshape(-1, 1), loc, scale))
    return torch.cat(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problem", type=int, default=14)
    p.add_argument("--restart", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="SVI steps (default: compare's, as the store)")
    p.add_argument("--num-samples", type=int, default=None, help="weight samples (default: compare's, 500)")
    args = p.parse_args()
    torch.set_num_threads(1)
    options = {} if args.steps is None else {"steps": args.steps, "map_steps": args.steps}
    cfg = CompareConfig(**options, **({} if args.num_samples is None else {"num_samples": args.num_samples}))
    data = load_dataset(FAMILY[args.problem].name)
    tasks = {t.method: t for t in compare_tasks(data.name, cfg) if t.restart == args.restart}
    z = torch.randn(1_000_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    t = torch.sinh(z) - torch.sinh(z).mean()
    print(f"the truth's heavy-tailed effect c sinh(z): excess kurtosis {float(t.pow(4).mean() / t.var() ** 2 - 3):.2f}")
    lls = {}
    for method in METHODS:
        fit = _fit_task(tasks[method], cfg, data)
        ll, spread, (f_kurt, f_skew) = per_point_test_ll(fit, data, cfg)
        lls[method] = ll = ll.numpy()
        mu = latent_means(fit.guide, data.x_train, data.y_train)
        q = ", ".join(f"{v:.2f}" for v in np.quantile(ll, [0.01, 0.05, 0.5, 0.95]))
        print(
            f"{method}: valid LL {fit.valid_ll:.3f}, test LL {ll.mean():.3f}, per-point quantiles "
            f"(1%, 5%, 50%, 95%) {q}; sd of mu_z {float(mu.std()):.3f}; sd of f over z* {spread:.3f}, "
            f"its excess kurtosis {f_kurt:.2f} and skewness {f_skew:+.2f}; noise sd {float(fit.model.noise_scale):.3f}"
        )
        u = (mu / fit.model.latent_scale).reshape(-1).numpy()
        kurt = float(((u - u.mean()) ** 4).mean() / u.var() ** 2 - 3.0)
        agg = aggregate_test_ll(fit, data, cfg, mu).numpy()
        print(
            f"  latent means: excess kurtosis {kurt:.2f}, share beyond 3.29 sigma_z {np.mean(np.abs(u) > 3.29):.4f}; "
            f"test LL with z* from the latent means {agg.mean():.3f} (from the prior {ll.mean():.3f}), "
            f"1% quantile {np.quantile(agg, 0.01):.2f}"
        )
    diff = lls[METHODS[1]] - lls[METHODS[0]]
    order = np.argsort(np.abs(data.y_test.reshape(-1).numpy() - float(data.y_test.mean())))
    n = len(order)
    for lo, hi in ((0.0, 0.5), (0.5, 0.9), (0.9, 0.99), (0.99, 1.0)):
        part = diff[order[int(lo * n) : max(int(hi * n), int(lo * n) + 1)]]
        print(f"|y - mean| in quantiles {lo:.2f}-{hi:.2f}: NCAI_0 minus MFVI {part.mean():+.3f} per point")
    worst = np.argsort(lls[METHODS[1]])[: max(1, n // 100)]  # NCAI_0's worst 1% of test points
    above = float(np.mean(data.y_test.reshape(-1).numpy()[worst] > float(data.y_test.mean())))
    print(f"NCAI_0's worst 1% of test points: share above the mean of y {above:.2f}")
    extreme = diff[order[-max(1, n // 20) :]].sum() / diff.sum()
    print(f"total {diff.mean():+.3f} per point; share of the total from the 5% most extreme points: {extreme:.2f}")


if __name__ == "__main__":
    main()
