"""Where a long sweep stands: progress per method and the time it still needs, from its store alone.

``pyro-bnnlv status DIR`` (or :func:`sweep_status`) reads every results store under ``DIR``
(``DIR/sweep.sqlite``, or all of them below it), read only, also while a driver runs. Per store
it reports whether a driver holds it, its code version, and per method the finished, failed and
pending tasks with the mean wall time of the finished ones. The time still needed is

.. math::

    \\hat T = \\sum_{\\text{methods } m} n^{\\text{pending}}_m \\, \\bar t_m,

with :math:`\\bar t_m` the mean task time of method :math:`m`'s finished tasks (one core each;
divide by the worker count for the wall time), and the report names the data sets with pending
tasks none of which has finished (the mean may come from smaller sets). A method without a
finished task in its own store (:attr:`StoreStatus.remaining_hours` NaN) is estimated by
:func:`format_status` from the same method's finished tasks in the other stores, pooled
(:math:`\\sum_s n_{m,s} \\bar t_{m,s} / \\sum_s n_{m,s}`), saying which estimates are borrowed;
one that no store has timed stays unestimated and the total says so.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import filelock
import pandas as pd

from .run import load_results
from .store import STORE_NAME

__all__ = ["StoreStatus", "find_stores", "format_status", "sweep_status"]


@dataclass
class StoreStatus:
    """One store's state: ``per_method`` has columns ``done``, ``failed``, ``pending``,
    ``mean_task_seconds`` and ``remaining_hours`` (one core; NaN without a finished task)."""

    path: Path
    code_version: str | None
    running: bool
    per_method: pd.DataFrame
    #: per method: the data sets with a finished task of that method (its estimate's basis) and
    #: those with pending tasks of it but none finished (they may take longer or shorter: larger
    #: data sets run more steps per epoch)
    basis: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)

    @property
    def remaining_hours(self) -> float:
        """Core-hours still needed (NaN if a method with pending tasks has no finished one)."""
        return float(self.per_method["remaining_hours"].sum(min_count=1)) if self._estimable else float("nan")

    @property
    def unestimated(self) -> list[str]:
        """The methods with pending tasks but no finished one here (no estimate of their own)."""
        pm = self.per_method
        return list(pm.index[pm["remaining_hours"].isna() & (pm["pending"] > 0)])

    @property
    def _estimable(self) -> bool:
        return not self.unestimated


def find_stores(root: str | Path) -> list[Path]:
    """The directories under ``root`` (``root`` itself included) that hold a sweep store."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"no directory {str(root)!r}; give the --out directory of a sweep")
    if (root / STORE_NAME).exists():
        return [root]
    found = sorted(p.parent for p in root.rglob(STORE_NAME))
    if not found:
        raise FileNotFoundError(f"no sweep store ({STORE_NAME}) in or below {str(root)!r}")
    return found


def _is_running(out_dir: Path) -> bool:
    lock = filelock.FileLock(str(out_dir / "sweep.lock"))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return True
    except OSError:  # a read-only directory: no driver can write a store there
        return False
    lock.release()
    return False


def _code_version(out_dir: Path) -> str | None:
    uri = f"{(out_dir / STORE_NAME).resolve().as_uri()}?mode=ro"  # encoded: '#', '?' or '%' in a path
    conn = sqlite3.connect(uri, uri=True, timeout=30)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'code_version'").fetchone()
    finally:
        conn.close()
    return None if row is None else str(row[0]).strip('"')


def sweep_status(out_dir: str | Path) -> StoreStatus:
    """The :class:`StoreStatus` of the store in ``out_dir`` (read only)."""
    out_dir = Path(out_dir)
    table = load_results(out_dir)
    counts = table.pivot_table(index="method", columns="status", values="task_id", aggfunc="count", fill_value=0)
    counts = counts.reindex(columns=["done", "failed", "pending"], fill_value=0)
    counts = counts.reindex(list(dict.fromkeys(table["method"])))  # planning order
    done = table[table["status"] == "done"]
    mean = done.groupby("method")["task_seconds"].mean().reindex(counts.index)
    per_method = counts.assign(mean_task_seconds=mean, remaining_hours=counts["pending"] * mean / 3600.0)
    per_method.loc[per_method["pending"] == 0, "remaining_hours"] = 0.0
    per_method.columns.name = None
    basis = {}
    if "dataset" in table:
        for method in per_method.index:
            rows = table[table["method"] == method]
            timed = tuple(dict.fromkeys(rows.loc[rows["status"] == "done", "dataset"].astype(str)))
            pending = dict.fromkeys(rows.loc[rows["status"] == "pending", "dataset"].astype(str))
            basis[method] = (timed, tuple(d for d in pending if d not in timed))
    return StoreStatus(out_dir, _code_version(out_dir), _is_running(out_dir), per_method, basis)


def _pooled_means(statuses: list[StoreStatus]) -> dict[str, tuple[float, list[StoreStatus]]]:
    """Per method, the mean task time over the finished tasks of every store that has some, and
    those stores."""
    pooled: dict[str, tuple[float, int, list[StoreStatus]]] = {}
    for s in statuses:
        timed = s.per_method[(s.per_method["done"] > 0) & s.per_method["mean_task_seconds"].notna()]
        for method, row in timed.iterrows():
            total, n, sources = pooled.get(method, (0.0, 0, []))
            pooled[method] = (total + row["mean_task_seconds"] * row["done"], n + int(row["done"]), sources + [s])
    return {m: (total / n, sources) for m, (total, n, sources) in pooled.items()}


def _store_label(s: StoreStatus) -> str:
    return "/".join(s.path.parts[-2:])


def format_status(statuses: list[StoreStatus], workers: int = 1) -> str:
    """A plain-text report of ``statuses``; wall-time estimates for ``workers`` parallel workers.

    A method with pending tasks but none finished in its store is estimated from the same
    method's finished tasks in the other stores (module docstring), marked as borrowed."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    pooled = _pooled_means(statuses)
    lines, total, borrowed_total, unknown = [], 0.0, 0.0, False
    for s in statuses:
        pm = s.per_method
        n = {k: int(pm[k].sum()) for k in ("done", "failed", "pending")}
        state = "a driver is running it" if s.running else "idle"
        lines.append(f"{s.path} (code version {s.code_version}; {state})")
        lines.append(f"  {sum(n.values())} tasks: {n['done']} done, {n['failed']} failed, {n['pending']} pending")
        borrowed = []
        for method in s.unestimated:
            if method in pooled:
                mean, sources = pooled[method]
                hours = float(pm.loc[method, "pending"]) * mean / 3600.0
                borrowed_total += hours
                borrowed.append(
                    f"  {method}: none finished here; {hours:.2f} core-hours at {mean:.1f} s a task, as in "
                    f"{', '.join(_store_label(o) for o in sources)} (borrowed: may differ here)"
                )
            else:
                unknown = True
        if n["pending"] or n["failed"]:
            shown = pm.assign(
                mean_task_seconds=pm["mean_task_seconds"].round(1), remaining_hours=pm["remaining_hours"].round(2)
            )
            lines += ["  " + ln for ln in shown.to_string().splitlines()]
            for method, (timed, untimed) in s.basis.items():
                if timed and untimed:
                    lines.append(
                        f"  {method}: timed on {', '.join(timed)} only; not yet on {', '.join(untimed)} "
                        "(tasks there may take longer)"
                    )
            lines += borrowed
        total += float(pm["remaining_hours"].sum())  # NaN (no estimate) skipped, said below
    total += borrowed_total
    hours = f"{total:.1f} core-hours, {total / workers:.1f} h on {workers} worker{'s' * (workers != 1)}"
    if borrowed_total:
        hours += f" ({borrowed_total:.1f} core-hours of it borrowed from other stores' timings)"
    if unknown:
        hours += " so far, plus methods without a finished task (no estimate)"
    lines.append(f"remaining: {hours}")
    return "\n".join(lines)
