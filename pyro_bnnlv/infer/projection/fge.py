r"""Fast Geometric Ensembling (FGE): many good weight vectors from one training run.

Reference: Garipov et al. (2018), as used by Pradier, Pan, Yao, Ghosh & Doshi-Velez (2018),
arXiv:1811.07006 (Alg. 1, step 1; App. A: "a step-size of 0.001 to first reach the MAP solution, and
then a cyclic learning rate between 0.01 and 0.0001. Each cycle lasts for 10 epochs"; R = 500
candidates, the best 150 by validation RMSE kept).

The objective is the negative log joint ``-log p(y | x, w) - log p(w)`` of the model (a
:class:`~pyro_bnnlv.models.bnn.BNN`: its ``net``, ``noise_scale``, ``prior_loc`` and
``prior_scale``), divided by ``N`` and estimated on minibatches
(:func:`~pyro_bnnlv.infer.svi.map_objective`, the objective of ``train_map``), optimised with Adam (App. A uses
Adam for every subtask). After :func:`~pyro_bnnlv.infer.train_map` reaches the MAP with step
0.001, each cycle of ``c`` steps runs Garipov et al.'s triangular schedule

.. math::

    t = \frac{(i \bmod c) + 1}{c}, \quad
    \alpha(i) = \begin{cases} (1 - 2t)\,\alpha_1 + 2t\,\alpha_2 & t \le 1/2 \\
                              (2 - 2t)\,\alpha_2 + (2t - 1)\,\alpha_1 & t > 1/2 \end{cases}

from ``alpha_1 = 0.01`` down to ``alpha_2 = 0.0001`` and back, and the weights are collected at the
middle of each cycle, where the learning rate is smallest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..._checks import check_int
from ..._state import set_seed
from ..svi import map_objective, train_map

__all__ = ["FGEResult", "cyclic_lr", "fge"]


@dataclass
class FGEResult:
    """Output of :func:`fge`.

    Attributes:
        candidates: ``(R, P)`` all collected weight vectors, in collection order.
        valid_rmse: ``(R,)`` RMSE of each candidate's prediction on the validation data.
        kept: ``(K, P)`` the ``K`` candidates with the lowest validation RMSE (best first).
        map_weights: ``(P,)`` the MAP the cycles start from.
    """

    candidates: Tensor
    valid_rmse: Tensor
    kept: Tensor
    map_weights: Tensor


def cyclic_lr(step: int, cycle_steps: int, lr_max: float, lr_min: float) -> float:
    """Garipov et al.'s triangular schedule (module docstring): ``lr_min`` at mid-cycle."""
    t = ((step % cycle_steps) + 1) / cycle_steps
    if t <= 0.5:
        return (1 - 2 * t) * lr_max + 2 * t * lr_min
    return (2 - 2 * t) * lr_min + (2 * t - 1) * lr_max


def fge(
    model,
    x: Tensor,
    y: Tensor,
    *,
    x_valid: Tensor | None = None,
    y_valid: Tensor | None = None,
    num_candidates: int = 500,
    keep: int = 150,
    map_steps: int = 2000,
    map_lr: float = 0.001,
    lr_max: float = 0.01,
    lr_min: float = 0.0001,
    cycle_epochs: float = 10,
    batch_size: int = 128,
    seed: int | None = None,
    progress: bool = True,
) -> FGEResult:
    """Collect ``num_candidates`` weight vectors by FGE and keep the best ``keep`` by validation RMSE.

    Args:
        model: a :class:`~pyro_bnnlv.models.bnn.BNN` (its prior and noise define the objective).
        x, y: training data; x_valid, y_valid: validation data for the ranking (default: the
            training data).
        num_candidates: ``R`` (paper: 500); keep: how many to keep (paper: 150).
        map_steps, map_lr: Adam steps and step size to reach the MAP first (paper: 0.001).
        lr_max, lr_min: the cyclic schedule's bounds (paper: 0.01, 0.0001).
        cycle_epochs: cycle length in epochs (paper: 10); one epoch is ``ceil(N / batch_size)``
            steps.
        batch_size: minibatch size (paper: 128; capped at ``N``).
        seed: seeds the initialisation and the minibatches.
    """
    for name, v in (
        ("num_candidates", num_candidates),
        ("keep", keep),
        ("map_steps", map_steps),
        ("batch_size", batch_size),
    ):
        check_int(v, name)
    if keep > num_candidates:
        raise ValueError(f"keep={keep} exceeds num_candidates={num_candidates}")
    if not 0 < lr_min < lr_max:
        raise ValueError(f"need 0 < lr_min < lr_max, got lr_min={lr_min}, lr_max={lr_max}")
    if cycle_epochs <= 0:
        raise ValueError(f"cycle_epochs must be positive, got {cycle_epochs}")
    model.check_data(x, y)
    if (x_valid is None) != (y_valid is None):
        raise ValueError("pass both x_valid and y_valid, or neither")
    if x_valid is None:
        x_valid, y_valid = x, y
    else:
        model.check_data(x_valid, y_valid)
    N = x.shape[0]
    batch_size = min(batch_size, N)
    w_map = train_map(model, x, y, num_steps=map_steps, lr=map_lr, batch_size=batch_size, seed=seed, progress=progress)
    set_seed(None if seed is None else int(seed) + 1)
    y2 = y.reshape(N, -1).to(x.dtype)
    w = torch.nn.Parameter(w_map.clone())
    opt = torch.optim.Adam([w], lr=lr_max)
    cycle = max(2, int(math.ceil(cycle_epochs * math.ceil(N / batch_size))))
    collected = []
    bar = tqdm(total=num_candidates, disable=not progress, desc="FGE", leave=False)
    step = 0
    while len(collected) < num_candidates:
        lr = cyclic_lr(step, cycle, lr_max, lr_min)
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(N, (batch_size,))
        opt.zero_grad()
        loss = map_objective(model, w, x[idx], y2[idx], N)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"FGE: non-finite objective at step {step}")
        loss.backward()
        opt.step()
        step += 1
        if step % cycle == cycle // 2:  # the middle of a cycle: the smallest learning rate
            collected.append(w.detach().clone())
            bar.update(1)
    bar.close()
    candidates = torch.stack(collected)
    with torch.no_grad():
        f = model.net(x_valid, candidates).reshape(num_candidates, x_valid.shape[0], -1)
        rmse = (f - y_valid.reshape(x_valid.shape[0], -1)).pow(2).mean((1, 2)).sqrt()
    order = rmse.argsort()
    return FGEResult(candidates, rmse, candidates[order[:keep]], w_map)
