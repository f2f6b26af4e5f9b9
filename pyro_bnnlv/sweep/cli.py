"""The command-line options every sweep-backed command shares, and its exit status.

``add_sweep_arguments(parser)`` adds ``--workers``, ``--executor``, ``--address``, ``--out``,
``--code-version`` and ``--stop-after``; ``sweep_options(args)`` turns them into
:func:`~pyro_bnnlv.sweep.run_sweep` keyword arguments (and checks the command's ``--output`` file
can be written, before the run); ``report(table)`` prints the sweep's
summary (failed tasks with their last error line) and returns the command's exit status: 1 if a
task failed, else 3 if tasks are still pending (``--stop-after``: run the command again), else 0.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from .executors import EXECUTORS

__all__ = ["EXIT_FAILED", "EXIT_INCOMPLETE", "add_sweep_arguments", "check_output_file", "report", "sweep_options"]

#: exit status of a command whose sweep has failed tasks
EXIT_FAILED = 1
#: exit status of a command that stopped with tasks pending (``--stop-after``)
EXIT_INCOMPLETE = 3


def _hours(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--stop-after takes a number of hours, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"--stop-after takes hours >= 0, got {text!r}")
    return value


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the sweep options (an argument group) to ``parser``."""
    g = parser.add_argument_group("sweep: parallel and resumable runs (pyro_bnnlv.sweep)")
    g.add_argument(
        "--workers",
        type=int,
        default=None,
        help="tasks run in parallel (default: all cores, or the Ray cluster's CPUs)",
    )
    g.add_argument(
        "--executor",
        default="local",
        choices=EXECUTORS,
        help="local worker processes (default), a Ray cluster, or inline in this process",
    )
    g.add_argument(
        "--address",
        default=None,
        help="Ray cluster address host:port (with --executor ray; default: a local Ray instance)",
    )
    g.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="directory of the results store (sweep.sqlite): rerunning the same command "
        "resumes; default: a temporary directory (nothing kept)",
    )
    g.add_argument(
        "--code-version",
        default=None,
        metavar="LABEL",
        help="pin the code version the store must agree on (default: a hash of the "
        "package's source); for resuming after edits that cannot change the results",
    )
    g.add_argument(
        "--stop-after",
        type=_hours,
        default=None,
        metavar="HOURS",
        help="start no task after HOURS hours (running ones finish; the rest stay pending: "
        "run the same command again to continue; exit status 3 while incomplete); "
        "0 runs nothing and prints the table so far, also while another process runs "
        "the sweep",
    )


def check_output_file(path: str | Path, option: str = "--output") -> None:
    """``ValueError`` naming ``option`` and the fix unless a file can be written at ``path``: its
    directory exists and takes a new file (tried: a temporary file is created and removed), and an
    existing file there is not a directory and opens for appending. A long run checks this first
    instead of failing when it writes its table at the end."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{option} {str(path)!r} is a directory; give a file path")
    if not target.parent.is_dir():
        raise ValueError(
            f"{option} {str(path)!r}: the directory {str(target.parent)!r} does not exist; "
            "create it first or give another path"
        )
    try:
        with tempfile.TemporaryFile(dir=target.parent):
            pass
        if target.exists():
            with open(target, "a"):
                pass
    except OSError as err:
        raise ValueError(f"{option} {str(path)!r} cannot be written ({err}); give a writable path") from None


def sweep_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :func:`~pyro_bnnlv.sweep.run_sweep` keyword arguments of parsed sweep options
    (``SystemExit`` with the fix for ``--stop-after`` without ``--out``: nothing to resume from).

    A command's ``--output`` file, if it has that option, is checked first
    (:func:`check_output_file`), so a run that could not write its table fails before it starts."""
    stop = args.stop_after
    if stop is not None and args.out is None:
        raise SystemExit(
            "error: --stop-after leaves tasks to run later, but without --out DIR nothing is kept to "
            "resume from; add --out DIR (and run the same command again to continue)"
        )
    if getattr(args, "output", None):
        check_output_file(args.output)
    return dict(
        executor=args.executor,
        workers=args.workers,
        address=args.address,
        out_dir=args.out,
        code_version=args.code_version,
        stop_after=None if stop is None else stop * 3600.0,
    )


def report(table: pd.DataFrame, file: TextIO | None = None) -> int:
    """Print the sweep's summary; return :data:`EXIT_FAILED` if a task failed, else
    :data:`EXIT_INCOMPLETE` if tasks are pending, else 0.

    ``table`` is a :func:`~pyro_bnnlv.sweep.run_sweep` table or any table that carries its
    ``attrs`` (``"summary"``, ``"failed"``)."""
    if "summary" not in table.attrs:
        raise ValueError("report() needs a table from run_sweep (or one carrying its attrs: summary, failed)")
    print(table.attrs["summary"], file=file or sys.stdout)
    if table.attrs["failed"]:
        return EXIT_FAILED
    return EXIT_INCOMPLETE if table.attrs.get("pending") else 0
