"""pyro_bnnlv._platform: usable cores, and the allocator setting of the sweep's workers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pyro_bnnlv._platform import is_glibc, retain_freed_memory, usable_cores
from pyro_bnnlv.sweep import Task, run_sweep

glibc = pytest.mark.skipif(not is_glibc(), reason="mallopt is glibc's")


def faults_per_step(steps: int = 10) -> float:
    """Minor page faults per "training step": four live 20 MB tensors, then all freed."""
    import resource

    import torch

    def step() -> None:
        ts = [torch.ones(5_000_000) for _ in range(4)]
        del ts

    for _ in range(3):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps


def faults_task(task: Task) -> dict:
    return {"faults": faults_per_step()}


_SCRIPT = "import sys; from tests.test_platform import faults_per_step, retain_freed_memory; " \
          "took = retain_freed_memory() if sys.argv[1] == '1' else None; print(took, faults_per_step())"  # fmt: skip


@pytest.mark.parametrize("kwargs", [{"mmap_threshold": 2**31}, {"trim_threshold": 0}, {"trim_threshold": 1.5},
                                    {"mmap_threshold": True}])  # fmt: skip
def test_retain_freed_memory_refuses_values_a_c_int_cannot_hold(kwargs):
    """2**32 as a C int would wrap to 0 (trim on every free) and mallopt would report success."""
    with pytest.raises(ValueError, match=f"{next(iter(kwargs))} must be an int in \\[1, 2\\*\\*31\\)"):
        retain_freed_memory(**kwargs)


def test_usable_cores_is_a_positive_int():
    assert isinstance(usable_cores(), int) and usable_cores() >= 1


@glibc
def test_retain_freed_memory_stops_refaulting_a_steps_large_tensors():
    """With glibc's defaults every page of the freed 80 MB is handed back and faulted in again on
    the next step (about 19,500 faults); retained, none is."""
    runs = {}
    for arm in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", _SCRIPT, arm], capture_output=True, text=True, check=True,
                             cwd=str(__import__("pathlib").Path(__file__).parents[1]))  # fmt: skip
        took, faults = out.stdout.split()
        runs[arm] = (took, float(faults))
    assert runs["1"][0] == "True"
    assert runs["0"][1] > 10_000 and runs["1"][1] < 100


@glibc
def test_local_sweep_workers_retain_freed_memory(tmp_path):
    table = run_sweep([Task("toy", method="faults", seed=0)], faults_task, out_dir=tmp_path, executor="local",
                      workers=1, progress=False)  # fmt: skip
    assert table["status"].tolist() == ["done"] and table["faults"].iloc[0] < 100
