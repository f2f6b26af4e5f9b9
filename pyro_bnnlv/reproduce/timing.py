"""Timing for the benchmarks (``pyro-bnnlv bench NAME``): medians of interleaved measurements.

Times on shared machines are noisy; ratios of interleaved measurements are not (much). Every
benchmark alternates its contenders in rounds and reports medians over steps.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from torch import Tensor

from ..infer.svi import fit_svi

__all__ = ["ALTERNATED", "fit_step_ms", "fit_step_ms_beside", "median_ms"]

#: steps not timed at the start of a timed fit (compilation, warm-up, the JIT guard's checks at
#: steps 1 and 10), and calls before a timed function's
WARMUP = 20
#: steps of each contender in a row in :func:`fit_step_ms_beside`
BLOCK = 25
#: the label prefix of the benchmarks' rows timed by :func:`fit_step_ms_beside`
ALTERNATED = f"alternated in blocks of {BLOCK} steps"


def median_ms(fn: Callable[[], None], steps: int, warmup: int = WARMUP) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``steps`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def fit_step_ms(model: Callable[..., Any], guide: Any, x: Tensor, y: Tensor, steps: int, **fit_kwargs: Any) -> float:
    """Median ms per ``fit_svi`` step over ``steps`` steps, stamped by its callback; the first
    :data:`WARMUP` steps are not timed."""
    stamps: list[float] = []
    fit_svi(
        model,
        guide,
        x,
        y,
        num_steps=steps + WARMUP + 1,
        progress=False,
        callback=lambda step, value: stamps.append(time.perf_counter()),
        **fit_kwargs,
    )
    timed = stamps[WARMUP:]
    return 1e3 * statistics.median(b - a for a, b in zip(timed, timed[1:]))


def fit_step_ms_beside(
    other: Callable[[], None],
    model: Callable[..., Any],
    guide: Any,
    x: Tensor,
    y: Tensor,
    steps: int,
    block: int = BLOCK,
    **fit_kwargs: Any,
) -> tuple[float, float]:
    """Median ms per ``fit_svi`` step and per call of ``other``, alternated in blocks: after every
    ``block``-th step ``fit_svi``'s callback calls ``other`` ``block`` times and times each call; a
    ``fit_svi`` step is the time between the end of one callback and the start of the next. Both
    see the same moments of the machine's load, so their ratio is steadier than that of separate
    runs, and each runs most steps with its own data in the caches, as a fit does (alternating
    every step, ``block=1``, evicts them: a step's cold-cache cost is then part of both medians,
    more of the contender with the larger working set). The first :data:`WARMUP` steps are not
    timed (``other`` runs once after each of them, as its warm-up)."""
    marks: list[tuple[float, float]] = []  # (callback start, callback end)
    theirs: list[float] = []

    def callback(step: int, value: float) -> None:
        start = time.perf_counter()
        if step < WARMUP:
            other()
        elif step % block == 0:
            for _ in range(block):
                t = time.perf_counter()
                other()
                theirs.append(time.perf_counter() - t)
        marks.append((start, time.perf_counter()))

    fit_svi(model, guide, x, y, num_steps=steps + WARMUP + 1, progress=False, callback=callback, **fit_kwargs)
    timed = marks[WARMUP:]
    ours = [b_start - a_end for (_, a_end), (b_start, _) in zip(timed, timed[1:])]
    return 1e3 * statistics.median(ours), 1e3 * statistics.median(theirs)
