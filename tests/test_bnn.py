import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

import pyro_bnnlv as pb
from pyro_bnnlv import BNN, MLP, fan_in_prior_scale


def _model(**kw):
    return BNN(MLP(1, [8], 1), **kw)


def test_model_sites_and_shapes(toy_data):
    x, y = toy_data
    tr = pyro.poutine.trace(_model()).get_trace(x, y)
    assert tr.nodes["w"]["value"].shape == (_model().num_weights,)
    assert tr.nodes["obs"]["value"].shape == (100,)
    assert tr.nodes["obs"]["is_observed"]


def test_multi_output_model():
    model = BNN(MLP(2, [6], 3))
    x, y = torch.randn(20, 2), torch.randn(20, 3)
    tr = pyro.poutine.trace(model).get_trace(x, y)
    assert tr.nodes["obs"]["fn"].event_shape == (3,)
    assert tr.nodes["obs"]["fn"].batch_shape == (20,)
    guide = AutoNormal(model)
    pred = Predictive(model, guide=guide, num_samples=5, parallel=True)(x)
    assert pred["obs"].shape == (5, 20, 3)


def test_subsampling_rescales_likelihood(toy_data):
    x, y = toy_data
    model = _model()
    tr = pyro.poutine.trace(model).get_trace(x, y, batch_size=10)
    tr.compute_log_prob()
    assert tr.nodes["obs"]["value"].shape == (10,)
    assert tr.nodes["obs"]["scale"] == pytest.approx(10.0)


def test_prior_scale_variants():
    net = MLP(3, [4], 1)
    s = fan_in_prior_scale(net, omega=4.0)
    assert torch.allclose(s[:12], torch.full((12,), 4 / 3**0.5))  # first-layer weights, H = 3
    assert torch.allclose(s[12:16], torch.ones(4))  # first-layer biases
    assert torch.allclose(s[16:20], torch.full((4,), 2.0))  # output weights, H = 4
    model = BNN(net, prior_scale=s)
    assert torch.equal(model.prior_scale, s)
    assert torch.equal(BNN(net, prior_scale=0.5).prior_scale, torch.full((net.num_weights,), 0.5))


def test_learned_noise_is_a_positive_param(toy_data):
    x, y = toy_data
    model = _model(noise_scale=0.3, learn_noise=True)
    assert "noise_scale_unconstrained" in dict(model.named_parameters())
    tr = pyro.poutine.trace(model).get_trace(x, y)
    assert torch.allclose(tr.nodes["obs"]["fn"].scale, torch.tensor(0.3))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(prior_scale=0.0), "prior_scale"),
        (dict(prior_scale=torch.ones(3)), "prior_scale"),
        (dict(noise_scale=-1.0), "noise_scale"),
        (dict(noise_scale=float("nan")), "noise_scale"),
    ],
)
def test_bad_scales_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _model(**kwargs)


def test_bad_data_raise(toy_data):
    x, y = toy_data
    model = _model()
    with pytest.raises(ValueError, match="different numbers of rows"):
        model(x, y[:-1])
    with pytest.raises(ValueError, match="in_features=1"):
        model(torch.zeros(100, 2), y)
    bad = x.clone()
    bad[3, 0] = float("nan")
    with pytest.raises(ValueError, match="x contains NaN"):
        model(bad, y)
    bad_y = y.clone()
    bad_y[0] = float("inf")
    with pytest.raises(ValueError, match="y contains NaN"):
        model(x, bad_y)
    with pytest.raises(ValueError, match=r"y must have shape \(100,\) or \(100, 1\)"):
        model(x, y.unsqueeze(-1).expand(100, 2))

    # a single-output (N, 1) column is read as (N,): the same log-likelihood (issue 16)
    def log_lik(targets):
        with pyro.poutine.seed(rng_seed=0):
            trace = pyro.poutine.trace(model).get_trace(x, targets)
        return trace.log_prob_sum()

    assert log_lik(y.unsqueeze(-1)).item() == log_lik(y).item()
    with pytest.raises(ValueError, match=r"x has dtype torch.float64 but BNN's buffers are torch.float32.*double"):
        model(x.double(), y.double())
    for other in (pb.BNNLV(pb.MLP(2, [4], 1), latent_dim=1), pb.ProjectedBNN(pb.MLP(1, [4], 1), latent_dim=2)):
        with pytest.raises(ValueError, match="x has dtype torch.float64"):
            other(x.double(), y.double())
    model.double()(x.double(), y.double())  # converting the model is the fix


def test_vectorised_particle_elbo_equals_mean_of_single_particle_elbos(toy_data):
    """The broadcasting trap: with vectorised particles w has batch shape (P, 1); a model that
    returned f of shape (P, 1, N) would be broadcast to (P, P, N) and inflate the ELBO ~P-fold."""
    x, y = toy_data
    model = _model()
    num_particles = 25
    draws = torch.randn(num_particles, model.num_weights)

    def guide_for(value):
        def guide(x, y):
            pyro.sample("w", dist.Delta(value, event_dim=1))

        return guide

    single = [Trace_ELBO().loss(model, guide_for(draws[s]), x, y) for s in range(num_particles)]
    elbo = Trace_ELBO(num_particles=num_particles, vectorize_particles=True, max_plate_nesting=1)
    vectorised = elbo.loss(model, guide_for(draws.unsqueeze(1)), x, y)
    assert vectorised == pytest.approx(sum(single) / num_particles, rel=1e-5)


def test_predictive_works_with_guide_and_prior(toy_data):
    x, y = toy_data
    model = _model()
    guide = AutoNormal(model)
    out = Predictive(model, guide=guide, num_samples=6)(x)
    assert out["obs"].shape == (6, 100)
    prior = Predictive(model, num_samples=4, parallel=True)(x)
    assert prior["obs"].shape == (4, 100) and prior["w"].shape == (4, 1, model.num_weights)
    seq = Predictive(model, guide=guide, num_samples=3, parallel=False)(x)
    assert seq["obs"].shape == (3, 100)


def test_model_f_exposes_batched_network(toy_data):
    x, _ = toy_data
    model = _model()
    w = torch.randn(7, model.num_weights)
    assert model.f(x, w).shape == (7, 100, 1)
    torch.testing.assert_close(model.f(x, w)[3], model.net(x, w[3]))


def test_training_never_moves_the_prior():
    """AutoNormal(init_loc_fn=init_to_mean) takes the prior's mean tensor as its loc; the model
    must hand Pyro copies, or Adam trains the prior itself (found in the linear model)."""
    from pyro.infer.autoguide import AutoNormal, init_to_mean

    x, y = torch.randn(20, 1), torch.randn(20)
    model = pb.BNN(pb.MLP(1, [4], 1), prior_scale=1.0, noise_scale=0.1)
    lv = pb.BNNLV(pb.MLP(2, [4], 1), latent_dim=1)
    for m in (model, lv):
        with pyro.get_param_store().scope():
            guide = AutoNormal(m, init_loc_fn=init_to_mean)
            pb.fit_svi(m, guide, x, y, num_steps=20, lr=0.1, seed=0, progress=False, loss=pyro.infer.Trace_ELBO())
        assert (m.prior_loc == 0).all() and (m.prior_scale == 1).all()


def test_every_model_satisfies_the_protocols_it_claims():
    """The model protocols (issue 15) replace attribute probes: each library model is a
    RegressionModel; those on a network a NetworkModel; those with other latents a LatentModel.
    A plain Pyro function is none, and evaluate / train_map / LinearizedLaplace say so."""
    from pyro_bnnlv.protocols import LatentModel, NetworkModel, RegressionModel

    models = {
        "BNN": (pb.BNN(pb.MLP(1, [3], 1)), (True, True, False)),
        "BNNLV": (pb.BNNLV(pb.MLP(2, [3], 1), latent_dim=1), (True, True, True)),
        "ProjectedBNN": (pb.ProjectedBNN(pb.MLP(1, [3], 1), latent_dim=2), (True, True, True)),
        "OverparametrisedLinear": (pb.OverparametrisedLinear(3), (True, False, False)),
    }
    for name, (model, expected) in models.items():
        got = tuple(isinstance(model, p) for p in (RegressionModel, NetworkModel, LatentModel))
        assert got == expected, name

    def plain(x, y=None):
        return None

    assert not isinstance(plain, RegressionModel)
    x, y = torch.randn(5, 1), torch.randn(5)
    with pytest.raises(TypeError, match="evaluate needs a pyro_bnnlv model"):
        pb.evaluate(plain, torch.randn(4, 10), x, y)
    with pytest.raises(TypeError, match="train_map fits the weights of a BNN"):
        pb.train_map(pb.BNNLV(pb.MLP(2, [3], 1), latent_dim=1), x, y)


def test_f_converts_numpy_arrays_to_the_other_arguments_dtype():
    """Issue 39: ``model.f`` given a NumPy array (was torch's matmul TypeError)."""
    import numpy as np

    model = pb.BNN(pb.MLP(1, [4], 1))
    w = torch.randn(2, model.num_weights)
    x = np.linspace(-1, 1, 5)[:, None]  # float64, as NumPy makes it
    expected = model.f(torch.as_tensor(x, dtype=torch.float32), w)
    torch.testing.assert_close(model.f(x, w), expected, rtol=0, atol=0)
    torch.testing.assert_close(model.f(torch.as_tensor(x, dtype=torch.float32), w.numpy()), expected, rtol=0, atol=0)
    assert model.f(x, w.numpy()).dtype == torch.float32  # both arrays: the model's dtype
    with pytest.raises(TypeError, match="x must be a torch.Tensor or a NumPy array, got list"):
        model.f([[0.0]], w)
    linear = pb.OverparametrisedLinear(3)
    torch.testing.assert_close(linear.f(np.ones(4), np.ones((2, 3))), linear.f(torch.ones(4), torch.ones(2, 3)))


def test_evaluate_on_an_empty_validation_split_names_it():
    """Issue 39: a 3-row data set has no validation point; evaluate(split="valid") says so."""
    import numpy as np

    data = pb.datasets.from_arrays(np.arange(3.0)[:, None], np.arange(3.0))
    model = pb.BNN(pb.MLP(1, [4], 1))
    w = torch.zeros(4, model.num_weights)
    with pytest.raises(
        ValueError, match=r"split='valid': the data set 'data' has no valid points \(sizes \(2, 0, 1\)\)"
    ):
        pb.evaluate(model, w, data, split="valid")
    assert np.isfinite(pb.evaluate(model, w, data, split="test")["test_ll"])
