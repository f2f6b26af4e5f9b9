"""Toy data of Pradier, Pan, Yao, Ghosh & Doshi-Velez (2018), arXiv:1811.07006: the four-mode set
(Fig. 2) and the sine family of the multi-task variant (App. B, eq. 8-9).

* ``four-modes``: the paper draws points "from the 4 modes shown in Fig. 2d" and fits a 3-unit
  RBF network, whose solutions each fit three of the four modes. The figure's exact data are not
  given. Ours (``symmetric=True``, the default): on ``[0, 5]`` two bumps of height 1 at
  ``x = 1, 3`` (20 points each, ``x`` spread 0.15, noise 0.05) on a baseline of 160 points at 0
  (``|x - c| > 0.6``), mirrored onto ``[-5, 0]``, so that a 3-unit RBF network misses one of the
  four bumps and the two best "missed-bump modes" have equal mass, the setting of Fig. 2
  (why: docs/design-notes.md, 'datasets.projected_toys'). ``symmetric=False`` gives the earlier construction
  (40 points per bump, 160 baseline points over ``[-5, 5]``), with one dominant mode.
  :func:`bumps_fitted`, :func:`missed_bump_modes` and :func:`canonical_rbf_units` are the
  diagnostics the tutorial and tests use.
* ``sine-tasks``: ``y = a sin(x + b) + eps`` with ``a ~ U(-3, 3)`` per task and ``b`` equally
  spaced on ``[0, 2 pi)``, ``x ~ U(-pi, pi)``; ``extras["task_train"]`` (and ``_valid``,
  ``_test``) hold the task index of every point, ``extras["amplitude"]``/``["phase"]`` the
  tasks' ``a`` and ``b``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from torch import Tensor

from .._checks import check_int, check_seed
from ..nets import MLP
from .base import Dataset, make_dataset, register

__all__ = [
    "FOUR_MODE_CENTRES",
    "bumps_fitted",
    "canonical_rbf_units",
    "four_modes",
    "four_modes_net",
    "missed_bump_modes",
    "sine_tasks",
]

#: the bump positions of ``four-modes``
FOUR_MODE_CENTRES = (-3.0, -1.0, 1.0, 3.0)


@register("four-modes", "synthetic", "Proj-BNN Fig. 2: four bumps, fit by a 3-unit RBF net three at a time")
def four_modes(seed: int = 0, standardize: bool = False, noise: float = 0.05, symmetric: bool = True) -> Dataset:
    """Four-mode toy (see the module docstring): 400 training points (``symmetric=False``: 320),
    validation and test drawn alike."""
    rng = np.random.default_rng(check_seed(seed))

    def draw_symmetric():
        xs, ys = [], []
        for c in (1.0, 3.0):
            xs.append(c + 0.15 * rng.normal(size=20))
            ys.append(np.ones(20))
        base = rng.uniform(0.0, 5.0, 4000)
        base = base[np.min(np.abs(base[:, None] - np.array([1.0, 3.0])), 1) > 0.6][:160]
        xs.append(base)
        ys.append(np.zeros(len(base)))
        x, y = np.concatenate(xs), np.concatenate(ys)
        y = y + noise * rng.normal(size=len(y))
        return np.concatenate([-x[::-1], x]), np.concatenate([y[::-1], y])

    def draw():
        xs, ys = [], []
        for c in FOUR_MODE_CENTRES:
            xs.append(c + 0.15 * rng.normal(size=40))
            ys.append(np.ones(40))
        base = rng.uniform(-5.0, 5.0, 2000)
        base = base[np.min(np.abs(base[:, None] - np.array(FOUR_MODE_CENTRES)), 1) > 0.6][:160]
        xs.append(base)
        ys.append(np.zeros(len(base)))
        x, y = np.concatenate(xs), np.concatenate(ys)
        return x, y + noise * rng.normal(size=len(y))

    fn = draw_symmetric if symmetric else draw
    splits = {"train": fn(), "valid": fn(), "test": fn()}
    what = "mirror-symmetric " if symmetric else ""
    return make_dataset(
        "four-modes",
        splits,
        standardize=standardize,
        extras={"noise_std": np.array(noise)},
        description=f"{what}bumps of height 1 at -3,-1,1,3 on a zero baseline over [-5, 5]",
    )


def four_modes_net() -> MLP:
    """The network of Fig. 2: ``1 -> 3 RBF units -> 1`` (10 weights)."""
    return MLP(1, [3], 1, activation="rbf")


def bumps_fitted(net: MLP, w: Tensor, tol: float = 0.3) -> Tensor:
    """``(S, 4)`` booleans: which bumps of ``four-modes`` each of the ``(S, P)`` weight vectors
    fits, ``|f_w(c) - 1| < tol`` at the bump centres ``c``."""
    centres = torch.tensor(FOUR_MODE_CENTRES, dtype=w.dtype)[:, None]
    with torch.no_grad():
        return (net(centres, w.reshape(-1, w.shape[-1]))[..., 0] - 1).abs() < tol


def missed_bump_modes(net: MLP, w: Tensor, tol: float = 0.3) -> dict[str, float | int | dict]:
    """Mode census of weight samples on ``four-modes``.

    Returns ``fits_three`` (the share of samples fitting at least three bumps), ``counts``
    (among those, how many miss each bump, keyed by its centre; a sample fitting all four
    counts as missing none) and ``modes`` (how many distinct missed bumps hold at least 10% of
    the three-bump samples, the criterion of issue 17)."""
    ok = bumps_fitted(net, w, tol)
    three = ok.sum(1) >= 3
    counts: Counter = Counter()
    for row in ok[three]:
        missed = (~row).nonzero().flatten().tolist()
        counts[FOUR_MODE_CENTRES[missed[0]] if missed else "none"] += 1
    n3 = int(three.sum())
    modes = sum(1 for k, v in counts.items() if k != "none" and n3 > 0 and v >= 0.1 * n3)
    return {"fits_three": float(three.float().mean()), "counts": dict(counts), "modes": modes}


def canonical_rbf_units(net: MLP, w: Tensor) -> Tensor:
    """The same functions with the hidden units of a one-hidden-layer RBF network in a canonical
    order: each unit's ``exp(-(a x + b)^2)`` is unchanged by ``(a, b) -> (-a, -b)``, so ``a >= 0``
    is chosen, and the units are sorted by their centre ``-b / a`` (the output weights follow).
    Removes the ``k! 2^k`` copies of every solution that MAP restarts land in."""
    if net.activation != "rbf" or len(net.hidden_sizes) != 1 or net.in_features != 1:
        raise ValueError("canonical_rbf_units needs an MLP(1, [k], L, activation='rbf')")
    (W1, b1), (W2, b2) = net.unflatten(w)  # (*S, k, 1), (*S, k), (*S, L, k), (*S, L)
    a, b = W1[..., 0], b1
    sign = torch.where(a < 0, -1.0, 1.0).to(w.dtype)
    a, b = a * sign, b * sign
    order = (-b / a.clamp_min(1e-12)).argsort(-1)
    a, b = a.gather(-1, order), b.gather(-1, order)
    W2 = W2.gather(-1, order.unsqueeze(-2).expand_as(W2))
    return torch.cat([a, b, W2.flatten(-2), b2], -1)


@register("sine-tasks", "synthetic", "Proj-BNN App. B: a sin(x + b) tasks for the multi-task model")
def sine_tasks(
    seed: int = 0, standardize: bool = False, num_tasks: int = 12, points: int = 20, noise: float = 0.1
) -> Dataset:
    """Sine family (see the module docstring): ``points`` per task per split."""
    num_tasks, points = check_int(num_tasks, "num_tasks"), check_int(points, "points")
    rng = np.random.default_rng(check_seed(seed))
    a = rng.uniform(-3.0, 3.0, num_tasks)
    b = np.linspace(0.0, 2 * np.pi, num_tasks, endpoint=False)
    splits, tasks = {}, {}
    for split in ("train", "valid", "test"):
        t = np.repeat(np.arange(num_tasks), points)
        x = rng.uniform(-np.pi, np.pi, len(t))
        splits[split] = (x, a[t] * np.sin(x + b[t]) + noise * rng.normal(size=len(t)))
        tasks[f"task_{split}"] = t
    data = make_dataset(
        "sine-tasks",
        splits,
        standardize=standardize,
        extras={"amplitude": a, "phase": b, "noise_std": np.array(noise)},
        description=f"{num_tasks} tasks y = a sin(x + b), a ~ U(-3, 3), b on [0, 2 pi)",
    )
    import torch

    data.extras.update({k: torch.as_tensor(v, dtype=torch.long) for k, v in tasks.items()})
    return data
