"""Pyro's process-parallel chains (run_nuts's traced path and kernel="pyro"): a start method that
does not hang, clear errors where none works, and a dying chain process raises (nuts_processes)."""

import os
import sys
import time
import types

import pytest
import torch
import torch.multiprocessing
from pyro.infer import MCMC, NUTS

import pyro_bnnlv as pb
from pyro_bnnlv.infer.mcmc import run_nuts
from pyro_bnnlv.infer.mcmc.kernel import CountingNUTS
from pyro_bnnlv.infer.mcmc.processes import ChainProcessError, chain_start_method, run_watched

from test_nuts import _linreg_data, _linreg_model


@pytest.fixture
def eight_cores(monkeypatch):
    """Pyro's MCMC runs chains in processes only when num_chains <= cores - 1."""
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(torch.multiprocessing, "cpu_count", lambda: 8)


def test_traced_chains_run_in_spawned_processes_where_forked_ones_hung(eight_cores):
    """The case that hung with Pyro's default ``fork`` (2 runs of 2, in HMC.setup's gradient):
    a BNN+LV on the traced path after the MAP initialisation's parallel torch work."""
    x = torch.linspace(-1, 1, 20).unsqueeze(-1)
    y = torch.sin(3 * x[:, 0])
    model = pb.BNNLV(pb.MLP(2, [5], 1, activation="tanh"), latent_dim=1, noise_scale=0.1)
    mcmc = run_nuts(
        model,
        x,
        y,
        num_samples=4,
        warmup_steps=4,
        num_chains=2,
        potential="traced",
        map_steps=50,
        progress=False,
        seed=0,
    )
    assert mcmc.run_info.chain_method == "processes" and mcmc.run_info.start_method == "spawn"
    assert mcmc.get_samples(group_by_chain=True)["w"].shape[:2] == (2, 4)


class _DyingNUTS(NUTS):
    """A kernel whose chain process exits without reporting (as a killed or unbootable child, or
    one whose error could not be pickled), with exit code ``code``."""

    def __init__(self, model, code):
        super().__init__(model)
        self.code = code

    def setup(self, *args, **kwargs):
        os._exit(self.code)


@pytest.mark.parametrize("code", [3, 0])
def test_a_chain_process_that_ends_without_its_draws_raises_instead_of_hanging(eight_cores, code):
    x, y = _linreg_data()
    mcmc = MCMC(
        _DyingNUTS(_linreg_model(), code),
        num_samples=2,
        warmup_steps=2,
        num_chains=2,
        disable_progbar=True,
        mp_context="fork",
    )
    t0 = time.perf_counter()
    with pytest.raises(
        ChainProcessError,
        match=rf"chain \d's process ended with exit code {code} before it "
        r"delivered all its draws\. The process was killed",
    ):
        run_watched(mcmc, x, y, start_method="fork", every=0.2)
    assert time.perf_counter() - t0 < 30


class _ThreadCheckingNUTS(CountingNUTS):
    """Fails the chain unless its process runs with the torch thread count of the caller."""

    def setup(self, *args, **kwargs):
        super().setup(*args, **kwargs)
        if torch.get_num_threads() != 1:
            raise RuntimeError(f"the chain runs with {torch.get_num_threads()} torch threads")


def test_spawned_chains_keep_the_callers_torch_thread_count(eight_cores):
    """A spawned process starts with one thread per core; the chains take the caller's count."""
    x, y = _linreg_data()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mcmc = MCMC(
            _ThreadCheckingNUTS(_linreg_model()),
            num_samples=2,
            warmup_steps=2,
            num_chains=2,
            disable_progbar=True,
            mp_context="spawn",
        )
        run_watched(mcmc, x, y, start_method="spawn")
    finally:
        torch.set_num_threads(before)
    assert mcmc.get_samples(group_by_chain=True)["w"].shape[:2] == (2, 2)


def _unpicklable_kernel():
    kernel = NUTS(_linreg_model())
    kernel.handle = lambda: None  # a lambda does not pickle
    return kernel


def test_start_method_default_checks_and_errors(monkeypatch):
    assert chain_start_method(None, NUTS(_linreg_model()), _linreg_model(), compiled=False) == "spawn"
    assert chain_start_method("forkserver", NUTS(_linreg_model()), _linreg_model(), compiled=False) == "forkserver"
    assert chain_start_method("fork", _unpicklable_kernel(), _linreg_model(), compiled=False) == "fork"  # at your risk
    # the compiled C++ potential does not pickle, and forked chains with it finish: fork
    assert chain_start_method(None, _unpicklable_kernel(), _linreg_model(), compiled=True) == "fork"
    with pytest.raises(ValueError, match="mp_context='threads' is not a start method of this platform"):
        chain_start_method("threads", NUTS(_linreg_model()), _linreg_model(), compiled=False)
    # a Python potential that cannot be pickled: no start method is both possible and safe
    with pytest.raises(ValueError, match=r"cannot be pickled to reach 'spawn' chain processes .*num_chains=1"):
        chain_start_method(None, _unpicklable_kernel(), _linreg_model(), compiled=False)
    with pytest.raises(ValueError, match="cannot be pickled to reach 'forkserver'"):
        chain_start_method("forkserver", _unpicklable_kernel(), _linreg_model(), compiled=True)
    # a model defined in an interactive session (a notebook's __main__ has no file)
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    notebook_model = types.FunctionType(_linreg_model.__code__, {}, "model")
    notebook_model.__module__ = "__main__"
    with pytest.raises(ValueError, match="cannot import a model defined in an interactive session"):
        chain_start_method(None, NUTS(notebook_model), notebook_model, compiled=False)


def test_run_nuts_refuses_python_potential_chains_in_processes_before_sampling(eight_cores, monkeypatch):
    """kernel='pyro' on a Python fast potential (not picklable; forked chains with it hung):
    an error that names the fix, before any process starts."""
    from pyro_bnnlv._compiled import ENV

    monkeypatch.setenv(ENV, "0")
    x = torch.linspace(-1, 1, 20).unsqueeze(-1)
    model = pb.BNN(pb.MLP(1, [4], 1, activation="tanh"), noise_scale=0.1)
    with pytest.raises(ValueError, match="kernel='flat', whose chains run in threads"):
        run_nuts(
            model,
            x,
            torch.sin(3 * x[:, 0]),
            num_samples=2,
            warmup_steps=2,
            num_chains=2,
            kernel="pyro",
            map_steps=5,
            progress=False,
        )
