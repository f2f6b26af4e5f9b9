"""pyro_bnnlv.plotting (issue 40, item 2): every posterior evaluate takes can be plotted, and data
with several inputs get a predicted-vs-observed plot and a calibration curve. The tests read the
figures' data back and check them against direct computations."""

import math

import matplotlib
import numpy as np
import pytest
import torch
from scipy import stats

import pyro_bnnlv as pb
from pyro_bnnlv.plotting import DEFAULT_LEVELS, plot_calibration, plot_predicted_vs_observed, plot_predictive_1d

matplotlib.use("Agg")


def _data(input_dim, n=90, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = 2 * torch.randn(n, input_dim, generator=g) + 1
    y = 4 + 3 * torch.sin(x[:, 0]) + x[:, 1:].sum(-1) + 0.3 * torch.randn(n, generator=g)
    return pb.datasets.from_arrays(x, y, seed=seed)


def _samples(model, S=40, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {"w": 0.7 * torch.randn(S, model.num_weights, generator=g)}


def _laplace(data):
    model = pb.BNN(pb.MLP(data.input_dim, [8], 1), noise_scale=0.3)
    w_map = pb.train_map(model, data.x_train, data.y_train, num_steps=150, progress=False, seed=0)
    return model, pb.LinearizedLaplace(model, w_map).fit(data.x_train, data.y_train)


def _pit(y, loc, scale):
    """Predictive CDF at each target, ``F_n(y_n) = mean_s Phi((y_n - loc_sn) / scale_sn)``."""
    return stats.norm.cdf((y[None, :] - loc) / scale).mean(0)


def _direct_picp(pit, levels):
    """Fraction of targets inside the central interval: ``(1 - l) / 2 <= F_n(y_n) <= (1 + l) / 2``."""
    return [float(np.mean((pit >= (1 - lv) / 2) & (pit <= (1 + lv) / 2))) for lv in levels]


def test_calibration_curve_is_the_coverage_of_the_central_intervals(tmp_path):
    data = _data(3)
    model = pb.BNN(pb.MLP(3, [8], 1), noise_scale=0.5)
    samples = _samples(model)
    fig = plot_calibration(model, samples, data, tmp_path / "cal.png")
    curve, diagonal = fig.axes[0].lines[:2]
    np.testing.assert_allclose(curve.get_xdata(), DEFAULT_LEVELS)
    with torch.no_grad():
        loc = model.f(data.x_test, samples["w"])[..., 0].double().numpy()
    pit = _pit(data.y_test.double().numpy(), loc, 0.5)
    np.testing.assert_allclose(curve.get_ydata(), _direct_picp(pit, DEFAULT_LEVELS), atol=1e-12)
    # each point is evaluate's PICP at that level (evaluate's is k / N in float32: compare k)
    n = len(data.y_test)
    for level, picp in zip(DEFAULT_LEVELS[::6], curve.get_ydata()[::6]):
        assert round(picp * n) == round(pb.evaluate(model, samples, data, level=level)["picp"] * n)
    np.testing.assert_allclose(diagonal.get_xdata(), [0, 1])
    np.testing.assert_allclose(diagonal.get_ydata(), [0, 1])
    assert (tmp_path / "cal.png").stat().st_size > 5000
    # levels= and split=
    fig = plot_calibration(model, samples, data, levels=[0.9, 0.5], split="valid")
    line = fig.axes[0].lines[0]
    with torch.no_grad():
        loc_v = model.f(data.x_valid, samples["w"])[..., 0].double().numpy()
    np.testing.assert_allclose(line.get_xdata(), [0.5, 0.9])
    np.testing.assert_allclose(
        line.get_ydata(), _direct_picp(_pit(data.y_valid.double().numpy(), loc_v, 0.5), [0.5, 0.9]), atol=1e-12
    )


def test_predicted_vs_observed_draws_mean_and_interval_on_the_original_scale():
    data = _data(3)
    model = pb.BNN(pb.MLP(3, [8], 1), noise_scale=0.5)
    samples = _samples(model)
    fig = plot_predicted_vs_observed(model, samples, data, level=0.8)
    ax = fig.axes[0]
    points = ax.containers[0]
    sy, my = float(data.y_std), float(data.y_mean)
    observed = data.y_test.double().numpy() * sy + my
    with torch.no_grad():
        loc = model.f(data.x_test, samples["w"])[..., 0].double()
    np.testing.assert_allclose(points.lines[0].get_xdata(), observed, rtol=1e-6)
    np.testing.assert_allclose(points.lines[0].get_ydata(), loc.mean(0).numpy() * sy + my, rtol=1e-6)
    # the error bars end at the mixture's 10% and 90% quantiles: F(lower) = 0.1, F(upper) = 0.9
    segments = np.asarray(points.lines[2][0].get_segments())  # (N, 2 ends, (x, y))
    lower, upper = ((segments[:, k, 1] - my) / sy for k in (0, 1))
    np.testing.assert_allclose(_pit(lower, loc.numpy(), 0.5), 0.1, atol=1e-8)
    np.testing.assert_allclose(_pit(upper, loc.numpy(), 0.5), 0.9, atol=1e-8)
    picp = pb.evaluate(model, samples, data, level=0.8)["picp"]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"predictive mean, 80% interval (PICP {picp:.2f})" in texts and "predicted = observed" in texts
    assert ax.get_xlabel() == f"observed y (test, {len(data.y_test)} points)"


def test_plots_take_a_linearized_laplace_and_its_guide():
    data1 = _data(1)
    model, la = _laplace(data1)
    fig = plot_predictive_1d(model, la, data1, num_grid=50)
    ax = fig.axes[0]
    x = ax.lines[0].get_xdata()
    pred = la.predictive(
        torch.as_tensor((x - float(data1.x_mean[0])) / float(data1.x_std[0]), dtype=torch.float32).unsqueeze(-1)
    )
    sy, my = float(data1.y_std), float(data1.y_mean)
    mean = pred.mean[:, 0].numpy() * sy + my
    np.testing.assert_allclose(ax.lines[0].get_ydata(), mean, rtol=1e-5)
    # the band is the exact Gaussian 95% interval: fill_between's polygon runs along the lower
    # edge (vertices 1..N) and back along the upper one (vertices N+2..2N+1)
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    half = stats.norm.ppf(0.975) * pred.var[:, 0].sqrt().numpy() * sy
    np.testing.assert_allclose(band[1:51], mean - half, rtol=1e-5)
    np.testing.assert_allclose(band[52:102][::-1], mean + half, rtol=1e-5)
    # the sampled Laplace is a guide: plotted like any guide
    fig = plot_predictive_1d(model, la.as_guide(), data1, num_grid=20, num_samples=30)
    assert len(fig.axes[0].lines[0].get_ydata()) == 20

    data3 = _data(3)
    model3, la3 = _laplace(data3)
    fig = plot_calibration(model3, la3, data3, levels=[0.2, 0.5, 0.95])
    pred = la3.predictive(data3.x_test)
    pit = stats.norm.cdf((data3.y_test.double().numpy() - pred.mean[:, 0].numpy()) / pred.var[:, 0].sqrt().numpy())
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), _direct_picp(pit, [0.2, 0.5, 0.95]), atol=1e-12)
    for level, picp in zip([0.2, 0.5, 0.95], fig.axes[0].lines[0].get_ydata()):
        expected = la3.evaluate(data3.x_test, data3.y_test, level=level)["picp"]
        assert picp == pytest.approx(expected, abs=1e-12)
    fig = plot_predicted_vs_observed(model3, la3, data3)
    sy, my = float(data3.y_std), float(data3.y_mean)
    segments = np.asarray(fig.axes[0].containers[0].lines[2][0].get_segments())
    half = stats.norm.ppf(0.975) * pred.var[:, 0].sqrt().numpy() * sy
    np.testing.assert_allclose(segments[:, 1, 1] - segments[:, 0, 1], 2 * half, rtol=1e-6)


def test_bnnlv_calibration_matches_evaluate_with_the_same_seed():
    data = _data(2, n=40)
    model = pb.BNNLV(pb.MLP(3, [5], 1), latent_dim=1, noise_scale=0.4)
    samples = _samples(model, S=20)
    fig = plot_calibration(model, samples, data, levels=[0.5, 0.9], seed=3, latent_draws=8)
    n = len(data.y_test)  # evaluate's PICP is k / n in float32: compare k
    for level, picp in zip([0.5, 0.9], fig.axes[0].lines[0].get_ydata()):
        expected = pb.evaluate(model, samples, data, level=level, seed=3, latent_draws=8)["picp"]
        assert round(picp * n) == round(expected * n)


def test_errors_name_the_argument_and_the_way_out():
    data = _data(3)
    model = pb.BNN(pb.MLP(3, [8], 1), noise_scale=0.5)
    samples = _samples(model)
    with pytest.raises(
        ValueError, match="needs 1-D inputs; the data set has 3.*plot_predicted_vs_observed.*plot_calibration"
    ):
        plot_predictive_1d(model, samples, data)
    with pytest.raises(TypeError, match="data must be a pyro_bnnlv Dataset.*from_arrays"):
        plot_calibration(model, samples, (data.x_test, data.y_test))
    with pytest.raises(ValueError, match="level must lie in \\(0, 1\\).*level=0.95"):
        plot_calibration(model, samples, data, levels=[0.5, 95])
    with pytest.raises(ValueError, match="levels must be a non-empty sequence"):
        plot_calibration(model, samples, data, levels=[])
    with pytest.raises(ValueError, match="split must be one of"):
        plot_predicted_vs_observed(model, samples, data, split="validation")
    assert math.isfinite(pb.evaluate(model, samples, data)["test_ll"])
