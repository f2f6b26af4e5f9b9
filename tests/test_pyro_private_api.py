"""The private parts of Pyro that FlatNUTS and the in-process chain runner rely on.

``pyro_bnnlv.infer.mcmc.kernel.FlatNUTS`` re-implements ``NUTS.sample`` on top of Pyro's own
setup and adaptation, so it reads and writes private state of Pyro's ``HMC``/``NUTS``;
``pyro_bnnlv.infer.mcmc.chains._InProcessMCMC`` fills the private state of Pyro's ``MCMC`` and
feeds ``MCMC.run`` through its sampler protocol. ``pyro-ppl`` is pinned to the tested minor
version (pyproject.toml); when a new Pyro renames or drops any of these, the test below names it.
"""

import importlib
import inspect

import pytest
import torch
from pyro.infer import MCMC, NUTS
from pyro.infer.mcmc import api
from pyro.infer.mcmc.logger import ProgressBar

from pyro_bnnlv.infer.mcmc.kernel import FlatNUTS
from pyro_bnnlv.models.potential import FlatPotential

FIX = "pin pyro-ppl or update FlatNUTS"

# instance attributes of a set-up HMC/NUTS kernel that FlatNUTS / CountingNUTS use
KERNEL_ATTRIBUTES = [
    "_t",  # iteration counter (warm-up vs sampling, sample-site names)
    "_warmup_steps",
    "_accept_cnt",
    "_mean_accept_prob",
    "_divergences",
    "_adapter",  # WarmupAdapter: step-size and mass-matrix adaptation
    "_max_sliced_energy",  # divergence threshold
    "_max_tree_depth",
    "_potential_energy_last",
]
# private methods of HMC that FlatNUTS calls, with the parameters it passes
KERNEL_METHODS = {"_sample_r": ["name"], "_cache": ["z", "potential_energy", "z_grads"], "_fetch_from_cache": []}
# public attributes FlatNUTS relies on (their shape of use is Pyro-internal)
KERNEL_PUBLIC = ["mass_matrix_adapter", "initial_params", "step_size", "potential_fn"]
MASS_ADAPTER_ATTRIBUTES = ["mass_matrix_size", "scale", "inverse_mass_matrix"]
# instance attributes of Pyro's MCMC that _InProcessMCMC sets (it skips MCMC.__init__) and
# chain_records reads
MCMC_ATTRIBUTES = ["_samples", "_args", "_kwargs", "_diagnostics", "disable_validation", "sampler"]
# attributes FlatNUTS adds; Pyro must not use them itself
FLAT_OWN = [
    "flat_potential",
    "_vg",
    "_ext",
    "_tree_potential",
    "_generator",
    "_mass_key",
    "_mass",
    "_records",
    "_dtype",
    "_p",
    "_m",
]


def _missing(what: str) -> str:
    return f"Pyro's {what} is missing from the installed pyro-ppl: {FIX}"


@pytest.fixture(scope="module")
def stock_nuts():
    """Pyro's own NUTS on a 3-dim standard normal, set up and advanced by two draws."""

    def potential_fn(params):
        return 0.5 * (params["w"] ** 2).sum()

    nuts = NUTS(potential_fn=potential_fn, max_tree_depth=3)
    nuts.initial_params = {"w": torch.zeros(3, dtype=torch.float64)}
    nuts.setup(warmup_steps=1)
    params = nuts.initial_params
    for _ in range(2):
        params = nuts.sample(params)
    return nuts


@pytest.mark.parametrize("name", KERNEL_ATTRIBUTES + KERNEL_PUBLIC)
def test_nuts_kernel_attribute_exists(stock_nuts, name):
    if not hasattr(stock_nuts, name):
        pytest.fail(_missing(f"NUTS attribute {name!r}"))


@pytest.mark.parametrize("name", sorted(KERNEL_METHODS))
def test_nuts_kernel_method_exists_with_its_parameters(name):
    method = getattr(NUTS, name, None)
    if not callable(method):
        pytest.fail(_missing(f"NUTS method {name!r}"))
    params = list(inspect.signature(method).parameters)[1:]
    if params[: len(KERNEL_METHODS[name])] != KERNEL_METHODS[name]:
        pytest.fail(f"Pyro's NUTS.{name} takes {params}, FlatNUTS passes {KERNEL_METHODS[name]}: {FIX}")


def test_fetch_from_cache_returns_position_energy_gradient(stock_nuts):
    cached = stock_nuts._fetch_from_cache()
    if not (isinstance(cached, tuple) and len(cached) == 3):
        pytest.fail(f"Pyro's NUTS._fetch_from_cache no longer returns (z, potential_energy, z_grads): {FIX}")


def test_warmup_adapter_step_takes_what_flatnuts_passes(stock_nuts):
    params = list(inspect.signature(stock_nuts._adapter.step).parameters)
    if params[:4] != ["t", "z", "accept_prob", "z_grad"]:
        pytest.fail(f"Pyro's WarmupAdapter.step takes {params}, FlatNUTS passes (t, z, accept_prob, z_grad): {FIX}")


@pytest.mark.parametrize("name", MASS_ADAPTER_ATTRIBUTES)
def test_mass_matrix_adapter_attribute_exists(stock_nuts, name):
    if not hasattr(stock_nuts.mass_matrix_adapter, name):
        pytest.fail(_missing(f"mass-matrix adapter attribute {name!r}"))


@pytest.mark.parametrize("name", FLAT_OWN)
def test_flatnuts_own_attributes_do_not_shadow_pyros(stock_nuts, name):
    if name in vars(stock_nuts) or hasattr(NUTS, name):
        pytest.fail(f"Pyro's NUTS now has its own {name!r}, which FlatNUTS overwrites: {FIX}")


def test_flatnuts_sets_its_attributes():
    """The list above is FlatNUTS's own state (so the shadowing test checks the right names)."""
    pot = FlatPotential.from_log_density({"w": (3,)}, lambda p: -0.5 * (p["w"] ** 2).sum())
    kernel = FlatNUTS(pot, compiled=False, max_tree_depth=3)
    kernel.initial_params = {"w": torch.zeros(3, dtype=torch.float64)}
    kernel.setup(warmup_steps=1)
    kernel.sample(kernel.initial_params)
    missing = [n for n in FLAT_OWN if n not in vars(kernel)]
    assert not missing, missing


@pytest.fixture(scope="module")
def stock_mcmc():
    nuts = NUTS(potential_fn=lambda p: 0.5 * (p["w"] ** 2).sum(), max_tree_depth=2)
    mcmc = MCMC(nuts, num_samples=2, warmup_steps=1, initial_params={"w": torch.zeros(2)}, disable_progbar=True)
    mcmc.run()
    return mcmc


@pytest.mark.parametrize("name", MCMC_ATTRIBUTES)
def test_mcmc_attribute_exists(stock_mcmc, name):
    if not hasattr(stock_mcmc, name):
        pytest.fail(_missing(f"MCMC attribute {name!r}"))


def test_mcmc_internals_used_by_the_chain_runner():
    if not hasattr(api, "AbstractMCMC"):
        pytest.fail(_missing("pyro.infer.mcmc.api.AbstractMCMC"))
    if list(inspect.signature(api.AbstractMCMC.__init__).parameters)[1:] != ["kernel", "num_chains", "transforms"]:
        pytest.fail(f"Pyro's AbstractMCMC.__init__ changed its parameters: {FIX}")
    if not callable(getattr(api.AbstractMCMC, "_set_transforms", None)):
        pytest.fail(_missing("AbstractMCMC._set_transforms (called by MCMC.run)"))
    # MCMC.run drives the sampler: structure, draws, diagnostics as (item, chain_id), then terminate
    src = inspect.getsource(MCMC.run)
    for needle in ("self.sampler.run(", "self.sampler.terminate(", "self._diagnostics[chain_id]"):
        if needle not in src:
            pytest.fail(
                f"Pyro's MCMC.run no longer contains {needle!r} (the sampler protocol _ChainRunner follows): {FIX}"
            )


@pytest.mark.parametrize(
    "module, name",
    [
        ("pyro.infer.mcmc.api", "AbstractMCMC"),
        ("pyro.infer.mcmc.util", "initialize_model"),
        ("pyro.infer.mcmc.logger", "ProgressBar"),
        ("pyro.ops.integrator", "potential_grad"),
        ("pyro.poutine.util", "site_is_subsample"),
        ("pyro.poutine.runtime", "_PYRO_STACK"),  # ClosedFormKLElbo's fused steps: handlers around the call
    ],
)
def test_pyro_internal_import_exists(module, name):
    try:
        mod = importlib.import_module(module)
    except ImportError:
        pytest.fail(_missing(f"module {module}"))
    if not hasattr(mod, name):
        pytest.fail(_missing(f"{module}.{name}"))


def test_progress_bar_interface():
    params = list(inspect.signature(ProgressBar.__init__).parameters)[1:]
    if params[:2] != ["warmup_steps", "num_samples"] or "disable" not in params or "num_bars" not in params:
        pytest.fail(f"Pyro's ProgressBar takes {params}: {FIX}")
    bar = ProgressBar(1, 1, disable=True, num_bars=2)
    for name in ("update", "set_description", "set_postfix", "close", "disable"):
        if not hasattr(bar, name):
            pytest.fail(_missing(f"ProgressBar.{name}"))
    bar.close()


def test_what_the_fused_closed_form_steps_read_of_autonormal_and_the_trace_messenger():
    """ClosedFormKLElbo's fused steps call AutoNormal._get_loc_and_scale(name) inside the guide's
    Pyro context, read its prototype_trace and create_plates, and allow TraceMessengers with
    param_only=True around the call (the ones SVI and fit_svi use)."""
    import pyro
    import pyro.distributions as dist
    from pyro.infer.autoguide import AutoNormal
    from pyro.poutine.trace_messenger import TraceMessenger

    def model():
        pyro.sample("z", dist.Normal(torch.zeros(2), 1.0).to_event(1))

    guide = AutoNormal(model, init_scale=0.3)
    with pyro.get_param_store().scope():
        guide()
        loc, scale = guide._get_loc_and_scale("z")
    if loc.shape != (2,) or not torch.allclose(scale, torch.full((2,), 0.3)):
        pytest.fail(
            "AutoNormal._get_loc_and_scale no longer returns (loc, scale): pin pyro-ppl or update closed_form_kl"
        )
    if guide.prototype_trace is None or not hasattr(guide, "create_plates"):
        pytest.fail("AutoNormal has no prototype_trace / create_plates: pin pyro-ppl or update closed_form_kl")
    if not TraceMessenger(param_only=True).param_only:
        pytest.fail("TraceMessenger no longer keeps param_only: pin pyro-ppl or update closed_form_kl")
