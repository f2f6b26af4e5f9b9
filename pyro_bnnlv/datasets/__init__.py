"""Data sets of the papers: synthetic generators and loaders for the shared real data.

``load_dataset(name, seed=0, **options)`` is the single entry point; ``list_datasets()`` gives
the names with a one-line summary; ``load_split(name, k)`` is the ``k``-th of repeated
train/test splits, whatever kind of set ``name`` is. Names are lower case with hyphens (``heavy-tail``); an
underscore spelling (``heavy_tail``) is accepted too. Your own data: :func:`from_arrays`
(tensors or arrays) and :func:`from_frame` (a pandas ``DataFrame``) give the same
:class:`Dataset` with a seeded random split.
"""

from __future__ import annotations

import warnings

import pandas as pd

from .._checks import check_seed

# registers the loaders, synthetic first
from . import synthetic, files, projected_toys, ncai_family, classification  # noqa: F401, I001
from .base import (
    DATA_DIR_ENV,
    REGISTRY,
    Dataset,
    _canonical,
    default_data_dir,
    encode_labels,
    from_arrays,
    from_frame,
    stratified_split,
)
from .fetch import MIRROR_ENV, DatasetUnavailableError, dataset_status, fetch_dataset
from .files import UCI_FOLDERS, load_table, load_uci, uci_num_splits
from .oracle import ORACLE_DATASETS, OracleLL, expected_test_ll, true_log_density
from .splits import extrapolation_split, gap_split, gap_splits, interpolation_split, pooled_data

__all__ = [
    "DATA_DIR_ENV",
    "MIRROR_ENV",
    "ORACLE_DATASETS",
    "Dataset",
    "DatasetUnavailableError",
    "OracleLL",
    "dataset_status",
    "default_data_dir",
    "encode_labels",
    "expected_test_ll",
    "extrapolation_split",
    "fetch_dataset",
    "from_arrays",
    "from_frame",
    "gap_split",
    "gap_splits",
    "interpolation_split",
    "list_datasets",
    "load_dataset",
    "load_split",
    "load_table",
    "load_uci",
    "pooled_data",
    "stratified_split",
    "true_log_density",
]


def load_dataset(name: str, seed: int = 0, **options) -> Dataset:
    """Load data set ``name`` (see :func:`list_datasets`); ``ValueError`` for an unknown name.

    Args:
        seed: what it seeds depends on the set.

            * UCI sets (boston, concrete, energy, kin8nm, naval, power, protein, wine, yacht):
              the random ``valid_fraction`` (10%) of the training part held out for validation.
              It also moves the standardisation statistics, computed on the remaining training
              rows. It does **not** choose the train/test split: that is ``split=``.
            * lidar, mcycle, airfoil, abalone: the random 70/20/10 train/valid/test split.
            * synthetic sets: the generator (every point changes).
            * classification sets (digits, digits-ood, breast-cancer, iris, wine-classes,
              two-moons, spirals): the stratified random split, and the points of two-moons and
              spirals.
        options: passed to the loader. ``split=k`` (UCI only): the ``k``-th of the standard
            PBP / MC-dropout train/test splits (0-based; 20 per set, protein 5). Others:
            ``standardize`` (default ``True`` for real sets and every classification set,
            ``False`` for synthetic regression ones), ``sizes`` (synthetic train/valid/test
            sizes), ``valid_fraction`` (UCI), ``fractions`` (the random-split sets, and the
            classification sets bundled with scikit-learn: default 60/20/20), ``noise``
            (two-moons, spirals); for the real sets ``data_dir``, ``download`` and ``mirror``
            (a URL or directory in the data directory's layout to download from, instead of
            ``$PYRO_BNNLV_MIRROR`` or the public source).

    The returned :class:`Dataset` records ``split`` and ``seed`` (shown by its ``repr``).
    Example: ``load_dataset("yacht", split=3, seed=0)`` is the fourth standard split with the
    validation subset drawn by seed 0.
    """
    key = _canonical(name)
    seed = check_seed(seed)
    if key not in REGISTRY:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(sorted(REGISTRY))}")
    if key in UCI_FOLDERS and seed != 0 and "split" not in options:
        warnings.warn(
            f"load_dataset({key!r}, seed={seed}): for a UCI set seed only redraws the validation subset; "
            "the train/test split stays split=0. For repeated train/test splits use "
            f"pb.datasets.load_split({key!r}, k); pass split= explicitly to keep this one and silence this",
            UserWarning,
            stacklevel=2,
        )
    data = REGISTRY[key].loader(seed=seed, **options)
    data.seed = seed
    if key in UCI_FOLDERS:
        data.split = int(options.get("split", 0))
    return data


def load_split(name: str, index: int, **options) -> Dataset:
    """The ``index``-th of repeated train/test splits of ``name``, for "mean over k splits" tables.

    ``load_dataset``'s ``seed`` does not choose a UCI set's train/test split (``split=`` does), so
    ``load_dataset(name, seed=k)`` for k = 0..9 evaluates ten fits on one test set. This picks:

    * UCI sets: standard split ``index`` (PBP / MC-dropout), its validation subset seeded by
      ``index`` too; ``ValueError`` past the set's number of standard splits (20; protein 5);
    * every other set: ``seed=index`` (the random-split sets' random split, the synthetic sets'
      generator).

    ``options`` go to :func:`load_dataset` (not ``seed`` or ``split``).
    """
    key = _canonical(name)
    index = check_seed(index)
    clash = {"seed", "split"} & set(options)
    if clash:
        raise ValueError(f"load_split chooses {sorted(clash)} from index={index}; leave them out of the options")
    if key in UCI_FOLDERS:
        n = uci_num_splits(key, options.get("data_dir"), options.get("download", True), options.get("mirror"))
        if index >= n:
            raise ValueError(f"{key} has {n} standard train/test splits (0..{n - 1}); index={index} is past them")
        return load_dataset(key, seed=index, split=index, **options)
    return load_dataset(key, seed=index, **options)


def list_datasets() -> pd.DataFrame:
    """Names, kind (synthetic / file / bundled with scikit-learn), task (regression /
    classification) and a one-line summary of every data set."""
    rows = [(n, e.kind, e.task, e.summary) for n, e in REGISTRY.items()]
    return pd.DataFrame(rows, columns=["name", "kind", "task", "summary"]).set_index("name")
