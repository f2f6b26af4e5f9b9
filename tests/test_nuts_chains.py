"""Several NUTS chains in one process; run-time estimate, tree depth and saturation warning."""

import logging
import math
import re
import warnings

import pyro
import pytest
import torch
from pyro.infer import MCMC

import pyro_bnnlv as pb
from pyro_bnnlv import _compiled as compiled
from pyro_bnnlv.infer.mcmc import FlatNUTS, chain_records, flat_potential, run_nuts
from pyro_bnnlv.infer.mcmc.chains import _ChainRunner, warmup_reestimate

from test_nuts import _draws, _linreg_data, _linreg_model, _tiny_bnn64

needs_core = pytest.mark.skipif(compiled.nuts_extension() is None, reason="no C++ toolchain")


def _toy_bnn():
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-1, 1, 24).unsqueeze(-1)
    y = torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(24, generator=g)
    return pb.BNN(pb.MLP(1, [6], 1, activation="tanh"), prior_scale=1.0, noise_scale=0.1), x, y


KW = dict(num_samples=12, warmup_steps=12, progress=False, map_steps=50, max_tree_depth=6)


def _same_chain(a, b):
    assert torch.equal(a["w"], b["w"])


@pytest.mark.parametrize("chain_method", ["auto", "sequential"])
def test_chains_in_one_process_equal_separate_runs(chain_method):
    """Chain c of run_nuts(seed=s, num_chains=3) is run_nuts(seed=s + c), draw for draw and
    record for record (initialisation, Pyro's adaptation per chain, NUTS draws)."""
    model, x, y = _toy_bnn()
    many = run_nuts(model, x, y, num_chains=3, seed=10, chain_method=chain_method, **KW)
    info = many.run_info
    expected = "threads" if chain_method == "auto" and compiled.nuts_extension() is not None else "sequential"
    assert info.chain_method == expected and info.seeds == [10, 11, 12]
    w = many.get_samples(group_by_chain=True)["w"]
    assert w.shape == (3, 12, model.net.num_weights)
    recs = chain_records(many)
    for c in range(3):
        one = run_nuts(model, x, y, seed=10 + c, **KW)
        assert torch.equal(w[c], one.get_samples()["w"])
        ref = chain_records(one)[0]
        for key in ("num_steps", "tree_depth", "potential_energy", "warmup_num_steps", "divergences"):
            assert recs[c][key] == ref[key], key
    # the chains differ from each other (own seeds), and each adapted its own step size
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2])
    assert len({float(k.step_size) for k in many.kernels}) == 3


def test_chain_generator_reproduces_the_global_generator():
    """A FlatNUTS with its own generator seeded s draws exactly what it draws from the global
    generator seeded s (momenta of the step-size search included), which is Pyro's NUTS."""
    model, x, y = _tiny_bnn64()
    pot = flat_potential(model, x, y)
    w0 = model.net.init_weights(torch.Generator().manual_seed(1)).double()
    for compiled_tree in (False, None):
        ref = _draws(FlatNUTS(pot, compiled=compiled_tree, max_tree_depth=6), w0, 3, 8)  # seed 3
        pyro.set_rng_seed(99)  # the global generator is not used
        kernel = FlatNUTS(pot, compiled=compiled_tree, max_tree_depth=6, generator=torch.Generator().manual_seed(3))
        mcmc = MCMC(kernel, num_samples=3, warmup_steps=8, initial_params={"w": w0}, disable_progbar=True)
        mcmc.run()
        assert torch.equal(mcmc.get_samples()["w"], ref)
    with pytest.raises(TypeError, match="generator"):
        FlatNUTS(pot, generator=3)


def test_inference_data_shows_every_chain():
    from pyro_bnnlv.diagnostics import to_inference_data

    model, x, y = _toy_bnn()
    mcmc = run_nuts(model, x, y, num_chains=3, seed=0, **KW)
    idata = to_inference_data(model, mcmc, x, y, seed=0)
    assert idata.posterior.sizes["chain"] == 3 and idata.posterior.sizes["draw"] == 12
    assert idata.sample_stats["tree_depth"].shape == (3, 12)
    steps = idata.sample_stats["n_steps"].values
    depth = idata.sample_stats["tree_depth"].values
    assert ((2**depth - 1 <= steps) & (steps <= 2 ** (depth + 1) - 1)).all()


def test_tree_depth_counts_completed_doublings():
    """Pyro's (and Stan's) tree depth: a tree that exhausts max_tree_depth = d has depth d and
    2^d - 1 leapfrog steps (a tiny step size never U-turns); otherwise
    2^depth - 1 <= steps <= 2^(depth + 1) - 1."""
    model, x, y = _tiny_bnn64()
    pot = flat_potential(model, x, y)
    w0 = model.net.init_weights(torch.Generator().manual_seed(1)).double()
    for compiled_tree in (False, None):
        kernel = FlatNUTS(
            pot,
            compiled=compiled_tree,
            step_size=1e-6,
            adapt_step_size=False,
            adapt_mass_matrix=False,
            max_tree_depth=4,
        )
        mcmc = MCMC(kernel, num_samples=5, warmup_steps=0, initial_params={"w": w0}, disable_progbar=True)
        mcmc.run()
        rec = chain_records(mcmc)[0]
        assert rec["tree_depth"] == [4] * 5 and rec["num_steps"] == [15] * 5
    mcmc = run_nuts(model, x, y, num_samples=30, warmup_steps=30, seed=0, progress=False, map_steps=50)
    rec = chain_records(mcmc)[0]
    assert any(d < 10 for d in rec["tree_depth"])
    for d, n in zip(rec["tree_depth"], rec["num_steps"]):
        assert 2**d - 1 <= n <= 2 ** (d + 1) - 1


def test_saturated_tree_depth_warns_with_the_share():
    model, x, y = _toy_bnn()
    with pytest.warns(UserWarning, match=r"100% of the draws reached max_tree_depth=1 \(1 leapfrog"):
        m = run_nuts(model, x, y, seed=0, **{**KW, "max_tree_depth": 1})
    assert m.run_info.max_tree_depth_share == 1.0


def test_a_chain_that_never_moves_is_reported():
    """Too short a warm-up can leave a step size at which every proposal is rejected (the cosine
    toy, 1x10, 20 warm-up iterations: all draws one point); that must not pass silently as
    posterior samples. Which seeds stick depends on the CPU's rounding (of seeds 0-7: 6 and 7 on
    one machine, 4 and 7 on another), so every seed is checked: warned exactly when stuck."""
    data = pb.load_dataset("cosine", seed=0)
    model = pb.BNN(pb.MLP(1, [10], 1, activation="tanh"), prior_scale=math.sqrt(0.5), noise_scale=0.1)
    args = (model, data.x_train, data.y_train)
    stuck = []
    for seed in range(8):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = run_nuts(*args, num_samples=10, warmup_steps=20, seed=seed, progress=False)
        draws = torch.unique(m.get_samples()["w"], dim=0).shape[0]
        said = [str(w.message) for w in caught if "never moved" in str(w.message)]
        assert bool(said) == (draws == 1), (seed, draws, said)
        if said:
            assert re.search(r"chain\(s\) \[0\] never moved: all 10 draws.*warmup_steps=20", said[0])
            stuck.append(seed)
    assert 0 < len(stuck) < 8, stuck  # both cases occur among these seeds


def test_threaded_chains_beyond_the_cores_say_what_they_cost(monkeypatch):
    if compiled.nuts_extension() is None:
        pytest.skip("threaded chains need the compiled core")
    model, x, y = _toy_bnn()
    monkeypatch.setattr("pyro_bnnlv.infer.mcmc.nuts.usable_cores", lambda: 1)
    with pytest.warns(UserWarning, match=r"2 chains share 1 core\(s\).*about 2.0x the wall time"):
        m = run_nuts(model, x, y, num_chains=2, seed=0, **KW)
    assert m.run_info.chain_method == "threads"
    monkeypatch.setattr("pyro_bnnlv.infer.mcmc.nuts.usable_cores", lambda: 2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*chains share")
        run_nuts(model, x, y, num_chains=2, seed=0, **KW)


def test_threaded_chains_keep_the_callers_thread_limit(monkeypatch):
    """On a 16-core machine two chains would get 8 intra-op threads each; a caller who set
    torch.set_num_threads(1) keeps 1 (the chain threads come on top of it)."""
    if compiled.nuts_extension() is None:
        pytest.skip("threaded chains need the compiled core")
    model, x, y = _toy_bnn()
    monkeypatch.setattr("pyro_bnnlv.infer.mcmc.nuts.usable_cores", lambda: 16)
    before = torch.get_num_threads()
    calls = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), real(n))[1])
    try:
        real(1)
        run_nuts(model, x, y, num_chains=2, seed=0, **KW)
        assert calls and max(calls) == 1, calls
    finally:
        real(before)


def test_run_time_is_estimated_from_the_first_iterations(caplog):
    model, x, y = _toy_bnn()
    with caplog.at_level(logging.INFO, logger="pyro_bnnlv"):
        m = run_nuts(model, x, y, num_chains=2, seed=0, **KW)
    est = m.run_info.estimated_sampling_seconds
    assert est is not None and 0 < est < math.inf
    said = [r.getMessage() for r in caplog.records if "NUTS: estimated" in r.getMessage()]
    assert len(said) == 1 and "2 chains" in said[0] and "x 24 iterations" in said[0]
    again = [r.getMessage() for r in caplog.records if "re-estimated" in r.getMessage()]
    assert len(again) == 1 and "from the last 3 warm-up iterations" in again[0]  # ceil(12 / 4)
    reest = m.run_info.reestimated_sampling_seconds
    assert reest is not None and 0 < reest < math.inf


def test_warmup_reestimate_projects_the_draws_from_the_end_of_the_warmup():
    """The per-draw cost is the mean of the last quarter of the warm-up: with iterations costing
    1, 1, 1, 1, 2, 2, 4, 4 s (deepening trees) the draws are projected at 4 s each, where the rate
    of the first four iterations (1 s) would run 3.1x low."""
    ends = [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0]
    r, T = warmup_reestimate(ends, num_samples=10)
    assert (r, T) == (4.0, 16.0 + 10 * 4.0)
    assert T / (4.0 * (8 + 10) / 4) == pytest.approx(56 / 18)  # against the estimate from the first 4
    assert warmup_reestimate(ends, 10, tail=1.0) == (2.0, 36.0)  # the whole warm-up's mean
    assert warmup_reestimate([3.0], 5) == (3.0, 18.0)  # one iteration: m = 1, t_0 = 0
    assert warmup_reestimate(ends[:5], 2)[0] == pytest.approx((6.0 - 3.0) / 2)  # m = ceil(5 / 4) = 2
    assert warmup_reestimate(ends, 0) == (4.0, 16.0)
    for bad in ([], [2.0, 1.0], [-1.0]):
        with pytest.raises(ValueError):
            warmup_reestimate(bad, 3)
    with pytest.raises(ValueError, match="tail"):
        warmup_reestimate(ends, 3, tail=0.0)


@pytest.mark.parametrize("parallel", [True, False])
def test_the_reestimate_of_a_run_takes_the_slowest_chain_or_k_times_the_first(parallel, caplog):
    """In parallel threads the run ends with its slowest chain; one after another it takes K times
    the first chain (re-estimated when that chain's warm-up ends); the line names the factor
    against the first estimate."""
    runner = _ChainRunner([object()] * 2, [{}] * 2, warmup_steps=4, num_samples=10, parallel=parallel, progress=False)
    runner.estimate = {"seconds": 14.0, "from_iterations": 4}
    fast, slow = [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 4.0, 8.0]  # last-quarter costs 1 s and 4 s per draw
    with caplog.at_level(logging.INFO, logger="pyro_bnnlv"):
        if parallel:
            runner._say_reestimate(None, [fast, slow], [0.5, 0.0], elapsed=8.0)
            assert runner.reestimate["seconds"] == 8.0 + 10 * 4.0
        else:
            runner._say_reestimate(None, [slow], [0.5], elapsed=8.5)
            assert runner.reestimate["seconds"] == 0.5 + 2 * (8.0 + 10 * 4.0)
    (msg,) = [r.getMessage() for r in caplog.records]
    factor = runner.reestimate["seconds"] / 14.0
    assert msg.startswith("NUTS: warm-up done in") and f"{factor:.1f}x the first estimate" in msg


def test_python_potential_chains_run_one_after_another_and_say_so():
    module = torch.nn.Sequential(torch.nn.Linear(1, 3), torch.nn.ELU(), torch.nn.Linear(3, 1))  # no MLP's
    model = pb.BNN(pb.ModuleNet(module, 1, 1), prior_scale=1.0, noise_scale=0.2)
    x, y = torch.randn(10, 1), torch.randn(10)
    with pytest.warns(UserWarning, match="one after another"):
        m = run_nuts(model, x, y, num_chains=2, seed=0, **{**KW, "num_samples": 4, "warmup_steps": 4})
    assert m.run_info.chain_method == "sequential"
    assert m.get_samples(group_by_chain=True)["w"].shape[:2] == (2, 4)
    if compiled.nuts_extension() is not None:
        with pytest.raises(ValueError, match="chain_method='threads' needs the compiled core"):
            run_nuts(model, x, y, num_chains=2, chain_method="threads", **KW)
    with pytest.raises(ValueError, match="chain_method"):
        run_nuts(model, x, y, chain_method="vectorized", **KW)
    lin, (xl, yl) = _linreg_model(), _linreg_data()
    with pytest.raises(ValueError, match="flat kernel only"):
        run_nuts(lin, xl, yl, kernel="pyro", chain_method="threads", **KW)


@needs_core
def test_an_error_in_one_chain_thread_stops_the_run(monkeypatch):
    model, x, y = _toy_bnn()
    original = FlatNUTS.sample

    def failing(self, params):
        if self._generator is not None and self is getattr(failing, "target", None) and self._t == 5:
            raise FloatingPointError("chain 1 broke at iteration 5")
        return original(self, params)

    init = FlatNUTS.__init__

    def remember(self, *args, **kwargs):
        init(self, *args, **kwargs)
        failing.count = getattr(failing, "count", 0) + 1
        if failing.count == 2:  # the second chain's kernel
            failing.target = self

    monkeypatch.setattr(FlatNUTS, "sample", failing)
    monkeypatch.setattr(FlatNUTS, "__init__", remember)
    with pytest.raises(FloatingPointError, match="chain 1 broke"):
        run_nuts(model, x, y, num_chains=3, seed=0, **KW)


@needs_core
def test_compiled_potential_clone_computes_the_same_potential():
    """Each thread's chain gets a clone (its own work buffers); the multi-chain test above shows
    that the threads do not disturb each other."""
    model, x, y = _toy_bnn()
    pot = flat_potential(model, x, y)
    twin = pot.compiled.clone()
    assert twin is not pot.compiled and twin.dim == pot.dim
    for seed in range(3):
        q = torch.randn(pot.dim, generator=torch.Generator().manual_seed(seed))
        (u, g), (u2, g2) = pot.compiled.value_and_grad(q), twin.value_and_grad(q)
        assert u == u2 and torch.equal(g, g2)
