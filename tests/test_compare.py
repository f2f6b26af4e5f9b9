import math

import pandas as pd

from pyro_bnnlv.cli import main
from pyro_bnnlv.compare import COLUMNS, METHODS, CompareConfig, run_compare


def test_compare_end_to_end_tiny(tmp_path, capsys):
    csv, png = tmp_path / "t.csv", tmp_path / "t.png"
    code = main(["compare", "goldberg", "--steps", "30", "--restarts", "1", "--quiet",
                 "--output", str(csv), "--figure", str(png),
                 "--grid", "eps_T=0.01", "eps_y=0.1,0.5"])  # fmt: skip
    assert code == 0
    table = pd.read_csv(csv)
    assert list(table.columns) == COLUMNS
    assert list(table["method"]) == list(METHODS)
    assert table[["test_ll", "rmse", "picp", "mpiw", "seconds"]].notna().all().all()
    assert math.isnan(table.loc[0, "mi_x_z"]) and table.loc[1:, "hz_z"].notna().all()
    assert png.stat().st_size > 20_000
    assert "NCAI grid points=2" in capsys.readouterr().out


def test_full_preset_is_the_papers_grid():
    cfg = CompareConfig.full(steps=5)
    assert cfg.steps == 5 and cfg.restarts == 10 and cfg.empirical_bayes
    assert len(cfg.ncai_grid) == 8 and cfg.lv_noise_vars == (0.1, 0.01)


def test_compare_with_empirical_bayes_runs():
    cfg = CompareConfig(steps=10, restarts=1, empirical_bayes=True, num_samples=20, map_steps=10)
    table, fits = run_compare("williams", cfg, progress=False)
    assert table["test_ll"].notna().all()
    assert fits["BNN+LV (MFVI)"].model.prior_scale[0].item() != 1.0  # EB moved the prior
