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
import json
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from ..datasets.ncai_family import FAMILY, ceiling
from ..sweep import STORE_NAME, SweepStore, Task, load_results, run_sweep
from ..sweep.cli import add_sweep_arguments, report, sweep_options
from .ncai_compare import CompareConfig, compare_tasks, fit_task, keep_ncai0_where_better
from . import tables

__all__ = [
    "TERMS",
    "family_lambda_table",
    "family_table",
    "family_tasks",
    "family_wins_table",
    "main",
    "run_family",
    "select",
    "win_rates",
]

#: the independence terms compared by default: today's and issue 37's
TERMS = ("hsic", "knn-mi")
_LAMBDA = "BNN+LV (NCAI_lambda)"


def family_tasks(
    problems: Sequence[str], cfg: CompareConfig, terms: Sequence[str] = TERMS, *, lambda_only: bool = False
) -> list[Task]:
    """``compare``'s tasks on each problem (data seed ``cfg.seed``), NCAI_lambda once per term;
    with ``lambda_only`` the NCAI_lambda tasks alone (a term added to a family whose other fits
    are in another store: the task ids are the same in both)."""
    tasks = []
    for name in problems:
        for task in compare_tasks(name, cfg):
            if task.method != _LAMBDA:
                if not lambda_only:
                    tasks.append(task)
                continue
            for term in terms:
                tasks.append(dataclasses.replace(task, grid={**task.params, "independence": term}))
    return tasks


def select(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (problem, method) of the problems whose every fit is done: the best fit by
    validation LL; NCAI_lambda per term (``method`` ``"NCAI_lambda (TERM)"``), replaced by NCAI_0's
    fit where that validates better (``lambda0`` True); an NCAI_lambda row keeps its own best fit's
    numbers in the ``lambda_*`` columns either way (what selection weighed). A problem with a fit
    still pending (or failed) is left out: a selection over some of its restarts would be another
    protocol."""
    complete = results.groupby("dataset")["status"].transform(lambda s: bool((s == "done").all()))
    done = results[complete.astype(bool)].copy()
    if done.empty:
        return pd.DataFrame(columns=_SELECTED)
    term = done["independence"] if "independence" in done else pd.Series("", index=done.index)
    done["arm"] = [f"NCAI_lambda ({t})" if m == _LAMBDA else m for m, t in zip(done["method"], term.fillna(""))]
    # the penalised dependence statistic at the end of training (logged as hsic_x or indep_x)
    logged = [done[c] for c in ("final_indep_x", "final_hsic_x") if c in done]
    done["final_statistic"] = logged[0].fillna(logged[1]) if len(logged) == 2 else (logged or [math.nan])[0]
    best = done.loc[done.groupby(["dataset", "arm"])["valid_ll"].idxmax()].copy()
    best["lambda0"] = False
    for col in _OWN:
        best[f"lambda_{col}"] = best[col].where(best["arm"].str.startswith("NCAI_lambda"))
    rows = []
    for _, group in best.groupby("dataset", sort=False):
        g = group.set_index("arm")
        own = g[[f"lambda_{c}" for c in _OWN]].copy()
        for arm in keep_ncai0_where_better(g, [a for a in g.index if a.startswith("NCAI_lambda")]):
            g.loc[arm, "lambda0"] = True
            g.loc[arm, own.columns] = own.loc[arm]
        rows.append(g.reset_index())
    out = pd.concat(rows, ignore_index=True)
    ceilings = {p.name: _ceiling(p.index) for p in FAMILY if p.name in set(out["dataset"])}
    out["ceiling"] = out["dataset"].map(ceilings)
    return out[_SELECTED]


_OWN = ("valid_ll", "test_ll", "mi_x_z", "final_statistic")
_SELECTED = [
    "dataset",
    "arm",
    "test_ll",
    "rmse",
    "mi_x_z",
    "hz_z",
    "valid_ll",
    "lambda0",
    "setting",
    "ceiling",
    *(f"lambda_{c}" for c in _OWN),
]


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
    rows = []
    if selected.empty or baseline not in set(selected["arm"]):
        return pd.DataFrame(rows)  # e.g. a --lambda-only run without the family's other fits
    wide = selected.pivot(index="dataset", columns="arm")
    for arm in [a for a in selected["arm"].unique() if a.startswith("NCAI")]:
        both = wide["test_ll"][[arm, baseline]].dropna().index
        if not len(both):
            continue
        ll, mi = wide["test_ll"].loc[both], wide["mi_x_z"].loc[both]
        (ll_mean, ll_se, n), (mi_mean, mi_se, _) = (
            tables.paired(ll[arm], ll[baseline]),
            tables.paired(mi[arm], mi[baseline]),
        )
        ll_wins, mi_wins = int((ll[arm] > ll[baseline]).sum()), int((mi[arm] < mi[baseline]).sum())
        rows.append(
            {
                "arm": arm,
                "problems": n,
                "ll_win_rate": ll_wins / n,
                "ll_win_ci": "[{:.2f}, {:.2f}]".format(*_wilson(ll_wins, n)),
                "ll_diff_mean": ll_mean,
                "ll_diff_se": ll_se,
                "mi_win_rate": mi_wins / n,
                "mi_win_ci": "[{:.2f}, {:.2f}]".format(*_wilson(mi_wins, n)),
                "mi_diff_mean": mi_mean,
                "mi_diff_se": mi_se,
                "lambda0_kept": int(wide["lambda0"].loc[both, arm].astype(bool).sum()) if "lambda0" in wide else 0,
            }
        )
    return pd.DataFrame(rows)


_ARMS = ("BNN (MFVI)", "BNN+LV (MFVI)", "BNN+LV (NCAI_0)")
_LABELS = {"BNN (MFVI)": "BNN", "BNN+LV (MFVI)": "MFVI", "BNN+LV (NCAI_0)": "NCAI_0"}


def family_table(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """The results page's family table (``<!-- generated: ncai-family CSV -->``, the CSV of
    :func:`select`): per problem its structure and true-density ceiling, the selected fit's test
    LL of each method (NCAI_lambda per term, ``(0)`` where selection kept ``lambda = 0``, bold the
    best), and ``I(x; mu_z)`` of BNN+LV MFVI and of each term's selected fit."""
    chosen = pd.concat(frames, ignore_index=True)
    lambda_arms = sorted(a for a in chosen["arm"].unique() if a.startswith("NCAI_lambda"))
    arms = [a for a in _ARMS if a in set(chosen["arm"])] + lambda_arms
    problems = {p.name: p for p in FAMILY}
    rows = []
    for name, block in chosen.groupby("dataset", sort=True):
        g = block.set_index("arm")
        ll = [float(g.loc[a, "test_ll"]) if a in g.index else math.nan for a in arms]
        top = tables.best(ll, largest=True)
        cells = [
            tables.bold(
                tables.num(v) + (" (0)" if a in lambda_arms and a in g.index and bool(g.loc[a, "lambda0"]) else ""),
                k == top,
            )
            for k, (a, v) in enumerate(zip(arms, ll))
        ]
        mi = [tables.num(float(g.loc[a, "mi_x_z"])) if a in g.index else "" for a in ["BNN+LV (MFVI)", *lambda_arms]]
        p = problems.get(name)
        what = f"{p.effect}, D = {p.input_dim}, N = {p.n_train:,}" if p is not None else ""
        rows.append([name.removeprefix("ncai-family-"), what, tables.num(float(g["ceiling"].iloc[0])), *cells, *mi])
    labels = [_LABELS.get(a, a.replace("NCAI_lambda (", "NCAI ").rstrip(")")) for a in arms]
    header = [
        "problem",
        "latent effect, x dim, N",
        "ceiling",
        *(f"test LL: {a}" for a in labels),
        *(f"`I(x; mu_z)`: {a}" for a in ["MFVI", *labels[len(arms) - len(lambda_arms) :]]),
    ]
    return tables.table(header, rows)


def family_wins_table(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """The family's win rates (:func:`win_rates` of the CSV of :func:`select`): per NCAI term
    against BNN+LV MFVI, the share of problems with the higher test LL and with the lower
    ``I(x; mu_z)`` (Wilson 95% intervals), the mean paired differences with SE and the paired
    t-test's verdict (:func:`.tables.paired_verdict`), and how often ``lambda = 0`` was kept."""
    rates = win_rates(pd.concat(frames, ignore_index=True))
    rows = []
    for r in rates.itertuples(index=False):
        n = int(r.problems)
        ll = tables.paired_text(r.ll_diff_mean, r.ll_diff_se, n)
        mi = tables.paired_text(r.mi_diff_mean, r.mi_diff_se, n)
        rows.append(
            [
                r.arm.replace("NCAI_lambda", "selected NCAI"),
                str(n),
                f"{round(r.ll_win_rate * n)} of {n}, {r.ll_win_ci}",
                ll,
                f"{round(r.mi_win_rate * n)} of {n}, {r.mi_win_ci}",
                mi,
                f"{int(r.lambda0_kept)} of {n}",
            ]
        )
    header = [
        "against BNN+LV (MFVI)",
        "problems",
        "test LL higher (95% CI)",
        "test LL difference: mean (SE), verdict",
        "`I(x; mu_z)` lower (95% CI)",
        "`I(x; mu_z)` difference: mean (SE), verdict",
        "`lambda = 0` kept",
    ]
    return tables.table(header, rows)


def family_lambda_table(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """What selection weighed (the CSV of :func:`select`): per NCAI term, its best ``lambda > 0``
    fit minus NCAI_0's best, paired by problem, in validation LL, test LL and ``I(x; mu_z)`` (mean
    (SE), verdict of :func:`.tables.paired_verdict`), and on how many problems the fit's own
    penalised statistic ended at or below 0.02 (its penalty spent) while KSG still measured
    ``I(x; mu_z)`` above 0.1 on the same means."""
    chosen = pd.concat(frames, ignore_index=True)
    zero = chosen[chosen["arm"] == "BNN+LV (NCAI_0)"].set_index("dataset")
    rows = []
    for arm in sorted(a for a in chosen["arm"].unique() if a.startswith("NCAI_lambda")):
        lam = chosen[chosen["arm"] == arm].set_index("dataset")
        cells = [tables.paired_cell(lam[f"lambda_{c}"], zero[c]) for c in ("valid_ll", "test_ll", "mi_x_z")]
        stat = lam["lambda_final_statistic"]
        spent = (stat <= 0.02) & (lam["lambda_mi_x_z"] > 0.1)
        quiet = f"{int(spent.sum())} of {len(lam)}" if stat.notna().any() else "n/a"  # pc logs no such statistic
        rows.append([arm.replace("NCAI_lambda", "NCAI_lambda fit"), str(len(lam)), *cells, quiet])
    header = [
        "term",
        "problems",
        "validation LL minus NCAI_0's: mean (SE), verdict",
        "test LL",
        "`I(x; mu_z)`",
        "statistic <= 0.02 (its own units: nats for k-NN terms, nHSIC for hsic) and `I(x; mu_z)` > 0.1",
    ]
    return tables.table(header, rows)


def run_family(
    problems: Sequence[str] | None = None,
    config: CompareConfig | None = None,
    terms: Sequence[str] = TERMS,
    *,
    lambda_only: bool = False,
    progress: bool = True,
    **sweep: object,
) -> pd.DataFrame:
    """Run the family's sweep (``sweep``: :func:`~pyro_bnnlv.sweep.run_sweep`'s options) and
    return its results table (one row per fit); ``lambda_only``: :func:`family_tasks`'."""
    cfg = config or CompareConfig()
    names = list(problems) if problems is not None else [p.name for p in FAMILY]
    tasks = family_tasks(names, cfg, terms, lambda_only=lambda_only)
    conf = dataclasses.asdict(cfg)
    meta = {"experiment": "ncai-family", "config": conf, "terms": list(terms)} | (
        {"lambda_only": True} if lambda_only else {}
    )
    return run_sweep(
        tasks, functools.partial(fit_task, config=conf), sweep_meta=meta, progress=progress, desc="ncai-family", **sweep
    )


def _stored_config(folder: str | Path) -> dict[str, object]:
    """The ``CompareConfig`` (as a dict) a family store was run with."""
    store = SweepStore(folder).open(lock=False, write=False)
    try:
        meta = store.meta().get("sweep_meta", {})
    finally:
        store.close()
    return json.loads(json.dumps(meta.get("config", {})))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pyro-bnnlv reproduce ncai-family", description=__doc__.split("\n\n")[0])
    p.add_argument("--problems", type=int, default=len(FAMILY), help="the first N problems of the family (24)")
    p.add_argument("--independence", nargs="+", default=list(TERMS), help="NCAI's independence terms to compare")
    p.add_argument("--steps", type=int, default=None, help="SVI steps per fit (default: compare's 3,000)")
    p.add_argument("--restarts", type=int, default=None, help="restarts per setting (default: compare's 2)")
    p.add_argument(
        "--lambda-only",
        action="store_true",
        help="only the NCAI_lambda fits of --independence (a term added to the family; "
        "its other fits come from --with-store)",
    )
    p.add_argument(
        "--with-store",
        action="append",
        default=[],
        metavar="DIR",
        help="another store of this family (e.g. the one with the other methods' fits) whose "
        "results join this run's before selection; repeatable",
    )
    p.add_argument("--output", help="CSV of the selected fits (one row per problem and method)")
    p.add_argument("--quiet", action="store_true")
    add_sweep_arguments(p)
    args = p.parse_args(argv)
    if not 1 <= args.problems <= len(FAMILY):
        p.error(f"--problems must lie in 1..{len(FAMILY)}, got {args.problems}")
    if args.output:
        folder = Path(args.output).resolve().parent
        if not folder.is_dir():
            p.error(f"--output: the folder {folder} does not exist; create it first")
    torch.set_num_threads(1)
    overrides = {k: v for k, v in dict(steps=args.steps, restarts=args.restarts).items() if v is not None}
    cfg = CompareConfig(**overrides)
    for folder in args.with_store:
        if not (Path(folder) / STORE_NAME).is_file():
            p.error(f"--with-store: {folder} holds no sweep store ({STORE_NAME})")
        other, ours = _stored_config(folder), json.loads(json.dumps(dataclasses.asdict(cfg)))
        if other != ours:
            differ = sorted(k for k in set(other) | set(ours) if other.get(k) != ours.get(k))
            p.error(
                f"--with-store: {folder} was run with other settings ({', '.join(differ)}); "
                f"its fits cannot be selected beside this run's"
            )
    results = run_family(
        [q.name for q in FAMILY[: args.problems]],
        cfg,
        args.independence,
        lambda_only=args.lambda_only,
        progress=not args.quiet,
        **sweep_options(args),
    )
    own = results
    if args.with_store:
        results = pd.concat([results, *(load_results(folder) for folder in args.with_store)], ignore_index=True)
    if (results["status"] == "done").any():
        chosen = select(results)
        print(chosen.pivot(index="dataset", columns="arm", values="test_ll").to_string(float_format="%.3f"))
        print(win_rates(chosen).to_string(index=False, float_format="%.3f"))
        if args.output:
            chosen.to_csv(args.output, index=False)
    return report(own)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
