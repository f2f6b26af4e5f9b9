"""Projected BNN: the model (eq. 3, 8-9), FGE, the prediction-constrained autoencoder, Alg. 1."""

import pyro
import pytest
import torch
from pyro.infer import Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

import pyro_bnnlv as pb
from pyro_bnnlv.infer.fge import cyclic_lr, fge
from pyro_bnnlv.infer.projection import (
    _recentre_first_layer,
    fit_projected_bnn,
    fit_projection,
    init_projected_guide,
)
from pyro_bnnlv.models.projected import ProjectedBNN


def _data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(n, generator=g)
    return x, y


def test_w_is_the_deterministic_projection_of_z_and_phi():
    x, y = _data()
    model = ProjectedBNN(pb.MLP(1, [8], 1), latent_dim=3, decoder_hidden=[5])
    guide = AutoNormal(model, init_scale=0.1)
    guide(x, y)
    s = pb.sample_posterior(model, guide, x, num_samples=6, sites=("w", "z", "phi"), seed=0)
    assert s["z"].shape == (6, 3) and s["phi"].shape == (6, model.num_phi)
    assert s["w"].shape == (6, model.net.num_weights)
    assert torch.allclose(s["w"], model.project(s["z"], s["phi"]), atol=1e-6)
    assert Predictive(model, guide=guide, num_samples=4, parallel=True)(x)["obs"].shape == (4, 40)
    assert torch.isfinite(torch.tensor(pb.evaluate(model, s, x, y).to_numpy())).all()
    idata = pb.to_inference_data(model, s, x, y)
    assert idata.posterior["w"].shape == (1, 6, model.net.num_weights)
    # vectorised particles: the ELBO of 8 particles averages single-particle ELBOs' scale
    assert abs(Trace_ELBO(num_particles=8, vectorize_particles=True).loss(model, guide, x, y)) < 1e7


def test_multi_task_shapes_fixed_phi_and_errors():
    x, y = _data(30)
    task = torch.arange(30) % 3
    model = ProjectedBNN(pb.MLP(1, [6], 1), latent_dim=2, num_tasks=3)
    guide = AutoNormal(model)
    guide(x, y, task=task)                      # set up with the observed data
    pred = Predictive(model, guide=guide, num_samples=5, parallel=True)(x, task=task)
    assert pred["z"].shape == (5, 3, 2) and pred["w"].shape == (5, 3, model.net.num_weights)
    assert pred["obs"].shape == (5, 30)
    assert Trace_ELBO().loss(model, guide, x, y, batch_size=10, task=task) > 0
    with pytest.raises(ValueError, match="task"):
        model(x, y)
    with pytest.raises(ValueError, match="task indices"):
        model(x, y, task=task + 3)
    pyro.clear_param_store()
    fixed = ProjectedBNN(pb.MLP(1, [6], 1), latent_dim=2, fixed_phi=torch.zeros(model.num_phi))
    trace = pyro.poutine.trace(fixed).get_trace(x, y)
    assert "phi" not in trace.nodes and trace.nodes["w"]["value"].shape == (fixed.net.num_weights,)
    with pytest.raises(ValueError, match="latent_dim"):
        ProjectedBNN(pb.MLP(1, [6], 1), latent_dim=0)


def test_fge_collects_distinct_candidates_that_all_fit():
    x, y = _data(60)
    bnn = pb.BNN(pb.MLP(1, [10], 1), prior_scale=1.0, noise_scale=0.1)
    res = fge(bnn, x, y, num_candidates=12, keep=5, map_steps=1500, map_lr=0.01, cycle_epochs=5,
              batch_size=32, seed=0, progress=False)  # fmt: skip
    assert res.candidates.shape == (12, bnn.net.num_weights) and res.kept.shape == (5, bnn.net.num_weights)
    dist = torch.cdist(res.candidates, res.candidates) + torch.eye(12)
    assert (dist > 1e-4).all()                                   # all distinct
    with torch.no_grad():
        f = bnn.net(x, res.candidates)[..., 0]
        f_map = bnn.net(x, res.map_weights)[..., 0]
    rmse = (f - y).pow(2).mean(1).sqrt()
    rmse_map = float((f_map - y).pow(2).mean().sqrt())
    # every candidate fits: within twice the noise (0.1), far below a constant predictor's error
    assert rmse_map < 0.15 and (rmse < 0.2).all() and float(y.std()) > 0.6, (rmse, rmse_map)
    assert torch.equal(res.kept[0], res.candidates[res.valid_rmse.argmin()])
    assert cyclic_lr(9, 20, 0.01, 0.0001) == pytest.approx(0.0001)   # mid-cycle minimum
    assert cyclic_lr(19, 20, 0.01, 0.0001) == pytest.approx(0.01)


def test_autoencoder_reduces_both_terms_and_recentring_is_exact():
    x, y = _data(60)
    bnn = pb.BNN(pb.MLP(1, [10], 1), prior_scale=1.0, noise_scale=0.1)
    res = fge(bnn, x, y, num_candidates=20, keep=20, map_steps=800, map_lr=0.01, cycle_epochs=3,
              batch_size=32, seed=0, progress=False)  # fmt: skip
    model = ProjectedBNN(bnn.net, latent_dim=2, decoder_hidden=[10])
    fit = fit_projection(model, res.kept, x, y, num_steps=600, lr=0.01, seed=0, progress=False)
    unconstrained = fit_projection(model, res.kept, x, y, beta=0.0, num_steps=600, lr=0.01, seed=0,
                                   progress=False)  # fmt: skip
    first = lambda v: sum(v[:30]) / 30  # noqa: E731
    last = lambda v: sum(v[-30:]) / 30  # noqa: E731
    assert last(fit.reconstruction) < 0.8 * first(fit.reconstruction)
    assert last(fit.neg_log_lik) < first(fit.neg_log_lik)
    # the prediction constraint is what keeps the reconstructed weights predictive
    with torch.no_grad():
        def nll(phi):
            w = model.project(fit.codes if phi is fit.phi else unconstrained.codes, phi)
            f = model.net(x, w)[..., 0]
            return -torch.distributions.Normal(f, 0.1).log_prob(y).mean()
    assert nll(fit.phi) < nll(unconstrained.phi)
    assert fit.codes.std(0) == pytest.approx(torch.full((2,), float(model.latent_scale)), rel=1e-4)
    # the re-centred decoder on the re-centred codes is the same function
    z = torch.randn(7, 2)
    phi = model.decoder.init_weights(torch.Generator().manual_seed(3))
    new_phi, new_z = _recentre_first_layer(model.decoder, phi, z, 0.5)
    assert torch.allclose(model.project(z, phi), model.project(new_z, new_phi), atol=1e-5)


def test_three_stage_fit_beats_the_prior_predictive_and_variants_run():
    data = pb.load_dataset("cosine")
    x, y = data.x_train, data.y_train
    kwargs = dict(fge_kwargs=dict(num_candidates=30, keep=15, map_steps=800, map_lr=0.01, cycle_epochs=3),
                  projection_kwargs=dict(num_steps=400), num_steps=600, num_particles=8,
                  progress=False, seed=0)  # fmt: skip
    model = ProjectedBNN(pb.MLP(1, [20], 1, activation="tanh"), latent_dim=2)
    fit = fit_projected_bnn(model, x, y, x_valid=data.x_valid, y_valid=data.y_valid, **kwargs)
    post = pb.sample_posterior(fit.model, fit.guide, x, num_samples=200, seed=0)
    prior = Predictive(fit.model, num_samples=200, return_sites=["w"])(x)["w"].squeeze(1)
    ll_post = float(pb.evaluate(fit.model, post, data.x_test, data.y_test)["test_ll"])
    ll_prior = float(pb.evaluate(fit.model, {"w": prior}, data.x_test, data.y_test)["test_ll"])
    assert ll_post > ll_prior + 2, (ll_post, ll_prior)       # nats per test point
    assert set(fit.seconds) == {"fge", "autoencoder", "vi"}
    for variant in ("one-stage", "qz-only"):
        m = ProjectedBNN(pb.MLP(1, [20], 1, activation="tanh"), latent_dim=2)
        f = fit_projected_bnn(m, x, y, variant=variant, **dict(kwargs, num_steps=100))
        assert all(torch.isfinite(torch.tensor(f.losses)))
        assert hasattr(f.guide.locs, "phi") == (variant == "one-stage")   # qz-only: phi fixed
    linear = ProjectedBNN(pb.MLP(1, [20], 1, activation="tanh"), latent_dim=2, decoder_hidden=[],
                          decoder_activation="identity")  # fmt: skip
    f = fit_projected_bnn(linear, x, y, **dict(kwargs, num_steps=100))
    assert linear.num_phi == 2 * linear.net.num_weights + linear.net.num_weights
    with pytest.raises(ValueError, match="variant"):
        fit_projected_bnn(linear, x, y, variant="two-stage")
    multi = ProjectedBNN(pb.MLP(1, [5], 1), latent_dim=2, num_tasks=3)
    with pytest.raises(ValueError, match="single-task"):
        fit_projected_bnn(multi, x, y)


def test_multi_task_codes_separate_the_tasks_of_the_sine_family():
    data = pb.load_dataset("sine-tasks", num_tasks=6)
    x, y, task = data.x_train, data.y_train, data.extras["task_train"]
    model = ProjectedBNN(pb.MLP(1, [20], 1, activation="tanh"), latent_dim=2, num_tasks=6,
                         latent_scale=1.0, phi_scale=1.0)  # fmt: skip
    guide = init_projected_guide(model, None, seed=0)
    pb.fit_svi(model, guide, x, y, num_steps=1500, lr=0.03, seed=0, progress=False,
               loss=Trace_ELBO(num_particles=4, vectorize_particles=True), model_kwargs={"task": task})
    loc, scale = guide.locs.z.detach(), guide.scales.z.detach()
    sep = torch.cdist(loc, loc) / (scale.pow(2).sum(-1)[:, None] + scale.pow(2).sum(-1)[None]).sqrt()
    off = sep[~torch.eye(6, dtype=torch.bool)]
    assert off.median() > 2, sep                         # codes of different tasks are apart
    w = pb.sample_posterior(model, guide, x, y, num_samples=50, seed=0, task=task)["w"]
    f = model.net(x.unsqueeze(-2), w[:, task, :]).squeeze(-2)[..., 0].mean(0)
    rmse = float((f - y).pow(2).mean().sqrt())
    assert rmse < 0.7 * float(y.std())                   # one shared function could not do this
