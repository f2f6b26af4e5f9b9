"""Classification data sets (issue 42): the bundled and synthetic sets of
pyro_bnnlv.datasets.classification, and from_arrays / from_frame with task="classification"."""

import sys

import numpy as np
import pandas as pd
import pytest
import torch

import pyro_bnnlv as pb
from pyro_bnnlv.datasets import encode_labels, from_arrays, from_frame, list_datasets, stratified_split
from pyro_bnnlv.datasets.base import make_dataset

pytest.importorskip("sklearn")

#: name -> (rows in train + valid + test, inputs, K)
SETS = {
    "digits": (1797, 64, 10),
    "digits-ood": (901, 64, 5),
    "breast-cancer": (569, 30, 2),
    "iris": (150, 4, 3),
    "wine-classes": (178, 13, 3),
    "two-moons": (500, 2, 2),
    "spirals": (500, 2, 2),
}


def _counts(data, split):
    return np.bincount(getattr(data, f"y_{split}").numpy(), minlength=data.num_classes)


@pytest.mark.parametrize("name", sorted(SETS))
def test_shapes_dtypes_labels_and_seeds(name):
    n, D, K = SETS[name]
    data = pb.load_dataset(name, seed=3)
    assert sum(data.sizes) == n and data.input_dim == D
    assert data.num_classes == K and len(data.class_names) == K and data.task == "classification"
    assert f"K={K}" in repr(data) and data.standardized and data.seed == 3
    assert float(data.y_mean) == 0.0 and float(data.y_std) == 1.0
    for split in ("train", "valid", "test"):
        x, y = getattr(data, f"x_{split}"), getattr(data, f"y_{split}")
        assert x.dtype == torch.get_default_dtype() and x.shape == (len(y), D)
        assert y.dtype == torch.long and y.dim() == 1
        assert int(y.min()) >= 0 and int(y.max()) < K
    assert (_counts(data, "train") > 0).all()  # every class in the training set
    again, other = pb.load_dataset(name, seed=3), pb.load_dataset(name, seed=4)
    assert torch.equal(again.x_train, data.x_train) and torch.equal(again.y_test, data.y_test)
    assert not torch.equal(other.x_train, data.x_train)
    assert list_datasets().loc[name, "task"] == "classification"


@pytest.mark.parametrize("name", ["iris", "breast-cancer", "digits"])
def test_split_is_stratified_sixty_twenty_twenty(name):
    data = pb.load_dataset(name, seed=0)
    n = sum(data.sizes)
    assert data.sizes[1] == round(0.2 * n) and data.sizes[2] == round(0.2 * n)
    total = sum(_counts(data, s) for s in ("train", "valid", "test"))
    for split, f in (("train", 0.6), ("valid", 0.2), ("test", 0.2)):
        assert np.abs(_counts(data, split) - f * total).max() < 1.5  # largest remainders: within one row
    if name == "iris":
        assert [_counts(data, s).tolist() for s in ("train", "valid", "test")] == [[30] * 3, [10] * 3, [10] * 3]
    other = pb.load_dataset(name, seed=0, fractions=(0.5, 0.25, 0.25))
    assert other.sizes[0] == n - 2 * round(0.25 * n)


def test_inputs_are_standardised_with_the_training_statistics():
    data = pb.load_dataset("wine-classes", seed=2)
    raw = pb.load_dataset("wine-classes", seed=2, standardize=False)
    assert not raw.standardized and torch.equal(raw.y_test, data.y_test)  # the split does not move
    x_train = raw.x_train.double()
    torch.testing.assert_close(data.x_mean.double(), x_train.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(data.x_std.double(), x_train.std(0, unbiased=False), rtol=1e-5, atol=1e-5)
    for split in ("train", "valid", "test"):
        expected = (getattr(raw, f"x_{split}") - data.x_mean) / data.x_std
        torch.testing.assert_close(getattr(data, f"x_{split}"), expected, rtol=1e-4, atol=1e-4)
    assert data.x_train.mean(0).abs().max() < 1e-4
    assert data.x_test.mean(0).abs().max() > 1e-3  # test inputs use the training statistics, not their own


def test_digits_ood_holds_out_five_to_nine_with_the_same_standardisation():
    from sklearn.datasets import load_digits

    data = pb.load_dataset("digits-ood", seed=1)
    in_dist = torch.cat([data.y_train, data.y_valid, data.y_test])
    assert set(in_dist.tolist()) == set(range(5)) and data.class_names == ("0", "1", "2", "3", "4")
    digit = data.extras["digit_ood"]
    assert digit.dtype == torch.long and set(digit.tolist()) == set(range(5, 10))
    assert not set(in_dist.tolist()) & set(digit.tolist())
    images, labels = load_digits(return_X_y=True)
    x_ood = torch.as_tensor(images[labels >= 5], dtype=torch.float64)
    assert data.extras["x_ood"].shape == x_ood.shape == (896, 64)
    expected = (x_ood - data.x_mean.double()) / data.x_std.double()
    torch.testing.assert_close(data.extras["x_ood"].double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(digit, torch.as_tensor(labels[labels >= 5]))


def test_two_moons_and_spirals_options_and_geometry():
    moons = pb.load_dataset("two-moons", seed=0, sizes=(40, 10, 20), noise=0.0, standardize=False)
    assert moons.sizes == (40, 10, 20) and not moons.standardized
    x = torch.cat([moons.x_train, moons.x_valid, moons.x_test]).double()
    y = torch.cat([moons.y_train, moons.y_valid, moons.y_test])
    centre = torch.where(y[:, None] == 0, torch.tensor([0.0, 0.0]), torch.tensor([1.0, 0.5])).double()
    torch.testing.assert_close((x - centre).norm(dim=1), torch.ones(70, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    noisy = pb.load_dataset("two-moons", seed=0, noise=0.3, standardize=False)
    assert "noise 0.3" in noisy.description

    sp = pb.load_dataset("spirals", seed=0, sizes=(60, 20, 20), noise=0.0, turns=2.0, standardize=False)
    x = torch.cat([sp.x_train, sp.x_valid, sp.x_test]).double()
    y = torch.cat([sp.y_train, sp.y_valid, sp.y_test]).double()
    r = x.norm(dim=1)
    assert r.min() >= 0.1 - 1e-6 and r.max() <= 1 + 1e-6
    angle = torch.atan2(x[:, 1], x[:, 0])  # a = 2 pi turns r + pi c, modulo 2 pi
    diff = torch.remainder(angle - (2 * torch.pi * 2.0 * r + torch.pi * y) + torch.pi, 2 * torch.pi) - torch.pi
    assert diff.abs().max() < 1e-4
    with pytest.raises(ValueError, match="noise must be >= 0"):
        pb.load_dataset("spirals", noise=-1)
    with pytest.raises(ValueError, match="sizes must be three positive integers"):
        pb.load_dataset("two-moons", sizes=(10, 10))


def test_missing_scikit_learn_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # import sklearn now raises ImportError
    with pytest.raises(ImportError, match="pip install scikit-learn"):
        pb.load_dataset("iris")
    assert pb.load_dataset("spirals").num_classes == 2  # spirals needs no scikit-learn
    with pytest.raises(ValueError, match="fractions must be three positive numbers"):
        pb.datasets.classification._check_fractions((0.5, 0.5))


def test_from_arrays_maps_string_labels_and_keeps_every_class_in_train():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(61, 3))
    y = np.array(["setosa"] * 30 + ["virginica"] * 20 + ["versicolor"] * 10 + ["rare"])
    data = from_arrays(x, y, task="classification", seed=5)
    assert data.class_names == ("rare", "setosa", "versicolor", "virginica") and data.num_classes == 4
    assert data.y_train.dtype == torch.long and (_counts(data, "train") > 0).all()
    assert data.sizes == (61 - 12 - 6, 6, 12)  # round(0.1 * 61), round(0.2 * 61)
    assert "4 classes, stratified random" in data.description
    # labels map back to the original rows: find each training input in x
    names = np.array(data.class_names)
    x_back = (data.x_train.double() * data.x_std.double() + data.x_mean.double()).numpy()
    rows = [int(np.argmin(np.abs(x - r).sum(1))) for r in x_back]
    assert (names[data.y_train.numpy()] == y[rows]).all()
    same = from_arrays(x, y, task="classification", seed=5)
    assert torch.equal(same.x_test, data.x_test) and torch.equal(same.y_test, data.y_test)
    ints = from_arrays(x, np.where(y == "setosa", 7, 3), task="classification")
    assert ints.class_names == ("3", "7") and set(ints.y_train.tolist()) == {0, 1}
    floats = from_arrays(x, (y == "setosa").astype(float), task="classification")  # whole floats are fine
    assert floats.class_names == ("0", "1")
    regression = from_arrays(x, x[:, 0])  # the default task is unchanged
    assert regression.num_classes is None and regression.y_train.is_floating_point() and "K=" not in repr(regression)


def test_from_frame_with_a_class_column():
    rng = np.random.default_rng(1)
    frame = pd.DataFrame(
        {"a": rng.normal(size=40), "b": rng.normal(size=40), "species": pd.Categorical(["dog", "cat"] * 20)}
    )
    data = from_frame(frame, "species", task="classification", seed=2)
    assert data.name == "species" and data.class_names == ("cat", "dog") and data.input_dim == 2
    assert _counts(data, "train").tolist() == [14, 14]
    with pytest.raises(ValueError, match="not numeric.*for class labels in 'species' pass task='classification'"):
        from_frame(frame, "species")
    frame.loc[3, "species"] = np.nan
    with pytest.raises(ValueError, match=r"columns \['species'\] contain missing values"):
        from_frame(frame, "species", task="classification")


def test_label_errors_name_the_argument_and_the_fix():
    x = np.zeros((10, 2))
    with pytest.raises(ValueError, match=r"y has missing \(NaN / None\) class labels at rows \[2\]"):
        from_arrays(x, [0, 1, np.nan, 0, 1, 0, 1, 0, 1, 0], task="classification")
    with pytest.raises(ValueError, match="y has missing"):
        from_arrays(x, ["a", "b", None, "a", "b", "a", "b", "a", "b", "a"], task="classification")
    with pytest.raises(ValueError, match=r"y has a single class \('a' in all 10 rows\)"):
        from_arrays(x, ["a"] * 10, task="classification")
    with pytest.raises(ValueError, match=r"float labels that are not whole numbers \(e.g. 0.5\).*task='regression'"):
        from_arrays(x, np.linspace(0, 4.5, 10), task="classification")
    with pytest.raises(ValueError, match="task must be 'regression'.*or 'classification'"):
        from_arrays(x, np.arange(10), task="classify")
    with pytest.raises(ValueError, match=r"y must have shape \(N,\) \(one class label per row\)"):
        encode_labels(np.zeros((10, 2)))
    with pytest.raises(ValueError, match="cannot hold out .* keep a training row of each class"):
        stratified_split([0, 0, 1, 1], 2, 1, seed=0)
    splits = {s: (np.zeros((2, 1)), np.array([0, 2])) for s in ("train", "valid", "test")}
    with pytest.raises(ValueError, match=r"the train labels must be integers in \[0, 2\) \(num_classes=2\), got 2"):
        make_dataset("toy", splits, standardize=False, description="", num_classes=2)
    with pytest.raises(ValueError, match="class_names has 1 names for num_classes=3"):
        make_dataset("toy", splits, standardize=False, description="", num_classes=3, class_names=["a"])


def test_stratified_split_is_exact_and_seeded():
    labels = np.repeat([0, 1, 2], [50, 30, 3])
    train, valid, test = stratified_split(labels, 16, 17, seed=4)
    assert (len(train), len(valid), len(test)) == (50, 16, 17)
    assert sorted(np.concatenate([train, valid, test]).tolist()) == list(range(83))
    assert np.bincount(labels[train], minlength=3).min() >= 1
    again = stratified_split(labels, 16, 17, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(again, (train, valid, test)))
    assert not np.array_equal(stratified_split(labels, 16, 17, seed=5)[2], test)
