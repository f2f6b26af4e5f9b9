"""Input checks shared by the statistics (a ground piece of ``stats``: it imports nothing else
from it, so every estimator and kernel module can use it)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._checks import ArgumentTypeError

__all__: list[str] = []


def _as_tensor_2d(name: str, value: Any) -> Tensor:
    """Return ``value`` as a floating tensor of shape ``(n, d)`` (1-D ``(n,)`` -> ``(n, 1)``).

    Under ``torch.jit.trace`` only the reshape runs: the checks branch on values, and
    ``pyro.ops.jit.trace`` runs every compiled function once eagerly (where they apply) first.
    """
    if torch.jit.is_tracing() and isinstance(value, Tensor):
        return value.unsqueeze(-1) if value.dim() == 1 else value
    if isinstance(value, (str, bytes)) or value is None:
        x = None
    else:
        try:
            x = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            x = None
    if x is None:
        raise ArgumentTypeError(
            f"`{name}` must be a tensor or array of real numbers (one row per datapoint), got "
            f"{value!r:.80} of type {type(value).__name__}"
        )
    if not (x.is_floating_point() or x.is_complex()):
        x = x.to(torch.get_default_dtype())
    if x.is_complex():
        raise ValueError(f"`{name}` must be real-valued, got dtype {x.dtype}")
    if x.dim() == 1:
        x = x.unsqueeze(-1)
    elif x.dim() != 2:
        raise ValueError(f"`{name}` must have shape (n,) or (n, d) (one row per datapoint), got shape {tuple(x.shape)}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"`{name}` must be non-empty, got shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x.detach()).all()):
        raise ValueError(f"`{name}` contains NaN or infinite values")
    return x


def _check_same_n(name_a: str, a: Any, name_b: str, b: Any) -> None:
    if not torch.jit.is_tracing() and a.shape[0] != b.shape[0]:
        raise ValueError(
            f"`{name_a}` and `{name_b}` must have the same number of rows (datapoints), "
            f"got {a.shape[0]} and {b.shape[0]}"
        )
