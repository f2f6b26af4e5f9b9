"""The in-between-uncertainty tutorial runs top to bottom at its small size
(PYRO_BNNLV_TUTORIAL_SMALL=1) and its headline checks hold even there."""

import math
import runpy
import time
import warnings
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[1] / "tutorials" / "in_between_uncertainty.py"


def test_in_between_tutorial_runs_at_small_size(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRO_BNNLV_TUTORIAL_SMALL", "1")
    monkeypatch.setenv("PYRO_BNNLV_TUTORIAL_OUT", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(tmp_path)
    import matplotlib

    matplotlib.use("Agg")
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ns = runpy.run_path(str(TUTORIAL), run_name="__main__")
    assert time.perf_counter() - t0 < 60
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
