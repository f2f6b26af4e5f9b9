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

from .._checks import check_fraction, check_int, check_seed

__all__ = [
    "DATA_DIR_ENV",
    "REGISTRY",
    "Dataset",
    "default_data_dir",
    "encode_labels",
    "from_arrays",
    "from_frame",
    "make_dataset",
    "random_holdout",
    "register",
    "standardized_source",
    "stratified_split",
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
    """Train / validation / test tensors of a regression or classification data set.

    Inputs are ``(N, D)`` float tensors and targets ``(N,)``. A classification set has
    ``num_classes = K`` (``None`` for regression): its targets are ``torch.long`` class labels
    ``0..K-1``, ``class_names[k]`` names label ``k``, and labels are never standardised. When
    ``standardized`` is true the tensors are standardised with the training statistics
    ``x_mean, x_std, y_mean, y_std`` (original = standardised * std + mean; pass the data set or
    ``y_mean``/``y_std`` to :func:`pyro_bnnlv.evaluate` for the original scale); otherwise the
    statistics are the identity.

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
    num_classes: int | None = None
    class_names: tuple[str, ...] | None = None

    @property
    def input_dim(self) -> int:
        return self.x_train.shape[1]

    @property
    def task(self) -> str:
        """``"classification"`` when ``num_classes`` is set, else ``"regression"``."""
        return "regression" if self.num_classes is None else "classification"

    @property
    def sizes(self) -> tuple[int, int, int]:
        return len(self.x_train), len(self.x_valid), len(self.x_test)

    def __repr__(self) -> str:
        n_tr, n_va, n_te = self.sizes
        how = "".join(f", {k}={v}" for k, v in (("split", self.split), ("seed", self.seed)) if v is not None)
        return (
            f"Dataset({self.name!r}, D={self.input_dim}, "
            f"{'' if self.num_classes is None else f'K={self.num_classes}, '}train={n_tr}, valid={n_va}, "
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
    num_classes: int | None = None,
    class_names: Sequence[str] | None = None,
) -> Dataset:
    """Build a :class:`Dataset` from numpy ``{"train": (x, y), "valid": ..., "test": ...}``.

    Standardisation uses the training split's mean and standard deviation; a constant input
    column (std 0 up to rounding, e.g. two columns of UCI naval) gets std 1 so it maps to 0 instead of NaN.
    ``extras`` entries named ``x_*`` are standardised like the inputs, ``y_*`` like the
    targets, and ``noise_std`` is divided by ``y_std``.

    Classification (``num_classes=K``, ``None`` for regression): every split's ``y`` holds
    integer labels ``0..K-1`` (checked), stored as ``torch.long``; only the inputs are
    standardised (``y_mean = 0``, ``y_std = 1``); integer ``extras`` stay integer
    (``torch.long``); ``class_names`` (``K`` strings, default ``"0", ..., "K-1"``) name the labels.
    """
    K, names = _check_classes(name, num_classes, class_names)
    x_tr, y_tr = (np.asarray(a, dtype=np.float64) for a in splits["train"])
    if x_tr.ndim == 1:
        x_tr = x_tr[:, None]
    D = x_tr.shape[1]
    if standardize:
        x_mean, x_std = _mean_std(x_tr)
        # constant columns: std is 0 up to rounding (naval's 0.998 column gives ~1e-16)
        x_std = np.where(x_std > 1e-10 * np.maximum(1.0, np.abs(x_mean)), x_std, 1.0)
        y_mean, y_std = (float(v[0]) for v in _mean_std(y_tr.reshape(-1, 1))) if K is None else (0.0, 1.0)
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
        if K is None:
            out[f"y_{split}"] = _to_tensor(_standardise(y.reshape(-1), y_mean, y_std))
        else:
            out[f"y_{split}"] = torch.as_tensor(_check_labels(name, split, y, K))
        if not standardize:
            _check_representable_values(name, split, x, y)
    ext = _scaled_extras(extras, D, x_mean, x_std, y_mean, y_std, integers=K is not None)
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
        num_classes=K,
        class_names=names,
    )
    if standardize and K is None:  # labels are never standardised: nothing for evaluate to warn about
        _mark_standardized(data)
    return data


def _scaled_extras(
    extras: dict[str, np.ndarray] | None,
    D: int,
    x_mean: np.ndarray,
    x_std: np.ndarray,
    y_mean: float,
    y_std: float,
    integers: bool,
) -> dict[str, Tensor]:
    """:func:`make_dataset`'s ``extras`` as tensors: ``x_*`` standardised like the inputs, ``y_*``
    like the targets, ``noise_std`` divided by ``y_std``; with ``integers`` (classification),
    integer arrays (labels) are kept as ``torch.long`` instead."""
    ext = {}
    for key, value in (extras or {}).items():
        if integers and np.asarray(value).dtype.kind in "iub":
            ext[key] = torch.as_tensor(np.asarray(value, dtype=np.int64))
            continue
        value = np.asarray(value, dtype=np.float64)
        if key.startswith("x_"):
            value = (value.reshape(len(value), D) - x_mean) / x_std
        elif key.startswith("y_"):
            value = (value - y_mean) / y_std
        elif key == "noise_std":
            value = value / y_std
        ext[key] = _to_tensor(value)
    return ext


def _check_classes(name: str, num_classes: Any, class_names: Any) -> tuple[int | None, tuple[str, ...] | None]:
    """``(K, class_names)`` of :func:`make_dataset`: ``(None, None)`` for regression."""
    if num_classes is None:
        if class_names is not None:
            raise ValueError(f"dataset {name!r}: class_names= needs num_classes= (a classification set)")
        return None, None
    K = check_int(num_classes, "num_classes", minimum=2)
    names = tuple(str(c) for c in range(K)) if class_names is None else tuple(str(c) for c in class_names)
    if len(names) != K:
        raise ValueError(
            f"dataset {name!r}: class_names has {len(names)} names for num_classes={K}; give one per class"
        )
    return K, names


def _check_labels(name: str, split: str, y: np.ndarray, K: int) -> np.ndarray:
    """Class labels ``y`` of a split as ``int64 (N,)``; ``ValueError`` unless they are integers in ``[0, K)``."""
    y = y.reshape(-1)
    bad = ~(np.isfinite(y) & (y == np.round(y)) & (y >= 0) & (y < K))
    if bad.any():
        raise ValueError(
            f"dataset {name!r}: the {split} labels must be integers in [0, {K}) (num_classes={K}), "
            f"got {y[bad][0]:g}; map the classes to 0..K-1 first (from_arrays(..., "
            f"task='classification') does it)"
        )
    return y.astype(np.int64)


def random_holdout(idx: np.ndarray, n_holdout: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rest, holdout)``: ``n_holdout`` of the indices ``idx`` drawn at random (seeded), both sorted;
    the validation subsets of the UCI splits and of the gap / extrapolation splits."""
    perm = np.random.default_rng(check_seed(seed)).permutation(idx)
    return np.sort(perm[n_holdout:]), np.sort(perm[:n_holdout])


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


def _check_representable(
    name: str, x_mean: np.ndarray, x_std: np.ndarray, y_mean: float, y_std: float, standardize: bool
) -> None:
    """The statistics are stored as tensors of the default dtype: refuse (naming the column) what
    that dtype cannot hold instead of storing ``inf``."""
    if not standardize:
        return
    big = torch.finfo(torch.get_default_dtype()).max
    for what, values in (("x", np.stack([x_mean, x_std], 1)), ("y", np.array([[y_mean, y_std]]))):
        bad = np.flatnonzero(~(np.abs(values) <= big).all(1))
        if bad.size:
            column = f"x column {bad[0]}" if what == "x" else "y"
            raise ValueError(
                f"dataset {name!r}: {column} has a mean or standard deviation beyond what "
                f"{torch.get_default_dtype()} holds ({big:.3g}), so its standardisation cannot be "
                f"stored; rescale it first (e.g. divide by a power of 10), or call "
                f"torch.set_default_dtype(torch.float64) before loading"
            )


def _check_representable_values(name: str, split: str, x: np.ndarray, y: np.ndarray) -> None:
    """Unstandardised values are stored as given: refuse a column the default dtype cannot hold."""
    big = torch.finfo(torch.get_default_dtype()).max
    bad = np.flatnonzero(~(np.abs(x) <= big).all(0)) if x.size else []
    if len(bad) or (y.size and not (np.abs(y) <= big).all()):
        column = f"x column {bad[0]}" if len(bad) else "y"
        raise ValueError(
            f"dataset {name!r}: {column} of the {split} split has values beyond what "
            f"{torch.get_default_dtype()} holds ({big:.3g}); rescale it first (e.g. divide by a power "
            f"of 10), or call torch.set_default_dtype(torch.float64) before loading"
        )


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
        raise ValueError(
            f"{name} must be numeric (a tensor, array or DataFrame of numbers); "
            f"encode categorical columns first, e.g. pandas.get_dummies ({err})"
        ) from None
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values; drop or impute them first")
    return arr


_TASKS = ("regression", "classification")


def _check_task(task: Any) -> str:
    if task not in _TASKS:
        raise ValueError(f"task must be 'regression' (real-valued y) or 'classification' (class labels), got {task!r}")
    return task


def encode_labels(value: Any, name: str = "y") -> tuple[np.ndarray, tuple[str, ...]]:
    """Class labels as ``(codes, class_names)``: the sorted unique values of ``value`` are the
    classes, ``codes`` ``int64 (N,)`` their indices ``0..K-1`` and ``class_names`` the values as
    strings (``[3, 7, 3]`` -> ``([0, 1, 0], ("3", "7"))``; ``["b", "a"]`` -> ``([1, 0], ("a", "b"))``).

    Labels may be integers, strings, bools, or floats holding whole numbers (``1.0``); a
    ``ValueError`` naming ``name`` for missing labels (NaN, ``None``), fractional floats, a
    single class or a shape other than ``(N,)`` / ``(N, 1)``."""
    import pandas as pd

    if isinstance(value, Tensor):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(f"{name} must have shape (N,) (one class label per row), got {arr.shape}")
    if arr.dtype.kind in "fcO" and pd.isna(arr).any():
        raise ValueError(
            f"{name} has missing (NaN / None) class labels at rows "
            f"{np.flatnonzero(pd.isna(arr))[:5].tolist()}; drop those rows first"
        )
    values = arr.tolist() if arr.dtype.kind == "O" else arr
    fractional = [
        v
        for v in np.atleast_1d(values)
        if isinstance(v, (float, np.floating, complex, np.complexfloating))
        and not (np.real(v) == np.round(np.real(v)) and np.imag(v) == 0)
    ]
    if fractional:
        raise ValueError(
            f"{name} has float labels that are not whole numbers (e.g. {_plain(fractional[0])!r}); "
            f"task='classification' is for class labels (integers or strings): pass real-valued "
            f"targets with task='regression' (the default)"
        )
    if arr.dtype.kind in "fc":
        arr = np.real(arr).astype(np.int64)
    elif arr.dtype.kind == "O":  # whole floats among Python objects: 1.0 is the class "1"
        arr = np.array([int(v) if isinstance(v, (float, np.floating)) else v for v in values], dtype=object)
    try:
        classes, codes = np.unique(arr, return_inverse=True)
    except TypeError:
        raise ValueError(
            f"{name} mixes label types that cannot be sorted (e.g. numbers and strings); "
            f"make them one type, e.g. all strings ({name}.astype(str))"
        ) from None
    if len(classes) < 2:
        raise ValueError(
            f"{name} has a single class ({_plain(classes[0])!r} in all {len(arr)} rows) where "
            f"classification needs at least two"
            if len(classes)
            else f"{name} has no labels"
        )
    return codes.reshape(-1).astype(np.int64), tuple(str(c) for c in classes.tolist())


def _plain(v: Any) -> Any:
    """A NumPy scalar as the Python value (for messages: ``1.5``, not ``np.float64(1.5)``)."""
    return v.item() if isinstance(v, np.generic) else v


def _apportion(weights: np.ndarray, total: int, cap: np.ndarray) -> np.ndarray:
    """``total`` split over the classes in proportion to ``weights`` by largest remainders, at most
    ``cap[k]`` for class ``k`` (``total <= cap.sum()``)."""
    w = np.asarray(weights, dtype=np.float64)
    quota = total * w / w.sum() if w.sum() > 0 else np.zeros_like(w)
    out = np.minimum(np.floor(quota).astype(np.int64), cap)
    while out.sum() < total:
        order = np.argsort(-(quota - out), kind="stable")
        out[next(k for k in order if out[k] < cap[k])] += 1
    return out


def stratified_split(labels: Any, n_valid: int, n_test: int, seed: int | None) -> tuple[np.ndarray, ...]:
    """Row indices ``(train, valid, test)`` of a seeded stratified random split of ``labels``.

    Exactly ``n_valid`` and ``n_test`` rows are held out. Each class gives the held-out sets a share
    proportional to its size (largest remainders), but keeps at least one row for training, so
    every class is in the training set; the rows of each class are drawn at random by
    ``numpy.random.default_rng(seed)``, and each index array is shuffled."""
    labels = np.asarray(labels).reshape(-1)
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    if n_valid + n_test > (counts - 1).sum():
        raise ValueError(
            f"cannot hold out {n_valid} + {n_test} of {len(labels)} rows in {len(classes)} classes and "
            f"keep a training row of each class; use smaller fractions"
        )
    held = _apportion(counts, n_valid + n_test, counts - 1)
    to_test = _apportion(held, n_test, held)
    parts: tuple[list, list, list] = ([], [], [])
    for c, h, t in zip(classes, held, to_test):
        rows = rng.permutation(np.flatnonzero(labels == c))
        parts[2].append(rows[:t]), parts[1].append(rows[t:h]), parts[0].append(rows[h:])
    return tuple(rng.permutation(np.concatenate(p)).astype(np.int64) for p in parts)


def _checked_xy(x: Any, y: Any, task: str) -> tuple[np.ndarray, np.ndarray, tuple[str, ...] | None]:
    """:func:`from_arrays`'s ``(x (N, D), y (N,), class_names)``."""
    xa = _as_float_array(x, "x")
    if task == "classification":
        ya, class_names = encode_labels(y, "y")
    else:
        ya, class_names = _as_float_array(y, "y"), None
    if xa.ndim == 1:
        xa = xa[:, None]
    if ya.ndim == 2 and ya.shape[1] == 1:
        ya = ya[:, 0]
    if xa.ndim != 2:
        raise ValueError(f"x must have shape (N, D) or (N,), got {xa.shape}")
    if ya.ndim != 1:
        raise ValueError(
            f"y must have shape (N,) (one real-valued target), got {ya.shape}: a Dataset holds one "
            "target; for several outputs fit the tensors directly (pb.BNN(pb.MLP(D, [50], L)) with y of "
            "shape (N, L) in fit_svi / evaluate), or one Dataset per column"
        )
    if len(xa) != len(ya):
        raise ValueError(f"x and y have different numbers of rows: {len(xa)} vs {len(ya)}")
    return xa, ya, class_names


def from_arrays(
    x: Any,
    y: Any,
    *,
    name: str = "data",
    test_fraction: float = 0.2,
    valid_fraction: float = 0.1,
    seed: int = 0,
    standardize: bool = True,
    task: str = "regression",
) -> Dataset:
    """Your own data as a :class:`Dataset`: a seeded random train/valid/test split.

    Args:
        x: inputs ``(N, D)`` or ``(N,)``: a tensor, NumPy array, list or pandas object.
        y: real-valued targets ``(N,)`` (``task="regression"``, one target column), or class
            labels ``(N,)`` (``task="classification"``): integers, strings or bools; the sorted
            unique values become labels ``0..K-1`` (``torch.long``) and their originals, as
            strings, ``data.class_names`` (:func:`encode_labels`).
        test_fraction, valid_fraction: shares of the ``N`` rows for the test and validation sets
            (``round(fraction * N)`` rows each, drawn by ``numpy.random.default_rng(seed)``); the
            rest is the training set. For classification the split is stratified
            (:func:`stratified_split`: each class in proportion, every class in the training set).
        standardize: standardise inputs and targets with the training statistics (the
            default, as for the UCI sets); pass ``y_mean=data.y_mean, y_std=data.y_std`` to
            :func:`~pyro_bnnlv.evaluate`, or the data set itself, to get metrics on the original
            scale. Class labels are never standardised.
        task: ``"regression"`` (the default) or ``"classification"``.

    Example: ``data = pb.datasets.from_arrays(x, y, seed=0)``, then ``data.x_train`` etc.
    """
    seed = check_seed(seed)
    task = _check_task(task)
    xa, ya, class_names = _checked_xy(x, y, task)
    test_fraction = check_fraction(test_fraction, "test_fraction")
    valid_fraction = check_fraction(valid_fraction, "valid_fraction")
    N = len(xa)
    n_test, n_valid = round(test_fraction * N), round(valid_fraction * N)
    if N - n_test - n_valid < 2:
        raise ValueError(
            f"{N} rows leave {N - n_test - n_valid} for training with test_fraction="
            f"{test_fraction} and valid_fraction={valid_fraction}; need at least 2"
        )
    if task == "classification":
        train, valid, test = stratified_split(ya, n_valid, n_test, seed)
        how = f"{len(class_names)} classes, stratified random"
    else:
        perm = np.random.default_rng(seed).permutation(N)
        test, valid, train = perm[:n_test], perm[n_test : n_test + n_valid], perm[n_test + n_valid :]
        how = "random"
    data = make_dataset(
        name,
        {k: (xa[i], ya[i]) for k, i in (("train", train), ("valid", valid), ("test", test))},
        standardize=standardize,
        description=f"{name}: {N} rows, {how} {1 - test_fraction - valid_fraction:.2g}/"
        f"{valid_fraction:.2g}/{test_fraction:.2g} split, seed {seed}",
        num_classes=None if class_names is None else len(class_names),
        class_names=class_names,
    )
    data.seed = seed
    return data


def from_frame(frame: Any, target: str, features: Sequence[str] | None = None, **options: Any) -> Dataset:
    """A pandas ``DataFrame`` as a :class:`Dataset`: column ``target`` is ``y``, ``features``
    (default: every other column) are ``x``; ``options`` as for :func:`from_arrays`
    (``name`` defaults to ``target``). With ``task="classification"`` the target column holds
    class labels (integers, strings, a categorical, ...), mapped to ``0..K-1`` as
    :func:`from_arrays` does; the features must be numeric either way."""
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame must be a pandas DataFrame, got {type(frame).__name__}")
    if target not in frame.columns:
        raise ValueError(f"target column {target!r} not in the frame; columns: {list(frame.columns)}")
    features = [c for c in frame.columns if c != target] if features is None else list(features)
    if target in features:
        raise ValueError(
            f"features includes the target column {target!r}, which would put y among the "
            f"inputs: leave it out of features= (or omit features= for every other column)"
        )
    repeated = sorted({c for c in features if features.count(c) > 1}, key=str)
    if repeated:
        raise ValueError(f"features names the columns {repeated} more than once; list each feature once")
    missing = [c for c in features if c not in frame.columns]
    if missing or not features:
        raise ValueError(f"features {missing or features} not usable; columns: {list(frame.columns)}")
    labels = _check_task(options.get("task", "regression")) == "classification"
    nonnumeric = [c for c in [*features, *([] if labels else [target])] if not pd.api.types.is_numeric_dtype(frame[c])]
    if nonnumeric:
        hint = f"; for class labels in {target!r} pass task='classification'" if target in nonnumeric else ""
        raise ValueError(
            f"columns {nonnumeric} are not numeric; encode them first "
            f"(e.g. pandas.get_dummies) or leave them out of features={hint}"
        )
    nan = [c for c in [*features, target] if frame[c].isna().any()]
    if nan:
        raise ValueError(f"columns {nan} contain missing values; drop or impute them first (e.g. frame.dropna())")
    options.setdefault("name", target)
    return from_arrays(frame[features].to_numpy(), frame[target].to_numpy(), **options)


@dataclass(frozen=True)
class _Entry:
    loader: Callable[..., Dataset]
    kind: str  # "synthetic", "file" or "bundled" (ships with scikit-learn)
    summary: str
    task: str = "regression"  # or "classification"


#: name -> registry entry; filled by the ``synthetic``, ``files``, ``classification``, ... modules.
REGISTRY: dict[str, _Entry] = {}


def register(
    name: str, kind: str, summary: str, task: str = "regression"
) -> Callable[[Callable[..., Dataset]], Callable[..., Dataset]]:
    task = _check_task(task)

    def deco(fn: Callable[..., Dataset]) -> Callable[..., Dataset]:
        REGISTRY[name] = _Entry(fn, kind, summary, task)
        return fn

    return deco
