"""The HyVI tutorial runs top to bottom at its small size (PYRO_BNNLV_TUTORIAL_SMALL=1)."""

import math
import runpy
import warnings
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[1] / "tutorials" / "hypernet_vi.py"


def test_hyvi_tutorial_runs_at_small_size(tmp_path, monkeypatch):
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
    table = ns["uncertainty"]
    assert list(table.index) == ["MFVI", "NN-HyVI", "FuNN-HyVI"]
    assert table.notna().all().all()
    assert all(0.0 <= v <= 1.0 for v in ns["ood_auroc"])
    assert all(math.isfinite(v) for v in table["test LL"])
    for name in ("hyvi_predictive.png", "hyvi_entropy_FuNN-HyVI.png"):
        assert (tmp_path / name).stat().st_size > 0
