"""Loaders for the real data sets in the shared data directory (formats in its ``README.md``).

The directory (:func:`~pyro_bnnlv.datasets.base.default_data_dir`), the checksums and the
downloads on first use (``download=True``, ``mirror=``) are
:func:`~pyro_bnnlv.datasets.fetch.fetch_dataset`'s.

* UCI sets with the standard PBP / MC-dropout splits (``uci/<folder>/``): ``split`` selects one
  of the 20 (protein: 5) train/test partitions; ``valid_fraction`` of the training rows (a
  seeded random subset) become the validation set.
* Sets without standard splits (LIDAR, motorcycle, airfoil, abalone) get a seeded random
  70% / 20% / 10% train / validation / test split, the proportions of
  Yacoby, Pan & Doshi-Velez (2022), arXiv:1911.00569, App. F.1.

Real data are standardised with training statistics by default.
"""

from __future__ import annotations

import numbers
import os
from pathlib import Path

import numpy as np

from .._checks import check_seed
from .base import Dataset, make_dataset, random_holdout, register
from .fetch import fetch_dataset

__all__ = ["TABLES", "UCI_FOLDERS", "load_table", "load_uci", "uci_num_splits"]

#: dataset name -> folder under ``uci/``
UCI_FOLDERS = {
    "boston": "bostonHousing",
    "concrete": "concrete",
    "energy": "energy",
    "kin8nm": "kin8nm",
    "naval": "naval-propulsion-plant",
    "power": "power-plant",
    "protein": "protein-tertiary-structure",
    "wine": "wine-quality-red",
    "yacht": "yacht",
}

#: dataset name -> (relative path, loader kind, description)
TABLES = {
    "lidar": ("hetero/lidar.csv", "csv", "LIDAR (Sigrist 1994): logratio against range, 221 points"),
    "mcycle": ("hetero/mcycle.csv", "csv", "Motorcycle (Silverman 1985): accel against times, 133 points"),
    "airfoil": ("uci_extra/airfoil", "uci", "UCI airfoil self-noise, 1503 points, 5 inputs"),
    "abalone": ("uci_extra/abalone", "uci", "UCI abalone (one-hot sex), 4177 points, 10 inputs"),
}


def _resolve(
    name: str, data_dir: str | Path | None, rel: str, download: bool, mirror: str | os.PathLike | None
) -> Path:
    """``rel`` inside the data directory, once every file of ``name`` is there and verified."""
    return fetch_dataset(name, data_dir, download=download, mirror=mirror) / rel


def _read_uci_matrix(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    data = np.loadtxt(folder / "data.txt")
    features = np.loadtxt(folder / "index_features.txt", dtype=int, ndmin=1)
    target = int(np.loadtxt(folder / "index_target.txt", dtype=int))
    return data[:, features], data[:, target]


def uci_num_splits(
    name: str, data_dir: str | Path | None = None, download: bool = True, mirror: str | os.PathLike | None = None
) -> int:
    """How many standard splits the UCI set ``name`` has (20; protein 5)."""
    if name not in UCI_FOLDERS:
        raise ValueError(f"unknown UCI dataset {name!r}; expected one of {sorted(UCI_FOLDERS)}")
    folder = _resolve(name, data_dir, f"uci/{UCI_FOLDERS[name]}", download, mirror)
    return int(np.loadtxt(folder / "n_splits.txt"))


def load_uci(
    name: str,
    split: int = 0,
    seed: int = 0,
    valid_fraction: float = 0.1,
    standardize: bool = True,
    data_dir: str | Path | None = None,
    download: bool = True,
    mirror: str | os.PathLike | None = None,
) -> Dataset:
    """A UCI set with its standard ``split`` (0-based); validation = ``valid_fraction`` of train.

    Missing files are downloaded on first use unless ``download=False``, from ``mirror`` (else
    ``$PYRO_BNNLV_MIRROR``, else the public source)."""
    if name not in UCI_FOLDERS:
        raise ValueError(f"unknown UCI dataset {name!r}; expected one of {sorted(UCI_FOLDERS)}")
    folder = _resolve(name, data_dir, f"uci/{UCI_FOLDERS[name]}", download, mirror)
    n_splits = uci_num_splits(name, data_dir, download, mirror)
    if isinstance(split, bool) or not isinstance(split, numbers.Integral) or not 0 <= split < n_splits:
        raise ValueError(
            f"split must be an integer in [0, {n_splits}) for {name} (the index of a standard split), got {split!r}"
        )
    split = int(split)
    x, y = _read_uci_matrix(folder)
    train = np.loadtxt(folder / f"index_train_{split}.txt", dtype=int)
    test = np.loadtxt(folder / f"index_test_{split}.txt", dtype=int)
    if not 0.0 <= valid_fraction < 1.0:
        raise ValueError(f"valid_fraction must lie in [0, 1), got {valid_fraction}")
    train, valid = random_holdout(train, int(round(valid_fraction * len(train))), seed)
    return make_dataset(
        name,
        {"train": (x[train], y[train]), "valid": (x[valid], y[valid]), "test": (x[test], y[test])},
        standardize=standardize,
        description=f"UCI {name} ({UCI_FOLDERS[name]}), standard split {split} of {n_splits}",
    )


def load_table(
    name: str,
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.7, 0.2, 0.1),
    standardize: bool = True,
    data_dir: str | Path | None = None,
    download: bool = True,
    mirror: str | os.PathLike | None = None,
) -> Dataset:
    """LIDAR, motorcycle, airfoil or abalone with a seeded random train/valid/test split; missing
    files are downloaded as by :func:`load_uci`."""
    if name not in TABLES:
        raise ValueError(f"unknown dataset {name!r}; expected one of {sorted(TABLES)}")
    rel, kind, description = TABLES[name]
    path = _resolve(name, data_dir, rel, download, mirror)
    if kind == "csv":
        table = np.loadtxt(path, delimiter=",", skiprows=1)
        x, y = table[:, :1], table[:, 1]
    else:
        x, y = _read_uci_matrix(path)
    if len(fractions) != 3 or abs(sum(fractions) - 1.0) > 1e-9 or min(fractions) <= 0:
        raise ValueError(f"fractions must be three positive numbers summing to 1, got {fractions}")
    perm = np.random.default_rng(check_seed(seed)).permutation(len(x))
    n_tr = int(round(fractions[0] * len(x)))
    n_va = int(round(fractions[1] * len(x)))
    parts = perm[:n_tr], perm[n_tr : n_tr + n_va], perm[n_tr + n_va :]
    splits = {k: (x[p], y[p]) for k, p in zip(("train", "valid", "test"), parts)}
    return make_dataset(
        name, splits, standardize=standardize, description=f"{description}; random {fractions} split, seed {seed}"
    )


def _register_files() -> None:
    for name, folder in UCI_FOLDERS.items():

        def loader(seed: int = 0, _name: str = name, **kw) -> Dataset:
            return load_uci(_name, seed=seed, **kw)

        register(name, "file", f"UCI {folder}, standard splits (split=0..)")(loader)
    for name, (_, _, description) in TABLES.items():

        def loader(seed: int = 0, _name: str = name, **kw) -> Dataset:
            return load_table(_name, seed=seed, **kw)

        register(name, "file", description)(loader)


_register_files()
