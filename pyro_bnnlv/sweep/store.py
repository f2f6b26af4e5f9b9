"""The results store of a sweep: one SQLite file (standard library) in the output directory.

``OUT_DIR/sweep.sqlite`` holds two tables:

* ``meta``: the sweep's identity (task function, ``sweep_meta``, task ids: a fingerprint over
  them) and the code version, written once when the store is created. A later run with another
  identity or code version raises :class:`SweepMismatchError` and writes nothing.
* ``tasks``: one row per planned task (its key as JSON), ``pending`` until its result arrives;
  each finished task is written in its own transaction (SQLite's rollback journal makes that
  atomic: a ``kill -9`` leaves either the old row or the new one), with its result as JSON or
  its traceback, the wall time, the worker (host and pid), the torch thread count, the code
  version and the number of attempts.

Only the driver process writes, so the default rollback journal is used (no ``-wal`` files): when
no run is active the store is the single file ``sweep.sqlite``, which can be committed to a
repository and resumed elsewhere. ``OUT_DIR/sweep.lock`` (a ``filelock`` lock, released by the
OS if the process dies) keeps two drivers from working on one store at once.

Opening a store checks it before anything runs (:meth:`SweepStore.check`): a file of that name
that is not a sweep store (random bytes, another program's SQLite database), a damaged one
(truncated, its identity rows deleted, a stored result cut short) or, for a run, one that cannot
be written raises :class:`SweepStoreError` naming the file and what to do; nothing is written to it.
"""

from __future__ import annotations

import json
import shlex
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import filelock
import pandas as pd

from .task import KEY_FIELDS, Task, canonical_json, describe_version_change, digest

__all__ = ["STORE_NAME", "TABLE_FIELDS", "SweepLockedError", "SweepMismatchError", "SweepStore", "SweepStoreError"]

STORE_NAME = "sweep.sqlite"
#: the columns a results table adds after the task's result
TABLE_FIELDS = ("task_seconds", "attempts", "error")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY, position INTEGER NOT NULL, key TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending', result TEXT, traceback TEXT, seconds REAL,
    worker TEXT, threads INTEGER, code_version TEXT, finished TEXT, attempts INTEGER NOT NULL DEFAULT 0
);
"""


class SweepMismatchError(ValueError):
    """The output directory holds a different sweep (other tasks, settings or code version)."""


class SweepStoreError(ValueError):
    """``OUT_DIR/sweep.sqlite`` cannot be used: not a sweep store, damaged, or not writable."""


class SweepLockedError(RuntimeError):
    """Another process is running a sweep in this output directory."""


#: what a store's ``meta`` table holds once its sweep is claimed
_META_KEYS = ("fingerprint", "code_version", "fn", "sweep_meta", "n_tasks")
_STATUSES = ("pending", "done", "failed")


class SweepStore:
    """``OUT_DIR/sweep.sqlite``; see the module docstring. Use as a context manager."""

    def __init__(self, out_dir: str | Path) -> None:
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise ValueError(f"out_dir={str(out_dir)!r} is a file; give a directory for the sweep's store")
        self.path = self.out_dir / STORE_NAME
        self._lock = filelock.FileLock(str(self.out_dir / "sweep.lock"))
        self._conn: sqlite3.Connection | None = None

    # -- opening and locking -------------------------------------------------------------------
    def open(self, *, lock: bool = True, write: bool | None = None) -> SweepStore:
        """Lock the store (``lock``) and open it, checking it first (:meth:`check`): a file that is
        not a sweep store, a damaged one, or (``write``, default ``lock``) one that cannot be
        written raises :class:`SweepStoreError` naming the file and the fix, before any task runs."""
        write = lock if write is None else write
        if lock or write:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        if lock:
            try:
                self._lock.acquire(timeout=0)
            except filelock.Timeout:
                raise SweepLockedError(
                    f"another process is running a sweep in {str(self.out_dir)!r} (it holds "
                    f"{self._lock.lock_file}); wait for it to finish or use another output directory"
                ) from None
            except OSError as err:
                raise SweepStoreError(
                    f"cannot create the lock file {self._lock.lock_file!r} ({err}): the output directory "
                    f"is not writable; {_WRITABLE_FIX}"
                ) from None
        try:
            fresh = not self.path.exists() or self.path.stat().st_size == 0
            # isolation_level=None: we open transactions ourselves ("BEGIN IMMEDIATE" ... "COMMIT")
            self._conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            if not fresh:
                self.check()
            self._conn.execute("PRAGMA synchronous=FULL")
            if write:
                self._conn.executescript(_SCHEMA)
                self._check_writable()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._lock.is_locked:
            self._lock.release()

    def __enter__(self) -> SweepStore:
        return self.open() if self._conn is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the store is closed; use `with SweepStore(out_dir) as store:`")
        return self._conn

    # -- checks --------------------------------------------------------------------------------
    def check(self) -> None:
        """:class:`SweepStoreError` naming the file and the fix unless the store is a sweep store that
        SQLite reads whole (``PRAGMA quick_check``) with its identity and every stored task and
        result readable (an empty database, or one whose sweep was not yet claimed, passes)."""
        try:
            tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            check = self.conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(check)
            if not tables:
                return
            if not {"meta", "tasks"} <= tables:
                raise SweepStoreError(
                    f"{str(self.path)!r} is an SQLite database but not a sweep store (its tables: "
                    f"{', '.join(sorted(tables))}); it was left untouched: give another output directory, or "
                    "move the file away"
                )
            meta = dict(self.conn.execute("SELECT key, value FROM meta"))
            tasks = self.conn.execute("SELECT id, key, status, result FROM tasks").fetchall()
        except sqlite3.DatabaseError as err:
            raise SweepStoreError(
                f"{str(self.path)!r} is not a sweep store SQLite can read ({err}): it is damaged "
                f"or another kind of file; {_DAMAGED_FIX}"
            ) from None
        if not meta and not tasks:
            return  # created, not yet claimed (a run stopped in between)
        missing = [k for k in _META_KEYS if k not in meta]
        if missing:
            raise SweepStoreError(
                f"{str(self.path)!r} is damaged: its meta table lacks {missing} (the sweep's "
                f"identity), so it cannot be resumed safely; {_DAMAGED_FIX}"
            )
        for k in _META_KEYS:
            _loads(meta[k], f"{str(self.path)!r} is damaged: meta {k!r}", _DAMAGED_FIX)
        for tid, key, status, result in tasks:
            where = f"{str(self.path)!r} is damaged: task {tid}"
            if status not in _STATUSES:
                raise SweepStoreError(f"{where} has status {status!r}; {_DAMAGED_FIX}")
            _loads(key, f"{where}'s key", _DAMAGED_FIX)
            if result is not None:
                _loads(result, f"{where}'s stored result", _DAMAGED_FIX + _rerun_fix(self.path, tid))

    def _check_writable(self) -> None:
        """Write a row and roll it back: SQLite's own answer (a read-only file, directory or disk),
        before any task runs rather than when its result is stored."""
        try:
            with self._transaction() as c:
                c.execute("INSERT OR REPLACE INTO meta VALUES ('write-check', '0')")
                raise _RollBack
        except _RollBack:
            pass
        except sqlite3.OperationalError as err:
            raise SweepStoreError(f"{str(self.path)!r} cannot be written ({err}); {_WRITABLE_FIX}") from None

    # -- identity ------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        """The stored meta table (JSON values decoded); empty for a new store."""
        if not self._has_table("meta"):
            return {}  # created by a run that has not yet written its tables
        return {k: json.loads(v) for k, v in self.conn.execute("SELECT key, value FROM meta")}

    def _has_table(self, name: str) -> bool:
        q = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        return self.conn.execute(q, (name,)).fetchone() is not None

    def claim(self, identity: Mapping[str, Any], code_version: str, tasks: Sequence[Task]) -> None:
        """Create the store for this sweep, or check that it already holds this sweep.

        Raises :class:`SweepMismatchError` (nothing written) if the stored fingerprint or code
        version differ, naming what differs and the fix.
        """
        fingerprint = digest(identity, 32)
        stored = self.meta()
        if not stored:
            with self._transaction() as c:
                rows = {
                    "fingerprint": fingerprint,
                    "code_version": code_version,
                    "fn": identity["fn"],
                    "sweep_meta": identity["meta"],
                    "n_tasks": len(tasks),
                }
                c.executemany("INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in rows.items()])
                c.executemany(
                    "INSERT INTO tasks (id, position, key) VALUES (?, ?, ?)",
                    [(t.id, i, canonical_json(t.key())) for i, t in enumerate(tasks)],
                )
            return
        fix = f"use another output directory, or delete {str(self.path)!r} to discard its results"
        if stored.get("fingerprint") != fingerprint:
            raise SweepMismatchError(
                f"{str(self.out_dir)!r} holds the results of a different sweep "
                f"({self._difference(stored, identity)}); {fix}"
            )
        if stored["code_version"] != code_version:
            raise SweepMismatchError(
                f"{str(self.out_dir)!r}: {describe_version_change(stored['code_version'], code_version)}; "
                f"start a new version: {fix}; or, if the change cannot affect the stored results, resume them "
                f"with code_version={stored['code_version']!r} (--code-version)"
            )

    def _difference(self, stored: Mapping[str, Any], identity: Mapping[str, Any]) -> str:
        fn, meta = json.loads(canonical_json(identity["fn"])), json.loads(canonical_json(identity["meta"]))
        if stored.get("fn") != fn:  # as stored (JSON: a tuple reads back as a list)
            return f"task function {stored.get('fn')} -> {fn}"
        if stored.get("sweep_meta") != meta:
            old, new = stored.get("sweep_meta") or {}, meta
            keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            return "settings " + ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys)
        old_ids = {r[0] for r in self.conn.execute("SELECT id FROM tasks")}
        new_ids = set(identity["tasks"])
        return f"tasks: {len(old_ids - new_ids)} stored tasks not in this sweep, {len(new_ids - old_ids)} new ones"

    # -- tasks ---------------------------------------------------------------------------------
    def pending(self, *, retry_failed: bool = True) -> list[str]:
        """Ids of the tasks still to run, in planning order (failed ones too if ``retry_failed``)."""
        statuses = ("pending", "failed") if retry_failed else ("pending",)
        q = f"SELECT id FROM tasks WHERE status IN ({','.join('?' * len(statuses))}) ORDER BY position"
        return [r[0] for r in self.conn.execute(q, statuses)]

    def commit(self, outcome: Mapping[str, Any], code_version: str) -> None:
        """Write one finished task (an outcome of :func:`~pyro_bnnlv.sweep.executors.execute`)."""
        with self._transaction() as c:
            cur = c.execute(
                "UPDATE tasks SET status=?, result=?, traceback=?, seconds=?, worker=?, threads=?, "
                "code_version=?, finished=?, attempts=attempts+1 WHERE id=?",
                (
                    outcome["status"],
                    outcome.get("result"),
                    outcome.get("traceback"),
                    outcome.get("seconds"),
                    outcome.get("worker"),
                    outcome.get("threads"),
                    code_version,
                    outcome.get("finished"),
                    outcome["id"],
                ),
            )
            if cur.rowcount != 1:
                raise RuntimeError(f"task {outcome['id']} is not in the store {str(self.path)!r}")

    def counts(self) -> dict[str, int]:
        """``{"pending": ..., "done": ..., "failed": ...}``."""
        out = {"pending": 0, "done": 0, "failed": 0}
        out.update(dict(self.conn.execute("SELECT status, COUNT(*) FROM tasks GROUP BY status")))
        return out

    def table(self) -> pd.DataFrame:
        """One row per planned task in planning order.

        Columns: ``task_id``, the key (``dataset, split, method``, one column per grid name,
        ``restart, seed``), ``status`` (``done``, ``failed`` or ``pending``), the result's
        entries, ``task_seconds`` (wall time of the task function), ``attempts`` and ``error``
        (the traceback of a failed task). No rows while a starting run has not yet planned its tasks.
        """
        rows, grid_names, result_names = [], [], []
        q = "SELECT id, key, status, result, traceback, seconds, attempts FROM tasks ORDER BY position"
        # a run creates the file before its tables: read between the two, the store is empty, not damaged
        for tid, key, status, result, tb, seconds, attempts in self.conn.execute(q) if self._has_table("tasks") else ():
            key = json.loads(key)
            grid = key.pop("grid")
            res = json.loads(result) if result else {}
            grid_names += [k for k in grid if k not in grid_names]
            result_names += [k for k in res if k not in result_names]
            rows.append(
                {
                    "task_id": tid,
                    **key,
                    **grid,
                    "status": status,
                    **res,
                    "task_seconds": seconds,
                    "attempts": attempts,
                    "error": tb,
                }
            )
        first = ["task_id", *KEY_FIELDS[:3], *grid_names, *KEY_FIELDS[3:], "status"]
        columns = first + [c for c in result_names if c not in first] + list(TABLE_FIELDS)
        return pd.DataFrame(rows, columns=columns)

    def _transaction(self):
        return _Transaction(self.conn)


_DAMAGED_FIX = (
    "restore it from a copy (git checkout, or one made by `pyro-bnnlv snapshot`), or move it away "
    "to start the sweep over"
)
_WRITABLE_FIX = (
    "the sweep would run its tasks and then fail to store their results: make the store and its "
    "directory writable, or copy the store elsewhere (`pyro-bnnlv snapshot SRC DEST`) and give "
    "that directory as out_dir (--out)"
)


def _rerun_fix(path: Path, task_id: str) -> str:
    sql = f"UPDATE tasks SET status='pending', result=NULL WHERE id='{task_id}'"  # ids are hex digits
    return f'; or run that task again: sqlite3 {shlex.quote(str(path))} "{sql}"'


def _loads(text: str, what: str, fix: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError) as err:
        raise SweepStoreError(f"{what} is not valid JSON ({err}); {fix}") from None


class _RollBack(Exception):
    """Raised inside a transaction to undo it (:meth:`SweepStore._check_writable`)."""


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, *exc: object) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")
