"""The Proj-BNN tutorial runs top to bottom at its small size (PYRO_BNNLV_TUTORIAL_SMALL=1)."""

import runpy
import warnings
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[1] / "tutorials" / "projected_bnn.py"


def test_projected_tutorial_runs_at_small_size(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRO_BNNLV_TUTORIAL_SMALL", "1")
    monkeypatch.setenv("PYRO_BNNLV_TUTORIAL_OUT", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(tmp_path)
    import matplotlib

    matplotlib.use("Agg")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ns = runpy.run_path(str(TUTORIAL), run_name="__main__")
    assert ns["SMALL"] is True
    table = ns["modes"]
    assert list(table.index) == ["candidates", "MFVI on w", "Proj-BNN (qz-only)", "Proj-BNN (full)"]
    assert table.notna().all().all()
    # the candidates are MAP fits of three bumps (the toy's premise)
    assert table.loc["candidates", "fits >= 3"] >= 0.5
    assert (tmp_path / "projected_four_modes.png").stat().st_size > 0
