"""The :class:`Dataset` container, standardisation, and the dataset registry."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._checks import check_fraction, check_seed

__all__ = [
    "DATA_DIR_ENV",
    "REGISTRY",
    "Dataset",
    "default_data_dir",
    "from_arrays",
    "from_frame",
    "make_dataset",
    "register",
    "standardized_source",
]

#: Environment variable naming the directory of the real data files (see ``../shared/data``).
DATA_DIR_ENV = "PYRO_BNNLV_DATA"


def default_data_dir() -> Path:
    """``$PYRO_BNNLV_DATA`` if set; else ``../shared/data`` relative to the repository root when
    that directory exists (a development checkout); else the user cache (``~/.cache/pyro_bnnlv``
    on Linux, ``pooch.os_cache``), where :mod:`pyro_bnnlv.datasets.fetch` downloads the real data."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    repo_root = Path(__file__).resolve().parents[2]
    shared = (repo_root / ".." / "shared" / "data").resolve()
    if shared.is_dir():
        return shared
    import pooch

    return Path(pooch.os_cache("pyro_bnnlv"))


@dataclass
class Dataset:
    """Train / validation / test tensors of a regression data set.

    Inputs are ``(N, D)`` float tensors and targets ``(N,)``. When ``standardized`` is true the
    tensors are standardised with the training statistics ``x_mean, x_std, y_mean, y_std``
    (original = standardised * std + mean); pass ``y_mean``/``y_std`` to
    :func:`pyro_bnnlv.evaluate` to report metrics on the original scale. Otherwise the statistics
    are the identity (mean 0, std 1).

    ``extras`` holds anything else a generator knows: ground-truth latent inputs ``z_*``,
    out-of-distribution inputs ``x_ood``, the true noise standard deviation, and so on.

    ``split`` and ``seed`` record how :func:`~pyro_bnnlv.datasets.load_dataset` made it: for the
    UCI sets ``split`` is the standard train/test split and ``seed`` draws the validation subset
    of its training part (and so moves the standardisation statistics); for the other sets
    ``seed`` is the generator's or the random split's seed. Your own data:
    :func:`from_arrays` / :func:`from_frame`.
    """

    name: str
    x_train: Tensor
    y_train: Tensor
    x_valid: Tensor
    y_valid: Tensor
    x_test: Tensor
    y_test: Tensor
    x_mean: Tensor
    x_std: Tensor
    y_mean: Tensor
    y_std: Tensor
    standardized: bool
    description: str
    extras: dict[str, Tensor] = field(default_factory=dict)
    split: int | None = None
    seed: int | None = None

    @property
    def input_dim(self) -> int:
        return self.x_train.shape[1]

    @property
    def sizes(self) -> tuple[int, int, int]:
        return len(self.x_train), len(self.x_valid), len(self.x_test)

    def __repr__(self) -> str:
        n_tr, n_va, n_te = self.sizes
        how = "".join(f", {k}={v}" for k, v in (("split", self.split), ("seed", self.seed)) if v is not None)
        return (
            f"Dataset({self.name!r}, D={self.input_dim}, train={n_tr}, valid={n_va}, "
            f"test={n_te}{how}, standardized={self.standardized})"
        )


# Targets of standardised data sets, so that pyro_bnnlv.evaluate can warn when it is given one
# without y_mean / y_std: id -> tensor (weak; the check is ``registry.get(id(y)) is y``) and
# id -> "data.y_test of 'yacht'".
_STANDARDIZED: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
_STANDARDIZED_LABEL: dict[int, str] = {}


def _mark_standardized(data: Dataset) -> None:
    for split in ("train", "valid", "test"):
        t = getattr(data, f"y_{split}")
        key = id(t)
        _STANDARDIZED[key] = t
        _STANDARDIZED_LABEL[key] = f"y_{split} of the standardised data set {data.name!r}"
        weakref.finalize(t, _STANDARDIZED_LABEL.pop, key, None)


def standardized_source(y: Any) -> str | None:
    """If ``y`` is the very target tensor of a standardised :class:`Dataset` (``data.y_test``
    etc.), a description of it; else ``None``. Slices and copies are not recognised."""
    if isinstance(y, Tensor) and _STANDARDIZED.get(id(y)) is y:
        return _STANDARDIZED_LABEL.get(id(y))
    return None


def _to_tensor(a: np.ndarray) -> Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.float64), dtype=torch.get_default_dtype())


def make_dataset(
    name: str,
    splits: dict[str, tuple[np.ndarray, np.ndarray]],
    *,
    standardize: bool,
    description: str,
    extras: dict[str, np.ndarray] | None = None,
) -> Dataset:
    """Build a :class:`Dataset` from numpy ``{"train": (x, y), "valid": ..., "test": ...}``.

    Standardisation uses the training split's mean and standard deviation; a constant input
    column (std 0 up to rounding, e.g. two columns of UCI naval) gets std 1 so it maps to 0 instead of NaN.
    ``extras`` entries named ``x_*`` are standardised like the inputs, ``y_*`` like the
    targets, and ``noise_std`` is divided by ``y_std``.
    """
    x_tr, y_tr = (np.asarray(a, dtype=np.float64) for a in splits["train"])
    if x_tr.ndim == 1:
        x_tr = x_tr[:, None]
    D = x_tr.shape[1]
    if standardize:
        x_mean, x_std = _mean_std(x_tr)
        # constant columns: std is 0 up to rounding (naval's 0.998 column gives ~1e-16)
        x_std = np.where(x_std > 1e-10 * np.maximum(1.0, np.abs(x_mean)), x_std, 1.0)
        y_mean, y_std = (float(v[0]) for v in _mean_std(y_tr.reshape(-1, 1)))
        if y_std <= 0:
            raise ValueError(f"dataset {name!r}: training targets are constant")
    else:
        x_mean, x_std, y_mean, y_std = np.zeros(D), np.ones(D), 0.0, 1.0
    _check_representable(name, x_mean, x_std, y_mean, y_std, standardize)
    out = {}
    for split in ("train", "valid", "test"):
        x, y = (np.asarray(a, dtype=np.float64) for a in splits[split])
        x = x.reshape(len(x), D)
        out[f"x_{split}"] = _to_tensor(_standardise(x, x_mean, x_std))
        out[f"y_{split}"] = _to_tensor(_standardise(y.reshape(-1), y_mean, y_std))
        if not standardize:
            _check_representable_values(name, split, x, y)
    ext = {}
    for key, value in (extras or {}).items():
        value = np.asarray(value, dtype=np.float64)
        if key.startswith("x_"):
            value = (value.reshape(len(value), D) - x_mean) / x_std
        elif key.startswith("y_"):
            value = (value - y_mean) / y_std
        elif key == "noise_std":
            value = value / y_std
        ext[key] = _to_tensor(value)
    data = Dataset(
        name=name,
        **out,
        x_mean=_to_tensor(x_mean),
        x_std=_to_tensor(x_std),
        y_mean=torch.tensor(y_mean),
        y_std=torch.tensor(y_std),
        standardized=standardize,
        description=description,
        extras=ext,
    )
    if standardize:
        _mark_standardized(data)
    return data


def _mean_std(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column means and (population) standard deviations of ``a (N, D)`` without overflow: each
    column is divided by its largest magnitude first (``mean = m * mean(a / m)``), so a column
    near the float64 maximum (``1e307``) has a finite mean and std instead of ``inf``."""
    m = np.abs(a).max(axis=0)
    m = np.where(m > 0, m, 1.0)
    scaled = a / m
    return m * scaled.mean(0), m * scaled.std(0)


def _standardise(a: np.ndarray, mean: np.ndarray | float, std: np.ndarray | float) -> np.ndarray:
    """``(a - mean) / std`` computed as ``(a / std) - (mean / std)``: no overflow in ``a - mean``
    for values near the float64 maximum."""
    return a / std - np.asarray(mean) / std


def _check_representable(name: str, x_mean: np.ndarray, x_std: np.ndarray, y_mean: float, y_std: float,
                         standardize: bool) -> None:  # fmt: skip
    """The statistics are stored as tensors of the default dtype: refuse (naming the column) what
    that dtype cannot hold instead of storing ``inf``."""
    if not standardize:
        return
    big = torch.finfo(torch.get_default_dtype()).max
    for what, values in (("x", np.stack([x_mean, x_std], 1)), ("y", np.array([[y_mean, y_std]]))):
        bad = np.flatnonzero(~(np.abs(values) <= big).all(1))
        if bad.size:
            column = f"x column {bad[0]}" if what == "x" else "y"
            raise ValueError(f"dataset {name!r}: {column} has a mean or standard deviation beyond what "
                             f"{torch.get_default_dtype()} holds ({big:.3g}), so its standardisation cannot be "
                             f"stored; rescale it first (e.g. divide by a power of 10), or call "
                             f"torch.set_default_dtype(torch.float64) before loading")  # fmt: skip


def _check_representable_values(name: str, split: str, x: np.ndarray, y: np.ndarray) -> None:
    """Unstandardised values are stored as given: refuse a column the default dtype cannot hold."""
    big = torch.finfo(torch.get_default_dtype()).max
    bad = np.flatnonzero(~(np.abs(x) <= big).all(0)) if x.size else []
    if len(bad) or (y.size and not (np.abs(y) <= big).all()):
        column = f"x column {bad[0]}" if len(bad) else "y"
        raise ValueError(f"dataset {name!r}: {column} of the {split} split has values beyond what "
                         f"{torch.get_default_dtype()} holds ({big:.3g}); rescale it first (e.g. divide by a power "
                         f"of 10), or call torch.set_default_dtype(torch.float64) before loading")  # fmt: skip


def _canonical(name: str) -> str:
    """A data set name as the registry spells it: lower case, hyphens (``heavy_tail`` -> ``heavy-tail``)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a data set name (a str, see list_datasets()), got {name!r}")
    return name.strip().lower().replace("_", "-")


def _as_float_array(value: Any, name: str) -> np.ndarray:
    if isinstance(value, Tensor):
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be numeric (a tensor, array or DataFrame of numbers); "
                         f"encode categorical columns first, e.g. pandas.get_dummies ({err})") from None  # fmt: skip
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values; drop or impute them first")
    return arr


def from_arrays(
    x: Any,
    y: Any,
    *,
    name: str = "data",
    test_fraction: float = 0.2,
    valid_fraction: float = 0.1,
    seed: int = 0,
    standardize: bool = True,
) -> Dataset:
    """Your own regression data as a :class:`Dataset`: a seeded random train/valid/test split.

    Args:
        x: inputs ``(N, D)`` or ``(N,)``: a tensor, NumPy array, list or pandas object.
        y: real-valued targets ``(N,)`` (this library does regression; one target column).
        test_fraction, valid_fraction: shares of the ``N`` rows for the test and validation sets
            (``round(fraction * N)`` rows each, drawn by ``numpy.random.default_rng(seed)``); the
            rest is the training set.
        standardize: standardise inputs and targets with the training statistics (the
            default, as for the UCI sets); pass ``y_mean=data.y_mean, y_std=data.y_std`` to
            :func:`~pyro_bnnlv.evaluate`, or the data set itself, to get metrics on the original
            scale.

    Example: ``data = pb.datasets.from_arrays(x, y, seed=0)``, then ``data.x_train`` etc.
    """
    seed = check_seed(seed)
    xa, ya = _as_float_array(x, "x"), _as_float_array(y, "y")
    if xa.ndim == 1:
        xa = xa[:, None]
    if ya.ndim == 2 and ya.shape[1] == 1:
        ya = ya[:, 0]
    if xa.ndim != 2:
        raise ValueError(f"x must have shape (N, D) or (N,), got {xa.shape}")
    if ya.ndim != 1:
        raise ValueError(f"y must have shape (N,) (one real-valued target), got {ya.shape}")
    if len(xa) != len(ya):
        raise ValueError(f"x and y have different numbers of rows: {len(xa)} vs {len(ya)}")
    test_fraction = check_fraction(test_fraction, "test_fraction")
    valid_fraction = check_fraction(valid_fraction, "valid_fraction")
    N = len(xa)
    n_test, n_valid = round(test_fraction * N), round(valid_fraction * N)
    if N - n_test - n_valid < 2:
        raise ValueError(f"{N} rows leave {N - n_test - n_valid} for training with test_fraction="
                         f"{test_fraction} and valid_fraction={valid_fraction}; need at least 2")  # fmt: skip
    perm = np.random.default_rng(seed).permutation(N)
    test, valid, train = perm[:n_test], perm[n_test:n_test + n_valid], perm[n_test + n_valid:]
    data = make_dataset(
        name, {k: (xa[i], ya[i]) for k, i in (("train", train), ("valid", valid), ("test", test))},
        standardize=standardize,
        description=f"{name}: {N} rows, random {1 - test_fraction - valid_fraction:.2g}/"
                    f"{valid_fraction:.2g}/{test_fraction:.2g} split, seed {seed}",
    )  # fmt: skip
    data.seed = seed
    return data


def from_frame(
    frame: Any,
    target: str,
    features: Sequence[str] | None = None,
    **options: Any,
) -> Dataset:
    """A pandas ``DataFrame`` as a :class:`Dataset`: column ``target`` is ``y``, ``features``
    (default: every other column) are ``x``; ``options`` as for :func:`from_arrays`
    (``name`` defaults to ``target``)."""
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame must be a pandas DataFrame, got {type(frame).__name__}")
    if target not in frame.columns:
        raise ValueError(f"target column {target!r} not in the frame; columns: {list(frame.columns)}")
    features = [c for c in frame.columns if c != target] if features is None else list(features)
    if target in features:
        raise ValueError(f"features includes the target column {target!r}, which would put y among the "
                         f"inputs: leave it out of features= (or omit features= for every other column)")  # fmt: skip
    repeated = sorted({c for c in features if features.count(c) > 1}, key=str)
    if repeated:
        raise ValueError(f"features names the columns {repeated} more than once; list each feature once")
    missing = [c for c in features if c not in frame.columns]
    if missing or not features:
        raise ValueError(f"features {missing or features} not usable; columns: {list(frame.columns)}")
    nonnumeric = [c for c in [*features, target] if not pd.api.types.is_numeric_dtype(frame[c])]
    if nonnumeric:
        raise ValueError(f"columns {nonnumeric} are not numeric; encode them first "
                         f"(e.g. pandas.get_dummies) or leave them out of features=")  # fmt: skip
    nan = [c for c in [*features, target] if frame[c].isna().any()]
    if nan:
        raise ValueError(f"columns {nan} contain missing values; drop or impute them first "
                         f"(e.g. frame.dropna())")  # fmt: skip
    options.setdefault("name", target)
    return from_arrays(frame[features].to_numpy(), frame[target].to_numpy(), **options)


@dataclass(frozen=True)
class _Entry:
    loader: Callable[..., Dataset]
    kind: str  # "synthetic" or "file"
    summary: str


#: name -> registry entry; filled by the ``synthetic`` and ``files`` modules.
REGISTRY: dict[str, _Entry] = {}


def register(name: str, kind: str, summary: str) -> Callable[[Callable[..., Dataset]], Callable[..., Dataset]]:
    def deco(fn: Callable[..., Dataset]) -> Callable[..., Dataset]:
        REGISTRY[name] = _Entry(fn, kind, summary)
        return fn

    return deco
