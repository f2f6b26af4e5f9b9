"""Initialisation of guides' locations for network weights.

Pyro's autoguides default to ``init_to_feasible``, which puts every weight at 0: a symmetric
saddle where all hidden units are identical (:mod:`~pyro_bnnlv.guides.mean_field`).
:func:`init_to_network` starts the weight site at a PyTorch-default network initialisation (or
a given vector, e.g. a MAP fit) instead.

The initial weights follow the dtype (and device) of the model's ``"w"`` site when the guide
is set up, so a model converted with ``model.double()`` (before or after this function is
called) gets float64 starting weights.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from pyro.infer.autoguide import init_to_feasible
from torch import Tensor

from .._checks import ArgumentTypeError, check_real, check_seed

__all__ = ["init_to_network"]


def check_init_scale(value: object, name: str = "init_scale") -> float:
    """A guide's initial scale as a positive finite ``float`` (Python or NumPy reals; not bools,
    strings, NaN or infinities: an infinite scale gives NaN parameters at the first step)."""
    try:
        scale = check_real(value, name, allow_inf=True)
    except ArgumentTypeError:
        raise
    except ValueError:  # NaN
        scale = math.nan
    if not 0 < scale < math.inf:
        kind = "a positive finite number" if scale == math.inf else "a positive number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return scale


def init_to_network(
    model: torch.nn.Module, seed: int = 0, weights: Tensor | None = None, fallback: Callable | None = init_to_feasible
) -> Callable:
    """An ``init_loc_fn`` for autoguides: site ``"w"`` starts at ``weights`` or at
    ``model.net.init_weights`` drawn with ``seed`` (an integer in ``[0, 2**32)``; ``None``: from
    torch's global generator); other sites (e.g. latent inputs ``"z"``) use ``fallback``
    (default ``init_to_feasible``, i.e. 0 for real-valued sites)."""
    net = getattr(model, "net", None)
    if net is None or not hasattr(net, "init_weights"):
        raise TypeError(
            f"init_to_network needs a model with a network in model.net (BNN, BNNLV, ProjectedBNN); "
            f"{type(model).__name__} has none: use one of Pyro's init functions (e.g. init_to_feasible)"
        )
    seed = check_seed(seed)
    if weights is None:
        weights = net.init_weights(None if seed is None else torch.Generator().manual_seed(seed))
    else:
        if not isinstance(weights, Tensor):
            raise TypeError(
                f"weights must be a tensor of {net.num_weights} weights (or None), got {type(weights).__name__}"
            )
        net.check_weights(weights, "weights")
        if not torch.isfinite(weights).all():
            raise ValueError("weights contains NaN or infinite values")
    return functools.partial(_init_site, weights=weights.detach().clone(), fallback=fallback)


def _init_site(site: dict, weights: Tensor, fallback: Callable | None) -> Tensor:
    """``weights`` for site ``"w"`` in the dtype and device of the site's distribution."""
    if site["name"] != "w":
        if fallback is None:
            raise ValueError(f"init_to_network has no value for site {site['name']!r} and fallback=None")
        return fallback(site)
    try:  # the mean has the site's dtype and device and, unlike a draw, uses no random numbers
        like = site["fn"].mean
    except NotImplementedError:
        like = site["fn"].sample()
    return weights.to(dtype=like.dtype, device=like.device)
