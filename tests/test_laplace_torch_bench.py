"""``pyro-bnnlv bench laplace-torch`` (issue 42): the message where laplace-torch is missing, and a
small comparison where it is importable.

laplace-torch is not a dependency of pyro_bnnlv and CI does not install it, so the comparison
test skips there (``pytest.importorskip("laplace")``); it runs in an environment made as
:data:`~pyro_bnnlv.reproduce.laplace_torch_bench.INSTALL_COMMANDS` says (a virtualenv with the
system's site packages and laplace-torch installed without its dependencies).
"""

from __future__ import annotations

import sys

import pytest

from pyro_bnnlv.cli import main
from pyro_bnnlv.reproduce.bench import BENCHMARKS
from pyro_bnnlv.reproduce.laplace_torch_bench import INSTALL_COMMANDS, laplace_torch_bench


def test_missing_laplace_torch_exits_naming_the_install_commands(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "laplace", None)  # "import laplace" raises ImportError
    assert BENCHMARKS["laplace-torch"][0] is laplace_torch_bench
    with pytest.raises(SystemExit) as exc:
        main(["bench", "laplace-torch"])
    message = str(exc.value.code)
    assert message.startswith("pyro-bnnlv bench laplace-torch needs laplace-torch (import laplace failed")
    for command in INSTALL_COMMANDS:
        assert command in message
    assert "pip install --no-deps laplace-torch==0.3" in message
    assert "torchvision" in message  # says why --no-deps: no torchvision beside the CPU torch


def test_laplace_torch_agrees_on_a_tiny_network():
    """iris, 4-8-3 bias-free tanh network, a short MAP: the probit predictive of every contender
    (both libraries, full and K-FAC / kron, three laplace-torch backends, float32 and float64) is
    within 1e-3 of ours in float64 (float64: within 1e-6), and so is the log marginal likelihood."""
    pytest.importorskip("laplace")
    table = laplace_torch_bench(steps=1, rounds=1, data_sets=("iris",), hidden=8, map_steps=200)
    assert set(table.index.get_level_values("structure")) == {"full", "kfac"}
    assert len(table) == 12
    assert (table["max_dp_probit"] < 1e-3).all()
    f64 = table[table.index.get_level_values("contender").str.endswith("float64")]
    assert (f64["max_dp_probit"] < 1e-6).all()
    assert (f64["d_log_marglik"].abs() < 1e-5).all()
    assert (table["max_dp_mc"] < 0.05).all()  # 10,000 draws each: loose
    assert (table["prior_prec_opt"] > 0).all()
    ours = table.xs("pyro_bnnlv float64", level="contender")["prior_prec_opt"]
    theirs = table.xs("laplace-torch default (CurvlinopsGGN) float64", level="contender")["prior_prec_opt"]
    assert ((theirs / ours - 1).abs() < 0.1).all()  # 100 Adam steps against L-BFGS: loose
    assert (table[["fit_ms", "predict_ms", "total_ms"]] > 0).all().all()
