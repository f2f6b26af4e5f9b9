r"""Several :class:`~pyro_bnnlv.infer.mcmc.kernel.FlatNUTS` chains in one process.

``run_nuts(num_chains=K)`` on the flat kernel runs all chains in the calling process, each with
its own :class:`~pyro_bnnlv.infer.mcmc.kernel.FlatNUTS` (so its own step-size and mass-matrix
adaptation, Pyro's ``WarmupAdapter``), its own ``torch.Generator`` (seeded by
:func:`_sampling_seed`) and, for a compiled potential, its own ``MLPPotential.clone()``
(:func:`_chain_potentials`). The compiled tree releases the GIL, so the chains run in parallel
threads (``_ChainRunner``); a Python potential holds the GIL, so its chains run one after
another. Nothing needs pickling or ``fork``. ``_InProcessMCMC`` is Pyro's ``MCMC`` around that
runner, so ``get_samples(group_by_chain=True)``, ``summary()`` and the ArviZ export work as
usual.

``_InProcessMCMC`` fills the private state of Pyro's ``MCMC`` (``_samples``, ``_diagnostics``,
``_args``, ...) that ``MCMC.run`` would; ``tests/test_pyro_private_api.py`` checks that it still
exists.
"""

from __future__ import annotations

import logging
import math
import queue
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from pyro.infer import MCMC
from pyro.infer.mcmc.api import AbstractMCMC
from pyro.infer.mcmc.logger import ProgressBar
from tqdm import tqdm

from ..._platform import usable_cores
from ...models.potential import FlatPotential
from .kernel import FlatNUTS

__all__ = [
    "_ChainRunner",
    "_InProcessMCMC",
    "_chain_potentials",
    "_format_seconds",
    "_sampling_seed",
    "warmup_reestimate",
]

_log = logging.getLogger("pyro_bnnlv")

_MASK64 = (1 << 64) - 1


def _sampling_seed(chain_seed: int) -> int:
    """Seed of a chain's NUTS generator: SplitMix64's mix of the chain seed (Steele, Lea & Flood
    2014, "Fast splittable pseudorandom number generators", OOPSLA), so that the sampling stream
    of chain seed ``s`` never coincides with an initialisation stream (``set_seed(s' + 1)``) of
    this or another chain."""
    z = (int(chain_seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1  # 63 bits


def _chain_potentials(pot: FlatPotential, num_chains: int) -> list[FlatPotential]:
    """One potential per chain. A compiled potential keeps work buffers, so each further chain
    gets an independent ``clone()`` (same data); a Python potential is shared (its chains run one
    after another)."""
    if pot.compiled is None or not hasattr(pot.compiled, "clone"):
        return [pot] * num_chains
    out = [pot]
    for _ in range(num_chains - 1):
        core = pot.compiled.clone()
        out.append(FlatPotential(dict(pot.sites), core.value_and_grad, compiled=core))
    return out


def _format_seconds(sec: float) -> str:
    if sec < 120:
        return f"{sec:.0f} s"
    if sec < 7200:
        return f"{sec / 60:.1f} min"
    return f"{sec / 3600:.1f} h"


#: the share of the warm-up whose cost per iteration predicts the kept draws' (:func:`warmup_reestimate`)
WARMUP_TAIL = 0.25


def warmup_reestimate(warmup_ends: Sequence[float], num_samples: int, tail: float = WARMUP_TAIL) -> tuple[float, float]:
    r"""``(r, T)``: one chain's projected seconds per kept draw ``r`` and seconds from its start to
    its end ``T``, from the times ``t_1 <= ... <= t_W`` (seconds since the chain started) at which its
    ``W`` warm-up iterations ended.

    An iteration costs its leapfrog steps (up to ``2^depth - 1``), and the trees deepen during the
    warm-up: the step size adapts down from its initial value and the mass matrix is learned in
    windows, so an estimate from the first iterations runs low. The kept draws cost about what the
    end of the warm-up cost, so ``r`` is the mean over the last ``m = ceil(tail W)`` warm-up
    iterations,

    .. math:: r = (t_W - t_{W-m}) / m \qquad (t_0 = 0), \qquad T = t_W + S r

    with ``S = num_samples``. ``ValueError`` for no warm-up iterations or times out of order.
    """
    W = len(warmup_ends)
    if W == 0:
        raise ValueError("warmup_reestimate needs at least one warm-up iteration")
    if any(b < a for a, b in zip([0.0, *warmup_ends], warmup_ends)):
        raise ValueError("warm-up end times must be non-negative and non-decreasing")
    if not 0 < tail <= 1:
        raise ValueError(f"tail must lie in (0, 1], got {tail!r}")
    m = max(1, math.ceil(tail * W))
    start = warmup_ends[W - m - 1] if W > m else 0.0
    r = (warmup_ends[-1] - start) / m
    return r, warmup_ends[-1] + num_samples * r


class _ChainRunner:
    """Runs several :class:`FlatNUTS` chains in this process, in Pyro's sampler protocol.

    ``run()`` yields ``(item, chain_id)`` as Pyro's samplers do for :class:`~pyro.infer.MCMC`:
    first the sites' shapes, then each kept draw as one flat tensor, then the chain's
    diagnostics. With ``parallel=True`` every chain runs in its own thread (the C++ trees release
    the GIL), else one after another; each chain owns its kernel, potential and generator, so the
    draws do not depend on the order of execution.

    After ``estimate_after`` iterations per running chain the total run time is estimated and said
    (a ``tqdm`` line when the bars are on and it is 10 s or more; an INFO record of the
    ``pyro_bnnlv`` logger either way), and re-estimated at the end of the warm-up
    (:func:`warmup_reestimate`), after which the bars' postfix projects the time left from the rate
    since then.

    While the chains run in threads, torch's intra-op thread count is ``cores // K`` (at least 1;
    restored afterwards) so that they do not oversubscribe the cores. ``cores``: the caller's
    count of usable cores (``None``: :func:`~pyro_bnnlv._platform.usable_cores`).
    """

    def __init__(
        self,
        kernels: Sequence[FlatNUTS],
        initial_params: Sequence[dict],
        warmup_steps: int,
        num_samples: int,
        parallel: bool,
        progress: bool,
        estimate_after: int = 10,
        cores: int | None = None,
    ) -> None:
        self.kernels = list(kernels)
        self.initial_params = list(initial_params)
        self.warmup_steps, self.num_samples = warmup_steps, num_samples
        self.parallel = parallel
        self.progress = progress
        self.estimate_after = estimate_after
        self.cores = cores
        self.estimate: dict[str, float] | None = None
        self.reestimate: dict[str, float] | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def terminate(self, *args: Any, **kwargs: Any) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
        self._threads = []

    def _chain(self, c: int):
        kernel = self.kernels[c]
        kernel.initial_params = self.initial_params[c]
        kernel.setup(self.warmup_steps)
        params = kernel.initial_params
        names = sorted(params)
        yield "structure", {n: params[n].shape for n in names}
        for i in range(self.warmup_steps + self.num_samples):
            if self._stop.is_set():
                return
            params = kernel.sample(params)
            if i < self.warmup_steps:
                yield "warmup", None
            else:
                yield "draw", torch.cat([params[n].reshape(-1) for n in names])
        yield "diagnostics", kernel.diagnostics()
        kernel.cleanup()

    def _events(self):
        K = len(self.kernels)
        if not self.parallel:
            for c in range(K):
                for kind, payload in self._chain(c):
                    yield c, kind, payload
            return
        events: queue.Queue = queue.Queue()

        def work(c: int) -> None:
            try:
                for kind, payload in self._chain(c):
                    events.put((c, kind, payload))
                events.put((c, "end", None))
            except BaseException as err:  # noqa: BLE001 -- re-raised in the caller's thread
                events.put((c, "error", err))

        self._stop.clear()
        self._threads = [
            threading.Thread(target=work, args=(c,), name=f"nuts-chain-{c}", daemon=True) for c in range(K)
        ]
        for t in self._threads:
            t.start()
        running = K
        while running:
            c, kind, payload = events.get()
            if kind == "error":
                self.terminate()
                raise payload
            if kind == "end":
                running -= 1
                continue
            yield c, kind, payload

    def _cores(self) -> int:
        return usable_cores() if self.cores is None else self.cores

    def run(self, *args: Any, **kwargs: Any):
        K, W, S = len(self.kernels), self.warmup_steps, self.num_samples
        total = K * (W + S)
        intra = torch.get_num_threads()
        if self.parallel:  # the chains occupy the cores: no intra-op threads on top (restored below),
            # and never more than the caller allowed with torch.set_num_threads
            torch.set_num_threads(min(intra, max(1, self._cores() // K)))
        bar = ProgressBar(W, S, disable=not self.progress, num_bars=K)
        done = [0] * K
        t0 = time.perf_counter()
        last_postfix = t0
        running = K if self.parallel else 1
        starts = [t0] * K  # when each chain began (its "structure" event)
        warmup_ends: list[list[float]] = [[] for _ in range(K)]  # its warm-up iterations' end times
        history: list[float] = []  # the end time of every iteration, in order
        mark = (t0, 0)  # (time, iterations) the postfix's rate counts from
        try:
            for c, kind, payload in self._events():
                now = time.perf_counter()
                if kind == "structure":
                    starts[c] = now
                if kind in ("warmup", "draw"):
                    done[c] += 1
                    history.append(now)
                    bar.update(pos=c)
                    if done[c] == W + 1 or (W == 0 and done[c] == 1):
                        bar.set_description("Sample" if K == 1 else f"Sample [{c + 1}]", pos=c)
                    n = sum(done)
                    if kind == "warmup":
                        warmup_ends[c].append(now - starts[c])
                    if self.estimate is None and n >= min(self.estimate_after * running, total):
                        self._say_estimate(bar, n, now - t0, total)
                    if (
                        self.reestimate is None
                        and W > 0
                        and done[c] == W
                        and all(len(warmup_ends[k]) == W for k in range(running))
                    ):
                        self._say_reestimate(bar, warmup_ends[:running], [s - t0 for s in starts[:running]], now - t0)
                        tail = max(1, math.ceil(WARMUP_TAIL * n))  # the rate counts from the window's start
                        mark = (history[-tail - 1], n - tail) if n > tail else (t0, 0)
                    if self.progress and now - last_postfix > 0.5:
                        left = (now - mark[0]) * (total - n) / max(n - mark[1], 1)
                        for b in range(K):
                            bar.set_postfix({"left": _format_seconds(left)}, refresh=False, pos=b)
                        last_postfix = now
                if kind != "warmup":
                    yield payload, c
        finally:
            self.terminate()
            bar.close()
            torch.set_num_threads(intra)

    def _say_estimate(self, bar: Any, n: int, elapsed: float, total: int) -> None:
        est = elapsed * total / n
        K = len(self.kernels)
        cores = self._cores()
        how = (
            f"{K} chains in parallel threads" + (f" on {cores} cores" if K > cores else "")
            if self.parallel and K > 1
            else f"{K} chains one after another"
            if K > 1
            else "1 chain"
        )
        msg = (
            f"NUTS: estimated {_format_seconds(est)} in total for {how} x "
            f"{self.warmup_steps + self.num_samples} iterations, from the first {n} iterations "
            f"({1e3 * elapsed / n:.1f} ms per iteration; warm-up trees often grow later)"
        )
        self.estimate = {"seconds": est, "from_iterations": n}
        _log.info(msg)
        if self.progress and not bar.disable and est >= 10:  # worth a line above the bars
            tqdm.write(msg, file=sys.stderr)

    def _say_reestimate(
        self, bar: Any, warmup_ends: Sequence[Sequence[float]], offsets: Sequence[float], elapsed: float
    ) -> None:
        """The run time re-estimated at the end of the warm-up of the running chains (all of them
        in parallel, else the first), by :func:`warmup_reestimate` per chain: in parallel the run
        ends with its slowest chain, one after another it takes ``K`` times the first chain."""
        K, S = len(self.kernels), self.num_samples
        per_chain = [warmup_reestimate(ends, S) for ends in warmup_ends]
        if len(per_chain) == K and self.parallel:
            est = max(off + T for off, (_, T) in zip(offsets, per_chain))
        else:
            est = offsets[0] + K * per_chain[0][1]
        W = len(warmup_ends[0])
        r_ms = 1e3 * sum(r for r, _ in per_chain) / len(per_chain)
        first = self.estimate["seconds"] if self.estimate is not None else None
        msg = (
            f"NUTS: warm-up done in {_format_seconds(elapsed)}; re-estimated {_format_seconds(est)} in total "
            f"({_format_seconds(max(est - elapsed, 0.0))} left) from the last {max(1, math.ceil(WARMUP_TAIL * W))} "
            f"warm-up iterations ({r_ms:.1f} ms per iteration and chain)"
            + (f", {est / first:.1f}x the first estimate" if first else "")
        )
        self.reestimate = {"seconds": est, "ms_per_draw": r_ms}
        _log.info(msg)
        if self.progress and not bar.disable and est >= 10:
            tqdm.write(msg, file=sys.stderr)


class _InProcessMCMC(MCMC):
    """Pyro's :class:`~pyro.infer.MCMC` (``get_samples``, ``summary``, ``diagnostics``) whose
    ``run`` advances several :class:`FlatNUTS` chains in this process (:class:`_ChainRunner`)
    instead of Pyro's one-after-another or multiprocessing samplers. ``kernel`` is chain 0's
    kernel, ``kernels`` all of them."""

    def __init__(
        self,
        kernels: Sequence[FlatNUTS],
        num_samples: int,
        warmup_steps: int,
        initial_params: Sequence[dict],
        parallel: bool,
        progress: bool,
        cores: int | None = None,
    ) -> None:
        AbstractMCMC.__init__(self, kernels[0], len(kernels), None)
        self.kernels = list(kernels)
        self.warmup_steps, self.num_samples = warmup_steps, num_samples
        self.disable_validation = True
        self._samples = None
        self._args, self._kwargs = None, None
        self._diagnostics = [None] * len(kernels)
        self.sampler = _ChainRunner(kernels, initial_params, warmup_steps, num_samples, parallel, progress, cores=cores)
