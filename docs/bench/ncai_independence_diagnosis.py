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

Everything is seeded; the fits are cached in ``--cache`` (delete it to refit).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

DEFAULT_CACHE = Path("/tmp/ncai-diag/fits.npz")
FITS = (("sin-tanh", "BNN+LV (NCAI_lambda)", 0), ("sin-tanh", "BNN+LV (NCAI_lambda)", 1),
        ("bimodal", "BNN+LV (NCAI_lambda)", 0), ("bimodal", "BNN+LV (NCAI_lambda)", 1))  # fmt: skip


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


def fit_all(cache: Path) -> dict[str, np.ndarray]:
    """Fit (or read from ``cache``) every fit of :data:`FITS`; ``x``, ``y``, ``mu_z`` and the last
    training step's logged ``hsic_x`` per fit."""
    out = dict(np.load(cache)) if cache.exists() else {}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args()
    torch.manual_seed(0)
    fits = fit_all(args.cache)
    print(sorted(fits))


if __name__ == "__main__":
    main()
