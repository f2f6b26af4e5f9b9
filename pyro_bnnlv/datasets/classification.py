r"""Classification data sets (issue 42): no download, labels ``0..K-1`` as ``torch.long``.

Sets bundled with scikit-learn (a development dependency, imported only when one of them is
loaded; ``pip install scikit-learn``):

* ``digits``: the 8x8 handwritten digits of the UCI "Optical Recognition of Handwritten Digits"
  set (Alpaydin & Kaynak 1998) as scikit-learn ships them: 1,797 images, 64 inputs (pixel
  counts 0-16), ``K = 10``;
* ``digits-ood``: the digits 0-4 only (``K = 5``), the images of 5-9 as ``extras["x_ood"]``;
* ``breast-cancer``: Wisconsin Diagnostic Breast Cancer (Street, Wolberg & Mangasarian 1993),
  569 rows, 30 inputs, ``K = 2`` (0 malignant, 1 benign, scikit-learn's coding);
* ``iris``: Fisher (1936), 150 rows, 4 inputs, ``K = 3``;
* ``wine-classes``: UCI Wine recognition (Forina et al.; three cultivars), 178 rows, 13 inputs,
  ``K = 3``. (``wine`` is the UCI wine-quality *regression* set.)

These get a seeded stratified random split (:func:`~pyro_bnnlv.datasets.base.stratified_split`),
``fractions=(0.6, 0.2, 0.2)`` train / validation / test by default.

Synthetic sets (``sizes=(n_train, n_valid, n_test)``, default ``(300, 100, 100)``; ``seed`` draws
the points and the split):

* ``two-moons``: ``sklearn.datasets.make_moons`` (noise sd ``noise``, default 0.2), split stratified;
* ``spirals``: two interleaved spirals, the "two-spirals" problem of Lang & Witbrock (1988) with
  continuous positions: for class ``c in {0, 1}`` and ``t ~ U(0.1, 1)``,
  ``x = t (cos a, sin a) + eps`` with ``a = 2 pi turns t + pi c`` and ``eps ~ N(0, noise^2 I)``
  (``turns = 1.5``, ``noise = 0.05`` by default); classes alternate so each split is balanced up to one.

Every classification set standardises its inputs with the training statistics by default
(``standardize=True``); labels are never standardised (``y_mean = 0``, ``y_std = 1``).
``data.num_classes`` is ``K`` and ``data.class_names`` names each label.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._checks import check_real, check_seed
from .base import Dataset, make_dataset, register, stratified_split
from .synthetic import _check_sizes

__all__ = ["breast_cancer", "digits", "digits_ood", "iris", "spirals", "two_moons", "wine_classes"]

DEFAULT_FRACTIONS = (0.6, 0.2, 0.2)


def _sklearn_datasets(name: str) -> Any:
    """``sklearn.datasets``, or an ``ImportError`` that says how to get it."""
    try:
        from sklearn import datasets
    except ImportError:
        raise ImportError(
            f"the data set {name!r} comes from scikit-learn, which is not installed: "
            f"pip install scikit-learn (or pip install -e '.[dev]')"
        ) from None
    return datasets


def _check_fractions(fractions: Any) -> tuple[float, float, float]:
    try:
        f = tuple(float(v) for v in fractions)
    except (TypeError, ValueError):
        f = ()
    if len(f) != 3 or abs(sum(f) - 1.0) > 1e-9 or min(f) <= 0:
        raise ValueError(
            f"fractions must be three positive numbers (train, valid, test) summing to 1, got {fractions!r}"
        )
    return f


def _split(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    n_valid: int,
    n_test: int,
    seed: int | None,
    *,
    standardize: bool,
    description: str,
    class_names: Sequence[str],
    extras: dict | None = None,
) -> Dataset:
    """A stratified ``(N - n_valid - n_test) / n_valid / n_test`` split of labels ``y`` (``0..K-1``)."""
    train, valid, test = stratified_split(y, n_valid, n_test, seed)
    splits = {k: (x[i], y[i]) for k, i in (("train", train), ("valid", valid), ("test", test))}
    return make_dataset(
        name,
        splits,
        standardize=standardize,
        description=description,
        extras=extras,
        num_classes=len(class_names),
        class_names=class_names,
    )


def _bundled(name: str, loader: str, seed: int, fractions: Any, standardize: bool, what: str) -> Dataset:
    bunch = getattr(_sklearn_datasets(name), loader)()
    f = _check_fractions(fractions)
    x, y = np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64)
    N = len(y)
    return _split(
        name,
        x,
        y,
        round(f[1] * N),
        round(f[2] * N),
        check_seed(seed),
        standardize=standardize,
        class_names=[str(c) for c in bunch.target_names],
        description=f"{what}; stratified random {f[0]:g}/{f[1]:g}/{f[2]:g} split, seed {seed}",
    )


@register(
    "digits", "bundled", "8x8 handwritten digits (scikit-learn), 1797 images, 64 inputs, K=10", task="classification"
)
def digits(seed: int = 0, standardize: bool = True, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> Dataset:
    """UCI optical digits, 8x8 (scikit-learn's ``load_digits``): 1,797 images, ``K = 10``."""
    return _bundled(
        "digits",
        "load_digits",
        seed,
        fractions,
        standardize,
        "8x8 handwritten digits 0-9 (UCI optdigits via scikit-learn), 64 pixel inputs 0-16",
    )


@register(
    "breast-cancer",
    "bundled",
    "Wisconsin diagnostic breast cancer (scikit-learn), 569 rows, 30 inputs, K=2",
    task="classification",
)
def breast_cancer(seed: int = 0, standardize: bool = True, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> Dataset:
    """Wisconsin diagnostic breast cancer (``load_breast_cancer``): 0 malignant, 1 benign."""
    return _bundled(
        "breast-cancer",
        "load_breast_cancer",
        seed,
        fractions,
        standardize,
        "Wisconsin diagnostic breast cancer, 30 inputs, 0 malignant / 1 benign",
    )


@register("iris", "bundled", "Fisher's iris (scikit-learn), 150 rows, 4 inputs, K=3", task="classification")
def iris(seed: int = 0, standardize: bool = True, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> Dataset:
    """Fisher's iris (``load_iris``): setosa, versicolor, virginica."""
    return _bundled("iris", "load_iris", seed, fractions, standardize, "Fisher's iris, 4 inputs, 3 species")


@register(
    "wine-classes", "bundled", "UCI wine recognition (scikit-learn), 178 rows, 13 inputs, K=3", task="classification"
)
def wine_classes(seed: int = 0, standardize: bool = True, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> Dataset:
    """UCI wine recognition (``load_wine``): three cultivars; not ``wine`` (wine-quality regression)."""
    return _bundled(
        "wine-classes",
        "load_wine",
        seed,
        fractions,
        standardize,
        "UCI wine recognition, 13 chemical inputs, 3 cultivars",
    )


@register("digits-ood", "bundled", "digits 0-4 (K=5); the digits 5-9 as extras['x_ood']", task="classification")
def digits_ood(seed: int = 0, standardize: bool = True, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> Dataset:
    """Digits 0-4 split as :func:`digits` (``K = 5``); all images of 5-9 are ``extras["x_ood"]``
    (standardised with the training statistics) with their digits in ``extras["digit_ood"]``."""
    bunch = _sklearn_datasets("digits-ood").load_digits()
    f = _check_fractions(fractions)
    x, y = np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64)
    inside = y < 5
    N = int(inside.sum())
    return _split(
        "digits-ood",
        x[inside],
        y[inside],
        round(f[1] * N),
        round(f[2] * N),
        check_seed(seed),
        standardize=standardize,
        class_names=[str(c) for c in range(5)],
        extras={"x_ood": x[~inside], "digit_ood": y[~inside]},
        description=f"8x8 digits 0-4 (K=5), the digits 5-9 out of distribution; stratified random "
        f"{f[0]:g}/{f[1]:g}/{f[2]:g} split, seed {seed}",
    )


@register(
    "two-moons", "synthetic", "two interleaved half circles (make_moons), noise 0.2, 300/100/100", task="classification"
)
def two_moons(
    seed: int = 0, standardize: bool = True, sizes: Sequence[int] = (300, 100, 100), noise: float = 0.2
) -> Dataset:
    """``sklearn.datasets.make_moons(sum(sizes), noise=noise, random_state=seed)``, split stratified."""
    sizes = _check_sizes(sizes)
    noise = check_real(noise, "noise", nonnegative=True)
    seed = check_seed(seed)
    x, y = _sklearn_datasets("two-moons").make_moons(sum(sizes), noise=noise, random_state=seed)
    return _split(
        "two-moons",
        x,
        y.astype(np.int64),
        sizes[1],
        sizes[2],
        seed,
        standardize=standardize,
        class_names=("0", "1"),
        description=f"two moons (make_moons), noise {noise:g}; sizes {sizes}, seed {seed}",
    )


@register("spirals", "synthetic", "two interleaved spirals, 1.5 turns, noise 0.05, 300/100/100", task="classification")
def spirals(
    seed: int = 0,
    standardize: bool = True,
    sizes: Sequence[int] = (300, 100, 100),
    noise: float = 0.05,
    turns: float = 1.5,
) -> Dataset:
    """Two interleaved spirals (module docstring): ``x = t (cos a, sin a) + eps``, ``t ~ U(0.1, 1)``,
    ``a = 2 pi turns t + pi c``, ``eps ~ N(0, noise^2 I)``."""
    sizes = _check_sizes(sizes)
    noise = check_real(noise, "noise", nonnegative=True)
    turns = check_real(turns, "turns", positive=True)
    seed = check_seed(seed)
    rng = np.random.default_rng(seed)
    N = sum(sizes)
    c = np.arange(N) % 2
    t = rng.uniform(0.1, 1.0, N)
    a = 2 * np.pi * turns * t + np.pi * c
    x = t[:, None] * np.stack([np.cos(a), np.sin(a)], 1) + noise * rng.normal(size=(N, 2))
    return _split(
        "spirals",
        x,
        c,
        sizes[1],
        sizes[2],
        seed,
        standardize=standardize,
        class_names=("0", "1"),
        description=f"two spirals, {turns:g} turns, noise {noise:g}; sizes {sizes}, seed {seed}",
    )
