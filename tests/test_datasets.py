import numpy as np
import pytest
import torch

from pyro_bnnlv.datasets import DATA_DIR_ENV, default_data_dir, list_datasets, load_dataset
from pyro_bnnlv.datasets.synthetic import goldberg_var, williams_var, yuan_var

PAPER_SIZES = {
    "heavy-tail": (300, 300, 300),
    "depeweg": (750, 250, 250),
    "bimodal": (750, 250, 250),
    "goldberg": (200, 200, 200),
    "yuan": (200, 200, 200),
    "williams": (200, 200, 200),
    "cosine": (120, 60, 120),
    "clusters": (100, 50, 100),
}


@pytest.mark.parametrize("name, sizes", sorted(PAPER_SIZES.items()))
def test_synthetic_sizes_and_reproducibility(name, sizes):
    d1, d2, d3 = load_dataset(name, seed=0), load_dataset(name, seed=0), load_dataset(name, seed=1)
    assert d1.sizes == sizes
    assert d1.x_train.shape == (sizes[0], 1) and d1.y_train.shape == (sizes[0],)
    assert torch.equal(d1.y_train, d2.y_train)
    assert not torch.equal(d1.y_train, d3.y_train)
    assert not d1.standardized


def _noise_variance_fit(name, var_fn, mean_fn, n=200_000):
    d = load_dataset(name, seed=0, sizes=(n, 10, 10))
    x, y = d.x_train[:, 0].double().numpy(), d.y_train.double().numpy()
    resid2 = (y - mean_fn(x)) ** 2
    bins = np.linspace(0, 1, 6)
    for lo, hi in zip(bins[:-1], bins[1:]):
        m = (x >= lo) & (x < hi)
        expected = var_fn(x[m]).mean()
        se = resid2[m].std() / np.sqrt(m.sum())
        assert abs(resid2[m].mean() - expected) < 5 * se, (name, lo, resid2[m].mean(), expected)


def test_goldberg_noise_variance_is_x_plus_half():
    _noise_variance_fit("goldberg", goldberg_var, lambda x: 2 * np.sin(2 * np.pi * x))
    assert goldberg_var(np.array([0.0, 1.0])).tolist() == [0.5, 1.5]


def test_yuan_and_williams_noise_variances():
    _noise_variance_fit("yuan", yuan_var, lambda x: 2 * np.exp(-30 * (x - 0.25) ** 2 + np.sin(np.pi * x**2)) - 2)
    _noise_variance_fit("williams", williams_var, lambda x: np.sin(2.5 * x) * np.sin(1.5 * x))


def test_latent_generators_store_ground_truth():
    d = load_dataset("depeweg", seed=0, sizes=(50_000, 10, 10))
    x, y, z = (t.double().numpy() for t in (d.x_train[:, 0], d.y_train, d.extras["z_train"]))
    assert z.std() == pytest.approx(1.0, abs=0.02)
    resid = y - (7 * np.sin(x) + 3 * np.abs(np.cos(x / 2)) * z)
    assert resid.var() == pytest.approx(0.1, rel=0.03)
    # mixture of N(-4, .16), N(0, .81), N(4, .16): a third of the mass near each centre
    assert np.mean(np.abs(x + 4) < 1.2) == pytest.approx(1 / 3, abs=0.02)
    h = load_dataset("heavy-tail", seed=0, sizes=(50_000, 10, 10))
    assert h.extras["z_train"].std().item() == pytest.approx(0.1, rel=0.03)
    assert h.x_train.min() >= -4 and h.x_train.max() <= 4
    b = load_dataset("bimodal", seed=0)
    assert b.x_train.min() >= -0.5 and b.x_train.max() <= 2.0


def test_cosine_and_clusters_layout():
    c = load_dataset("cosine")
    x = c.x_train[:, 0]
    assert (((x >= -1) & (x <= -0.5)) | ((x >= 0.5) & (x <= 1))).all()
    ood = c.extras["x_ood"]
    assert ood.shape == (1000, 1) and ood.min() >= -4 and ood.max() <= 2
    resid = c.y_train - torch.cos(4 * (x + 0.2))
    assert resid.std().item() == pytest.approx(0.1, rel=0.25)
    k = load_dataset("clusters")
    assert ((k.x_train < -0.5) | (k.x_train > 0.5)).all()
    assert (k.extras["x_gap"].abs() <= 0.5).all()


def test_unknown_name_and_aliases():
    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        load_dataset("nope")
    assert load_dataset("heavy_tail").name == "heavy-tail"
    names = set(list_datasets().index)
    assert {"lidar", "mcycle", "yacht", "protein", "cosine", "clusters"} <= names


def test_data_dir_setting(monkeypatch, tmp_path):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("PYRO_BNNLV_MIRROR", str(tmp_path / "no-mirror"))  # offline: fail fast
    assert default_data_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match="PYRO_BNNLV_DATA"):
        load_dataset("yacht")


needs_data = pytest.mark.skipif(not (default_data_dir() / "uci").exists(), reason="shared data directory not found")

UCI_ROWS = {
    "boston": (506, 13),
    "concrete": (1030, 8),
    "energy": (768, 8),
    "kin8nm": (8192, 8),
    "naval": (11934, 16),
    "power": (9568, 4),
    "protein": (45730, 9),
    "wine": (1599, 11),
    "yacht": (308, 6),
}


@needs_data
@pytest.mark.parametrize("name", sorted(UCI_ROWS))
def test_uci_standard_splits(name):
    n, D = UCI_ROWS[name]
    d = load_dataset(name, split=1)
    n_tr, n_va, n_te = d.sizes
    assert n_tr + n_va + n_te == n and d.input_dim == D
    assert n_tr + n_va == round(0.9 * n)
    assert n_va == round(0.1 * (n_tr + n_va))
    assert torch.isfinite(d.x_train).all() and torch.isfinite(d.x_test).all()
    assert d.x_train.mean(0).abs().max() < 1e-4 and d.y_train.mean().abs() < 1e-4
    # a different split gives a different test set
    assert not torch.equal(load_dataset(name, split=2).y_test[:5], d.y_test[:5])


@needs_data
def test_load_split_changes_the_test_set_for_every_kind_of_set():
    from pyro_bnnlv.datasets import load_split

    def raw(d):  # test targets on the original scale (standardisation moves with the seed)
        return d.y_test * d.y_std + d.y_mean

    # the pitfall it exists for: a UCI set's seed moves only the validation subset
    with pytest.warns(UserWarning, match="seed only redraws the validation subset"):
        moved = load_dataset("yacht", seed=3)
    assert torch.allclose(raw(load_dataset("yacht", seed=0)), raw(moved))
    a, b = load_split("yacht", 0), load_split("yacht", 3)
    assert raw(a).shape == raw(b).shape and not torch.allclose(raw(a), raw(b)) and (b.split, b.seed) == (3, 3)
    assert torch.equal(b.y_test, load_dataset("yacht", split=3, seed=3).y_test)
    assert not torch.equal(load_split("airfoil", 0).y_test, load_split("airfoil", 1).y_test)  # random-split set
    assert not torch.equal(load_split("cosine", 0).y_train, load_split("cosine", 1).y_train)  # synthetic
    with pytest.raises(ValueError, match=r"protein has 5 standard train/test splits \(0..4\); index=5"):
        load_split("protein", 5)
    with pytest.raises(ValueError, match="load_split chooses \\['seed'\\] from index=1"):
        load_split("yacht", 1, seed=2)


@needs_data
def test_uci_split_bounds_and_naval_constant_columns():
    with pytest.raises(ValueError, match="split"):
        load_dataset("protein", split=5)  # protein has 5 splits
    d = load_dataset("naval")
    assert torch.isfinite(d.x_train).all()
    assert (d.x_std == 1.0).sum() >= 2  # two constant columns kept at 0, not NaN


@needs_data
@pytest.mark.parametrize(
    "name, n, D", [("lidar", 221, 1), ("mcycle", 133, 1), ("airfoil", 1503, 5), ("abalone", 4177, 10)]
)
def test_tables_random_splits(name, n, D):
    d = load_dataset(name, seed=3)
    assert sum(d.sizes) == n and d.input_dim == D
    assert d.sizes[0] == round(0.7 * n)
    back = d.y_train * d.y_std + d.y_mean  # original scale recovered
    raw = load_dataset(name, seed=3, standardize=False)
    torch.testing.assert_close(back, raw.y_train, rtol=1e-5, atol=1e-5)


def test_from_frame_refuses_the_target_among_the_features():
    """Issue 39: ``features=["a", "y"]`` with ``target="y"`` would put y among the inputs."""
    import pandas as pd

    from pyro_bnnlv.datasets import from_frame

    frame = pd.DataFrame({"a": np.arange(20.0), "b": np.ones(20), "y": np.arange(20.0) ** 2})
    with pytest.raises(ValueError, match=r"features includes the target column 'y'.*leave it out of features="):
        from_frame(frame, target="y", features=["a", "y"])
    with pytest.raises(ValueError, match=r"features names the columns \['a'\] more than once"):
        from_frame(frame, target="y", features=["a", "b", "a"])
    assert from_frame(frame, target="y", features=["a"]).input_dim == 1


def test_from_arrays_standardises_a_column_near_the_float64_maximum():
    """Issue 39: a column near 1e307 was zeroed (x - mean overflowed). In float64 it is
    standardised exactly; in float32, whose range the statistics exceed, it is refused by column."""
    from pyro_bnnlv.datasets import from_arrays

    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 2))
    x[:, 1] = 1e307 * (1.0 + 0.1 * rng.normal(size=50))
    y = rng.normal(size=50)
    with pytest.raises(
        ValueError, match=r"x column 1 has a mean or standard deviation beyond what torch.float32 holds"
    ):
        from_arrays(x, y)
    with pytest.raises(ValueError, match=r"x column 1 of the train split has values beyond what torch.float32 holds"):
        from_arrays(x, y, standardize=False)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        data = from_arrays(x, y)
        small = from_arrays(np.stack([x[:, 0], x[:, 1] / 1e307], 1), y)  # the same column, rescaled
    finally:
        torch.set_default_dtype(default)
    torch.testing.assert_close(data.x_train, small.x_train, rtol=1e-6, atol=1e-6)
    assert data.x_train[:, 1].std() > 0.9
    torch.testing.assert_close(data.x_mean[1] / 1e307, small.x_mean[1], rtol=1e-6, atol=0)
