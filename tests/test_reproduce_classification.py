"""``pyro-bnnlv reproduce classification`` runs end to end at its smoke-test size through the CLI,
writes its CSVs and figures, and its numbers pass honest sanity checks even there: the two NUTS
references agree with each other better than MAP agrees with NUTS, and K-FAC stores far less than
a dense covariance."""

import math

import pandas as pd
import pytest
import torch

import pyro_bnnlv as pb
from pyro_bnnlv.cli import main as cli_main
from pyro_bnnlv.reproduce import classification as cls
from pyro_bnnlv.reproduce import tables
from pyro_bnnlv.reproduce.report import TABLES


def _run(tmp_path, part):
    out = tmp_path / "results"
    out.mkdir()
    status = cli_main(
        [
            "reproduce",
            "classification",
            "--small",
            "--seeds",
            "1",
            "--parts",
            part,
            "--executor",
            "inline",
            "--quiet",
            "--results-dir",
            str(out),
            "--out",
            str(tmp_path / "sweeps"),
            "--code-version",
            "test",
        ]
    )
    assert status == 0
    return out


def test_two_moons_smoke_run_through_the_cli(tmp_path, capsys):
    out = _run(tmp_path, "two-moons")
    t = pd.read_csv(out / "classification-two-moons.csv")
    assert list(t.columns) == [
        "dataset",
        "seed",
        "method",
        "tv_to_nuts",
        "kl_to_nuts",
        "accuracy",
        "nll",
        "brier",
        "ece",
        "seconds",
    ]
    assert list(t["method"]) == list(cls.TWO_MOONS_METHODS)
    assert t[["tv_to_nuts", "kl_to_nuts", "accuracy", "nll", "ece"]].notna().all().all()
    by = t.set_index("method")
    assert by.loc["NUTS", "tv_to_nuts"] == 0 and by.loc["NUTS", "kl_to_nuts"] == 0
    assert (t["kl_to_nuts"] >= -1e-12).all() and (t["tv_to_nuts"] <= 1).all()
    # the two references (compiled flat kernel; Pyro's own kernel, other seeds) agree better than MAP
    assert by.loc["NUTS-ref", "tv_to_nuts"] < by.loc["MAP", "tv_to_nuts"]
    assert (out / "classification-two-moons.png").stat().st_size > 0
    text = capsys.readouterr().out
    assert "TV to NUTS" in text and "pair (ordered by mean TV)" in text
    # the store resumes: the same command runs nothing and gives the same table
    cli_main(
        [
            "reproduce",
            "classification",
            "--small",
            "--seeds",
            "1",
            "--parts",
            "two-moons",
            "--executor",
            "inline",
            "--quiet",
            "--results-dir",
            str(out),
            "--out",
            str(tmp_path / "sweeps"),
            "--code-version",
            "test",
        ]
    )
    assert pd.read_csv(out / "classification-two-moons.csv").equals(t)
    assert "ran 0 tasks" in capsys.readouterr().out


def test_digits_smoke_run_through_the_cli(tmp_path):
    out = _run(tmp_path, "digits")
    t = pd.read_csv(out / "classification-digits.csv")
    assert list(t.columns) == [
        "dataset",
        "seed",
        "method",
        "accuracy",
        "nll",
        "brier",
        "ece",
        "auroc_entropy",
        "auroc_mi",
        "seconds",
        "memory_mb",
        "dense_cov_mb",
    ]
    by = t.set_index("method")
    assert list(by.index) == list(cls.DIGITS_METHODS)
    assert math.isnan(by.loc["MAP", "auroc_mi"]) and 0 <= by.loc["K-FAC", "auroc_mi"] <= 1
    # K-FAC keeps per layer two Kronecker factors and their eigenbases: far below P^2 float64s
    P = cls.digits_cnn().num_weights
    assert by.loc["K-FAC", "dense_cov_mb"] == pytest.approx(P * P * 8 / 2**20)
    assert by.loc["K-FAC", "memory_mb"] < 0.01 * by.loc["K-FAC", "dense_cov_mb"]
    assert by.loc["MAP", "memory_mb"] == pytest.approx(P * 4 / 2**20)
    assert by.loc["MFVI", "memory_mb"] == pytest.approx(2 * P * 4 / 2**20)
    assert (out / "classification-digits.png").stat().st_size > 0
    for name in ("classification-digits", "classification-digits-paired"):
        assert TABLES[name]([t], [], {}).startswith("| ")


def test_laplace_probability_draws_average_to_predictive_probs():
    data = pb.load_dataset("two-moons", seed=0, sizes=(60, 10, 20))
    model = pb.BNN(pb.MLP(2, [6], 2), likelihood="categorical")
    w = pb.train_map(model, data.x_train, data.y_train, num_steps=100, lr=0.05, progress=False)
    for structure in ("full", "kfac"):
        la = pb.LinearizedLaplace(model, w, structure=structure).fit(data.x_train, data.y_train)
        s = cls.laplace_probs_samples(la, data.x_test, num_samples=64, seed=3)
        assert s.shape == (64, 20, 2)
        assert torch.allclose(s.mean(0), la.predictive_probs(data.x_test, num_samples=64, seed=3), atol=1e-12)
    assert cls.posterior_bytes(la) < cls.posterior_bytes(pb.LinearizedLaplace(model, w).fit(data.x_train, data.y_train))


def test_grid_paired_differences_and_tables():
    x = torch.tensor([[0.0, 1.0], [2.0, -1.0]])
    pts, box = cls.grid_inputs(x, n=3, margin=0.5)
    assert box == (-0.5, 2.5, -1.5, 1.5)
    assert torch.equal(pts.reshape(3, 3, 2)[0, :, 0], torch.tensor([-0.5, 1.0, 2.5]))  # first coordinate fastest
    probs = torch.tensor([[0.3, 0.7], [1.0, 0.0], [1e-15, 1 - 1e-15]], dtype=torch.float64)
    back = cls._decode_grid(cls._encode_grid(probs))
    assert torch.allclose(back, probs.clamp(1e-12, 1 - 1e-12), atol=1e-4)
    t = pd.DataFrame(
        dict(
            seed=[0, 0, 1, 1, 2, 2],
            method=["A", "B"] * 3,
            tv_to_nuts=[0.1, 0.3, 0.2, 0.5, 0.1, 0.4],
            kl_to_nuts=[0.1, 0.1, 0.2, 0.2, 0.3, 0.31],
        )
    )
    mean, se, n = cls.paired_differences(t, "A", "B", "tv_to_nuts")
    assert n == 3 and mean == pytest.approx(-0.8 / 3)
    assert se == pytest.approx(float(pd.Series([-0.2, -0.3, -0.3]).std() / math.sqrt(3)))
    assert tables.paired_verdict(mean, se, n, "B better", "A better", within=2) == "A better"
    assert tables.paired_verdict(-0.01, 0.01, n, "B better", "A better", within=2) == "tie"
    assert tables.paired_text(mean, se, n, "B better", "A better", 4, style="± {se}", within=2) == (
        "-0.2667 ± 0.0333, A better"
    )
