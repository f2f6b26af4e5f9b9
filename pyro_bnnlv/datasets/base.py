"""The :class:`Dataset` container, standardisation, and the dataset registry."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = ["Dataset", "DATA_DIR_ENV", "default_data_dir", "register", "REGISTRY", "make_dataset"]

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

    @property
    def input_dim(self) -> int:
        return self.x_train.shape[1]

    @property
    def sizes(self) -> tuple[int, int, int]:
        return len(self.x_train), len(self.x_valid), len(self.x_test)

    def __repr__(self) -> str:
        n_tr, n_va, n_te = self.sizes
        return (
            f"Dataset({self.name!r}, D={self.input_dim}, train={n_tr}, valid={n_va}, "
            f"test={n_te}, standardized={self.standardized})"
        )


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
        x_mean, x_std = x_tr.mean(0), x_tr.std(0)
        # constant columns: std is 0 up to rounding (naval's 0.998 column gives ~1e-16)
        x_std = np.where(x_std > 1e-10 * np.maximum(1.0, np.abs(x_mean)), x_std, 1.0)
        y_mean, y_std = float(y_tr.mean()), float(y_tr.std())
        if y_std <= 0:
            raise ValueError(f"dataset {name!r}: training targets are constant")
    else:
        x_mean, x_std, y_mean, y_std = np.zeros(D), np.ones(D), 0.0, 1.0
    out = {}
    for split in ("train", "valid", "test"):
        x, y = (np.asarray(a, dtype=np.float64) for a in splits[split])
        x = x.reshape(len(x), D)
        out[f"x_{split}"] = _to_tensor((x - x_mean) / x_std)
        out[f"y_{split}"] = _to_tensor((y.reshape(-1) - y_mean) / y_std)
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
    return Dataset(
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
