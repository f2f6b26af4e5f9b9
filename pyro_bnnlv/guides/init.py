"""Initialisation of guides' locations for network weights.

Pyro's autoguides default to ``init_to_feasible``, which puts every weight at 0: a symmetric
saddle of the network where all hidden units are identical, from which mean-field VI escapes
slowly if at all (on the cosine toy, RMSE 0.41 after 1,500 steps against 0.15 from a proper
initialisation). :func:`init_to_network` starts the weight site at a PyTorch-default network
initialisation (or a given vector, e.g. a MAP fit) instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from pyro.infer.autoguide import init_to_feasible, init_to_value
from torch import Tensor

__all__ = ["init_to_network"]


def init_to_network(
    model: torch.nn.Module,
    seed: int = 0,
    weights: Tensor | None = None,
    fallback: Callable | None = init_to_feasible,
) -> Callable:
    """An ``init_loc_fn`` for autoguides: site ``"w"`` starts at ``weights`` or at
    ``model.net.init_weights`` drawn with ``seed``; other sites (e.g. latent inputs ``"z"``)
    use ``fallback`` (default ``init_to_feasible``, i.e. 0 for real-valued sites)."""
    net = model.net
    if weights is None:
        weights = net.init_weights(torch.Generator().manual_seed(int(seed)))
    else:
        net.check_weights(weights, "weights")
        if not torch.isfinite(weights).all():
            raise ValueError("weights contains NaN or infinite values")
    return init_to_value(values={"w": weights.detach().clone()}, fallback=fallback)
