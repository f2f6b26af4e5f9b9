"""Gap splits and extrapolation / interpolation splits: sizes, disjointness, the ordering property,
re-standardisation, determinism."""

import numpy as np
import pytest
import torch

from pyro_bnnlv.datasets import (
    Dataset,
    default_data_dir,
    extrapolation_split,
    gap_split,
    gap_splits,
    interpolation_split,
    load_dataset,
    pooled_data,
)
from pyro_bnnlv.datasets.base import make_dataset

needs_data = pytest.mark.skipif(not (default_data_dir() / "uci").exists(), reason="shared data directory not found")


def _toy(n=301, d=3, seed=0, standardize=True) -> Dataset:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * np.arange(1, d + 1) + 5.0
    y = x.sum(1) + rng.normal(size=n)
    cut = [int(0.7 * n), int(0.8 * n)]
    parts = np.split(np.arange(n), cut)
    return make_dataset(
        "toy",
        {k: (x[p], y[p]) for k, p in zip(("train", "valid", "test"), parts)},
        standardize=standardize,
        description="toy",
    )


def _indices(ds):
    return [ds.extras[f"idx_{k}"].long().numpy() for k in ("train", "valid", "test")]


def _check_partition(ds, n):
    tr, va, te = _indices(ds)
    everything = np.concatenate([tr, va, te])
    assert len(everything) == n and len(np.unique(everything)) == n  # disjoint and complete
    assert ds.sizes == (len(tr), len(va), len(te))
    return tr, va, te


def test_pooled_data_inverts_the_standardisation():
    ds = _toy()
    x, y = pooled_data(ds)
    raw = _toy(standardize=False)
    # float32 storage: agreement to float32 resolution of values of order 10
    np.testing.assert_allclose(x, pooled_data(raw)[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(y, pooled_data(raw)[1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("n", [300, 301, 302])
def test_gap_split_sizes_disjointness_and_the_gap(n):
    ds = _toy(n)
    x, y = pooled_data(ds)
    for d, split in enumerate(gap_splits(ds, seed=1)):
        assert split.name == f"toy-gap{d}" and int(split.extras["gap_dim"]) == d
        tr, va, te = _check_partition(split, n)
        assert len(te) == round(n / 3)
        assert len(va) == round(0.1 * (n - len(te)))
        outer = np.concatenate([tr, va])
        below, above = outer[x[outer, d] < x[te, d].min()], outer[x[outer, d] > x[te, d].max()]
        assert len(below) + len(above) == len(outer)  # every training point is outside the gap
        assert abs(len(below) - len(above)) <= 1  # the middle third: as many below as above
        # the test points are exactly the middle third of the sorted dimension
        ranks = np.argsort(np.argsort(x[:, d], kind="stable"), kind="stable")
        assert set(ranks[te]) == set(range((n - len(te)) // 2, (n - len(te)) // 2 + len(te)))
        # re-standardised with the new training statistics, on the right rows
        assert split.standardized
        torch.testing.assert_close(split.x_train.mean(0), torch.zeros(3), atol=1e-5, rtol=0)
        torch.testing.assert_close(
            split.x_test * split.x_std + split.x_mean, torch.as_tensor(x[te], dtype=torch.float32), rtol=1e-5, atol=1e-4
        )
        torch.testing.assert_close(
            split.y_test * split.y_std + split.y_mean, torch.as_tensor(y[te], dtype=torch.float32), rtol=1e-5, atol=1e-4
        )


def test_splits_are_deterministic_and_seeded():
    ds = _toy()
    a, b, c = gap_split(ds, 1, seed=0), gap_split(ds, 1, seed=0), gap_split(ds, 1, seed=1)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.x_valid, b.x_valid)
    assert torch.equal(a.extras["idx_test"], c.extras["idx_test"])  # the seed does not move the test set ...
    assert not torch.equal(a.extras["idx_valid"], c.extras["idx_valid"])  # ... validation does
    e1, e2 = extrapolation_split(ds, seed=3), extrapolation_split(ds, seed=3)
    assert torch.equal(e1.x_train, e2.x_train)


def _norms(x):
    std = x.std(0)
    return np.linalg.norm((x - x.mean(0)) / std, axis=1)


@pytest.mark.parametrize("n", [400, 403])
def test_extrapolation_and_interpolation_splits(n):
    ds = _toy(n)
    x, _ = pooled_data(ds)
    r = _norms(x)
    ext = extrapolation_split(ds)
    tr, va, te = _check_partition(ext, n)
    assert len(te) == round(0.1 * n) and len(va) == round(0.1 * n)
    inner = np.concatenate([tr, va])
    low, high = te[r[te] < r[inner].min()], te[r[te] > r[inner].max()]
    assert len(low) + len(high) == len(te) and abs(len(low) - len(high)) <= 1
    itp = interpolation_split(ds)
    tr, va, te = _check_partition(itp, n)
    assert len(te) == round(0.1 * n) and len(va) == round(0.1 * n)
    outer = np.concatenate([tr, va])
    lo_, hi_ = outer[r[outer] < r[te].min()], outer[r[outer] > r[te].max()]
    assert len(lo_) + len(hi_) == len(outer) and abs(len(lo_) - len(hi_)) <= 1
    assert ext.name == "toy-extrapolation" and itp.name == "toy-interpolation"


def test_unstandardised_input_stays_unstandardised():
    ds = _toy(standardize=False)
    split = gap_split(ds, 0)
    assert not split.standardized
    assert float(split.y_std) == 1.0
    assert gap_split(ds, 0, standardize=True).standardized


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda ds: gap_split(ds, 3), "dim"),
        (lambda ds: gap_split(ds, 0, valid_fraction=1.0), "valid_fraction"),
        (lambda ds: extrapolation_split(ds, test_fraction=-0.1), "test_fraction"),
        (lambda ds: interpolation_split(ds, test_fraction=0.6, valid_fraction=0.5), "test_fraction"),
    ],
)
def test_bad_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call(_toy())


def test_not_a_dataset_raises():
    with pytest.raises(TypeError, match="Dataset"):
        gap_split((torch.zeros(3, 1), torch.zeros(3)), 0)


@needs_data
def test_gap_splits_of_energy_have_the_stated_sizes():
    ds = load_dataset("energy", split=0)
    splits = gap_splits(ds)
    assert len(splits) == 8
    for s in splits:
        n_tr, n_va, n_te = s.sizes
        assert n_te == 256 and n_va == 51 and n_tr == 461  # 768 points: 256 test, 512 outer
        assert torch.isfinite(s.x_train).all() and torch.isfinite(s.x_test).all()
