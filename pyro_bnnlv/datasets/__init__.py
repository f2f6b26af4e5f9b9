"""Data sets of the papers: synthetic generators and loaders for the shared real data.

``load_dataset(name, seed=0, **options)`` is the single entry point; ``list_datasets()`` gives
the names with a one-line summary. Names are lower case with hyphens (``heavy-tail``); an
underscore spelling (``heavy_tail``) is accepted too.
"""

from __future__ import annotations

import pandas as pd

from . import synthetic, files, projected_toys  # noqa: F401, I001  (registers the loaders, synthetic first)
from .base import DATA_DIR_ENV, REGISTRY, Dataset, default_data_dir
from .fetch import MIRROR_ENV, DatasetUnavailableError, dataset_status, fetch_dataset
from .files import load_table, load_uci
from .splits import extrapolation_split, gap_split, gap_splits, interpolation_split, pooled_data

__all__ = [
    "DATA_DIR_ENV",
    "MIRROR_ENV",
    "Dataset",
    "DatasetUnavailableError",
    "dataset_status",
    "fetch_dataset",
    "default_data_dir",
    "list_datasets",
    "load_dataset",
    "load_table",
    "load_uci",
    "extrapolation_split",
    "gap_split",
    "gap_splits",
    "interpolation_split",
    "pooled_data",
]


def _canonical(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be a data set name (a str, see list_datasets()), got {name!r}")
    return name.strip().lower().replace("_", "-")


def load_dataset(name: str, seed: int = 0, **options) -> Dataset:
    """Load data set ``name``; ``options`` go to its loader (``standardize``, ``sizes``,
    ``split``, ``data_dir``, ...). Raises ``ValueError`` for an unknown name."""
    key = _canonical(name)
    if key not in REGISTRY:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[key].loader(seed=seed, **options)


def list_datasets() -> pd.DataFrame:
    """Names, kind (synthetic / file) and a one-line summary of every data set."""
    rows = [(n, e.kind, e.summary) for n, e in REGISTRY.items()]
    return pd.DataFrame(rows, columns=["name", "kind", "summary"]).set_index("name")
