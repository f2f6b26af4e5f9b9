"""float64 end to end (issue 16): following the models' own dtype error message ("convert the
model, e.g. model.double()") must give a working float64 pipeline: initialisation, mean-field and
hypernetwork guides, sampled Laplace, evaluation, and the README's quick start as written."""

import dataclasses
import math

import pytest
import torch
from pyro.infer.autoguide import AutoNormal
from test_readme import _section_code

import pyro_bnnlv as pb
from pyro_bnnlv.guides import hypernet_lv_guide

F64 = torch.float64


def _double_data(data):
    """Every tensor of a Dataset in float64 (what a user with float64 data has)."""
    tensors = {f.name: getattr(data, f.name) for f in dataclasses.fields(data)}
    return dataclasses.replace(
        data, **{k: v.double() for k, v in tensors.items() if torch.is_tensor(v) and v.is_floating_point()}
    )


@pytest.fixture
def toy64(toy_data):
    x, y = toy_data
    return x.double(), y.double()


def _model64(hidden=8):
    return pb.BNN(pb.MLP(1, [hidden], 1, activation="tanh"), noise_scale=0.1).double()


def test_readme_quick_start_after_model_double(tmp_path, monkeypatch):
    """The quick start exactly as in the README, with float64 data and ``model.double()``
    inserted after the lines that create them (fewer steps and samples, as in test_readme)."""
    code = _section_code("Quick start")
    lines = code.splitlines()
    data_line = next(i for i, line in enumerate(lines) if line.startswith("data = "))
    lines.insert(data_line + 1, "data = _double_data(data)")
    model_line = next(i for i, line in enumerate(lines) if line.startswith("model = "))
    lines.insert(model_line + 1, "model = model.double()")
    code = "\n".join(lines).replace("num_steps=2000", "num_steps=50").replace("num_samples=500", "num_samples=50")
    monkeypatch.chdir(tmp_path)
    ns: dict = {"_double_data": _double_data}
    exec(compile(code, "README quick start (float64)", "exec"), ns)
    assert ns["samples"]["w"].dtype == F64
    assert ns["pred"]["obs"].dtype == F64 and ns["pred"]["obs"].shape == (100, len(ns["data"].x_test))
    assert ns["f"].dtype == F64
    metrics = pb.evaluate(ns["model"], ns["samples"], ns["data"].x_test, ns["data"].y_test)
    assert math.isfinite(metrics["test_ll"]) and metrics["picp"] > 0


def test_readme_quick_start_with_float64_default_dtype(tmp_path, monkeypatch):
    """The same snippet, unmodified, under ``torch.set_default_dtype(torch.float64)``."""
    code = _section_code("Quick start")
    code = code.replace("num_steps=2000", "num_steps=50").replace("num_samples=500", "num_samples=20")
    monkeypatch.chdir(tmp_path)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    try:
        ns: dict = {}
        exec(compile(code, "README quick start (float64 default)", "exec"), ns)
    finally:
        torch.set_default_dtype(previous)
    assert ns["data"].x_train.dtype == F64
    assert ns["samples"]["w"].dtype == F64 and ns["pred"]["obs"].dtype == F64


@pytest.mark.parametrize("convert_first", [True, False], ids=["double-then-init", "init-then-double"])
def test_init_to_network_follows_the_model_dtype(convert_first, toy64):
    x, y = toy64
    model = pb.BNN(pb.MLP(1, [8], 1), noise_scale=0.1)
    if convert_first:
        model.double()
    init = pb.init_to_network(model, seed=3)
    model.double()
    guide = AutoNormal(model, init_loc_fn=init)
    guide(x, y)
    expected = model.net.init_weights(torch.Generator().manual_seed(3)).double()
    assert guide.locs.w.dtype == F64
    torch.testing.assert_close(guide.locs.w.detach(), expected)  # float32 draw, cast exactly


def test_init_to_network_names_the_missing_network():
    with pytest.raises(TypeError, match="model.net"):
        pb.init_to_network(pb.OverparametrisedLinear(K=2))


def test_hypernet_guide_in_float64(toy64):
    x, y = toy64
    model = _model64()
    guide = pb.HypernetGuide(model, init_loc_fn=pb.init_to_network(model))
    losses = pb.fit_svi(
        model,
        guide,
        x,
        y,
        num_steps=20,
        lr=0.005,
        loss=pb.KNNElbo(num_particles=4, num_kl_samples=20, num_prior_samples=20),
        seed=0,
        progress=False,
    )
    assert all(math.isfinite(v) for v in losses)
    assert all(p.dtype == F64 for p in guide.hypernet.parameters())
    samples = pb.sample_posterior(model, guide, x, num_samples=30, seed=0)
    assert samples["w"].dtype == F64 and samples["w"].std(0).mean() > 0
    assert guide.sample_weights(5)["w"].dtype == F64
    assert guide.median()["w"].dtype == F64
    assert math.isfinite(pb.evaluate(model, samples, x, y)["test_ll"])


def test_hypernet_lv_guide_in_float64(toy64):
    x, y = toy64
    model = pb.BNNLV(pb.MLP(2, [8], 1), latent_dim=1, noise_scale=0.1).double()
    guide = hypernet_lv_guide(model, init_loc_fn=pb.init_to_network(model))
    pb.fit_svi(
        model,
        guide,
        x,
        y,
        num_steps=10,
        loss=pb.KNNElbo(num_particles=4, num_kl_samples=20, num_prior_samples=20),
        seed=0,
        progress=False,
    )
    samples = pb.sample_posterior(model, guide, x, y, num_samples=10, sites=("w", "z"), seed=0)
    assert samples["w"].dtype == F64 and samples["z"].dtype == F64


@pytest.mark.parametrize("structure", ["full", "diag", "last_layer"])
@pytest.mark.parametrize("guide_dtype", [None, F64], ids=["default-dtype", "f64"])
def test_sampled_laplace_on_a_float64_model(structure, guide_dtype, toy64):
    """``as_guide()`` of a float64 model's Laplace fit samples in the data's dtype (float64),
    whatever dtype the guide stores (``as_guide()`` defaults to the model's dtype); the draws
    have the Laplace covariance."""
    x, y = toy64
    model = _model64()
    w_map = pb.train_map(model, x, y, num_steps=100, seed=0, progress=False)
    la = pb.LinearizedLaplace(model, w_map, structure=structure).fit(x, y)
    guide = la.as_guide(guide_dtype)
    assert guide.loc.dtype == F64  # the model's dtype by default
    assert la.to_model().prior_scale.dtype == F64 and la.to_model().noise_scale.dtype == F64
    samples = pb.sample_posterior(model, guide, x, num_samples=2000, seed=0)
    assert samples["w"].dtype == F64
    var = guide.distribution(F64).variance
    torch.testing.assert_close(samples["w"].var(0), var, rtol=0.15, atol=1e-12)  # 2000 draws: sd 3.2%
    assert math.isfinite(pb.evaluate(model, samples["w"][:200], x, y)["test_ll"])


def test_laplace_guide_distribution_dtype():
    loc, scale = torch.zeros(3), torch.ones(3)
    guide = pb.LaplaceGuide(loc, scale=scale)
    assert guide.distribution().sample().dtype == torch.float32
    assert guide.distribution(F64).sample().dtype == F64
    assert guide.double().distribution().sample().dtype == F64


def test_evaluate_float32_model_on_float64_data_says_what_to_convert(toy64):
    x, y = toy64
    model = pb.BNN(pb.MLP(1, [8], 1), noise_scale=0.1)
    samples = {"w": model.net.init_weights(torch.Generator().manual_seed(0)).expand(5, -1)}
    with pytest.raises(ValueError, match=r"model.double\(\)"):
        pb.evaluate(model, samples, x, y)
