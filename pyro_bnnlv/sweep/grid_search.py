"""Choose hyper-parameters (the observation noise first of all) by validation log-likelihood, on the
sweep layer.

The noise scale is the decision that moves a BNN's test log-likelihood most, and a learned noise
is no substitute: mean-field VI that learns it tends to overestimate it (the KL term rewards
explaining the data as noise). :func:`grid_search` fits one model per grid point (and seed) with
the user's own ``fit`` function, scores each on the data set's validation split with
:func:`pyro_bnnlv.evaluate` and returns the table with the best point, e.g.::

    def fit(data, seed, noise_scale):
        model = pb.BNN(pb.MLP(data.input_dim, [50], 1), noise_scale=noise_scale)
        guide = pb.MeanField(model)
        pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=3000, seed=seed, progress=False)
        return model, guide

    table = pb.grid_search(fit, data, {"noise_scale": [0.05, 0.1, 0.2, 0.4]})
    table.attrs["best"]          # {"noise_scale": 0.1}

The fits are sweep tasks (:func:`~pyro_bnnlv.sweep.run_sweep`): ``out_dir=`` keeps a resumable
store, ``executor="local", workers=2`` runs them in worker processes (``fit`` must then be a
module-level function of a file, as for any sweep task function).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..datasets.base import Dataset
from ..stats.predictive import evaluate
from .run import run_sweep
from .task import Task, task_function

__all__ = ["grid_search", "grid_search_task"]


@task_function("grid-search/fit")
def grid_search_task(task: Task, *, fit: Callable[..., Any], data: Dataset, num_samples: int = 500) -> dict[str, Any]:
    """One grid point: ``model, posterior = fit(data, seed, **point)``, then the validation metrics
    of :func:`pyro_bnnlv.evaluate` (``valid_test_ll`` is the validation log-likelihood)."""
    model, posterior = fit(data, task.seed, **task.params)
    metrics = evaluate(model, posterior, data, split="valid", seed=task.seed, num_samples=num_samples, intervals=False)
    return {f"valid_{k}": float(v) for k, v in metrics.items() if math.isfinite(float(v))}


def _check_grid(grid: Any) -> dict[str, list[Any]]:
    if not isinstance(grid, Mapping) or not grid:
        raise TypeError(
            f"grid must be a non-empty dict of name -> list of values, e.g. {{'noise_scale': [0.05, 0.1, "
            f"0.2]}}; got {grid!r}"
        )
    out = {}
    for name, values in grid.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"grid names must be keyword names of fit(data, seed, ...); got {name!r}")
        values = [values] if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) else list(values)
        if not values:
            raise ValueError(f"grid[{name!r}] is empty: give at least one value")
        out[name] = values
    return out


def grid_search(
    fit: Callable[..., Any],
    data: Dataset,
    grid: Mapping[str, Sequence[Any]],
    *,
    seeds: Sequence[int] = (0,),
    num_samples: int = 500,
    out_dir: str | Path | None = None,
    executor: str = "inline",
    workers: int | None = None,
    code_version: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Fit ``fit(data, seed, **point)`` at every point of ``grid`` (and every seed) and score it on
    ``data``'s validation split.

    Args:
        fit: returns ``(model, posterior)`` for :func:`pyro_bnnlv.evaluate` (a fitted guide, samples,
            an ``MCMC`` run or a ``LinearizedLaplace``); called with the data set, the seed and the
            grid point's values as keyword arguments.
        data: a :class:`~pyro_bnnlv.datasets.Dataset` with a validation split.
        grid: ``{name: [values]}``; every combination is a point (numbers, strings or bools).
        seeds: one fit per seed at each point; the points are ranked by their mean validation LL.
        num_samples: posterior draws per evaluation (from a guide).
        out_dir, executor, workers, code_version, progress: as for :func:`~pyro_bnnlv.sweep.run_sweep`.

    Returns the sweep's table (one row per fit: the point, ``seed``, ``status`` and the validation
    metrics, e.g. ``valid_test_ll``) with ``attrs["best"]`` the point with the highest mean
    validation log-likelihood and ``attrs["ranking"]`` the points' means over seeds, best first.
    """
    if not isinstance(data, Dataset):
        raise TypeError(
            f"data must be a pyro_bnnlv Dataset (pb.load_dataset, pb.datasets.from_arrays), got {type(data).__name__}"
        )
    if data.x_valid.shape[0] == 0:
        raise ValueError(f"data set {data.name!r} has no validation points: make it with a valid_fraction > 0")
    if not callable(fit):
        raise TypeError(
            f"fit must be a function fit(data, seed, **point) -> (model, posterior), got {type(fit).__name__}"
        )
    points = _check_grid(grid)
    names = list(points)
    tasks = [
        Task(data.name, "grid-search", grid=dict(zip(names, combo)), seed=int(seed))
        for combo in itertools.product(*points.values())
        for seed in seeds
    ]
    fn = functools.partial(grid_search_task, fit=fit, data=data, num_samples=int(num_samples))
    table = run_sweep(
        tasks,
        fn,
        out_dir=out_dir,
        executor=executor,
        workers=workers,
        code_version=code_version,
        progress=progress,
        desc="grid search",
    )
    done = table[table["status"] == "done"]
    if done.empty or "valid_test_ll" not in done:
        raise RuntimeError(f"every fit of the grid search failed:\n{table.attrs.get('summary', '')}")
    ranking = (
        done.groupby(names, sort=False)["valid_test_ll"].agg(["mean", "count"]).sort_values("mean", ascending=False)
    )
    best = ranking.index[0]
    table.attrs["best"] = dict(zip(names, best if isinstance(best, tuple) else (best,)))
    table.attrs["ranking"] = ranking
    return table
