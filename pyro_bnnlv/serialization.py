"""Save a fitted model + guide to one file and rebuild them exactly, safely.

The file (``torch.save``) holds only plain data and tensors: state dicts plus what is needed to
rebuild the objects: the model's registered class name (``"BNN"``; :func:`register_class`) and
``config()``, the guide's registered class name and constructor keyword arguments, and the shapes and dtype of the training data (the guide's
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

import contextlib
import inspect
import math
import os
import pickle
import re
import secrets
import zipfile
from pathlib import Path
from collections.abc import Callable, Iterator
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
from .protocols import ChecksData
from .models import BNN, BNNLV, OverparametrisedLinear, ProjectedBNN
from .nets import MLP

__all__ = ["load_fit", "register_class", "save_fit"]

_FORMAT = 3
# format 1: no y_shape when saved without y, no guide config; formats 1-2 name classes
# "module:Qualname"; format 3 by their registered name
_READABLE_FORMATS = (1, 2, 3)

# registered name -> class; a file names a class by its registered name, so moving a class to
# another module does not break the files written before
_MODELS: dict[str, type] = {c.__name__: c for c in (BNN, BNNLV, ProjectedBNN, OverparametrisedLinear)}
_GUIDES: dict[str, type] = {
    c.__name__: c
    for c in (
        AutoNormal,
        MeanField,
        AutoMultivariateNormal,
        AutoDiagonalNormal,
        AutoLowRankMultivariateNormal,
        AutoDelta,
        HypernetGuide,
        HypernetLVGuide,
        LaplaceGuide,
    )
}


def register_class(cls: type, kind: str, name: str | None = None) -> None:
    """Allow :func:`load_fit` to rebuild ``cls`` (``kind`` ``"model"`` or ``"guide"``).

    Files name the class by ``name`` (default ``cls.__name__``), not by its module, so the class
    may move between modules without breaking saved fits; register it under the same name
    before loading. A name already taken by another class is refused: pass another ``name``.

    A model class needs ``config()`` and ``from_config(config)`` (or a constructor taking
    ``**config``); a guide class is rebuilt as ``cls(model, **guide_kwargs)`` and then set up by
    one call with data of the saved shapes.
    """
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a class, got {cls!r}")
    if kind not in ("model", "guide"):
        raise ValueError(f"kind must be 'model' or 'guide', got {kind!r}")
    name = cls.__name__ if name is None else name
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be a Python identifier such as {cls.__name__!r}, got {name!r}")
    table = _MODELS if kind == "model" else _GUIDES
    taken = table.get(name, cls)
    if taken is not cls:
        raise ValueError(
            f"the {kind} name {name!r} is already registered for {taken.__module__}."
            f"{taken.__qualname__}; register {cls.__qualname__} under another name: "
            f"register_class(cls, {kind!r}, name='My{name}')"
        )
    table[name] = cls


def _registered_name(cls: type, table: dict[str, type]) -> str | None:
    return next((name for name, c in table.items() if c is cls), None)


def _lookup(table: dict[str, type], name: Any, what: str, path: Path, fmt: Any) -> type:
    """The class a file names: its registered name (format 3), or the last component of the
    ``"module:Qualname"`` formats 1-2 wrote (classes that moved since still load; nothing is
    imported, so ``"os:system"`` names no registered class and is refused)."""
    key = name
    if isinstance(name, str) and fmt in (1, 2):
        key = name.rpartition(":")[2].rpartition(".")[2]
    if not isinstance(key, str) or key not in table:
        raise ValueError(
            f"{path} names the {what} class {name!r}, which is not one load_fit rebuilds "
            f"({', '.join(sorted(table))}); it was not imported. "
            f"For a class of your own call pyro_bnnlv.serialization.register_class(cls, {what!r}) first"
        )
    return table[key]


def _leaves(value: Any, name: str, bad_key: Callable[[str, Any], Exception]) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of every leaf of nested lists, tuples and dicts (``name[0]``,
    ``name['key']``); a dict key that is not a string raises ``bad_key(name, key)``."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise bad_key(name, k)
            yield from _leaves(v, f"{name}[{k!r}]", bad_key)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{name}[{i}]", bad_key)
    else:
        yield name, value


def _check_plain(value: Any, name: str) -> None:
    """Only data ``torch.load(weights_only=True)`` can read back: numbers, strings, None, tensors,
    and lists / tuples / dicts of them."""
    for at, v in _leaves(
        value, name, lambda at, k: TypeError(f"{at} has a non-string key {k!r}; save_fit stores string keys only")
    ):
        if v is None or isinstance(v, (bool, int, float, str, torch.Tensor)):
            continue
        kind = f"function ({type(v).__name__})" if callable(v) else type(v).__name__
        hint = " (initialisation functions need not be saved: the saved state overrides them)" if callable(v) else ""
        raise TypeError(
            f"{at} is a {kind}; a fit file holds only numbers, strings, tensors and lists/dicts of them, so drop it{hint}"
        )


def _y_shape(model: torch.nn.Module, x: torch.Tensor, model_kwargs: dict[str, Any]) -> tuple[int, ...]:
    """The shape of ``y`` the model expects for ``x``: that of its ``"obs"`` site sampled with
    ``y=None`` (needed to set the guide up with ``"obs"`` observed, as it was trained)."""
    with isolated_param_store(model), torch.no_grad(), torch.random.fork_rng(devices=[]):
        trace = poutine.trace(model).get_trace(x, None, **model_kwargs)
    if "obs" not in trace.nodes:
        raise ValueError(
            f"{type(model).__name__} has no 'obs' site, so the shape of y cannot be inferred: pass y to save_fit"
        )
    return tuple(trace.nodes["obs"]["value"].shape)


def _guide_kwargs(guide: torch.nn.Module, guide_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The guide's own ``config()`` (architecture: e.g. a hypernet's sizes) updated by ``guide_kwargs``."""
    if isinstance(guide, LaplaceGuide):
        kwargs = {"site": guide.site}  # its tensors are in its state dict
    else:
        kwargs = dict(guide.config()) if hasattr(guide, "config") else {}
    if isinstance(guide, AutoLowRankMultivariateNormal) and guide.rank is not None:
        kwargs["rank"] = int(guide.rank)  # the shape of cov_factor; the default depends on P
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
    besides the model that change its parameters' shapes (a hypernet's sizes and an
    ``AutoLowRankMultivariateNormal``'s ``rank`` are recorded automatically);
    initialisation functions need not be saved, the state dict overrides what they produce.
    ``model_kwargs``: keyword arguments the model needs besides ``x, y`` (e.g. ``{"task": task}``
    for a multi-task :class:`~pyro_bnnlv.ProjectedBNN`); they are saved and passed to the model
    when :func:`load_fit` re-creates the guide's parameters. Anything that could not be read back
    raises here, before the file is written: the model and guide are rebuilt in memory from what
    would be written (as :func:`load_fit` does) and the guide is run against the model once, so a
    guide that never ran, a guide of another model or data in another dtype than the model's are
    refused with a ``ValueError`` naming the problem.
    """
    path = _check_save_path(path)
    model_name, guide_name = _registered_name(type(model), _MODELS), _registered_name(type(guide), _GUIDES)
    for kind, obj, registered in (("model", model, model_name), ("guide", guide, guide_name)):
        if registered is None:
            raise TypeError(
                f"{kind} {type(obj).__name__} is not a class load_fit rebuilds; register it with "
                f"pyro_bnnlv.serialization.register_class(cls, {kind!r}) first"
            )
    model_kwargs = dict(model_kwargs or {})
    _check_plain(model_kwargs, "model_kwargs")
    if isinstance(model, ChecksData):
        model.check_data(x, y, **model_kwargs)  # catches a missing task= before writing the file
    if callable(getattr(model, "_check_dtype", None)):
        model._check_dtype(x)  # load_fit sets the guide up with data of x's dtype
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
    _check_readable(payload, model, guide)
    _write_atomically(payload, path)


def _write_atomically(payload: dict[str, Any], path: Path) -> None:
    """``torch.save(payload, path)`` all or nothing: the bytes go to a temporary file in the same
    directory, which is flushed, ``fsync``-ed and then renamed over ``path`` (``os.replace`` is
    atomic on one file system). A write that fails part-way (disk full, a file-size limit)
    removes the temporary file and leaves whatever was at ``path`` as it was."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        # os.open with mode 0o666 applies the umask, as torch.save(path) would (mkstemp gives 0o600)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:  # torch reports a failed write as a RuntimeError
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(err, OSError) and err.strerror:
            cause = err.strerror
        else:
            cause = "the write stopped part-way (a full disk or a file-size limit?)"
        message = (
            f"save_fit could not write {str(path)!r}: {cause}. "
            f"Nothing was changed at that path (the fit is written to a temporary file first and "
            f"renamed into place only when complete); free disk space, raise the file-size limit "
            f"(ulimit -f) or pick another directory, and call save_fit again"
        )
        raise (OSError(err.errno, message) if isinstance(err, OSError) and err.errno else OSError(message)) from err
    with contextlib.suppress(OSError):  # make the rename itself durable (not possible everywhere)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _check_save_path(path: Any) -> Path:
    """``path`` as a ``Path`` to a file that can be written: not a directory, in one that exists."""
    if not isinstance(path, (str, Path)) and not hasattr(path, "__fspath__"):
        raise TypeError(f"path must be a file path (str or pathlib.Path), got {type(path).__name__}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"path {str(path)!r} is a directory: pass a file path such as {str(path / 'fit.pt')!r}")
    if not path.parent.is_dir():
        raise FileNotFoundError(
            f"path {str(path)!r}: the directory {str(path.parent)!r} does not exist; "
            "create it first (e.g. Path(path).parent.mkdir(parents=True))"
        )
    return path


class _StateMismatch(Exception):
    """A saved state dict that does not fit the module rebuilt from the saved configuration."""

    def __init__(self, what: str, target: str, err: RuntimeError) -> None:
        lines = [ln.strip() for ln in str(err).splitlines()[1:] if ln.strip()] or [str(err)]
        detail = "; ".join(lines)
        self.what, self.target = what, target
        self.detail = detail if len(detail) <= 400 else detail[:400] + " ..."
        self.missing_only = (
            "Missing key(s)" in str(err) and "size mismatch" not in str(err) and "Unexpected" not in str(err)
        )
        super().__init__(f"{what}: {self.detail}")


def _load_state(module: torch.nn.Module, state: Any, what: str) -> None:
    _check_state_dtypes(module, state, what)
    try:
        module.load_state_dict(state)
    except RuntimeError as err:
        raise _StateMismatch(what, type(module).__name__, err) from None


def _check_readable(payload: dict[str, Any], model: torch.nn.Module, guide: torch.nn.Module) -> None:
    """Rebuild the model and guide from ``payload`` in memory, as :func:`load_fit` will, and run
    the rebuilt guide against the rebuilt model once; a ``ValueError`` that names the problem
    instead of a file ``load_fit`` cannot read."""
    model_cls, guide_cls = _MODELS[payload["model_class"]], _GUIDES[payload["guide_class"]]
    model_name, guide_name = type(model).__name__, type(guide).__name__
    has_state = bool(guide.state_dict())
    with torch.random.fork_rng(devices=[]):
        try:
            model2 = _build_model(model_cls, payload["model_config"], payload["model_state"])
            guide2 = _build_guide(guide_cls, model2, payload)
        except _StateMismatch as err:
            if err.what == "guide_state" and (not has_state or err.missing_only):
                raise ValueError(
                    f"save_fit: the {guide_name} has no parameters yet (it never ran), so there is no fit "
                    f"to save: fit it first (pb.fit_svi(model, guide, x, y, ...)), or call it once, "
                    f"guide(x, y), to save its initial state ({err.detail})"
                ) from None
            if err.what == "guide_state":
                raise ValueError(
                    f"save_fit: the {guide_name}'s parameters do not match a {guide_name} built for this "
                    f"{model_name} and data of x's shape {tuple(payload['x_shape'])}: was the guide built "
                    f"for another model (or with constructor arguments save_fit does not record: pass "
                    f"them as guide_kwargs)? {err.detail}"
                ) from None
            raise ValueError(
                f"save_fit: the {model_name}'s state does not match the model its config() rebuilds: {err.detail}"
            ) from None
        except (ValueError, TypeError, RuntimeError, KeyError) as err:
            raise ValueError(
                f"save_fit: the fit could not be read back (load_fit would fail rebuilding the "
                f"{guide_name} for this {model_name}): {type(err).__name__}: {err}"
            ) from None
        _check_guide_fits_model(guide2, model2, payload, guide_name, model_name)


def _check_guide_fits_model(
    guide: torch.nn.Module,
    model: torch.nn.Module,
    payload: dict[str, Any],
    guide_name: str,
    model_name: str,
    prefix: str = "save_fit",
) -> None:
    """Run the rebuilt guide and replay the rebuilt model against it on data of the saved shapes
    (a guide whose draws the model cannot take, e.g. a LaplaceGuide of another network, fails here)."""
    x, y = _dummy_data(model, payload)
    kwargs = payload.get("model_kwargs", {})
    try:
        with isolated_param_store(model, guide), torch.no_grad():
            guide_trace = poutine.trace(guide).get_trace(x, y, **kwargs)
            poutine.replay(model, trace=guide_trace)(x, y, **kwargs)
    except (ValueError, RuntimeError) as err:
        raise ValueError(
            f"{prefix}: the {guide_name} does not fit this {model_name} (was it built for "
            f"another model?): {type(err).__name__}: {err}"
        ) from None


def _describe(obj: Any) -> str:
    """What a loaded object that is not a fit file looks like."""
    if torch.is_tensor(obj):
        return f"a single tensor of shape {tuple(obj.shape)} and dtype {obj.dtype}"
    if isinstance(obj, dict):
        keys = list(obj)
        shown = ", ".join(map(repr, keys[:5])) + (", ..." if len(keys) > 5 else "")
        if keys and all(torch.is_tensor(v) for v in obj.values()):
            return (
                f"a state dict of {len(keys)} tensors (keys {shown}); load it with "
                "module.load_state_dict(torch.load(path, weights_only=True))"
            )
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
        what = (
            ""
            if zipfile.is_zipfile(path)
            else f"; it is not a zip archive as torch.save writes (starts with {_head(path)!r})"
        )
        raise ValueError(
            f"{path} is not a pyro_bnnlv fit: torch.load cannot read it ({type(e).__name__}: {e}){what}"
        ) from None
    if not isinstance(payload, dict) or "format" not in payload or "model_class" not in payload:
        raise ValueError(
            f"{path} is not a pyro_bnnlv fit (save_fit writes a dict with 'format', "
            f"'model_class', ...): it holds {_describe(payload)}"
        )
    if payload["format"] not in _READABLE_FORMATS:
        raise ValueError(
            f"{path}: unsupported fit file format {payload['format']!r} (this version reads {_READABLE_FORMATS})"
        )
    required = ("model_config", "model_state", "guide_class", "guide_state", "x_shape", "x_dtype")
    if payload["format"] >= 2:
        required += ("guide_kwargs", "y_shape")
    missing = [k for k in required if k not in payload]
    if missing:
        raise ValueError(
            f"{path} is damaged or incomplete: it lacks {missing}, which every fit "
            f"written by save_fit holds; write it again with save_fit"
        )
    return payload


#: the most values ``x`` or ``y`` of a saved fit may hold: load_fit allocates data of the saved
#: shapes to set the guide up, so a tampered shape must not ask for terabytes (2**28 float32
#: values are 1 GiB; the data sets a fit trains on in memory are far smaller)
_MAX_DATA_VALUES = 2**28
#: state entries (last component of the key) that are scales: positive wherever they appear
_POSITIVE_STATE = ("noise_scale", "prior_scale", "latent_scale", "phi_scale", "scale")


class _Damaged(ValueError):
    """A field of a fit file that save_fit never writes."""

    def __init__(self, path: Path, field: str, problem: str) -> None:
        super().__init__(
            f"{path} is damaged or was not written by save_fit: {field} {problem}; write the fit again with save_fit"
        )


def _validate(payload: dict[str, Any], path: Path, guide_cls: type) -> None:
    """Every field load_fit reads, checked before anything is built (issue 39, item 7): the
    types; data shapes of positive sizes that fit in memory; a floating ``x_dtype``; finite
    state tensors of float32 / float64 (scales positive, Cholesky factors with a positive
    diagonal); guide options the guide class takes; and sizes in the configuration no larger
    than the file's own parameters (the network ``model_config['net']`` describes has exactly as
    many weights as ``model_state['prior_loc']``). A size that does not match therefore never
    reaches the allocator."""
    for key in ("model_config", "model_state", "guide_state", "guide_kwargs", "model_kwargs"):
        value = payload.get(key)
        if key in payload and not isinstance(value, dict) and not (key == "guide_kwargs" and value is None):
            raise _Damaged(path, repr(key), f"is a {type(value).__name__}, not a dict")
    for key in ("model_config", "guide_kwargs", "model_kwargs"):
        _check_file_plain(payload.get(key) or {}, key, path)
    _check_file_dtype(payload["x_dtype"], path)
    total = sum(_check_state(payload[key], key, path) for key in ("model_state", "guide_state"))
    x_shape = _check_file_shape(payload["x_shape"], "x_shape", path)
    y_shape = payload.get("y_shape")
    if y_shape is not None:
        y_shape = _check_file_shape(y_shape, "y_shape", path)
        if y_shape[0] != x_shape[0]:
            raise _Damaged(path, "y_shape", f"{y_shape} has another number of rows than x_shape {x_shape}")
    _check_sizes(payload["model_config"], "model_config", total, path)
    _check_sizes(payload.get("guide_kwargs") or {}, "guide_kwargs", total, path)
    _check_network(payload, path, total, guide_cls)
    _check_guide_options(payload.get("guide_kwargs") or {}, guide_cls, path)


def _check_file_plain(value: Any, name: str, path: Path) -> None:
    """Plain data (as :func:`_check_plain`) with finite numbers, positive where the name is a scale."""
    for at, v in _leaves(value, name, lambda at, k: _Damaged(path, at, f"has a non-string key {k!r}")):
        if v is None or isinstance(v, (bool, str)):
            continue
        if isinstance(v, (int, float)):
            if not math.isfinite(v):
                raise _Damaged(path, at, f"is {v!r}, not a finite number")
            if _is_scale(at) and not v > 0:
                raise _Damaged(path, at, f"is {v!r}: a scale must be positive")
        elif not torch.is_tensor(v) or not at.startswith("model_kwargs"):
            raise _Damaged(
                path, at, f"is a {type(v).__name__}; save_fit writes numbers, strings and lists/dicts of them"
            )
        elif v.is_floating_point() and not torch.isfinite(v).all():
            raise _Damaged(path, at, "contains NaN or infinite values")


def _is_scale(name: str) -> bool:
    last = re.sub(r"\[\d+\]$", "", name).rpartition("[")[2].strip("'\"]").rpartition(".")[2]
    return last in _POSITIVE_STATE or last == "init_scale"


def _check_file_dtype(name: Any, path: Path) -> torch.dtype:
    dtype = getattr(torch, str(name).removeprefix("torch."), None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype) or dtype not in (torch.float32, torch.float64):
        raise _Damaged(
            path, "x_dtype", f"{name!r} is not a floating-point torch dtype (torch.float32 or torch.float64)"
        )
    return dtype


def _check_file_shape(shape: Any, name: str, path: Path) -> tuple[int, ...]:
    if (
        not isinstance(shape, (list, tuple))
        or not 1 <= len(shape) <= 2
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape)
    ):
        raise _Damaged(path, name, f"is {shape!r}, not the shape (N, D) or (N,) of the data")
    if any(n < 1 for n in shape):
        raise _Damaged(path, name, f"{tuple(shape)} has a size below 1")
    if math.prod(shape) > _MAX_DATA_VALUES:
        raise _Damaged(
            path,
            name,
            f"{tuple(shape)} describes {math.prod(shape):.3g} values, more than a fit is "
            f"trained on in memory (load_fit allows {_MAX_DATA_VALUES})",
        )
    return tuple(shape)


def _check_state(state: dict[str, Any], name: str, path: Path) -> int:
    """Tensors only, float32 / float64 (integer index tensors allowed), finite, scales positive,
    Cholesky factors with a positive diagonal; returns the number of values."""
    total = 0
    for key, t in state.items():
        field = f"{name}[{key!r}]"
        if not isinstance(key, str) or not torch.is_tensor(t):
            raise _Damaged(path, field, f"is a {type(t).__name__}, not a tensor")
        if t.is_floating_point():
            if t.dtype not in (torch.float32, torch.float64):
                raise _Damaged(path, field, f"has dtype {t.dtype}; save_fit writes float32 or float64")
            if not torch.isfinite(t).all():
                raise _Damaged(path, field, "contains NaN or infinite values")
            last = key.rpartition(".")[2]
            if last in _POSITIVE_STATE and not (t > 0).all():
                raise _Damaged(path, field, f"has a value <= 0 ({t.min().item():.3g}): a scale must be positive")
            if last == "scale_tril" and (t.dim() != 2 or not (t.diagonal() > 0).all()):
                raise _Damaged(path, field, "is not a Cholesky factor (a square matrix with a positive diagonal)")
        elif t.dtype in (torch.bool, torch.complex64, torch.complex128) or key.rpartition(".")[2] != "indices":
            raise _Damaged(path, field, f"has dtype {t.dtype}; save_fit writes float32 or float64 here")
        total += t.numel()
    return total


def _check_sizes(value: Any, name: str, total: int, path: Path) -> None:
    """Sizes in a configuration are bounded by the file's own parameters: no integer, and no
    layer chain's weight count (sum of products of neighbouring widths), exceeds ``total``."""
    if isinstance(value, dict):
        hidden = value.get("hidden_sizes")  # a hypernet's layers start at noise_dim
        chain = [value["noise_dim"], *hidden] if "noise_dim" in value and isinstance(hidden, (list, tuple)) else None
        for k, v in value.items():
            _check_sizes(v, f"{name}[{k!r}]", total, path)
        if chain is not None:
            _check_sizes(chain, f"{name}['noise_dim', 'hidden_sizes']", total, path)
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_sizes(v, f"{name}[{i}]", total, path)
        ints = [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
        if len(ints) == len(value) and sum(a * b for a, b in zip(ints, ints[1:])) > total:
            raise _Damaged(
                path, name, f"{list(value)} describes layers of more weights than the file's {total} parameter values"
            )
        return
    if isinstance(value, int) and not isinstance(value, bool) and value > total:
        raise _Damaged(path, name, f"is {value}, larger than the file's {total} parameter values: no fit has that size")


def _check_network(payload: dict[str, Any], path: Path, total: int, guide_cls: type) -> None:
    """The network ``model_config['net']`` describes (an :class:`~pyro_bnnlv.nets.MLP`, whose
    construction is arithmetic only) has as many weights as ``model_state['prior_loc']`` (and a
    Laplace guide's ``loc`` over ``w``)."""
    net = payload["model_config"].get("net")
    if not isinstance(net, dict):
        return
    try:
        mlp = MLP(**net)
    except (TypeError, ValueError) as err:
        raise _Damaged(path, "model_config['net']", f"does not describe a network: {err}") from None
    prior_loc = payload["model_state"].get("prior_loc")
    if torch.is_tensor(prior_loc) and tuple(prior_loc.shape) != (mlp.num_weights,):
        raise ValueError(
            f"{path} is inconsistent (damaged or edited): its model_state does not match the "
            f"{payload['model_class']} its model_config rebuilds: model_config['net'] describes a network "
            f"of {mlp.num_weights} weights but model_state['prior_loc'] has shape {tuple(prior_loc.shape)}; "
            f"write the fit again with save_fit"
        )
    loc, kwargs = payload["guide_state"].get("loc"), payload.get("guide_kwargs") or {}
    if (
        guide_cls is LaplaceGuide
        and kwargs.get("site", "w") == "w"
        and torch.is_tensor(loc)
        and tuple(loc.shape) != (mlp.num_weights,)
    ):
        raise _Damaged(
            path,
            "guide_state['loc']",
            f"has shape {tuple(loc.shape)} but the network of model_config['net'] has {mlp.num_weights} weights",
        )
    rank = kwargs.get("rank")
    if isinstance(rank, int) and rank * mlp.num_weights > total:
        raise _Damaged(
            path,
            "guide_kwargs['rank']",
            f"is {rank}: a ({mlp.num_weights}, {rank}) covariance factor holds more values than the file's {total}",
        )


def _guide_options(cls: type) -> set[str] | None:
    """The keyword options a guide class is rebuilt with (``None``: any)."""
    if cls is LaplaceGuide:
        return {"site"}  # its tensors come from the state dict
    if cls is HypernetLVGuide:
        cls = HypernetGuide  # forwards its options to the hypernet
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return {n for n, p in list(params.items())[1:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _check_guide_options(kwargs: dict[str, Any], cls: type, path: Path) -> None:
    options = _guide_options(cls)
    unknown = sorted(set(kwargs) - options) if options is not None else []
    if unknown:
        raise _Damaged(
            path,
            "guide_kwargs",
            f"has the option(s) {unknown}, which {cls.__name__} does not take (it takes {sorted(options)})",
        )


def _check_state_dtypes(module: torch.nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """``load_state_dict`` casts silently: a state entry of another dtype than the module's is refused."""
    own = module.state_dict()
    for key, t in state.items():
        if key in own and torch.is_tensor(t) and t.dtype != own[key].dtype:
            raise _StateMismatch(
                what,
                type(module).__name__,
                RuntimeError(
                    f"\n{what}[{key!r}] has dtype {t.dtype} but the rebuilt {type(module).__name__} holds {own[key].dtype}"
                ),
            )


def _build_model(cls: type, config: dict[str, Any], state: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = cls.from_config(config) if hasattr(cls, "from_config") else cls(**config)
    dtypes = {v.dtype for v in state.values() if torch.is_tensor(v) and v.is_floating_point()}
    if len(dtypes) == 1:  # load_state_dict copies into the existing tensors: keep a float64 model float64
        model.to(dtypes.pop())
    _load_state(model, state, "model_state")
    return model


def _build_guide(cls: type, model: torch.nn.Module, payload: dict[str, Any]) -> torch.nn.Module:
    kwargs = dict(payload.get("guide_kwargs") or {})
    state = payload["guide_state"]
    if cls is LaplaceGuide:  # its tensors are its constructor's arguments
        if not torch.is_tensor(state.get("loc")):
            raise _StateMismatch("guide_state", "LaplaceGuide", RuntimeError("\nit has no tensor 'loc'"))
        tensors = {k: state.get(k) for k in ("scale_tril", "scale", "indices")}
        guide = LaplaceGuide(state["loc"], **tensors, **kwargs)
        _load_state(guide, state, "guide_state")
        return guide
    if hasattr(model, "create_plates") and "create_plates" in inspect.signature(cls).parameters:
        kwargs.setdefault("create_plates", model.create_plates)  # local latents subsample
    guide = cls(model, **kwargs)
    x_dummy, y_dummy = _dummy_data(model, payload)
    # creates the guide's parameters with their saved shapes; the set-up's random draws do not
    # move the caller's random stream
    with isolated_param_store(model, guide), torch.no_grad(), torch.random.fork_rng(devices=[]):
        guide(x_dummy, y_dummy, **payload.get("model_kwargs", {}))
    _load_state(guide, state, "guide_state")
    return guide


def _dummy_data(model: torch.nn.Module, payload: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeros shaped and typed like the data the fit was saved with (labels of a classifier as integers)."""
    dtype = getattr(torch, str(payload["x_dtype"]).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"the file's x_dtype {payload['x_dtype']!r} is not a floating-point torch dtype")
    x_dummy = torch.zeros(payload["x_shape"], dtype=dtype)
    y_shape = payload.get("y_shape")
    if y_shape is None:  # format 1, saved without y
        y_shape = _y_shape(model, x_dummy, payload.get("model_kwargs", {}))
    likelihood = getattr(model, "likelihood", None)
    if getattr(likelihood, "classification", False):  # class labels: integers
        return x_dummy, torch.zeros(y_shape, dtype=torch.long)
    return x_dummy, torch.zeros(y_shape, dtype=dtype)


def load_fit(path: str | Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Rebuild ``(model, guide)`` saved by :func:`save_fit`.

    Reads with ``torch.load(weights_only=True)`` and rebuilds only allow-listed classes (module
    docstring); any other file raises a ``ValueError`` that says what the file holds.
    """
    path = Path(path)
    payload = _read(path)
    model_cls = _lookup(_MODELS, payload["model_class"], "model", path, payload["format"])
    guide_cls = _lookup(_GUIDES, payload.get("guide_class"), "guide", path, payload["format"])
    _validate(payload, path, guide_cls)
    try:
        model = _build_model(model_cls, payload["model_config"], payload["model_state"])
    except _StateMismatch as err:
        raise ValueError(
            f"{path} is inconsistent (damaged or edited): its model_state does not match the "
            f"{err.target} its model_config rebuilds: {err.detail}"
        ) from None
    except (TypeError, ValueError, KeyError) as err:
        raise ValueError(
            f"{path} is inconsistent (damaged or edited): its model_config does not rebuild a "
            f"{model_cls.__name__}: {type(err).__name__}: {err}"
        ) from None
    if callable(getattr(model, "check_data", None)):
        x, y = _dummy_data(model, payload)
        try:
            model.check_data(x, y, **payload.get("model_kwargs", {}))
        except (TypeError, ValueError) as err:
            raise _Damaged(
                path,
                "x_shape / y_shape",
                f"{tuple(x.shape)} / {tuple(y.shape)} do not fit the {model_cls.__name__}: {err}",
            ) from None
    try:
        guide = _build_guide(guide_cls, model, payload)
    except _StateMismatch as err:
        raise ValueError(
            f"{path} is inconsistent (damaged or edited): its guide_state does not match the "
            f"{err.target} rebuilt from its guide_class, guide_kwargs and x_shape: {err.detail}"
        ) from None
    except (TypeError, ValueError, KeyError, RuntimeError) as err:
        # a LaplaceGuide is built from its state's tensors, any other guide from its options
        field = "guide_state" if guide_cls is LaplaceGuide else f"guide_kwargs {payload.get('guide_kwargs')!r}"
        raise _Damaged(
            path,
            field,
            f"do not rebuild a {guide_cls.__name__} for this {model_cls.__name__}: {type(err).__name__}: {err}",
        ) from None
    with torch.random.fork_rng(devices=[]):
        _check_guide_fits_model(
            guide, model, payload, guide_cls.__name__, model_cls.__name__, f"{path} is inconsistent (damaged or edited)"
        )
    return model, guide
