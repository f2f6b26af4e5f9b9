"""Pyro's process-parallel NUTS chains, made safe: a clean start method and no silent hang.

Pyro's ``MCMC`` runs ``num_chains`` chains in worker processes when there are more cores than
chains (``num_chains <= cpu_count - 1``), with the platform's default start method: ``fork`` on
Linux. A forked child inherits the parent's torch thread pools in whatever state the parent left
them; after the parent has run parallel torch work (``run_nuts``'s MAP initialisation does), the
child's first backward pass can wait forever on a pool that no longer exists (measured: a BNN+LV
on the traced path, 2 chains, hung in ``HMC.setup``'s gradient in 2 runs of 2; PyTorch issues
#3966 and #2245, Pyro #2276). And Pyro's parent waits for its chains' results without looking at
the processes, so a child that dies (killed, or failing before it can report) hangs it too.

* :func:`chain_start_method` makes ``"spawn"`` the default: each chain starts a fresh
  interpreter (a few seconds of imports), which needs the kernel to pickle and, from a script,
  the ``if __name__ == "__main__":`` guard; it says so before any process starts when that
  cannot work, and keeps ``fork`` only where it was measured safe (the compiled potential);
* :func:`run_watched` runs ``mcmc.run`` with a watchdog thread that turns a chain process that
  exits without its results into an error in the parent, with the likely causes.
"""

from __future__ import annotations

import multiprocessing
import pickle
import sys
import threading
from typing import Any

from pyro.infer import MCMC

__all__ = ["chain_start_method", "run_watched", "ChainProcessError"]


def chain_start_method(mp_context: str | None, kernel: Any, model: Any, compiled: bool) -> str:
    """The start method of the chain processes, checked; raises ``ValueError`` with the fix.

    ``mp_context`` given: it must be one of the platform's start methods, and unless it is
    ``"fork"`` (which copies the process: anything goes, but it can hang) the kernel must pickle
    and the model's module must be importable by the child (not an interactive session's
    ``__main__``: a notebook, ``python -c``). ``None`` (the default): ``"spawn"`` when that holds;
    ``"fork"`` for a kernel that cannot be pickled but runs the compiled C++ potential (its
    gradient needs no parallel torch work in the child: 3 of 3 runs finished where the Python
    potential hung 2 of 2); otherwise an error, as no start method is both possible and safe.
    """
    methods = multiprocessing.get_all_start_methods()
    if mp_context is not None and mp_context not in methods:
        raise ValueError(f"mp_context={mp_context!r} is not a start method of this platform; use one "
                         f"of {methods} (default: 'spawn' where the model allows)")  # fmt: skip
    if mp_context == "fork":
        return mp_context
    method = mp_context or "spawn"
    fix = ("run the chains in this process instead (num_chains=1 per call; or the fast path's "
           "default kernel='flat', whose chains run in threads), define the model in a module or "
           "script file, or pass mp_context='fork' (it can hang: pyro_bnnlv.infer.nuts_processes "
           "says why)")  # fmt: skip
    main = sys.modules.get("__main__")
    defined_in = getattr(model, "__module__", None) or type(model).__module__
    if defined_in == "__main__" and not getattr(main, "__file__", None):
        raise ValueError(f"run_nuts: the {method!r} chain processes cannot import a model defined in "
                         f"an interactive session: {fix}")  # fmt: skip
    try:
        pickle.dumps(kernel)
    except Exception as err:  # noqa: BLE001 -- any pickling failure means the same thing here
        if mp_context is None and compiled:
            return "fork"
        raise ValueError(f"run_nuts: the NUTS kernel cannot be pickled to reach {method!r} chain "
                         f"processes ({type(err).__name__}: {err}): {fix}") from err  # fmt: skip
    return method


class ChainProcessError(RuntimeError):
    """A chain's worker process ended without delivering its results."""


def _watch(mcmc: MCMC, done: threading.Event, every: float) -> None:
    sampler = mcmc.sampler
    while not done.wait(every):
        for chain, worker in enumerate(getattr(sampler, "workers", [])):
            code = worker.exitcode
            if code is None or code == 0:  # running, or finished after reporting (Pyro's worker
                continue  # reports its own exceptions before it returns)
            sampler.result_queue.put((chain, ChainProcessError(
                f"run_nuts: chain {chain}'s process ended with exit code {code} before it finished. "
                "With the 'spawn' start method (the default) the usual causes are a script without "
                "`if __name__ == \"__main__\":` around the sampling (the child imports the script "
                "again; its stderr says 'bootstrapping phase') or a model the child cannot import; "
                "otherwise the process was killed (out of memory?)."
            )))  # fmt: skip
            return


def run_watched(mcmc: MCMC, *args: Any, every: float = 1.0) -> None:
    """``mcmc.run(*args)``; a chain process that dies raises :class:`ChainProcessError` here
    instead of leaving Pyro waiting for it forever."""
    done = threading.Event()
    watchdog = threading.Thread(target=_watch, args=(mcmc, done, every), daemon=True)
    watchdog.start()
    try:
        mcmc.run(*args)
    finally:
        done.set()
        watchdog.join()
