"""Ground layer: argument checks shared by every module, with errors that name the argument.

One acceptance rule for each kind of number, so a value that works in one function works in all:

* counts (:func:`check_int`): Python or NumPy integers, and one-element integer tensors; not
  bools, not floats (``4.7`` is never truncated; ``4.0`` is refused as a count: say ``4``);
* reals (:func:`check_real`): Python or NumPy integers and floats and one-element tensors; not
  bools, strings or NaN; infinities only with ``allow_inf=True``;
* seeds (:func:`check_seed`): ``None`` or an integer in ``[0, 2**32)``, the range NumPy's and
  Python's generators all accept;
* widths of network layers are counts too, but :func:`pyro_bnnlv.nets.as_positive_int` also
  takes an integral float (``4.0``), as ``MLP`` always has; every layer width goes through it.

Each returns the plain Python value (``int`` or ``float``), so callers store and compare plain
numbers whatever the user passed.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "POSITIVE_NUMBERS",
    "ArgumentTypeError",
    "as_float64",
    "as_float64_vector",
    "as_number_tensor",
    "as_positive_float64",
    "check_fraction",
    "check_int",
    "check_real",
    "check_seed",
]


#: the ``kind`` of :func:`as_number_tensor` for prior, noise and precision scales
POSITIVE_NUMBERS = "a positive number (or a tensor of them)"


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (a string for a number, ...): a ``TypeError``, and a
    ``ValueError`` too, so code that catches either (as earlier versions raised) still does."""


def _unwrap(value: object) -> object:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dim() <= 1:
        return value.item()
    return value


def check_int(value: object, name: str, *, minimum: int | None = 1, allow_none: bool = False) -> int | None:
    """``value`` as an ``int >= minimum`` (``minimum=None``: any integer); ``ValueError`` naming
    ``name`` otherwise (:class:`ArgumentTypeError` for a non-number)."""
    if value is None and allow_none:
        return None
    value = _unwrap(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        kind = "a positive integer" if minimum == 1 else "an integer" if minimum is None else f"an integer >= {minimum}"
        error = ValueError if isinstance(value, numbers.Real) else ArgumentTypeError
        raise error(f"{name} must be {kind}, got {value!r}" + (" (None is not allowed)" if value is None else ""))
    if minimum is not None and value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return int(value)


def check_real(
    value: object,
    name: str,
    *,
    positive: bool = False,
    nonnegative: bool = False,
    allow_inf: bool = False,
    allow_none: bool = False,
) -> float | None:
    """``value`` as a ``float``; ``ValueError`` naming ``name`` for NaN, an infinity (unless
    ``allow_inf``), a non-positive value (``positive``) or a negative one (``nonnegative``);
    :class:`ArgumentTypeError` for anything that is not a real number (strings, bools, ``None``)."""
    if value is None and allow_none:
        return None
    value = _unwrap(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}")
    value = float(value)
    finite = not (math.isnan(value) or (math.isinf(value) and not allow_inf))
    if positive and not (finite and value > 0):
        kind = "a positive number" if allow_inf or not math.isinf(value) else "a positive finite number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    if not finite:
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if nonnegative and not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def check_seed(value: object, name: str = "seed") -> int | None:
    """``None`` or an integer seed in ``[0, 2**32)`` as an ``int``."""
    if value is None:
        return None
    value = _unwrap(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{name} must be None or an integer in [0, 2**32), got {value!r}")
    if not 0 <= value < 2**32:
        raise ValueError(f"{name} must be None or an integer in [0, 2**32), got {value!r}")
    return int(value)


def as_float64(value: object, name: str, *, allow_infinite: bool = False) -> Tensor:
    """``value`` as a float64 tensor; ``ValueError`` naming ``name`` if any entry is NaN, or
    infinite unless ``allow_infinite`` (a precision or variance may be ``inf``)."""
    t = torch.as_tensor(value, dtype=torch.float64)
    bad = torch.isnan(t) if allow_infinite else ~torch.isfinite(t)
    if bad.any():
        raise ValueError(f"{name} must be {'free of NaN' if allow_infinite else 'finite'}, got {value!r}")
    return t


def as_positive_float64(value: object, name: str, *, allow_infinite: bool = False) -> Tensor:
    """:func:`as_float64` with every entry > 0."""
    t = as_float64(value, name, allow_infinite=allow_infinite)
    if (t <= 0).any():
        raise ValueError(f"{name} must be positive, got {value!r}")
    return t


def as_float64_vector(value: object, K: int, name: str, positive: bool = False) -> Tensor:
    """A scalar or ``(K,)`` value as a float64 ``(K,)`` vector (:func:`as_float64`, or
    :func:`as_positive_float64` when ``positive``)."""
    t = as_positive_float64(value, name) if positive else as_float64(value, name)
    if t.dim() == 0:
        return t.expand(K).clone()
    if t.shape != (K,):
        raise ValueError(f"{name} must be a scalar or have shape ({K},), got {tuple(t.shape)}")
    return t


def check_fraction(value: object, name: str) -> float:
    """``value`` as a ``float`` in ``[0, 1)`` (Python or NumPy reals; not bools), the error
    naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a fraction in [0, 1), got {value!r}")
    return float(value)


def as_number_tensor(value: object, name: str, dtype: torch.dtype, kind: str) -> Tensor:
    """``value`` (a number, NumPy scalar or array, or tensor) as a ``dtype`` tensor (it may share
    memory with ``value``); strings, bools and other non-numbers raise :class:`ArgumentTypeError`
    ``"{name} must be {kind}, got ..."``."""
    is_bool = isinstance(value, (bool, np.bool_)) or (
        isinstance(value, (Tensor, np.ndarray)) and value.dtype in (torch.bool, np.bool_)
    )
    if is_bool or isinstance(value, (str, bytes)):
        raise ArgumentTypeError(f"{name} must be {kind}, got {value!r}")
    try:
        return torch.as_tensor(value, dtype=dtype)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ArgumentTypeError(
            f"{name} must be {kind}, got {value!r} of type {type(value).__name__} ({err})"
        ) from None
