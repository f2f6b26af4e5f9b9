"""Save a fitted model + guide to one file and rebuild them exactly.

The file (``torch.save``) holds state dicts plus the configuration needed to rebuild the
objects: the model's class and ``config()``, the guide's class and constructor keyword
arguments, and the shape of the training inputs (needed to re-create the guide's parameters,
whose shapes can depend on the number of data points, e.g. per-datapoint latents). No global
parameter-store names are involved, so several fits can be loaded side by side.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import torch

from .infer.svi import isolated_param_store

__all__ = ["save_fit", "load_fit"]

_FORMAT = 1


def _qualname(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _import(qualname: str) -> type:
    module, _, name = qualname.partition(":")
    return getattr(importlib.import_module(module), name)


def save_fit(
    path: str | Path,
    model: torch.nn.Module,
    guide: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor | None = None,
    guide_kwargs: dict[str, Any] | None = None,
    model_kwargs: dict[str, Any] | None = None,
) -> None:
    """Write ``model`` and ``guide`` (fitted on data shaped like ``x``, ``y``) to ``path``.

    ``guide_kwargs``: picklable constructor arguments of the guide besides the model (e.g.
    ``{"init_scale": 0.01}``); initialisation functions need not be saved, the state dict
    overrides what they produce. ``model_kwargs``: keyword arguments the model needs besides
    ``x, y`` (e.g. ``{"task": task}`` for a multi-task :class:`~pyro_bnnlv.ProjectedBNN`); they
    are saved and passed to the model when :func:`load_fit` re-creates the guide's parameters.
    """
    if not hasattr(model, "config"):
        raise TypeError(f"model {type(model).__name__} has no config(); cannot be saved")
    model_kwargs = dict(model_kwargs or {})
    if hasattr(model, "check_data"):
        model.check_data(x, y, **model_kwargs)  # catches a missing task= before writing the file
    payload = {
        "format": _FORMAT,
        "model_class": _qualname(model),
        "model_config": model.config(),
        "model_state": model.state_dict(),
        "guide_class": _qualname(guide),
        "guide_kwargs": dict(guide_kwargs or {}),
        "guide_state": guide.state_dict(),
        "x_shape": tuple(x.shape),
        "y_shape": None if y is None else tuple(y.shape),
        "x_dtype": str(x.dtype),
        "model_kwargs": {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in model_kwargs.items()},
    }
    torch.save(payload, Path(path))


def load_fit(path: str | Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Rebuild ``(model, guide)`` saved by :func:`save_fit`."""
    payload = torch.load(Path(path), weights_only=False)
    if payload.get("format") != _FORMAT:
        raise ValueError(f"{path}: unsupported file format {payload.get('format')!r}")
    model = _import(payload["model_class"]).from_config(payload["model_config"])
    model.load_state_dict(payload["model_state"])
    guide_cls = _import(payload["guide_class"])
    kwargs = dict(payload["guide_kwargs"])
    if hasattr(model, "create_plates") and "create_plates" in inspect.signature(guide_cls).parameters:
        kwargs.setdefault("create_plates", model.create_plates)  # local latents subsample
    guide = guide_cls(model, **kwargs)
    dtype = getattr(torch, payload["x_dtype"].removeprefix("torch."))
    x_dummy = torch.zeros(payload["x_shape"], dtype=dtype)
    y_shape = payload["y_shape"]
    y_dummy = None if y_shape is None else torch.zeros(y_shape, dtype=dtype)
    with isolated_param_store(model, guide), torch.no_grad():
        guide(x_dummy, y_dummy, **payload.get("model_kwargs", {}))  # creates the guide's parameters with their saved shapes
    guide.load_state_dict(payload["guide_state"])
    return model, guide
