"""The UCI reproduction script runs end to end at a tiny size and its MAP step learns the noise."""

import math

import pytest
import torch

import pyro_bnnlv as pb
from pyro_bnnlv.datasets import default_data_dir
from pyro_bnnlv.reproduce.in_between import METHODS, fit_map_learned_noise, main, run_split, summary, uci_table

needs_data = pytest.mark.skipif(not (default_data_dir() / "uci").exists(), reason="shared data directory not found")


def test_map_with_learned_noise_recovers_the_noise_level():
    data = pb.load_dataset("clusters")  # true noise 0.1
    net = pb.MLP(1, [20], 1)
    w, sigma, step = fit_map_learned_noise(net, data, num_steps=1500, seed=0)
    assert 0.07 < sigma < 0.14 and 50 <= step <= 1500
    assert torch.isfinite(w).all()


def test_run_split_gives_every_method_on_a_small_problem():
    data = pb.load_dataset("clusters", sizes=(60, 20, 40))
    out = run_split(data, map_steps=200, vi_steps=100, num_samples=20)
    for m in METHODS:
        assert math.isfinite(out[m]), (m, out[m])


@needs_data
def test_uci_table_and_summary_on_yacht(capsys):
    table = uci_table(
        ["yacht"], standard_splits=[0], max_gap_dims=1, map_steps=100, vi_steps=50, num_samples=10, progress=False
    )
    assert list(table["kind"]) == ["standard", "gap"]
    summ = summary(table)
    assert set(summ["method"]) == set(METHODS)
    assert summ["mean"].map(math.isfinite).all()
    assert (
        main(
            [
                "--datasets",
                "yacht",
                "--standard-splits",
                "1",
                "--max-gap-dims",
                "1",
                "--map-steps",
                "50",
                "--vi-steps",
                "20",
            ]
        )
        == 0
    )
    assert "yacht" in capsys.readouterr().out


def test_two_hidden_layers_and_split_counts():
    data = pb.load_dataset("clusters", sizes=(60, 20, 40))
    out = run_split(data, map_steps=100, vi_steps=50, num_samples=10, hidden_layers=2, methods=("MAP", "LL"))
    assert math.isfinite(out["MAP"]) and math.isfinite(out["LL"]) and "MFVI" not in out
    with pytest.raises(ValueError, match="hidden_layers"):
        run_split(data, hidden_layers=3)
    from pyro_bnnlv.reproduce.in_between import PAPER_LL

    for hl in (1, 2):  # every method, split kind and data set has the paper's number
        assert all(len(v) == 9 for kind in PAPER_LL[hl].values() for v in kind.values())


@needs_data
def test_uci_split_counts_and_missing_standard_splits_are_skipped():
    from pyro_bnnlv.datasets.files import uci_num_splits

    assert uci_num_splits("protein") == 5 and uci_num_splits("yacht") == 20
    with pytest.raises(ValueError, match="unknown UCI dataset"):
        uci_num_splits("nope")
    table = uci_table(
        ["yacht"],
        standard_splits=[19, 20],
        gap=False,
        map_steps=20,
        vi_steps=10,
        num_samples=5,
        progress=False,
        methods=("MAP",),
    )
    assert list(table["split"]) == [19]


def test_mfvi_paper_settings_and_method_subsets():
    data = pb.load_dataset("clusters", sizes=(60, 20, 40))
    out = run_split(data, methods=("MFVI",), mfvi="paper", num_samples=10)
    assert math.isfinite(out["MFVI"]) and "MAP" not in out and "sec_MAP" not in out
    with pytest.raises(ValueError, match="mfvi"):
        run_split(data, mfvi="long")
    with pytest.raises(ValueError, match="unknown methods"):
        run_split(data, methods=("MAP", "HMC"))
