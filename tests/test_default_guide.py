"""The default guide trap (issue 16): plain ``AutoNormal(model)`` starts every weight at 0 with
scale 0.1 and stays stuck on the cosine toy; ``pb.MeanField(model)`` (AutoNormal with a network
start and init_scale=0.01) is the short path to a good fit.

Measured on the issue's setting (cosine toy, 120 points, 1x50 tanh, N(0, 1) prior, sigma 0.1,
3,000 Adam steps at lr 0.01, seeds 0, 500 posterior samples, test LL on the 120 test points,
fit_svi's default loss, which draws as eager ``Trace_ELBO`` does): plain AutoNormal -4.29
(RMSE 0.41), MeanField 0.61 (RMSE 0.13), identical to
``AutoNormal(model, init_loc_fn=pb.init_to_network(model), init_scale=0.01)``. At 1,000 steps,
the budget of the test below: -4.07 vs 0.47. (At 600 steps MeanField's test LL depends on the
random stream: 0.24 with seed 0 and 0.61 with seed 1; the compiled loss, whose trace drew other
numbers, gave 0.53.)
"""

import math

import pytest
import torch
from pyro.infer.autoguide import AutoNormal

import pyro_bnnlv as pb
from pyro_bnnlv.infer.svi import isolated_param_store


def _cosine_fit(make_guide, num_steps):
    data = pb.datasets.load_dataset("cosine")
    model = pb.BNN(pb.MLP(1, [50], 1, activation="tanh"), prior_scale=1.0, noise_scale=0.1)
    guide = make_guide(model)
    pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=num_steps, lr=0.01, seed=0, progress=False)
    samples = pb.sample_posterior(model, guide, data.x_train, num_samples=200, seed=0)
    return pb.evaluate(model, samples, data.x_test, data.y_test)


def test_mean_field_fits_the_cosine_toy_where_plain_autonormal_is_stuck():
    good = _cosine_fit(pb.MeanField, num_steps=1000)
    plain = _cosine_fit(AutoNormal, num_steps=1000)
    assert good["test_ll"] > 0.3 and good["rmse"] < 0.2  # measured 0.47, 0.15
    assert plain["test_ll"] < -2.0 and plain["rmse"] > 0.35  # measured -4.07, 0.41: the trap


def test_mean_field_is_autonormal_with_a_network_start(toy_data):
    x, y = toy_data
    model = pb.BNN(pb.MLP(1, [8], 1), noise_scale=0.1)
    guide = pb.MeanField(model, seed=2)
    reference = AutoNormal(model, init_loc_fn=pb.init_to_network(model, seed=2), init_scale=0.01)
    other = pb.MeanField(model, seed=3)
    for g in (guide, reference, other):  # each in its own store: guides of one class share names
        with isolated_param_store(model, g):
            g(x, y)
    assert isinstance(guide, AutoNormal)
    torch.testing.assert_close(guide.locs.w, reference.locs.w, rtol=0, atol=0)
    torch.testing.assert_close(guide.scales.w, reference.scales.w)
    torch.testing.assert_close(guide.scales.w, torch.full_like(guide.scales.w, 0.01))
    assert not torch.equal(other.locs.w, guide.locs.w)


def test_mean_field_overrides():
    model = pb.BNN(pb.MLP(1, [4], 1), noise_scale=0.1)
    x, y = torch.randn(10, 1), torch.randn(10)
    w0 = torch.linspace(-1, 1, model.net.num_weights)
    guide = pb.MeanField(model, init_loc_fn=pb.init_to_network(model, weights=w0), init_scale=0.2)
    guide(x, y)
    torch.testing.assert_close(guide.locs.w.detach(), w0)
    torch.testing.assert_close(guide.scales.w.detach(), torch.full_like(w0, 0.2))


def test_mean_field_on_bnnlv_subsamples_the_latents_with_minibatches(toy_data):
    x, y = toy_data
    model = pb.BNNLV(pb.MLP(2, [8], 1), latent_dim=1, noise_scale=0.1)
    guide = pb.MeanField(model)
    assert guide.create_plates == model.create_plates
    losses = pb.fit_svi(model, guide, x, y, num_steps=20, batch_size=25, seed=0, progress=False)
    assert all(math.isfinite(v) for v in losses)
    assert guide.locs.z.shape == (100, 1)


def test_mean_field_on_a_model_without_a_network_uses_pyros_start():
    model = pb.OverparametrisedLinear(K=3)
    guide = pb.MeanField(model)
    x, y = torch.randn(20), torch.randn(20)
    guide(x, y)
    for value in guide.median(x, y).values():
        assert torch.all(value == 0)  # init_to_feasible of a Gaussian site


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"seed": 1.5}, TypeError, "seed"),
        ({"seed": True}, TypeError, "seed"),
        ({"init_scale": 0.0}, ValueError, "init_scale"),
        ({"init_scale": "a"}, ValueError, "init_scale"),
    ],
)
def test_mean_field_rejects_bad_arguments(kwargs, error, match):
    model = pb.BNN(pb.MLP(1, [4], 1))
    with pytest.raises(error, match=match):
        pb.MeanField(model, **kwargs)


def test_mean_field_in_float64(toy_data):
    x, y = (t.double() for t in toy_data)
    model = pb.BNN(pb.MLP(1, [8], 1), noise_scale=0.1).double()
    guide = pb.MeanField(model)
    pb.fit_svi(model, guide, x, y, num_steps=10, seed=0, progress=False)
    assert guide.locs.w.dtype == torch.float64
