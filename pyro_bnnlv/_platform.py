"""Ground layer: what this process may use of the machine."""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import platform
import sys

__all__ = ["is_glibc", "retain_freed_memory", "skip_collection_at_exit", "usable_cores"]

#: glibc's ``mallopt`` parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the OS reports it (a container,
    ``taskset`` or a batch scheduler limits it), else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def is_glibc() -> bool:
    """Whether this process runs on Linux with glibc (whose ``mallopt`` :func:`retain_freed_memory` calls)."""
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def retain_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 1 << 30) -> bool:
    """Make glibc's ``malloc`` keep freed memory for reuse instead of handing it back to the OS.

    A training step allocates and frees tensors of several MB, which glibc by default serves with
    ``mmap`` or hands back once twice that is free, so every step faults the same pages in again.
    Raising the mmap threshold to 32 MiB (glibc's ceiling for its dynamic threshold on 64-bit) and
    the trim threshold to 1 GiB keeps them in the heap (the losses are bitwise the same; timings:
    docs/design-notes.md, '_platform'). The cost: a process keeps its peak heap. Process-wide and
    permanent; used by the sweep's local workers and by ``pyro-bnnlv``'s ``main`` (also when called
    in-process), not by ``import pyro_bnnlv``.

    Returns whether both settings took (``False`` off glibc, e.g. macOS or musl: nothing changes;
    if glibc refuses the mmap threshold, the trim threshold is not touched either). Both values
    are C ints: a value outside ``[1, 2^31)`` is a ``ValueError``, not silently truncated.
    """
    for name, value in (("mmap_threshold", mmap_threshold), ("trim_threshold", trim_threshold)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**31:
            raise ValueError(f"{name} must be an int in [1, 2**31) bytes (mallopt takes a C int), got {value!r}")
    if not is_glibc():
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:  # pragma: no cover - glibc always has it
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))


_exit_hook_registered = False


def skip_collection_at_exit() -> None:
    """At interpreter exit, move every object to the collector's permanent generation
    (``gc.freeze()``, an ``atexit`` hook run before the interpreter tears its modules down), so the
    collections of the shutdown skip the objects torch and its modules hold, most of such a
    process's exit (docs/design-notes.md, '_platform'). Objects in unreachable cycles
    are then not finalised at exit, so only for our own processes, whose files and stores are
    closed explicitly: ``pyro-bnnlv``'s ``main`` and the sweep's local workers, not ``import
    pyro_bnnlv``. Registered once per process."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(gc.freeze)
        _exit_hook_registered = True
