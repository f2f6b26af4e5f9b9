"""Issue 20: a researcher's own data and own network without reading the source.

Own data (from_arrays / from_frame), evaluate on a Dataset / guide / LinearizedLaplace with a
warning for forgotten standardisation statistics, plots that return figures and take ``ax=``,
ModuleNet fan-in priors, a gradient-free ``model.noise_scale``, readable EmpiricalBayes scales,
the k-NN ELBOs' fast preset, plot_trace and the mixture quantile.
"""

import math
import warnings

import matplotlib
import numpy as np
import pandas as pd
import pyro
import pytest
import torch
from scipy import optimize, stats
from torch import nn

import pyro_bnnlv as pb
from pyro_bnnlv.plotting import plot_predictive_1d
from pyro_bnnlv.stats.latent import plot_uncertainty_decomposition, uncertainty_decomposition
from pyro_bnnlv.stats.ood import ood_report
from pyro_bnnlv.stats.predictive import mixture_interval, mixture_quantile


def _sine_frame(n=60, seed=0):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"x": rng.uniform(-3, 3, n), "other": rng.normal(size=n)})
    df["y"] = 5 + 3 * np.sin(df["x"]) + 0.2 * rng.standard_normal(n)
    return df


@pytest.fixture
def no_backend_switch(monkeypatch):
    """Fail if anything calls matplotlib.use during the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"matplotlib.use{args} was called: plot helpers must not switch the backend")

    monkeypatch.setattr(matplotlib, "use", refuse)


# ---------------------------------------------------------------------------------------------
# own data
# ---------------------------------------------------------------------------------------------
def test_from_frame_split_standardisation_and_repr():
    df = _sine_frame()
    data = pb.datasets.from_frame(df, target="y", features=["x"], seed=3)
    assert data.sizes == (42, 6, 12) and data.input_dim == 1 and data.seed == 3
    # the documented split (default_rng(seed).permutation: test rows, then valid, then train),
    # standardised with the training rows' statistics only
    perm = np.random.default_rng(3).permutation(60)
    train, test = perm[18:], perm[:12]
    y = df["y"].to_numpy()
    assert float(data.y_mean) == pytest.approx(y[train].mean()) and float(data.y_std) == pytest.approx(y[train].std())
    np.testing.assert_allclose(data.y_train * data.y_std + data.y_mean, y[train], rtol=1e-5)
    np.testing.assert_allclose(data.x_test[:, 0] * data.x_std + data.x_mean, df["x"].to_numpy()[test], rtol=1e-5)
    again = pb.datasets.from_arrays(df[["x"]].to_numpy(), torch.tensor(df["y"].to_numpy()), seed=3, name="y")
    assert torch.equal(again.x_test, data.x_test) and torch.equal(again.y_valid, data.y_valid)
    assert "seed=3" in repr(data)
    other = pb.datasets.from_frame(df, target="y", features=["x"], seed=4)
    assert not torch.equal(other.y_test, data.y_test)


def test_from_frame_refuses_what_it_cannot_use():
    df = _sine_frame()
    with pytest.raises(ValueError, match="missing values.*dropna"):
        pb.datasets.from_frame(df.assign(x=df["x"].where(df.index != 3)), target="y")
    with pytest.raises(ValueError, match="not numeric.*get_dummies"):
        pb.datasets.from_frame(df.assign(city="a"), target="y")
    with pytest.raises(ValueError, match="target column 'z'"):
        pb.datasets.from_frame(df, target="z")
    with pytest.raises(ValueError, match="test_fraction"):
        pb.datasets.from_arrays(df[["x"]], df["y"], test_fraction=1.5)


def test_load_dataset_records_split_and_seed():
    data = pb.load_dataset("yacht", split=2, seed=1)
    assert (data.split, data.seed) == (2, 1)
    assert "split=2, seed=1" in repr(data)
    assert pb.load_dataset("yacht").split == 0
    assert pb.load_dataset("cosine", seed=5).split is None


def test_load_dataset_seed_moves_the_validation_subset_not_the_test_split():
    """The docstring's rule: on a UCI set ``seed=`` draws the validation subset (and so moves the
    standardisation statistics) while the test rows stay; ``split=`` picks other test rows."""
    with pytest.warns(UserWarning, match=r"seed only redraws the validation subset.*load_split\('yacht', k\)"):
        b = pb.load_dataset("yacht", seed=1)  # the pitfall is said, not silent
    a, other = pb.load_dataset("yacht", seed=0), pb.load_dataset("yacht", split=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(pb.load_dataset("yacht", split=0, seed=1).y_test, b.y_test)  # explicit: no warning

    def original(d, part):
        return getattr(d, f"y_{part}").double() * float(d.y_std) + float(d.y_mean)

    torch.testing.assert_close(original(a, "test"), original(b, "test"), rtol=1e-5, atol=1e-5)
    assert float(a.y_mean) != float(b.y_mean)
    assert not torch.equal(torch.sort(original(a, "valid")).values, torch.sort(original(b, "valid")).values)
    assert a.x_test.shape != other.x_test.shape or not torch.allclose(original(a, "test"), original(other, "test"))


# ---------------------------------------------------------------------------------------------
# evaluate
# ---------------------------------------------------------------------------------------------
def _fitted(data, steps=60):
    model = pb.BNN(pb.MLP(data.input_dim, [10], 1), noise_scale=0.3)
    guide = pb.MeanField(model)
    pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=steps, lr=0.01, seed=0, progress=False)
    return model, guide


def test_evaluate_takes_a_dataset_a_guide_and_warns_on_forgotten_statistics():
    data = pb.datasets.from_frame(_sine_frame(), target="y", features=["x"])
    model, guide = _fitted(data)
    samples = pb.sample_posterior(model, guide, data.x_train, num_samples=200, seed=1)
    explicit = pb.evaluate(model, samples, data.x_test, data.y_test, y_mean=data.y_mean, y_std=data.y_std)
    pd.testing.assert_series_equal(pb.evaluate(model, samples, data), explicit)
    # a guide: the same draws as sample_posterior with the same seed
    pd.testing.assert_series_equal(pb.evaluate(model, guide, data, num_samples=200, seed=1), explicit)
    valid = pb.evaluate(model, samples, data, split="valid")
    pd.testing.assert_series_equal(
        valid, pb.evaluate(model, samples, data.x_valid, data.y_valid, y_mean=data.y_mean, y_std=data.y_std)
    )
    with pytest.warns(UserWarning, match="standardised scale.*y_mean=data.y_mean"):
        standardised = pb.evaluate(model, samples, data.x_test, data.y_test)
    # the warning is right: those numbers differ from the original-scale ones by log(y_std)
    assert standardised["test_ll"] - explicit["test_ll"] == pytest.approx(math.log(float(data.y_std)), rel=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pb.evaluate(model, samples, data.x_test, data.y_test, y_mean=0.0, y_std=1.0)  # on purpose


def test_evaluate_takes_a_linearized_laplace():
    data = pb.datasets.from_frame(_sine_frame(), target="y", features=["x"])
    model = pb.BNN(pb.MLP(1, [10], 1), noise_scale=0.3)
    w_map = pb.train_map(model, data.x_train, data.y_train, num_steps=100, progress=False)
    la = pb.LinearizedLaplace(model, w_map).fit(data.x_train, data.y_train)
    expected = la.evaluate(data.x_test, data.y_test, y_mean=data.y_mean, y_std=data.y_std)
    pd.testing.assert_series_equal(pb.evaluate(model, la, data), expected)


def test_evaluate_guide_of_bnnlv_needs_the_training_points():
    data = pb.load_dataset("heavy-tail", sizes=(40, 20, 20))
    model = pb.BNNLV(pb.MLP(2, [5], 1), latent_dim=1, noise_scale=0.3)
    guide = pyro.infer.autoguide.AutoNormal(model, create_plates=model.create_plates)
    pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=5, progress=False)
    with pytest.raises(ValueError, match="train_data"):
        pb.evaluate(model, guide, data.x_test, data.y_test)
    assert math.isfinite(pb.evaluate(model, guide, data, num_samples=20, seed=0)["test_ll"])


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------
def test_plots_return_figures_take_ax_and_keep_the_backend(tmp_path, no_backend_switch):
    import matplotlib.figure
    import matplotlib.pyplot as plt

    data = pb.datasets.from_frame(_sine_frame(), target="y", features=["x"])
    model, guide = _fitted(data, steps=20)
    fig = plot_predictive_1d(model, guide, data, num_samples=50)
    assert isinstance(fig, matplotlib.figure.Figure)
    # drawn on the original scale of x
    xs = fig.axes[0].lines[0].get_xdata()
    assert xs.min() < data.x_train.min() * data.x_std + data.x_mean
    outer, axes = plt.subplots(1, 2)
    assert plot_predictive_1d(model, guide, data, ax=axes[1], num_samples=50) is outer
    assert axes[1].lines and not axes[0].lines
    plot_predictive_1d(model, guide, data, tmp_path / "p.png", num_samples=50)
    assert (tmp_path / "p.png").stat().st_size > 5000
    plt.close("all")


def test_uncertainty_decomposition_plot_on_the_original_scale(no_backend_switch):
    import matplotlib.pyplot as plt

    data = pb.load_dataset("heavy-tail", sizes=(40, 20, 20), standardize=True)
    model = pb.BNNLV(pb.MLP(2, [5], 1), latent_dim=1, noise_scale=0.3)
    w = torch.randn(10, model.num_weights, generator=torch.Generator().manual_seed(0))
    frame = uncertainty_decomposition(model, w, data.x_test, num_inner=30)
    fig = plot_uncertainty_decomposition({"a": frame, "b": frame}, data=data)
    ax = fig.axes[0]
    order = frame.sort_values("x")
    np.testing.assert_allclose(
        ax.lines[0].get_xdata(), order["x"] * float(data.x_std[0]) + float(data.x_mean[0]), rtol=1e-6
    )
    shift = math.log(float(data.y_std))  # H(aY + b) = H(Y) + log a
    np.testing.assert_allclose(ax.lines[0].get_ydata(), order["total"] + shift, rtol=1e-6)
    np.testing.assert_allclose(ax.lines[2].get_ydata(), order["epistemic"], rtol=1e-6)
    assert fig.axes[0].get_shared_y_axes().joined(fig.axes[0], fig.axes[1])
    plt.close("all")


def test_ood_report_compares_methods_on_shared_axes(tmp_path, no_backend_switch):
    model = pb.BNN(pb.MLP(1, [], 1, activation="identity"))
    g = torch.Generator().manual_seed(0)
    wide = torch.stack([1 + 0.3 * torch.randn(300, generator=g), 0.2 * torch.randn(300, generator=g)], 1)
    narrow = wide * torch.tensor([0.1, 1.0]) + torch.tensor([0.9, 0.0])
    near, far = torch.linspace(-0.5, 0.5, 30)[:, None], torch.linspace(3, 4, 30)[:, None]
    frame = ood_report(model, {"wide": wide, "narrow": narrow}, near, near, far, figure=tmp_path / "ood.png")
    assert list(frame.index.names) == ["method", "split"]
    single = ood_report(model, wide, near, near, far)
    pd.testing.assert_frame_equal(frame.loc["wide"], single)
    assert frame.loc[("narrow", "ood"), "mean"] < frame.loc[("wide", "ood"), "mean"]
    assert (tmp_path / "ood.png").stat().st_size > 5000
    from pyro_bnnlv.stats.ood import plot_ood_comparison

    fig = plot_ood_comparison({"wide": single, "again": single})
    a, b = fig.axes[:2]
    assert a.get_shared_x_axes().joined(a, b) and a.get_xlim() == b.get_xlim()


def test_other_plot_helpers_draw_into_given_axes(no_backend_switch):
    """ax= / axes= for the helpers besides plot_predictive_1d: each returns the caller's figure,
    draws into the given axes only, and writes no file without a path."""
    import matplotlib.pyplot as plt

    from pyro_bnnlv.stats.ood import plot_epistemic_histograms, plot_ood_comparison

    outer, axes = plt.subplots(3, 3)
    rng = np.random.default_rng(0)
    ent = {"test": rng.normal(size=50), "ood": rng.normal(1, 1, size=50)}
    assert plot_epistemic_histograms(ent, ax=axes[0, 0]) is outer
    assert axes[0, 0].patches and not axes[0, 1].patches
    model = pb.BNN(pb.MLP(1, [], 1, activation="identity"))
    g = torch.Generator().manual_seed(0)
    w = torch.stack([1 + 0.3 * torch.randn(100, generator=g), 0.2 * torch.randn(100, generator=g)], 1)
    near, far = torch.linspace(-0.5, 0.5, 20)[:, None], torch.linspace(3, 4, 20)[:, None]
    rep = ood_report(model, w, near, near, far)
    assert plot_ood_comparison({"a": rep, "b": rep}, axes=[axes[1, 0], axes[1, 1]]) is outer
    assert axes[1, 0].patches and axes[1, 1].patches and not axes[1, 2].patches
    with pytest.raises(ValueError, match="axes has 1 entries for 2"):
        plot_ood_comparison({"a": rep, "b": rep}, axes=[axes[1, 2]])
    lv = pb.BNNLV(pb.MLP(2, [5], 1), latent_dim=1, noise_scale=0.3)
    frame = uncertainty_decomposition(lv, torch.randn(5, lv.num_weights, generator=g), near, num_inner=10)
    assert plot_uncertainty_decomposition({"a": frame}, axes=[axes[2, 0]]) is outer
    assert len(axes[2, 0].lines) == 3 and not axes[2, 1].lines
    data = pb.load_dataset("cosine", sizes=(30, 10, 10))
    bnn = pb.BNN(pb.MLP(1, [5], 1), noise_scale=0.1)
    idata = pb.to_inference_data(
        bnn, {"w": 0.1 * torch.randn(2, 15, bnn.num_weights, generator=g)}, data.x_train, data.y_train, seed=0
    )
    trace_fig, trace_axes = plt.subplots(2, 2)
    assert pb.diagnostics.plot_trace(idata, f_points=[0], axes=trace_axes) is trace_fig
    assert all(ax.lines or ax.patches for ax in trace_axes.ravel())
    plt.close("all")


def test_no_library_code_switches_the_matplotlib_backend():
    """An interactive session's backend is the user's: no module of the package may call
    ``matplotlib.use`` or ``pyplot.switch_backend`` (a plot helper of issue 17 did, after the
    issue-20 clean-up had removed the others)."""
    import re
    from pathlib import Path

    root = Path(pb.__file__).parent
    offenders = [
        f"{p.relative_to(root)}:{i}"
        for p in root.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"matplotlib\.use\(|switch_backend\(", line) and not line.lstrip().startswith("#")
    ]
    assert not offenders, offenders


def test_plot_trace_shows_function_values_and_log_likelihood(no_backend_switch):
    import matplotlib.pyplot as plt

    data = pb.load_dataset("cosine", sizes=(30, 10, 10))
    model = pb.BNN(pb.MLP(1, [5], 1), noise_scale=0.1)
    g = torch.Generator().manual_seed(0)
    samples = {"w": 0.1 * torch.randn(2, 15, model.num_weights, generator=g)}
    idata = pb.to_inference_data(model, samples, data.x_train, data.y_train, seed=0)
    fig = pb.diagnostics.plot_trace(idata, num_points=3)
    assert len(fig.axes) == 2 * 4  # f at 3 inputs + the log-likelihood, histogram and trace each
    assert fig.axes[-1].lines[0].get_ydata().shape == (15,) and len(fig.axes[-1].lines) == 2
    plt.close("all")


# ---------------------------------------------------------------------------------------------
# own networks, noise, empirical Bayes
# ---------------------------------------------------------------------------------------------
def test_fan_in_prior_scale_reads_modulenet_layers():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    net = pb.ModuleNet(seq, 6, 1)
    assert torch.equal(pb.fan_in_prior_scale(net, omega=3.0), pb.fan_in_prior_scale(pb.MLP(6, [32, 32], 1), omega=3.0))
    assert net.param_slices()["2.weight"] == slice(6 * 32 + 32, 6 * 32 + 32 + 32 * 32)
    conv = pb.ModuleNet(
        nn.Sequential(nn.Unflatten(1, (1, 8)), nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(12, 1)), 8, 1
    )
    fan = conv.layer_fan_in()
    assert set(fan[conv.param_slices()["1.weight"]].tolist()) == {3.0}  # 1 channel x kernel 3
    with pytest.raises(ValueError, match=r"\['1.weight', '1.bias'\].*prior_scale"):
        pb.fan_in_prior_scale(pb.ModuleNet(nn.Sequential(nn.Linear(2, 3), nn.LayerNorm(3), nn.Linear(3, 1)), 2, 1))


def test_noise_scale_reads_without_gradient_and_is_still_learned():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(200, 1, generator=g) * 2 - 1
    y = 2 * x[:, 0] + 0.1 * torch.randn(200, generator=g)
    model = pb.BNN(pb.MLP(1, [], 1, activation="identity"), noise_scale=0.5, learn_noise=True)
    assert not model.noise_scale.requires_grad
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float(model.noise_scale) == pytest.approx(0.5) and model.noise_scale.item() == pytest.approx(0.5)
    guide = pb.MeanField(model)
    pb.fit_svi(model, guide, x, y, num_steps=600, lr=0.02, seed=0, progress=False)
    assert float(model.noise_scale) < 0.2  # from 0.5 towards the true 0.1
    fixed = pb.BNN(pb.MLP(1, [], 1), noise_scale=0.3)
    assert float(fixed.noise_scale) == pytest.approx(0.3) and "noise_scale" in fixed.state_dict()


def test_empirical_bayes_exposes_scalar_scales():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 1, generator=g)
    y = torch.randn(50, generator=g)
    model = pb.BNNLV(pb.MLP(2, [4], 1), latent_dim=1, noise_scale=0.5)
    guide = pyro.infer.autoguide.AutoNormal(model, create_plates=model.create_plates)
    eb = pb.EmpiricalBayes(model, guide)
    assert eb.prior_scale == 1.0 and eb.latent_scale == 1.0
    pb.fit_svi(model, guide, x, y, num_steps=3, loss=pyro.infer.Trace_ELBO(), callback=eb, progress=False)
    assert isinstance(eb.prior_scale, float)
    assert eb.prior_scale == pytest.approx(math.sqrt(eb.history[-1]["s_w"]))
    assert torch.allclose(model.prior_scale, torch.tensor(eb.prior_scale))
    assert f"prior_scale={eb.prior_scale:.4g}" in repr(eb)
    assert f"prior_scale={eb.prior_scale:.4g} (shared by all" in repr(model)


def test_latent_diagnostics_names_the_argument_order():
    """The issue's mistake exactly: a fitted guide first, as ``latent_diagnostics(guide, x, y)``."""
    x, y = torch.randn(10, 1), torch.randn(10)
    model = pb.BNNLV(pb.MLP(2, [4], 1), latent_dim=1, noise_scale=0.3)
    guide = pb.MeanField(model)
    pb.fit_svi(model, guide, x, y, num_steps=5, seed=0, progress=False)
    for wrong in [(guide, x, y), (lambda *a: None, x, y)]:
        with pytest.raises(TypeError, match=r"latent_diagnostics\(model, guide, x, y\)"):
            pb.stats.latent_diagnostics(*wrong)
    assert "mi_x_z" in str(pb.stats.latent_diagnostics(model, guide, x, y))  # the right order works


# ---------------------------------------------------------------------------------------------
# k-NN ELBO preset, mixture quantile
# ---------------------------------------------------------------------------------------------
def test_knn_elbo_fast_preset():
    fast = pb.KNNElbo.fast()
    assert (fast.num_particles, fast.num_kl_samples, fast.num_prior_samples) == (10, 100, 100)
    nu = pb.infer.input_box(torch.tensor([[0.0], [1.0]]), margin=1.0)
    ffast = pb.FunctionalKNNElbo.fast(input_dist=nu, num_particles=4)
    assert isinstance(ffast, pb.FunctionalKNNElbo) and ffast.input_dist is nu and ffast.num_particles == 4
    assert (nu.base_dist.low.item(), nu.base_dist.high.item()) == (-1.0, 2.0)


def test_mixture_quantile_solves_the_mixture_cdf():
    """Against SciPy's CDF of the same mixture: F(m) = q to rounding, across scales and levels."""
    g = torch.Generator().manual_seed(0)
    for trial in range(10):
        S = int(torch.randint(1, 40, (1,), generator=g))
        loc = torch.randn(S, 5, generator=g) * float(torch.rand(1, generator=g) * 10)
        scale = torch.rand(S, 5, generator=g) * 2 + 0.01 if trial % 2 else torch.tensor(0.05)
        sc = np.broadcast_to(scale.double().numpy(), loc.shape)
        for q in (0.001, 0.025, 0.5, 0.975):
            m = mixture_quantile(loc, scale, q)
            for n in range(5):
                cdf = stats.norm(loc[:, n].double().numpy(), sc[:, n]).cdf(float(m[n])).mean()
                assert cdf == pytest.approx(q, abs=1e-12)
    # a unique quantile (no flat stretch of the CDF): the same point as a root finder's
    loc = torch.tensor([[-1.0], [0.5], [2.0]])
    ref = optimize.brentq(lambda v: stats.norm([-1.0, 0.5, 2.0], 0.7).cdf(v).mean() - 0.9, -20, 20, xtol=1e-14)
    assert float(mixture_quantile(loc, 0.7, 0.9)) == pytest.approx(ref, abs=1e-10)


def test_mixture_interval_is_the_pair_of_quantiles_found_together():
    """Both ends solve SciPy's CDF of the same mixture (an independent reference), for a scalar,
    a per-component, a per-point and a one-element scale of loc's rank; the ends have the shape
    of ``loc[0]``; a percentage for ``level`` is refused."""
    g = torch.Generator().manual_seed(1)
    S, n = 300, 7
    loc = torch.randn(S, n, 1, generator=g, dtype=torch.float64) * 3
    scales = (
        torch.tensor(0.4, dtype=torch.float64),
        torch.rand(S, n, 1, generator=g, dtype=torch.float64) + 0.05,
        torch.rand(S, 1, 1, generator=g, dtype=torch.float64) + 0.05,
        torch.rand(n, 1, generator=g, dtype=torch.float64) + 0.05,
        torch.full((1, 1, 1), 0.4, dtype=torch.float64),
    )
    for scale in scales:
        lower, upper = mixture_interval(loc, scale, 0.9)
        assert lower.shape == upper.shape == (n, 1), tuple(scale.shape)
        sc = np.broadcast_to(scale.numpy(), loc.shape)
        for bound, q in ((lower, 0.05), (upper, 0.95)):
            for i in range(n):
                cdf = stats.norm(loc[:, i, 0].numpy(), sc[:, i, 0]).cdf(float(bound[i, 0])).mean()
                assert cdf == pytest.approx(q, abs=1e-12), tuple(scale.shape)
        torch.testing.assert_close(lower, mixture_quantile(loc, scale, 0.05), rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="level=0.95"):
        mixture_interval(loc, 0.4, 95)
