"""Every tutorial runs top to bottom at its small size (``PYRO_BNNLV_TUTORIAL_SMALL=1``) and its
headline checks hold even there. Full-size numbers are in the tutorials' text and the README."""

import math
import runpy
import warnings
from pathlib import Path

import matplotlib
import pytest

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"


@pytest.fixture
def run_tutorial(tmp_path, monkeypatch):
    """Run ``tutorials/NAME`` at small size in ``tmp_path``; return its namespace."""

    def run(name: str) -> dict:
        monkeypatch.setenv("PYRO_BNNLV_TUTORIAL_SMALL", "1")
        monkeypatch.setenv("PYRO_BNNLV_TUTORIAL_OUT", str(tmp_path))
        monkeypatch.setenv("MPLBACKEND", "Agg")
        monkeypatch.chdir(tmp_path)
        matplotlib.use("Agg")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ArviZ notices, Pareto-k warnings at small size
            return runpy.run_path(str(TUTORIALS / name), run_name="__main__")

    return run


def test_nuts_tutorial_runs_at_small_size(run_tutorial, tmp_path):
    ns = run_tutorial("nuts_gold_standard.py")
    assert ns["SMALL"] is True
    table = ns["comparison"]
    assert list(table.index) == ["MFVI", "NUTS (KL: half vs half)"]
    assert table.notna().all().all()
    assert set(ns["summary"].kind) == {"f", "log_lik", "w"}
    for name in ("nuts_trace_f.png", "nuts_rank_f.png", "nuts_vs_mfvi.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_ncai_tutorial_runs(run_tutorial, tmp_path):
    ns = run_tutorial("ncai_nonidentifiability.py")
    assert len(ns["table"]) == 4
    assert (tmp_path / "tutorial-ncai-compare.png").exists()
    assert (tmp_path / "tutorial-ncai-uncertainty.png").exists()
    assert set(ns["summary"].index) == {"total", "aleatoric", "epistemic"}


def test_hyvi_tutorial_runs_at_small_size(run_tutorial, tmp_path):
    ns = run_tutorial("hypernet_vi.py")
    assert ns["SMALL"] is True
    table = ns["uncertainty"]
    assert list(table.index) == ["MFVI", "NN-HyVI", "FuNN-HyVI"]
    assert table.notna().all().all()
    assert all(0.0 <= v <= 1.0 for v in ns["ood_auroc"])
    assert all(math.isfinite(v) for v in table["test LL"])
    for name in ("hyvi_predictive.png", "hyvi_entropy_FuNN-HyVI.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_projected_tutorial_runs_at_small_size(run_tutorial, tmp_path):
    ns = run_tutorial("projected_bnn.py")
    assert ns["SMALL"] is True
    table = ns["table"]
    assert list(table.index) == [
        "candidates",
        "MFVI on w",
        "Proj-BNN autoencoder, q(z)",
        "Proj-BNN autoencoder, q(z) q(phi)",
        "Proj-BNN mmd, q(z)",
        "Proj-BNN mmd, q(z) q(phi)",
    ]
    assert table[["fits_three", "modes", "test_ll"]].notna().all().all()
    # the candidates are MAP fits of three bumps (the toy's premise)
    assert table.loc["candidates", "fits_three"] >= 0.5
    assert (tmp_path / "projected_four_modes.png").stat().st_size > 0


def test_in_between_tutorial_runs_at_small_size(run_tutorial, tmp_path):
    ns = run_tutorial("in_between_uncertainty.py")
    assert ns["SMALL"] is True
    table = ns["table"]
    assert list(table.index) == ["MFVI", "FCVI", "LL", "NUTS"]
    assert all(math.isfinite(v) for v in table.to_numpy().ravel())
    # linearised Laplace opens up in the gap (sec. 3, Fig. 1)
    assert table.loc["LL", "gap / cluster sd"] > 3
    # App. B: mean-field output weights give a convex variance, full covariance does not
    assert ns["convex"] == {"MFVI-output": True, "BLR (full covariance)": False}
    assert ns["gap_peak"]["BLR (full covariance)"] > 1
    for name in ("in_between_bands.png", "in_between_convex_variance.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_invariance_tutorial_runs_at_small_size(run_tutorial, tmp_path):
    ns = run_tutorial("invariance_gap.py")
    assert ns["SMALL"] is True
    svi = ns["svi"]
    assert list(svi.K) == [2, 8, 32]
    # even the short small-size fits land near the mean-field optimum, far from the exact posterior
    assert (svi.pred_var_rel_err.abs() < 0.05).all()
    assert (svi.pred_var_f_fit > 1.9 * svi.pred_var_f_post).all()
    nuts = ns["nuts_tables"][4]
    assert (nuts.z.abs() < 4).all()
    totals = ns["totals"]
    assert list(totals.index) == [10, 30]
    assert (totals.total_gap > 0).all() and (totals.total_gap < totals.first_layer_kl).all()
    assert (totals.total_gap_mixture <= totals.total_gap).all()
    for name in ("invariance-gap.png", "invariance-gap-bnn-10.png", "invariance-gap-bnn-30.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_classification_tutorial_runs_at_small_size(run_tutorial, tmp_path):
    ns = run_tutorial("classification.py")
    assert ns["SMALL"] is True
    moons = ns["moons"]
    assert list(moons.index) == ["NUTS", "MFVI", "MAP", "linearised Laplace"]
    assert moons.notna().all().all() and moons.loc["NUTS", "TV to NUTS (grid)"] == 0
    assert (moons["accuracy"] > 0.8).all()
    cnn = ns["cnn_table"]
    assert list(cnn.index) == ["MAP", "K-FAC Laplace", "MFVI"]
    assert cnn.drop(columns="AUROC BALD").notna().all().all() and math.isnan(cnn.loc["MAP", "AUROC BALD"])
    assert ((cnn["AUROC entropy"] > 0.5) & (cnn["AUROC entropy"] <= 1)).all()
    # K-FAC stores Kronecker factors: far below a dense covariance's P^2 float64s
    P = ns["net"].num_weights
    assert cnn.loc["K-FAC Laplace", "posterior MB"] < 0.01 * P * P * 8 / 2**20
    for name in ("classification_two_moons_entropy.png", "classification_digits_reliability.png"):
        assert (tmp_path / name).stat().st_size > 0
