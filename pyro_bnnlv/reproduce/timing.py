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

#: the label prefix of the benchmarks' rows timed by :func:`fit_step_ms_beside`
ALTERNATED = "alternated step by step"


def median_ms(fn: Callable[[], None], steps: int, warmup: int = 20) -> float:
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
    """Median ms per ``fit_svi`` step over ``steps`` steps, stamped by its callback; the first 20
    steps (compilation, warm-up, the JIT guard's checks at steps 1 and 10) are not timed."""
    stamps: list[float] = []
    fit_svi(
        model,
        guide,
        x,
        y,
        num_steps=steps + 21,
        progress=False,
        callback=lambda step, value: stamps.append(time.perf_counter()),
        **fit_kwargs,
    )
    return 1e3 * statistics.median(b - a for a, b in zip(stamps[20:], stamps[21:]))


def fit_step_ms_beside(
    other: Callable[[], None],
    model: Callable[..., Any],
    guide: Any,
    x: Tensor,
    y: Tensor,
    steps: int,
    **fit_kwargs: Any,
) -> tuple[float, float]:
    """Median ms per ``fit_svi`` step and per call of ``other``, alternated step by step: ``fit_svi``'s
    callback runs ``other`` once after every step and times it, and a ``fit_svi`` step is the time
    between the end of one callback and the start of the next. Both see the same moments of the
    machine's load, so their ratio is steadier than that of separate runs. The first 20 steps are
    not timed (``other`` runs there too, as its warm-up)."""
    marks: list[tuple[float, float]] = []  # (callback start, callback end)

    def callback(step: int, value: float) -> None:
        start = time.perf_counter()
        other()
        marks.append((start, time.perf_counter()))

    fit_svi(model, guide, x, y, num_steps=steps + 21, progress=False, callback=callback, **fit_kwargs)
    timed = marks[20:]
    ours = [b_start - a_end for (_, a_end), (b_start, _) in zip(timed, timed[1:])]
    theirs = [end - start for start, end in timed[1:]]
    return 1e3 * statistics.median(ours), 1e3 * statistics.median(theirs)
