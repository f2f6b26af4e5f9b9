"""Experiments as sweeps: parallel, resumable, the same numbers on one core or a cluster.

A fit is a :class:`Task` (a frozen key: data set, split, method, grid point, restart, seed, with
a stable id) and a pure function ``fn(task) -> dict`` of results (registered under a stable name
with :func:`task_function` if it is part of the library). :func:`run_sweep` runs the
tasks that have no stored result on an executor (local worker processes, Ray, or inline), writes
each result to a SQLite store in the output directory as soon as it arrives (one transaction per
task), and returns the table of all tasks. Rerunning resumes; a failed task is recorded with its
traceback and the others go on.

Modules: :mod:`~pyro_bnnlv.sweep.task` (keys, ids, the sweep's identity),
:mod:`~pyro_bnnlv.sweep.store` (the SQLite store), :mod:`~pyro_bnnlv.sweep.executors`
(inline, local processes, Ray), :mod:`~pyro_bnnlv.sweep.run` (:func:`run_sweep`),
:mod:`~pyro_bnnlv.sweep.status` (progress and time still needed, from a store alone),
:mod:`~pyro_bnnlv.sweep.snapshot` (consistent copies of stores, also while a driver runs),
:mod:`~pyro_bnnlv.sweep.grid_search` (hyper-parameters, e.g. the noise, by validation LL).
"""

from .executors import EXECUTORS, check_ray_address
from .grid_search import grid_search
from .run import failures, load_results, run_sweep, summarize
from .store import STORE_NAME, SweepLockedError, SweepMismatchError, SweepStore, SweepStoreError
from .task import Task, code_version, task_function

__all__ = [
    "EXECUTORS",
    "STORE_NAME",
    "SweepLockedError",
    "SweepMismatchError",
    "SweepStore",
    "SweepStoreError",
    "Task",
    "check_ray_address",
    "code_version",
    "failures",
    "grid_search",
    "load_results",
    "run_sweep",
    "summarize",
    "task_function",
]
