import pyro
import pytest
import torch
from pyro.infer import Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

import pyro_bnnlv as pb
from pyro_bnnlv.models.bnnlv import BNNLV


def _model(D=1, K=1, **kw):
    return BNNLV(pb.MLP(D + K, [8], 1, activation="leaky_relu"), latent_dim=K, **kw)


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 1, generator=g)
    return x, torch.sin(x[:, 0]) + 0.1 * torch.randn(40, generator=g)


def test_sites_shapes_and_subsampling(data):
    x, y = data
    model = _model(K=2)
    tr = pyro.poutine.trace(model).get_trace(x, y)
    assert tr.nodes["z"]["value"].shape == (40, 2)
    assert tr.nodes["z"]["fn"].batch_shape == (40,) and tr.nodes["z"]["fn"].event_shape == (2,)
    tr = pyro.poutine.trace(model).get_trace(x, y, batch_size=10)
    assert tr.nodes["z"]["value"].shape == (10, 2) and tr.nodes["obs"]["value"].shape == (10,)


def test_guide_subsamples_latents_with_the_model(data):
    x, y = data
    model = _model()
    guide = AutoNormal(model, create_plates=model.create_plates)
    guide(x, y)
    assert guide.locs.z.shape == (40, 1)
    gt = pyro.poutine.trace(guide).get_trace(x, y, batch_size=8)
    assert gt.nodes["z"]["value"].shape == (8, 1)
    loss = Trace_ELBO().loss(model, guide, x, y, batch_size=8)
    assert torch.isfinite(torch.tensor(loss))


def test_minibatch_elbo_is_unbiased_for_full_batch_elbo(data):
    """Expected minibatch loss over random batches equals the full-batch loss (same guide)."""
    x, y = data
    model = _model()
    guide = AutoNormal(model, create_plates=model.create_plates, init_scale=1e-4, init_loc_fn=pb.init_to_network(model))
    guide(x, y)
    elbo = Trace_ELBO()
    full = sum(elbo.loss(model, guide, x, y) for _ in range(50)) / 50
    mini = sum(elbo.loss(model, guide, x, y, batch_size=10) for _ in range(4000)) / 4000
    assert mini == pytest.approx(full, rel=0.02)


def test_predictive_uses_prior_latents_not_training_ones(data):
    x, y = data
    model = _model(latent_scale=2.0)
    w = torch.randn(200, model.num_weights)
    loc, _ = model.predictive_components(x[:5], {"w": w}, generator=torch.Generator().manual_seed(0))
    # reproduce by hand: z* ~ N(0, 2^2) independently per sample and input, by the normal
    # quantile function of uniforms drawn input by input
    u = torch.rand(5, 200, 1, generator=torch.Generator().manual_seed(0)).permute(1, 0, 2)
    z = torch.special.ndtri(u) * 2.0
    expected = model.net(torch.cat([x[:5].expand(200, 5, 1), z], -1), w)
    torch.testing.assert_close(loc, expected)


def test_evaluate_handles_bnnlv_and_test_sets_of_other_sizes(data):
    x, y = data
    model = _model()
    guide = AutoNormal(model, create_plates=model.create_plates, init_loc_fn=pb.init_to_network(model))
    pb.fit_svi(model, guide, x, y, num_steps=20, progress=False)
    samples = pb.sample_posterior(model, guide, x, y, num_samples=30, sites=("w", "z"), seed=0)
    assert samples["w"].shape == (30, model.num_weights) and samples["z"].shape == (30, 40, 1)
    x_test = torch.randn(7, 1)
    m = pb.evaluate(model, samples, x_test, torch.zeros(7), seed=0)
    assert set(m.index) == {"test_ll", "rmse", "picp", "mpiw"}
    # a naive Predictive with the guide on test inputs of another size must fail, not silently
    # reuse the 40 training latents
    with pytest.raises((ValueError, RuntimeError)):
        Predictive(model, guide=guide, num_samples=3)(x_test)


def test_latent_weight_mask_and_bad_inputs():
    model = _model(D=2, K=1)
    mask = model.latent_weight_mask()
    (W0, _), _ = model.net.unflatten(torch.arange(model.num_weights, dtype=torch.float))
    assert torch.equal(torch.nonzero(mask)[:, 0], W0[:, 2].long())
    with pytest.raises(ValueError, match=r"x must have shape \(N, 2\)"):
        model(torch.zeros(5, 3), torch.zeros(5))
    with pytest.raises(ValueError, match="latent_dim"):
        BNNLV(pb.MLP(1, [4], 1), latent_dim=1)
    with pytest.raises(ValueError, match="latent_scale"):
        _model(latent_scale=-1.0)


def test_vectorised_particles_match_single_particles(data):
    x, y = data
    model = _model()
    guide = AutoNormal(model, create_plates=model.create_plates, init_loc_fn=pb.init_to_network(model))
    guide(x, y)
    pyro.set_rng_seed(1)
    vec = Trace_ELBO(num_particles=2000, vectorize_particles=True, max_plate_nesting=1)
    single = Trace_ELBO(num_particles=1)
    v = vec.loss(model, guide, x, y)
    s = sum(single.loss(model, guide, x, y) for _ in range(2000)) / 2000
    assert v == pytest.approx(s, rel=0.03)


def test_save_and_load_bnnlv(tmp_path, data):
    from pyro_bnnlv.serialization import load_fit, save_fit

    x, y = data
    model = _model(latent_scale=0.5)
    guide = AutoNormal(model, create_plates=model.create_plates, init_loc_fn=pb.init_to_network(model))
    pb.fit_svi(model, guide, x, y, num_steps=10, progress=False)
    save_fit(tmp_path / "f.pt", model, guide, x, y)
    model2, guide2 = load_fit(tmp_path / "f.pt")
    assert float(model2.latent_scale) == 0.5
    a = pb.sample_posterior(model, guide, x, y, num_samples=5, sites=("w", "z"), seed=3)
    b = pb.sample_posterior(model2, guide2, x, y, num_samples=5, sites=("w", "z"), seed=3)
    torch.testing.assert_close(a["z"], b["z"])


def test_sample_posterior_of_a_loaded_fit_on_a_slice_of_x_says_to_pass_the_training_data(tmp_path):
    """Issue 39: the guide's z is indexed by training point, so a slice of x cannot be sampled;
    the error says so (was Pyro's shape table), and the full data gives the original's draws."""
    from pyro_bnnlv.serialization import load_fit, save_fit

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 1, generator=g), torch.randn(20, generator=g)
    model = pb.BNNLV(pb.MLP(2, [4], 1), latent_dim=1)
    guide = pb.MeanField(model)
    pb.fit_svi(model, guide, x, y, num_steps=3, seed=0, progress=False)
    save_fit(tmp_path / "fit.pt", model, guide, x, y)
    model2, guide2 = load_fit(tmp_path / "fit.pt")
    for args in ((x[:5],), (x[:5], y[:5])):
        with pytest.raises(
            ValueError,
            match=r"the guide's per-datapoint latents \['z'\] do not fit x of 5 rows: .*"
            r"needs the training inputs .*samples\['z'\]\[:, idx\]",
        ):
            pb.sample_posterior(model2, guide2, *args, num_samples=3, sites=("w", "z"))
    a = pb.sample_posterior(model, guide, x, y, num_samples=3, sites=("w", "z"), seed=1)
    b = pb.sample_posterior(model2, guide2, x, y, num_samples=3, sites=("w", "z"), seed=1)
    assert b["z"].shape == (3, 20, 1)
    torch.testing.assert_close(a["z"], b["z"], rtol=0, atol=0)
