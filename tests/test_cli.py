import pytest
import torch

from pyro_bnnlv.cli import main


def test_fit_command_end_to_end(tmp_path, capsys):
    png = tmp_path / "fit.png"
    code = main(
        [
            "fit",
            "--dataset",
            "cosine",
            "--steps",
            "40",
            "--hidden",
            "10",
            "--quiet",
            "--num-samples",
            "20",
            "--output",
            str(png),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    for metric in ("test_ll", "rmse", "picp", "mpiw"):
        assert metric in out
    assert png.exists() and png.stat().st_size > 10_000


def test_fit_command_with_laplace_and_every_option_explained(tmp_path, capsys):
    png = tmp_path / "la.png"
    assert (
        main(
            [
                "fit",
                "--dataset",
                "cosine",
                "--guide",
                "laplace",
                "--steps",
                "100",
                "--hidden",
                "10",
                "--quiet",
                "--output",
                str(png),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "linearised Laplace" in out and "prior_factor" in out and "noise_scale" in out
    assert png.stat().st_size > 10_000
    from pyro_bnnlv.cli import _parser

    subparsers = next(a for a in _parser()._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    fit = subparsers.choices["fit"]
    missing = [a.dest for a in fit._actions if not a.help]
    assert not missing, f"fit options without help text: {missing}"


def test_fit_split_chooses_the_train_test_split(capsys):
    args = ["fit", "--dataset", "yacht", "--steps", "3", "--hidden", "5", "--quiet", "--num-samples", "5", "--no-plot"]
    assert main(args + ["--split", "3"]) == 0
    assert "split=3, seed=3" in capsys.readouterr().out
    assert main(args + ["--split", "3", "--seed", "1"]) == 0  # the fit's seed; the split stays 3
    assert "split=3, seed=3" in capsys.readouterr().out
    assert main(args + ["--split", "25"]) == 2
    assert "yacht has 20 standard train/test splits" in capsys.readouterr().err


def test_fit_unknown_dataset_is_a_clear_error(capsys):
    assert main(["fit", "--dataset", "nope", "--steps", "5", "--quiet"]) == 2
    assert "unknown dataset 'nope'" in capsys.readouterr().err


@pytest.mark.slow  # a benchmark command (its smoke run is long; `pytest -m slow`)
def test_bench_svi_overhead_prints_ratios(capsys):
    assert main(["bench", "svi-overhead", "--steps", "10"]) == 0
    out = capsys.readouterr().out
    assert "ratio_to_hand" in out and "particles_32_vs_1_ours" in out


def test_bench_knn_and_proj_print_their_ratios(capsys):
    """Side-by-side benches of this round's speed-ups; the two k-NN estimates agree."""
    from pyro_bnnlv.reproduce.hyvi import knn_bench

    table = knn_bench(steps=1, rounds=1)
    estimates = table["estimate"]
    assert estimates.iloc[0] == pytest.approx(estimates.iloc[1], rel=1e-5)
    assert main(["bench", "proj", "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "stage 3: traced / fused step" in out and "BbB: traced / fused step" in out


@pytest.mark.slow  # a benchmark command (its smoke run is long; `pytest -m slow`)
def test_bench_allocator_runs_both_arms_in_fresh_interpreters_with_equal_losses():
    """``bench allocator``: glibc's default vs retain_freed_memory, each arm its own interpreter;
    the allocator must not change a number (the speed-up is measured by the bench, not here)."""
    from pyro_bnnlv._platform import is_glibc

    if not is_glibc():
        pytest.skip("mallopt is glibc's")
    from pyro_bnnlv.reproduce.hyvi import allocator_bench

    table = allocator_bench(steps=2, rounds=1, methods=("FuNN-HyVI",))
    assert list(table.index.get_level_values("allocator")) == ["glibc default", "retain_freed_memory"]
    assert table["same_loss"].all() and table.attrs["losses bitwise equal"] is True
    assert table["ms_per_step"].gt(0).all() and "FuNN-HyVI speed-up" in table.attrs


def test_reproduce_hyvi_smoke(tmp_path, capsys):
    out_csv = tmp_path / "uci.csv"
    assert (
        main(
            [
                "reproduce",
                "hyvi-uci",
                "--small",
                "--quiet",
                "--splits",
                "1",
                "--datasets",
                "yacht",
                "--output",
                str(out_csv),
            ]
        )
        == 0
    )
    import pandas as pd

    table = pd.read_csv(out_csv)
    assert set(table["method"]) == {"MFVI", "NN-HyVI", "FuNN-HyVI"}
    assert table[["rmse", "test_ll", "auroc_ood"]].notna().all().all()
    assert main(["reproduce", "hyvi-cosine", "--small", "--quiet", "--figure", str(tmp_path / "c.png")]) == 0
    assert "FuNN-HyVI" in capsys.readouterr().out and (tmp_path / "c.png").exists()


def test_hyvi_uci_splits_are_different_train_test_splits(monkeypatch):
    """Table 5's mean over 10 splits needs 10 test sets: split k is the UCI set's standard split k
    (it was load_dataset(name, seed=k), whose test set is split 0's for every k)."""
    import pyro_bnnlv.reproduce.hyvi as hyvi

    seen = []

    def recording_evaluate(model, posterior, x, y, **kw):
        seen.append(y * kw["y_std"] + kw["y_mean"])  # the test targets on the original scale
        return evaluate(model, posterior, x, y, **kw)

    evaluate = hyvi.evaluate
    monkeypatch.setattr(hyvi, "evaluate", recording_evaluate)
    table = hyvi.uci_experiment(
        ["yacht"],
        splits=2,
        steps=3,
        hidden=5,
        particles=2,
        kl_samples=10,
        num_inputs=5,
        num_samples=10,
        methods=("MFVI",),
        executor="inline",
        progress=False,
    )
    assert list(table["status"]) == ["done", "done"] and len(seen) == 2
    assert not torch.allclose(seen[0], seen[1])


def test_hyvi_uci_task_uses_the_whole_training_split_and_app_e_mfvi_settings(monkeypatch):
    """Experiment 2 trains on the split's 90% (no validation subset); MFVI gets 100 particles with
    the KL in closed form and twice the patience (App. E); every warning of a fit is counted in
    its result, shown once."""
    import warnings

    from pyro.infer import TraceMeanField_ELBO

    import pyro_bnnlv.reproduce.hyvi as hyvi
    from pyro_bnnlv.datasets import load_split
    from pyro_bnnlv.sweep import Task

    seen = {}

    def fake_fit(method, model, x, y, *, steps, lr_schedule, num_samples, **kw):
        seen[method] = (len(x), lr_schedule.patience)
        for _ in range(3):
            warnings.warn("the same warning", UserWarning)
        return torch.zeros(num_samples, model.num_weights), 1.0, steps

    monkeypatch.setattr(hyvi, "_fit", fake_fit)
    kw = dict(steps=7, lr=0.005, hidden=5, particles=2, kl_samples=10, num_inputs=5, num_samples=10, schedule=True)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        out = hyvi.uci_task(Task("yacht", method="MFVI", split=2, seed=2), **kw)
    hyvi.uci_task(Task("yacht", method="NN-HyVI", split=2, seed=2), **kw)
    full = load_split("yacht", 2, valid_fraction=0.0)
    assert seen["MFVI"] == (len(full.x_train), 60) and seen["NN-HyVI"] == (len(full.x_train), 30)
    assert len(full.x_train) == len(load_split("yacht", 2).x_train) + len(load_split("yacht", 2).x_valid)
    assert out["capped"] is True and out["warnings"] == "3x UserWarning: the same warning"
    assert sum("the same warning" in str(w.message) for w in shown) == 1
    loss = hyvi._loss("MFVI", None, 5, 100, 500)
    assert isinstance(loss, TraceMeanField_ELBO) and loss.num_particles == 100 and loss.vectorize_particles


def test_reproduce_projected_smoke(tmp_path, capsys):
    out_csv = tmp_path / "proj.csv"
    assert (
        main(
            [
                "reproduce",
                "proj-uci",
                "--small",
                "--quiet",
                "--datasets",
                "yacht",
                "--schemes",
                "random",
                "extrapolation",
                "--output",
                str(out_csv),
            ]
        )
        == 0
    )
    import pandas as pd

    table = pd.read_csv(out_csv)
    assert set(table["method"]) == {"BbB", "FGE", "Proj-BNN", "Proj-BNN (MMD)"}
    assert set(table["scheme"]) == {"random", "extrapolation"}
    assert table[["test_ll", "rmse"]].notna().all().all()


def test_reproduce_hyvi_uci_paper_budget_arguments(monkeypatch):
    """--paper: the paper's 10 splits and its learning-rate schedule (steps become a cap); an
    explicit --splits or --steps still wins; --paper with cosine or --small is refused."""
    import pandas as pd
    import pytest

    import pyro_bnnlv.reproduce.hyvi as hyvi

    calls = []

    def fake(**kwargs):
        calls.append(kwargs)
        table = pd.DataFrame({c: [] for c in hyvi.UCI_COLUMNS})
        table.attrs["summary"] = {}
        return table

    monkeypatch.setattr(hyvi, "uci_experiment", fake)
    monkeypatch.setattr(hyvi, "report", lambda table: 0)
    assert main(["reproduce", "hyvi-uci", "--paper", "--quiet"]) == 0
    kw = calls[-1]
    assert kw["splits"] == 10 and kw["schedule"] is True and kw["lr"] == 0.005
    assert kw["particles"] == 100 and kw["kl_samples"] == 500 and kw["steps"] == 200_000 and kw["num_samples"] == 1000
    assert main(["reproduce", "hyvi-uci", "--paper", "--splits", "3", "--steps", "900", "--quiet"]) == 0
    assert calls[-1]["splits"] == 3 and calls[-1]["steps"] == 900 and calls[-1]["schedule"] is True
    assert main(["reproduce", "hyvi-uci", "--quiet"]) == 0
    assert calls[-1]["splits"] == 2 and "schedule" not in calls[-1]
    for bad in (["reproduce", "hyvi-cosine", "--paper"], ["reproduce", "hyvi-uci", "--paper", "--small"]):
        with pytest.raises(SystemExit):
            main(bad)
