import os
import sys
from pathlib import Path

import pyro
import pytest
import torch


def pytest_configure(config):
    """Under pytest-xdist (``-n 2`` in ``addopts``: one worker per core) each worker keeps to one
    torch thread, so the two workers do not oversubscribe the cores."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """``--dist loadgroup``: the tests of a module that share one of its module-scoped fixtures (a
    fitted posterior, a local Ray instance) run on one worker, so the fixture is built once, and
    every test on a Ray instance on the same worker, so two instances never compete."""
    for item in items:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        scopes = {fd.scope for name, fds in defs.items() for fd in fds if (fd.baseid or "").startswith("tests")}
        if "ray_instance" in defs or "ray" in item.name:
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif scopes - {"function"}:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@pytest.fixture(autouse=True)
def _fresh_pyro_state():
    """Each test starts from an empty global param store and a fixed seed."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    yield
    pyro.clear_param_store()


@pytest.fixture
def toy_data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(100, 1, generator=g) * 2 - 1
    y = torch.cos(4 * (x[:, 0] + 0.2)) + 0.1 * torch.randn(100, generator=g)
    return x, y


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray instance per test module that asks for it; its workers import the test modules."""
    import ray

    path = os.pathsep.join([str(Path(__file__).parent)] + [p for p in sys.path if p])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()
