"""pb.grid_search: hyper-parameters (the noise) by validation log-likelihood on the sweep layer."""

import pytest
import torch

import pyro_bnnlv as pb


def _data(noise=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(300, 1, generator=g) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + noise * torch.randn(300, generator=g)
    return pb.datasets.from_arrays(x, y, seed=seed, valid_fraction=0.3, test_fraction=0.2, name="sine")


def fit(data, seed, noise_scale):
    model = pb.BNN(pb.MLP(1, [20], 1), noise_scale=noise_scale)
    guide = pb.MeanField(model)
    pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=400, lr=0.02, seed=seed, progress=False)
    return model, guide


def test_the_noise_near_the_truth_wins_and_the_store_resumes(tmp_path):
    data = _data(noise=0.3)
    grid = {"noise_scale": [0.03, 0.3, 3.0]}
    table = pb.grid_search(fit, data, grid, seeds=(0, 1), num_samples=100, out_dir=tmp_path, progress=False)
    assert len(table) == 6 and (table["status"] == "done").all()
    assert table.attrs["best"] == {"noise_scale": 0.3}
    ranking = table.attrs["ranking"]
    assert list(ranking["count"]) == [2, 2, 2] and ranking["mean"].is_monotonic_decreasing
    # the mean validation LL of each point is the mean of its fits' evaluate(..., split="valid")
    model, guide = fit(data, 0, 0.3)
    direct = pb.evaluate(model, guide, data, split="valid", seed=0, num_samples=100, intervals=False)
    row = table[(table["noise_scale"] == 0.3) & (table["seed"] == 0)].iloc[0]
    assert row["valid_test_ll"] == pytest.approx(float(direct["test_ll"]), abs=1e-6)
    again = pb.grid_search(fit, data, grid, seeds=(0, 1), num_samples=100, out_dir=tmp_path, progress=False)
    assert again["valid_test_ll"].tolist() == table["valid_test_ll"].tolist()  # read back, not refitted


def test_bad_grids_and_data_name_the_fix():
    data = _data()
    with pytest.raises(TypeError, match="non-empty dict"):
        pb.grid_search(fit, data, [0.1, 0.2])
    with pytest.raises(ValueError, match="is empty"):
        pb.grid_search(fit, data, {"noise_scale": []})
    with pytest.raises(TypeError, match="Dataset"):
        pb.grid_search(fit, (data.x_train, data.y_train), {"noise_scale": [0.1]})
    with pytest.raises(TypeError, match="fit must be a function"):
        pb.grid_search(None, data, {"noise_scale": [0.1]})
