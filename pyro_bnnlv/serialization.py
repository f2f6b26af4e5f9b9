"""Save a fitted model + guide to one file and rebuild them exactly, safely.

The file (``torch.save``) holds only plain data and tensors: state dicts plus what is needed to
rebuild the objects: the model's class name and ``config()``, the guide's class name and
constructor keyword arguments, and the shapes and dtype of the training data (the guide's
parameters can depend on the number of data points, e.g. per-datapoint latents). No global
parameter-store names are involved, so several fits can be loaded side by side.

Security. :func:`load_fit` reads with ``torch.load(weights_only=True)``, whose unpickler builds
nothing but tensors and plain containers, so a crafted file (a pickled ``__reduce__`` payload,
say) is refused before any of its code runs. The class names in the file are looked up in an
allow-list of the library's own models and guides (and Pyro's autoguides) and never imported:
a file that names anything else (``"os:system"``) is refused. :func:`register_class` adds a
class of your own to the allow-list, from your code (a file cannot do it).
"""

from __future__ import annotations

import inspect
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from pyro import poutine
from pyro.infer.autoguide import (
    AutoDelta,
    AutoDiagonalNormal,
    AutoLowRankMultivariateNormal,
    AutoMultivariateNormal,
    AutoNormal,
)

from .guides import HypernetGuide, LaplaceGuide, MeanField
from .guides.hypernet import HypernetLVGuide
from .infer.svi import isolated_param_store
from .models import BNN, BNNLV, OverparametrisedLinear, ProjectedBNN

__all__ = ["save_fit", "load_fit", "register_class"]

_FORMAT = 2
_READABLE_FORMATS = (1, 2)  # format 1: no y_shape when saved without y, no guide config


def _qualname(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


_MODELS: dict[str, type] = {_qualname(c): c for c in (BNN, BNNLV, ProjectedBNN, OverparametrisedLinear)}
_GUIDES: dict[str, type] = {
    _qualname(c): c
    for c in (AutoNormal, MeanField, AutoMultivariateNormal, AutoDiagonalNormal, AutoLowRankMultivariateNormal,
              AutoDelta, HypernetGuide, HypernetLVGuide, LaplaceGuide)
}  # fmt: skip


def register_class(cls: type, kind: str) -> None:
    """Allow :func:`load_fit` to rebuild ``cls`` (``kind`` ``"model"`` or ``"guide"``).

    A model class needs ``config()`` and ``from_config(config)`` (or a constructor taking
    ``**config``); a guide class is rebuilt as ``cls(model, **guide_kwargs)`` and then set up by
    one call with data of the saved shapes.
    """
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a class, got {cls!r}")
    if kind not in ("model", "guide"):
        raise ValueError(f"kind must be 'model' or 'guide', got {kind!r}")
    (_MODELS if kind == "model" else _GUIDES)[_qualname(cls)] = cls


def _lookup(table: dict[str, type], name: Any, what: str, path: Path) -> type:
    if not isinstance(name, str) or name not in table:
        raise ValueError(
            f"{path} names the {what} class {name!r}, which is not one load_fit rebuilds "
            f"({', '.join(sorted(n.rpartition(':')[2] for n in table))}); it was not imported. "
            f"For a class of your own call pyro_bnnlv.serialization.register_class(cls, {what!r}) first"
        )
    return table[name]


def _check_plain(value: Any, name: str) -> None:
    """Only data ``torch.load(weights_only=True)`` can read back: numbers, strings, None, tensors,
    and lists / tuples / dicts of them."""
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{name}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{name} has a non-string key {k!r}; save_fit stores string keys only")
            _check_plain(v, f"{name}[{k!r}]")
        return
    kind = f"function ({type(value).__name__})" if callable(value) else type(value).__name__
    hint = " (initialisation functions need not be saved: the saved state overrides them)" if callable(value) else ""
    raise TypeError(f"{name} is a {kind}; a fit file holds only numbers, strings, tensors and "
                    f"lists/dicts of them, so drop it{hint}")  # fmt: skip


def _y_shape(model: torch.nn.Module, x: torch.Tensor, model_kwargs: dict[str, Any]) -> tuple[int, ...]:
    """The shape of ``y`` the model expects for ``x``: that of its ``"obs"`` site sampled with
    ``y=None`` (needed to set the guide up with ``"obs"`` observed, as it was trained)."""
    with isolated_param_store(model), torch.no_grad(), torch.random.fork_rng(devices=[]):
        trace = poutine.trace(model).get_trace(x, None, **model_kwargs)
    if "obs" not in trace.nodes:
        raise ValueError(f"{type(model).__name__} has no 'obs' site, so the shape of y cannot be inferred: "
                         "pass y to save_fit")  # fmt: skip
    return tuple(trace.nodes["obs"]["value"].shape)


def _guide_kwargs(guide: torch.nn.Module, guide_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The guide's own ``config()`` (architecture: e.g. a hypernet's sizes) updated by ``guide_kwargs``."""
    if isinstance(guide, LaplaceGuide):
        kwargs = {"site": guide.site}  # its tensors are in its state dict
    else:
        kwargs = dict(guide.config()) if hasattr(guide, "config") else {}
    kwargs.update(guide_kwargs or {})
    _check_plain(kwargs, "guide_kwargs")
    return kwargs


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

    Every guide the library ships can be saved: ``AutoNormal`` / :class:`~pyro_bnnlv.MeanField`
    (also from :func:`~pyro_bnnlv.ncai_guide`), ``AutoMultivariateNormal``, ``AutoDelta``,
    :class:`~pyro_bnnlv.HypernetGuide`, :func:`~pyro_bnnlv.guides.hypernet_lv_guide` and
    :class:`~pyro_bnnlv.LaplaceGuide` (``LinearizedLaplace.as_guide()``). ``y`` may be omitted:
    its shape is then read from the model. ``guide_kwargs``: constructor arguments of the guide
    besides the model that change its parameters' shapes (e.g. ``{"rank": 5}`` for
    ``AutoLowRankMultivariateNormal``; a hypernet's sizes are recorded automatically);
    initialisation functions need not be saved, the state dict overrides what they produce.
    ``model_kwargs``: keyword arguments the model needs besides ``x, y`` (e.g. ``{"task": task}``
    for a multi-task :class:`~pyro_bnnlv.ProjectedBNN`); they are saved and passed to the model
    when :func:`load_fit` re-creates the guide's parameters. Anything that could not be read back
    raises here, before the file is written.
    """
    model_name, guide_name = _qualname(type(model)), _qualname(type(guide))
    if model_name not in _MODELS:
        raise TypeError(f"model {type(model).__name__} is not a class load_fit rebuilds; register it with "
                        "pyro_bnnlv.serialization.register_class(cls, 'model') first")  # fmt: skip
    if guide_name not in _GUIDES:
        raise TypeError(f"guide {type(guide).__name__} is not a class load_fit rebuilds; register it with "
                        "pyro_bnnlv.serialization.register_class(cls, 'guide') first")  # fmt: skip
    model_kwargs = dict(model_kwargs or {})
    _check_plain(model_kwargs, "model_kwargs")
    if hasattr(model, "check_data"):
        model.check_data(x, y, **model_kwargs)  # catches a missing task= before writing the file
    config = model.config()
    _check_plain(config, "model.config()")
    payload = {
        "format": _FORMAT,
        "model_class": model_name,
        "model_config": config,
        "model_state": model.state_dict(),
        "guide_class": guide_name,
        "guide_kwargs": _guide_kwargs(guide, guide_kwargs),
        "guide_state": guide.state_dict(),
        "x_shape": tuple(x.shape),
        "y_shape": _y_shape(model, x, model_kwargs) if y is None else tuple(y.shape),
        "x_dtype": str(x.dtype),
        "model_kwargs": {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in model_kwargs.items()},
    }
    torch.save(payload, Path(path))


def _describe(obj: Any) -> str:
    """What a loaded object that is not a fit file looks like."""
    if torch.is_tensor(obj):
        return f"a single tensor of shape {tuple(obj.shape)} and dtype {obj.dtype}"
    if isinstance(obj, dict):
        keys = list(obj)
        shown = ", ".join(map(repr, keys[:5])) + (", ..." if len(keys) > 5 else "")
        if keys and all(torch.is_tensor(v) for v in obj.values()):
            return (f"a state dict of {len(keys)} tensors (keys {shown}); load it with "
                    "module.load_state_dict(torch.load(path, weights_only=True))")  # fmt: skip
        return f"a dict with keys {shown}"
    return f"a {type(obj).__name__}"


def _head(path: Path, n: int = 16) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _read(path: Path) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` with errors that say what the file is."""
    if path.is_file() and path.stat().st_size == 0:
        raise ValueError(f"{path} is empty (0 bytes): not a fit written by save_fit (an interrupted save?)")
    try:
        payload = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        if found:
            raise ValueError(
                f"{path} is not a pyro_bnnlv fit: it refers to the Python object {found.group(1)}, which "
                "save_fit never writes; it was refused without running it (torch.load weights_only=True)"
            ) from None
        raise ValueError(f"{path} is not a pyro_bnnlv fit: torch.load cannot read it ({e})") from None
    except OSError:  # missing file, permissions: not about the content
        raise
    except Exception as e:  # not a torch file, truncated, ...: torch raises many types
        what = "" if zipfile.is_zipfile(path) else f"; it is not a zip archive as torch.save writes (starts with {_head(path)!r})"
        raise ValueError(f"{path} is not a pyro_bnnlv fit: torch.load cannot read it "
                         f"({type(e).__name__}: {e}){what}") from None  # fmt: skip
    if not isinstance(payload, dict) or "format" not in payload or "model_class" not in payload:
        raise ValueError(f"{path} is not a pyro_bnnlv fit (save_fit writes a dict with 'format', "
                         f"'model_class', ...): it holds {_describe(payload)}")  # fmt: skip
    if payload["format"] not in _READABLE_FORMATS:
        raise ValueError(f"{path}: unsupported fit file format {payload['format']!r} "
                         f"(this version reads {_READABLE_FORMATS})")  # fmt: skip
    return payload


def _build_model(cls: type, config: dict[str, Any], state: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = cls.from_config(config) if hasattr(cls, "from_config") else cls(**config)
    dtypes = {v.dtype for v in state.values() if torch.is_tensor(v) and v.is_floating_point()}
    if len(dtypes) == 1:  # load_state_dict copies into the existing tensors: keep a float64 model float64
        model.to(dtypes.pop())
    model.load_state_dict(state)
    return model


def _build_guide(cls: type, model: torch.nn.Module, payload: dict[str, Any]) -> torch.nn.Module:
    kwargs = dict(payload["guide_kwargs"])
    state = payload["guide_state"]
    if cls is LaplaceGuide:  # its tensors are its constructor's arguments
        tensors = {k: state.get(k) for k in ("scale_tril", "scale", "indices")}
        guide = LaplaceGuide(state["loc"], **tensors, **kwargs)
        guide.load_state_dict(state)
        return guide
    if hasattr(model, "create_plates") and "create_plates" in inspect.signature(cls).parameters:
        kwargs.setdefault("create_plates", model.create_plates)  # local latents subsample
    guide = cls(model, **kwargs)
    dtype = getattr(torch, str(payload["x_dtype"]).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"the file's x_dtype {payload['x_dtype']!r} is not a floating-point torch dtype")
    x_dummy = torch.zeros(payload["x_shape"], dtype=dtype)
    y_shape = payload["y_shape"]
    if y_shape is None:  # format 1, saved without y
        y_shape = _y_shape(model, x_dummy, payload.get("model_kwargs", {}))
    y_dummy = torch.zeros(y_shape, dtype=dtype)
    # creates the guide's parameters with their saved shapes; the set-up's random draws do not
    # move the caller's random stream
    with isolated_param_store(model, guide), torch.no_grad(), torch.random.fork_rng(devices=[]):
        guide(x_dummy, y_dummy, **payload.get("model_kwargs", {}))
    guide.load_state_dict(state)
    return guide


def load_fit(path: str | Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Rebuild ``(model, guide)`` saved by :func:`save_fit`.

    Reads with ``torch.load(weights_only=True)`` and rebuilds only allow-listed classes (module
    docstring); any other file raises a ``ValueError`` that says what the file holds.
    """
    path = Path(path)
    payload = _read(path)
    model_cls = _lookup(_MODELS, payload["model_class"], "model", path)
    guide_cls = _lookup(_GUIDES, payload.get("guide_class"), "guide", path)
    model = _build_model(model_cls, payload["model_config"], payload["model_state"])
    return model, _build_guide(guide_cls, model, payload)

