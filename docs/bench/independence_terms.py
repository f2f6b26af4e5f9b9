"""Validation of the independence terms of :mod:`pyro_bnnlv.stats.independence` against KSG
(issue 37, item 2).

    python docs/bench/independence_terms.py [--n 350] [--draws 3] [--reference-n 20000] [--null-reps 100]
        [--candidates KIND ...]

Each candidate of :func:`~pyro_bnnlv.stats.independence.independence_statistic` ALONE, on
:data:`PATTERNS`: 31 synthetic dependence patterns of a 1-D latent ``z`` on ``x`` (monotone,
oscillating at several frequencies, variance changing with ``x``, bimodal with an
``x``-dependent mode, quadratic; 1-D ``x ~ U[-3, 3]`` and 3-D ``x ~ U[-3, 3]^3``; several
strengths; two independent patterns). Per pattern:

* the reference, KSG ``I(x; z)`` (:func:`~pyro_bnnlv.stats.ksg_mutual_information`, k = 5) on
  ``--reference-n`` points;
* each candidate's mean over ``--draws`` independent batches of ``--n`` points (350: NCAI's
  full-batch size on the issue's ``from_arrays`` set; bimodal trains on 750);
* the reference estimator itself on those batches (column ``KSG on n``, not a penalty): how well
  any statistic can order the patterns from ``n`` points, the ceiling of the Spearman criterion.

Printed: the table, each candidate's Spearman rank correlation with the reference over the
patterns, and its null (``z`` independent of ``x``): mean and 95% quantile over --null-reps batches at
``n`` in 64, 128, 350, 750. All draws are seeded.
"""

from __future__ import annotations

import argparse
from typing import Callable

import numpy as np
import torch
from scipy.stats import spearmanr

from pyro_bnnlv.stats import ksg_mutual_information
from pyro_bnnlv.stats.independence import KINDS, independence_statistic

Sampler = Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]]


def _one_d(f: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Sampler:
    def sample(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.uniform(-3, 3, (n, 1))
        return x, f(x[:, 0], rng.standard_normal(n))[:, None]

    return sample


def _three_d(f: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Sampler:
    def sample(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.uniform(-3, 3, (n, 3))
        return x, f(x, rng.standard_normal(n))[:, None]

    return sample


def _bimodal(shift: float, dims: int = 1) -> Sampler:
    """``z = shift * s + 0.3 e`` with ``s = +-1``, ``P(s = 1) = sigmoid(2 x_1)``."""

    def sample(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.uniform(-3, 3, (n, dims))
        s = np.where(rng.uniform(size=n) < 1 / (1 + np.exp(-2 * x[:, 0])), 1.0, -1.0)
        return x, (shift * s + 0.3 * rng.standard_normal(n))[:, None]

    return sample


#: name -> sampler of ``(x (n, D), z (n, 1))``.
PATTERNS: dict[str, Sampler] = {
    "independent 1-D": _one_d(lambda x, e: e),
    "independent 3-D": _three_d(lambda x, e: e),
    **{f"linear {a:g}": _one_d(lambda x, e, a=a: a * x + e) for a in (0.05, 0.15, 0.4, 1.0, 3.0)},
    **{f"tanh {a:g}": _one_d(lambda x, e, a=a: a * np.tanh(2 * x) + e) for a in (0.5, 2.0)},
    "cubic": _one_d(lambda x, e: 0.1 * x**3 + 0.5 * e),
    **{f"quadratic {a:g}": _one_d(lambda x, e, a=a: a * x**2 + e) for a in (0.1, 0.5)},
    **{
        f"sin f={f:g} a={a:g}": _one_d(lambda x, e, f=f, a=a: a * np.sin(f * x) + e)
        for f in (1.0, 3.0, 8.0)
        for a in (0.5, 2.0)
    },
    **{f"variance {s:g}": _one_d(lambda x, e, s=s: np.exp(s * x) * e) for s in (0.1, 0.3, 0.8)},
    "variance |x|": _one_d(lambda x, e: (0.1 + np.abs(x)) * e),
    **{f"bimodal {d:g}": _bimodal(d) for d in (0.5, 1.0, 3.0)},
    "3-D linear 0.3": _three_d(lambda x, e: 0.3 * x[:, 0] + e),
    "3-D linear sum": _three_d(lambda x, e: x.sum(1) + e),
    "3-D sin f=3": _three_d(lambda x, e: 2 * np.sin(3 * x[:, 1]) + e),
    "3-D variance": _three_d(lambda x, e: np.exp(0.4 * x[:, 2]) * e),
    "3-D bimodal": _bimodal(2.0, dims=3),
    "3-D sines": _three_d(lambda x, e: np.sin(2 * x[:, 0]) + np.sin(2 * x[:, 1]) + np.sin(2 * x[:, 2]) + 0.5 * e),
}

#: The patterns with 1-D ``x``.
ONE_D: list[str] = [p for p in PATTERNS if not p.startswith("3-D") and p != "independent 3-D"]

#: The column of the reference estimator on the candidates' batches.
KSG_ON_BATCH = "KSG on n"

#: The candidates validated, with their options (``hsic-multiscale`` at its default scales).
CANDIDATES: dict[str, dict] = {kind: {"kind": kind} for kind in KINDS}


def statistic(x: np.ndarray, z: np.ndarray, options: dict) -> float:
    with torch.no_grad():
        return float(independence_statistic(torch.as_tensor(x), torch.as_tensor(z), **options))


def value(x: np.ndarray, z: np.ndarray, candidate: str) -> float:
    """``candidate``'s value on one batch: :func:`statistic` with its options, or KSG itself for
    :data:`KSG_ON_BATCH` (deterministic: it draws nothing, so the other candidates' draws do not
    depend on whether it runs)."""
    if candidate == KSG_ON_BATCH:
        return float(ksg_mutual_information(x, z))
    return statistic(x, z, CANDIDATES[candidate])


def validate(
    n: int, draws: int, reference_n: int, seed: int = 0, candidates: tuple[str, ...] = tuple(CANDIDATES)
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """``(reference KSG per pattern, {candidate: {pattern: mean over draws}})``, seeded; the
    candidates always include :data:`KSG_ON_BATCH`, KSG on the candidates' batches."""
    candidates = (KSG_ON_BATCH, *candidates)
    reference, values = {}, {c: {} for c in candidates}
    for i, (name, sample) in enumerate(PATTERNS.items()):
        rng = np.random.default_rng([seed, i])
        reference[name] = ksg_mutual_information(*sample(rng, reference_n))
        batches = [sample(rng, n) for _ in range(draws)]
        for cand in candidates:
            values[cand][name] = float(np.mean([value(x, z, cand) for x, z in batches]))
    return reference, values


def null_quantiles(
    n: int, reps: int, seed: int = 0, dims: int = 1, candidates: tuple[str, ...] = tuple(CANDIDATES)
) -> dict[str, tuple[float, float]]:
    """Per candidate (:data:`KSG_ON_BATCH` too) ``(mean, 95% quantile)`` over ``reps`` batches of
    ``n`` independent ``x ~ U[-3, 3]^dims``, ``z ~ N(0, 1)``."""
    rng = np.random.default_rng([seed, n, dims])
    batches = [(rng.uniform(-3, 3, (n, dims)), rng.standard_normal((n, 1))) for _ in range(reps)]
    out = {}
    for cand in candidates:
        vals = np.array([value(x, z, cand) for x, z in batches])
        out[cand] = (float(vals.mean()), float(np.quantile(vals, 0.95)))
    return out


def spearman(reference: dict[str, float], values: dict[str, float], names: list[str] | None = None) -> float:
    """Spearman rank correlation of a candidate's values with the reference over ``names``
    (default: every pattern)."""
    names = list(reference) if names is None else names
    return float(spearmanr([reference[p] for p in names], [values[p] for p in names]).statistic)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=350)
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--reference-n", type=int, default=20000)
    parser.add_argument("--null-reps", type=int, default=100)
    parser.add_argument(
        "--candidates",
        nargs="+",
        choices=list(CANDIDATES),
        default=list(CANDIDATES),
        help="the terms to validate (default: all; the terms drawing from torch's generator, the k-NN "
        "ones, see draws that depend on which others run before them)",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    cands = list(args.candidates)
    reference, values = validate(args.n, args.draws, args.reference_n, candidates=tuple(cands))
    cands = [KSG_ON_BATCH, *cands]
    print(
        f"{len(reference)} patterns; candidates: mean of {args.draws} batches of n = {args.n}; "
        f"reference: KSG on {args.reference_n} points"
    )
    print(f"{'pattern':<22}{'KSG':>8}" + "".join(f"{c:>19}" for c in cands))
    for p in sorted(reference, key=reference.get):
        print(f"{p:<22}{reference[p]:>8.3f}" + "".join(f"{values[c][p]:>19.4f}" for c in cands))
    print(f"{'Spearman vs KSG':<30}" + "".join(f"{spearman(reference, values[c]):>19.3f}" for c in cands))
    for label, names in (("1-D x", ONE_D), ("3-D x", [p for p in reference if p not in ONE_D])):
        print(
            f"{f'  on the {len(names)} with {label}':<30}"
            + "".join(f"{spearman(reference, values[c], names):>19.3f}" for c in cands)
        )
    for n in (64, 128, 350, 750):
        null = null_quantiles(n, args.null_reps, candidates=tuple(cands))
        print(f"{f'null n={n} mean / q95':<30}" + "".join(f"{null[c][0]:>10.4f} /{null[c][1]:>7.4f}" for c in cands))


if __name__ == "__main__":
    main()
