"""Pyro's process-parallel NUTS chains, made safe: a clean start method and no silent hang.

Pyro's ``MCMC`` runs ``num_chains`` chains in worker processes when there are more cores than
chains (``num_chains <= cpu_count - 1``), with the platform's default start method: ``fork`` on
Linux. A forked child inherits the parent's torch thread pools in whatever state the parent left
them; after the parent has run parallel torch work (``run_nuts``'s MAP initialisation does), the
child's first backward pass can wait forever on a pool that no longer exists (PyTorch issues
#3966 and #2245, Pyro #2276; the measured hang: docs/design-notes.md, 'infer.mcmc.processes').
And Pyro's parent waits for its chains' results without looking at
the processes, so a child that dies (killed, or failing before it can report) hangs it too.

* :func:`chain_start_method` makes ``"spawn"`` the default: each chain starts a fresh
  interpreter (a few seconds of imports), which needs the kernel to pickle and, from a script,
  the ``if __name__ == "__main__":`` guard; it says so before any process starts when that
  cannot work, and keeps ``fork`` only where it was measured safe (the compiled potential);
* :func:`run_watched` runs ``mcmc.run`` so that a chain process that exits without delivering
  its results is an error in the parent, with the likely causes;
* the chains keep the caller's torch thread count (a spawned process would start with one
  thread per core; :class:`~pyro_bnnlv.infer.mcmc.kernel.CountingNUTS` sets it back).
"""

from __future__ import annotations

from collections.abc import Callable

import multiprocessing
import pickle
import queue
import sys
from typing import Any

from pyro.infer import MCMC

__all__ = ["ChainProcessError", "chain_start_method", "run_watched"]


def chain_start_method(mp_context: str | None, kernel: Any, model: Callable[..., Any], compiled: bool) -> str:
    """The start method of the chain processes, checked; raises ``ValueError`` with the fix.

    ``mp_context`` given: it must be one of the platform's start methods, and unless it is
    ``"fork"`` (which copies the process: anything goes, but it can hang) the kernel must pickle
    and the model's module must be importable by the child (not an interactive session's
    ``__main__``: a notebook, ``python -c``). ``None`` (the default): ``"spawn"`` when that holds;
    ``"fork"`` for a kernel that cannot be pickled but runs the compiled C++ potential (its
    gradient needs no parallel torch work in the child); otherwise an error, as no start method is both possible and safe.
    """
    methods = multiprocessing.get_all_start_methods()
    if mp_context is not None and mp_context not in methods:
        raise ValueError(
            f"mp_context={mp_context!r} is not a start method of this platform; use one "
            f"of {methods} (default: 'spawn' where the model allows)"
        )
    if mp_context == "fork":
        return mp_context
    method = mp_context or "spawn"
    fix = (
        "run the chains in this process instead (num_chains=1 per call; or the fast path's "
        "default kernel='flat', whose chains run in threads), define the model in a module or "
        "script file, or pass mp_context='fork' (it can hang: pyro_bnnlv.infer.mcmc.processes "
        "says why)"
    )
    main = sys.modules.get("__main__")
    defined_in = getattr(model, "__module__", None) or type(model).__module__
    if defined_in == "__main__" and not getattr(main, "__file__", None):
        raise ValueError(
            f"run_nuts: the {method!r} chain processes cannot import a model defined in an interactive session: {fix}"
        )
    try:
        pickle.dumps(kernel)
    except Exception as err:  # noqa: BLE001 -- any pickling failure means the same thing here
        if mp_context is None and compiled:
            return "fork"
        raise ValueError(
            f"run_nuts: the NUTS kernel cannot be pickled to reach {method!r} chain "
            f"processes ({type(err).__name__}: {err}): {fix}"
        ) from err
    return method


class ChainProcessError(RuntimeError):
    """A chain's worker process ended without delivering its results."""


def _advice(start_method: str | None) -> str:
    if start_method in ("spawn", "forkserver"):
        return (
            "With the 'spawn' start method (the default) the usual causes are a script without "
            '`if __name__ == "__main__":` around the sampling (the child imports the script '
            "again; its stderr says 'bootstrapping phase'), a model the child cannot import, or "
            "an error the child could not send; otherwise the process was killed (out of memory?)."
        )
    return "The process was killed (out of memory?) or exited on its own; its stderr may say why."


def run_watched(mcmc: MCMC, *args: Any, start_method: str | None = None, every: float = 1.0) -> None:
    """``mcmc.run(*args)``; a chain process that ends without delivering all its results raises
    :class:`ChainProcessError` here instead of leaving Pyro waiting for it forever.

    Pyro's parent reads its chains' results with ``result_queue.get(timeout=5)`` and retries on
    every time-out without looking at the processes. This wraps that ``get``: it records each
    chain's end-of-results marker (``None``), and when the queue has been empty for ``every``
    seconds twice in a row (anything a process sent before it exited has arrived by then), a
    chain process that has exited (any exit code) without its marker is an error, raised in the
    parent's own thread, where Pyro's clean-up terminates the other chains. A chain that
    delivered everything may exit as it likes.
    """
    sampler = mcmc.sampler
    workers, results = getattr(sampler, "workers", None), getattr(sampler, "result_queue", None)
    if workers is None or results is None:  # one process (Pyro's _UnarySampler): nothing to watch
        mcmc.run(*args)
        return
    receive, finished, suspects = results.get, set(), set()

    def get(block: bool = True, timeout: float | None = None) -> Any:
        waited = 0.0
        while True:
            try:
                item = receive(timeout=every)
            except queue.Empty:
                waited += every
                dead = {c for c, w in enumerate(sampler.workers) if w.exitcode is not None and c not in finished}
                lost = dead & suspects  # dead at two empty polls in a row
                if lost:
                    chain = min(lost)
                    code = sampler.workers[chain].exitcode
                    raise ChainProcessError(
                        f"run_nuts: chain {chain}'s process ended with exit code {code} "
                        f"before it delivered all its draws. {_advice(start_method)}"
                    ) from None
                suspects.clear()
                suspects.update(dead)
                if not block or (timeout is not None and waited >= timeout):
                    raise
                continue
            suspects.clear()
            if item[1] is None:
                finished.add(item[0])
            return item

    results.get = get
    try:
        mcmc.run(*args)
    finally:
        del results.get
