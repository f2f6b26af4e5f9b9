"""Why NCAI's independence term missed the dependence it should remove (issue 37, item 1).

    python docs/bench/ncai_independence_diagnosis.py [--cache /tmp/ncai-diag/fits.npz]

Two data sets no result of ours uses, at ``compare``'s default settings
(:class:`~pyro_bnnlv.reproduce.ncai_compare.CompareConfig`: 3,000 Adam steps, lr 0.01, the NCAI
step-1 initialisation, one grid point ``eps_T = 0.01, eps_x = 0.5``, full-batch training, HSIC
independence term):

* ``sin-tanh``: :func:`~pyro_bnnlv.datasets.from_arrays` of 500 points, ``x ~ U[-3, 3]``,
  ``y = sin(1.5 x) + (0.6 + 0.15 x) tanh(4 z) + 0.15 e``, ``z, e ~ N(0, 1)`` (numpy seed 0; split
  seed 0, standardised as ``from_arrays`` does by default);
* ``bimodal``: the library's set (App. G of Yacoby, Pan & Doshi-Velez 2022, arXiv:1911.00569),
  split 0, original scale.

Fits (the sweep tasks of ``compare``, same seeds): NCAI_lambda restarts 0 and 1 per set. On each fit's variational means ``mu_z`` (training inputs) it prints

* the penalty's statistic exactly as :class:`~pyro_bnnlv.infer.ncai_elbo.NCAIElbo` computes it
  (:func:`~pyro_bnnlv.infer.ncai_elbo.ncai_penalties`, ``hsic_x``), the exponent
  ``hsic_x / eps_x`` and the penalty's slope ``lambda3 N exp(.) / eps_x``;
* KSG ``I(x; mu_z)`` (k = 5, the reported metric);
* normalised HSIC with Gaussian bandwidths ``c`` times the median heuristic of ``x`` and of
  ``mu_z`` (``c`` in 0.05 ... 2; the library's bandwidth, ``h^2 = sum Var``, is ``c ~ 1``),
  and its null's 95% quantile (200 permutations of ``mu_z``);
* distance correlation;
* the same on random minibatches of 64 and 128 points (mean and sd over 50 batches).

Everything is seeded; the fits are cached in ``--cache`` after each one (delete it to refit;
``--cached-only`` analyses what is cached). A fit takes several minutes on a shared 2-core
machine.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

DEFAULT_CACHE = Path("/tmp/ncai-diag/fits.npz")
FITS = (
    ("sin-tanh", "BNN+LV (NCAI_lambda)", 0),
    ("bimodal", "BNN+LV (NCAI_lambda)", 0),
    ("sin-tanh", "BNN+LV (NCAI_lambda)", 1),
    ("bimodal", "BNN+LV (NCAI_lambda)", 1),
)


def sin_tanh_data():
    """The issue's ``from_arrays`` set (500 points, split seed 0)."""
    from pyro_bnnlv.datasets import from_arrays

    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, 500)
    z, e = rng.standard_normal(500), rng.standard_normal(500)
    y = np.sin(1.5 * x) + (0.6 + 0.15 * x) * np.tanh(4 * z) + 0.15 * e
    return from_arrays(x, y, name="sin-tanh", seed=0)


def load(name: str):
    from pyro_bnnlv.reproduce.ncai_compare import load_compare_data

    return sin_tanh_data() if name == "sin-tanh" else load_compare_data(name, seed=0)


def fit_all(cache: Path, fit: bool = True) -> dict[str, np.ndarray]:
    """Fit (or read from ``cache``) every fit of :data:`FITS`; ``x``, ``y``, ``mu_z`` and the last
    training step's logged ``hsic_x`` per fit (``fit=False``: the cached ones only)."""
    out = dict(np.load(cache)) if cache.exists() else {}
    if not fit:
        return out
    from pyro_bnnlv.reproduce.ncai_compare import CompareConfig, _fit_task, compare_tasks
    from pyro_bnnlv.stats.latent import latent_means

    cfg = CompareConfig()
    for name, method, restart in FITS:
        key = f"{name}|{method}|{restart}"
        if key + "|mu" in out:
            continue
        data = load(name)
        task = next(t for t in compare_tasks(data.name, cfg) if t.method == method and t.restart == restart)
        fit = _fit_task(task, cfg, data)
        out[key + "|x"] = data.x_train.double().numpy()
        out[key + "|y"] = data.y_train.double().numpy()
        out[key + "|mu"] = latent_means(fit.guide, data.x_train, data.y_train).double().numpy()
        out[key + "|valid_ll"] = np.array(fit.valid_ll)
        if fit.history is not None and "hsic_x" in fit.history:
            out[key + "|train_hsic"] = np.array(float(fit.history["hsic_x"].iloc[-1]))
        print(f"fitted {key}: valid LL {fit.valid_ll:.3f}", flush=True)
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cache, **out)  # after every fit: an interrupted run resumes
    return out


SCALES = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
EPS_X, N_BATCHES, PERMUTATIONS = 0.5, 30, 100


def statistics(x: np.ndarray, y: np.ndarray, mu: np.ndarray, rng: np.random.Generator) -> dict[str, float]:
    """Every statistic of the module docstring on one batch."""
    from pyro_bnnlv.infer.ncai_elbo import ncai_penalties
    from pyro_bnnlv.stats import ksg_mutual_information
    from pyro_bnnlv.stats.independence import independence_statistic, multiscale_hsic

    xt, yt, mt = (torch.as_tensor(a) for a in (x, y, mu))
    with torch.no_grad():
        out = {
            "penalty hsic_x": float(ncai_penalties(xt, yt, mt)["hsic_x"]),
            "KSG": ksg_mutual_information(x, mu),
            "knn-mi": float(independence_statistic(xt, mt, "knn-mi")),
            "dcor": float(independence_statistic(xt, mt, "dcor")),
            "hsic-multiscale": float(independence_statistic(xt, mt, "hsic-multiscale")),
        }
        for c in SCALES:
            out[f"dCKA c={c:g}"] = float(multiscale_hsic(xt, mt, (c,)))
    return out


def permutation_q95(x: np.ndarray, mu: np.ndarray, rng: np.random.Generator) -> dict[str, float]:
    """95% quantile of the penalty statistic and of each single-scale dCKA with ``mu`` permuted."""
    from pyro_bnnlv.stats.hsic import normalized_hsic
    from pyro_bnnlv.stats.independence import multiscale_hsic

    xt = torch.as_tensor(x)
    vals: dict[str, list[float]] = {}
    with torch.no_grad():
        for _ in range(PERMUTATIONS):
            mt = torch.as_tensor(mu[rng.permutation(len(mu))])
            vals.setdefault("penalty hsic_x", []).append(float(normalized_hsic(xt, mt)))
            for c in SCALES:
                vals.setdefault(f"dCKA c={c:g}", []).append(float(multiscale_hsic(xt, mt, (c,))))
    return {k: float(np.quantile(v, 0.95)) for k, v in vals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--cached-only", action="store_true", help="analyse the cached fits, fit nothing")
    args = parser.parse_args()
    torch.manual_seed(0)
    fits = fit_all(args.cache, fit=not args.cached_only)
    for name, method, restart in FITS:
        key = f"{name}|{method}|{restart}"
        if key + "|mu" not in fits:
            print(f"\n== {key}: not in the cache (run without --cached-only to fit it)")
            continue
        x, y, mu = fits[key + "|x"], fits[key + "|y"], fits[key + "|mu"]
        rng = np.random.default_rng(restart)
        full = statistics(x, y, mu, rng)
        q95 = permutation_q95(x, mu, rng)
        n = len(x)
        t = full["penalty hsic_x"]
        print(
            f"\n== {name}, {method}, restart {restart}: N = {n}, valid LL {float(fits[key + '|valid_ll']):.3f}, "
            f"sd(x) {x.std():.2f}, sd(mu_z) {mu.std():.3f}, last training step's hsic_x "
            f"{float(fits.get(key + '|train_hsic', np.nan)):.4f}"
        )
        print(
            f"   penalty lambda3 N exp(T/eps_x) at T = {t:.4f}: {n * np.exp(t / EPS_X):.1f} nats, its floor (T = 0) "
            f"{n:.0f}: the whole independence term is worth {n * (np.exp(t / EPS_X) - 1):.1f} nats; slope "
            f"N exp(T/eps_x)/eps_x = {n * np.exp(t / EPS_X) / EPS_X:.0f} nats per unit of T"
        )
        batches = {
            b: [statistics(x[i], y[i], mu[i], rng) for i in (rng.choice(n, b, replace=False) for _ in range(N_BATCHES))]
            for b in (64, 128)
        }
        print(
            f"   {'statistic':<18}{'full data':>10}{'perm. q95':>10}"
            + "".join(f"{f'B={b} mean':>12}{'sd':>7}" for b in batches)
        )
        for stat, value in full.items():
            row = f"   {stat:<18}{value:>10.4f}{q95.get(stat, np.nan):>10.4f}"
            for b, rows in batches.items():
                v = np.array([r[stat] for r in rows])
                row += f"{v.mean():>12.4f}{v.std():>7.4f}"
            print(row)
        print(
            f"   (c: bandwidths c x median |x_i - x_j| and c x median |mu_i - mu_j|; the penalty's own "
            f"bandwidth h^2 = Var is c = {np.sqrt(x.var()) / np.median(np.abs(x - x.T)):.2f} for x)"
        )


if __name__ == "__main__":
    main()
