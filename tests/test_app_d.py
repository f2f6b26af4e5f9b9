"""App. D's protocol for MAP and Laplace (Foong et al. 2019): the stated grid, minibatches drawn
with replacement, snapshots that equal runs of their own length, selection on each method's own
validation log-likelihood and the refit on training + validation."""

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import pyro_bnnlv as pb
from pyro_bnnlv.nets import MLP
from pyro_bnnlv.reproduce import app_d, in_between
from pyro_bnnlv.reproduce.in_between import run_split


def _data(n=150):
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (n, 1))
    return pb.datasets.from_arrays(x, np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(n), seed=0)


def test_the_grid_is_app_d_s():
    assert app_d.APP_D_GRID["omega"] == (1.0, 2.0)
    assert app_d.APP_D_GRID["lr"] == (0.01, 0.001)
    assert app_d.APP_D_GRID["epochs"]["MAP"] == (20, 40, 100)
    assert app_d.APP_D_GRID["epochs"]["LL"] == app_d.APP_D_GRID["epochs"]["SL"] == (40, 100, 200, 400)


def test_minibatches_of_100_with_replacement_and_snapshots_equal_runs_of_their_own_length(monkeypatch):
    data = _data()
    x, y = data.x_train, data.y_train  # 105 points: 2 steps per epoch
    draws = []
    randint = torch.randint

    def recording(high, size, generator=None):
        out = randint(high, size, generator=generator)
        draws.append(out)
        return out

    monkeypatch.setattr(torch, "randint", recording)
    net = MLP(1, [5], 1, activation="tanh")
    both = app_d.train_map_minibatch(net, x, y, omega=1.0, lr=0.01, epochs=(2, 5), seed=3)
    assert len(draws) == 5 * math.ceil(len(x) / 100) and all(d.shape == (100,) for d in draws)
    assert any(len(set(d.tolist())) < 100 for d in draws)  # with replacement: repeats occur
    alone = app_d.train_map_minibatch(net, x, y, omega=1.0, lr=0.01, epochs=(2,), seed=3)
    assert set(both) == {2, 5} and set(alone) == {2}
    assert torch.equal(both[2][0], alone[2][0]) and both[2][1] == alone[2][1]
    assert not torch.equal(both[2][0], both[5][0])


def test_each_method_chooses_on_its_own_validation_ll_and_is_refitted_on_train_and_validation(monkeypatch):
    data = _data()
    monkeypatch.setattr(
        app_d, "APP_D_GRID", {"omega": (1.0, 2.0), "lr": (0.01,), "epochs": {"MAP": (1, 2), "LL": (2, 3), "SL": (3,)}}
    )
    calls = []
    scores = app_d._scores

    def recording(net, w, sigma, omega, x, y, xe, ye, methods, **kw):
        out = scores(net, w, sigma, omega, x, y, xe, ye, methods, **kw)
        calls.append((omega, len(x), len(xe), methods, out))
        return out

    monkeypatch.setattr(app_d, "_scores", recording)
    out = app_d.app_d_map_laplace(data, num_samples=20, seed=0)
    n_train, n_valid, n_test = len(data.x_train), len(data.x_valid), len(data.x_test)
    validation = [c for c in calls if c[2] == n_valid]
    refits = [c for c in calls if c[2] == n_test]
    assert all(c[1] == n_train for c in validation)
    assert [c[3] for c in refits] == [("MAP",), ("LL",), ("SL",)]
    assert all(c[1] == n_train + n_valid for c in refits)  # refitted on training + validation
    for m, epochs in (("MAP", (1, 2)), ("LL", (2, 3)), ("SL", (3,))):
        seen = [c[4][m] for c in validation if m in c[4]]
        assert len(seen) == 2 * len(epochs)  # every grid point scored once
        assert out[f"{m}_valid"] == max(seen)
        assert out[m] == next(c[4][m] for c in refits if c[3] == (m,))
        assert math.isfinite(out[m]) and out[f"{m}_config"].startswith("omega=")


def test_run_split_with_the_app_d_protocol(monkeypatch):
    monkeypatch.setattr(
        app_d, "APP_D_GRID", {"omega": (1.0,), "lr": (0.01,), "epochs": {"MAP": (1,), "LL": (1,), "SL": (1,)}}
    )
    out = run_split(_data(), methods=("MAP", "LL", "SL", "LL-valid"), protocol="app-d", num_samples=10)
    assert {"MAP", "LL", "SL", "MAP_config", "sec_app_d"} <= set(out) and "LL-valid" not in out
    with pytest.raises(ValueError, match="protocol must be"):
        run_split(_data(), protocol="appendix")


def test_the_fan_in_variant_gives_the_laplace_posterior_the_fan_in_prior(monkeypatch):
    data = _data()
    priors = []
    bnn = app_d.BNN

    def recording(net, prior_scale, noise_scale):
        priors.append(prior_scale)
        return bnn(net, prior_scale=prior_scale, noise_scale=noise_scale)

    monkeypatch.setattr(app_d, "BNN", recording)
    net = MLP(1, [5], 1, activation="tanh")
    w, sigma = app_d.train_map_minibatch(net, data.x_train, data.y_train, omega=2.0, lr=0.01, epochs=(2,), seed=0)[2]
    args = (net, w, sigma, 2.0, data.x_train, data.y_train, data.x_valid, data.y_valid, ("LL",))
    stated = app_d._scores(*args, num_samples=5, seed=0, y_mean=0.0, y_std=1.0)
    fan_in = app_d._scores(*args, num_samples=5, seed=0, y_mean=0.0, y_std=1.0, laplace_prior="fan-in")
    assert priors[0] == 2.0 and torch.equal(priors[1], pb.fan_in_prior_scale(net, omega=2.0))
    assert stated["LL"] != fan_in["LL"]
    with pytest.raises(ValueError, match="laplace_prior must be"):
        app_d.app_d_map_laplace(data, laplace_prior="wide")


def test_the_documented_app_d_command_reads_the_committed_store(tmp_path, capsys):
    # the fan-in option came after this store: as-stated (the default) must leave the recorded
    # task function unchanged, so rerunning the results page's command runs nothing
    store = Path(__file__).resolve().parents[1] / "docs/results/sweeps/in-between-app-d-1hl"
    shutil.copytree(store, tmp_path / "store")
    argv = [
        "--protocol",
        "app-d",
        "--methods",
        "MAP",
        "LL",
        "SL",
        "--datasets",
        "yacht",
        "boston",
        "energy",
        "concrete",
        "wine",
        "--standard-splits",
        "20",
        "--workers",
        "2",
        "--out",
        str(tmp_path / "store"),
        "--code-version",
        "app-d-1",
        "--quiet",
    ]
    assert in_between.main(argv) == 0
    assert "146 tasks: 146 done" in capsys.readouterr().out
