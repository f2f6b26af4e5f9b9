"""A consistent copy of sweep stores, also while a driver is writing them.

When no driver runs, a store is the single file ``sweep.sqlite`` and can be copied or committed
as it is. While one runs, a plain ``cp`` or ``git add`` may read the file in the middle of a
task's transaction: SQLite's rollback journal then holds the pages the copy lacks, and the copy
alone is a corrupt database. ``pyro-bnnlv snapshot SRC DEST`` (or :func:`snapshot_stores`) copies
every store under ``SRC`` with SQLite's online backup API, which reads one consistent state, to
the same relative place under ``DEST``; each copy is checked (``PRAGMA integrity_check``) and all
are moved into place only when every one succeeded. ``--out DEST/...`` then resumes from the copy.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .status import _is_running, find_stores
from .store import STORE_NAME

__all__ = ["Snapshot", "snapshot_stores"]


@dataclass(frozen=True)
class Snapshot:
    """One copied store: where from, where to, and its tasks per status at the copied moment."""

    source: Path
    destination: Path
    counts: dict[str, int]


def _read_only_uri(path: Path) -> str:
    """A read-only SQLite URI for ``path`` (percent-encoded: ``#``, ``?`` and ``%`` in a directory
    name would otherwise end the path)."""
    return f"{path.resolve().as_uri()}?mode=ro"


def _copy_to_temporary(source: Path, destination: Path) -> tuple[Path, dict[str, int]]:
    """Back ``source`` up to a temporary file beside ``destination``; checked, not yet in place."""
    fd, name = tempfile.mkstemp(prefix=".snapshot-", suffix=".sqlite", dir=destination.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        src = sqlite3.connect(_read_only_uri(source), uri=True, timeout=60)
        dst = sqlite3.connect(tmp)
        try:
            try:
                src.backup(dst)  # one consistent read; retried by SQLite while a writer commits
            except sqlite3.OperationalError as err:
                if "readonly" not in str(err):
                    raise
                raise ValueError(
                    f"{str(source)!r} holds a commit interrupted by a killed driver (its journal "
                    "must be rolled back first): run the sweep's command again, with --stop-after "
                    f"0 to run nothing, then snapshot ({err})"
                ) from None
            check = dst.execute("PRAGMA integrity_check").fetchone()[0]
            counts = dict(dst.execute("SELECT status, COUNT(*) FROM tasks GROUP BY status").fetchall())
        finally:
            dst.close()
            src.close()
        if check != "ok":
            raise RuntimeError(f"the copy of {str(source)!r} fails SQLite's integrity check: {check}")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, {k: int(v) for k, v in counts.items()}


def _check_destinations(
    stores: list[Path], targets: list[Path], source: Path, destination: Path, overwrite: bool
) -> None:
    src_root, dst_root = source.resolve(), destination.resolve()
    if dst_root == src_root or src_root in dst_root.parents or dst_root in src_root.parents:
        raise ValueError(
            f"destination {str(destination)!r} is {str(source)!r}, inside it or above it; "
            "give a directory beside the sweep's output directory"
        )
    for target in targets:
        where = target.parent.resolve()  # through any symbolic link on the way
        if where == src_root or src_root in where.parents:
            raise ValueError(
                f"{str(target)!r} leads into {str(source)!r} (a symbolic link?): a live "
                "store would be replaced; give another destination"
            )
        if not target.exists():
            continue
        if not overwrite:
            raise ValueError(
                f"{str(target)!r} already exists; give an empty destination, or "
                "overwrite=True (--overwrite) to replace it"
            )
        if _is_running(target.parent):
            raise ValueError(f"a driver is running the store {str(target)!r}: it cannot be replaced")
        journal = target.with_name(target.name + "-journal")
        if journal.exists():
            raise ValueError(
                f"{str(journal)!r} is the journal of an interrupted commit of the store "
                "being replaced; it would be rolled into the copy: remove the old store "
                "and its journal first"
            )


def snapshot_stores(source: str | Path, destination: str | Path, *, overwrite: bool = False) -> list[Snapshot]:
    """Copy every store under ``source`` to the same relative directory under ``destination``.

    Safe while a driver writes ``source`` (module docstring). All or nothing: every store is
    copied and checked before any is moved into place. Raises ``ValueError``, copying nothing,
    if ``destination`` is ``source``, inside it (also through a symbolic link) or above it; if a
    store exists at a destination and ``overwrite`` is false, or (with ``overwrite``) a driver
    runs it or it has an interrupted commit's journal; or if a source store holds an
    interrupted commit (rerun its sweep first). ``FileNotFoundError`` if ``source`` holds no
    store.
    """
    source, destination = Path(source), Path(destination)
    stores = find_stores(source)
    targets = [destination / d.relative_to(source) / STORE_NAME for d in stores]
    _check_destinations(stores, targets, source, destination, overwrite)
    made = [p for t in targets for p in [t.parent, *t.parent.parents] if not p.exists()]
    staged: list[tuple[Path, Path, Path, dict[str, int]]] = []
    try:
        for store, target in zip(stores, targets):
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp, counts = _copy_to_temporary(store / STORE_NAME, target)
            staged.append((store / STORE_NAME, target, tmp, counts))
    except BaseException:
        for _, _, tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        for directory in sorted(set(made), key=lambda p: len(p.parts), reverse=True):
            if directory.exists() and not any(directory.iterdir()):
                directory.rmdir()
        raise
    for _, target, tmp, _ in staged:
        os.replace(tmp, target)
    return [Snapshot(src, target, counts) for src, target, _, counts in staged]
