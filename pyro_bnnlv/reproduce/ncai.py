"""The NCAI paper's protocol on its five synthetic sets (``pyro-bnnlv reproduce ncai``).

Yacoby, Pan & Doshi-Velez (2022), arXiv:1911.00569, sec. 7 and App. F.1: "We use the first
data-split to select hyper-parameters by selecting the hyper-parameters that yield the best
average log-likelihood performance on the validation set across 10 random restarts. After having
selected the hyper-parameter for each method, we select between NCAI_{lambda=0} and NCAI_lambda
[...]. Now, using the selected hyper-parameters and form of NCAI, we train our models on the
remaining 5 data-splits, averaging the best-of-10 random restarts (selected by validation
log-likelihood) across the data-splits."

Here a data split is a seed of the synthetic generator (split 0 selects, splits 1-5 evaluate).
Both stages are sweeps (:mod:`pyro_bnnlv.sweep`) with a store per data set and stage under
``--out``, so a run killed or stopped at the end of a session resumes where it stopped (pin
``--code-version`` to resume after edits that cannot change the numbers). Each fit is
:func:`~pyro_bnnlv.reproduce.ncai_compare.fit_task` with
:class:`~pyro_bnnlv.reproduce.ncai_compare.CompareConfig` settings (``--full``: 30,000 steps,
10 restarts, the App. F.1 grids, empirical Bayes).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from pathlib import Path
from unittest.mock import patch

import pandas as pd
import torch
from pyro.infer.autoguide import AutoNormal

from ..datasets import ORACLE_DATASETS, expected_test_ll, load_dataset
from ..guides import init_to_network
from ..guides.ncai_init import ncai_guide
from ..infer.elbos.fused import FusedTraceElbo
from ..infer.elbos import ncai as ncai_elbo
from ..infer.elbos.ncai import NCAIElbo
from ..infer.svi import adam, fit_svi
from ..models.bnnlv import BNNLV
from ..nets import MLP
from ..param_names import own_param_names
from ..sweep import Task, run_sweep
from ..sweep.cli import add_sweep_arguments, report, sweep_options
from . import tables
from .timing import ALTERNATED, fit_step_ms, fit_step_ms_beside
from .ncai_compare import METHODS, CompareConfig, compare_tasks, fit_task, load_compare_data, task_setting

__all__ = ["DATASETS", "PAPER", "main", "run_protocol", "select_settings", "summary", "true_test_ll"]

DATASETS = ("heavy-tail", "goldberg", "williams", "yuan", "depeweg")

#: The paper's test log-likelihood (Table 4), I(x; mu_z) (Table 2) and HZ(mu_z) (Table 3) for
#: (BNN, BNN+LV MFVI, NCAI_0, NCAI_lambda); NaN where the paper has no entry.
PAPER = {
    "test_ll": {
        "heavy-tail": (-2.47, -1.867, -1.481, -1.426),
        "goldberg": (-1.055, -1.026, -0.962, -0.963),
        "williams": (-1.591, -1.033, -0.414, -0.414),
        "yuan": (-2.846, -1.278, -1.211, -1.211),
        "depeweg": (-2.306, -2.342, -1.973, -1.973),
    },
    "mi_x_z": {  # MFVI / NCAI_lambda
        "heavy-tail": (0.243, 0.036),
        "goldberg": (0.229, 0.046),
        "williams": (0.982, 0.519),
        "yuan": (0.24, 0.283),
        "depeweg": (0.428, 0.032),
    },
    "hz_z": {
        "heavy-tail": (4.70, 0.027),
        "goldberg": (0.92, 0.026),
        "williams": (6.45, 7.25),
        "yuan": (5.25, 8.09),
        "depeweg": (6.41, 0.79),
    },
}


def select_settings(results: pd.DataFrame) -> dict[str, str]:
    """Stage 1: per method the setting with the best *mean* validation LL over restarts, and
    ``NCAI_lambda``'s replaced by ``"lambda=0"`` where ``NCAI_0``'s mean validates better."""
    done = results[results["status"] == "done"]
    means = done.groupby(["method", "setting"])["valid_ll"].mean()
    chosen = {m: means.loc[m].idxmax() for m in METHODS if m in means.index.get_level_values(0)}
    lam, zero = "BNN+LV (NCAI_lambda)", "BNN+LV (NCAI_0)"
    if lam in chosen and zero in chosen and means.loc[(zero, chosen[zero])] >= means.loc[(lam, chosen[lam])]:
        chosen[lam] = "lambda=0"
    return chosen


def _evaluation_tasks(dataset: str, cfg: CompareConfig, chosen: dict[str, str], splits: Sequence[int]) -> list[Task]:
    tasks = []
    for task in compare_tasks(dataset, cfg, splits=list(splits)):
        setting = chosen.get(task.method)
        if task_setting(task, cfg.independence) == setting:  # "lambda=0" matches no NCAI_lambda task
            tasks.append(task)
    return tasks


def _best_per_split(results: pd.DataFrame, chosen: dict[str, str]) -> pd.DataFrame:
    """Per evaluation split and method, the restart with the best validation LL; a split whose
    restarts are not all finished (a run stopped part-way) gives no row rather than the best of
    some restarts."""
    group = pd.MultiIndex.from_frame(results[["split", "method"]])
    unfinished = group.isin(group[(results["status"] == "pending").to_numpy()])
    done = results[(results["status"] == "done").to_numpy() & ~unfinished]
    best = done.loc[done.groupby(["split", "method"])["valid_ll"].idxmax()].copy()
    if chosen.get("BNN+LV (NCAI_lambda)") == "lambda=0":
        zero = best[best["method"] == "BNN+LV (NCAI_0)"].assign(method="BNN+LV (NCAI_lambda)")
        best = pd.concat([best, zero], ignore_index=True)
    return best


def run_protocol(
    datasets: Sequence[str] = DATASETS,
    config: CompareConfig | Callable[[str], CompareConfig] | None = None,
    *,
    splits: Sequence[int] = (1, 2, 3, 4, 5),
    out: str | Path,
    progress: bool = True,
    **sweep: object,
) -> pd.DataFrame:
    """Both stages on every data set; returns one row per (data set, method, evaluation split)
    with the selected setting. Stores: ``out/<dataset>/selection`` and ``out/<dataset>/evaluation``.
    ``config``: one :class:`CompareConfig` for every data set, or a function of the data set's name
    (``lambda name: CompareConfig.full(dataset=name)``: F.1's per-data-set grids).

    ``stop_after`` (seconds, in ``sweep``) is one deadline for the whole protocol: no task starts
    after it. A data set whose selection stage is incomplete does not start its evaluation stage,
    and its rows are missing from the table; ``table.attrs["pending"]`` counts the tasks left
    (the evaluation stage's only once it is planned)."""
    config_for = config if callable(config) else (lambda name: config or CompareConfig())
    stop_after = sweep.pop("stop_after", None)
    t0 = time.perf_counter()

    def remaining() -> float | None:
        return None if stop_after is None else max(0.0, float(stop_after) - (time.perf_counter() - t0))

    frames, failed, pending, incomplete = [], 0, 0, []
    for name in datasets:
        name = load_compare_data(name).name
        cfg = config_for(name)
        conf = dataclasses.asdict(cfg)
        fn = functools.partial(fit_task, config=conf)
        meta = {"experiment": "ncai-protocol", "config": conf}
        stage1 = run_sweep(
            compare_tasks(name, cfg, splits=[0]),
            fn,
            out_dir=Path(out) / name / "selection",
            sweep_meta=meta,
            progress=progress,
            desc=f"{name} selection",
            stop_after=remaining(),
            **sweep,
        )
        failed += stage1.attrs["failed"]
        if stage1.attrs["pending"]:
            pending += stage1.attrs["pending"]
            incomplete.append(f"{name} (selection)")
            continue
        chosen = select_settings(stage1)
        tasks = _evaluation_tasks(name, cfg, chosen, splits)
        stage2 = run_sweep(
            tasks,
            fn,
            out_dir=Path(out) / name / "evaluation",
            sweep_meta=meta,
            progress=progress,
            desc=f"{name} evaluation",
            stop_after=remaining(),
            **sweep,
        )
        failed += stage2.attrs["failed"]
        if stage2.attrs["pending"]:
            pending += stage2.attrs["pending"]
            incomplete.append(f"{name} (evaluation)")
        best = _best_per_split(stage2, chosen)
        frames.append(best.assign(selected=best["method"].map(chosen)))
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["dataset", "method", "split"])
    summary = f"{len(table)} selected fits; {failed} failed tasks"
    if incomplete:
        summary += (
            f"\nincomplete: {pending} tasks pending in {', '.join(incomplete)}; run the same command again to continue"
        )
    table.attrs.update(failed=failed, pending=pending, summary=summary)
    return table


@functools.lru_cache(maxsize=None)
def true_test_ll(dataset: str) -> float:
    """The data set's test-LL ceiling ``E[log p(y | x)]`` under its generating process
    (:func:`pyro_bnnlv.datasets.expected_test_ll`; 20,000 points where it is a Monte Carlo mean,
    standard error below 0.01), NaN for a set without a known density."""
    if dataset not in ORACLE_DATASETS:
        return float("nan")
    return expected_test_ll(dataset, num_points=20_000, nodes=1000).value


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation over splits per (data set, method), beside the paper's values
    and the set's test-LL ceiling ``true_test_ll`` (:func:`true_test_ll`, the same per set)."""
    cols = ["test_ll", "mi_x_z", "hz_z"]
    agg = table.groupby(["dataset", "method"], sort=False)[cols].agg(["mean", "std"])
    agg.columns = [f"{c}_{s}" for c, s in agg.columns]
    paper_ll = []
    for dataset, method in agg.index:
        values = PAPER["test_ll"].get(dataset)
        paper_ll.append(values[METHODS.index(method)] if values else float("nan"))
    agg["paper_test_ll"] = paper_ll
    agg["true_test_ll"] = [true_test_ll(dataset) for dataset, _ in agg.index]
    agg["splits"] = table.groupby(["dataset", "method"], sort=False).size()
    return agg


def _full_config(name: str, overrides: dict) -> CompareConfig:
    return CompareConfig.full(dataset=name, **overrides)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pyro-bnnlv reproduce ncai", description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="*", default=list(DATASETS))
    p.add_argument("--full", action="store_true", help="the paper's budget (30,000 steps, 10 restarts, EB)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--restarts", type=int, default=None)
    p.add_argument("--independence", choices=["hsic", "pc"], default=None)
    p.add_argument("--splits", type=int, default=5, help="evaluation splits (1..N; split 0 selects)")
    p.add_argument("--output", help="CSV of the selected fits")
    p.add_argument("--quiet", action="store_true")
    add_sweep_arguments(p)
    args = p.parse_args(argv)
    if args.out is None:
        p.error("--out DIR is required: the protocol is long and resumes from its stores")
    torch.set_num_threads(1)
    overrides = {
        k: v
        for k, v in dict(steps=args.steps, restarts=args.restarts, independence=args.independence).items()
        if v is not None
    }
    if args.full:
        cfg = functools.partial(_full_config, overrides=overrides)  # F.1's grids per data set
    else:
        cfg = CompareConfig.full(**{"steps": 3000, "restarts": 2, "empirical_bayes": False, **overrides})
    opts = sweep_options(args)
    out = opts.pop("out_dir")
    table = run_protocol(args.datasets, cfg, splits=range(1, args.splits + 1), out=out, progress=not args.quiet, **opts)
    if len(table):
        print(summary(table).to_string(float_format="%.3f"))
    if args.output:
        table.to_csv(args.output, index=False)
    return report(table)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


def _bench_pair(kind: str, data: Any, seed: int) -> tuple[BNNLV, AutoNormal, NCAIElbo | None]:
    """The benchmark's BNN+LV (1x50 LeakyReLU) on heavy-tail, its guide and loss for ``kind``
    (``"mfvi"``: ``AutoNormal`` and ``fit_svi``'s default loss, ``None``)."""
    model = BNNLV(MLP(2, [50], 1, activation="leaky_relu"), latent_scale=0.1, noise_scale=math.sqrt(0.1))
    if kind == "mfvi":
        guide = AutoNormal(
            model, init_scale=0.01, create_plates=model.create_plates, init_loc_fn=init_to_network(model, seed=seed)
        )
        return model, own_param_names(guide), None
    guide = ncai_guide(model, data.x_train, data.y_train, num_steps=50, seed=seed)
    loss = NCAIElbo(
        jit=kind == "ncai-jit",
        fused=kind in ("ncai-fused", "ncai-after", "ncai-started", "ncai-torch", "ncai-pc"),
        independence="pc" if kind == "ncai-pc" else "hsic",
    )
    return model, guide, loss


@contextlib.contextmanager
def _kind_settings(kind: str) -> Iterator[None]:
    """The settings a bench ``kind`` runs under: ``"ncai-torch"``, the statistics on their
    pure-torch path, as without a C++ compiler; ``"ncai-after"``, computed after the ELBO (HZ and
    HSIC side by side on torch's intra-op pool), as when no core is free of that pool;
    ``"ncai-started"``, started on the kernels' worker thread before the ELBO, as when one is; the
    others, as they are (the default chooses by :func:`~pyro_bnnlv.infer.elbos.ncai._core_beside_the_pool`)."""
    # a mock only where it changes something: every call of one is recorded
    free_core = {"ncai-after": False, "ncai-started": True}.get(kind)
    with (
        patch.dict(os.environ, {"PYRO_BNNLV_COMPILED": "0"} if kind == "ncai-torch" else {}),
        patch.object(ncai_elbo, "_core_beside_the_pool", return_value=free_core)
        if free_core is not None
        else contextlib.nullcontext(),
    ):
        yield


def _ncai_step_ms(kind: str, data: Any, steps: int, seed: int) -> float:
    """Median ms per ``fit_svi`` step on heavy-tail's BNN+LV (1x50 LeakyReLU), full batch."""
    model, guide, loss = _bench_pair(kind, data, seed)
    with _kind_settings(kind):
        return fit_step_ms(model, guide, data.x_train, data.y_train, steps, loss=loss, seed=seed)


def _mfvi_step(data: Any, seed: int) -> Callable[[], None]:
    """One BNN+LV MFVI step as ``fit_svi`` takes it (its default loss's ``loss_and_grads``, one
    Adam update at its default rate), callable outside ``fit_svi`` after a first step in it."""
    model, guide, _ = _bench_pair("mfvi", data, seed)
    x, y = data.x_train, data.y_train
    loss = FusedTraceElbo()
    fit_svi(model, guide, x, y, num_steps=1, loss=loss, seed=seed, progress=False)  # sets the pair up
    optimizer = adam(list(guide.parameters()), lr=0.01)  # fit_svi's optimizer (torch's fused Adam)

    def step() -> None:
        loss.loss_and_grads(model, guide, x, y)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _ncai_beside_mfvi_ms(data: Any, steps: int, seed: int, kind: str = "ncai-fused") -> tuple[float, float]:
    """NCAIElbo's ``fit_svi`` step (``kind`` of :func:`_ncai_step_ms`: the default,
    ``"ncai-after"`` or ``"ncai-started"``) and the MFVI step (:func:`_mfvi_step`) alternated in
    blocks of steps (:func:`~pyro_bnnlv.reproduce.timing.fit_step_ms_beside`): ``(ncai, mfvi)`` ms."""
    model, guide, loss = _bench_pair(kind, data, seed)
    with _kind_settings(kind):
        return fit_step_ms_beside(
            _mfvi_step(data, seed), model, guide, data.x_train, data.y_train, steps, loss=loss, seed=seed
        )


def ncai_bench(steps: int = 300, rounds: int = 3, seed: int = 0) -> pd.DataFrame:
    """``pyro-bnnlv bench ncai``: ms per SVI step on heavy-tail (N = 300, 1x50), NCAIElbo vs MFVI.

    Contenders, alternated in rounds: BNN+LV MFVI (``fit_svi``'s default, the fused
    ``Trace_ELBO`` of :class:`~pyro_bnnlv.infer.elbos.fused.FusedTraceElbo`), NCAIElbo's
    default (fused, the HSIC term's statistics in one call of the compiled pairwise kernels,
    :func:`~pyro_bnnlv.stats._pairwise.ncai_statistics`: started on another thread before the
    ELBO when a core is free of torch's intra-op pool, else computed after it with HZ and HSIC
    side by side on that pool), each of those two ways forced, the statistics on their pure-torch
    path (``PYRO_BNNLV_COMPILED=0``, what runs without a C++ compiler), fused with the printed
    correlation term, compiled with ``torch.jit`` (``jit=True``, the previous default), and traced
    eagerly (``fused=False``), each in runs of its own; and NCAIElbo's default and its two ways
    forced, each with the MFVI step **alternated in blocks of steps** in one fit (the MFVI step
    runs in ``fit_svi``'s callback), whose ratio (median over rounds) the target reads: separate
    runs put the two at different moments of a shared machine's load. Per-step medians include
    ``fit_svi``'s guard (checks at steps 1, 10, 100, 1,000; the step-100 check falls inside the
    timed window).
    """

    data = load_dataset("heavy-tail", seed=seed)
    labels = {
        "mfvi": "BNN+LV MFVI (fit_svi default: fused Trace_ELBO)",
        "ncai-fused": "NCAIElbo default: fused, HSIC term",
        "ncai-after": "NCAIElbo fused, HSIC term, statistics after the ELBO (on the intra-op pool)",
        "ncai-started": "NCAIElbo fused, HSIC term, statistics started on a worker thread before the ELBO",
        "ncai-torch": "NCAIElbo fused, HSIC term, torch statistics (no C++)",
        "ncai-pc": "NCAIElbo fused, printed PC term",
        "ncai-jit": "NCAIElbo jit=True (torch.jit), HSIC term",
        "ncai-eager": "NCAIElbo traced eagerly (fused=False), HSIC term",
    }
    alternated = ("ncai-fused", "ncai-after", "ncai-started")
    times: dict[str, list[float]] = {k: [] for k in labels}
    beside: dict[str, list[tuple[float, float]]] = {k: [] for k in alternated}
    for r in range(rounds):
        for kind in labels:
            times[kind].append(_ncai_step_ms(kind, data, steps, seed + r))
        for kind in alternated:
            beside[kind].append(_ncai_beside_mfvi_ms(data, steps, seed + r, kind))
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [(labels[k], med[k], med[k] / med["mfvi"]) for k in labels]
    for kind in alternated:
        ours, theirs = (statistics.median(v) for v in zip(*beside[kind]))
        rows += [
            (ALTERNATED + ": " + labels[kind], ours, statistics.median(a / b for a, b in beside[kind])),
            (ALTERNATED + " with it: BNN+LV MFVI", theirs, 1.0),
        ]
    table = pd.DataFrame(rows, columns=["loss", "ms_per_step", "ratio_to_mfvi"]).set_index("loss")
    ratio = statistics.median(a / b for a, b in beside["ncai-fused"])
    table.attrs[f"NCAIElbo default / MFVI step {ALTERNATED}, target <= 1.3"] = ratio
    return table


# --------------------------------------------------------------------------- results tables


#: the order of ``ncai.PAPER``'s tuples
_NCAI_ORDER = ("BNN (MFVI)", "BNN+LV (MFVI)", "BNN+LV (NCAI_0)", "BNN+LV (NCAI_lambda)")


_NCAI_LABELS = {
    "BNN (MFVI)": "BNN MFVI",
    "BNN+LV (MFVI)": "BNN+LV MFVI",
    "BNN+LV (NCAI_0)": "BNN+LV NCAI_0",
    "BNN+LV (NCAI_lambda)": "BNN+LV NCAI_lambda",
}


def _ncai_paper(dataset: str, method: str) -> tuple[float, float, float]:
    """The NCAI paper's (test LL, I(x; mu_z), HZ(mu_z)) for one method; NaN where it has none."""
    nan = float("nan")
    ll = PAPER["test_ll"].get(dataset)
    ll = ll[_NCAI_ORDER.index(method)] if ll and method in _NCAI_ORDER else nan
    pos = {"BNN+LV (MFVI)": 0, "BNN+LV (NCAI_lambda)": 1}.get(method)
    mi = PAPER["mi_x_z"].get(dataset, (nan, nan))[pos] if pos is not None else nan
    hz = PAPER["hz_z"].get(dataset, (nan, nan))[pos] if pos is not None else nan
    return ll, mi, hz


def compare_table(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """``pyro-bnnlv compare DATASET --output CSV``: one row per method (best restart of split 0);
    further CSVs (the ``--independence pc`` run) add their NCAI_lambda row. Bold: the best test LL
    among the BNN+LV rows, and NCAI_lambda's I and HZ where no other BNN+LV row is lower."""
    dataset = options.get("dataset") or Path(paths[0]).stem.removeprefix("compare-").removesuffix("-pc")
    rows: list[tuple[str, str, pd.Series, bool]] = []  # label, method, row, with paper values
    for i, (frame, path) in enumerate(zip(frames, paths)):
        term = "printed PC term (`--independence pc`)" if Path(path).stem.endswith("-pc") else "HSIC term"
        for _, row in frame.iterrows():
            method = row["method"]
            if i > 0 and method != "BNN+LV (NCAI_lambda)":
                continue
            label = _NCAI_LABELS.get(method, method)
            if method == "BNN+LV (NCAI_lambda)" and len(frames) > 1:
                label += f", {term}"
            rows.append((label, method, row, i == 0))
    lv = [k for k, (_, m, _, _) in enumerate(rows) if m.startswith("BNN+LV")]
    best_ll = tables.best([rows[k][2]["test_ll"] for k in lv], largest=True)
    best_ll = lv[best_ll] if best_ll is not None else None
    lowest = {}
    for col in ("mi_x_z", "hz_z"):
        k = tables.best([rows[j][2][col] for j in lv], largest=False)
        lowest[col] = lv[k] if k is not None and rows[lv[k]][1] == "BNN+LV (NCAI_lambda)" else None
    out = []
    for k, (label, method, row, paper) in enumerate(rows):
        ll_p, mi_p, hz_p = _ncai_paper(dataset, method) if paper else (float("nan"),) * 3
        out.append(
            [
                label,
                tables.with_paper(tables.bold(tables.num(row["test_ll"]), k == best_ll), ll_p),
                tables.with_paper(tables.bold(tables.num(row["mi_x_z"]), k == lowest["mi_x_z"]), mi_p, printed=True),
                tables.with_paper(tables.bold(tables.num(row["hz_z"]), k == lowest["hz_z"]), hz_p, printed=True),
            ]
        )
    header = [
        f"{dataset}, split 0",
        "test LL (paper Table 4)",
        "`I(x; mu_z)` (paper Table 2)",
        "`HZ(mu_z)` (paper Table 3)",
    ]
    return tables.table(header, out)


def _setting_label(selected: str) -> str:
    """``"noise_var=0.1, eps_T=0.01, eps_x=1"`` -> ``"eps_T 0.01, eps_x 1"``."""
    if selected == "lambda=0":
        return "lambda = 0"
    parts = [p.strip().replace("=", " ") for p in str(selected).split(",") if not p.strip().startswith("noise_var")]
    return ", ".join(parts)


def protocol_table(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """``pyro-bnnlv reproduce ncai --output CSV``: mean over the evaluation splits per data set
    and method (the test LL's sd in brackets), then the paper's value in brackets. Bold: the best
    test LL per data set, and NCAI_lambda's I and HZ where no other BNN+LV method is lower. In
    italics under each set: its test-LL ceiling, the expected LL of the true conditional density
    (:func:`pyro_bnnlv.reproduce.ncai.true_test_ll`)."""
    table = pd.concat(frames, ignore_index=True)
    summ = summary(table)
    selected = table.groupby(["dataset", "method"], sort=False)["selected"].first()
    splits = sorted(set(summ["splits"]))
    out = []
    for dataset in summ.index.get_level_values(0).unique():
        block = summ.loc[dataset]
        methods = list(block.index)
        best_ll = tables.best(list(block["test_ll_mean"]), largest=True)
        lv = [i for i, m in enumerate(methods) if m.startswith("BNN+LV")]
        lowest = {}
        for col in ("mi_x_z", "hz_z"):
            k = tables.best([block[f"{col}_mean"].iloc[i] for i in lv], largest=False)
            lowest[col] = lv[k] if k is not None and methods[lv[k]] == "BNN+LV (NCAI_lambda)" else None
        for i, method in enumerate(methods):
            r = block.loc[method]
            ll_p, mi_p, hz_p = _ncai_paper(dataset, method)
            label = _NCAI_LABELS.get(method, method)
            if method == "BNN+LV (NCAI_lambda)":
                label += f" ({_setting_label(selected[(dataset, method)])})"
            if i == 0:
                label = f"**{dataset}** {label}"

            def cell(col: str, paper: float, bold: bool, printed: bool, sd: bool = False) -> str:
                mean = tables.num(r[f"{col}_mean"])
                if not mean:
                    return ""
                text = tables.bold(mean, bold) + (f" ({tables.num(r[f'{col}_std'])})" if sd else "")
                return tables.with_paper(text, paper, printed)

            out.append(
                [
                    label,
                    cell("test_ll", ll_p, i == best_ll, False, sd=True),
                    cell("mi_x_z", mi_p, i == lowest["mi_x_z"], True),
                    cell("hz_z", hz_p, i == lowest["hz_z"], True),
                ]
            )
        ceiling = tables.num(block["true_test_ll"].iloc[0])  # "" for a set without a known density
        if ceiling:
            out.append(["*ceiling: the true density*", f"*{ceiling}*", "", ""])
    n = ", ".join(str(s) for s in splits)
    header = [f"{n} splits, mean", "test LL (sd) (paper)", "`I(x; mu_z)` (paper)", "`HZ(mu_z)` (paper)"]
    return tables.table(header, out)


def paired_table(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """NCAI_lambda against each other method per data set, paired by evaluation split: the mean
    difference of test LL, ``I(x; mu_z)`` and ``HZ(mu_z)`` over the splits with its standard error,
    and the verdict (:func:`.tables.paired_verdict`): "tie" where a paired t-test does not reject
    equality at the 5% level (``|mean| < t_{0.975, n-1} SE``), else which way the difference goes:
    an ordering of two means over a few splits is a claim only with this."""
    table = pd.concat(frames, ignore_index=True)
    lam = "BNN+LV (NCAI_lambda)"
    rows = []
    for dataset, block in table.groupby("dataset", sort=False):
        wide = tables.by_method(block, "split", ("test_ll", "mi_x_z", "hz_z"))
        for k, other in enumerate(m for m in METHODS if m != lam and m in wide["test_ll"].columns):
            cells = []
            for col in ("test_ll", "mi_x_z", "hz_z"):
                w = wide[col]
                both = lam in w.columns and other in w.columns
                cells.append(tables.paired_cell(w[lam], w[other]) if both else "")
            rows.append([f"**{dataset}**" if k == 0 else "", _NCAI_LABELS.get(other, other), *cells])
    header = ["set", "NCAI_lambda minus", "test LL: mean (SE), verdict", "`I(x; mu_z)`", "`HZ(mu_z)`"]
    return tables.table(header, rows)


def paired_summary(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """One paragraph from the same paired differences as :func:`paired_table`: the sets where
    NCAI_lambda's test LL is above, tied with (paired t-test at 5%) or below the BNN's and BNN+LV
    MFVI's, with the mean difference and its standard error, and where its ``I(x; mu_z)`` and
    ``HZ(mu_z)`` are below MFVI's."""
    table = pd.concat(frames, ignore_index=True)
    lam, mfvi, bnn = "BNN+LV (NCAI_lambda)", "BNN+LV (MFVI)", "BNN (MFVI)"
    sets = list(table["dataset"].drop_duplicates())
    splits = sorted(set(table.groupby(["dataset", "method"])["split"].nunique()))

    def verdicts(other: str, col: str) -> dict[str, list[tuple[str, float, float]]]:
        out: dict[str, list[tuple[str, float, float]]] = {}
        for dataset in sets:
            w = tables.by_method(table[table["dataset"] == dataset], "split", [col])[col]
            if lam in w.columns and other in w.columns:
                mean, se, n = tables.paired(w[lam], w[other])
                out.setdefault(tables.paired_verdict(mean, se, n), []).append((dataset, mean, se))
        return out

    def where(items: list[tuple[str, float, float]], each: bool = False) -> str:
        if len(items) > 2 and not each:
            means, ses = [m for _, m, _ in items], [s for _, _, s in items]
            names = f"all {len(sets)}" if len(items) == len(sets) else tables.listing([d for d, _, _ in items])
            return (
                f"{names} (differences {tables.num(min(means))} to {tables.num(max(means))} nats, SE at most "
                f"{tables.num(max(ses))})"
            )
        return tables.listing([f"{d} ({tables.num(m)}, SE {tables.num(s)})" for d, m, s in items])

    parts = []
    for other, name in ((bnn, "the BNN"), (mfvi, "BNN+LV MFVI")):
        v = verdicts(other, "test_ll")
        said = [f"above {{}} on {where(v['higher'])}"] if v.get("higher") else []
        said += [f"tied with {{}} on {where(v['tie'], each=True)}"] if v.get("tie") else []
        said += [f"below {{}} on {where(v['lower'])}"] if v.get("lower") else []
        parts.append(", ".join(c.format(f"{name}'s" if k == 0 else "it") for k, c in enumerate(said)))
    n = " or ".join(str(s) for s in splits)
    text = f"Paired by split ({n} splits, t-test at 5%), NCAI_lambda's test LL is " + "; ".join(parts) + "."
    for col, stat in (("mi_x_z", "`I(x; mu_z)`"), ("hz_z", "`HZ(mu_z)`")):
        v = verdicts(mfvi, col)
        lower = [d for d, _, _ in v.get("lower", [])]
        rest = [
            f"{'a tie' if k == 'tie' else 'higher'} on {tables.listing([d for d, _, _ in v[k]])}"
            for k in ("tie", "higher")
            if v.get(k)
        ]
        text += (
            f" Its {stat} is below MFVI's on {len(lower)} of {len(sets)}"
            + (f" ({'; '.join(rest)})" if rest else "")
            + "."
        )
    return text
