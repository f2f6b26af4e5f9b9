"""Deprecated location of the NCAI comparison experiment: use :mod:`pyro_bnnlv.reproduce.ncai_compare`.

This alias re-exports the same objects, so ``from pyro_bnnlv.compare import run_compare`` keeps
working. It is also the recorded home of :func:`fit_task` (its ``__module__`` stays
``"pyro_bnnlv.compare"``): sweep stores fingerprint their task function as ``module:qualname``,
and the stores under ``docs/results/sweeps/`` were made with ``pyro_bnnlv.compare:fit_task``, so
this module must stay importable for them to resume and for worker processes to unpickle it.
"""

from __future__ import annotations

from .reproduce.ncai_compare import (
    COLUMNS,
    DATASET_SETTINGS,
    METHODS,
    CompareConfig,
    compare_tasks,
    fit_task,
    load_compare_data,
    plot_compare,
    run_compare,
    select_fits,
    task_setting,
)

__all__ = ["CompareConfig", "DATASET_SETTINGS", "run_compare", "load_compare_data", "compare_tasks",
           "fit_task", "task_setting", "select_fits", "plot_compare", "METHODS", "COLUMNS"]  # fmt: skip
