"""Run a sweep: plan the tasks in the store, run the unfinished ones, return the table.

:func:`run_sweep` is what ``compare`` and every ``reproduce`` command call, and what a user calls
for a grid of their own::

    from pyro_bnnlv.sweep import Task, run_sweep

    def fit_one(task: Task) -> dict:          # module level, so worker processes can import it
        data = load_dataset(task.dataset, split=task.split)
        ...                                   # seeded from task.seed by run_sweep
        return {"test_ll": ..., "rmse": ...}

    tasks = [Task(name, method=m, split=s, seed=s) for name in names for m in methods for s in range(10)]
    table = run_sweep(tasks, fit_one, out_dir="runs/my-grid", workers=8)   # or executor="ray"

Run the same call again (after a crash, a ``kill -9``, on another machine with the store copied
over) and only the tasks without a result run; the table is the same as an uninterrupted run's.
A sweep longer than the machine is free can run in instalments: ``stop_after=8 * 3600`` starts no
task after eight hours and lets the running ones finish (a ``kill`` would lose them), and
``stop_after=0`` runs nothing and returns the table so far, also while another process runs the
sweep.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from .executors import check_executor_args, cores_note, make_executor
from .store import SweepLockedError, SweepStore
from .task import Task, check_picklable, code_version as current_code_version, sweep_identity

__all__ = ["failures", "load_results", "run_sweep", "summarize"]


def _check_tasks(tasks: Sequence[Task]) -> list[Task]:
    tasks = list(tasks)
    if not tasks:
        raise ValueError("tasks is empty; a sweep needs at least one Task")
    bad = [t for t in tasks if not isinstance(t, Task)]
    if bad:
        raise TypeError(f"tasks must be pyro_bnnlv.sweep.Task objects, got {type(bad[0]).__name__}")
    seen: dict[str, Task] = {}
    for t in tasks:
        if t.id in seen:
            raise ValueError(f"tasks holds the same task twice: {t.key()}; give repeats distinct restart=")
        seen[t.id] = t
    return tasks


def _check_run_arguments(
    fn: Callable,
    executor: str,
    workers: int | None,
    threads: int,
    address: str | None,
    stop_after: float | None,
    out_dir: str | Path | None,
) -> None:
    """:func:`run_sweep`'s checks of its execution arguments (the task function picklable for
    worker processes), before its store is touched."""
    if out_dir is None and stop_after is not None:
        raise ValueError(
            "stop_after leaves tasks pending to run later, but without out_dir the store is a temporary "
            "directory, deleted on return: give out_dir (the command's --out DIR) to resume from"
        )
    if stop_after is not None and (
        isinstance(stop_after, bool) or not isinstance(stop_after, (int, float)) or not stop_after >= 0
    ):
        raise ValueError(f"stop_after must be a number of seconds >= 0 (or None), got {stop_after!r}")
    check_executor_args(executor, workers, threads, address)
    if executor != "inline":
        check_picklable(fn)


def _open_store(store: SweepStore, stop_after: float | None) -> bool:
    """Open ``store`` locked for a run; for ``stop_after=0`` (a look) read-only if another
    process is running the sweep, which the result says (``True``)."""
    try:
        store.open(write=stop_after != 0 or not store.path.exists())
        return False
    except SweepLockedError:
        if stop_after != 0:
            raise
        store.open(lock=False)
        return True


def run_sweep(
    tasks: Sequence[Task],
    fn: Callable[[Task], Mapping[str, Any]],
    *,
    out_dir: str | Path | None,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    threads: int = 1,
    sweep_meta: Mapping[str, Any] | None = None,
    code_version: str | None = None,
    retry_failed: bool = True,
    prepare: Callable[[], object] | None = None,
    progress: bool = True,
    desc: str = "sweep",
    stop_after: float | None = None,
) -> pd.DataFrame:
    """Run ``fn`` on every task without a stored result and return the table of all tasks.

    Args:
        tasks: the sweep's :class:`Task` objects (distinct; their order is the table's order).
        fn: ``fn(task) -> dict`` of str/int/float/bool/None results; a module-level function or
            a ``functools.partial`` of one (worker processes import it). It must depend on the
            task (and the partial's bound settings) only; ``run_sweep`` seeds Python, NumPy,
            torch and Pyro with ``task.seed`` and clears Pyro's parameter store before each call.
            An exception is recorded with its traceback and the sweep goes on.
        out_dir: directory of the results store (``sweep.sqlite``, see
            :mod:`pyro_bnnlv.sweep.store`); created if missing. A store of a different sweep
            (other tasks, function, ``sweep_meta`` or code version) raises
            :class:`~pyro_bnnlv.sweep.SweepMismatchError` and is left untouched. ``None``: a
            temporary directory, removed afterwards (nothing to resume).
        executor: ``"local"`` (worker processes on this machine), ``"ray"`` (a Ray cluster at
            ``address``, or a local Ray instance) or ``"inline"`` (this process, for debugging).
            Local workers are started with ``spawn`` and import the main script again: a script
            that calls ``run_sweep`` at module level needs ``if __name__ == "__main__":``.
        workers: parallel tasks; default: this machine's cores (``"local"``, capped at the number
            of unfinished tasks) or the Ray cluster's CPUs.
        address: the Ray cluster (``host:port``, ``ray://host:port`` or ``"auto"``); unreachable
            addresses raise ``ConnectionError`` within seconds.
        threads: torch threads per task (default 1). Fixed, not ``cores // workers``: torch's
            floating-point results depend on the thread count, so a sweep's numbers would
            otherwise depend on its worker count.
        sweep_meta: JSON-able settings that identify the sweep beyond its tasks (budgets, ...).
        code_version: the label of the code that computes the results, which the store must
            agree on (else :class:`~pyro_bnnlv.sweep.SweepMismatchError`). Default
            :func:`~pyro_bnnlv.sweep.task.code_version` of ``fn``, which any edit of the package
            or the task code changes. A pinned label declares that the code under it computes the
            same results (resume after an edit that cannot change them with the stored label,
            which the error quotes); a task function without readable source needs one.
        retry_failed: rerun tasks that failed in an earlier run (default) or keep their failure.
        prepare: called once in this process, in a thread beside the first tasks (waited for
            before ``run_sweep`` returns), e.g. ``pyro_bnnlv._compiled.nuts_extension`` to
            compile the NUTS core once while the workers start.
        progress: one tqdm bar over the tasks (done / running / failed, ETA).
        stop_after: seconds after which no task starts (running tasks finish; the others stay
            pending for the next run); ``None``: run every task. ``0`` runs nothing: the table of
            the store so far, read without the lock if another process is running the sweep.

    Returns:
        The store's table (:meth:`~pyro_bnnlv.sweep.SweepStore.table`): one row per task with its
        key, ``status``, results, ``task_seconds``, ``attempts`` and ``error``;
        ``table.attrs`` holds ``"wall_seconds"``, ``"executor"``, ``"ran"`` (tasks run now),
        ``"failed"`` (failed tasks), ``"pending"`` (tasks without a result: non-zero only after
        ``stop_after``) and ``"summary"`` (:func:`summarize`: counts and one line per
        failed task); commands built on a sweep copy these attrs onto their own tables.
    """
    tasks = _check_tasks(tasks)
    _check_run_arguments(fn, executor, workers, threads, address, stop_after, out_dir)  # before the store is touched
    version = code_version or current_code_version(fn)
    identity = sweep_identity(tasks, fn, sweep_meta)
    t0 = time.perf_counter()
    note, ran = "nothing to run", 0
    with contextlib.ExitStack() as stack:
        if out_dir is None:  # a temporary store, removed on return (after the store is closed)
            out_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="pyro-bnnlv-sweep-"))
        store = SweepStore(out_dir)
        stack.callback(store.close)
        looking = _open_store(store, stop_after)
        note = "nothing run: another process is running this sweep" if looking else note
        todo = _tasks_to_run(store, tasks, identity, version, looking, retry_failed)
        if todo and stop_after != 0:
            deadline = None if stop_after is None else t0 + stop_after
            ran, note = _run_pending(
                store, fn, todo, version, executor, workers, threads, address, prepare, deadline, progress, desc
            )
        elif todo:
            note = "nothing run (stop_after=0)" if note == "nothing to run" else note
        table = store.table()
    return _with_run_attrs(table, seconds=time.perf_counter() - t0, note=note, ran=ran)


def _with_run_attrs(table: pd.DataFrame, *, seconds: float, note: str, ran: int) -> pd.DataFrame:
    """``table`` with :func:`run_sweep`'s ``attrs`` (see its Returns)."""
    pending = int((table["status"] == "pending").sum())
    table.attrs.update(wall_seconds=seconds, executor=note, ran=ran)
    table.attrs.update(failed=len(failures(table)), pending=pending, summary=summarize(table))
    return table


def _tasks_to_run(
    store: SweepStore,
    tasks: Sequence[Task],
    identity: Mapping[str, Any],
    version: str,
    looking: bool,
    retry_failed: bool,
) -> list[Task]:
    """The tasks without a result in ``store``, after claiming it for this sweep; none while
    another process runs the sweep and has not planned its tasks yet (``looking`` and no
    metadata: nothing to read, nothing to write)."""
    if looking and not store.meta():
        return []
    store.claim(identity, version, tasks)
    by_id = {t.id: t for t in tasks}
    return [by_id[i] for i in store.pending(retry_failed=retry_failed)]


def _run_pending(
    store: SweepStore,
    fn: Callable,
    todo: Sequence[Task],
    version: str,
    executor: str,
    workers: int | None,
    threads: int,
    address: str | None,
    prepare: Callable[[], object] | None,
    deadline: float | None,
    progress: bool,
    desc: str,
) -> tuple[int, str]:
    """Run ``todo`` on a new executor, with ``prepare`` in a thread of this process beside the
    tasks (waited for before returning), starting no task after ``deadline``
    (``time.perf_counter()`` seconds; ``None``: none); returns ``(tasks run, the executor's note)``."""
    runner = make_executor(executor, workers=workers, threads=threads, address=address, num_tasks=len(todo))
    note = cores_note(runner)
    preparing = threading.Thread(target=prepare, name="pyro_bnnlv-sweep-prepare", daemon=True) if prepare else None
    if preparing is not None:
        preparing.start()

    def accept() -> bool:
        return deadline is None or time.perf_counter() < deadline

    try:
        return _drive(store, runner, fn, todo, version, accept, progress=progress, desc=f"{desc} ({note})"), note
    finally:
        runner.close()
        if preparing is not None:
            preparing.join()


def _drive(
    store: SweepStore,
    runner,
    fn,
    todo: Sequence[Task],
    version: str,
    accept: Callable[[], bool],
    *,
    progress: bool,
    desc: str,
) -> int:
    """Run ``todo`` on ``runner``, committing each outcome; returns the number of tasks run."""
    counts = store.counts()
    total = sum(counts.values())
    failed = ran = 0
    bar = tqdm(total=total, initial=total - len(todo), desc=desc, unit="task", disable=not progress, dynamic_ncols=True)
    remaining = len(todo)
    stopping = False

    def accept_and_say() -> bool:
        nonlocal stopping
        ok = accept()
        if not ok and not stopping:
            stopping = True
            postfix()
        return ok

    def postfix() -> None:
        running = "no new tasks (stop_after)" if stopping else f"running {min(runner.slots, remaining)}"
        bar.set_postfix_str(f"{running}, failed {failed}", refresh=True)

    with contextlib.closing(bar):
        postfix()
        for outcome in runner.run(fn, todo, accept_and_say):
            store.commit(outcome, version)
            remaining -= 1
            ran += 1
            failed += outcome["status"] == "failed"
            bar.update(1)
            postfix()
    return ran


def load_results(out_dir: str | Path) -> pd.DataFrame:
    """The table of the store in ``out_dir`` without running anything (works while a run is active)."""
    path = Path(out_dir)
    store = SweepStore(path)
    if not store.path.exists():
        raise FileNotFoundError(f"no sweep store in {str(path)!r} (expected {store.path.name})")
    store.open(lock=False)
    try:
        return store.table()
    finally:
        store.close()


def failures(table: pd.DataFrame) -> pd.DataFrame:
    """The failed rows of a sweep table."""
    return table[table["status"] == "failed"]


def summarize(table: pd.DataFrame) -> str:
    """``"12 tasks: 11 done, 1 failed, 0 pending"`` and one line per failed task (its last error line)."""
    counts = table["status"].value_counts()
    lines = [
        f"{len(table)} tasks: {counts.get('done', 0)} done, {counts.get('failed', 0)} failed, "
        f"{counts.get('pending', 0)} pending"
    ]
    for _, row in failures(table).iterrows():
        last = [ln for ln in str(row["error"]).strip().splitlines() if ln.strip()][-1:] or ["?"]
        key = ", ".join(f"{k}={row[k]}" for k in ("dataset", "split", "method", "restart", "seed"))
        lines.append(f"  FAILED {row['task_id']} ({key}): {last[0]}")
    if "wall_seconds" in table.attrs:
        lines.append(
            f"ran {table.attrs['ran']} tasks in {table.attrs['wall_seconds']:.1f} s ({table.attrs['executor']})"
        )
    if counts.get("pending", 0):
        lines.append(f"incomplete: {counts['pending']} tasks pending; run the same command again to continue")
    return "\n".join(lines)
