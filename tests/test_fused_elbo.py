"""FusedTraceElbo computes Trace_ELBO's estimator for the library's pairs without Pyro's traces:
the same draws from the same random state, the same loss and gradients (float32 rounding), at
points away from the start (after Adam steps, on other minibatches), for every supported pair;
anything else runs traced."""

import warnings

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroParam

import pyro_bnnlv as pb
from pyro_bnnlv.infer.elbos.fused import fused_pair
from fused_twin import compare_with_twin, count_traced_steps

RTOL = 2e-6  # float32: a sum of a few hundred terms, in another order


def _data(N=40, L=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 1, generator=g, dtype=dtype)
    y = torch.randn(N, L, generator=g, dtype=dtype) if L > 1 else torch.sin(2 * x[:, 0])
    return x, y


def _pair(kind, guide_kind, L=1, learn_noise=False):
    if kind == "bnn":
        model = pb.BNN(
            pb.MLP(1, [7], L),
            prior_scale=pb.fan_in_prior_scale(pb.MLP(1, [7], L)),
            noise_scale=0.3,
            learn_noise=learn_noise,
        )
    else:
        model = pb.BNNLV(pb.MLP(2, [7], L), latent_scale=0.7, noise_scale=0.3, learn_noise=learn_noise)
    if guide_kind == "meanfield":
        guide = pb.MeanField(model, init_scale=0.2)
    else:
        guide = AutoNormal(model, init_scale=0.2, create_plates=getattr(model, "create_plates", None))
    return model, guide


def _compare(model, guide, x, y, kwargs, loss, steps=5, checks=3):
    """:func:`fused_twin.compare_with_twin` for FusedTraceElbo, whose twin is Trace_ELBO."""
    n, twin = compare_with_twin(model, guide, x, y, kwargs, loss, steps=steps, checks=checks, rtol=RTOL)
    assert loss._compiled, "the pair was not recognised"
    assert type(twin) is Trace_ELBO
    return n


@pytest.mark.parametrize("kind", ["bnn", "bnnlv"])
@pytest.mark.parametrize("guide_kind", ["meanfield", "autonormal"])
@pytest.mark.parametrize("particles, vectorize", [(1, False), (4, True), (3, False)])
@pytest.mark.parametrize("batch_size", [None, 8])
def test_fused_equals_trace_elbo(kind, guide_kind, particles, vectorize, batch_size):
    model, guide = _pair(kind, guide_kind)
    x, y = _data()
    loss = pb.FusedTraceElbo(num_particles=particles, vectorize_particles=vectorize)
    kwargs = {} if batch_size is None else {"batch_size": batch_size}
    assert _compare(model, guide, x, y, kwargs, loss) == 2 * (2 if kind == "bnnlv" else 1)


@pytest.mark.parametrize("kind", ["bnn", "bnnlv"])
def test_fused_equals_trace_elbo_with_a_learned_noise_and_two_outputs(kind):
    model, guide = _pair(kind, "meanfield", L=2, learn_noise=True)
    x, y = _data(L=2)
    loss = pb.FusedTraceElbo(num_particles=2, vectorize_particles=True)
    n = _compare(model, guide, x, y, {"batch_size": 10}, loss)
    assert n == 2 * (2 if kind == "bnnlv" else 1) + 1  # sigma is trained too


def test_fused_equals_trace_elbo_in_float64():
    model, guide = _pair("bnnlv", "meanfield")
    model.double()
    guide = pb.MeanField(model, init_scale=0.2)
    x, y = _data(dtype=torch.float64)
    _compare(model, guide, x, y, {"batch_size": 8}, pb.FusedTraceElbo())


@pytest.mark.parametrize("kind, batch_size", [("bnn", None), ("bnnlv", 12)])
def test_fit_svi_default_equals_trace_elbo_over_a_fit(kind, batch_size):
    """The whole history and the fitted guide of fit_svi's default (fused) against Trace_ELBO."""
    x, y = _data(N=60)
    out = []
    for loss in (None, Trace_ELBO()):
        model, guide = _pair(kind, "meanfield")
        hist = pb.fit_svi(
            model, guide, x, y, num_steps=150, lr=0.02, seed=3, batch_size=batch_size, progress=False, loss=loss
        )
        out.append((hist, [p.detach().clone() for p in guide.parameters()]))
    (h_fused, p_fused), (h_traced, p_traced) = out
    assert h_fused == pytest.approx(h_traced, rel=1e-5)
    assert h_fused[-1] < h_fused[0]
    for a, b in zip(p_fused, p_traced):
        assert torch.allclose(a, b, atol=1e-4)


def test_steps_after_the_first_run_no_pyro_trace(monkeypatch):
    calls = count_traced_steps(monkeypatch)
    model, guide = _pair("bnnlv", "meanfield")
    x, y = _data()
    pb.fit_svi(model, guide, x, y, num_steps=30, batch_size=8, seed=0, progress=False, check_jit=False)
    assert calls["n"] == 1  # the first step only


def test_pyro_svi_trains_the_same_with_the_fused_loss():
    """Pyro's SVI collects each step's parameters from a parameter-only trace: the fused steps
    issue the guide's pyro.param statements there, so SVI trains exactly as with Trace_ELBO."""
    x, y = _data()
    finals = []
    for loss in (pb.FusedTraceElbo(), Trace_ELBO()):
        model, guide = _pair("bnnlv", "meanfield")
        with pyro.get_param_store().scope():
            pyro.set_rng_seed(0)
            svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), loss)
            losses = [svi.step(x, y, batch_size=8) for _ in range(40)]
            finals.append((losses, guide.locs.z.detach().clone()))
    assert finals[0][0] == pytest.approx(finals[1][0], rel=1e-5)
    assert torch.allclose(finals[0][1], finals[1][1], atol=1e-5)


def test_a_replaced_parameter_is_read_through_pyro_again():
    model, guide = _pair("bnn", "meanfield")
    x, y = _data()
    loss = pb.FusedTraceElbo()
    with pyro.get_param_store().scope():
        loss.loss_and_grads(model, guide, x, y)
        loss.loss_and_grads(model, guide, x, y)  # fused: remembers the store's tensors
        guide.locs.w = PyroParam(torch.full((model.num_weights,), 0.5))
        pyro.set_rng_seed(0)
        fused = loss.loss(model, guide, x, y)
        pyro.set_rng_seed(0)
        traced = Trace_ELBO().loss(model, guide, x, y)
    assert fused == pytest.approx(traced, rel=RTOL)


class _Tempered(pb.BNN):
    def _likelihood(self, f):
        return pyro.distributions.Normal(f.squeeze(-1), 2 * self.noise_scale_param())


def test_what_a_fused_step_cannot_see_runs_traced():
    bnn, lv = pb.BNN(pb.MLP(1, [4], 1)), pb.BNNLV(pb.MLP(2, [4], 1))
    tempered = _Tempered(pb.MLP(1, [4], 1))
    assert fused_pair(bnn, pb.MeanField(bnn)) and fused_pair(lv, pb.MeanField(lv))
    assert not fused_pair(tempered, pb.MeanField(tempered))  # a method of the model replaced
    assert not fused_pair(lv, AutoNormal(lv))  # z's guide not subsampled with the model's plate
    assert not fused_pair(pb.BNN(pb.ModuleNet(torch.nn.Linear(1, 1), 1, 1)), None)
    # a handler around the call: traced, so it acts (the loss scaled by 3)
    model, guide = _pair("bnn", "meanfield")
    x, y = _data()
    loss = pb.FusedTraceElbo()
    with pyro.get_param_store().scope():
        loss.loss(model, guide, x, y)
        pyro.set_rng_seed(0)
        scaled = pyro.poutine.scale(scale=3.0)
        fused = loss.loss(scaled(model), scaled(guide), x, y)
        pyro.set_rng_seed(0)
        traced = Trace_ELBO().loss(scaled(model), scaled(guide), x, y)
        hook = model.register_forward_hook(lambda *a: None)  # a hook: traced
        assert loss._pair(model, guide, (x, y), {}) is None
        pyro.set_rng_seed(0)
        hooked = loss.loss(model, guide, x, y)
        hook.remove()
        pyro.set_rng_seed(0)
        plain = Trace_ELBO().loss(model, guide, x, y)
    assert fused == pytest.approx(traced, rel=RTOL)
    assert hooked == pytest.approx(plain, rel=RTOL)


def test_bad_data_and_arguments_fail_cleanly():
    with pytest.raises(ValueError, match="num_particles"):
        pb.FusedTraceElbo(num_particles=0)
    with pytest.raises(TypeError, match="fused must be True or False"):
        pb.FusedTraceElbo(fused="yes")
    model, guide = _pair("bnn", "meanfield")
    x, y = _data()
    loss = pb.FusedTraceElbo()
    with pyro.get_param_store().scope():
        loss.loss(model, guide, x, y)
        bad = x.clone()
        bad[3, 0] = float("nan")
        with pytest.raises(ValueError, match="x contains NaN"):
            loss.loss(model, guide, bad, y)
        x[0, 0] = float("inf")  # in place: the same tensor, checked again
        with pytest.raises(ValueError, match="x contains NaN"):
            loss.loss(model, guide, x, y)


def test_the_default_fused_fit_raises_no_warning():
    model, guide = _pair("bnnlv", "meanfield")
    x, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pb.fit_svi(model, guide, x, y, num_steps=120, batch_size=8, seed=0, progress=False)
