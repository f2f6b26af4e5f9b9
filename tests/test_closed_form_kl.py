"""ClosedFormKLElbo: Trace_ELBO with closed-form KL terms (Pradier et al. 2018, eq. 5)."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import AutoNormal

from pyro_bnnlv.infer.elbos.closed_form_kl import ClosedFormKLElbo

Z_SCALE, PHI_SCALE = 2.0, 1.5


def _model(y):
    z = pyro.sample("z", dist.Normal(torch.zeros(3), Z_SCALE).to_event(1))
    phi = pyro.sample("phi", dist.Normal(torch.zeros(5), PHI_SCALE).to_event(1))
    with pyro.plate("data", y.shape[0]):
        pyro.sample("obs", dist.Normal(z.sum(-1) + phi.sum(-1), 1.0), obs=y)


def _setup():
    pyro.clear_param_store()
    y = torch.randn(7, generator=torch.Generator().manual_seed(0))
    guide = AutoNormal(_model, init_scale=0.3)
    guide(y)
    with torch.no_grad():  # spread the means so the KL terms are not trivial
        guide.locs.z.copy_(torch.tensor([0.5, -1.0, 0.2]))
        guide.locs.phi.copy_(torch.linspace(-1, 1, 5))
    return y, guide


def _kl(loc, scale, prior_scale):
    loc, scale = loc.detach(), scale.detach()
    return float((torch.log(prior_scale / scale) + (scale**2 + loc**2) / (2 * prior_scale**2) - 0.5).sum())


def _exact_elbo(y, guide):
    """The linear-Gaussian model's ELBO in closed form: E_q log N(y | sum z + sum phi, 1) - KLs."""
    loc_z, scale_z = guide._get_loc_and_scale("z")
    loc_p, scale_p = guide._get_loc_and_scale("phi")
    m, v = float(loc_z.sum() + loc_p.sum()), float(scale_z.pow(2).sum() + scale_p.pow(2).sum())
    ell = float((-0.5 * math.log(2 * math.pi) - 0.5 * ((y - m) ** 2 + v)).sum())
    return ell - _kl(loc_z, scale_z, Z_SCALE) - _kl(loc_p, scale_p, PHI_SCALE)


def test_kl_terms_are_the_closed_form_of_the_guides_parameters():
    y, guide = _setup()
    elbo = ClosedFormKLElbo(("z", "phi"), num_particles=4, max_plate_nesting=1)
    model_trace, guide_trace = next(elbo._get_traces(_model, guide, (y,), {}))
    terms = elbo.kl_terms(model_trace, guide_trace)
    for name, prior in (("z", Z_SCALE), ("phi", PHI_SCALE)):
        loc, scale = guide._get_loc_and_scale(name)
        assert float(terms[name].detach()) == pytest.approx(_kl(loc, scale, prior), rel=1e-6)


def test_loss_converges_to_the_exact_elbo_as_trace_elbo_does():
    y, guide = _setup()
    exact = -_exact_elbo(y, guide)
    closed = [
        ClosedFormKLElbo(("z", "phi"), num_particles=2000, max_plate_nesting=1).loss(_model, guide, y)
        for _ in range(20)
    ]
    mc = [
        Trace_ELBO(num_particles=2000, vectorize_particles=True, max_plate_nesting=1).loss(_model, guide, y)
        for _ in range(20)
    ]
    closed_t, mc_t = torch.tensor(closed), torch.tensor(mc)
    assert float(closed_t.mean()) == pytest.approx(exact, abs=4 * float(closed_t.std()) / math.sqrt(20) + 1e-3)
    assert float(mc_t.mean()) == pytest.approx(exact, abs=4 * float(mc_t.std()) / math.sqrt(20) + 1e-3)


def test_gradients_reach_every_guide_parameter_and_match_the_exact_elbo():
    y, guide = _setup()
    exact_grads = torch.autograd.grad(-_exact_elbo_t(y, guide), list(guide.parameters()))
    loss = ClosedFormKLElbo(("z", "phi"), num_particles=200_000, max_plate_nesting=1).differentiable_loss(
        _model, guide, y
    )
    grads = torch.autograd.grad(loss, list(guide.parameters()))
    for g, e in zip(grads, exact_grads):
        assert torch.allclose(g, e, atol=0.05 * float(e.abs().max()) + 0.02)


def _exact_elbo_t(y, guide):
    loc_z, scale_z = guide._get_loc_and_scale("z")
    loc_p, scale_p = guide._get_loc_and_scale("phi")
    m, v = loc_z.sum() + loc_p.sum(), scale_z.pow(2).sum() + scale_p.pow(2).sum()
    ell = (-0.5 * math.log(2 * math.pi) - 0.5 * ((y - m) ** 2 + v)).sum()

    def kl(loc, scale, prior):
        return (torch.log(prior / scale) + (scale**2 + loc**2) / (2 * prior**2) - 0.5).sum()

    return ell - kl(loc_z, scale_z, Z_SCALE) - kl(loc_p, scale_p, PHI_SCALE)


def test_bad_sites_are_refused_with_the_site_named():
    y, guide = _setup()
    with pytest.raises(ValueError, match="sequence of site names"):
        ClosedFormKLElbo("z")
    with pytest.raises(ValueError, match="no sample site 'w'"):
        ClosedFormKLElbo(("w",), max_plate_nesting=1).loss(_model, guide, y)
    with pytest.raises(ValueError, match="observed"):
        ClosedFormKLElbo(("obs",), max_plate_nesting=1).loss(_model, guide, y)

    def positive(y):
        s = pyro.sample("s", dist.Gamma(2.0, 1.0))
        with pyro.plate("data", y.shape[0]):
            pyro.sample("obs", dist.Normal(0.0, s), obs=y)

    pyro.clear_param_store()
    g = AutoNormal(positive)
    with pytest.raises(ValueError, match="'s'.*(point mass|Gamma)"):
        ClosedFormKLElbo(("s",), max_plate_nesting=1).loss(positive, g, y)


def test_the_pyro_details_it_relies_on_are_there():
    """The vectorised particle plate's name and AutoNormal's auxiliary site, both Pyro internals:
    if a Pyro release renames them, this names what changed (the ELBO itself raises too)."""
    import pyro_bnnlv.infer.elbos.closed_form_kl as cfk

    y, guide = _setup()
    elbo = Trace_ELBO(num_particles=3, vectorize_particles=True, max_plate_nesting=1)
    model_trace, guide_trace = next(elbo._get_traces(_model, guide, (y,), {}))
    frames = {f.name for f in model_trace.nodes["z"]["cond_indep_stack"]}
    assert cfk._PARTICLE_PLATE in frames, frames
    assert "z" + cfk._AUX in guide_trace.nodes, list(guide_trace.nodes)


def test_a_multi_task_site_in_a_plate_keeps_its_plate_terms():
    """z inside an unsubsampled plate of 4 tasks: the KL sums the 4 tasks' terms once."""

    def model(y):
        with pyro.plate("tasks", 4, dim=-2):
            z = pyro.sample("z", dist.Normal(torch.zeros(2), Z_SCALE).to_event(1))
        with pyro.plate("data", y.shape[0], dim=-1):
            pyro.sample("obs", dist.Normal(z.sum((-1, -2)).unsqueeze(-1), 1.0), obs=y)

    pyro.clear_param_store()
    y = torch.randn(6)
    guide = AutoNormal(model, init_scale=0.4)
    guide(y)
    elbo = ClosedFormKLElbo(("z",), num_particles=5, max_plate_nesting=2)
    model_trace, guide_trace = next(elbo._get_traces(model, guide, (y,), {}))
    loc, scale = guide._get_loc_and_scale("z")
    assert float(elbo.kl_terms(model_trace, guide_trace)["z"].detach()) == pytest.approx(
        _kl(loc, scale, Z_SCALE), rel=1e-6
    )


# --- fused steps: the same estimator as the traced ones, for the library's BNN and ProjectedBNN ---


def _boston_like(n=60, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, (x[:, :1].sin() + 0.1 * torch.randn(n, 1, generator=g)).squeeze(-1)


def _bnn(d=4, hidden=8):
    from pyro_bnnlv.models import BNN
    from pyro_bnnlv.nets import MLP

    return BNN(MLP(d, [hidden], 1, activation="relu"), prior_scale=0.3, noise_scale=0.2)


def _projected(d=4, fixed_phi=False):
    from pyro_bnnlv.models import ProjectedBNN
    from pyro_bnnlv.nets import MLP

    model = ProjectedBNN(MLP(d, [8], 1, activation="relu"), latent_dim=3, decoder_hidden=[5])
    if fixed_phi:
        model.fixed_phi = 0.1 * torch.randn(model.num_phi, generator=torch.Generator().manual_seed(3))
    return model


def _fitted_guide(model, x, y, sites):
    """An AutoNormal set up by one traced step, its parameters moved off their start."""
    guide = AutoNormal(model, init_scale=0.05)
    elbo = ClosedFormKLElbo(sites, num_particles=4, max_plate_nesting=1)
    elbo.loss_and_grads(model, guide, x, y, batch_size=16)
    with torch.no_grad():
        for p in guide.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
            p.grad = None
    return guide, elbo


def _step(elbo, model, guide, x, y, batch_size, seed):
    torch.manual_seed(seed)
    value = elbo.loss_and_grads(model, guide, x, y, batch_size=batch_size)
    grads = [p.grad.clone() for p in guide.parameters()]
    for p in guide.parameters():
        p.grad = None
    return value, grads


@pytest.mark.parametrize("case", ["bnn", "projected", "projected-fixed-phi"])
@pytest.mark.parametrize("batch_size", [16, None])
def test_a_fused_step_is_the_traced_step(case, batch_size):
    """Same parameters, same random state: the fused and the traced step give the same loss and
    gradients (the same draws in the same order), and the fused path was taken."""
    x, y = _boston_like()
    model = _bnn() if case == "bnn" else _projected(fixed_phi=case.endswith("fixed-phi"))
    sites = ("w",) if case == "bnn" else (("z",) if model.fixed_phi is not None else ("z", "phi"))
    with pyro.get_param_store().scope():
        guide, fused = _fitted_guide(model, x, y, sites)
        calls = []
        original = fused._fused_loss_and_grads
        fused._fused_loss_and_grads = lambda *a, **k: calls.append(1) or original(*a, **k)
        v_f, g_f = _step(fused, model, guide, x, y, batch_size, seed=11)
        traced = ClosedFormKLElbo(sites, num_particles=4, max_plate_nesting=1, fused=False)
        v_t, g_t = _step(traced, model, guide, x, y, batch_size, seed=11)
    assert calls == [1]
    assert v_f == pytest.approx(v_t, rel=1e-6)
    for a, b in zip(g_f, g_t):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max()))
    # and a different random state gives a different step (the draws are not frozen)
    v_other, _ = _step(fused, model, guide, x, y, batch_size, seed=12)
    assert v_other != pytest.approx(v_f, rel=1e-6)


def test_the_models_closed_form_priors_are_their_forward_priors():
    """The hooks restate forward's priors; compared here with a trace of forward itself."""
    x, y = _boston_like()
    for model, names in ((_bnn(), ("w",)), (_projected(), ("phi", "z")), (_projected(fixed_phi=True), ("z",))):
        priors = model.closed_form_priors(x.dtype)
        trace = pyro.poutine.trace(model).get_trace(x, y)
        latent = [n for n, s in trace.iter_stochastic_nodes() if not pyro.poutine.util.site_is_subsample(s)]
        assert latent == list(names) == list(priors)
        for name in names:
            fn = trace.nodes[name]["fn"].base_dist
            assert torch.equal(fn.loc, priors[name].loc.expand_as(fn.loc))
            assert torch.equal(fn.scale.expand_as(fn.loc), priors[name].scale.expand_as(fn.loc))


def test_models_and_guides_the_fused_path_does_not_describe_run_traced():
    from pyro_bnnlv.models import BNN, ProjectedBNN

    class NoisyBNN(BNN):  # another forward: the hooks may not describe it
        def forward(self, x, y=None, batch_size=None):
            return super().forward(x, y, batch_size)

    class OwnGuide(AutoNormal):  # likewise for a guide
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    x, y = _boston_like()
    multi = ProjectedBNN(_bnn().net, latent_dim=2, decoder_hidden=[4], num_tasks=2)
    task = torch.arange(len(x)) % 2
    cases = [
        (NoisyBNN(_bnn().net), AutoNormal, ("w",), {}),
        (_bnn(), OwnGuide, ("w",), {}),
        (multi, AutoNormal, ("z", "phi"), {"task": task}),
    ]
    for model, guide_cls, sites, kwargs in cases:
        with pyro.get_param_store().scope():
            guide = guide_cls(model)
            elbo = ClosedFormKLElbo(sites, num_particles=2, max_plate_nesting=1)
            for _ in range(2):
                elbo.loss_and_grads(model, guide, x, y, **kwargs)
            assert elbo._fused_plan(model, guide, (x, y), kwargs) is None, type(model).__name__


def test_fit_svi_with_fused_steps_follows_the_traced_fit_and_a_reused_loss_trains_again():
    """fit_svi: the first step traced (it collects the parameters), the rest fused; the losses
    follow the traced fit's to rounding over 30 steps; the same loss object reused for a second
    fit still trains (its first step is traced again)."""
    from pyro_bnnlv.infer.svi import fit_svi

    x, y = _boston_like()
    model = _projected()
    histories = {}
    for fused in (False, True):
        with pyro.get_param_store().scope():
            guide = AutoNormal(model, init_scale=0.05)
            loss = ClosedFormKLElbo(("z", "phi"), num_particles=4, max_plate_nesting=1, fused=fused)
            histories[fused] = fit_svi(
                model, guide, x, y, num_steps=30, lr=0.01, batch_size=16, seed=0, progress=False, loss=loss
            )
            if fused:
                assert loss._compiled, "the fused path was never set up"
                before = {n: p.detach().clone() for n, p in guide.named_parameters()}
                fit_svi(model, guide, x, y, num_steps=5, lr=0.01, batch_size=16, seed=1, progress=False, loss=loss)
                assert all(not torch.equal(before[n], p) for n, p in guide.named_parameters())
    assert histories[True] == pytest.approx(histories[False], rel=1e-5)


def test_a_fused_path_that_disagrees_with_the_trace_is_caught_by_fit_svi():
    """A model whose hook misstates its prior: fit_svi's check at step 1 warns and finishes traced."""
    from pyro_bnnlv.infer.svi import fit_svi
    from pyro_bnnlv.models import BNN

    class WrongHook(BNN):
        def closed_form_priors(self, dtype):
            return {"w": dist.Normal(self.prior_loc, 10 * self.prior_scale)}

    x, y = _boston_like()
    model = WrongHook(_bnn().net, prior_scale=0.3, noise_scale=0.2)
    with pyro.get_param_store().scope(), pytest.warns(RuntimeWarning, match="fused ClosedFormKLElbo disagrees.*step 1"):
        fit_svi(
            model,
            AutoNormal(model),
            x,
            y,
            num_steps=4,
            lr=0.01,
            seed=0,
            progress=False,
            loss=ClosedFormKLElbo(("w",), num_particles=2, max_plate_nesting=1),
        )


def test_fused_must_be_a_bool():
    with pytest.raises(TypeError, match="fused must be True or False"):
        ClosedFormKLElbo(("w",), fused="yes")


def test_a_learned_noise_scale_is_trained_by_fused_steps_as_by_traced_ones():
    """BNN(learn_noise=True): the noise is a parameter of the model, collected by fit_svi's first
    (traced) step; the fused steps must move it exactly as traced ones do."""
    from pyro_bnnlv.infer.svi import fit_svi
    from pyro_bnnlv.models import BNN
    from pyro_bnnlv.nets import MLP

    x, y = _boston_like()
    out = {}
    for fused in (False, True):
        model = BNN(MLP(4, [8], 1), prior_scale=0.3, noise_scale=0.5, learn_noise=True)
        with pyro.get_param_store().scope():
            hist = fit_svi(
                model,
                AutoNormal(model, init_scale=0.05),
                x,
                y,
                num_steps=40,
                lr=0.02,
                batch_size=16,
                seed=0,
                progress=False,
                loss=ClosedFormKLElbo(("w",), num_particles=4, max_plate_nesting=1, fused=fused),
            )
        out[fused] = (float(model.noise_scale), hist)
    assert out[True][0] != 0.5 and out[True][0] == pytest.approx(out[False][0], rel=1e-5)
    assert out[True][1] == pytest.approx(out[False][1], rel=1e-5)


def test_pyros_own_svi_trains_with_fused_steps_as_with_traced_ones():
    """pyro.infer.SVI collects, at every step, the parameters the step's pyro.param statements
    touch: fused steps must issue them (read inside the modules' Pyro context), or SVI would
    update nothing after its first step."""
    from pyro.infer import SVI

    from pyro_bnnlv.models import BNN
    from pyro_bnnlv.nets import MLP

    x, y = _boston_like()
    out = {}
    for fused in (False, True):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        model = BNN(MLP(4, [8], 1), prior_scale=0.3, noise_scale=0.5, learn_noise=True)
        guide = AutoNormal(model, init_scale=0.05)
        elbo = ClosedFormKLElbo(("w",), num_particles=4, max_plate_nesting=1, fused=fused)
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), elbo)
        out[fused] = ([svi.step(x, y, batch_size=16) for _ in range(30)], float(model.noise_scale))
        if fused:
            assert elbo._compiled, "the fused path was never set up"
    pyro.clear_param_store()
    assert out[True][1] != 0.5 and out[True][1] == pytest.approx(out[False][1], rel=1e-5)
    assert out[True][0] == pytest.approx(out[False][0], rel=1e-5)


def test_what_a_fused_step_cannot_see_runs_traced_and_bad_input_fails_alike():
    """Handlers around the call (a mask), forward hooks, a guide with create_plates, frozen
    parameters and no_grad: the same loss as traced (fused where it is safe, traced where not);
    bad data: the model's own error, fused or not."""
    x, y = _boston_like()
    model = _bnn()
    keep = torch.arange(len(x)) % 3 > 0

    def call(elbo, guide, **kw):
        torch.manual_seed(7)
        return elbo.loss_and_grads(model, guide, x, y, **kw)

    with pyro.get_param_store().scope():
        guide, fused = _fitted_guide(model, x, y, ("w",))
        traced = fused.eager_twin()
        assert not traced.fused and traced.num_particles == fused.num_particles
        with pyro.poutine.mask(mask=keep):
            assert call(fused, guide) == pytest.approx(call(traced, guide), rel=1e-6)
        handle = model.register_forward_pre_hook(lambda m, args: (2 * args[0], *args[1:]))
        assert fused._fused_plan(model, guide, (x, y), {}) is None
        assert call(fused, guide) == pytest.approx(call(traced, guide), rel=1e-6)
        handle.remove()
        assert fused._fused_plan(model, guide, (x, y), {})[0] == ["w"]
        with torch.no_grad():
            assert call(fused, guide) == pytest.approx(call(traced, guide), rel=1e-6)
        for bad_y, match in ((y[:1], "different numbers of rows"), (y.masked_fill(keep, float("nan")), "NaN")):
            for elbo in (fused, traced):
                with pytest.raises(ValueError, match=match):
                    elbo.loss_and_grads(model, guide, x, bad_y)
        plated = AutoNormal(model, create_plates=lambda *a, **k: pyro.plate("data", len(x), subsample_size=16))
        elbo = ClosedFormKLElbo(("w",), num_particles=2, max_plate_nesting=1)
        elbo.loss_and_grads(model, plated, x, y, batch_size=16)
        assert elbo._fused_plan(model, plated, (x, y), {"batch_size": 16}) is None


def test_num_particles_must_be_a_positive_int():
    """Issue 39: num_particles=0 reached Pyro's ZeroDivisionError."""
    for bad in (0, -1, 1.5):
        with pytest.raises((TypeError, ValueError), match="num_particles"):
            ClosedFormKLElbo(("w",), num_particles=bad)
