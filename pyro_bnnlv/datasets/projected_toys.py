"""Toy data of ``projected-bnn-latent-weights.txt``: the four-mode set (Fig. 2) and the sine family
of the multi-task variant (App. B, eq. 8-9).

* ``four-modes``: the paper draws points "from the 4 modes shown in Fig. 2d" and fits a 3-unit
  RBF network, whose solutions each fit three of the four modes. The figure's exact data are not
  given; ours are four bumps of height 1 at ``x = -3, -1, 1, 3`` (40 points each, noise 0.05)
  on a baseline of 160 points at height 0 spread over ``[-5, 5]`` away from the bumps (the
  baseline rules out "a constant of 1 with dips" solutions). A network
  ``f(x) = c + sum_j v_j exp(-(a_j x + b_j)^2)`` with three units can place one bump per unit
  and must leave one of the four clusters unfitted: four groups of solutions (times the 3!
  unit permutations), one per missed bump.
* ``sine-tasks``: ``y = a sin(x + b) + eps`` with ``a ~ U(-3, 3)`` per task and ``b`` equally
  spaced on ``[0, 2 pi)``, ``x ~ U(-pi, pi)``; ``extras["task_train"]`` (and ``_valid``,
  ``_test``) hold the task index of every point, ``extras["amplitude"]``/``["phase"]`` the
  tasks' ``a`` and ``b``.
"""

from __future__ import annotations

import numpy as np

from .base import Dataset, make_dataset, register

__all__ = ["four_modes", "sine_tasks"]


@register("four-modes", "synthetic", "Proj-BNN Fig. 2: four bumps, fit by a 3-unit RBF net three at a time")
def four_modes(seed: int = 0, standardize: bool = False, noise: float = 0.05) -> Dataset:
    """Four-mode toy (see the module docstring); 320 training points, validation and test alike."""
    rng = np.random.default_rng(seed)

    def draw():
        xs, ys = [], []
        for c in (-3.0, -1.0, 1.0, 3.0):
            xs.append(c + 0.15 * rng.normal(size=40))
            ys.append(np.ones(40))
        base = rng.uniform(-5.0, 5.0, 2000)
        base = base[np.min(np.abs(base[:, None] - np.array([-3.0, -1.0, 1.0, 3.0])), 1) > 0.6][:160]
        xs.append(base)
        ys.append(np.zeros(len(base)))
        x, y = np.concatenate(xs), np.concatenate(ys)
        return x, y + noise * rng.normal(size=len(y))

    splits = {"train": draw(), "valid": draw(), "test": draw()}
    return make_dataset("four-modes", splits, standardize=standardize, extras={"noise_std": np.array(noise)},
                        description="bumps of height 1 at -3,-1,1,3 on a zero baseline over [-5, 5]")  # fmt: skip


@register("sine-tasks", "synthetic", "Proj-BNN App. B: a sin(x + b) tasks for the multi-task model")
def sine_tasks(seed: int = 0, standardize: bool = False, num_tasks: int = 12, points: int = 20,
               noise: float = 0.1) -> Dataset:  # fmt: skip
    """Sine family (see the module docstring): ``points`` per task per split."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-3.0, 3.0, num_tasks)
    b = np.linspace(0.0, 2 * np.pi, num_tasks, endpoint=False)
    splits, tasks = {}, {}
    for split in ("train", "valid", "test"):
        t = np.repeat(np.arange(num_tasks), points)
        x = rng.uniform(-np.pi, np.pi, len(t))
        splits[split] = (x, a[t] * np.sin(x + b[t]) + noise * rng.normal(size=len(t)))
        tasks[f"task_{split}"] = t
    data = make_dataset("sine-tasks", splits, standardize=standardize,
                        extras={"amplitude": a, "phase": b, "noise_std": np.array(noise)},
                        description=f"{num_tasks} tasks y = a sin(x + b), a ~ U(-3, 3), b on [0, 2 pi)")  # fmt: skip
    import torch

    data.extras.update({k: torch.as_tensor(v, dtype=torch.long) for k, v in tasks.items()})
    return data
