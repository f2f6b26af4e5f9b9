import os
import sys
from pathlib import Path

import pyro
import pytest
import torch


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
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})  # fmt: skip
    yield ray
    ray.shutdown()
