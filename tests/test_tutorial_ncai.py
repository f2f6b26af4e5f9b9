"""The NCAI tutorial runs top to bottom at a small size."""

import runpy
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[1] / "tutorials" / "ncai_nonidentifiability.py"


def test_ncai_tutorial_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRO_BNNLV_TUTORIAL_SMALL", "1")
    monkeypatch.chdir(tmp_path)
    ns = runpy.run_path(str(TUTORIAL), run_name="__main__")
    assert len(ns["table"]) == 4
    assert (tmp_path / "tutorial-ncai-compare.png").exists()
    assert (tmp_path / "tutorial-ncai-uncertainty.png").exists()
    assert set(ns["summary"].index) == {"total", "aleatoric", "epistemic"}
