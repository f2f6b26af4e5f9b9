"""NCAIElbo on the fused ELBO: for the library's BNN+LV with a mean-field guide a step runs no
Pyro trace and no torch.jit, and gives the traced objective's draws, value, gradients and
statistics (checked away from the start: after Adam steps, on fresh minibatches)."""

import warnings

import pyro
import pytest
import torch

import pyro_bnnlv as pb
from pyro_bnnlv.infer.elbos import ncai as ncai_module
from pyro_bnnlv.infer.elbos.ncai import NCAIElbo
from pyro_bnnlv.infer.elbos.penalized import PenalizedElbo
from pyro_bnnlv.stats._pairwise import StartedStatistics, pairwise_extension
from fused_twin import compare_with_twin, count_traced_steps

# weights and growth rates at which the penalties and the ELBO are of one order (App. F.1's
# eps_T = 0.01 makes exp(HZ / eps_T) dwarf the ELBO at a random start)
MODERATE = dict(lambda1=1.0, lambda2=1.0, lambda3=1.0, eps_T=1.0, eps_x=1.0, eps_y=1.0)


def _data(N=60):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 1, generator=g)
    return x, torch.sin(2 * x[:, 0]) + 0.2 * torch.randn(N, generator=g)


def _pair(seed=0):
    model = pb.BNNLV(pb.MLP(2, [7], 1, activation="tanh"), latent_scale=0.7, noise_scale=0.3)
    return model, pb.MeanField(model, init_scale=0.2, seed=seed)


def _compare(loss, kwargs):
    """:func:`fused_twin.compare_with_twin` for NCAIElbo, each compared step fused."""
    model, guide = _pair()
    x, y = _data()
    fused_calls = []
    original = loss._fused_objective

    def counted(*args, **kwargs):
        out = original(*args, **kwargs)
        fused_calls.append(out is not None)
        return out

    loss._fused_objective = counted
    _, twin = compare_with_twin(model, guide, x, y, kwargs, loss)
    assert type(twin) is NCAIElbo and not twin.fused and twin._fuser is None
    assert fused_calls[0] is False and all(fused_calls[1:]), "the pair was not fused after its first step"
    return loss.history[-1]


@pytest.mark.parametrize(
    "options, kwargs",
    [
        ({}, {}),
        ({}, {"batch_size": 20}),
        ({"num_particles": 3}, {"batch_size": 20}),
        ({"num_particles": 4, "vectorize_particles": True}, {}),
        ({"independence": "pc"}, {"batch_size": 20}),
        ({"independence": "knn-mi"}, {"batch_size": 30}),
        ({"independence": "hsic-multiscale", "warmup_steps": 20}, {}),
        ({"lambda1": 0.0, "lambda2": 0.0, "lambda3": 0.0}, {"batch_size": 20}),
    ],
)
def test_fused_ncai_equals_the_traced_objective(options, kwargs):
    terms = _compare(NCAIElbo(**{**MODERATE, **options}), kwargs)
    assert "elbo_loss" in terms and "penalty" in terms


def test_the_statistics_do_not_depend_on_the_particles():
    # on the full data the statistics are functions of the guide's means only: 1, 3 sequential
    # and 4 vectorised particles must record the same values (the traced objective used to divide
    # them by 4 with vectorised particles)
    def statistics(**options):
        model, guide = _pair()
        x, y = _data()
        with pyro.get_param_store().scope():
            out = []
            for fused in (True, False):
                loss = NCAIElbo(**MODERATE, fused=fused, **options)
                pyro.set_rng_seed(0)
                for _ in range(2):  # the second call is fused (the first one registers the pair)
                    loss.loss_and_grads(model, guide, x, y)
                out.append({k: v for k, v in loss.history[-1].items() if k in ("hz", "offdiag", "hsic_x")})
        return out

    reference = statistics()[0]
    assert set(reference) == {"hz", "offdiag", "hsic_x"}
    for options in ({}, {"num_particles": 3}, {"num_particles": 4, "vectorize_particles": True}):
        for terms in statistics(**options):
            assert terms == pytest.approx(reference, rel=1e-6)


def test_a_default_ncai_fit_runs_no_trace_after_its_first_step_and_no_jit(monkeypatch):
    calls = count_traced_steps(monkeypatch)

    def no_jit(*args, **kwargs):
        raise AssertionError("torch.jit.trace called")

    monkeypatch.setattr(torch.jit, "trace", no_jit)
    model, guide = _pair()
    x, y = _data()
    loss = NCAIElbo(**MODERATE)
    assert loss.fused and not loss.jit
    pb.fit_svi(model, guide, x, y, num_steps=30, batch_size=20, loss=loss, seed=0, progress=False, check_jit=False)
    assert calls["n"] == 1 and len(loss.history) == 30


@pytest.mark.parametrize("compiled", ["1", "0"], ids=["compiled", "torch"])
def test_a_non_finite_latent_mean_stops_a_fused_fit_with_the_step(monkeypatch, compiled):
    """The fused step's statistics skip the per-step input checks, with the compiled kernels and
    on their torch path (PYRO_BNNLV_COMPILED=0, read at each call): a latent mean made NaN shows
    as a non-finite loss, reported with its step (not a ValueError from the statistics)."""
    monkeypatch.setenv("PYRO_BNNLV_COMPILED", compiled)
    model, guide = _pair()
    x, y = _data()

    def poison(step, value):
        if step == 4:
            with torch.no_grad():
                guide.locs.z[0] = float("nan")

    with pytest.raises(pb.NonFiniteLossError, match="at step 5"):
        pb.fit_svi(model, guide, x, y, num_steps=10, loss=NCAIElbo(**MODERATE), seed=0, progress=False, callback=poison)


def test_a_fused_ncai_fit_equals_the_traced_one_and_passes_the_guard():
    x, y = _data()
    out = []
    for fused in (True, False):
        model, guide = _pair()
        loss = NCAIElbo(**MODERATE, fused=fused, warmup_steps=10)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hist = pb.fit_svi(
                model, guide, x, y, num_steps=120, lr=0.02, batch_size=20, loss=loss, seed=3, progress=False
            )
        assert not [w for w in caught if "eager twin" in str(w.message)]  # the guard checked steps 1, 10, 100
        out.append((hist, loss.history, [p.detach().clone() for p in guide.parameters()]))
    (h_f, rec_f, p_f), (h_t, rec_t, p_t) = out
    assert h_f == pytest.approx(h_t, rel=1e-4)
    assert [r["hz"] for r in rec_f] == pytest.approx([r["hz"] for r in rec_t], rel=1e-4)
    for a, b in zip(p_f, p_t):
        assert torch.allclose(a, b, atol=1e-4)


def test_options_that_cannot_fuse():
    class TracePenalty(PenalizedElbo):
        def penalty(self, model_trace, guide_trace):
            return 0.0

    with pytest.raises(TypeError, match="fused_penalty_terms"):
        TracePenalty(fused=True)
    with pytest.raises(TypeError, match="fused must be True or False"):
        NCAIElbo(fused="yes")
    assert not NCAIElbo(jit=True).fused  # the compiled path on request
    assert NCAIElbo(jit=True, fused=True).fused
    assert not NCAIElbo(latent_site="h").fused  # other site names: traced


@pytest.fixture
def two_intra_op_threads():
    """torch's intra-op pool at two threads for the test (the kernels' HZ and HSIC then run side
    by side), restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.skipif(pairwise_extension() is None, reason="no C++ compiler")
@pytest.mark.parametrize(
    "options, kwargs",
    [
        ({}, {}),
        ({}, {"batch_size": 20}),
        ({"num_particles": 3}, {"batch_size": 20}),
        ({"num_particles": 4, "vectorize_particles": True}, {}),
    ],
)
def test_statistics_started_beside_the_elbo_give_the_same_fit(monkeypatch, two_intra_op_threads, options, kwargs):
    """With a core free of torch's intra-op pool a fused step starts the "hsic" statistics of
    each round's rows before computing the ELBO and collects them after: the same history and
    parameters, to the bit, as computing them afterwards (no free core: HZ and HSIC side by side
    on the pool, here with two intra-op threads)."""
    collected = {"n": 0}
    take = StartedStatistics._take  # every way of collecting them takes the handle once

    def counted(self, *args):
        collected["n"] += 1
        return take(self, *args)

    monkeypatch.setattr(StartedStatistics, "_take", counted)
    x, y = _data()
    out = []
    for free in (True, False):
        monkeypatch.setattr(ncai_module, "_core_beside_the_pool", lambda: free)
        collected["n"] = 0
        model, guide = _pair()
        loss = NCAIElbo(**MODERATE, **options)
        hist = pb.fit_svi(model, guide, x, y, num_steps=25, loss=loss, seed=0, progress=False, **kwargs)
        out.append((hist, loss.history, [p.detach().clone() for p in guide.parameters()], collected["n"]))
    (h2, r2, p2, n2), (h1, r1, p1, n1) = out
    rounds = 1 if options.get("vectorize_particles") else options.get("num_particles", 1)
    assert n2 == 24 * rounds and n1 == 0  # every fused step (not the first, traced one) overlapped
    assert h2 == h1 and r2 == r1
    assert all(torch.equal(a, b) for a, b in zip(p2, p1))


@pytest.mark.skipif(pairwise_extension() is None, reason="no C++ compiler")
@pytest.mark.parametrize("free_core", [True, False])
@pytest.mark.parametrize(
    "options, kwargs",
    [({}, {}), ({}, {"batch_size": 20}), ({"num_particles": 4, "vectorize_particles": True}, {"batch_size": 20})],
)
def test_the_penalty_gradient_added_to_the_leaf_equals_the_backward_pass(monkeypatch, free_core, options, kwargs):
    """In a training step the "hsic" penalty's gradient with respect to the guide's means
    (``loc_z``, all rows or the minibatch's) is computed with its statistics and added to
    ``loc_z.grad`` after the ELBO's backward pass, with no autograd node: the same history and
    parameters, to the bit, as the node and one backward pass through it (what ``loss`` and
    ``differentiable_loss`` build), started on the worker or computed after the ELBO."""
    monkeypatch.setattr(ncai_module, "_core_beside_the_pool", lambda: free_core)
    x, y = _data()
    added = []
    add = PenalizedElbo.add_leaf_gradient
    monkeypatch.setattr(PenalizedElbo, "add_leaf_gradient", lambda self, *a: added.append(a[1]) or add(self, *a))
    out = []
    for direct in (True, False):
        if not direct:
            monkeypatch.setattr(PenalizedElbo, "takes_leaf_gradients", property(lambda self: False))
        model, guide = _pair()
        loss = NCAIElbo(**MODERATE, **options)
        hist = pb.fit_svi(model, guide, x, y, num_steps=25, loss=loss, seed=0, progress=False, **kwargs)
        out.append((hist, loss.history, [p.detach().clone() for p in guide.parameters()]))
    assert len(added) == 24  # every fused step, none in the node's run
    assert all((rows is None) == ("batch_size" not in kwargs) for rows in added)
    (h1, r1, p1), (h2, r2, p2) = out
    assert h1 == h2 and r1 == r2
    assert all(torch.equal(a, b) for a, b in zip(p1, p2))


@pytest.mark.skipif(pairwise_extension() is None, reason="no C++ compiler")
def test_a_penalty_leaf_gradient_outside_a_training_step_is_refused():
    loss = NCAIElbo()
    assert not loss.takes_leaf_gradients
    with pytest.raises(RuntimeError, match="outside a training step"):
        loss.add_leaf_gradient(torch.zeros(3, 1, requires_grad=True), None, torch.ones(3, 1))
