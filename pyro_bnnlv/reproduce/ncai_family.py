r"""``pyro-bnnlv reproduce ncai-family``: NCAI against mean-field VI on problems nobody tuned it on.

Issue 37. On each problem of the seeded family (:mod:`pyro_bnnlv.datasets.ncai_family`: 24 BNN+LV
problems, random smooth ``f``, additive / heteroscedastic / multiplicative / multimodal /
heavy-tailed latent effects, ``N`` from 200 to 2,000, 1-D and 2-D ``x``, each with its true
test-LL ceiling) the comparison of ``pyro-bnnlv compare`` runs at its default budget (3,000
steps, 2 restarts, one NCAI setting, App. F.1's noise grids), as one resumable sweep:
BNN (MFVI), BNN+LV (MFVI), NCAI_0 and NCAI_lambda, the last with each independence term of
``--independence`` (default: today's ``hsic`` and issue 37's ``knn-mi``). Per problem and
method the fit with the best validation LL is kept, and NCAI_lambda is *selected* against NCAI_0
by validation LL (App. F.1), per term.

Reported: per problem the test LL, ``I(x; mu_z)`` (KSG) and ``HZ(mu_z)`` of each method beside
the ceiling; over the family, for the selected NCAI of each term against BNN+LV (MFVI), the
share of problems where it has the higher test LL and the lower ``I(x; mu_z)``, each with a
Wilson 95% interval, and the mean paired difference with its standard error. How often the
selection keeps ``lambda = 0`` is counted too: that is where the constraint cost validation LL.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
from collections.abc import Sequence

import pandas as pd
import torch

from ..datasets.ncai_family import FAMILY, ceiling
from ..sweep import Task, run_sweep
from ..sweep.cli import add_sweep_arguments, report, sweep_options
from .ncai_compare import CompareConfig, compare_tasks, fit_task, keep_ncai0_where_better
from . import tables

__all__ = ["TERMS", "family_tasks", "main", "run_family", "select", "win_rates"]

#: the independence terms compared by default: today's and issue 37's
TERMS = ("hsic", "knn-mi")
_LAMBDA = "BNN+LV (NCAI_lambda)"


def family_tasks(problems: Sequence[str], cfg: CompareConfig, terms: Sequence[str] = TERMS) -> list[Task]:
    """``compare``'s tasks on each problem (data seed ``cfg.seed``), NCAI_lambda once per term."""
    tasks = []
    for name in problems:
        for task in compare_tasks(name, cfg):
            if task.method != _LAMBDA:
                tasks.append(task)
                continue
            for term in terms:
                tasks.append(dataclasses.replace(task, grid={**task.params, "independence": term}))
    return tasks


def select(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (problem, method): the best fit by validation LL; NCAI_lambda per term
    (``method`` ``"NCAI_lambda (TERM)"``), replaced by NCAI_0's fit where that validates
    better (``lambda0`` True)."""
    done = results[results["status"] == "done"].copy()
    term = done["independence"] if "independence" in done else pd.Series("", index=done.index)
    done["arm"] = [f"NCAI_lambda ({t})" if m == _LAMBDA else m for m, t in zip(done["method"], term.fillna(""))]
    best = done.loc[done.groupby(["dataset", "arm"])["valid_ll"].idxmax()].copy()
    best["lambda0"] = False
    rows = []
    for _, group in best.groupby("dataset", sort=False):
        g = group.set_index("arm")
        for arm in keep_ncai0_where_better(g, [a for a in g.index if a.startswith("NCAI_lambda")]):
            g.loc[arm, "lambda0"] = True
        rows.append(g.reset_index())
    out = pd.concat(rows, ignore_index=True)
    ceilings = {p.name: _ceiling(p.index) for p in FAMILY if p.name in set(out["dataset"])}
    out["ceiling"] = out["dataset"].map(ceilings)
    return out[["dataset", "arm", "test_ll", "rmse", "mi_x_z", "hz_z", "valid_ll", "lambda0", "setting", "ceiling"]]


@functools.cache
def _ceiling(index: int) -> float:
    return ceiling(FAMILY[index])[0]


def _wilson(wins: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95% interval of a proportion ``wins / n``."""
    if n == 0:
        return math.nan, math.nan
    p = wins / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def win_rates(selected: pd.DataFrame, baseline: str = "BNN+LV (MFVI)") -> pd.DataFrame:
    """For each NCAI arm against ``baseline``, over the problems both finished: the share with
    the higher test LL and the share with the lower ``I(x; mu_z)`` (Wilson 95% intervals), the
    mean paired differences with their standard errors, and how often ``lambda = 0`` was kept."""
    wide = selected.pivot(index="dataset", columns="arm")
    rows = []
    for arm in [a for a in selected["arm"].unique() if a.startswith("NCAI")]:
        both = wide["test_ll"][[arm, baseline]].dropna().index
        if not len(both):
            continue
        ll, mi = wide["test_ll"].loc[both], wide["mi_x_z"].loc[both]
        (ll_mean, ll_se, n), (mi_mean, mi_se, _) = tables.paired(ll[arm], ll[baseline]), tables.paired(mi[arm], mi[baseline])
        ll_wins, mi_wins = int((ll[arm] > ll[baseline]).sum()), int((mi[arm] < mi[baseline]).sum())
        rows.append({
            "arm": arm, "problems": n,
            "ll_win_rate": ll_wins / n, "ll_win_ci": "[{:.2f}, {:.2f}]".format(*_wilson(ll_wins, n)),
            "ll_diff_mean": ll_mean, "ll_diff_se": ll_se,
            "mi_win_rate": mi_wins / n, "mi_win_ci": "[{:.2f}, {:.2f}]".format(*_wilson(mi_wins, n)),
            "mi_diff_mean": mi_mean, "mi_diff_se": mi_se,
            "lambda0_kept": int(wide["lambda0"].loc[both, arm].astype(bool).sum()) if "lambda0" in wide else 0,
        })  # fmt: skip
    return pd.DataFrame(rows)


def run_family(problems: Sequence[str] | None = None, config: CompareConfig | None = None,
               terms: Sequence[str] = TERMS, *, progress: bool = True, **sweep: object) -> pd.DataFrame:
    """Run the family's sweep (``sweep``: :func:`~pyro_bnnlv.sweep.run_sweep`'s options) and
    return its results table (one row per fit)."""
    cfg = config or CompareConfig()
    names = list(problems) if problems is not None else [p.name for p in FAMILY]
    tasks = family_tasks(names, cfg, terms)
    conf = dataclasses.asdict(cfg)
    return run_sweep(tasks, functools.partial(fit_task, config=conf),
                     sweep_meta={"experiment": "ncai-family", "config": conf, "terms": list(terms)},
                     progress=progress, desc="ncai-family", **sweep)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pyro-bnnlv reproduce ncai-family", description=__doc__.split("\n\n")[0])
    p.add_argument("--problems", type=int, default=len(FAMILY), help="the first N problems of the family (24)")
    p.add_argument("--independence", nargs="+", default=list(TERMS), help="NCAI's independence terms to compare")
    p.add_argument("--steps", type=int, default=None, help="SVI steps per fit (default: compare's 3,000)")
    p.add_argument("--restarts", type=int, default=None, help="restarts per setting (default: compare's 2)")
    p.add_argument("--output", help="CSV of the selected fits (one row per problem and method)")
    p.add_argument("--quiet", action="store_true")
    add_sweep_arguments(p)
    args = p.parse_args(argv)
    if not 1 <= args.problems <= len(FAMILY):
        p.error(f"--problems must lie in 1..{len(FAMILY)}, got {args.problems}")
    if args.output:
        from pathlib import Path

        folder = Path(args.output).resolve().parent
        if not folder.is_dir():
            p.error(f"--output: the folder {folder} does not exist; create it first")
    torch.set_num_threads(1)
    overrides = {k: v for k, v in dict(steps=args.steps, restarts=args.restarts).items() if v is not None}
    cfg = CompareConfig(**overrides)
    results = run_family([q.name for q in FAMILY[: args.problems]], cfg, args.independence,
                         progress=not args.quiet, **sweep_options(args))  # fmt: skip
    if (results["status"] == "done").any():
        chosen = select(results)
        print(chosen.pivot(index="dataset", columns="arm", values="test_ll").to_string(float_format="%.3f"))
        print(win_rates(chosen).to_string(index=False, float_format="%.3f"))
        if args.output:
            chosen.to_csv(args.output, index=False)
    return report(results)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
