"""The NUTS tutorial runs top to bottom at its small size (PYRO_BNNLV_TUTORIAL_SMALL=1)."""

import runpy
import time
import warnings
from pathlib import Path


TUTORIAL = Path(__file__).resolve().parents[1] / "tutorials" / "nuts_gold_standard.py"


def test_nuts_tutorial_runs_at_small_size(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRO_BNNLV_TUTORIAL_SMALL", "1")
    monkeypatch.setenv("PYRO_BNNLV_TUTORIAL_OUT", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(tmp_path)
    import matplotlib

    matplotlib.use("Agg")
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ's refactor notice, Pareto-k warnings at small size
        ns = runpy.run_path(str(TUTORIAL), run_name="__main__")
    assert time.perf_counter() - t0 < 60
    assert ns["SMALL"] is True
    table = ns["comparison"]
    assert list(table.index) == ["MFVI", "NUTS (KL: half vs half)"]
    assert table.notna().all().all()
    assert set(ns["summary"].kind) == {"f", "log_lik", "w"}
    for name in ("nuts_trace_f.png", "nuts_rank_f.png", "nuts_vs_mfvi.png"):
        assert (tmp_path / name).stat().st_size > 0

