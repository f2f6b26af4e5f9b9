"""NUTS gold standard: fast potential == traced potential, exact conjugate posterior, kernels."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, NUTS
from pyro.infer.mcmc.util import initialize_model
from pyro.ops.integrator import potential_grad

import pyro_bnnlv as pb
from pyro_bnnlv._mlp_kernels import ACTIVATION_TABLE
from pyro_bnnlv.infer.mcmc import (
    FlatNUTS,
    FlatPotential,
    chain_records,
    flat_potential,
    mlp_regression_potential,
    run_nuts,
)


# ----------------------------------------------------------------------------------------------
# fixtures: conjugate Bayesian linear regression written as a BNN with no hidden layer
# ----------------------------------------------------------------------------------------------
PRIOR, NOISE = 1.5, 0.5


def _linreg_data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    y = x @ torch.tensor([1.0, -0.7]) + 0.3 + NOISE * torch.randn(n, generator=g)
    return x, y


def _linreg_model():
    return pb.BNN(pb.MLP(2, [], 1, activation="identity"), prior_scale=PRIOR, noise_scale=NOISE)


def _exact_posterior(x, y):
    """w = [W (1x2), b]: Sigma = (Phi^T Phi / s^2 + I / p^2)^-1, mu = Sigma Phi^T y / s^2."""
    phi = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    prec = phi.T @ phi / NOISE**2 + torch.eye(3, dtype=torch.float64) / PRIOR**2
    cov = torch.linalg.inv(prec)
    return cov @ phi.T @ y.double() / NOISE**2, cov


def _check_exact(w, x, y):
    """Posterior mean within 5 Monte-Carlo standard errors (ESS from ArviZ), marginal standard
    deviations within 12%, correlations within 0.1 of the exact ones."""
    import arviz as az

    mu, cov = _exact_posterior(x, y)
    w = w.double()
    sd = cov.diag().sqrt()
    ess = torch.tensor([float(az.ess(w[:, j].numpy()[None])) for j in range(3)], dtype=torch.float64)
    z = (w.mean(0) - mu) / (sd / ess.sqrt())
    assert z.abs().max() < 5, (w.mean(0), mu, ess)
    emp = torch.cov(w.T)
    assert torch.allclose(emp.diag().sqrt() / sd, torch.ones(3, dtype=torch.float64), atol=0.12), (emp, cov)
    corr = emp / torch.outer(emp.diag().sqrt(), emp.diag().sqrt())
    corr_exact = cov / torch.outer(sd, sd)
    assert (corr - corr_exact).abs().max() < 0.1, (corr, corr_exact)


# ----------------------------------------------------------------------------------------------
# the fast potential equals Pyro's traced potential
# ----------------------------------------------------------------------------------------------
def _compare_to_traced(model, pot, x, y, scale=1.0, n=4, rtol=1e-5):
    _, traced, _, _ = initialize_model(model, model_args=(x, y))
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        params = {k: scale * torch.randn(shape, generator=g, dtype=x.dtype) for k, shape in pot.sites.items()}
        u, grad = pot(pot.pack(params))
        ref_grads, ref_u = potential_grad(traced, {k: v.clone() for k, v in params.items()})
        ref = pot.pack(ref_grads)
        assert float(u) == pytest.approx(float(ref_u), rel=rtol, abs=1e-3)
        assert torch.allclose(grad, ref, rtol=1e-4, atol=1e-3 * (1 + float(ref.abs().max()))), (grad, ref)
        # Pyro's dict form with autograd gives the same gradient
        z = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        (gz,) = torch.autograd.grad(pot.potential_fn(z), [z[k] for k in pot.names][:1])
        assert torch.allclose(gz.reshape(-1), grad[: gz.numel()])


@pytest.mark.parametrize("activation", sorted(ACTIVATION_TABLE))
def test_fast_potential_equals_traced_potential(activation):
    torch.manual_seed(0)
    x, y = torch.randn(30, 2), torch.randn(30)
    model = pb.BNN(
        pb.MLP(2, [7, 5], 1, activation=activation),
        prior_scale=pb.fan_in_prior_scale(pb.MLP(2, [7, 5], 1)),
        noise_scale=0.3,
    )
    pot = flat_potential(model, x, y)
    _compare_to_traced(model, pot, x, y)


def test_fast_potential_multi_output_prior_mean_and_float64():
    torch.manual_seed(0)
    x = torch.randn(25, 3, dtype=torch.float64)
    y = torch.randn(25, 2, dtype=torch.float64)
    model = pb.BNN(pb.MLP(3, [6], 2), prior_scale=0.7, noise_scale=0.2).double()
    model.prior_loc.fill_(0.3)
    pot = flat_potential(model, x, y)
    _compare_to_traced(model, pot, x, y, rtol=1e-10)


def test_fast_potential_for_any_flat_net_uses_autograd():
    module = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.ELU(), torch.nn.Linear(4, 1))  # no MLP has ELU
    net = pb.ModuleNet(module, 1, 1)
    model = pb.BNN(net, prior_scale=1.0, noise_scale=0.2)
    x, y = torch.randn(20, 1), torch.randn(20)
    pot = flat_potential(model, x, y)
    assert pot.compiled is None
    _compare_to_traced(model, pot, x, y)


class LatentBNN(pb.BNN):
    """A minimal BNN+LV written in the library's conventions (sites w, z in the data plate,
    network input [x, z]) that opts into the fast path through ``nuts_potential``."""

    def __init__(self, net, latent_dim=1, latent_scale=1.0, **kw):
        super().__init__(net, **kw)
        self.latent_dim, self.latent_scale = latent_dim, latent_scale

    def check_data(self, x, y=None):
        pass

    def forward(self, x, y=None):
        w = pyro.sample("w", dist.Normal(self.prior_loc, self.prior_scale).to_event(1))
        with pyro.plate("data", x.shape[0]):
            z = pyro.sample("z", dist.Normal(torch.zeros(self.latent_dim), self.latent_scale).to_event(1))
            xz = torch.cat([x.expand(*z.shape[:-1], x.shape[-1]), z], -1)
            f = self._plate_f(xz, w)
            return pyro.sample("obs", dist.Normal(f.squeeze(-1), self.noise_scale), obs=y)

    def nuts_potential(self, x, y):
        return mlp_regression_potential(
            self.net,
            x,
            y,
            prior_loc=self.prior_loc,
            prior_scale=self.prior_scale,
            noise_scale=self.noise_scale,
            latent_dim=self.latent_dim,
            latent_scale=self.latent_scale,
        )


def test_latent_input_potential_equals_traced_potential():
    torch.manual_seed(0)
    x, y = torch.randn(15, 1), torch.randn(15)
    model = LatentBNN(pb.MLP(1 + 2, [6], 1), latent_dim=2, latent_scale=0.8, prior_scale=1.0, noise_scale=0.3)
    pot = flat_potential(model, x, y)
    assert pot.names == ("w", "z") and pot.sites["z"] == (15, 2)
    _compare_to_traced(model, pot, x, y)


def test_from_log_density_matches_traced_and_subclass_is_not_mistaken_for_bnn():
    x, y = torch.randn(15, 1), torch.randn(15)

    class NoFastPath(LatentBNN):
        nuts_potential = None  # a BNN subclass with its own forward and no nuts_potential

    model = NoFastPath(pb.MLP(2, [4], 1), latent_dim=1)
    assert flat_potential(model, x, y) is None  # traced path, not the BNN potential
    net = model.net

    def log_density(p):
        xz = torch.cat([x, p["z"]], -1)
        f = net(xz, p["w"]).squeeze(-1)
        prior = dist.Normal(0.0, 1.0)
        lik = dist.Normal(f, model.noise_scale).log_prob(y).sum()
        return lik + prior.log_prob(p["w"]).sum() + prior.log_prob(p["z"]).sum()

    pot = FlatPotential.from_log_density({"w": (net.num_weights,), "z": (15, 1)}, log_density)
    _compare_to_traced(model, pot, x, y)


# ----------------------------------------------------------------------------------------------
# exact posterior of conjugate linear regression, fast and traced paths
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("potential,kernel", [("fast", "flat"), ("fast", "pyro"), ("traced", "flat")])
def test_nuts_recovers_exact_conjugate_posterior(potential, kernel):
    x, y = _linreg_data()
    model = _linreg_model()
    n = 600 if potential == "traced" else 1500
    mcmc = run_nuts(
        model,
        x,
        y,
        num_samples=n,
        warmup_steps=300,
        seed=1,
        progress=False,
        potential=potential,
        kernel=kernel,
        map_steps=300,
    )
    expected = {"fast": "fast/" + kernel, "traced": "traced"}[potential]
    assert mcmc.run_info.path == expected
    w = mcmc.get_samples()["w"]
    assert w.shape == (n, 3)
    _check_exact(w, x, y)


# ----------------------------------------------------------------------------------------------
# FlatNUTS is Pyro's NUTS
# ----------------------------------------------------------------------------------------------
def _tiny_bnn64():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 1, generator=g, dtype=torch.float64)
    y = torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(30, generator=g, dtype=torch.float64)
    model = pb.BNN(pb.MLP(1, [4], 1, activation="relu"), prior_scale=1.0, noise_scale=0.1).double()
    return model, x, y


def _draws(kernel, w0, num_samples, warmup):
    pyro.set_rng_seed(3)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, initial_params={"w": w0}, disable_progbar=True)
    mcmc.run()
    return mcmc.get_samples()["w"]


@pytest.mark.parametrize("compiled", [False, None], ids=["python-tree", "default-tree"])
def test_flat_nuts_reproduces_pyro_nuts_draw_for_draw(compiled):
    """Same potential, same seed: FlatNUTS and Pyro's NUTS(potential_fn) produce the same chain.

    The two differ only by floating-point rounding (a fused ``r + alpha * g`` in the leapfrog,
    Python-float vs 0-dim-tensor sums of acceptance probabilities: ~1e-16), which the chaotic
    dynamics of a small ReLU network amplify about tenfold per adaptive iteration, so the
    adaptive comparison is kept short."""
    model, x, y = _tiny_bnn64()
    pot = flat_potential(model, x, y)
    w0 = model.net.init_weights(torch.Generator().manual_seed(1)).double()
    fixed = dict(step_size=0.01, adapt_step_size=False, adapt_mass_matrix=False)
    a = _draws(FlatNUTS(pot, compiled=compiled, **fixed), w0, 30, 0)
    b = _draws(NUTS(potential_fn=pot.potential_fn, **fixed), w0, 30, 0)
    assert torch.allclose(a, b, atol=1e-10, rtol=0)
    a = _draws(FlatNUTS(pot, compiled=compiled, max_tree_depth=6), w0, 2, 8)
    b = _draws(NUTS(potential_fn=pot.potential_fn, max_tree_depth=6), w0, 2, 8)
    assert torch.allclose(a, b, atol=1e-7, rtol=0)


def test_flat_nuts_full_mass_matrix_and_records():
    x, y = _linreg_data()
    model = _linreg_model()
    mcmc = run_nuts(
        model, x, y, num_samples=800, warmup_steps=300, full_mass=True, seed=0, progress=False, map_steps=200
    )
    _check_exact(mcmc.get_samples()["w"], x, y)
    rec = chain_records(mcmc)[0]
    assert len(rec["num_steps"]) == 800 and len(rec["warmup_num_steps"]) == 300
    assert all(1 <= n < 2**10 for n in rec["num_steps"])
    assert all(0 <= p <= 1 for p in rec["accept_prob"])
    assert 0.6 < sum(rec["accept_prob"]) / 800 < 0.99
    # the recorded potential energy is -log p(y, w) of the returned draw
    pot = flat_potential(model, x, y)
    w = mcmc.get_samples()["w"]
    for i in (0, 399, 799):
        assert rec["potential_energy"][i] == pytest.approx(float(pot(w[i])[0]), rel=1e-5)


# ----------------------------------------------------------------------------------------------
# run_nuts options
# ----------------------------------------------------------------------------------------------
def test_run_nuts_seed_chains_and_init_options():
    x, y = _linreg_data()
    model = _linreg_model()
    kw = dict(num_samples=20, warmup_steps=20, progress=False, map_steps=50)
    a = run_nuts(model, x, y, seed=5, **kw).get_samples()["w"]
    b = run_nuts(model, x, y, seed=5, **kw).get_samples()["w"]
    c = run_nuts(model, x, y, seed=6, **kw).get_samples()["w"]
    assert torch.equal(a, b) and not torch.equal(a, c)

    m = run_nuts(model, x, y, num_chains=2, init="prior", seed=0, **kw)
    assert m.get_samples(group_by_chain=True)["w"].shape == (2, 20, 3)
    assert m.run_info.init == "prior"

    start = torch.tensor([[0.5, 0.5, 0.5], [-0.5, 0.0, 0.1]])
    m = run_nuts(model, x, y, num_chains=2, init={"w": start}, seed=0, **kw)
    assert m.get_samples(group_by_chain=True)["w"].shape == (2, 20, 3)
    m = run_nuts(model, x, y, init={"w": start[0]}, seed=0, **kw)
    assert m.run_info.init == "values"
    with pytest.raises(ValueError, match="init"):
        run_nuts(model, x, y, init={"w": torch.zeros(4)}, **kw)
    with pytest.raises(ValueError, match="init"):
        run_nuts(model, x, y, init="nowhere", **kw)
    with pytest.raises(ValueError, match="num_samples"):
        run_nuts(model, x, y, num_samples=0, warmup_steps=1)
    with pytest.raises(ValueError, match="kernel"):
        run_nuts(model, x, y, kernel="jax", **kw)


def test_map_initialisation_starts_chains_near_the_posterior():
    """Default init: each chain starts at a MAP fit, i.e. within the posterior bulk."""
    x, y = _linreg_data()
    model = _linreg_model()
    m = run_nuts(model, x, y, num_samples=5, warmup_steps=0, seed=0, progress=False, map_steps=1500, map_lr=0.05)
    mu, cov = _exact_posterior(x, y)
    first = m.get_samples()["w"][0].double()
    assert ((first - mu) / cov.diag().sqrt()).abs().max() < 5


def test_models_without_fast_path_and_a_wrong_custom_potential():
    noise = torch.tensor(0.5)

    def model(x, y=None):  # tensors, not Python floats: traced, a float would warn (a constant)
        w = pyro.sample("w", dist.Normal(torch.zeros(2), torch.ones(2)).to_event(1))
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("obs", dist.Normal(x[:, 0] * w[..., :1] + w[..., 1:], noise), obs=y)

    x, y = _linreg_data()
    x = x[:, :1]
    with pytest.raises(ValueError, match="no fast potential"):
        run_nuts(model, x, y, num_samples=5, warmup_steps=5, potential="fast", progress=False)
    m = run_nuts(model, x, y, num_samples=30, warmup_steps=30, seed=0, progress=False, map_steps=100)
    assert m.run_info.path == "traced" and m.get_samples()["w"].shape == (30, 2)

    class Wrong(LatentBNN):
        def nuts_potential(self, x, y):  # forgets the latent prior's scale
            return mlp_regression_potential(
                self.net,
                x,
                y,
                prior_loc=self.prior_loc,
                prior_scale=self.prior_scale,
                noise_scale=self.noise_scale,
                latent_dim=1,
                latent_scale=3.0,
            )

    wrong = Wrong(pb.MLP(2, [3], 1), latent_dim=1, latent_scale=1.0)
    with pytest.raises(ValueError, match="disagrees with the traced Pyro model"):
        run_nuts(wrong, x, y, num_samples=5, warmup_steps=5, init="prior", progress=False)


def test_bnn_with_latent_inputs_samples_w_and_all_z():
    torch.manual_seed(0)
    x, y = torch.randn(12, 1), torch.randn(12)
    model = LatentBNN(pb.MLP(2, [5], 1), latent_dim=1, prior_scale=1.0, noise_scale=0.3)
    m = run_nuts(model, x, y, num_samples=15, warmup_steps=15, seed=0, progress=False, map_steps=100, max_tree_depth=6)
    s = m.get_samples()
    assert m.run_info.path == "fast/flat"
    assert s["w"].shape == (15, model.net.num_weights) and s["z"].shape == (15, 12, 1)


def test_library_bnnlv_traced_and_fast_paths():
    """The library's BNN+LV: the traced path works, and its ``nuts_potential`` (hand-written for
    an MLP, autograd for any other FlatNet) equals the traced potential and runs the fast path."""
    torch.manual_seed(0)
    x, y = torch.randn(10, 1), torch.randn(10)
    model = pb.BNNLV(pb.MLP(2, [4], 1), latent_dim=1, latent_scale=0.7, noise_scale=0.2)
    kw = dict(num_samples=10, warmup_steps=10, seed=0, progress=False, map_steps=50, max_tree_depth=5)
    m = run_nuts(model, x, y, potential="traced", **kw)
    s = m.get_samples()
    assert m.run_info.path == "traced"
    assert s["w"].shape == (10, model.net.num_weights) and s["z"].shape == (10, 10, 1)

    pot = flat_potential(model, x, y)
    _compare_to_traced(model, pot, x, y)
    m = run_nuts(model, x, y, **kw)
    assert m.run_info.path == "fast/flat" and m.get_samples()["z"].shape == (10, 10, 1)

    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ELU(), torch.nn.Linear(4, 1))
    other = pb.BNNLV(pb.ModuleNet(module, 3, 1), latent_dim=2, latent_scale=0.5, noise_scale=0.3)
    _compare_to_traced(other, flat_potential(other, x, y), x, y)
    # an nn.Sequential that is an MLP gets that MLP's hand-written potential (same weights)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.SiLU(), torch.nn.Linear(4, 1))
    same = pb.BNNLV(pb.ModuleNet(module, 3, 1), latent_dim=2, latent_scale=0.5, noise_scale=0.3)
    pot = flat_potential(same, x, y)
    assert pot.sites == {"w": (same.num_weights,), "z": (x.shape[0], 2)}
    _compare_to_traced(same, pot, x, y)


@pytest.mark.slow
# the benchmark's comparator is Pyro's own NUTS(jit_compile=True): its subsample messenger registers
# the (fixed) plate size as a trace constant, a TracerWarning from Pyro's code, not the library's
@pytest.mark.filterwarnings("ignore:torch.tensor results are registered as constants:torch.jit.TracerWarning")
def test_nuts_benchmark_smoke():
    from pyro_bnnlv.reproduce.nuts_bench import nuts_benchmark

    table = nuts_benchmark(steps=1, rounds=1, num_samples=20, warmup_steps=20, hidden=10, num_chains=0)
    assert len(table) == 5 and (table["ms_per_leapfrog"] > 0).all()
    assert table.attrs["compiled_core"] and math.isfinite(table.attrs["speedup_python_flat_vs_traced"])
    assert math.isfinite(table.attrs["speedup_flat_vs_traced"])


@pytest.mark.slow
def test_nuts_chains_benchmark_smoke():
    """The multi-chain rows (and NumPyro's when it is installed) with their ratios."""
    from pyro_bnnlv.reproduce.nuts_bench import nuts_chains_benchmark

    table = nuts_chains_benchmark(num_chains=2, num_samples=10, warmup_steps=10, hidden=5)
    assert table.index[1].startswith("run_nuts, 2 chains")
    assert (table["bulk_ess_f_per_s"] > 0).all() and (table["ms_per_leapfrog"] > 0).all()
    assert math.isfinite(table.attrs["ours 2 chains / ours 1 chain, ESS/s (target >= 1.8)"])
    assert "load average before (1, 5, 15 min)" in table.attrs


def test_run_nuts_refuses_nan_data_of_a_plain_pyro_model_and_an_unknown_start_method():
    """Issue 39: a plain Pyro model checks nothing itself (NaN in y only showed as a stuck chain),
    and mp_context='bogus' ran."""
    import pyro.distributions as dist

    def model(x, y=None):
        b = pyro.sample("b", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(b * x, 0.5), obs=y)

    x = torch.linspace(-1, 1, 10)
    y = 0.3 * x
    y_bad = y.clone()
    y_bad[3] = float("nan")
    with pytest.raises(ValueError, match="y contains NaN"):
        run_nuts(model, x, y_bad, num_samples=5, warmup_steps=5, progress=False)
    with pytest.raises(ValueError, match="mp_context='bogus' is not a start method"):
        run_nuts(model, x, y, num_samples=5, warmup_steps=5, progress=False, mp_context="bogus")
