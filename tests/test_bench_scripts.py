"""The measurement scripts under docs/bench run and report what their docstrings say."""

import importlib.util
import math
from pathlib import Path

import pytest

from pyro_bnnlv.sweep import Task

BENCH = Path(__file__).parents[1] / "docs" / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("method", ["MFVI", "NN-MFVI", "NN-HyVI"])
def test_knn_kl_width_fit_task_reports_its_diagnostics(method):
    width = _load("knn_kl_width")
    out = width.fit_task(Task("boston", method=method, split=0, grid={"steps": 5}, seed=0))
    assert out["steps_run"] == 5 and 0 < out["noise_scale"] < 1 and math.isfinite(out["test_ll"])
    assert 0 < out["sd_ratio_median"] and 0 <= out["share_wider_than_prior"] <= 1 and math.isfinite(out["knn_kl"])
    # a mean-field guide has an exact KL to the prior; a hypernet guide has no density
    assert math.isfinite(out["exact_kl"]) == method.endswith("MFVI")
    if method.endswith("MFVI"):  # a guide at its init (sd 0.01) is far narrower than the prior, KL large
        assert out["sd_ratio_median"] < 0.1 and out["exact_kl"] > 1000


def test_proj_early_stopping_check_script_runs_and_stops_where_its_rule_says(monkeypatch, capsys, tmp_path):
    import json
    import sys

    script = _load("proj_early_stopping_check")
    assert script.stop_at([1.0, 2.0, 1.5, 1.9, 1.0], patience=3) == (1, 4)  # 3 checks without improvement
    assert script.stop_at([1.0, 2.0, 3.0], patience=3) == (2, 2)  # never stops: the last check
    out = tmp_path / "traj.json"
    monkeypatch.setattr(sys, "argv", ["x", "yacht", "0.01", "--steps", "2500", "--out", str(out)])
    script.main()
    text = capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert [r["step"] for r in rows] == list(range(100, 2600, 100))
    for rule in script.RULES:
        assert f"  {rule} " in text
    assert all(math.isfinite(r[k]) for r in rows for k in (*script.RULES, "test500"))


def test_ncai_family_exact_posterior_matches_the_gaussian_case_in_closed_form(capsys):
    """Additive effect: y = f(x) + c z + e is Gaussian in z, so p(z | x, y) = N(c (y - f) / (c^2 +
    s^2), s^2 / (c^2 + s^2)); the grid's means and the draws' moments agree with it."""
    import numpy as np

    script = _load("ncai_family_exact_posterior")
    problem = script.FAMILY[0]
    assert problem.effect == "additive"
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (4000, problem.input_dim))
    y = problem.mean(x, rng.normal(size=4000)) + rng.normal(0, problem.noise_var**0.5, 4000)
    mean, draw = script.exact_posterior(problem, x, y, np.random.default_rng(1))
    c, s2 = problem.amplitude, problem.noise_var
    exact_mean, exact_var = c * (y - problem.f(x)) / (c**2 + s2), s2 / (c**2 + s2)
    assert np.abs(mean - exact_mean).max() < 1e-6
    standardised = (draw - exact_mean) / exact_var**0.5  # N(0, 1) if the draws are exact
    assert abs(standardised.mean()) < 0.06 and abs(standardised.std() - 1) < 0.06
    table = script.main(["--problems", "2"])
    assert list(table["problem"]) == ["00", "01"] and "I(x; E[z|x,y])" in capsys.readouterr().out


def test_ncai_family_multiscale_scales_prints_every_size_and_the_nulls(monkeypatch, capsys):
    import sys

    script = _load("ncai_family_multiscale_scales")
    monkeypatch.setattr(sys, "argv", ["x", "--problem", "0", "--restart", "0", "--steps", "20", "--draws", "2"])
    script.main()
    text = capsys.readouterr().out
    assert "ncai-family-00, restart 0" in text and "x permuted (k=5)" in text
    for m in (8, 16, 32, 64, 128, 256):
        assert f"m = {m:3d}: I_m" in text
    assert text.count("ms per forward and backward") == 2


def test_ncai_family_heavy_tails_prints_both_fits_and_the_buckets(monkeypatch, capsys):
    import sys

    script = _load("ncai_family_heavy_tails")
    monkeypatch.setattr(sys, "argv", ["x", "--problem", "19", "--restart", "0", "--steps", "10", "--num-samples", "20"])
    script.main()
    text = capsys.readouterr().out
    for method in script.METHODS:
        assert f"{method}: valid LL" in text
    assert text.count("|y - mean| in quantiles") == 4 and "5% most extreme points" in text
    assert text.count("test LL with z* from the latent means") == 2 and "worst 1% of test points" in text
    assert "excess kurtosis" in text and "skewness" in text


def test_ncai_family_init_skew_prints_both_inits_the_mechanisms_and_the_table(monkeypatch, capsys):
    import sys

    script = _load("ncai_family_init_skew")
    argv = ["x", "--problems", "19", "--restarts", "0", "--steps", "10", "--num-samples", "20", "--redraws", "5"]
    monkeypatch.setattr(sys, "argv", [*argv, "--ablations"])
    script.main()
    text = capsys.readouterr().out
    for method in script.METHODS:
        assert f"{method} step 0: test LL" in text and f"{method} trained: valid LL" in text
    assert text.count("guide means at step 0") == 2 and "latent-input weights negated" in text
    assert "5 Xavier redraws" in text and "(i) latent means redrawn" in text
    replay = next(line for line in text.splitlines() if "replay of _fit" in line)
    ours, theirs = (float(v) for v in replay.replace("vs _fit_task's", "").split("valid LL")[1].split())
    assert ours == theirs  # the ablations' training is _fit's
    assert "\n19 0 | " in text


def test_machine_stalls_finds_a_gap_where_the_loop_was_stopped(monkeypatch, capsys):
    import sys
    import time

    script = _load("machine_stalls")
    real_clock, calls = time.perf_counter, [0]

    def clock():  # the 20th reading comes 0.3 s late: one stop of the loop
        calls[0] += 1
        return real_clock() + (0.3 if calls[0] >= 20 else 0.0)

    monkeypatch.setattr(script.time, "perf_counter", clock)
    wall, cpu, gaps = script.stalls(0.05, 0.1)
    assert len(gaps) == 1 and 0.3 <= gaps[0] < 0.4 and wall >= 0.3 and cpu >= 0
    monkeypatch.setattr(script.time, "perf_counter", real_clock)
    monkeypatch.setattr(sys, "argv", ["machine_stalls.py", "--seconds", "0.05"])
    script.main()
    out = capsys.readouterr().out
    assert out.startswith("wall ") and "% of the wall time" in out


def test_ncai_issue_case_prints_each_terms_table_and_its_fits(monkeypatch, capsys, tmp_path):
    import functools
    import sys

    from pyro_bnnlv.reproduce.ncai_compare import CompareConfig

    script = _load("ncai_issue_case")
    small = functools.partial(CompareConfig, map_steps=5, num_samples=20, latent_draws=2)
    monkeypatch.setattr(script, "CompareConfig", small)
    monkeypatch.setattr(sys, "argv", ["x", "--terms", "knn-mi-wide", "--steps", "5", "--out", str(tmp_path)])
    script.main()
    out = capsys.readouterr().out
    assert "== independence=knn-mi-wide" in out and (tmp_path / "knn-mi-wide").is_dir()
    fits = [line for line in out.splitlines() if line.startswith("BNN+LV") and "restart" in line]
    assert len(fits) == 6  # MFVI, NCAI_0 and NCAI_lambda, two restarts each
    assert all("final_indep_x" in line for line in fits if "NCAI_lambda" in line)
    assert not any("final_" in line for line in fits if "NCAI_lambda" not in line)
