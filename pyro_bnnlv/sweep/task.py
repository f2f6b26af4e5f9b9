"""A sweep's unit of work: :class:`Task`, its stable id, and the sweep's identity.

A task is a frozen key ``(dataset, split, method, grid point, restart, seed)``. Its id is the
first 16 hex digits of the SHA-256 of its canonical JSON (sorted keys, no spaces), so it is the
same in every process, on every machine and in every Python version, and it does not depend on
the order in which a grid was written (the grid point is stored as a sorted tuple of items).

A sweep's identity (:func:`sweep_identity`) is what a results store must agree on before it may
be resumed: the task function (its name and, for a ``functools.partial``, its bound arguments),
the user's ``sweep_meta`` and the sorted task ids. The code version (:func:`code_version`) is
checked separately so the error can say which of the two differs.

A task function's name in a store is the one given to :func:`task_function` (the library's
experiments register theirs, e.g. ``"ncai-compare/fit"``, so a store does not depend on the module
a function lives in) and ``module:qualname`` for any other function.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import json
import math
import pickle
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, Union

from .._checks import check_int

__all__ = [
    "KEY_FIELDS",
    "Task",
    "canonical_json",
    "code_version",
    "describe_fn",
    "digest",
    "sweep_identity",
    "task_function",
]

Scalar = Union[str, int, float, bool, None]
#: the columns a task contributes to a results table, in order (grid items follow ``method``)
KEY_FIELDS = ("dataset", "split", "method", "restart", "seed")


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys, no whitespace and no NaN/infinity (``ValueError`` on those)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def digest(obj: Any, length: int = 16) -> str:
    """The first ``length`` hex digits of the SHA-256 of :func:`canonical_json` of ``obj``."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:length]


def _check_scalar(value: Any, name: str) -> Scalar:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"grid value {name}={value!r} must be finite (it is part of the task id)")
        return value
    raise TypeError(
        f"grid value {name}={value!r} has type {type(value).__name__}; grid values must be str, int, "
        "float, bool or None (convert numpy scalars with float() or int())"
    )


@dataclass(frozen=True)
class Task:
    """The key of one fit: ``Task("boston", split=3, method="MFVI", grid={"lr": 0.01}, seed=3)``.

    ``grid`` takes a mapping or an iterable of ``(name, value)`` pairs and is stored as a sorted
    tuple of items (so ``Task`` is hashable and its id does not depend on the order of the grid).
    ``split`` is an int or a label (``"gap-3"``). The task function receives the task and reads
    its settings from these fields; :func:`~pyro_bnnlv.sweep.run_sweep` seeds Python, NumPy,
    torch and Pyro with ``seed`` before every call.
    """

    dataset: str
    method: str
    split: int | str = 0
    grid: tuple[tuple[str, Scalar], ...] = field(default=())
    restart: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("dataset", "method"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"Task.{name} must be a non-empty str, got {value!r}")
        # integers as fit_svi takes them (NumPy's too), stored as int: the same task, the same id
        if not (isinstance(self.split, str) and self.split):
            try:
                object.__setattr__(self, "split", check_int(self.split, "Task.split", minimum=0))
            except ValueError as err:  # ArgumentTypeError included
                raise ValueError(f"{err} (or a non-empty str label)") from None
        for name in ("restart", "seed"):
            object.__setattr__(self, name, check_int(getattr(self, name), f"Task.{name}", minimum=0))
        grid = self.grid
        pairs = list(grid.items()) if isinstance(grid, Mapping) else list(grid)
        items = []
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
                raise TypeError(f"Task.grid must be a mapping or (name, value) pairs, got item {pair!r}")
            items.append((pair[0], _check_scalar(pair[1], pair[0])))
        names = [k for k, _ in items]
        clashes = sorted({k for k in names if names.count(k) > 1} | (set(names) & set(KEY_FIELDS)))
        if clashes:
            raise ValueError(f"Task.grid names must be unique and differ from {KEY_FIELDS}; got {clashes}")
        object.__setattr__(self, "grid", tuple(sorted(items)))

    @property
    def params(self) -> dict[str, Scalar]:
        """The grid point as a dict."""
        return dict(self.grid)

    def key(self) -> dict[str, Any]:
        """The task as a JSON-able dict (what its id hashes)."""
        return {
            "dataset": self.dataset,
            "split": self.split,
            "method": self.method,
            "grid": self.params,
            "restart": self.restart,
            "seed": self.seed,
        }

    @property
    def id(self) -> str:
        """16 hex digits of the SHA-256 of the canonical JSON of :meth:`key`."""
        return digest(self.key())

    @classmethod
    def from_key(cls, key: Mapping[str, Any]) -> Task:
        """The inverse of :meth:`key`."""
        return cls(
            dataset=key["dataset"],
            method=key["method"],
            split=key["split"],
            grid=key.get("grid", {}),
            restart=key.get("restart", 0),
            seed=key.get("seed", 0),
        )


def _jsonable(value: Any) -> Any:
    try:
        canonical_json(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


#: registered task-function names -> the ``module:qualname`` of the function holding the name
_REGISTERED: dict[str, str] = {}
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
F = TypeVar("F", bound=Callable[..., Any])


def _where(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def task_function(name: str) -> Callable[[F], F]:
    """Register a sweep task function under a stable ``name`` (a decorator).

    A results store records its task function by this name instead of ``module:qualname``, so the
    function can move to another module without orphaning the stores made with it (worker
    processes still import it from where it is). ``name`` is lower-case words of letters, digits,
    ``.``, ``_`` or ``-`` separated by ``/`` (``"ncai-compare/fit"``); it has no ``:``, so it never
    equals an unregistered function's ``module:qualname``. One name, one function: registering a
    second function under a taken name raises ``ValueError``.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"task_function name must be lower-case words of letters, digits, '.', '_' or '-' "
            f"separated by '/' (like 'ncai-compare/fit'), got {name!r}"
        )

    def register(fn: F) -> F:
        where = _where(fn)
        if _REGISTERED.get(name, where) != where:
            raise ValueError(
                f"the task-function name {name!r} is taken by {_REGISTERED[name]}; give {where} another name"
            )
        _REGISTERED[name] = where
        fn.__sweep_name__ = name  # type: ignore[attr-defined]
        return fn

    return register


def _function_name(fn: Callable) -> str:
    """The registered name of ``fn`` (:func:`task_function`), else its ``module:qualname``."""
    name = getattr(fn, "__sweep_name__", None)
    where = _where(fn)
    return name if name is not None and _REGISTERED.get(name) == where else where


def _describe_value(value: Any) -> Any:
    """A bound argument as stable JSON: itself if JSON-able; a function, class or partial by its name
    (:func:`describe_fn`; their repr holds a memory address, different in every process); another
    object by its repr, or by its type and the hash of its pickle if that repr holds an address
    (``TypeError`` if it does not pickle either)."""
    if isinstance(value, functools.partial):
        return {"callable": describe_fn(value)}
    if inspect.isroutine(value) or isinstance(value, type):
        return {"callable": _function_name(value)}
    described = _jsonable(value)
    if isinstance(described, str) and described is not value and _ADDRESS.search(described):
        try:
            return {"object": _where(type(value)), "pickle": hashlib.sha256(pickle.dumps(value)).hexdigest()[:16]}
        except Exception:
            raise TypeError(
                f"the task function binds {described}, which has no stable description (its repr "
                "holds a memory address and it cannot be pickled), so its store could never be "
                "resumed: bind JSON-able settings (or a module-level function) instead"
            ) from None
    return described


def describe_fn(fn: Callable) -> dict[str, Any]:
    """The task function as JSON: its name (:func:`task_function`, else ``module:qualname``), and the
    bound arguments of a partial (callables among them by name)."""
    out: dict[str, Any] = {}
    while isinstance(fn, functools.partial):
        out.setdefault("args", []).extend(_describe_value(a) for a in fn.args)
        out.setdefault("kwargs", {}).update({k: _describe_value(v) for k, v in sorted(fn.keywords.items())})
        fn = fn.func
    out["function"] = _function_name(fn)
    return out


def check_picklable(fn: Callable) -> None:
    """``TypeError`` naming the fix unless ``fn`` pickles (worker processes need it)."""
    try:
        pickle.dumps(fn)
    except Exception as err:
        raise TypeError(
            f"the task function {describe_fn(fn)['function']} cannot be pickled ({err}); worker "
            "processes need a module-level function (or a functools.partial of one), not a lambda "
            "or a nested function; or use executor='inline'"
        ) from None


def sweep_identity(tasks: Iterable[Task], fn: Callable, sweep_meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """What two runs must share to use one store: the function, ``sweep_meta`` and the task ids."""
    meta = {} if sweep_meta is None else dict(sweep_meta)
    try:
        canonical_json(meta)
    except (TypeError, ValueError) as err:
        raise ValueError(f"sweep_meta must be JSON-serialisable with finite numbers: {err}") from None
    return {"fn": describe_fn(fn), "meta": meta, "tasks": sorted(t.id for t in tasks)}


_ROOT = Path(__file__).resolve().parents[1]
#: separates the package's part of a code version from the task function's source part
_TASK_SOURCE = "; task source "


@functools.cache
def _package_version() -> str:
    import pyro
    import torch

    h = hashlib.sha256()
    for path in sorted(p for ext in ("*.py", "*.cpp") for p in _ROOT.rglob(ext)):
        h.update(path.relative_to(_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    try:
        version = importlib.metadata.version("pyro_bnnlv")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        version = "unknown"
    return f"pyro_bnnlv {version} src {h.hexdigest()[:12]}, torch {torch.__version__}, pyro {pyro.__version__}"


def _callables(fn: Callable) -> list[Callable]:
    """``fn`` and, through ``functools.partial`` layers, the functions and classes it binds."""
    out = []
    while isinstance(fn, functools.partial):
        for value in (*fn.args, *fn.keywords.values()):
            if isinstance(value, functools.partial):
                out += _callables(value)
            elif inspect.isroutine(value) or isinstance(value, type):
                out.append(value)
        fn = fn.func
    return [fn, *out]


def _source_digest(fn: Callable) -> tuple[str, str] | None:
    """``(label, hash)`` of the source that defines ``fn``: its module's file (so helpers in that file
    count too), else the function's own source (a notebook cell); ``None`` for the package's own
    code (covered by :func:`code_version`). ``TypeError`` naming the fix if neither can be read."""
    target = fn if inspect.isroutine(fn) or isinstance(fn, type) else type(fn)
    target = getattr(target, "__func__", target)  # a bound method: its function
    module_name = getattr(target, "__module__", None) or "?"
    path = getattr(sys.modules.get(module_name), "__file__", None)
    if path and Path(path).is_file():
        path = Path(path).resolve()
        if _ROOT in path.parents:
            return None
        label = path.name if module_name == "__main__" else module_name
        return label, hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    try:
        source = inspect.getsource(target)
    except (OSError, TypeError):
        raise TypeError(
            f"the source of the task function {_where(target)} cannot be read (its module has no file: a "
            "script read from standard input?), so a store could not tell its results from those of an "
            "edited version; pass code_version='a label of your own' and change the label whenever you "
            "change the function"
        ) from None
    return _where(target), hashlib.sha256(source.encode()).hexdigest()[:12]


def code_version(fn: Callable | None = None) -> str:
    """The label of the code that computes a sweep's results (what its store must agree on).

    ``pyro_bnnlv`` version, a hash of its source files (``*.py``, ``*.cpp``), torch and Pyro
    versions; given the task function ``fn``, followed by ``; task source MODULE HASH`` for each
    function defined outside the package (``fn`` itself, or functions a ``functools.partial``
    binds): a hash of its module's file (helpers in that file count too) or, without a file (a
    notebook cell), of the function's own source. So any edit to the package or to the user's task
    code changes it and a store is never silently completed by other code; pass ``code_version=``
    to :func:`~pyro_bnnlv.sweep.run_sweep` to pin a label instead (see there).
    """
    version = _package_version()
    if fn is None:
        return version
    sources = dict.fromkeys(d for f in _callables(fn) if (d := _source_digest(f)) is not None)
    return version + "".join(f"{_TASK_SOURCE}{label} {h}" for label, h in sources)


def describe_version_change(stored: str, now: str) -> str:
    """What differs between two :func:`code_version` labels, in words."""
    old_src, new_src = stored.split(_TASK_SOURCE)[1:], now.split(_TASK_SOURCE)[1:]
    changed = [s for s in new_src if s not in old_src]
    if stored.split(_TASK_SOURCE)[0] == now.split(_TASK_SOURCE)[0] and changed:
        names = ", ".join(s.rsplit(" ", 1)[0] for s in changed)
        return f"the task function's source changed ({names} differs from the code that computed the stored results)"
    return f"the stored results were computed by other code: stored code version {stored!r}, now {now!r}"
