"""A consistent copy of sweep stores, also while a driver is writing them.

When no driver runs, a store is the single file ``sweep.sqlite`` and can be copied or committed
as it is. While one runs, a plain ``cp`` or ``git add`` may read the file in the middle of a
task's transaction: SQLite's rollback journal then holds the pages the copy lacks, and the copy
alone is a corrupt database. ``pyro-bnnlv snapshot SRC DEST`` (or :func:`snapshot_stores`) copies
every store under ``SRC`` with SQLite's online backup API, which reads one consistent state
(finished tasks up to some moment, never part of a transaction), to the same relative place
under ``DEST``; each copy is checked (``PRAGMA integrity_check``) before it is moved into place
atomically. ``--out DEST/...`` then resumes from the copy, here or on another machine.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .status import find_stores
from .store import STORE_NAME

__all__ = ["Snapshot", "snapshot_stores"]


@dataclass(frozen=True)
class Snapshot:
    """One copied store: where from, where to, and its tasks per status at the copied moment."""

    source: Path
    destination: Path
    counts: dict[str, int]


def _copy(source: Path, destination: Path) -> dict[str, int]:
    destination.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".snapshot-", suffix=".sqlite", dir=destination.parent)
    os.close(fd)
    try:
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=60)
        dst = sqlite3.connect(tmp)
        try:
            src.backup(dst)  # one consistent read, retried by SQLite if a writer commits meanwhile
            check = dst.execute("PRAGMA integrity_check").fetchone()[0]
            counts = dict(dst.execute("SELECT status, COUNT(*) FROM tasks GROUP BY status").fetchall())
        finally:
            dst.close()
            src.close()
        if check != "ok":
            raise RuntimeError(f"the copy of {str(source)!r} fails SQLite's integrity check: {check}")
        os.replace(tmp, destination)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return {k: int(v) for k, v in counts.items()}


def snapshot_stores(source: str | Path, destination: str | Path, *, overwrite: bool = False) -> list[Snapshot]:
    """Copy every store under ``source`` to the same relative directory under ``destination``.

    Safe while a driver writes ``source`` (module docstring). Raises ``ValueError``, copying
    nothing, if ``destination`` is ``source`` or lies inside it (a live store would be
    overwritten, or the copy found as a store of its own), or if a store already exists at a
    destination and ``overwrite`` is false; ``FileNotFoundError`` if ``source`` holds no store.
    """
    source, destination = Path(source), Path(destination)
    stores = find_stores(source)
    src_root, dst_root = source.resolve(), destination.resolve()
    if dst_root == src_root or src_root in dst_root.parents:
        raise ValueError(f"destination {str(destination)!r} is {str(source)!r} or inside it; "
                         "give a directory outside the sweep's output directory")  # fmt: skip
    targets = [destination / d.relative_to(source) / STORE_NAME for d in stores]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not overwrite:
        raise ValueError(f"{existing[0]!r} already exists (of {len(existing)} destinations); "
                         "give an empty destination, or overwrite=True (--overwrite) to replace")  # fmt: skip
    return [Snapshot(d / STORE_NAME, t, _copy(d / STORE_NAME, t)) for d, t in zip(stores, targets)]
