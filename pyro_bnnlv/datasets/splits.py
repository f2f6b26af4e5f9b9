"""Split schemes that test in-between and out-of-range prediction, on any loaded :class:`Dataset`.

* **Gap splits** (Foong, Li, Hernández-Lobato & Turner 2019, arXiv:1906.11537, sec. 3): for each
  input dimension ``d``, sort the points by ``x_d``; the middle third is the test set, the outer two
  thirds the training set, of which ``valid_fraction`` (10%) is a seeded random validation set. A
  data set with ``D`` inputs has ``D`` gap splits (:func:`gap_splits`).
* **Extrapolation and interpolation splits** (Pradier, Pan, Yao, Ghosh & Doshi-Velez 2018,
  arXiv:1811.07006, App. B): order the points by the L2 norm of their (standardised) inputs; 80%
  train / 10% validation / 10% test. The extrapolation test set is the 5% of points with the lowest
  and the 5% with the highest norm; the interpolation test set is "the complementary one (an
  inverted doughnut)", which we read as the 10% of points with the middle norms (ranks 45%-55%), so
  that training norms lie on both sides of every test norm. Validation is a seeded random 10% of all
  points drawn from the rest.

All functions pool the data set's train, validation and test points (mapped back to the original
scale), re-split them, and re-standardise with the new training statistics (if the input data
set was standardised). ``extras`` of the input are dropped; the new data set's ``extras`` hold
the pooled-row indices of each part (``idx_train``, ``idx_valid``, ``idx_test``) and, for gap
splits, the split dimension ``gap_dim``. Ties (e.g. energy's discrete inputs) are broken by the
pooled order (a stable sort), so the splits are deterministic.

Norms for the extrapolation / interpolation splits are computed on inputs standardised with the
pooled data's mean and standard deviation (constant columns get standard deviation 1), so that no
feature dominates by its units alone; the paper does not say which scale it used.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_fraction
from .base import Dataset, make_dataset, random_holdout

__all__ = ["extrapolation_split", "gap_split", "gap_splits", "interpolation_split", "pooled_data"]


def pooled_data(dataset: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """All points of ``dataset`` (train, then validation, then test) on the original scale."""
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a pyro_bnnlv Dataset, got {type(dataset).__name__}")
    xm, xs = dataset.x_mean.double().numpy(), dataset.x_std.double().numpy()
    ym, ys = float(dataset.y_mean), float(dataset.y_std)
    x = np.concatenate([t.double().numpy() for t in (dataset.x_train, dataset.x_valid, dataset.x_test)])
    y = np.concatenate([t.double().numpy().reshape(-1) for t in (dataset.y_train, dataset.y_valid, dataset.y_test)])
    return x * xs + xm, y * ys + ym


def _build(
    dataset: Dataset,
    x: np.ndarray,
    y: np.ndarray,
    train: np.ndarray,
    valid: np.ndarray,
    test: np.ndarray,
    name: str,
    description: str,
    standardize: bool | None,
    extras: dict,
) -> Dataset:
    if len(train) == 0 or len(test) == 0:
        raise ValueError(f"{dataset.name}: too few points ({len(x)}) for this split")
    std = dataset.standardized if standardize is None else bool(standardize)
    extras = dict(extras, idx_train=train, idx_valid=valid, idx_test=test)
    return make_dataset(
        name,
        {"train": (x[train], y[train]), "valid": (x[valid], y[valid]), "test": (x[test], y[test])},
        standardize=std,
        description=description,
        extras=extras,
    )


def gap_split(
    dataset: Dataset, dim: int, *, valid_fraction: float = 0.1, seed: int = 0, standardize: bool | None = None
) -> Dataset:
    """The gap split of ``dataset`` along input dimension ``dim`` (module docstring).

    Test: the ``round(N / 3)`` points in the middle of the ``x_dim`` order (equally many below and
    above, up to one); train: the rest minus ``round(valid_fraction * n_rest)`` random validation
    points (seeded by ``seed``). ``standardize`` defaults to ``dataset.standardized``.
    """
    check_fraction(valid_fraction, "valid_fraction")
    x, y = pooled_data(dataset)
    N, D = x.shape
    if not (isinstance(dim, (int, np.integer)) and 0 <= dim < D):
        raise ValueError(f"dim must be an integer in [0, {D}), got {dim!r}")
    order = np.argsort(x[:, dim], kind="stable")
    n_test = int(round(N / 3))
    lo = (N - n_test) // 2
    test = np.sort(order[lo : lo + n_test])
    rest = np.concatenate([order[:lo], order[lo + n_test :]])
    train, valid = random_holdout(rest, int(round(valid_fraction * len(rest))), seed)
    return _build(
        dataset,
        x,
        y,
        train,
        valid,
        test,
        f"{dataset.name}-gap{dim}",
        f"{dataset.name}: gap split on input {dim} (middle third is the test set)",
        standardize,
        {"gap_dim": np.array(dim)},
    )


def gap_splits(dataset: Dataset, **options) -> list[Dataset]:
    """One :func:`gap_split` per input dimension (``options`` go to each)."""
    return [gap_split(dataset, d, **options) for d in range(dataset.input_dim)]


def _norm_order(x: np.ndarray) -> np.ndarray:
    mean, std = x.mean(0), x.std(0)
    std = np.where(std > 1e-10 * np.maximum(1.0, np.abs(mean)), std, 1.0)
    return np.argsort(np.linalg.norm((x - mean) / std, axis=1), kind="stable")


def _norm_split(dataset, kind, test_fraction, valid_fraction, seed, standardize) -> Dataset:
    check_fraction(test_fraction, "test_fraction")
    check_fraction(valid_fraction, "valid_fraction")
    if test_fraction + valid_fraction >= 1.0:
        raise ValueError(f"test_fraction + valid_fraction must be < 1, got {test_fraction + valid_fraction}")
    x, y = pooled_data(dataset)
    N = len(x)
    order = _norm_order(x)
    n_test = int(round(test_fraction * N))
    if kind == "extrapolation":
        n_low = n_test // 2
        test_pos = np.r_[np.arange(n_low), np.arange(N - (n_test - n_low), N)]
        what = "lowest and highest input norms"
    else:
        lo = (N - n_test) // 2
        test_pos = np.arange(lo, lo + n_test)
        what = "middle input norms"
    mask = np.zeros(N, dtype=bool)
    mask[test_pos] = True
    test, rest = np.sort(order[mask]), order[~mask]
    train, valid = random_holdout(rest, int(round(valid_fraction * N)), seed)
    return _build(
        dataset,
        x,
        y,
        train,
        valid,
        test,
        f"{dataset.name}-{kind}",
        f"{dataset.name}: {kind} split (test: the {test_fraction:.0%} with the {what})",
        standardize,
        {},
    )


def extrapolation_split(
    dataset: Dataset,
    *,
    test_fraction: float = 0.1,
    valid_fraction: float = 0.1,
    seed: int = 0,
    standardize: bool | None = None,
) -> Dataset:
    """Extrapolation split (Pradier, Pan, Yao, Ghosh & Doshi-Velez 2018, arXiv:1811.07006, App. B):
    test = half of ``test_fraction`` of the points with the lowest and half with the highest input
    norms; validation = a random ``valid_fraction`` of all points from the rest; train = the
    remainder."""
    return _norm_split(dataset, "extrapolation", test_fraction, valid_fraction, seed, standardize)


def interpolation_split(
    dataset: Dataset,
    *,
    test_fraction: float = 0.1,
    valid_fraction: float = 0.1,
    seed: int = 0,
    standardize: bool | None = None,
) -> Dataset:
    """Interpolation split (App. B, "inverted doughnut"): test = the ``test_fraction`` of points
    with the middle input norms; validation and train as in :func:`extrapolation_split`."""
    return _norm_split(dataset, "interpolation", test_fraction, valid_fraction, seed, standardize)
