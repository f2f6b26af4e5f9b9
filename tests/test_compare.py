import math

import pandas as pd
import pytest

from pyro_bnnlv.cli import main
from pyro_bnnlv.reproduce.ncai_compare import (
    COLUMNS,
    METHODS,
    CompareConfig,
    load_compare_data,
    run_compare,
    select_fits,
)


def test_compare_end_to_end_tiny(tmp_path, capsys):
    csv, png = tmp_path / "t.csv", tmp_path / "t.png"
    code = main(
        [
            "compare",
            "goldberg",
            "--steps",
            "30",
            "--restarts",
            "1",
            "--quiet",
            "--output",
            str(csv),
            "--figure",
            str(png),
            "--grid",
            "eps_T=0.01",
            "eps_y=0.1,0.5",
        ]
    )
    assert code == 0
    table = pd.read_csv(csv)
    assert list(table.columns) == COLUMNS
    assert list(table["method"]) == list(METHODS)
    assert table[["test_ll", "rmse", "picp", "mpiw", "seconds"]].notna().all().all()
    assert math.isnan(table.loc[0, "mi_x_z"]) and table.loc[1:, "hz_z"].notna().all()
    assert png.stat().st_size > 20_000
    assert "NCAI grid points=2" in capsys.readouterr().out
    sel = table.set_index("method")["selected"]
    assert (
        sel["BNN (MFVI)"].startswith("noise_var=")
        and "eps_T=0.01" in sel["BNN+LV (NCAI_lambda)"]
        or sel["BNN+LV (NCAI_lambda)"].startswith("lambda=0")
    )


def test_full_preset_is_the_papers_grid():
    cfg = CompareConfig.full(steps=5)
    assert cfg.steps == 5 and cfg.restarts == 10 and cfg.empirical_bayes
    assert cfg.lv_noise_vars == (0.1, 0.01) and cfg.independence == "hsic"
    points = {(p["eps_T"], p["eps_x"]) for p in cfg.ncai_grid}
    assert points == {(t, e) for t in (0.01, 0.0003) for e in (0.1, 0.5, 1.0)}
    pc = CompareConfig.full(independence="pc")
    assert len(pc.ncai_grid) == 10  # App. F.1's 8 and Table 15's selected (eps_x, eps_y) = (0.1, 1.0)
    assert {"eps_T": 0.0003, "eps_x": 0.1, "eps_y": 1.0}.items() <= pc.ncai_grid[-1].items()


def test_full_preset_uses_app_f1_noise_grids_per_data_set():
    from pyro_bnnlv.reproduce.ncai_compare import compare_tasks

    dep = CompareConfig.full(dataset="depeweg")
    assert dep.bnn_noise_vars == (1.0, 0.1, 0.5) and dep.lv_noise_vars == (0.1,)
    noise = {(t.method, t.params["noise_var"]) for t in compare_tasks("depeweg", dep)}
    assert {v for m, v in noise if m == "BNN (MFVI)"} == {1.0, 0.1, 0.5}
    assert {v for m, v in noise if m != "BNN (MFVI)"} == {0.1}
    # the others keep the generic grids (heavy-tail: as its finished paper-budget run used them)
    for name in ("heavy-tail", "goldberg", "williams", "yuan"):
        assert CompareConfig.full(dataset=name) == CompareConfig.full()
    assert CompareConfig.full(dataset="depeweg", lv_noise_vars=(0.5,)).lv_noise_vars == (0.5,)  # overrides win


def test_synthetic_sets_keep_their_scale_real_sets_are_standardised():
    heavy = load_compare_data("heavy-tail")
    assert not heavy.standardized and heavy.y_train.std() > 3  # sigma_eps^2 = 0.1 means 0.1 here
    assert load_compare_data("yacht").standardized
    # the protocol's split k of a real set is a train/test split, not a validation reseed
    real = load_compare_data("yacht", seed=2)
    assert (real.split, real.seed) == (2, 2) and real.standardized
    assert load_compare_data("heavy-tail", seed=2).seed == 2


def test_compare_with_empirical_bayes_runs():
    cfg = CompareConfig(steps=10, restarts=1, empirical_bayes=True, num_samples=20, map_steps=10)
    table, fits = run_compare("williams", cfg, progress=False)
    assert table["test_ll"].notna().all()
    assert fits["BNN+LV (MFVI)"].model.prior_scale[0].item() != 1.0  # EB moved the prior
    assert fits["BNN+LV (MFVI)"].model.latent_scale.item() != 1.0  # williams: sigma_z^2 by EB
    for method in ("BNN+LV (NCAI_0)", "BNN+LV (NCAI_lambda)"):
        h = fits[method].history  # logged during training: loss terms and I(x; mu_z)
        assert len(h) == 10 and h["elbo_loss"].notna().all() and h["mi_x_mu_z"].notna().sum() == 1
    fixed = run_compare("heavy-tail", cfg, progress=False)[1]
    assert fixed["BNN+LV (MFVI)"].model.latent_scale.item() == pytest.approx(0.1)  # App. F.1 fixes it
    assert fixed["BNN+LV (MFVI)"].model.prior_scale[0].item() != 1.0


def test_selection_takes_ncai_0_where_it_validates_better():
    rows = []
    for split, (zero, lam) in enumerate([(-1.0, -1.2), (-1.5, -1.1)]):
        for method, ll, setting in [
            ("BNN (MFVI)", -2.0, "noise_var=1"),
            ("BNN+LV (MFVI)", -1.8, "noise_var=0.1"),
            ("BNN+LV (NCAI_0)", zero, "noise_var=0.1"),
            ("BNN+LV (NCAI_lambda)", lam, "noise_var=0.1, eps_T=0.01, eps_x=0.5"),
            ("BNN+LV (NCAI_lambda)", lam - 1, "noise_var=0.1, eps_T=0.0003, eps_x=0.5"),
        ]:
            rows.append(
                dict(
                    dataset="d",
                    split=split,
                    method=method,
                    valid_ll=ll,
                    setting=setting,
                    test_ll=ll - 0.1,
                    status="done",
                )
            )
    chosen = select_fits(pd.DataFrame(rows)).set_index(["split", "method"])
    assert chosen.loc[(0, "BNN+LV (NCAI_lambda)"), "selected"] == "lambda=0 (noise_var=0.1)"
    assert chosen.loc[(0, "BNN+LV (NCAI_lambda)"), "test_ll"] == pytest.approx(-1.1)
    assert chosen.loc[(1, "BNN+LV (NCAI_lambda)"), "selected"].endswith("eps_T=0.01, eps_x=0.5")
    assert list(chosen.loc[0].index) == list(METHODS)


def test_compare_table_is_the_same_inline_and_on_two_workers():
    cfg = CompareConfig(steps=20, restarts=1, num_samples=30, map_steps=20)
    tables = [
        run_compare("yuan", cfg, progress=False, executor=ex, workers=w)[0]
        for ex, w in (("inline", None), ("local", 2))
    ]
    numbers = ["test_ll", "rmse", "picp", "mpiw", "mi_x_z", "hz_z"]
    pd.testing.assert_frame_equal(tables[0][numbers], tables[1][numbers])
    assert list(tables[0]["selected"]) == list(tables[1]["selected"])


def test_reproduce_ncai_protocol_smoke_and_resume(tmp_path, capsys, monkeypatch):
    from pyro_bnnlv.reproduce.ncai import CompareConfig, main as protocol

    # the command's own settings, with a smoke test's MAP initialisation and evaluation sizes
    full = CompareConfig.full
    monkeypatch.setattr(
        CompareConfig, "full", lambda **kw: full(**{"map_steps": 50, "num_samples": 50, "latent_draws": 8, **kw})
    )

    argv = [
        "--datasets",
        "yuan",
        "--steps",
        "5",
        "--restarts",
        "1",
        "--splits",
        "1",
        "--executor",
        "inline",
        "--out",
        str(tmp_path),
        "--output",
        str(tmp_path / "p.csv"),
        "--quiet",
    ]
    assert protocol(argv) == 0
    table = pd.read_csv(tmp_path / "p.csv")
    assert sorted(table["method"]) == sorted(METHODS) and (table["split"] == 1).all()
    first = capsys.readouterr().out
    assert protocol(argv) == 0  # resumes: nothing left to run, the same summary
    assert capsys.readouterr().out.splitlines()[:6] == first.splitlines()[:6]


def test_a_split_with_unfinished_restarts_gives_no_row_rather_than_the_best_of_some():
    from pyro_bnnlv.reproduce.ncai import _best_per_split

    rows = [  # split 1: both methods complete; split 2: NCAI_0's second restart still pending
        ("BNN (MFVI)", 1, "done", -2.0),
        ("BNN (MFVI)", 1, "done", -1.5),
        ("BNN+LV (NCAI_0)", 1, "done", -1.2),
        ("BNN+LV (NCAI_0)", 1, "done", -1.4),
        ("BNN (MFVI)", 2, "done", -1.9),
        ("BNN (MFVI)", 2, "done", -2.1),
        ("BNN+LV (NCAI_0)", 2, "done", -1.3),
        ("BNN+LV (NCAI_0)", 2, "pending", float("nan")),
    ]
    results = pd.DataFrame(rows, columns=["method", "split", "status", "valid_ll"])
    best = _best_per_split(results, {"BNN+LV (NCAI_lambda)": "lambda=0"})
    got = sorted(zip(best["method"], best["split"], best["valid_ll"]))
    assert got == [
        ("BNN (MFVI)", 1, -1.5),
        ("BNN (MFVI)", 2, -1.9),
        ("BNN+LV (NCAI_0)", 1, -1.2),
        ("BNN+LV (NCAI_lambda)", 1, -1.2),
    ]


def test_fit_task_is_stored_under_its_registered_name_and_pickles_from_its_module():
    """Stores record ``fit_task`` as ``ncai-compare/fit`` (not a module path, so no alias module is
    needed to resume them), and worker processes unpickle it from its real module."""
    import functools
    import pickle
    from pathlib import Path

    import pyro_bnnlv.reproduce.ncai_compare as compare
    from pyro_bnnlv.sweep.task import describe_fn

    fn = functools.partial(compare.fit_task, config={"steps": 1})
    assert describe_fn(fn) == {"args": [], "kwargs": {"config": {"steps": 1}}, "function": "ncai-compare/fit"}
    assert compare.fit_task.__module__ == "pyro_bnnlv.reproduce.ncai_compare"
    assert pickle.loads(pickle.dumps(fn)).func is compare.fit_task
    assert not (Path(compare.__file__).parents[1] / "compare.py").exists()  # no alias module


def test_compare_config_refuses_settings_that_would_run_nothing_or_diverge():
    """Issue 39: `compare --restarts 0` ran a sweep of no fits."""
    from pyro_bnnlv.reproduce.ncai_compare import CompareConfig

    for kw, name in [
        (dict(restarts=0), "restarts"),
        (dict(steps=-1), "steps"),
        (dict(lv_noise_vars=()), "lv_noise_vars"),
        (dict(bnn_noise_vars=(0.1, -1.0)), "bnn_noise_vars"),
        (dict(lr=0.0), "lr"),
        (dict(independence="mi"), "independence"),
    ]:
        with pytest.raises(ValueError, match=name):
            CompareConfig(**kw)
    assert CompareConfig.full().restarts == 10


def test_compare_cli_with_zero_restarts_is_a_clean_error(capsys):
    from pyro_bnnlv.cli import main

    assert main(["compare", "heavy-tail", "--restarts", "0"]) == 2
    assert "restarts must be a positive integer, got 0" in capsys.readouterr().err


def test_compare_cli_takes_every_independence_term(tmp_path, capsys):
    """``--independence`` offers NCAIElbo's terms (the family benchmark's too), and the run's
    header line says which one it fits with."""
    from pyro_bnnlv.infer.elbos.ncai import INDEPENDENCE_TERMS

    csv = tmp_path / "t.csv"
    argv = ["compare", "goldberg", "--steps", "20", "--restarts", "1", "--quiet", "--no-plot", "--executor", "inline"]
    assert main([*argv, "--independence", "knn-mi-multiscale", "--output", str(csv)]) == 0
    assert "independence term=knn-mi-multiscale," in capsys.readouterr().out
    assert pd.read_csv(csv)["method"].tolist() == list(METHODS)
    from pyro_bnnlv.cli import _parser

    compare = _parser()._subparsers._group_actions[0].choices["compare"]
    action = next(a for a in compare._actions if a.dest == "independence")
    assert tuple(action.choices) == INDEPENDENCE_TERMS
